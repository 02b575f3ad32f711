//! `muster server`: run one scheduler replica until SIGINT or SIGTERM.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use muster_scheduler::policy::PreemptionConfig;
use muster_scheduler::server::{Replica, ReplicaConfig};
use tokio::net::TcpSocket;

/// `muster server --node-admission`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeAdmission {
    /// Only admitted nodes register.
    Required,
    /// Any node with a certificate for its name registers.
    Open,
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// This replica's id (1, 2, 3, …), the same across restarts.
    #[arg(long)]
    id: u64,
    /// Address to serve gRPC on (Raft, client and admin services).
    #[arg(long)]
    listen: SocketAddr,
    /// Address peers and clients use to reach this replica (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Where the log and snapshots live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The initial cluster, this replica included: 1=host:port,2=host:port,3=host:port.
    /// Used only on the first start (the lowest id bootstraps the cluster);
    /// a restart resumes from the data dir.
    /// Leave out to start empty and join with `muster cluster add-learner`.
    #[arg(long)]
    peers: Option<String>,
    /// Serve plain HTTP on this address: Prometheus metrics (/metrics),
    /// probes (/healthz, /readyz) and the read-only dashboard (/ui). No TLS
    /// and no login: bind it to loopback or a management network.
    #[arg(long, alias = "metrics")]
    http: Option<SocketAddr>,
    /// Which nodes may register. `required`: only nodes an admin admitted
    /// (`muster node admit`), for at most what they were admitted for.
    /// `open`: any node with an agent certificate for its name, claiming
    /// what it likes (a node admitted anyway is still held to it). Set the
    /// same on every replica.
    #[arg(long, value_enum, default_value_t = NodeAdmission::Required)]
    node_admission: NodeAdmission,
    /// Rebuild the dashboard's view at most this often (ms); requests in
    /// between are answered from the cached view.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    ui_refresh_ms: u64,
    /// Requests per second one client address may make to /ui, its API and
    /// /metrics (bursts of twice that); more get 429. Probes are not counted.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    http_rate: u32,
    /// A file holding a token (16–256 of A–Z a–z 0–9 - . _ ~) that /ui, its
    /// API and /metrics then require: `Authorization: Bearer TOKEN`, or open
    /// /ui?token=TOKEN once in a browser. Probes stay open.
    #[arg(long)]
    http_token_file: Option<PathBuf>,
    /// Snapshot every this many log entries (and purge behind it).
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Log entries kept behind a snapshot (a follower further behind gets
    /// the snapshot instead).
    #[arg(long, default_value_t = 1_000)]
    keep_log_behind_snapshot: u64,
    /// Most commands batched into one log entry.
    #[arg(long, default_value_t = 4096)]
    max_batch: usize,
    /// Leader heartbeat in ms (the election timeout is 4–5 heartbeats).
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// SIGTERM → SIGKILL grace agents give a task being stopped or preempted, ms.
    #[arg(long, default_value_t = 15_000)]
    preempt_grace_ms: u64,
    /// A gang teardown's tasks that have not acked this long after it started
    /// are forced to preempted (a node died mid-teardown), ms.
    #[arg(long, default_value_t = 45_000)]
    teardown_force_after_ms: u64,
    /// A node silent this long while holding work is marked lost, ms.
    #[arg(long, default_value_t = 30_000)]
    node_lost_after_ms: u64,
    /// Agents heartbeat this often, ms.
    #[arg(long, default_value_t = 5_000)]
    agent_heartbeat_ms: u64,
    /// Agent streams a second a successor is to take after a failover:
    /// agents whose stream breaks spread their reconnects over the leader's
    /// streams at this rate (at most a sixth of --node-lost-after-ms).
    #[arg(long, default_value_t = muster_scheduler::server::api::agent_hub::DEFAULT_RECONNECT_RATE,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    agent_reconnect_rate: u32,
    #[command(flatten)]
    preemption: PreemptionArgs,
    /// Turn EASY backfill off: a gang that does not fit is skipped and
    /// smaller ones run ahead of it however long they take (docs/admission.md).
    #[arg(long)]
    no_backfill: bool,
    /// Do not record why gangs wait: `alloc explain` then has no wait
    /// timeline for gangs admission held back (docs/replay.md).
    #[arg(long)]
    no_wait_notes: bool,
    #[command(flatten)]
    tls: crate::client::TlsArgs,
    /// Open connections allowed in all; more are closed at once.
    #[arg(long, default_value_t = 4096, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_connections: usize,
    /// Open connections allowed from one IP address.
    #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_connections_per_peer: usize,
    /// Concurrent calls and watches on one connection.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_streams_per_connection: u32,
    /// A TLS handshake not done by then drops the connection.
    #[arg(long, default_value = "10s")]
    handshake_timeout: String,
    /// A call with no response by then fails with DEADLINE_EXCEEDED.
    #[arg(long, default_value = "120s")]
    request_timeout: String,
    /// Default walltime (the budget watchdog's limit) for a class, when a
    /// submit gives none: CLASS=DURATION, e.g. 0=30m (repeatable; others 1h).
    #[arg(long = "default-walltime", value_name = "CLASS=DURATION")]
    default_walltime: Vec<String>,
    /// A node drain's timeout when neither `muster node drain --timeout` nor
    /// the node's muster.drain-timeout label gives one.
    #[arg(long, default_value = "4h")]
    drain_timeout: String,
    /// Registry credentials (a docker config.json) with which a submit's
    /// image tag is resolved to the digest every task then runs.
    #[arg(long, value_name = "FILE")]
    registry_auth: Option<std::path::PathBuf>,
    /// CA certificates (PEM) to trust for registries, besides the system's.
    #[arg(long, value_name = "FILE")]
    registry_ca: Option<std::path::PathBuf>,
    /// Leave image tags unresolved at submit (each agent resolves the tag
    /// when it pulls, so a gang's tasks may run different bytes if the tag
    /// moves meanwhile).
    #[arg(long)]
    no_image_resolve: bool,
    /// How long a finished allocation stays in the live state (then only
    /// `muster history` has it), or `off` to keep every one.
    #[arg(long, default_value = "3h")]
    retention: String,
    /// How long a finished allocation is held whole (environment, events,
    /// checkpoints, every attempt) before it is compacted: the live state
    /// then keeps its outcome, and `muster alloc get` answers from its
    /// job-history record. At most --retention (equal: never compacted);
    /// default 60s, or --retention when that is shorter.
    #[arg(long)]
    detail_retention: Option<String>,
    /// The most finished allocations held whole, however recent: beyond
    /// it the oldest are compacted first (bounds the memory a burst of
    /// finishes takes; about 3 KiB each).
    #[arg(long, default_value_t = muster_scheduler::policy::DEFAULT_KEEP_WHOLE)]
    detail_max: u64,
    /// How long after its submit an idempotency key is still honoured once
    /// its allocation is forgotten (a retried submit within it is answered
    /// with the original allocation, never run twice).
    #[arg(long, default_value = "24h")]
    idempotency_window: String,
    /// Append every applied log entry to <data-dir>/applied.log, kept past
    /// log compaction, for replay (`muster chaos`) and audit. Not fsynced;
    /// grows without bound.
    #[arg(long)]
    keep_applied_log: bool,
    /// The crash-consistency shim: record what each fsync made durable in
    /// <data-dir>/crash-image/, for a simulated power loss. Tests only.
    #[arg(long, hide = true)]
    crash_image: bool,
    /// A deliberate bug, to prove the chaos checks catch one
    /// (ack-before-commit, ack-before-fsync, ack-despite-fsync-error,
    /// ack-despite-write-error, unpaced-leader-clock, removed-voters-linger,
    /// spare-failed-gang-peers, refuse-slow-writes).
    /// Tests only.
    #[arg(long, hide = true)]
    inject_bug: Option<String>,
    /// Injected disk faults: the log reads this control file before each
    /// append and sync (fsync-eio, append-enospc, slow-sync MS, stall-sync;
    /// absent: none). Tests and `muster chaos` only.
    #[arg(long, hide = true, value_name = "PATH")]
    disk_fault_file: Option<PathBuf>,
    /// Injected clock faults: this replica's wall clock reads the host's
    /// moved by what this control file says (OFFSET_MS, or OFFSET_MS
    /// DRIFT_PER_MILLE SINCE_MS; absent: not moved). Tests and `muster chaos`
    /// only.
    #[arg(long, hide = true, value_name = "PATH")]
    clock_offset_file: Option<PathBuf>,
}

