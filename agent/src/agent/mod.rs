//! The node agent: one long-lived stream to the leader, the executor, and
//! reconnection.
//!
//! ```text
//!   loop:
//!     connect to the leader (hint from a refusal, else the next replica)
//!     send Register{node, resources, running tasks}
//!     Assign ──▶ Claim ──▶ ClaimGranted ──▶ executor::spawn ──▶ (exit) ──▶ TaskExited ──▶ Recorded
//!     Stop ──▶ SIGTERM → grace → SIGKILL to the task's process group
//!     Preempt{epoch} ──▶ the same stop, once (repeats are no-ops) ──▶ (exit) ──▶
//!         CheckpointUpload (if MUSTER_CHECKPOINT_DIR holds files) ──▶ Preempted{epoch} ──▶ Recorded
//!     CheckpointHint{epoch} ──▶ request file + SIGUSR1, once ──▶ done / exit / deadline (see
//!         `hint`) ──▶ the same stop ──▶ CheckpointUpload ──▶ Preempted{epoch, checkpoint_failed}
//!     every heartbeat interval: Heartbeat{running}
//!   on any stream error: keep the processes running, back off (jittered), reconnect
//! ```
//!
//! Exit and preempted reports (with their checkpoint) are kept until the
//! leader confirms them (`Recorded`) and are re-sent after a reconnect. A
//! `Preempt` for a task this agent does not run (it restarted, or the process
//! already ended) is acked at once. Each running attempt's process group is
//! recorded in `WORK_DIR/running/`; an agent that starts and finds records
//! from a previous life kills those groups first (it can no longer watch
//! them), then registers with nothing running, and the leader fails what it
//! thought ran there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use muster_core::sm::CheckpointStore;

use muster_clock::SharedClock;
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as Out;
use muster_proto::v1::agent_service_client::AgentServiceClient;
use muster_proto::v1::scheduler_message::Msg as In;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::checkpoint;
use crate::executor::{self, Exit, TaskLaunch};
use crate::hint::{Hint, HintWatch, Verdict};
use crate::serve::Grants;
use crate::store::{Naming, Saved, Stores};
use crate::watchdog::{self, ProgressFile, Sampler, WatchdogConfig, Watchdogs};

mod fence;
mod image;
mod record;
mod reports;
mod session;
mod task;
#[cfg(test)]
mod tests;
mod waiter;

use image::*;
pub use image::{BUILTIN_RUNTIME, IMAGE_PULL_FAILED, ImageRuntime, runtime_label};
use record::*;
use reports::*;
use task::*;
use waiter::*;

/// The largest message on the stream: the leader's own limit.
const MAX_MESSAGE_BYTES: usize = muster_proto::MAX_AGENT_MESSAGE_BYTES;

