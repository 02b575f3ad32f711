//! `muster replay`: a cluster's real workload, from a backup, a data dir or
//! a job history, replayed through the simulator as recorded and under
//! what-if settings (`muster_sim::replay`). Offline: it never talks to a
//! cluster, and reads its inputs without changing them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use muster_core::history::JobRecord;
use muster_raft_store::Backup;
use muster_scheduler::policy::{AdmissionConfig, Order, RetentionConfig};
use muster_scheduler::sm::{IMAGES_LABEL, ISOLATION_LABEL, PORTS_LABEL, State, VClusterSpec};
use muster_sim::replay::{MAX_REPLAY_JOBS, ReplaySettings, compare, replay, workload_of};
use muster_sim::{FleetNode, parse_fleet};

use crate::server::PreemptionArgs;
use crate::simulate::Policy;

/// How the report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The side-by-side summary.
    Text,
    /// The summary as JSON.
    Json,
    /// One row per job: its waits in the three columns.
    Csv,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A backup from `muster cluster backup`: the state (fleet, vClusters,
    /// live allocations) and the job history.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["data_dir", "history"], required_unless_present_any = ["data_dir", "history"])]
    backup: Option<PathBuf>,
    /// A replica's data dir: its snapshot and log (the state at its
    /// committed index) and its job history, read, never written.
    #[arg(long, value_name = "DIR", conflicts_with = "history")]
    data_dir: Option<PathBuf>,
    /// A job-history database (a replica's `history.sqlite`), with --fleet.
    #[arg(long, value_name = "FILE", requires = "fleet")]
    history: Option<PathBuf>,
    /// The fleet for --history: a node list, as `muster simulate
    /// --node-list` reads (count,gpus,gpu_model,vram_mb,mem_mb,cpus,labels).
    #[arg(long, value_name = "CSV", requires = "history")]
    fleet: Option<PathBuf>,
    /// How the recorded cluster's leader preempted: the same flags, and
    /// defaults, as `muster server`'s.
    #[command(flatten)]
    recorded: PreemptionArgs,
    /// What-if: this admission order.
    #[arg(long, value_enum, help_heading = "What-if")]
    policy: Option<Policy>,
    /// What-if: EASY backfill off.
    #[arg(long, help_heading = "What-if")]
    no_backfill: bool,
    /// What-if: priority preemption and reclamation off.
    #[arg(long, help_heading = "What-if")]
    no_preemption: bool,
    /// What-if: this SIGTERM → SIGKILL grace for preempted tasks, ms.
    #[arg(long, value_name = "MS", help_heading = "What-if")]
    what_if_preemption_grace_ms: Option<u64>,
    /// What-if: a vCluster's GPU quota, NAME=GPUS (`NAME=none` lifts it);
    /// repeatable.
    #[arg(long, value_name = "NAME=GPUS", help_heading = "What-if")]
    vcluster_max_gpus: Vec<String>,
    /// What-if: a vCluster's borrow limit, NAME=PERCENT; repeatable.
    #[arg(long, value_name = "NAME=PCT", help_heading = "What-if")]
    vcluster_borrow: Vec<String>,
    /// What-if: these nodes added (a node list CSV, as --fleet). Each
    /// reports the rendezvous ports, isolation and image runtime of the
    /// recorded fleet's first node, unless its labels say otherwise.
    #[arg(long, value_name = "CSV", help_heading = "What-if")]
    add_nodes: Option<PathBuf>,
    /// What-if: this many nodes removed (the last ones by node id).
    #[arg(long, value_name = "N", help_heading = "What-if")]
    remove_nodes: Option<u32>,
    /// What-if: finished allocations forgotten this long after they end
    /// (e.g. 1h), as `muster server --retention`.
    #[arg(long, value_name = "DURATION", help_heading = "What-if")]
    retention: Option<String>,
    /// Print the report as text, JSON, or CSV (one row per job).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

impl ReplayArgs {
    fn has_what_if(&self) -> bool {
        self.policy.is_some()
            || self.no_backfill
            || self.no_preemption
            || self.what_if_preemption_grace_ms.is_some()
            || !self.vcluster_max_gpus.is_empty()
            || !self.vcluster_borrow.is_empty()
            || self.add_nodes.is_some()
            || self.remove_nodes.is_some()
            || self.retention.is_some()
    }
}

/// What a replay reads: the records, the fleet and the vClusters, and when
/// the records were taken.
struct Recorded {
    records: Vec<JobRecord>,
    settings: ReplaySettings,
    horizon_ms: u64,
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut recorded = read_input(args)?;
    recorded.settings.preemption = Some(args.recorded.config()?);
    // A vCluster the records name that the state does not (a history
    // without a state, or one removed since) runs with a default spec.
    let known: BTreeSet<String> = recorded.settings.vclusters.iter().map(|(n, _)| n.clone()).collect();
    let named: BTreeSet<String> = recorded.records.iter().map(|r| r.vcluster.clone()).collect();
    for name in named.difference(&known) {
        recorded.settings.vclusters.push((name.clone(), VClusterSpec::default_for(name)));
    }
    let what_if = if args.has_what_if() { Some(what_if(args, &recorded.settings)?) } else { None };
    let actual_gpus: u64 = recorded.settings.nodes.iter().map(|n| u64::from(n.resources.gpus)).sum();
    let (jobs, order) = workload_of(&recorded.records, recorded.horizon_ms);
    let as_recorded = replay(jobs.clone(), &recorded.settings).context("replaying as recorded")?;
    let changed = match &what_if {
        Some(settings) => Some(replay(jobs, settings).context("replaying the what-if")?),
        None => None,
    };
    let report = compare(&recorded.records, &order, actual_gpus, &as_recorded, changed.as_ref());
    match args.format {
        Format::Text => {
            out!("{report}");
            let runs = if changed.is_some() { 2.0 } else { 1.0 };
            let hours = as_recorded.span_ms as f64 / 3_600_000.0;
            let wall = started.elapsed().as_secs_f64();
            out!(
                "\nreplayed {} of simulated time {} in {wall:.2} s of wall time ({:.1} simulated hours per second)",
                span(as_recorded.span_ms),
                if changed.is_some() { "twice" } else { "once" },
                hours * runs / wall.max(1e-9)
            );
        }
        Format::Json => out!("{}", serde_json::to_string_pretty(&report)?),
        Format::Csv => print!("{}", report.to_csv()),
    }
    Ok(())
}

/// A span of simulated time in words: seconds, minutes or hours.
fn span(ms: u64) -> String {
    match ms {
        0..120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        120_000..7_200_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

fn read_input(args: &ReplayArgs) -> anyhow::Result<Recorded> {
    if let Some(path) = &args.backup {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let backup = Backup::decode(&bytes).with_context(|| path.display().to_string())?;
        let state: State = backup.verify().with_context(|| path.display().to_string())?;
        if backup.extra.is_empty() {
            bail!(
                "{}: this backup carries no job history (it predates them); replay a data dir instead",
                path.display()
            );
        }
        let tmp = tempfile::tempdir().context("cannot make a temporary directory")?;
        let db = tmp.path().join("history.sqlite");
        std::fs::write(&db, &backup.extra).with_context(|| format!("cannot write {}", db.display()))?;
        let records = read_history(&db).with_context(|| format!("{}: its job history", path.display()))?;
        return Ok(from_state(&state, records));
    }
    if let Some(dir) = &args.data_dir {
        let state = crate::audit::replayed_state(dir)?;
        let db = dir.join("history.sqlite");
        if !db.exists() {
            bail!("{} holds no job history ({} is missing)", dir.display(), db.display());
        }
        return Ok(from_state(&state, read_history_of(&db)?));
    }
    let (Some(history), Some(fleet)) = (&args.history, &args.fleet) else {
        bail!("give --backup FILE, --data-dir DIR, or --history FILE with --fleet CSV");
    };
    let text = std::fs::read_to_string(fleet).with_context(|| format!("cannot read {}", fleet.display()))?;
    let nodes = parse_fleet(&text).map_err(|e| anyhow::anyhow!("{}: {e}", fleet.display()))?;
    let records = read_history_of(history)?;
    let horizon_ms = records.iter().map(|r| r.end_ms).max().unwrap_or(0);
    Ok(Recorded { records, settings: settings(nodes, Vec::new()), horizon_ms })
}

fn settings(nodes: Vec<FleetNode>, vclusters: Vec<(String, VClusterSpec)>) -> ReplaySettings {
    ReplaySettings { nodes, vclusters, admission: AdmissionConfig::default(), preemption: None, retention: None }
}

/// Every record of a replica's history database, read through a copy made
/// over a read-only connection (the file is never written).
fn read_history_of(db: &Path) -> anyhow::Result<Vec<JobRecord>> {
    let tmp = tempfile::tempdir().context("cannot make a temporary directory")?;
    let copy = tmp.path().join("history.sqlite");
    muster_history::HistoryStore::copy_read_only(db, &copy)?;
    read_history(&copy)
}

/// Every record of the history database at `path`, in finishing order.
fn read_history(path: &Path) -> anyhow::Result<Vec<JobRecord>> {
    let store = muster_history::HistoryStore::open(path)?;
    let count = store.count()? as usize;
    if count > MAX_REPLAY_JOBS {
        bail!("the job history holds {count} records; a replay takes at most {MAX_REPLAY_JOBS}");
    }
    let mut records = Vec::with_capacity(count);
    let mut next = 1;
    let last = store.max_seq()?;
    while next <= last {
        let batch = store.by_seq(next, last, 10_000)?;
        let Some(end) = batch.last().map(|r| r.seq) else { break };
        records.extend(batch);
        next = end + 1;
    }
    Ok(records)
}

/// The fleet, vClusters and live allocations of `state`, with the
/// history's records (and those of finished allocations the history does
/// not hold yet).
fn from_state(state: &State, mut records: Vec<JobRecord>) -> Recorded {
    let stored: BTreeSet<u64> = records.iter().map(|r| r.id).collect();
    records.extend(state.allocs().values().filter(|a| !stored.contains(&a.id)).map(|a| JobRecord::of(state, a)));
    let nodes = state
        .nodes()
        .iter()
        .map(|n| FleetNode { id: Some(n.id.to_string()), resources: n.resources, labels: n.labels.clone() })
        .collect();
    let vclusters = state.vclusters().into_iter().map(|v| (v.name, v.spec)).collect();
    let horizon_ms = records.iter().map(|r| r.end_ms).max().unwrap_or(0).max(state.now_ms());
    Recorded { records, settings: settings(nodes, vclusters), horizon_ms }
}

/// `NAME=VALUE`, for the flag `flag`.
fn name_value<'a>(flag: &str, item: &'a str) -> anyhow::Result<(&'a str, &'a str)> {
    match item.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim(), value.trim())),
        _ => bail!("--{flag}: {item:?} is not NAME=VALUE"),
    }
}