/// The exit status of a replica whose storage failed (an fsync or a write
/// of its log): it stopped serving, and a supervisor should start it again
/// once the disk is fixed; it reads back what is on disk.
pub const EXIT_STORAGE_FAILED: i32 = 75;

/// The gRPC listener's accept queue asked for: the kernel caps it at
/// `net.core.somaxconn` (4,096 by default since Linux 5.4; raise it for
/// fleets larger than that).
const LISTEN_BACKLOG: u32 = 65_535;

/// A duration flag that must be at least a second.
fn positive_duration(flag: &str, value: &str) -> anyhow::Result<Duration> {
    let s = crate::args::parse_duration_s(value).with_context(|| flag.to_string())?;
    if s == 0 {
        bail!("{flag} must be at least 1s");
    }
    Ok(Duration::from_secs(s))
}

/// Parses `CLASS=DURATION` pairs.
pub fn parse_walltime_defaults(items: &[String]) -> anyhow::Result<BTreeMap<u8, u64>> {
    let mut out = BTreeMap::new();
    for item in items {
        let (class, d) =
            item.split_once('=').with_context(|| format!("--default-walltime {item:?} is not CLASS=DURATION"))?;
        let class: u8 = class
            .trim()
            .parse()
            .ok()
            .filter(|c| *c <= 10)
            .with_context(|| format!("--default-walltime: {class:?} is not a class 0-10"))?;
        let s = crate::args::parse_duration_s(d).context("--default-walltime")?;
        if s == 0 {
            bail!("--default-walltime: {item:?} must be at least 1 second");
        }
        out.insert(class, s);
    }
    Ok(out)
}

