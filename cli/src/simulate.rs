//! `muster simulate`: the deterministic simulator from the command line.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use muster_scheduler::policy::{AdmissionConfig, Order, PackChoice};
use muster_scheduler::sm::Resources;
use muster_sim::{SimConfig, Simulation, WorkloadConfig, load_trace};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Policy {
    /// Largest gang first, then class, priority and submit time (the default).
    LargestFirst,
    /// Strict first-come-first-served: the pass stops at the first misfit.
    Fifo,
}

/// Which rack a packed gang takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PackChoiceArg {
    /// The rack with the fewest nodes that could take a task (the server's
    /// choice): the emptiest racks stay whole for larger gangs.
    Tightest,
    /// The first rack with room in best-fit order (a baseline).
    FirstFit,
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Nodes in the simulated cluster.
    #[arg(long, default_value_t = 100)]
    nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// A heterogeneous fleet instead of --nodes and --gpus-per-node: a CSV
    /// with the header count,gpus,gpu_model,vram_mb,mem_mb,cpus,labels (one
    /// row per node class; labels KEY=VALUE joined by ';'). The report then
    /// gives utilisation and queueing delay per GPU model.
    #[arg(long, value_name = "CSV", conflicts_with_all = ["nodes", "gpus_per_node"])]
    node_list: Option<PathBuf>,
    /// Every gang of more than one task must run under one value of this
    /// node label (e.g. rack, from --node-list's labels).
    #[arg(long, value_name = "KEY")]
    pack_by: Option<String>,
    /// Which value a packed gang takes, of those with room for it.
    #[arg(long, value_enum, default_value_t = PackChoiceArg::Tightest, requires = "pack_by")]
    pack_choice: PackChoiceArg,
    /// Synthetic allocations to submit (ignored with --trace).
    #[arg(long, default_value_t = 1000)]
    allocations: u32,
    /// Seed for the workload and every simulated agent's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replay a job trace (Philly CSV, plain or .gz) instead of a synthetic workload.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replay only the first N jobs of the trace (by submit time).
    #[arg(long)]
    limit: Option<usize>,
    /// Admission order.
    #[arg(long, value_enum, default_value_t = Policy::LargestFirst)]
    policy: Policy,
    /// Turn EASY backfill off (the first gang that does not fit gets no
    /// planned start; largest-first skips it, FIFO stops at it).
    #[arg(long)]
    no_backfill: bool,
    /// Synthetic arrivals per second (default: sized to --load).
    #[arg(long)]
    arrival_rate: Option<f64>,
    /// Synthetic offered load as a share of the cluster's GPUs.
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// The share of synthetic submissions that are job arrays (2 to 50
    /// one-task elements each).
    #[arg(long, default_value_t = 0.0, value_name = "SHARE")]
    arrays: f64,
    /// The share of synthetic submissions that are three-step workflows
    /// (prep → train, the gang → eval); the report gives their makespans.
    #[arg(long, default_value_t = 0.0, value_name = "SHARE")]
    workflows: f64,
    /// Chance that a task attempt fails.
    #[arg(long)]
    failure_prob: Option<f64>,
    /// Chance that an agent never claims its reservation (so it goes stale).
    #[arg(long)]
    lost_claim_prob: Option<f64>,
    /// Check every state invariant after every N commands (0: only at the end).
    #[arg(long, default_value_t = 0)]
    check_every: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Run the priority-preemption pass after each admission pass (server
    /// defaults: 3 victims, 2 min minimum runtime, 5 min near completion).
    #[arg(long)]
    preemption: bool,
    /// Nodes that crash during the run (at random times between the first
    /// and last submit): the leader's tick marks each lost after 30 s of
    /// silence, its tasks fail over, and it registers again 10 min later.
    #[arg(long, default_value_t = 0)]
    node_failures: u32,
    /// Forget finished allocations this long after they end, as a replica
    /// does with `muster server --retention` (default: keep them all). The
    /// report is the same; the state, and memory, stay bounded.
    #[arg(long)]
    retention: Option<String>,
    /// Also write what the run leaves as a backup, in `muster cluster
    /// backup`'s form: the final state and a job history holding every
    /// finished allocation, for `muster replay` to read.
    #[arg(long, value_name = "FILE")]
    save_backup: Option<PathBuf>,
}

/// This process's peak resident memory (`VmHWM`), MB, where Linux says.
fn peak_memory_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn probability(name: &str, p: f64) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&p) {
        bail!("--{name} must be between 0 and 1, got {p}");
    }
    Ok(p)
}