/// The recorded settings with the what-if flags applied.
fn what_if(args: &ReplayArgs, recorded: &ReplaySettings) -> anyhow::Result<ReplaySettings> {
    let mut s = recorded.clone();
    if let Some(policy) = args.policy {
        s.admission.order = match policy {
            Policy::LargestFirst => Order::LargestFirst,
            Policy::Fifo => Order::Fifo,
        };
    }
    if args.no_backfill {
        s.admission.backfill = false;
    }
    if let Some(ms) = args.what_if_preemption_grace_ms {
        if args.no_preemption {
            bail!("--what-if-preemption-grace-ms and --no-preemption contradict each other");
        }
        if ms > u64::from(u32::MAX) {
            bail!("--what-if-preemption-grace-ms must fit in 32 bits of milliseconds");
        }
        if let Some(p) = &mut s.preemption {
            p.grace_ms = ms;
        }
    }
    if args.no_preemption {
        s.preemption = None;
    }
    for item in &args.vcluster_max_gpus {
        let (name, value) = name_value("vcluster-max-gpus", item)?;
        let max = match value {
            "none" => None,
            v => Some(v.parse::<u32>().with_context(|| format!("--vcluster-max-gpus {item:?}: not a GPU count"))?),
        };
        vcluster(&mut s, "vcluster-max-gpus", name)?.quota.max_gpus = max;
    }
    for item in &args.vcluster_borrow {
        let (name, value) = name_value("vcluster-borrow", item)?;
        let pct: u8 = value
            .parse()
            .ok()
            .filter(|p| *p <= 100)
            .with_context(|| format!("--vcluster-borrow {item:?}: the limit is a percentage, 0 to 100"))?;
        vcluster(&mut s, "vcluster-borrow", name)?.borrow_limit_pct = pct;
    }
    if let Some(n) = args.remove_nodes {
        let n = n as usize;
        if n >= s.nodes.len() {
            bail!("--remove-nodes {n}: the recorded fleet has only {} nodes", s.nodes.len());
        }
        let mut ids: Vec<(String, usize)> =
            s.nodes.iter().enumerate().map(|(i, node)| (node.id.clone().unwrap_or_default(), i)).collect();
        ids.sort();
        let gone: BTreeSet<usize> = ids.iter().rev().take(n).map(|(_, i)| *i).collect();
        s.nodes = s.nodes.iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, n)| n.clone()).collect();
    }
    if let Some(path) = &args.add_nodes {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let added = parse_fleet(&text).map_err(|e| anyhow::anyhow!("--add-nodes {}: {e}", path.display()))?;
        let taken: BTreeSet<String> = s.nodes.iter().filter_map(|n| n.id.clone()).collect();
        // What a node's agent reports of itself beyond the node list's
        // columns (its rendezvous ports, isolation, image runtime): an added
        // node reports what the recorded fleet's first node did, unless
        // the list says otherwise, so it can take the same tasks.
        let agent_set: Vec<(String, String)> = s.nodes.first().map_or(Vec::new(), |n| {
            [PORTS_LABEL, ISOLATION_LABEL, IMAGES_LABEL]
                .iter()
                .filter_map(|k| Some((k.to_string(), n.labels.get(*k)?.clone())))
                .collect()
        });
        let mut k = 0;
        for mut node in added {
            for (key, value) in &agent_set {
                node.labels.entry(key.clone()).or_insert_with(|| value.clone());
            }
            let id = loop {
                k += 1;
                let id = format!("what-if-{k:05}");
                if !taken.contains(&id) {
                    break id;
                }
            };
            node.id = Some(id);
            s.nodes.push(node);
        }
        if s.nodes.len() > muster_sim::MAX_FLEET_NODES {
            bail!("--add-nodes: the fleet would hold more than {} nodes", muster_sim::MAX_FLEET_NODES);
        }
    }
    if let Some(r) = &args.retention {
        let secs = crate::args::parse_duration_s(r).context("--retention")?;
        if secs == 0 {
            bail!("--retention must be at least 1s");
        }
        s.retention = Some(RetentionConfig { retention_ms: secs * 1000, ..Default::default() });
    }
    Ok(s)
}

/// The spec of vCluster `name` in `s`, for the flag `flag`.
fn vcluster<'a>(s: &'a mut ReplaySettings, flag: &str, name: &str) -> anyhow::Result<&'a mut VClusterSpec> {
    let names: Vec<String> = s.vclusters.iter().map(|(n, _)| n.clone()).collect();
    match s.vclusters.iter_mut().find(|(n, _)| n == name) {
        Some((_, spec)) => Ok(spec),
        None => bail!("--{flag}: no vCluster {name:?} in the recording (it has {})", names.join(", ")),
    }
}
