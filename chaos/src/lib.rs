//! `muster chaos`: three real `muster server` processes (five while the
//! cluster is grown) and K real `muster agent` processes on loopback, each
//! replica's port behind a TCP proxy the harness controls; a submitter
//! sending allocations with idempotency keys and recording every attempt; a
//! seeded nemesis (kill -9, SIGSTOP/SIGCONT, partitions, slow links, a
//! follower kept away past a snapshot, failing disks, clock jumps,
//! membership changes, agents killed, paused, restarted and cut off); then a
//! quiet liveness phase with every fault healed, and the checks
//! (docs/reliability.md).
//!
//! ```text
//!   start ─▶ fault phase (workload ∥ nemesis, `duration`) ─▶ heal everything
//!         ─▶ liveness phase (every allocation terminal; replicas agree)
//!         ─▶ checks ─▶ report (JSON + one screen)
//! ```

#![deny(missing_docs)]

mod campaign;
mod checks;
mod client;
mod fabric;
mod membership;
mod nemesis;
mod procs;
mod proxy;
pub mod rank;
mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use campaign::campaign_summary;
pub use checks::CheckResult;
pub use nemesis::{Fault, FaultKind};
pub use workload::Op;

use self::procs::Procs;
use self::proxy::Proxy;

/// How long a chaos cluster may take to elect a leader and register its
/// agents before the run is abandoned.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// What to run.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// The `muster` binary (servers and agents are its subcommands).
    pub muster_bin: PathBuf,
    /// Data dirs, logs, the journal and the report go here.
    pub dir: PathBuf,
    /// Drives the workload and the nemesis.
    pub seed: u64,
    /// The fault phase.
    pub duration: Duration,
    /// The most the liveness phase may take.
    pub liveness_timeout: Duration,
    /// Node agents.
    pub agents: u32,
    /// A deliberate bug for the servers (`muster server --inject-bug`), to
    /// prove a check catches it.
    pub inject_bug: Option<String>,
    /// The fault kinds the nemesis picks from (empty: all of [`fault_kinds`]).
    pub faults: Vec<String>,
    /// The servers' `--retention` (`None`: their default, 3 h): set it short
    /// and finished allocations are forgotten during the run; the checks
    /// then read them from the job history.
    pub retention: Option<String>,
    /// How long each task runs, ms (low, high).
    pub task_ms: (u64, u64),
    /// Where the run's CA and certificates live (`None`: `dir/tls`). Runs
    /// of a campaign that run side by side share one: the harness's client
    /// holds one certificate.
    pub tls_dir: Option<PathBuf>,
    /// The workload variant with large checkpoints: every rank of a
    /// checkpointing allocation writes this many MiB of state to its
    /// checkpoint directory at start, and checks the state it resumes from
    /// (0: none).
    pub checkpoint_mb: u32,
    /// The daemonising workload: every rank starts a daemon that leaves its
    /// process group, ignores SIGTERM and beats as its attempt until killed.
    pub daemonising: bool,
}

/// How long a task runs unless told otherwise: 0.5–3 s.
pub const DEFAULT_TASK_MS: (u64, u64) = (500, 3_000);

/// The flags a configuration adds to every server.
fn server_args(cfg: &ChaosConfig) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(bug) = cfg.inject_bug.as_ref().filter(|b| !AGENT_BUGS.contains(&b.as_str())) {
        args.extend(["--inject-bug".to_string(), bug.clone()]);
    }
    if let Some(r) = &cfg.retention {
        args.extend(["--retention".to_string(), r.clone()]);
    }
    args
}

/// The one deliberate bug of the agents rather than the servers: they keep
/// their tasks running when cut off from every leader
/// (`--keep-running-when-cut-off`), so a partitioned node's tasks run twice.
pub const NO_AGENT_FENCING: &str = "no-agent-fencing";

/// The deliberate bug of agents that forget their predecessor's tasks:
/// started after an agent that left its tasks running (`--keep-tasks`), they
/// neither adopt nor kill them (`--forget-leftovers`), so the leader places
/// them again while they still run.
pub const FORGET_LEFTOVERS: &str = "forget-leftovers";