/// Priority-preemption knobs (docs/preemption.md).
#[derive(Args, Debug, Clone)]
pub struct PreemptionArgs {
    /// Most allocations one preemption decision may stop.
    #[arg(long, default_value_t = 3)]
    preemption_max_victims: usize,
    /// An allocation is not preempted within this long after it (re)started, ms.
    #[arg(long, default_value_t = 120_000)]
    preemption_min_runtime_ms: u64,
    /// An allocation this close to the end of its walltime is not preempted, ms.
    #[arg(long, default_value_t = 300_000)]
    near_completion_ms: u64,
    /// How long a hinted task has to checkpoint (one +50 % extension if it acknowledges), ms.
    #[arg(long, default_value_t = 600_000)]
    checkpoint_timeout_ms: u64,
    /// The longest deferral a hinted task may ask for, ms.
    #[arg(long, default_value_t = 300_000)]
    max_deferral_ms: u64,
    /// SIGTERM → SIGKILL grace for a preempted task (after its checkpoint, or at once without one), ms.
    #[arg(long, default_value_t = 30_000)]
    preemption_grace_ms: u64,
    /// An allocation preempted more than this many times counts in muster_preemption_cycles_total.
    #[arg(long, default_value_t = 3)]
    preemption_cycle_threshold: u32,
    /// A decision reads candidates from this share of the feasible nodes at a time (at least 100 nodes); 100
    /// compares every candidate at once (exact, slower on large clusters).
    #[arg(long, default_value_t = 5)]
    preemption_candidate_nodes_percent: usize,
    /// How long a vCluster's queued gang waits before borrowed work on its
    /// home nodes is preempted for it (elastic reclamation's return grace), ms.
    #[arg(long, default_value_t = muster_scheduler::policy::DEFAULT_RETURN_GRACE_MS)]
    reclaim_grace_ms: u64,
    /// A queued gang whose planned start (running work reaching its walltime,
    /// backfill keeping the nodes) is at most this far off waits instead of
    /// preempting, ms (0: preempt at once).
    #[arg(long, default_value_t = muster_scheduler::policy::DEFAULT_PREEMPTION_WAIT_MS)]
    pub preemption_wait_ms: u64,
}