/// The agent's settings.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's id.
    pub node_id: String,
    /// Scheduler replicas, `host:port`.
    pub schedulers: Vec<String>,
    /// What the node offers.
    pub resources: v1::Resources,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// `host:port` gang peers reach this node at.
    pub address: String,
    /// The TCP ports this node offers for gangs' rendezvous (empty: none).
    pub ports: muster_core::sm::PortRange,
    /// Where logs and process records live.
    pub work_dir: PathBuf,
    /// Shortest and longest pause between reconnects.
    pub backoff: (Duration, Duration),
    /// Watchdog knobs (the budget and stall window come with each task).
    pub watchdog: WatchdogConfig,
    /// Makes the sampler each attempt's watchdogs read the process group
    /// with (`/proc` and NVML by default; tests inject fakes).
    pub sampler: fn() -> Box<dyn Sampler>,
    /// Exit (`run` returns) once the scheduler says the node is stopped and
    /// nothing runs here, so a wrapper script can power the machine off.
    pub exit_when_stopped: bool,
    /// Keep tasks across agent restarts (`muster agent --keep-tasks`): the
    /// `muster` binary whose `task-shim` runs each task. Tasks then outlive
    /// this agent (it leaves them running when it exits), and the next agent
    /// with the same work dir adopts them. `None`: tasks are this agent's
    /// children, stopped when it exits; leftovers of an earlier agent are
    /// killed at start.
    pub task_shim: Option<PathBuf>,
    /// This node's agent certificate and the cluster CA; `None` connects
    /// without TLS (`--insecure`).
    pub tls: Option<muster_tls::TlsMaterial>,
    /// The one clock the agent and its hint code read.
    pub clock: SharedClock,
    /// Work-dir cleaning: log retention and the size cap.
    pub janitor: crate::janitor::JanitorConfig,
    /// Stop the running tasks once no leader has answered for half its
    /// node-lost window, before a leader may place them again (see
    /// `fence.rs`); `false` keeps them running (`--keep-running-when-cut-off`).
    pub fence: bool,
    /// Neither adopt nor kill what an earlier agent left running: a
    /// deliberate bug (`--forget-leftovers`, tests only), whose tasks then run
    /// on unwatched while the leader places them again.
    pub forget_leftovers: bool,
    /// Injected disk faults (`--disk-fault-file`, tests and chaos only): the
    /// file reading `full` makes the agent's writes that need new space
    /// fail with ENOSPC.
    pub disk_fault_file: Option<PathBuf>,
    /// Start an attempt even when its record cannot be written: a
    /// deliberate bug (`--start-without-record`, tests only), whose tasks
    /// the next agent can neither adopt nor kill.
    pub start_without_record: bool,
    /// Where this agent serves the checkpoints on its disk to other nodes'
    /// agents (`None`: it serves none, and a task placed elsewhere cannot
    /// resume from a checkpoint written here).
    pub checkpoint_listen: Option<std::net::SocketAddr>,
    /// The `host:port` other agents reach that service at (empty: the
    /// listening address; a port of 0: the one bound).
    pub checkpoint_address: String,
    /// Each attempt's cgroup (`crate::cgroup`); `None`: tasks are bare
    /// process groups (`--no-isolation`, the node labelled
    /// `muster.isolation=none`).
    pub isolation: Option<Arc<crate::cgroup::Isolation>>,
    /// Who each allocation's tasks run as (`crate::users`):
    /// [`crate::users::RunAs::agent`] runs them as this agent's own user.
    pub run_as: crate::users::RunAs,
    /// The `muster` binary, whose `task-shim` and `task-exec` keep tasks
    /// across agent restarts (`--keep-tasks`; `None`: tasks are not kept).
    pub exe: Option<PathBuf>,
    /// Container images (`None`: the node runs none, and does not carry
    /// the `muster.images` label).
    pub images: Option<ImageRuntime>,
    /// What starts attempts (`None`: real processes,
    /// [`executor::ProcessExecutor`]); a simulated one
    /// ([`executor::sim::SimExecutor`]) runs fleet benches on the real
    /// protocol.
    pub executor: Option<Arc<dyn executor::Executor>>,
}

/// Heartbeat intervals without a word from the leader (it acks every
/// heartbeat) before the agent drops the stream and looks for a leader.
pub const LEADER_SILENT_INTERVALS: u32 = 3;

/// The file in the work dir holding the node's lifecycle status as the
/// scheduler last told it (`ready`, `draining`, `stopped`, …), for scripts.
pub const NODE_STATUS_FILE: &str = "node-status";

/// The default sampler: `/proc` for memory and CPU, NVML for GPUs if present.
pub fn proc_sampler() -> Box<dyn Sampler> {
    Box::new(watchdog::ProcSampler::default())
}

/// The sampler of simulated attempts: reads nothing.
pub fn null_sampler() -> Box<dyn Sampler> {
    Box::new(watchdog::NullSampler)
}

/// One attempt: allocation, task index, reservation epoch.
type Key = muster_core::sync::TaskKey;