/// The deliberate bug of agents that start an attempt even when its record
/// cannot be written (`--start-without-record`): on a full disk, the agent
/// after them can neither adopt nor kill what they started (on a node
/// without isolation: a cgroup would still name it).
pub const START_WITHOUT_RECORD: &str = "start-without-record";

/// The deliberate bug of agents that do not contain their tasks
/// (`--no-isolation`): a stop signals the task's process group only, and a
/// daemon that left it runs on (see the daemonising workload).
pub const NO_ISOLATION: &str = "no-isolation";

/// The deliberate bugs of the agents rather than the servers.
pub const AGENT_BUGS: &[&str] = &[NO_AGENT_FENCING, FORGET_LEFTOVERS, START_WITHOUT_RECORD, NO_ISOLATION];

/// The flags a configuration adds to every agent.
fn agent_args(cfg: &ChaosConfig) -> Vec<String> {
    match cfg.inject_bug.as_deref() {
        Some(NO_AGENT_FENCING) => vec!["--keep-running-when-cut-off".to_string()],
        Some(FORGET_LEFTOVERS) => vec!["--forget-leftovers".to_string()],
        // With cgroups the next agent finds an unrecorded attempt all the
        // same (through its cgroup) and kills it: the bug shows on a node
        // that does not contain its tasks.
        Some(START_WITHOUT_RECORD) => vec!["--start-without-record".to_string(), "--no-isolation".to_string()],
        Some(NO_ISOLATION) => vec!["--no-isolation".to_string()],
        _ => Vec::new(),
    }
}

/// Every fault the nemesis knows, in docs/reliability.md's order.
pub fn fault_kinds() -> Vec<&'static str> {
    nemesis::KINDS.iter().map(|&(_, k)| k.name()).collect()
}

/// The weighted menu for `faults` (empty: everything); an unknown kind is
/// an error naming the known ones.
fn fault_menu(faults: &[String]) -> Result<Vec<(u32, FaultKind)>, String> {
    if faults.is_empty() {
        return Ok(nemesis::KINDS.to_vec());
    }
    faults
        .iter()
        .map(|f| {
            nemesis::KINDS
                .iter()
                .find(|&&(_, k)| k.name() == f.as_str())
                .copied()
                .ok_or_else(|| format!("unknown fault {f:?}; the faults are {}", fault_kinds().join(", ")))
        })
        .collect()
}

/// Operations by outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpCounts {
    /// Calls made.
    pub calls: usize,
    /// Acknowledged.
    pub ok: usize,
    /// Certainly not applied.
    pub failed: usize,
    /// May or may not have been applied.
    pub unknown: usize,
    /// Distinct idempotency keys (intended allocations).
    pub keys: usize,
}

/// What a run did and found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The fault phase, s.
    pub duration_s: u64,
    /// Agents.
    pub agents: u32,
    /// Every fault injected, in order.
    pub faults: Vec<Fault>,
    /// Client calls (submits, gets, cancels) by outcome.
    pub ops: OpCounts,
    /// Allocations at the end.
    pub allocations: usize,
    /// Of those, forgotten by the live state after the retention window
    /// and read from the job history.
    pub forgotten: usize,
    /// How long the liveness phase took, s.
    pub liveness_s: f64,
    /// The checks.
    pub checks: Vec<CheckResult>,
    /// Whether every check passed.
    pub passed: bool,
    /// Where the data dirs, logs, history and journal are.
    pub dir: PathBuf,
    /// The command that runs the same schedule again.
    pub reproduce: String,
    /// The fault after whose healing writes took longest to succeed again.
    pub slowest_recovery: Option<Recovery>,
}

/// How long after a fault was healed the first submit was acknowledged.
#[derive(Clone, Debug, Serialize)]
pub struct Recovery {
    /// The fault's kind.
    pub kind: &'static str,
    /// What it hit.
    pub target: String,
    /// From its healing to that acknowledgement, ms.
    pub after_ms: u64,
}