impl PreemptionArgs {
    /// The policy config these flags describe, or what is wrong with them.
    pub fn config(&self) -> anyhow::Result<PreemptionConfig> {
        let ms32 = u64::from(u32::MAX);
        if self.checkpoint_timeout_ms == 0 || self.checkpoint_timeout_ms > ms32 {
            bail!("--checkpoint-timeout-ms must be between 1 and {ms32}");
        }
        if self.preemption_candidate_nodes_percent == 0 || self.preemption_candidate_nodes_percent > 100 {
            bail!("--preemption-candidate-nodes-percent must be between 1 and 100");
        }
        if self.max_deferral_ms > ms32 || self.preemption_grace_ms > ms32 {
            bail!("--max-deferral-ms and --preemption-grace-ms must fit in 32 bits of milliseconds");
        }
        Ok(PreemptionConfig {
            max_victims: self.preemption_max_victims,
            min_runtime_ms: self.preemption_min_runtime_ms,
            near_completion_ms: self.near_completion_ms,
            checkpoint_timeout_ms: self.checkpoint_timeout_ms,
            max_deferral_ms: self.max_deferral_ms,
            grace_ms: self.preemption_grace_ms,
            cycle_threshold: self.preemption_cycle_threshold,
            candidate_nodes_percent: self.preemption_candidate_nodes_percent,
            wait_ms: self.preemption_wait_ms,
            ..PreemptionConfig::default()
        })
    }
}

/// Parses `1=host:port,2=host:port`.
pub fn parse_peers(list: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((id, addr)) = item.split_once('=') else { crate::usage!("--peers: {item:?} is not id=host:port") };
        let Ok(id) = id.trim().parse::<u64>() else { crate::usage!("--peers: {id:?} is not a replica id") };
        if id == 0 {
            crate::usage!("--peers: replica ids start at 1");
        }
        let addr = addr.trim();
        if crate::client::parse_addresses(addr).is_err() {
            crate::usage!("--peers: {addr:?} is not host:port");
        }
        if peers.insert(id, addr.to_string()).is_some() {
            crate::usage!("--peers: replica {id} is listed twice");
        }
    }
    Ok(peers)
}

/// The allocator's own figures: bytes held by live allocations, and bytes
/// it keeps resident (those plus its metadata and the freed pages it has
/// not returned yet). `None` when jemalloc cannot say.
pub fn allocator_figures() -> Option<(u64, u64)> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    let allocated = tikv_jemalloc_ctl::stats::allocated::read().ok()?;
    let resident = tikv_jemalloc_ctl::stats::resident::read().ok()?;
    Some((allocated as u64, resident as u64))
}

