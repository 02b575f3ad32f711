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
use std::time::Duration;

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
use crate::watchdog::{self, ProgressFile, Sampler, WatchdogConfig, Watchdogs};

/// The checkpoint cap until the leader says otherwise (its default).
const DEFAULT_MAX_CHECKPOINT_BYTES: usize = 4 << 20;

/// The largest message on the stream (a checkpoint at the cap, plus framing).
const MAX_MESSAGE_BYTES: usize = 16 << 20;

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

type Key = (u64, u32, u64);

/// What `running/<alloc>-<task>-<epoch>` says about a started attempt, for
/// the agent after this one: `pgid=… attempt=… gpus=0,1 walltime_s=…
/// stall_s=… gpu_health=0|1 started_ms=…` (an old record holds the pgid
/// alone).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    pgid: i32,
    attempt: u32,
    gpus: Vec<u32>,
    walltime_s: u64,
    stall_s: u32,
    gpu_health: bool,
    /// Wall clock (ms since the epoch) when it started: an adopted task's
    /// budget counts from here, not from the adoption.
    started_ms: u64,
    /// The allocation checkpoints (a record without the field: assume so,
    /// and let the leader refuse an upload it does not want).
    checkpointing: bool,
}

impl Record {
    fn encode(&self) -> String {
        let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        format!(
            "pgid={} attempt={} gpus={} walltime_s={} stall_s={} gpu_health={} started_ms={} checkpointing={}\n",
            self.pgid,
            self.attempt,
            gpus.join(","),
            self.walltime_s,
            self.stall_s,
            u8::from(self.gpu_health),
            self.started_ms,
            u8::from(self.checkpointing)
        )
    }

    /// The full record, or just the pgid of an old one.
    fn decode(text: &str) -> Result<Record, Option<i32>> {
        let text = text.trim();
        if let Ok(pgid) = text.parse::<i32>() {
            return Err(Some(pgid));
        }
        let fields: BTreeMap<&str, &str> = text.split_whitespace().filter_map(|kv| kv.split_once('=')).collect();
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let pgid = fields.get("pgid").and_then(|v| v.parse::<i32>().ok());
        let parsed = (|| {
            Some(Record {
                pgid: pgid?,
                attempt: u32::try_from(num("attempt")?).ok()?,
                gpus: match fields.get("gpus")? {
                    &"" => Vec::new(),
                    g => g.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u32>>>()?,
                },
                walltime_s: num("walltime_s")?,
                stall_s: u32::try_from(num("stall_s")?).ok()?,
                gpu_health: num("gpu_health")? == 1,
                started_ms: num("started_ms")?,
                checkpointing: num("checkpointing") != Some(0),
            })
        })();
        parsed.ok_or(pgid)
    }
}

/// `<alloc>-<task>-<epoch>`.
fn parse_key(name: &str) -> Option<Key> {
    let mut it = name.split('-');
    let k = (it.next()?.parse().ok()?, it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    it.next().is_none().then_some(k)
}

fn key_of(t: &Option<v1::TaskRef>) -> Option<Key> {
    t.as_ref().map(|t| (t.alloc_id, t.task_index, t.epoch))
}

fn task_ref(k: Key) -> v1::TaskRef {
    v1::TaskRef { alloc_id: k.0, task_index: k.1, epoch: k.2 }
}

/// What the agent tells a running task's waiter.
enum Control {
    /// SIGTERM, this grace, SIGKILL.
    Stop(Duration),
    /// Ask it to checkpoint first.
    Hint(Hint),
}

/// How an attempt ended, from its waiter.
struct Ended {
    exit: Result<Exit, String>,
    /// It was hinted and did not checkpoint before the deadline.
    checkpoint_failed: bool,
    /// A watchdog stopped it.
    watchdog: Option<watchdog::Trip>,
}

struct Running {
    /// The waiter's control channel; `None` once told to stop.
    ctrl: Option<mpsc::UnboundedSender<Control>>,
    gpus: Vec<u32>,
    attempt: u32,
    /// The preemption epoch of the first `Preempt` for this attempt.
    preempt: Option<u64>,
    /// The allocation checkpoints: the directory is uploaded at any exit.
    checkpointing: bool,
    /// The fingerprint of the checkpoint this attempt was given (what the
    /// leader already holds): an unchanged directory is not uploaded again.
    restored: Option<u64>,
}

/// A report the leader has not confirmed yet.
#[derive(Clone, Debug)]
enum Report {
    /// Sent after the exit checkpoint, if any.
    Exited {
        exit: v1::TaskExited,
        checkpoint: Option<v1::CheckpointUpload>,
    },
    Preempted {
        checkpoint: Option<v1::CheckpointUpload>,
        ack: v1::Preempted,
    },
    Watchdog {
        trip: v1::WatchdogTripped,
        checkpoint: Option<v1::CheckpointUpload>,
    },
}

impl Agent {
    /// The tasks a `Register` lists as running: those whose process runs,
    /// and those that ended while their report (exit, watchdog) is not yet
    /// recorded. The leader fails a running task its agent does not list, so
    /// a task that finished while the agent was reconnecting must be listed
    /// until its re-sent exit report is recorded — else a success would be
    /// recorded as a failure with no exit code.
    fn registered_tasks(&self) -> Vec<v1::TaskRef> {
        let ended_unreported = self
            .unrecorded
            .iter()
            .filter(|(_, r)| matches!(r, Report::Exited { .. } | Report::Watchdog { .. }))
            .map(|(k, _)| k);
        let keys: BTreeSet<&Key> = self.running.keys().chain(ended_unreported).collect();
        keys.into_iter().map(|k| task_ref(*k)).collect()
    }
}

async fn send_report<F, Fut>(report: &Report, send: &F) -> Result<(), String>
where
    F: Fn(Out) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    match report {
        Report::Exited { exit, checkpoint } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::Exited(exit.clone())).await
        }
        Report::Watchdog { trip, checkpoint } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::WatchdogTripped(trip.clone())).await
        }
        Report::Preempted { checkpoint, ack } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::Preempted(*ack)).await
        }
    }
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
    /// The largest checkpoint the leader stores.
    max_checkpoint_bytes: usize,
    free_gpus: BTreeSet<u32>,
    exits_tx: mpsc::UnboundedSender<(Key, Ended)>,
    exits_rx: mpsc::UnboundedReceiver<(Key, Ended)>,
    leader_hint: Option<String>,
    next: usize,
    jitter: u64,
    /// Told the node is stopped, with `exit_when_stopped` set.
    exit_now: bool,
    /// Attempts an earlier agent left running (with `task_shim`), adopted
    /// when `run` starts.
    leftovers: Vec<(Key, Record)>,
}