/// The fault whose healing was followed longest by no acknowledged submit.
fn slowest_recovery(faults: &[Fault], ops: &[Op]) -> Option<Recovery> {
    faults
        .iter()
        .filter_map(|f| {
            let first = ops
                .iter()
                .filter(|o| o.kind == "submit" && o.outcome == "ok" && o.complete_ms >= f.end_ms)
                .map(|o| o.complete_ms)
                .min()?;
            Some(Recovery { kind: f.kind, target: f.target.clone(), after_ms: first - f.end_ms })
        })
        .max_by_key(|r| r.after_ms)
}

impl Report {
    /// A one-screen summary.
    pub fn summary(&self) -> String {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for f in &self.faults {
            *kinds.entry(f.kind).or_default() += 1;
        }
        let mut out = format!(
            "muster chaos: seed {}, {} s of faults, {} agents\n  faults      {}\n  operations  {} ok, {} failed, {} unknown ({} allocations submitted)\n  allocations {} ({} read from the job history; liveness phase {:.1} s)\n",
            self.seed,
            self.duration_s,
            self.agents,
            kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join(", "),
            self.ops.ok,
            self.ops.failed,
            self.ops.unknown,
            self.ops.keys,
            self.allocations,
            self.forgotten,
            self.liveness_s,
        );
        if let Some(r) = &self.slowest_recovery {
            out.push_str(&format!(
                "  recovery    slowest {:.1} s: the first acknowledged submit after {} of {} was healed\n",
                r.after_ms as f64 / 1000.0,
                r.kind,
                r.target
            ));
        }
        for c in &self.checks {
            out.push_str(&format!("  {:<4} {:<22} {}\n", if c.passed { "ok" } else { "FAIL" }, c.name, c.detail));
        }
        if self.passed {
            out.push_str("every check passed\n");
        } else {
            out.push_str(&format!(
                "FAILED. Data dirs, logs, history and journal kept in {}\nreproduce: {}\n",
                self.dir.display(),
                self.reproduce
            ));
        }
        out
    }
}

/// A loopback port nobody listens on, never handed out before in this
/// process: runs side by side share the CA, so a replica of one run must
/// never answer on an address of another.
///
/// It is drawn below the kernel's ephemeral range: a port from `bind(0)`
/// is free only until the listener is dropped, and before the replica
/// binds it, any process's outgoing connection may take it as its local
/// port (a replica of a run among many parallel tests then failed to
/// listen: "Address already in use", and the cluster had no quorum).
fn free_port() -> Result<String, String> {
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let (low, high) = below_ephemeral_ports();
    // Where to start looking: different in each process and each call, so
    // that parallel runs rarely try the same ports.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let seed = u64::from(nanos) ^ (u64::from(std::process::id()) << 20);
    let span = u64::from(high - low) + 1;
    for k in 0..span {
        let port = low + ((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17).wrapping_add(k) % span) as u16;
        if HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).insert(port);
            return Ok(format!("127.0.0.1:{port}"));
        }
    }
    Err(format!("no free loopback port in {low}-{high}"))
}

/// Ports below the kernel's ephemeral range (`ip_local_port_range`; Linux
/// starts it at 32768 by default), above the well-known and most
/// services' ones.
fn below_ephemeral_ports() -> (u16, u16) {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    let high = first_ephemeral.saturating_sub(1).max(20_001);
    (20_000.min(high - 1), high)
}