/// Writes `state` and the job history `records` as a backup file.
fn save_backup(
    path: &std::path::Path,
    state: &muster_scheduler::sm::State,
    records: &[muster_core::history::JobRecord],
) -> anyhow::Result<()> {
    use muster_raft_store::StateMachineApp;
    let tmp = tempfile::tempdir().context("cannot make a temporary directory")?;
    let store = muster_history::HistoryStore::open(&tmp.path().join("history.sqlite"))?;
    for chunk in records.chunks(10_000) {
        store.insert(chunk)?;
    }
    let copy = tmp.path().join("backup.sqlite");
    store.backup_to(&copy)?;
    let extra = std::fs::read(&copy).with_context(|| format!("cannot read {}", copy.display()))?;
    let backup = muster_raft_store::Backup {
        index: 0,
        digest: state.digest(),
        taken_at_ms: state.now_ms(),
        taken_from: 0,
        state: state.snapshot(),
        extra,
    };
    std::fs::write(path, backup.encode()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if args.gpus_per_node == 0 || args.gpus_per_node > 64 {
        bail!("--gpus-per-node must be between 1 and 64, got {}", args.gpus_per_node);
    }
    if args.limit == Some(0) {
        bail!("--limit must be at least 1");
    }
    probability("arrays", args.arrays)?;
    probability("workflows", args.workflows)?;
    if args.arrays + args.workflows > 1.0 {
        bail!("--arrays and --workflows together must be at most 1, got {}", args.arrays + args.workflows);
    }
    if !(args.load > 0.0 && args.load.is_finite()) {
        bail!("--load must be a positive number, got {}", args.load);
    }
    if let Some(rate) = args.arrival_rate
        && !(rate > 0.0 && rate.is_finite())
    {
        bail!("--arrival-rate must be a positive number, got {rate}");
    }
    let fleet = match &args.node_list {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            muster_sim::parse_fleet(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Vec::new(),
    };
    // Trace jobs are cut into tasks of at most the largest node's GPUs;
    // the trace says nothing of GPU memory, so a task asks for what every
    // GPU of the fleet has (half the smallest's).
    let smallest_vram = fleet.iter().filter(|f| f.resources.gpus > 0).map(|f| f.resources.vram_mb).min();
    let node = match fleet.iter().map(|f| f.resources).max_by_key(|r| (r.gpus, r.mem_mb, r.cpus)) {
        Some(largest) => Resources { vram_mb: smallest_vram.unwrap_or(largest.vram_mb), ..largest },
        None => Resources {
            gpus: args.gpus_per_node,
            vram_mb: 80_000,
            mem_mb: 128_000 * u64::from(args.gpus_per_node),
            cpus: 12 * args.gpus_per_node,
        },
    };
    let gpus_total: u64 = if fleet.is_empty() {
        u64::from(args.nodes) * u64::from(args.gpus_per_node)
    } else {
        fleet.iter().map(|f| u64::from(f.resources.gpus)).sum()
    };
    let synthetic = args.trace.is_none();
    let jobs = match &args.trace {
        Some(path) => load_trace(path, &node, args.limit).with_context(|| format!("loading {}", path.display()))?,
        None => {
            if args.allocations == 0 {
                bail!("--allocations must be at least 1");
            }
            let workload = WorkloadConfig {
                allocations: args.allocations,
                arrival_rate_per_s: args.arrival_rate,
                target_load: args.load,
                array_share: args.arrays,
                workflow_share: args.workflows,
                ..WorkloadConfig::default()
            };
            workload.generate(args.seed, &node, gpus_total)
        }
    };
    let mut jobs = jobs;
    if let Some(key) = &args.pack_by {
        let pack = muster_scheduler::sm::Packing::parse(key).map_err(|e| anyhow::anyhow!("--pack-by {e}"))?;
        for job in jobs.iter_mut().filter(|j| j.spec.gang_size > 1) {
            job.spec.placement.pack_by = Some(pack.clone());
        }
    }
    let order = match args.policy {
        Policy::LargestFirst => Order::LargestFirst,
        Policy::Fifo => Order::Fifo,
    };
    // Synthetic runs exercise the failure paths by default; a trace replay
    // runs every job once, as the trace recorded it.
    let failure_prob = probability("failure-prob", args.failure_prob.unwrap_or(if synthetic { 0.02 } else { 0.0 }))?;
    let lost_claim_prob =
        probability("lost-claim-prob", args.lost_claim_prob.unwrap_or(if synthetic { 0.002 } else { 0.0 }))?;
    let cfg = SimConfig {
        nodes: args.nodes,
        node,
        seed: args.seed,
        admission: AdmissionConfig {
            order,
            backfill: !args.no_backfill,
            pack_choice: match args.pack_choice {
                PackChoiceArg::Tightest => PackChoice::Tightest,
                PackChoiceArg::FirstFit => PackChoice::FirstFit,
            },
            ..AdmissionConfig::default()
        },
        failure_prob,
        lost_claim_prob,
        check_every: args.check_every,
        preemption: args.preemption.then(muster_scheduler::policy::PreemptionConfig::default),
        node_failures: args.node_failures,
        fleet,
        retention: match &args.retention {
            None => None,
            Some(r) => {
                let s = crate::args::parse_duration_s(r).context("--retention")?;
                if s == 0 {
                    bail!("--retention must be at least 1s");
                }
                Some(muster_scheduler::policy::RetentionConfig { retention_ms: s * 1000, ..Default::default() })
            }
        },
        ..SimConfig::default()
    };
    let started = Instant::now();
    let report = match &args.save_backup {
        None => Simulation::new(cfg, jobs).run()?.0,
        Some(path) => {
            let (report, state, records) = Simulation::new(cfg, jobs).run_recording()?;
            save_backup(path, &state, &records)?;
            report
        }
    };
    let wall = started.elapsed();
    if args.json {
        out!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{report}");
        out!("simulated in  {:.2} s of wall time", wall.as_secs_f64());
        if let Some(mb) = peak_memory_mb() {
            out!("peak memory   {mb:.0} MB (resident, the whole process)");
        }
    }
    Ok(())
}