fn key_of(t: &Option<v1::TaskRef>) -> Option<Key> {
    t.as_ref().map(|t| (t.alloc_id, t.task_index, t.epoch))
}

fn task_ref(k: Key) -> v1::TaskRef {
    v1::TaskRef { alloc_id: k.0, task_index: k.1, epoch: k.2 }
}

/// A running agent. Dropping the shutdown sender (or sending `true`) stops
/// it; running tasks are stopped with the grace.
pub struct Agent {
    cfg: AgentConfig,
    running: BTreeMap<Key, Running>,
    /// Assignments received but not yet granted.
    assigned: BTreeMap<Key, v1::Assign>,
    /// Assignments not yet claimed because processes this agent still runs
    /// hold the GPUs they need (tasks the leader no longer places here, in
    /// their stop grace): claimed as GPUs come free.
    deferred: BTreeMap<Key, v1::Assign>,
    /// Exit and preempted reports not yet confirmed by the leader.
    unrecorded: BTreeMap<Key, Report>,
    /// Checkpoints written whose manifest the leader has not confirmed
    /// (its report is not recorded): deleted if it refuses them.
    uploads: BTreeMap<Key, Saved>,
    free_gpus: BTreeSet<u32>,
    exits_tx: mpsc::UnboundedSender<(Key, Ended)>,
    exits_rx: mpsc::UnboundedReceiver<(Key, Ended)>,
    /// Attempts whose checkpoint restore finished (or was stopped).
    prepared_tx: mpsc::UnboundedSender<(Key, Prepared)>,
    prepared_rx: mpsc::UnboundedReceiver<(Key, Prepared)>,
    /// Retired checkpoints deleted, to confirm to the leader.
    deleted_tx: mpsc::UnboundedSender<Vec<u64>>,
    deleted_rx: mpsc::UnboundedReceiver<Vec<u64>>,
    /// Retired checkpoints being deleted now (a heartbeat repeats the ask).
    deleting: Arc<std::sync::Mutex<BTreeSet<u64>>>,
    /// The checkpoint stores.
    stores: Arc<Stores>,
    /// What this node may serve to whom.
    grants: Grants,
    leader_hint: Option<String>,
    /// The address the current (or last) session dialled.
    addr: String,
    /// The current session's stream was accepted by a leader.
    established: bool,
    /// The window the leader said to spread a reconnect over, when a
    /// stream it accepted breaks (`Registered`, `HeartbeatAck`).
    reconnect_spread: Duration,
    /// When the tasks must stop if no leader answers (self-fencing).
    fence: fence::Fence,
    /// When the current session's `Register` went out.
    register_sent: tokio::time::Instant,
    next: usize,
    jitter: u64,
    /// Told the node is stopped, with `exit_when_stopped` set.
    exit_now: bool,
    /// Attempts an earlier agent left running (with `task_shim`), adopted
    /// when `run` starts.
    leftovers: Vec<(Key, Record)>,
    /// The records of started attempts, for the agent after this one.
    records: Records,
    /// Attempts whose image is being pulled (the heartbeat says how far).
    pulls: image::Pulls,
    /// The image digests last reported (`None`: not yet this session).
    images_sent: Option<Vec<String>>,
    /// Prefetches under way.
    prefetching: Arc<std::sync::atomic::AtomicUsize>,
    /// What starts attempts.
    executor: Arc<dyn executor::Executor>,
}

enum SessionEnd {
    Shutdown,
    Reconnect,
}

/// What the agent does after a connection attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Try again at once.
    AtOnce,
    /// A replica named the leader whose stream just broke: it has most
    /// likely not noticed yet (its leader watch takes a few milliseconds).
    /// Wait [`NOTICE_PAUSE`] and ask a replica again, instead of dialling
    /// the dead leader.
    Notice,
    /// Back off, after this many rounds in a row in which no replica took
    /// the stream.
    BackOff(u32),
}