/// Runs one chaos test. `Err` is for a harness that could not run at all
/// (a check that fails is a report with `passed: false`).
pub async fn run(cfg: &ChaosConfig) -> Result<Report, String> {
    let menu = fault_menu(&cfg.faults)?;
    std::fs::create_dir_all(cfg.dir.join("agents")).map_err(|e| format!("{}: {e}", cfg.dir.display()))?;
    let journal = cfg.dir.join("journal.log"); // Procs::journal
    std::fs::write(&journal, "").map_err(|e| e.to_string())?;
    let real: Vec<String> = (0..procs::MACHINES).map(|_| free_port()).collect::<Result<_, _>>()?;
    let mut proxies = Vec::new();
    for (i, r) in real.iter().enumerate() {
        proxies.push(Proxy::start(r.clone(), cfg.seed.wrapping_add(i as u64)).await.map_err(|e| e.to_string())?);
    }
    let proxied: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let mut procs = Procs::new(
        &cfg.muster_bin,
        &cfg.dir,
        real.clone(),
        proxied.clone(),
        cfg.agents,
        (server_args(cfg), agent_args(cfg)),
        cfg.tls_dir.clone().unwrap_or_else(|| cfg.dir.join("tls")),
    );
    // Everything runs over mutual TLS with its own role's certificate.
    let roles: Vec<muster_tls::Role> = procs
        .members()
        .into_iter()
        .map(muster_tls::Role::Server)
        .chain(procs.agent_ids().iter().map(|id| muster_tls::Role::Agent(id.clone())))
        .chain([muster_tls::Role::Admin("chaos".into())])
        .collect();
    let materials = muster_local::ensure_certs(&procs.tls_dir(), &roles)?;
    client::set_tls(materials.last().cloned());
    for id in procs.members() {
        procs.spawn_server(id).map_err(|e| format!("cannot start muster server: {e}"))?;
    }
    nemesis::refresh_known(&procs, &proxies);
    for i in 0..cfg.agents as usize {
        procs.spawn_agent(i).map_err(|e| format!("cannot start muster agent: {e}"))?;
    }
    nemesis::refresh_known(&procs, &proxies);
    wait_ready(&procs.member_addrs(), cfg.agents).await?;
    tracing::info!(seed = cfg.seed, "chaos: the cluster is ready; the fault phase begins");

    // The fault phase.
    let fabric = fabric::Fabric::start().await.map_err(|e| format!("cannot start the gang fabric: {e}"))?;
    let tasks = workload::Tasks {
        bin: cfg.muster_bin.clone(),
        journal: journal.clone(),
        fabric: fabric.addr(),
        checkpoint_mb: cfg.checkpoint_mb,
        daemonising: cfg.daemonising,
    };
    let until = Instant::now() + cfg.duration;
    let (ops, faults) = tokio::join!(
        workload::run(proxied.clone(), cfg.seed, &tasks, until, cfg.task_ms),
        nemesis::run(&mut procs, &proxies, &fabric, &menu, cfg.seed, until),
    );
    nemesis::heal_network(&proxies);
    fabric.heal();
    let crashed = procs.crashed();
    tracing::info!(seed = cfg.seed, faults = faults.len(), calls = ops.len(), "chaos: the fault phase is over");

    // The liveness phase: everything ends, the replicas converge.
    let quiet = Instant::now();
    let deadline = quiet + cfg.liveness_timeout;
    let members = procs.members();
    let (mut allocs, leader) = settle(&procs.member_addrs(), deadline).await;
    let statuses = converge(&procs.member_addrs(), deadline).await;
    let liveness_s = quiet.elapsed().as_secs_f64();
    tracing::info!(
        seed = cfg.seed,
        liveness_s,
        "chaos: the liveness phase is over; reading every allocation's history"
    );
    let mut histories = BTreeMap::new();
    let mut forgotten = 0;
    if let Some(leader) = leader {
        // Only an allocation that ended has a history that vouches for its
        // attempts: a live one's watch never closes, and a task it starts
        // after the read would look unrecorded. (`all_terminal` names the
        // live ones.)
        for a in allocs.iter().filter(|a| checks::is_terminal(a.status)) {
            if let Ok(h) = client::history(&leader, a.id).await {
                histories.insert(a.id, h);
            }
        }
        // Allocations forgotten after the retention window: their records
        // stand in for them (the checks read id, key, resources, status and
        // the committed starts).
        // A replica that restarted may still be fetching records it lacks
        // from its peers: give it until the deadline.
        let mut read = client::job_history(&leader).await;
        while read.is_err() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            read = client::job_history(&leader).await;
        }
        match read {
            Ok(records) => {
                let live: BTreeSet<u64> = allocs.iter().map(|a| a.id).collect();
                for r in records.into_iter().filter(|r| !live.contains(&r.id)) {
                    forgotten += 1;
                    histories.insert(r.id, client::starts_of(&r));
                    allocs.push(client::as_allocation(r));
                }
                allocs.sort_by_key(|a| a.id);
            }
            Err(e) => tracing::warn!(error = %e, "chaos: cannot read the job history"),
        }
    }
    tracing::info!(seed = cfg.seed, "chaos: histories read; stopping the cluster");
    procs.shutdown();
    tracing::info!(seed = cfg.seed, "chaos: the cluster is stopped; checking");
    let mut logs = Vec::new();
    let mut unreadable = Vec::new();
    // Every replica that ever ran, retired ones too (a replica that joined
    // late holds only what it applied after its snapshot).
    for id in procs.all_ids().into_iter().filter(|&id| procs.applied_log_dir(id).exists()) {
        match muster_raft_store::read_applied_log::<muster_core::sm::State>(&procs.applied_log_dir(id)) {
            Ok(records) => logs.push(checks::ReplicaLog { replica: id, records }),
            Err(e) => unreadable.push(e.to_string()),
        }
    }

    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    let parsed = checks::Journal::parse(&text);
    let mut results = vec![
        checks::acked_exactly_once(&ops, &allocs),
        checks::replicas_agree_as_members(&statuses, &members),
        checks::all_terminal(&allocs),
        checks::journal_consistent(&parsed, &histories),
        checks::gpus_never_overbooked(&parsed, &allocs, procs::AGENT_GPUS),
        checks::client_api_linearizable(&ops),
        checks::checkpoints_intact(&parsed, cfg.checkpoint_mb),
        checks::log_entries_bounded(&logs),
    ];
    let mut replay = checks::committed_log_replays(&logs, &statuses);
    if !unreadable.is_empty() {
        replay.passed = false;
        replay.detail = format!("{}; {}", unreadable.join("; "), replay.detail);
    }
    results.push(replay);
    results.push(checks::acked_entries_durable(&procs.power_losses, &procs.readbacks));
    let ahead = faults.iter().map(|f| f.clock_ms.max(0) as u64).max().unwrap_or(0);
    let behind = faults.iter().map(|f| (-f.clock_ms).max(0) as u64).max().unwrap_or(0);
    results.push(checks::deadlines_on_time(&logs, &ops, ahead, behind));
    results.push(CheckResult {
        name: "no_crashes",
        passed: crashed.is_empty(),
        detail: if crashed.is_empty() { "no process exited on its own".into() } else { crashed.join("; ") },
    });
    let ops_json = serde_json::to_string_pretty(&ops).unwrap_or_default();
    let _ = std::fs::write(cfg.dir.join("history.json"), ops_json);
    let passed = results.iter().all(|c| c.passed);
    let slowest = slowest_recovery(&faults, &ops);
    let report = Report {
        seed: cfg.seed,
        duration_s: cfg.duration.as_secs(),
        agents: cfg.agents,
        faults,
        ops: OpCounts {
            calls: ops.len(),
            ok: ops.iter().filter(|o| o.outcome == "ok").count(),
            failed: ops.iter().filter(|o| o.outcome == "failed").count(),
            unknown: ops.iter().filter(|o| o.outcome == "unknown").count(),
            keys: ops.iter().map(|o| o.key.as_str()).collect::<std::collections::BTreeSet<_>>().len(),
        },
        allocations: allocs.len(),
        forgotten,
        liveness_s,
        checks: results,
        passed,
        dir: cfg.dir.clone(),
        slowest_recovery: slowest,
        reproduce: format!(
            "muster chaos --seed {} --duration {}s --agents {}{}{}{}{} --dir {}",
            cfg.seed,
            cfg.duration.as_secs(),
            cfg.agents,
            if cfg.faults.is_empty() { String::new() } else { format!(" --faults {}", cfg.faults.join(",")) },
            cfg.inject_bug.as_ref().map(|b| format!(" --inject-bug {b}")).unwrap_or_default(),
            cfg.retention.as_ref().map(|r| format!(" --retention {r}")).unwrap_or_default(),
            if cfg.task_ms == DEFAULT_TASK_MS {
                String::new()
            } else {
                format!(" --task-seconds {}-{}", cfg.task_ms.0 as f64 / 1000.0, cfg.task_ms.1 as f64 / 1000.0)
            },
            cfg.dir.display()
        ),
    };
    let _ = std::fs::write(cfg.dir.join("report.json"), serde_json::to_string_pretty(&report).unwrap_or_default());
    Ok(report)
}