enum SessionEnd {
    Shutdown,
    Reconnect,
}

impl Agent {
    /// An agent with this configuration. Process groups an earlier agent
    /// with the same work dir left behind are adopted when it runs (with
    /// `task_shim`), or killed now (without).
    pub fn new(cfg: AgentConfig) -> std::io::Result<Agent> {
        let records = cfg.work_dir.join("running");
        fs::create_dir_all(&records)?;
        let mut leftovers = Vec::new();
        for entry in fs::read_dir(&records)? {
            let path = entry?.path();
            let key = path.file_name().and_then(|n| n.to_str()).and_then(parse_key);
            let record = fs::read_to_string(&path).map_err(|_| None).and_then(|t| Record::decode(&t));
            match (key, record) {
                (Some(key), Ok(r)) if cfg.task_shim.is_some() => {
                    leftovers.push((key, r));
                    continue;
                }
                (_, Ok(Record { pgid, .. }) | Err(Some(pgid))) if pgid > 1 => {
                    tracing::warn!(pgid, "killing a process group left by a previous agent");
                    executor::signal_group(pgid, libc::SIGKILL);
                }
                _ => {}
            }
            let _ = fs::remove_file(&path);
        }
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let free_gpus = (0..cfg.resources.gpus).collect();
        let jitter =
            cfg.node_id.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3));
        Ok(Agent {
            cfg,
            running: BTreeMap::new(),
            assigned: BTreeMap::new(),
            deferred: BTreeMap::new(),
            unrecorded: BTreeMap::new(),
            max_checkpoint_bytes: DEFAULT_MAX_CHECKPOINT_BYTES,
            free_gpus,
            exits_tx,
            exits_rx,
            leader_hint: None,
            next: 0,
            jitter,
            exit_now: false,
            leftovers,
        })
    }

    /// Takes over the attempts an earlier agent left: a live one is watched
    /// again (its watchdogs' budget counted from its real start); one that
    /// ended meanwhile is reported with the status its shim wrote. Either
    /// way it is listed at the next `Register`.
    fn adopt_leftovers(&mut self) {
        for (key, r) in std::mem::take(&mut self.leftovers) {
            for g in &r.gpus {
                self.free_gpus.remove(g);
            }
            let (ctrl_tx, ctrl_rx) = mpsc::unbounded_channel::<Control>();
            self.running.insert(
                key,
                Running {
                    ctrl: Some(ctrl_tx),
                    gpus: r.gpus.clone(),
                    attempt: r.attempt,
                    preempt: None,
                    checkpointing: r.checkpointing,
                    restored: None,
                },
            );
            let status = executor::status_path(&self.cfg.work_dir, key.0, key.1, key.2);
            if executor::alive(r.pgid) && executor::is_shim(r.pgid) {
                let ran = Duration::from_millis(self.cfg.clock.wall_ms().saturating_sub(r.started_ms));
                let limits = watchdog::Limits {
                    budget: (r.walltime_s > 0).then(|| Duration::from_secs(r.walltime_s).saturating_sub(ran)),
                    stall: (r.stall_s > 0).then(|| Duration::from_secs(u64::from(r.stall_s))),
                    gpu_health: r.gpu_health,
                };
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    attempt = r.attempt,
                    pgid = r.pgid,
                    "adopted a task the previous agent left running"
                );
                self.watch(key, r.attempt, executor::adopt(r.pgid, status), limits, ctrl_rx);
            } else {
                let exit = executor::read_status(&status)
                    .ok_or_else(|| "the task ended while its agent was down, and its exit status was lost".to_string());
                tracing::info!(alloc_id = key.0, task = key.1, exit = ?exit, "a task the previous agent left ended meanwhile");
                let _ = self.exits_tx.send((key, Ended { exit, checkpoint_failed: false, watchdog: None }));
            }
        }
    }

    /// Watches a started (or adopted) attempt until it ends, then tells the
    /// session through `exits`.
    fn watch(
        &self,
        key: Key,
        attempt: u32,
        mut task: executor::RunningTask,
        limits: watchdog::Limits,
        ctrl_rx: mpsc::UnboundedReceiver<Control>,
    ) {
        let dogs = Watchdogs::new(self.cfg.watchdog, limits, tokio::time::Instant::now());
        let progress = watchdog::progress_path(&self.cfg.work_dir, key.0, key.1, attempt);
        let guard = Guard {
            dogs,
            progress: ProgressFile::new(progress),
            sampler: (self.cfg.sampler)(),
            poll: self.cfg.watchdog.poll,
        };
        let checkpoint_dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let exits = self.exits_tx.clone();
        let clock = self.cfg.clock.clone();
        tokio::spawn(async move {
            let ended = watch_task(&mut task, ctrl_rx, &checkpoint_dir, guard, &clock).await;
            let _ = exits.send((key, ended));
        });
    }

    fn record_path(&self, k: Key) -> PathBuf {
        self.cfg.work_dir.join("running").join(format!("{}-{}-{}", k.0, k.1, k.2))
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.adopt_leftovers();
        let mut failures = 0u32;
        loop {
            if *shutdown.borrow() {
                break;
            }
            match self.session(&mut shutdown).await {
                Ok(SessionEnd::Shutdown) => break,
                Ok(SessionEnd::Reconnect) => failures = 0,
                Err(e) => {
                    failures += 1;
                    metrics::counter!("muster_agent_stream_failures_total").increment(1);
                    tracing::debug!(node = %self.cfg.node_id, error = %e, "agent stream failed");
                }
            }
            let pause = self.backoff(failures);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
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
        // Let the stopped tasks' waiters finish (and remove their records).
        let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(1);
        while waiting > 0 {
            match tokio::time::timeout_at(deadline, self.exits_rx.recv()).await {
                Ok(Some((key, _))) => {
                    let _ = fs::remove_file(self.record_path(key));
                    waiting -= 1;
                }
                _ => break,
            }
        }
    }

    /// Exponential backoff with deterministic per-node jitter.
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

    async fn session(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<SessionEnd, String> {
        let addr = self.pick_address();
        let channel = muster_tls::endpoint(&addr, self.cfg.tls.as_ref())
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        self.forget_claims();
        let (out, out_rx) = mpsc::channel::<v1::AgentMessage>(1024);
        let send = |msg: Out| {
            let out = out.clone();
            async move { out.send(v1::AgentMessage { msg: Some(msg) }).await.map_err(|_| "stream closed".to_string()) }
        };
        send(Out::Register(v1::Register {
            node_id: self.cfg.node_id.clone(),
            resources: Some(self.cfg.resources),
            labels: self.cfg.labels.clone().into_iter().collect(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            running: self.registered_tasks(),
            address: self.cfg.address.clone(),
        }))
        .await?;
        let mut client = AgentServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut inbound = match client.connect(ReceiverStream::new(out_rx)).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                if let Some(leader) = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok()) {
                    self.leader_hint = Some(leader.to_string());
                    return Ok(SessionEnd::Reconnect);
                }
                return Err(format!("{addr}: {}", status.message()));
            }
        };
        let mut every = Duration::from_secs(5);
        let mut heartbeat = tokio::time::interval(every);
        let mut last_heard = tokio::time::Instant::now();
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        last_heard = tokio::time::Instant::now();
                        if let Some(interval) = self.handle(m, &send).await? {
                            every = interval;
                            heartbeat = tokio::time::interval(every);
                        }
                        if self.exit_now {
                            return Ok(SessionEnd::Shutdown);
                        }
                    }
                    Ok(None) => return Ok(SessionEnd::Reconnect),
                    Err(status) => {
                        if let Some(leader) = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok()) {
                            self.leader_hint = Some(leader.to_string());
                            return Ok(SessionEnd::Reconnect);
                        }
                        return Err(status.message().to_string());
                    }
                },
                _ = heartbeat.tick() => {
                    // The leader acks every heartbeat: silence means it is
                    // frozen or cut off while the connection stays open.
                    if last_heard.elapsed() > every * LEADER_SILENT_INTERVALS {
                        tracing::warn!(node = %self.cfg.node_id, leader = %addr, "the leader stopped answering; reconnecting");
                        return Err(format!("{addr}: no answer for {LEADER_SILENT_INTERVALS} heartbeat intervals"));
                    }
                    send(Out::Heartbeat(v1::Heartbeat { running: self.running.keys().map(|k| task_ref(*k)).collect() })).await?;
                    self.claim_deferred(&send).await?;
                }
                Some((key, exit)) = self.exits_rx.recv() => {
                    let report = self.finished(key, exit);
                    send_report(&report, &send).await?;
                    self.claim_deferred(&send).await?;
                }
                _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
            }
        }
    }

    /// Handles one message; returns a new heartbeat interval when told one.
    async fn handle<F, Fut>(&mut self, m: v1::SchedulerMessage, send: &F) -> Result<Option<Duration>, String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        match m.msg {
            Some(In::Registered(r)) => {
                tracing::info!(node = %self.cfg.node_id, "registered with the leader");
                if r.max_checkpoint_bytes > 0 {
                    self.max_checkpoint_bytes = usize::try_from(r.max_checkpoint_bytes).unwrap_or(usize::MAX);
                }
                for report in self.unrecorded.values() {
                    send_report(report, send).await?;
                }
                return Ok(Some(Duration::from_millis(u64::from(r.heartbeat_interval_ms.max(100)))));
            }
            Some(In::Assign(a)) => {
                if let Some(key) = key_of(&a.task)
                    && !self.running.contains_key(&key)
                {
                    if (a.gpus as usize) <= self.spare_gpus() {
                        self.assigned.insert(key, a);
                        send(Out::Claim(v1::Claim { task: Some(task_ref(key)) })).await?;
                    } else {
                        tracing::warn!(
                            alloc_id = key.0,
                            task = key.1,
                            gpus = a.gpus,
                            spare = self.spare_gpus(),
                            "assignment waits: processes still stopping here hold its GPUs"
                        );
                        self.deferred.insert(key, a);
                    }
                }
            }
            Some(In::Granted(g)) => {
                if let Some(key) = key_of(&g.task)
                    && let Some(assign) = self.assigned.remove(&key)
                    && let Some(unusable) = self.start(key, assign, g.attempt)
                {
                    send(Out::CheckpointUnusable(unusable)).await?;
                }
            }
            Some(In::Stop(s)) => {
                if let Some(key) = key_of(&s.task)
                    && let Some(ctrl) = self.running.get_mut(&key).and_then(|r| r.ctrl.take())
                {
                    tracing::info!(alloc = key.0, task = key.1, reason = %s.reason, "stopping task");
                    let _ = ctrl.send(Control::Stop(Duration::from_millis(u64::from(s.grace_ms))));
                }
            }
            Some(In::CheckpointHint(h)) => {
                if let Some(key) = key_of(&h.task) {
                    let hint = Hint {
                        epoch: h.preemption_epoch,
                        timeout: Duration::from_millis(u64::from(h.timeout_ms)),
                        max_deferral: Duration::from_millis(u64::from(h.max_deferral_ms)),
                        grace: Duration::from_millis(u64::from(h.grace_ms)),
                    };
                    self.checkpoint_hint(key, hint, send).await?;
                }
            }
            Some(In::Preempt(p)) => {
                if let Some(key) = key_of(&p.task) {
                    self.preempt(key, &p, send).await?;
                }
            }
            Some(In::Refused(r)) => {
                if let Some(key) = key_of(&r.task) {
                    tracing::info!(alloc = key.0, task = key.1, code = %r.code, message = %r.message, "leader refused");
                    self.assigned.remove(&key);
                    self.deferred.remove(&key);
                    // A refused report is final (the task moved on): stop
                    // re-sending it and listing the task at registration.
                    if matches!(self.unrecorded.get(&key), Some(Report::Exited { .. } | Report::Watchdog { .. })) {
                        self.unrecorded.remove(&key);
                    }
                }
            }
            Some(In::NodeNotice(n)) => self.node_notice(&n),
            Some(In::HeartbeatAck(_)) => {}
            Some(In::FetchLogs(f)) => {
                let reply = self.read_logs(&f);
                send(Out::LogData(reply)).await?;
            }
            Some(In::Recorded(r)) => {
                if let Some(key) = key_of(&r.task)
                    && let Some(Report::Preempted { .. }) = self.unrecorded.remove(&key)
                {
                    // The checkpoint (if any) is in the replicated state now.
                    let _ = fs::remove_dir_all(checkpoint::dir(&self.cfg.work_dir, key.0, key.1));
                }
            }
            None => {}
        }
        Ok(None)
    }

    /// The scheduler says what became of this node: log it, keep it in the
    /// status file, and exit when stopped if asked to.
    fn node_notice(&mut self, n: &v1::NodeNotice) {
        let status = v1::NodeStatus::try_from(n.status)
            .map(|s| s.as_str_name().trim_start_matches("NODE_STATUS_").to_lowercase())
            .unwrap_or_else(|_| "unknown".into());
        tracing::info!(node = %self.cfg.node_id, status = %status, detail = %n.detail, deadline_ms = n.deadline_ms, "node status");
        if let Err(e) = fs::write(self.cfg.work_dir.join(NODE_STATUS_FILE), format!("{status}\n")) {
            tracing::warn!(error = %e, "cannot write the node status file");
        }
        if status == "stopped" && self.cfg.exit_when_stopped && self.running.is_empty() {
            tracing::info!(node = %self.cfg.node_id, "the node is stopped: exiting (--exit-when-stopped)");
            self.exit_now = true;
        }
    }

    /// A new stream starts with no claim in flight: claims made on an
    /// earlier one were answered there or never, and the leader of this one
    /// sends its assignments again. Kept, they would count as promised GPUs
    /// forever and hold back every later assignment.
    fn forget_claims(&mut self) {
        self.assigned.clear();
        self.deferred.clear();
    }

    /// GPUs neither running nor promised to an assignment being claimed.
    fn spare_gpus(&self) -> usize {
        let promised: usize = self.assigned.values().map(|a| a.gpus as usize).sum();
        self.free_gpus.len().saturating_sub(promised)
    }

    /// Claims the deferred assignments whose GPUs have come free, in key
    /// order. One the leader has since moved on from is refused, harmlessly.
    async fn claim_deferred<F, Fut>(&mut self, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let keys: Vec<Key> = self.deferred.keys().copied().collect();
        for key in keys {
            let gpus = self.deferred[&key].gpus as usize;
            if gpus <= self.spare_gpus() {
                let a = self.deferred.remove(&key).expect("listed");
                self.assigned.insert(key, a);
                tracing::info!(alloc_id = key.0, task = key.1, "its GPUs came free; claiming the assignment");
                send(Out::Claim(v1::Claim { task: Some(task_ref(key)) })).await?;
            }
        }
        Ok(())
    }

    /// A gang teardown wants this task stopped. The first `Preempt` of an
    /// attempt stops it (SIGTERM, grace, SIGKILL); repeats change nothing.
    /// A task not running here is acked at once, unless its report is
    /// already on its way.
    async fn preempt<F, Fut>(&mut self, key: Key, p: &v1::Preempt, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let epoch = p.preemption_epoch;
        if let Some(r) = self.running.get_mut(&key) {
            // The first stop of an attempt, or a later round (a cancel while
            // the task was asked to checkpoint): stop it now, and ack under
            // the newest epoch.
            if r.preempt.is_none_or(|e| e < epoch) {
                r.preempt = Some(epoch);
                tracing::info!(alloc_id = key.0, task = key.1, epoch, grace_ms = p.grace_ms, "preempting task");
                if let Some(ctrl) = r.ctrl.take() {
                    let _ = ctrl.send(Control::Stop(Duration::from_millis(u64::from(p.grace_ms))));
                }
            }
            return Ok(());
        }
        self.ack_not_running(key, epoch, send).await
    }

    /// A priority preemption asks this task to checkpoint, then stop. The
    /// first hint of an attempt starts the protocol; repeats change nothing.
    async fn checkpoint_hint<F, Fut>(&mut self, key: Key, hint: Hint, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        if let Some(r) = self.running.get_mut(&key) {
            if r.preempt.is_none() {
                r.preempt = Some(hint.epoch);
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    epoch = hint.epoch,
                    timeout_ms = hint.timeout.as_millis() as u64,
                    "asking task to checkpoint"
                );
                if let Some(ctrl) = &r.ctrl {
                    let _ = ctrl.send(Control::Hint(hint));
                }
            }
            return Ok(());
        }
        self.ack_not_running(key, hint.epoch, send).await
    }

    /// A stop request for a task not running here is acked at once, unless
    /// its report is already on its way.
    async fn ack_not_running<F, Fut>(&mut self, key: Key, epoch: u64, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        if let Some(Report::Preempted { checkpoint, ack }) = self.unrecorded.get_mut(&key)
            && ack.preemption_epoch < epoch
        {
            // The task stopped for an earlier round whose ack came too late
            // (the leader moved the teardown to a new epoch): the same stop
            // answers this round.
            ack.preemption_epoch = epoch;
            if let Some(c) = checkpoint.as_mut() {
                c.preemption_epoch = epoch;
            }
            let report = self.unrecorded[&key].clone();
            return send_report(&report, send).await;
        }
        if self.unrecorded.contains_key(&key) {
            return Ok(());
        }
        tracing::info!(alloc_id = key.0, task = key.1, epoch, "preempt for a task not running here; acking");
        let report = Report::Preempted {
            checkpoint: None,
            ack: v1::Preempted {
                task: Some(task_ref(key)),
                preemption_epoch: epoch,
                exit_code: None,
                signal: None,
                checkpoint_failed: false,
            },
        };
        self.unrecorded.insert(key, report.clone());
        send_report(&report, send).await
    }

    /// Reads part of an attempt's log file for the leader.
    fn read_logs(&self, f: &v1::FetchLogs) -> v1::LogData {
        use std::io::{Read, Seek, SeekFrom};
        let (out, err) = executor::log_paths(&self.cfg.work_dir, f.alloc_id, f.task_index, f.attempt);
        let path = if f.stderr { err } else { out };
        let running = self.running.keys().any(|k| k.0 == f.alloc_id && k.1 == f.task_index);
        let mut reply = v1::LogData { request_id: f.request_id, ..Default::default() };
        let result = (|| -> std::io::Result<()> {
            let mut file = fs::File::open(&path)?;
            file.seek(SeekFrom::Start(f.offset))?;
            let mut buf = Vec::new();
            file.take(u64::from(f.max_bytes.min(1 << 20))).read_to_end(&mut buf)?;
            reply.eof = !running && (buf.len() as u64) < u64::from(f.max_bytes);
            reply.data = buf;
            Ok(())
        })();
        if let Err(e) = result {
            reply.error = format!(
                "no log for attempt {} of task {} of allocation {} on this node: {e}",
                f.attempt, f.task_index, f.alloc_id
            );
        }
        reply
    }

    /// Starts a granted attempt. A checkpoint that cannot be restored here
    /// does not keep the task from running: it starts without it (said in
    /// its stderr log), and the returned message tells the leader.
    fn start(&mut self, key: Key, a: v1::Assign, attempt: u32) -> Option<v1::CheckpointUnusable> {
        let gpus: Vec<u32> = self.free_gpus.iter().take(a.gpus as usize).copied().collect();
        for g in &gpus {
            self.free_gpus.remove(g);
        }
        let checkpoint_dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let mut env: BTreeMap<String, String> = a.env.into_iter().collect();
        let progress = watchdog::progress_path(&self.cfg.work_dir, key.0, key.1, attempt);
        if let Some(parent) = progress.parent() {
            let _ = fs::create_dir_all(parent);
        }
        let _ = fs::remove_file(&progress);
        env.insert("MUSTER_PROGRESS_FILE".into(), progress.display().to_string());
        env.insert("MUSTER_NODE_ID".into(), self.cfg.node_id.clone());
        let limits = watchdog::Limits {
            budget: (a.walltime_s > 0).then(|| Duration::from_secs(a.walltime_s)),
            stall: (a.stall_timeout_s > 0).then(|| Duration::from_secs(u64::from(a.stall_timeout_s))),
            gpu_health: a.gpus > 0 && self.cfg.watchdog.gpu_health,
        };
        let (walltime_s, stall_s, checkpointing) = (a.walltime_s, a.stall_timeout_s, a.checkpointing);
        let mut restored_print = (!a.checkpoint.is_empty()).then(|| checkpoint::fingerprint(&a.checkpoint));
        let mut unusable = None;
        let unpacked = match a.checkpoint.is_empty() {
            true => Ok(false),
            false => checkpoint::unpack(&a.checkpoint, &checkpoint_dir).map(|()| true),
        };
        let restored = match unpacked {
            Ok(true) => {
                env.insert("MUSTER_RESUME".into(), "1".into());
                if let Some(data) = checkpoint::inline_data(&a.checkpoint) {
                    env.insert("CHECKPOINT_DATA".into(), data);
                }
                Ok(())
            }
            Ok(false) => checkpoint::reset(&checkpoint_dir),
            Err(e) => {
                let reason = format!("the stored checkpoint could not be restored ({e}); the task starts without it");
                tracing::warn!(alloc_id = key.0, task = key.1, attempt, error = %e, "checkpoint not restored");
                unusable = Some(v1::CheckpointUnusable {
                    task: Some(task_ref(key)),
                    checkpoint_epoch: a.checkpoint_epoch,
                    reason,
                });
                restored_print = None;
                checkpoint::reset(&checkpoint_dir)
            }
        }
        .map_err(|e| format!("cannot create {}: {e}", checkpoint_dir.display()));
        let launch = TaskLaunch {
            alloc: key.0,
            task: key.1,
            gang_size: a.gang_size,
            epoch: key.2,
            attempt,
            command: a.command,
            env,
            peers: a.peers,
            gpu_ids: gpus.clone(),
            checkpoint_dir,
        };
        let (ctrl_tx, ctrl_rx) = mpsc::unbounded_channel::<Control>();
        let spawned = restored.and_then(|()| {
            executor::spawn(&launch, &self.cfg.work_dir, self.cfg.task_shim.as_deref()).map_err(|e| e.to_string())
        });
        match spawned {
            Ok(task) => {
                let record = Record {
                    pgid: task.pgid(),
                    attempt,
                    gpus: gpus.clone(),
                    walltime_s,
                    stall_s,
                    gpu_health: limits.gpu_health,
                    started_ms: self.cfg.clock.wall_ms(),
                    checkpointing,
                };
                let _ = fs::write(self.record_path(key), record.encode());
                if let Some(u) = &unusable {
                    // After the spawn, which creates the attempt's log files.
                    self.note_in_log(key, attempt, &format!("muster: {}", u.reason));
                }
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    attempt,
                    pgid = task.pgid(),
                    resumed = !a.checkpoint.is_empty(),
                    "task started"
                );
                self.watch(key, attempt, task, limits, ctrl_rx);
            }
            Err(e) => {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "task did not start");
                let _ = self.exits_tx.send((key, Ended { exit: Err(e), checkpoint_failed: false, watchdog: None }));
            }
        }
        self.running.insert(
            key,
            Running { ctrl: Some(ctrl_tx), gpus, attempt, preempt: None, checkpointing, restored: restored_print },
        );
        unusable
    }

    /// What an attempt's end reports. Whenever a process of a checkpointing
    /// allocation ends (on its own, killed by a peer's failure or by
    /// SIGKILL, stopped by a watchdog, or preempted), what it left in its
    /// checkpoint directory goes with the report if it changed since the
    /// checkpoint the attempt was given: the next attempt resumes from it.
    /// A successful exit uploads nothing: a finished task never runs again.
    fn finished(&mut self, key: Key, ended: Ended) -> Report {
        let Ended { exit, checkpoint_failed, watchdog } = ended;
        let running = self.running.remove(&key);
        let (attempt, preempt) = running.as_ref().map_or((0, None), |r| (r.attempt, r.preempt));
        let (checkpointing, restored) = running.as_ref().map_or((false, None), |r| (r.checkpointing, r.restored));
        if let Some(r) = running {
            self.free_gpus.extend(r.gpus);
        }
        let _ = fs::remove_file(self.record_path(key));
        let _ = fs::remove_file(executor::status_path(&self.cfg.work_dir, key.0, key.1, key.2));
        let (exit_code, signal, error) = match exit {
            Ok(Exit::Code(c)) => (Some(c), None, String::new()),
            Ok(Exit::Signal(s)) => (None, Some(s), String::new()),
            Err(e) => (None, None, e),
        };
        let succeeded = exit_code == Some(0) && preempt.is_none() && watchdog.is_none();
        let dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let upload = if checkpointing && !succeeded && error.is_empty() {
            self.changed_checkpoint(key, attempt, restored, preempt)
        } else {
            None
        };
        let bytes = upload.as_ref().map_or(0, |c| c.data.len());
        let report = match preempt {
            None if watchdog.is_some() => {
                let trip = watchdog.expect("guarded");
                let _ = fs::remove_dir_all(&dir);
                tracing::warn!(alloc_id = key.0, task = key.1, kind = trip.kind, detail = %trip.detail, checkpoint_bytes = bytes, "watchdog tripped; task stopped");
                self.note_in_log(
                    key,
                    attempt,
                    &format!("muster: stopped by the {} watchdog: {}", trip.kind, trip.detail),
                );
                Report::Watchdog {
                    trip: v1::WatchdogTripped {
                        task: Some(task_ref(key)),
                        kind: trip.kind.to_string(),
                        detail: trip.detail,
                    },
                    checkpoint: upload,
                }
            }
            Some(epoch) => {
                if checkpoint_failed {
                    tracing::warn!(
                        alloc_id = key.0,
                        task = key.1,
                        epoch,
                        "no checkpoint before the deadline; task killed"
                    );
                    self.note_in_log(key, attempt, "muster: no checkpoint before the deadline; the task was killed");
                }
                tracing::info!(
                    alloc_id = key.0, task = key.1, epoch, exit_code = ?exit_code, signal = ?signal,
                    checkpoint_bytes = bytes, "task preempted"
                );
                Report::Preempted {
                    checkpoint: upload,
                    ack: v1::Preempted {
                        task: Some(task_ref(key)),
                        preemption_epoch: epoch,
                        exit_code,
                        signal,
                        checkpoint_failed,
                    },
                }
            }
            None => {
                let _ = fs::remove_dir_all(&dir);
                tracing::info!(alloc_id = key.0, task = key.1, exit_code = ?exit_code, signal = ?signal, checkpoint_bytes = bytes, "task exited");
                if !error.is_empty() {
                    self.note_in_log(key, attempt, &format!("muster: the task did not start: {error}"));
                }
                Report::Exited {
                    exit: v1::TaskExited { task: Some(task_ref(key)), exit_code, signal, error },
                    checkpoint: upload,
                }
            }
        };
        self.unrecorded.insert(key, report.clone());
        report
    }

    /// The task's checkpoint directory packed for upload, unless it holds
    /// nothing, is what the attempt was given, or is over the cap (said in
    /// the attempt's log). Under a preemption it answers that round's epoch;
    /// otherwise it is an exit upload, fenced by the reservation epoch.
    fn changed_checkpoint(
        &self,
        key: Key,
        attempt: u32,
        restored: Option<u64>,
        preempt: Option<u64>,
    ) -> Option<v1::CheckpointUpload> {
        let dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        match checkpoint::pack(&dir, self.max_checkpoint_bytes) {
            Ok(Some(data)) if restored == Some(checkpoint::fingerprint(&data)) => {
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    "checkpoint unchanged since the attempt began; not uploaded"
                );
                None
            }
            Ok(data) => data.map(|data| v1::CheckpointUpload {
                task: Some(task_ref(key)),
                preemption_epoch: preempt.unwrap_or(0),
                data,
                on_exit: preempt.is_none(),
            }),
            Err(e) => {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "checkpoint not saved");
                self.note_in_log(key, attempt, &format!("muster: checkpoint not saved: {e}"));
                None
            }
        }
    }

    /// Appends a line to an attempt's stderr log, where its owner looks.
    fn note_in_log(&self, key: Key, attempt: u32, line: &str) {
        use std::io::Write;
        let (_, err) = executor::log_paths(&self.cfg.work_dir, key.0, key.1, attempt);
        if let Some(parent) = err.parent() {
            let _ = fs::create_dir_all(parent);
        }
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(err) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// An attempt's watchdogs and what feeds them.
struct Guard {
    dogs: Watchdogs,
    progress: ProgressFile,
    sampler: Box<dyn Sampler>,
    poll: Duration,
}

/// How long a tripped task gets between SIGTERM and SIGKILL: it is hung.
const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

/// Waits for an attempt to end, obeying the agent: a stop stops it; a hint
/// starts the checkpoint protocol, polled every 200 ms, which stops it once
/// the task is done or out of time. Until a stop or hint, the watchdogs are
/// polled (beats from the progress file), and a trip stops it.
async fn watch_task(
    task: &mut executor::RunningTask,
    mut ctrl: mpsc::UnboundedReceiver<Control>,
    checkpoint_dir: &std::path::Path,
    mut guard: Guard,
    clock: &SharedClock,
) -> Ended {
    let mut hint: Option<HintWatch> = None;
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    let mut dog_tick = tokio::time::interval(guard.poll);
    let pgid = task.pgid();
    let mut trip = None;
    let (exit, checkpoint_failed) = loop {
        tokio::select! {
            exit = task.wait() => break (exit, false),
            _ = dog_tick.tick(), if hint.is_none() => {
                let now = tokio::time::Instant::now();
                if guard.progress.changed() {
                    guard.dogs.beat(now);
                }
                let sampler = &mut guard.sampler;
                match guard.dogs.poll(now, || sampler.sample(pgid)) {
                    watchdog::Verdict::Fine => {}
                    watchdog::Verdict::Busy(why) => {
                        metrics::counter!("muster_watchdog_suspected_stalls_total").increment(1);
                        tracing::info!(pgid, why = %why, "suspected stall, but the task is busy");
                    }
                    watchdog::Verdict::Trip(t) => {
                        metrics::counter!("muster_agent_watchdog_trips_total", "kind" => t.kind).increment(1);
                        trip = Some(t);
                        break (task.stop(WATCHDOG_GRACE).await, false);
                    }
                }
            }
            Some(c) = ctrl.recv() => match c {
                Control::Stop(grace) => break (task.stop(grace).await, false),
                Control::Hint(h) if hint.is_none() => match HintWatch::start(h, checkpoint_dir, tokio::time::Instant::now(), clock.wall_ms()) {
                    Ok(w) => {
                        executor::signal_group(task.pgid(), libc::SIGUSR1);
                        hint = Some(w);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot write the checkpoint request; stopping the task");
                        break (task.stop(h.grace).await, false);
                    }
                },
                Control::Hint(_) => {}
            },
            _ = poll.tick(), if hint.is_some() => {
                let w = hint.as_mut().expect("guarded");
                match w.check(tokio::time::Instant::now()) {
                    Verdict::Wait => {}
                    Verdict::Done => break (task.stop(w.hint().grace).await, false),
                    Verdict::TimedOut => break (task.stop(w.hint().grace).await, true),
                }
            }
        }
    };
    Ended { exit: exit.map_err(|e| e.to_string()), checkpoint_failed, watchdog: trip }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_record_round_trips_and_an_old_one_gives_its_pgid() {
        let r = Record {
            pgid: 4242,
            attempt: 2,
            gpus: vec![0, 3],
            walltime_s: 3600,
            stall_s: 120,
            gpu_health: true,
            started_ms: 1_795_000_000_000,
            checkpointing: false,
        };
        assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
        let none = Record { gpus: vec![], gpu_health: false, checkpointing: true, ..r.clone() };
        let older = r.encode().replace(" checkpointing=0", "");
        assert!(Record::decode(&older).unwrap().checkpointing, "a record without the field assumes checkpointing");
        assert_eq!(Record::decode(&none.encode()), Ok(none));
        assert_eq!(Record::decode("4242\n"), Err(Some(4242)), "a record from before --keep-tasks");
        assert_eq!(Record::decode("pgid=7 attempt=x"), Err(Some(7)), "a torn record still names its group");
        assert_eq!(Record::decode("garbage"), Err(None));
        assert_eq!(parse_key("12-3-4"), Some((12, 3, 4)));
        assert_eq!(parse_key("12-3"), None);
        assert_eq!(parse_key("12-3-4-5"), None);
    }

    fn test_config(dir: &std::path::Path) -> AgentConfig {
        AgentConfig {
            node_id: "n1".into(),
            schedulers: vec!["127.0.0.1:1".into()],
            resources: v1::Resources { gpus: 0, vram_mb: 0, mem_mb: 1_000, cpus: 1 },
            labels: BTreeMap::new(),
            address: "n1".into(),
            work_dir: dir.to_path_buf(),
            backoff: (Duration::from_millis(50), Duration::from_millis(100)),
            watchdog: crate::watchdog::WatchdogConfig::default(),
            sampler: proc_sampler,
            exit_when_stopped: false,
            task_shim: None,
            tls: None,
            clock: Default::default(),
        }
    }

    /// Issue 22, item 8: a stored checkpoint that does not unpack here (well
    /// formed and safe, but `a` is both a file and a directory) does not fail
    /// the attempt: the task starts without it, its stderr log says so, and
    /// the leader is told, so that nobody is charged for it.
    #[tokio::test]
    async fn a_checkpoint_that_cannot_be_restored_starts_the_task_without_it_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::new(test_config(dir.path())).unwrap();
        let blob = muster_proto::checkpoint_blob::encode([("a", &b"x"[..]), ("a/b", &b"y"[..])]);
        let key = (7, 0, 1);
        let assign = v1::Assign {
            task: Some(task_ref(key)),
            gang_size: 1,
            command: vec!["sh".into(), "-c".into(), "echo resume=${MUSTER_RESUME:-no}".into()],
            checkpoint: blob,
            checkpoint_epoch: 3,
            checkpointing: true,
            ..Default::default()
        };
        let unusable = agent.start(key, assign, 1).expect("the leader is told");
        assert_eq!((unusable.task, unusable.checkpoint_epoch), (Some(task_ref(key)), 3));
        assert!(unusable.reason.contains("could not be restored"), "{}", unusable.reason);
        let (ended_key, ended) =
            tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
        assert_eq!(ended_key, key);
        assert!(matches!(ended.exit, Ok(Exit::Code(0))), "the task ran");
        let (out, err) = executor::log_paths(dir.path(), 7, 0, 1);
        assert_eq!(fs::read_to_string(out).unwrap(), "resume=no\n", "started without the checkpoint");
        let err = fs::read_to_string(err).unwrap();
        assert!(err.contains("muster: the stored checkpoint could not be restored"), "{err}");
        assert!(fs::read_dir(checkpoint::dir(dir.path(), 7, 0)).unwrap().next().is_none(), "an empty directory");
    }

    /// An agent never starts a task on GPUs a process it still runs holds
    /// (one the leader no longer places here, in its stop grace): it claims
    /// the assignment only once the GPUs are free.
    #[tokio::test]
    async fn an_assignment_waits_for_gpus_a_stopping_task_still_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = test_config(dir.path());
        cfg.resources.gpus = 4;
        let mut agent = Agent::new(cfg).unwrap();
        let assign = |key: Key, gpus: u32, cmd: &str| v1::Assign {
            task: Some(task_ref(key)),
            gang_size: 1,
            gpus,
            command: vec!["sh".into(), "-c".into(), cmd.into()],
            ..Default::default()
        };
        let stale = (1, 0, 1);
        assert!(agent.start(stale, assign(stale, 4, "sleep 60"), 1).is_none());
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = sent.clone();
        let send = move |o: Out| {
            log.lock().unwrap().push(o);
            std::future::ready(Ok::<(), String>(()))
        };
        let next = (2, 0, 1);
        let msg = v1::SchedulerMessage { msg: Some(In::Assign(assign(next, 2, "true"))) };
        agent.handle(msg, &send).await.unwrap();
        assert!(sent.lock().unwrap().is_empty(), "no claim while the stopping task holds every GPU");
        assert!(agent.deferred.contains_key(&next));
        // The stale task is stopped; once it has exited, the claim goes out.
        let stop = v1::Stop { task: Some(task_ref(stale)), grace_ms: 1_000, reason: "re-placed".into() };
        agent.handle(v1::SchedulerMessage { msg: Some(In::Stop(stop)) }, &send).await.unwrap();
        let (key, ended) = tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
        assert_eq!(key, stale);
        agent.finished(key, ended);
        agent.claim_deferred(&send).await.unwrap();
        {
            let sent = sent.lock().unwrap();
            assert!(
                matches!(sent.as_slice(), [Out::Claim(c)] if c.task == Some(task_ref(next))),
                "claimed once its GPUs were free: {sent:?}"
            );
        }
        // The stream breaks before the grant: the next stream's leader sends
        // the assignment again, and the old claim no longer holds GPUs.
        assert_eq!(agent.spare_gpus(), 2);
        agent.forget_claims();
        assert_eq!(agent.spare_gpus(), 4, "a lost claim does not hold GPUs forever");
    }

    #[test]
    fn a_register_lists_tasks_whose_end_is_not_yet_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::new(test_config(dir.path())).unwrap();
        assert!(agent.registered_tasks().is_empty());
        let exited = (7, 0, 1);
        agent.unrecorded.insert(
            exited,
            Report::Exited {
                exit: v1::TaskExited { task: Some(task_ref(exited)), exit_code: Some(0), ..Default::default() },
                checkpoint: None,
            },
        );
        let preempted = (8, 1, 2);
        let ack = v1::Preempted { task: Some(task_ref(preempted)), preemption_epoch: 1, ..Default::default() };
        agent.unrecorded.insert(preempted, Report::Preempted { checkpoint: None, ack });
        // The exited task is listed until its report is recorded; a preempted
        // one is not (the leader is tearing it down, not counting it as running).
        assert_eq!(agent.registered_tasks(), vec![task_ref(exited)]);
        agent.unrecorded.remove(&exited);
        assert!(agent.registered_tasks().is_empty());
    }
}