/// How long an agent waits before asking again when a replica names the
/// leader it just lost.
const NOTICE_PAUSE: Duration = Duration::from_millis(50);

/// The longest reconnect spread an agent takes from a leader.
const MAX_RECONNECT_SPREAD: Duration = Duration::from_secs(60);

/// The window a leader's `reconnect_spread_ms` names, as the agent takes it
/// (at most [`MAX_RECONNECT_SPREAD`]).
fn reconnect_spread(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms)).min(MAX_RECONNECT_SPREAD)
}

/// When an agent dials again after a stream a leader accepted broke: a
/// point of `spread` fixed by its node id, the same every time, so that a
/// fleet's reconnects fall evenly over the window.
pub fn reconnect_after(node_id: &str, spread: Duration) -> Duration {
    // Salted apart from the first sweep's point.
    crate::janitor::point_in(("reconnect", node_id), spread)
}

/// The agent's reconnection budget.
#[derive(Debug, Default)]
struct Retries {
    /// Rounds in a row in which no replica took the stream.
    failures: u32,
    /// Attempts made without a pause since the last pause.
    quick: usize,
    /// The leader whose accepted stream broke, until a replica names it.
    lost: Option<String>,
}

impl Retries {
    /// The stream to `addr`, which a leader had accepted, broke.
    fn lost(&mut self, addr: &str) {
        self.lost = Some(addr.to_string());
    }

    /// After an attempt that failed, or that a replica answered by naming
    /// a leader (`named`), the agent goes again at once, to each replica
    /// once and to the leader it names, and then backs off. The first
    /// replica to name the leader whose stream just broke gets a short
    /// pause instead: followers learn that a leader's process is gone a
    /// few milliseconds after its agents do, and until then they name it.
    /// Dialling it would fail at once, and the quick attempts would run
    /// out in those milliseconds, leaving the agent a whole backoff behind
    /// the election. A leader that is in fact alive is named again, and
    /// followed then.
    fn next(&mut self, failed: bool, named: Option<&str>, replicas: usize) -> Next {
        if named.is_some() && named == self.lost.as_deref() {
            self.lost = None;
            return Next::Notice;
        }
        if (failed || named.is_some()) && self.quick < replicas {
            self.quick += 1;
            return Next::AtOnce;
        }
        self.quick = 0;
        self.failures = if failed { self.failures + 1 } else { 0 };
        Next::BackOff(self.failures)
    }
}