/// Waits for a leader and `agents` ready nodes; a failure says what it
/// last saw.
async fn wait_ready(real: &[String], agents: u32) -> Result<(), String> {
    // Generous: on a loaded 2-core machine (a campaign runs clusters side
    // by side) a first election can take a while.
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut seen = "no replica named a leader".to_string();
    loop {
        if let Some((_, addr)) = client::leader_at(real).await {
            seen = format!("the leader at {addr} did not answer ListNodes");
            if let Ok(ch) = client::connect(&addr, Duration::from_secs(2)).await
                && let Ok(r) = muster_proto::v1::node_service_client::NodeServiceClient::new(ch)
                    .list_nodes(muster_proto::v1::ListNodesRequest { page_size: 1000, ..Default::default() })
                    .await
            {
                let nodes = r.into_inner().nodes;
                let ready = nodes.iter().filter(|n| n.status == muster_proto::v1::NodeStatus::Ready as i32).count();
                if ready == agents as usize {
                    return Ok(());
                }
                seen = format!("the leader at {addr} had {} nodes registered, {ready} ready", nodes.len());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the cluster never had a leader and {agents} ready nodes in {} s (last seen: {seen})",
                STARTUP_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every allocation is terminal (or the deadline); returns the
/// last listing and the (control) address of the leader it came from.
async fn settle(real: &[String], deadline: Instant) -> (Vec<muster_proto::v1::Allocation>, Option<String>) {
    let mut last = (Vec::new(), None);
    loop {
        if let Some((_, addr)) = client::leader_at(real).await
            && let Ok(allocs) = client::list_all(&addr).await
        {
            let done = checks::all_terminal(&allocs).passed;
            last = (allocs, Some(addr));
            if done {
                return last;
            }
        }
        if Instant::now() > deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every replica reports the same applied index and digest (or
/// the deadline); returns their last statuses.
async fn converge(real: &[String], deadline: Instant) -> Vec<Option<muster_proto::v1::ReplicaStatus>> {
    loop {
        let mut statuses = Vec::new();
        for addr in real {
            statuses.push(client::status(addr).await);
        }
        if checks::replicas_agree(&statuses).passed || Instant::now() > deadline {
            return statuses;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fault_menu_is_everything_or_the_named_kinds() {
        assert_eq!(fault_menu(&[]).unwrap(), nemesis::KINDS.to_vec());
        let menu = fault_menu(&["power-loss-all".into(), "kill-leader".into()]).unwrap();
        assert_eq!(menu.iter().map(|&(_, k)| k).collect::<Vec<_>>(), [FaultKind::PowerLossAll, FaultKind::KillLeader]);
        let err = fault_menu(&["meteor".into()]).unwrap_err();
        assert!(err.contains("unknown fault \"meteor\"") && err.contains("lagging-follower"), "{err}");
        assert!(fault_kinds().contains(&"power-loss-replica"));
    }

    /// A replica's port lies below the ports the kernel hands outgoing
    /// connections, is free, and is never handed out twice.
    #[test]
    fn replica_ports_are_free_distinct_and_below_the_ephemeral_range() {
        let (low, high) = below_ephemeral_ports();
        let ports: BTreeSet<u16> =
            (0..20).map(|_| free_port().unwrap().rsplit(':').next().unwrap().parse::<u16>().unwrap()).collect();
        assert_eq!(ports.len(), 20, "a port handed out twice: {ports:?}");
        for p in &ports {
            assert!((low..=high).contains(p), "{p} outside {low}-{high}");
            std::net::TcpListener::bind(("127.0.0.1", *p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }
}
