//! `muster chaos`: real replicas and agents under a seeded nemesis, then the
//! checks (docs/reliability.md).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use muster_chaos::{ChaosConfig, run};

#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// How long faults are injected (e.g. 60s, 10m).
    #[arg(long, default_value = "60s")]
    duration: String,
    /// Drives the workload and the nemesis; the same seed gives the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Node agents.
    #[arg(long, default_value_t = 3)]
    agents: u32,
    /// The most the liveness phase may take once every fault is healed.
    #[arg(long, default_value = "120s")]
    liveness_timeout: String,
    /// Where data dirs, logs, the history, the journal and report.json go
    /// (default: a new directory under the system's temp dir, removed when
    /// every check passes).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the JSON report instead of the summary.
    #[arg(long)]
    json: bool,
    /// Run the servers with a deliberate bug (ack-before-commit,
    /// ack-before-fsync, ack-despite-fsync-error, ack-despite-write-error,
    /// unpaced-leader-clock, removed-voters-linger, spare-failed-gang-peers,
    /// refuse-slow-writes), or the agents'
    /// (no-agent-fencing, forget-leftovers, start-without-record,
    /// no-isolation), to see a check catch it.
    #[arg(long)]
    inject_bug: Option<String>,
    /// The servers' --retention (e.g. 20s): finished allocations are then
    /// forgotten during the run, and the checks read them from the job
    /// history. Default: the servers' own (3h).
    #[arg(long)]
    retention: Option<String>,
    /// Only these faults, comma-separated (default: all; see
    /// docs/reliability.md for the list).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// How long each task of the workload runs, in seconds: LOW-HIGH
    /// (long tasks outlive a node's failover).
    #[arg(long, default_value = "0.5-3", value_name = "LOW-HIGH")]
    task_seconds: String,
    /// A campaign: this many runs of --duration each, with seeds --seed,
    /// --seed + 1, …, one after another (or --parallel at a time), summed up
    /// at the end (with --dir, each run gets DIR/seed-N).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Runs of a campaign side by side, this many at a time (each its own
    /// cluster; they share one CA). More faults an hour, more load.
    #[arg(long, default_value_t = 1)]
    parallel: u32,
    /// The large-checkpoint workload: every rank of a checkpointing job
    /// writes this many MiB of state to its checkpoint directory, saved at
    /// every exit, teardown and preemption, and checks what it resumes from
    /// (checkpoints_intact). 0: none.
    #[arg(long, default_value_t = 0, value_name = "MIB")]
    checkpoint_mb: u32,
    /// The daemonising workload: every rank starts a daemon that leaves its
    /// process group (setsid), ignores SIGTERM and beats in the journal as
    /// its attempt until killed, so every stop must end the attempt's whole
    /// cgroup (gpus_never_overbooked, journal_consistent).
    #[arg(long)]
    daemonising_tasks: bool,
}