impl Agent {
    /// An agent with this configuration. Process groups an earlier agent
    /// with the same work dir left behind are adopted when it runs (with
    /// `task_shim`), or killed now (without).
    pub fn new(mut cfg: AgentConfig) -> std::io::Result<Agent> {
        let executor: Arc<dyn executor::Executor> =
            cfg.executor.clone().unwrap_or_else(|| Arc::new(executor::ProcessExecutor));
        if !executor.real()
            && (cfg.isolation.is_some() || cfg.images.is_some() || cfg.task_shim.is_some() || cfg.run_as.switches())
        {
            return Err(std::io::Error::other(
                "simulated tasks run no process: they take no cgroups, images, task shim or other accounts",
            ));
        }
        let isolation = cfg.isolation.as_ref().map_or("none", |iso| iso.version().label());
        cfg.labels.insert(crate::cgroup::ISOLATION_LABEL.to_string(), isolation.to_string());
        // Images run only inside a cgroup, through the muster binary.
        match (&cfg.images, &cfg.isolation, &cfg.exe) {
            (Some(images), Some(iso), Some(_)) => {
                // An OCI runtime names one cgroup path for every hierarchy.
                if let Some(program) = &images.oci
                    && iso.uniform_path().is_none()
                {
                    return Err(std::io::Error::other(format!(
                        "--container-runtime {}: this agent's cgroups lie at different paths in the v1 \
                         hierarchies (its own cgroups differ between controllers), and an OCI runtime takes one \
                         path for all: give --cgroup-root an absolute path, e.g. /muster/{}",
                        program.display(),
                        cfg.node_id
                    )));
                }
                let runtime = image::runtime_label(images);
                tracing::info!(
                    node = %cfg.node_id,
                    runtime = %runtime,
                    nvidia_container_cli = ?images.nvidia,
                    "this node runs container images"
                );
                cfg.labels.insert(muster_core::sm::IMAGES_LABEL.to_string(), runtime);
            }
            (Some(_), _, _) => {
                tracing::warn!("container images need cgroup isolation and the muster binary: this node runs none");
                cfg.images = None;
            }
            _ => {}
        }
        crate::users::prepare_work_dir(&cfg.work_dir, &cfg.run_as).map_err(std::io::Error::other)?;
        let (mut records, found) = Records::open(cfg.work_dir.join("running"), cfg.disk_fault_file.clone())?;
        let mut leftovers = Vec::new();
        for Found { slot, key, record } in found {
            if cfg.forget_leftovers {
                records.release(slot);
                continue;
            }
            match (key, record) {
                (Some(key), Ok(r)) if cfg.task_shim.is_some() => {
                    records.adopt(slot, key);
                    leftovers.push((key, r));
                    continue;
                }
                (_, Ok(Record { pgid, .. }) | Err(Some(pgid))) if pgid > 1 => {
                    tracing::warn!(pgid, "killing a process group left by a previous agent");
                    executor::signal_group(pgid, libc::SIGKILL);
                }
                _ => {}
            }
            records.release(slot);
        }
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let (prepared_tx, prepared_rx) = mpsc::unbounded_channel();
        let (deleted_tx, deleted_rx) = mpsc::unbounded_channel();
        let stores = Arc::new(Stores::new(&cfg.work_dir, &cfg.node_id, cfg.tls.clone()));
        let free_gpus = (0..cfg.resources.gpus).collect();
        let jitter =
            cfg.node_id.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3));
        let fence_on = cfg.fence;
        Ok(Agent {
            cfg,
            running: BTreeMap::new(),
            assigned: BTreeMap::new(),
            deferred: BTreeMap::new(),
            unrecorded: BTreeMap::new(),
            uploads: BTreeMap::new(),
            free_gpus,
            exits_tx,
            exits_rx,
            prepared_tx,
            prepared_rx,
            deleted_tx,
            deleted_rx,
            deleting: Arc::default(),
            stores,
            grants: Grants::default(),
            leader_hint: None,
            addr: String::new(),
            established: false,
            reconnect_spread: Duration::ZERO,
            fence: fence::Fence::new(fence_on, tokio::time::Instant::now()),
            register_sent: tokio::time::Instant::now(),
            next: 0,
            jitter,
            exit_now: false,
            leftovers,
            records,
            pulls: Default::default(),
            images_sent: None,
            prefetching: Default::default(),
            executor,
        })
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.kill_strays().await;
        self.adopt_leftovers();
        if let Some(listen) = self.cfg.checkpoint_listen {
            self.serve_checkpoints(listen, shutdown.clone()).await;
        }
        let mut retries = Retries::default();
        loop {
            if *shutdown.borrow() {
                break;
            }
            self.fence_if_due();
            let outcome = self.session(&mut shutdown).await;
            self.fence.stream_ended();
            let established = std::mem::take(&mut self.established);
            if established {
                // The stream ran: whatever ended it, start afresh.
                retries = Retries::default();
            }
            let failed = match outcome {
                Ok(SessionEnd::Shutdown) => break,
                Ok(SessionEnd::Reconnect) => false,
                Err(e) => {
                    metrics::counter!("muster_agent_stream_failures_total").increment(1);
                    tracing::debug!(node = %self.cfg.node_id, error = %e, "agent stream failed");
                    if established {
                        retries.lost(&self.addr);
                    }
                    true
                }
            };
            let pause = match retries.next(failed, self.leader_hint.as_deref(), self.cfg.schedulers.len()) {
                Next::AtOnce => Duration::ZERO,
                Next::Notice => {
                    self.leader_hint = None;
                    NOTICE_PAUSE
                }
                Next::BackOff(failures) => self.backoff(failures),
            };
            // A stream a leader had accepted broke: its leader may be gone,
            // and then every agent of the fleet lost its stream at the same
            // moment. Each waits its own point of the window the leader
            // gave, so that the successor takes them a few at a time.
            let pause =
                if established { pause.max(reconnect_after(&self.cfg.node_id, self.reconnect_spread)) } else { pause };
            let fence = self.fence_deadline();
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
                _ = sleep_until_some(fence) => {}
            }
        }
        if self.cfg.task_shim.is_some() {
            // --keep-tasks: the next agent adopts them.
            tracing::info!(node = %self.cfg.node_id, tasks = self.running.len(), "agent exiting; its tasks keep running");
            return;
        }
        let grace = Duration::from_secs(5);
        let mut waiting = 0;
        for (_, r) in std::mem::take(&mut self.running) {
            if let Some(ctrl) = r.ctrl {
                let _ = ctrl.send(Control::Stop(grace));
                waiting += 1;
            }
        }
        // Let the stopped tasks' waiters finish (and remove their records
        // and cgroups).
        let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(5);
        while waiting > 0 {
            match tokio::time::timeout_at(deadline, self.exits_rx.recv()).await {
                Ok(Some((key, _))) => {
                    self.records.clear(key);
                    waiting -= 1;
                }
                _ => break,
            }
        }
        if waiting == 0
            && let Some(iso) = &self.cfg.isolation
        {
            iso.remove_if_empty();
        }
    }

    /// Kills what is left in the cgroups of attempts this agent does not
    /// adopt: an earlier agent's tasks (with `--keep-tasks` off), and any
    /// process of theirs that escaped its process group, found through
    /// its cgroup whatever became of the records.
    async fn kill_strays(&mut self) {
        let Some(iso) = self.cfg.isolation.clone() else { return };
        if self.cfg.forget_leftovers {
            return;
        }
        let adopted: BTreeSet<Key> = self.leftovers.iter().map(|(k, _)| *k).collect();
        for key in iso.existing() {
            if adopted.contains(&key) {
                continue;
            }
            let cg = iso.attempt(key);
            let pids = cg.pids();
            if !pids.is_empty() {
                tracing::warn!(
                    alloc_id = key.0,
                    task = key.1,
                    epoch = key.2,
                    processes = pids.len(),
                    "killing the processes of an attempt an earlier agent left"
                );
            }
            cg.kill_all().await;
            cg.remove();
        }
    }

    /// Starts the service other agents fetch this node's checkpoints from.
    /// A port that cannot be bound is logged, and the agent runs on without
    /// it (its checkpoints then restore only here, or from a shared store).
    async fn serve_checkpoints(&mut self, listen: std::net::SocketAddr, mut shutdown: watch::Receiver<bool>) {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(node = %self.cfg.node_id, addr = %listen, error = %e, "cannot serve checkpoints");
                return;
            }
        };
        let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let port = listener.local_addr().map_or(0, |a| a.port());
        if self.cfg.checkpoint_address.is_empty() {
            self.cfg.checkpoint_address = local.clone();
        } else if let Some(host) = self.cfg.checkpoint_address.strip_suffix(":0") {
            // Any free port was asked for: advertise the one bound.
            self.cfg.checkpoint_address = format!("{host}:{port}");
        }
        let server = crate::serve::CheckpointServer::new(
            self.stores.node_root().to_path_buf(),
            self.grants.clone(),
            self.cfg.tls.is_some(),
        );
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.cfg.tls {
            match builder.tls_config(tls.server_config()) {
                Ok(b) => builder = b,
                Err(e) => {
                    tracing::error!(node = %self.cfg.node_id, error = %e, "cannot serve checkpoints over TLS");
                    return;
                }
            }
        }
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let router = builder.add_service(server.into_service());
        tracing::info!(node = %self.cfg.node_id, addr = %local, advertised = %self.cfg.checkpoint_address, "serving checkpoints");
        tokio::spawn(async move {
            let stop = async move {
                while !*shutdown.borrow() {
                    if shutdown.changed().await.is_err() {
                        break;
                    }
                }
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::error!(error = %e, "the checkpoint service stopped");
            }
        });
    }

    /// Deletes retired checkpoints the leader names (those not already being
    /// deleted), off this loop; the seqs deleted come back on `deleted`.
    fn delete_checkpoints(&self, d: v1::DeleteCheckpoints) {
        let fresh: Vec<v1::CheckpointManifest> = {
            let mut busy = self.deleting.lock().expect("deleting lock");
            d.checkpoints.into_iter().filter(|m| busy.insert(m.seq)).collect()
        };
        if fresh.is_empty() {
            return;
        }
        let (stores, deleting, done) = (self.stores.clone(), self.deleting.clone(), self.deleted_tx.clone());
        tokio::spawn(async move {
            let mut deleted = Vec::new();
            for m in &fresh {
                match stores.delete(m).await {
                    Ok(()) => deleted.push(m.seq),
                    Err(e) => {
                        tracing::warn!(seq = m.seq, key = %m.key, error = %e, "cannot delete a retired checkpoint")
                    }
                }
            }
            let mut busy = deleting.lock().expect("deleting lock");
            for m in &fresh {
                busy.remove(&m.seq);
            }
            if !deleted.is_empty() {
                tracing::info!(count = deleted.len(), "retired checkpoints deleted");
                let _ = done.send(deleted);
            }
        });
    }

    /// When the running tasks must stop if no leader answers first; `None`
    /// with nothing running, or with fencing off or done.
    fn fence_deadline(&self) -> Option<tokio::time::Instant> {
        self.fence.due().filter(|_| self.running.values().any(|r| r.ctrl.is_some()))
    }

    /// Stops every running task once the fence is due: no leader has
    /// answered for half its node-lost window, so one may soon place them
    /// elsewhere (`fence.rs`).
    fn fence_if_due(&mut self) {
        let Some(due) = self.fence_deadline() else { return };
        let now = tokio::time::Instant::now();
        if now < due {
            return;
        }
        let grace = self.fence.grace();
        let mut stopped = 0;
        for r in self.running.values_mut() {
            if let Some(ctrl) = r.ctrl.take() {
                let _ = ctrl.send(Control::Stop(grace));
                stopped += 1;
            }
        }
        self.fence.fenced();
        metrics::counter!("muster_agent_fenced_total").increment(1);
        tracing::warn!(
            node = %self.cfg.node_id,
            tasks = stopped,
            silent_s = self.fence.silent_for(now).as_secs_f64(),
            "no leader has answered this node for half its node-lost window: stopping its tasks before a leader places them elsewhere"
        );
    }

    /// Exponential backoff with deterministic per-node jitter, after
    /// `failures` rounds in a row in which no replica took the stream.
    fn backoff(&mut self, failures: u32) -> Duration {
        let (lo, hi) = self.cfg.backoff;
        let base = lo.saturating_mul(1u32 << failures.min(6)).min(hi);
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let extra = base.as_millis() as u64 / 2;
        base + Duration::from_millis(if extra == 0 { 0 } else { self.jitter % extra })
    }

    fn pick_address(&mut self) -> String {
        if let Some(hint) = self.leader_hint.take() {
            return hint;
        }
        let addr = self.cfg.schedulers[self.next % self.cfg.schedulers.len()].clone();
        self.next += 1;
        addr
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