/// Publishes [`allocator_figures`] as `muster_allocator_allocated_bytes` and
/// `muster_allocator_resident_bytes`, once a second, from one thread per
/// process (`muster dev` runs three servers in one; they share the figures).
pub fn publish_allocator_figures() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new().name("allocator-figures".into()).spawn(|| {
            loop {
                if let Some((allocated, resident)) = allocator_figures() {
                    metrics::gauge!("muster_allocator_allocated_bytes").set(allocated as f64);
                    metrics::gauge!("muster_allocator_resident_bytes").set(resident as f64);
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the thread that publishes the allocator's figures");
        }
    });
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    publish_allocator_figures();
    if args.id == 0 {
        bail!("--id: replica ids start at 1");
    }
    if args.snapshot_every == 0 || args.max_batch == 0 || args.heartbeat_ms == 0 {
        bail!("--snapshot-every, --max-batch and --heartbeat-ms must be at least 1");
    }
    if args.teardown_force_after_ms == 0 || args.node_lost_after_ms == 0 || args.agent_heartbeat_ms < 100 {
        bail!(
            "--teardown-force-after-ms and --node-lost-after-ms must be at least 1, --agent-heartbeat-ms at least 100"
        );
    }
    if args.preempt_grace_ms > u64::from(u32::MAX) || args.agent_heartbeat_ms > u64::from(u32::MAX) {
        bail!("--preempt-grace-ms and --agent-heartbeat-ms must fit in 32 bits of milliseconds");
    }
    let preemption = args.preemption.config()?;
    let reclaim = muster_scheduler::policy::ReclaimConfig {
        return_grace_ms: args.preemption.reclaim_grace_ms,
        ..Default::default()
    };
    let walltime_defaults = parse_walltime_defaults(&args.default_walltime)?;
    let drain_timeout_s = crate::args::parse_duration_s(&args.drain_timeout).context("--drain-timeout")?;
    let retention = match args.retention.as_str() {
        "off" => None,
        value => {
            let retention_ms = positive_duration("--retention", value)?.as_millis() as u64;
            let detail_ms = match &args.detail_retention {
                None => muster_scheduler::policy::DEFAULT_DETAIL_MS.min(retention_ms),
                Some(detail) => {
                    let ms = positive_duration("--detail-retention", detail)?.as_millis() as u64;
                    if ms > retention_ms {
                        bail!(
                            "--detail-retention {detail} is longer than --retention {value}: an allocation cannot \
                             stay whole after it is forgotten"
                        );
                    }
                    ms
                }
            };
            if args.detail_max > muster_scheduler::sm::MAX_KEEP_WHOLE {
                bail!("--detail-max {} is over the most, {}", args.detail_max, muster_scheduler::sm::MAX_KEEP_WHOLE);
            }
            Some(muster_scheduler::policy::RetentionConfig {
                retention_ms,
                detail_ms,
                keep_whole: args.detail_max,
                key_window_ms: crate::args::parse_duration_s(&args.idempotency_window)
                    .context("--idempotency-window")?
                    .saturating_mul(1000),
                ..Default::default()
            })
        }
    };
    let advertise = args.advertise.clone().unwrap_or_else(|| args.listen.to_string());
    let peers = match &args.peers {
        Some(list) => parse_peers(list)?,
        None => BTreeMap::new(),
    };
    if !peers.is_empty() {
        match peers.get(&args.id) {
            None => bail!("--peers must include this replica ({}={advertise})", args.id),
            Some(a) if *a != advertise => {
                bail!("--peers names replica {} at {a}, but it advertises {advertise}", args.id)
            }
            Some(_) => {}
        }
    }
    let socket = if args.listen.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
    // As long an accept queue as the kernel allows (net.core.somaxconn caps
    // it): after a failover every agent of the fleet dials the successor
    // within seconds, and a SYN that finds the queue full is dropped and
    // retried by the agent's TCP only 1, 3, 7 and 15 s later.
    let listener = socket.listen(LISTEN_BACKLOG)?;

    let mut cfg = ReplicaConfig::new(args.id, advertise, &args.data_dir);
    cfg.initial_members = peers;
    cfg.http = args.http;
    cfg.http_options = muster_scheduler::server::observe::http::HttpOptions {
        refresh_every: Duration::from_millis(args.ui_refresh_ms),
        rate_per_s: args.http_rate,
        token: match &args.http_token_file {
            Some(f) => {
                let t = std::fs::read_to_string(f).with_context(|| format!("--http-token-file {}", f.display()))?;
                let t = t.trim();
                muster_scheduler::server::observe::http::check_token(t)
                    .map_err(|e| anyhow::anyhow!("--http-token-file {}: {e}", f.display()))?;
                Some(t.into())
            }
            None => None,
        },
    };
    cfg.tls = args.tls.load(&muster_tls::Role::Server(args.id))?;
    cfg.limits = muster_scheduler::server::api::limits::ServerLimits {
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        max_streams_per_connection: args.max_streams_per_connection,
        handshake_timeout: positive_duration("--handshake-timeout", &args.handshake_timeout)?,
        request_timeout: positive_duration("--request-timeout", &args.request_timeout)?,
    };
    cfg.store.applied_log = args.keep_applied_log;
    cfg.store.crash_image = args.crash_image;
    cfg.store.disk_fault_file = args.disk_fault_file.clone();
    if let Some(file) = &args.clock_offset_file {
        cfg.clock = muster_clock::SharedClock::new(muster_clock::ShiftedClock::new(file));
    }
    cfg.raft.snapshot_every = args.snapshot_every;
    cfg.raft.keep_behind_snapshot = args.keep_log_behind_snapshot;
    cfg.raft.heartbeat_ms = args.heartbeat_ms;
    cfg.raft.election_timeout_ms = (args.heartbeat_ms * 4, args.heartbeat_ms * 5);
    cfg.max_batch = args.max_batch;
    cfg.hub.stop_grace = Duration::from_millis(args.preempt_grace_ms);
    cfg.hub.admission_required = args.node_admission == NodeAdmission::Required;
    cfg.hub.heartbeat_interval = Duration::from_millis(args.agent_heartbeat_ms);
    cfg.teardown_force_after = Duration::from_millis(args.teardown_force_after_ms);
    cfg.hub.node_lost_after = Duration::from_millis(args.node_lost_after_ms);
    cfg.hub.reconnect_rate = args.agent_reconnect_rate;
    cfg.preemption = preemption;
    cfg.admission.backfill = !args.no_backfill;
    cfg.admission.note_waits = !args.no_wait_notes;
    cfg.reclaim = reclaim;
    cfg.walltime_defaults = walltime_defaults;
    cfg.drain_timeout = Duration::from_secs(drain_timeout_s);
    cfg.registry = if args.no_image_resolve {
        None
    } else {
        let images = crate::images::ImageArgs {
            registry_auth: args.registry_auth.clone(),
            registry_ca: args.registry_ca.clone(),
            ..Default::default()
        };
        let registry = images.registry()?;
        // A CA given here that cannot be used is the operator's error.
        if args.registry_ca.is_some() {
            muster_registry::Registry::new(&registry).map_err(|e| anyhow::anyhow!("--registry-ca: {e}"))?;
        }
        Some(registry)
    };
    cfg.retention = retention;
    cfg.inject_bug = match args.inject_bug.as_deref() {
        None => None,
        Some(name) => Some(muster_scheduler::server::InjectedBug::parse(name).with_context(|| {
            format!(
                "--inject-bug {name:?}: the known bugs are {}",
                muster_scheduler::server::InjectedBug::NAMES.join(", ")
            )
        })?),
    };
    let replica = Replica::start(cfg, listener).await.context("cannot start the replica")?;
    eprintln!("muster server: replica {} serving on {}", replica.id(), replica.addr());
    if let Some(http) = replica.http_addr() {
        eprintln!("muster server: {}", muster_scheduler::server::observe::http::describe(http));
    }

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = replica.stopped() => {
            // Fail-stop: a replica whose disk failed serves nothing more; its
            // supervisor restarts it, and it reads back what is on disk.
            eprintln!(
                "muster server: replica {} stopped: {why}; exiting with status {EXIT_STORAGE_FAILED} so that its \
                 supervisor restarts it from what is on disk",
                replica.id()
            );
            tokio::time::timeout(Duration::from_secs(5), replica.shutdown()).await.ok();
            std::process::exit(EXIT_STORAGE_FAILED);
        }
    }
    eprintln!("muster server: shutting down");
    tokio::time::timeout(Duration::from_secs(10), replica.shutdown()).await.ok();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary's allocations go through jemalloc (`main.rs`), so its
    /// figures follow a large buffer in and out. Measured in a child process
    /// running only this test, so that no other test allocates meanwhile.
    #[test]
    fn the_allocator_figures_follow_a_large_buffer() {
        const NAME: &str = "server::tests::the_allocator_figures_follow_a_large_buffer";
        const SIZE: u64 = 64 << 20;
        if std::env::var_os("MUSTER_ALLOCATOR_PROBE").is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--test-threads", "1", "--nocapture"])
                .env("MUSTER_ALLOCATOR_PROBE", "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let (before, _) = allocator_figures().expect("jemalloc's statistics");
        let buffer = std::hint::black_box(vec![1u8; SIZE as usize]);
        let (during, resident) = allocator_figures().unwrap();
        assert!(during >= before + SIZE, "allocated {before} → {during}: the buffer did not come from jemalloc");
        assert!(resident >= SIZE, "resident {resident} while a written {SIZE}-byte buffer is live");
        drop(buffer);
        let (after, _) = allocator_figures().unwrap();
        assert!(after + SIZE <= during, "allocated {during} → {after} after the buffer was freed");
    }

    /// `main.rs` gives jemalloc one arena per CPU: the option is read, and
    /// the arena count follows the CPUs this process may run on.
    #[test]
    fn jemalloc_keeps_one_arena_per_cpu() {
        // SAFETY: `opt.percpu_arena` is a `const char *` in jemalloc, and it
        // points to a static, NUL-terminated name.
        let mode = unsafe {
            let name = tikv_jemalloc_ctl::raw::read::<*const std::ffi::c_char>(b"opt.percpu_arena\0").unwrap();
            std::ffi::CStr::from_ptr(name)
        };
        let mode = mode.to_str().unwrap();
        assert_eq!(mode, "percpu", "the binary's malloc_conf was not read");
        let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap() as usize;
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert!(arenas >= cpus && arenas < 4 * cpus.max(2), "{arenas} arenas for {cpus} CPUs");
    }

    #[test]
    fn peers_parse_and_bad_lists_are_named() {
        let p = parse_peers("1=127.0.0.1:7001, 2=127.0.0.1:7002").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[&2], "127.0.0.1:7002");
        assert!(parse_peers("1=a:1,1=b:2").unwrap_err().to_string().contains("listed twice"));
        assert!(parse_peers("x=a:1").unwrap_err().to_string().contains("not a replica id"));
        assert!(parse_peers("1:a:1").unwrap_err().to_string().contains("not id=host:port"));
        assert!(parse_peers("0=a:1").unwrap_err().to_string().contains("start at 1"));
        assert!(parse_peers("1=nohost").unwrap_err().to_string().contains("not host:port"));
    }

    #[test]
    fn walltime_defaults_parse_and_bad_ones_are_named() {
        let d = parse_walltime_defaults(&["0=30m".into(), "9=2h".into()]).unwrap();
        assert_eq!(d, BTreeMap::from([(0, 1800), (9, 7200)]));
        assert!(parse_walltime_defaults(&["11=1h".into()]).unwrap_err().to_string().contains("not a class"));
        assert!(parse_walltime_defaults(&["5".into()]).unwrap_err().to_string().contains("CLASS=DURATION"));
        assert!(parse_walltime_defaults(&["5=0s".into()]).unwrap_err().to_string().contains("at least 1 second"));
    }
}