pub async fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let duration = crate::args::parse_duration_s(&args.duration).context("--duration")?;
    let liveness = crate::args::parse_duration_s(&args.liveness_timeout).context("--liveness-timeout")?;
    if duration < 5 {
        bail!("--duration must be at least 5s (faults need time to happen)");
    }
    if !(1..=16).contains(&args.agents) {
        bail!("--agents must be between 1 and 16");
    }
    if let Some(bug) = &args.inject_bug
        && muster_scheduler::server::InjectedBug::parse(bug).is_none()
        && !muster_chaos::AGENT_BUGS.contains(&bug.as_str())
    {
        bail!(
            "--inject-bug {bug:?}: the known bugs are {}, {}",
            muster_scheduler::server::InjectedBug::NAMES.join(", "),
            muster_chaos::AGENT_BUGS.join(", ")
        );
    }
    if let Some(r) = &args.retention {
        let s = crate::args::parse_duration_s(r).context("--retention")?;
        if s == 0 {
            bail!("--retention must be at least 1s");
        }
    }
    let known = muster_chaos::fault_kinds();
    if let Some(f) = args.faults.iter().find(|f| !known.contains(&f.as_str())) {
        bail!("--faults: unknown fault {f:?}; the faults are {}", known.join(", "));
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if !(1..=4).contains(&args.parallel) {
        bail!("--parallel must be between 1 and 4");
    }
    let task_ms = parse_task_seconds(&args.task_seconds)?;
    if args.checkpoint_mb > 1024 {
        bail!("--checkpoint-mb must be at most 1024 (every rank writes it at every start)");
    }
    if let Some(dir) = &args.dir
        && dir.exists()
        && std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
    {
        bail!("--dir {} is not empty: a chaos run needs fresh data dirs", dir.display());
    }
    // Side by side, runs share one CA (the harness's client holds one
    // certificate); one after another, each run has its own.
    let shared_tls = (args.parallel > 1).then(|| match &args.dir {
        Some(d) => d.join("tls"),
        None => std::env::temp_dir().join(format!("muster-chaos-tls-{}", std::process::id())),
    });
    let bin = std::env::current_exe().context("cannot find the muster binary")?;
    let mut reports = Vec::new();
    let seeds: Vec<u64> = (0..args.runs).map(|n| args.seed.wrapping_add(u64::from(n))).collect();
    for batch in seeds.chunks(args.parallel as usize) {
        let mut running = tokio::task::JoinSet::new();
        for &seed in batch {
            let dir = match (&args.dir, args.runs) {
                (Some(d), 1) => d.clone(),
                (Some(d), _) => d.join(format!("seed-{seed}")),
                (None, _) => std::env::temp_dir().join(format!("muster-chaos-{seed}-{}", std::process::id())),
            };
            let cfg = ChaosConfig {
                muster_bin: bin.clone(),
                dir,
                seed,
                duration: std::time::Duration::from_secs(duration),
                liveness_timeout: std::time::Duration::from_secs(liveness),
                agents: args.agents,
                inject_bug: args.inject_bug.clone(),
                faults: args.faults.clone(),
                retention: args.retention.clone(),
                task_ms,
                tls_dir: shared_tls.clone(),
                checkpoint_mb: args.checkpoint_mb,
                daemonising: args.daemonising_tasks,
            };
            running.spawn(async move { run(&cfg).await.map(|r| (r, cfg.dir)) });
        }
        let mut done = Vec::new();
        while let Some(joined) = running.join_next().await {
            let (report, dir) = joined.context("a chaos run panicked")?.map_err(anyhow::Error::msg)?;
            if args.json && args.runs == 1 {
                out!("{}", serde_json::to_string_pretty(&report)?);
            } else if !args.json {
                out!("{}", report.summary().trim_end());
            }
            if report.passed && args.dir.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            done.push(report);
        }
        done.sort_by_key(|r| r.seed);
        reports.extend(done);
    }
    if let Some(tls) = shared_tls.filter(|_| args.dir.is_none() && reports.iter().all(|r| r.passed)) {
        let _ = std::fs::remove_dir_all(tls);
    }
    if args.runs > 1 {
        if args.json {
            let passed = reports.iter().all(|r| r.passed);
            out!("{}", serde_json::to_string_pretty(&serde_json::json!({ "runs": reports, "passed": passed }))?);
        } else {
            out!("\n{}", muster_chaos::campaign_summary(&reports).trim_end());
        }
    }
    let failed: Vec<String> =
        reports.iter().filter(|r| !r.passed).map(|r| format!("(seed {}) in {}", r.seed, r.dir.display())).collect();
    if !failed.is_empty() {
        bail!("a check failed {}; everything is kept there", failed.join(", "));
    }
    Ok(())
}

/// `--task-seconds LOW-HIGH` in milliseconds.
fn parse_task_seconds(v: &str) -> anyhow::Result<(u64, u64)> {
    let bad = || {
        anyhow::anyhow!("--task-seconds {v:?}: give LOW-HIGH in seconds, e.g. 0.5-3, with 0.25 <= LOW <= HIGH <= 600")
    };
    let (lo, hi) = v.split_once('-').ok_or_else(bad)?;
    let ms = |s: &str| s.trim().parse::<f64>().ok().filter(|x| x.is_finite()).map(|x| (x * 1000.0) as u64);
    let (lo, hi) = (ms(lo).ok_or_else(bad)?, ms(hi).ok_or_else(bad)?);
    if lo < 250 || lo > hi || hi > 600_000 {
        return Err(bad());
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_seconds_parse_and_bad_ones_are_named() {
        assert_eq!(parse_task_seconds("0.5-3").unwrap(), (500, 3_000));
        assert_eq!(parse_task_seconds("15-25").unwrap(), (15_000, 25_000));
        for bad in ["3", "3-1", "0.1-1", "a-b", "1-900"] {
            assert!(parse_task_seconds(bad).unwrap_err().to_string().contains("LOW-HIGH"), "{bad}");
        }
    }
}
