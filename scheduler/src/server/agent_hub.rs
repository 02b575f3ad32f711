//! The leader's end of the agent streams (`muster.v1.AgentService.Connect`).
//!
//! ```text
//!   Register ──▶ RegisterNode (Raft) ──▶ Registered ──▶ sync
//!   every applied entry ──▶ sync: Assign what is newly reserved on this node,
//!                                 Stop what the agent runs but no longer owns
//!   Claim ──▶ StartTask (Raft) ──▶ ClaimGranted | Refused
//!   TaskExited ──▶ FinishTask | FailTask (Raft)
//!   Heartbeat ──▶ liveness (memory only) ──▶ sync (and Preempt again, for every
//!                 preempting task not yet acked) ──▶ HeartbeatAck
//!   CheckpointUpload ──▶ SaveCheckpoint, or SaveExitCheckpoint when on_exit (Raft)
//!   Preempted ──▶ ConfirmPreempted (Raft) ──▶ Recorded (| Refused ABORTED: stale epoch)
//! ```
//!
//! Sync pushes `Preempt{epoch, grace}` for each task of this node the state
//! has preempting, the moment its teardown commits; heartbeats repeat it until
//! the ack commits. A priority preemption's victim that can checkpoint gets
//! `CheckpointHint{epoch, timeout, max deferral, grace}` instead; one that
//! cannot gets `Preempt` with the preemption grace (30 s). Nothing about a teardown lives in this memory: a new
//! leader's sync finds the preempting tasks in the replicated state and
//! signals them again.
//!
//! The node id is fixed by the stream's `Register`: every later command is
//! made for that node, so an agent can only claim or report tasks placed on
//! its own node; anything else is refused with `PERMISSION_DENIED`. Only the
//! leader serves streams; when this replica stops leading, each stream ends
//! with UNAVAILABLE and the new leader's address, and agents reconnect there
//! with their running tasks (which keep running).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_clock::SharedClock;
use muster_core::sync::{SentMemory, StopHow, SyncConfig, TaskKey, plan_sync};
use muster_core::tick::{Heard, Silence};
use muster_proto::checkpoint_blob;
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as In;
use muster_proto::v1::agent_service_server::AgentService;
use muster_proto::v1::scheduler_message::Msg as Out;
use openraft::ServerState;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{not_leader_status, propose_error_to_status, rejection_to_status};
use super::replica::Shared;
use crate::policy::PreemptionConfig;
use crate::sm::{
    Command, Event, MAX_AGENT_REASON_BYTES, NodeId, NodeStatus, Outcome, Resources, TaskStatus, WatchdogKind,
};

pub use muster_core::sync::ADDRESS_LABEL;

/// The largest message on an agent stream: room for a checkpoint at the
/// state machine's cap plus framing. Agents set the same on their end.
pub const MAX_AGENT_MESSAGE_BYTES: usize = 16 << 20;

/// When each node was last heard from, kept in memory on the leader only
/// (the leader's tick reads it through [`Silence`]), on the replica's
/// monotonic clock.
#[derive(Clone, Debug)]
pub struct Liveness {
    heard: Arc<Mutex<Heard>>,
    clock: SharedClock,
}

impl Liveness {
    /// Nothing heard yet, timed on `clock`.
    pub fn new(clock: SharedClock) -> Liveness {
        Liveness { heard: Arc::default(), clock }
    }

    /// A message from `node` arrived now.
    pub fn touch(&self, node: &NodeId) {
        let now = self.clock.mono_ms();
        self.heard.lock().expect("liveness lock").touch(node, now);
    }

    /// This replica became leader now: every node gets a full grace window.
    pub fn lead_from_now(&self) {
        let now = self.clock.mono_ms();
        self.heard.lock().expect("liveness lock").lead_from(now);
    }
}

impl Silence for Liveness {
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64 {
        self.heard.lock().expect("liveness lock").silent_ms(node, mono_ms)
    }
}

type Outbound = mpsc::Sender<Result<v1::SchedulerMessage, Status>>;

/// The agent streams this replica holds, by node, and log requests waiting
/// for an agent's answer.
#[derive(Clone, Default)]
pub struct AgentRegistry {
    inner: Arc<Mutex<RegistryInner>>,
}

#[derive(Default)]
struct RegistryInner {
    streams: BTreeMap<NodeId, Outbound>,
    /// Log requests waiting, by request id: the node asked and the waiter.
    pending: BTreeMap<u64, (NodeId, tokio::sync::oneshot::Sender<v1::LogData>)>,
    next_request: u64,
}

/// A fresh request id nobody can guess: a counter through SipHash under the
/// process's random keys (`RandomState` seeds them from the OS), so another
/// agent cannot aim a reply at someone's `alloc logs -f`.
fn unguessable_id(counter: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(counter);
    h.finish()
}

impl AgentRegistry {
    // `muster_agent_streams` moves by increments so that several replicas
    // in one process (`muster dev`) add up rather than overwrite.
    fn attach(&self, node: &NodeId, tx: &Outbound) {
        if self.inner.lock().expect("registry lock").streams.insert(node.clone(), tx.clone()).is_none() {
            metrics::gauge!("muster_agent_streams").increment(1.0);
        }
    }

    fn detach(&self, node: &NodeId, tx: &Outbound) {
        let mut inner = self.inner.lock().expect("registry lock");
        if inner.streams.get(node).is_some_and(|t| t.same_channel(tx)) {
            inner.streams.remove(node);
            metrics::gauge!("muster_agent_streams").decrement(1.0);
        }
    }

    /// Agent streams held open.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("registry lock").streams.len()
    }

    /// Whether no agent stream is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An agent's reply to a log request. Only the node the request was
    /// sent to may answer it; a reply from any other stream is dropped (and
    /// the request keeps waiting for its own node).
    fn answer(&self, from: &NodeId, data: v1::LogData) -> bool {
        let mut inner = self.inner.lock().expect("registry lock");
        match inner.pending.get(&data.request_id) {
            Some((asked, _)) if asked == from => {
                let (_, waiter) = inner.pending.remove(&data.request_id).expect("just found");
                let _ = waiter.send(data);
                true
            }
            _ => false,
        }
    }

    /// Asks `node`'s agent for part of a log file.
    pub async fn fetch_logs(&self, node: &NodeId, mut req: v1::FetchLogs) -> Result<v1::LogData, Status> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stream = {
            let mut inner = self.inner.lock().expect("registry lock");
            let stream = inner
                .streams
                .get(node)
                .cloned()
                .ok_or_else(|| Status::unavailable(format!("node {node} has no agent connected to the leader")))?;
            inner.next_request += 1;
            req.request_id = unguessable_id(inner.next_request);
            while inner.pending.contains_key(&req.request_id) {
                inner.next_request += 1;
                req.request_id = unguessable_id(inner.next_request);
            }
            inner.pending.insert(req.request_id, (node.clone(), tx));
            stream
        };
        let id = req.request_id;
        stream
            .send(Ok(v1::SchedulerMessage { msg: Some(Out::FetchLogs(req)) }))
            .await
            .map_err(|_| Status::unavailable(format!("node {node}'s agent stream closed")))?;
        match tokio::time::timeout(Duration::from_secs(10), rx).await {
            Ok(Ok(data)) => Ok(data),
            _ => {
                self.inner.lock().expect("registry lock").pending.remove(&id);
                Err(Status::deadline_exceeded(format!("node {node}'s agent did not answer for the logs")))
            }
        }
    }
}

/// Agent-stream settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubConfig {
    /// How often agents heartbeat.
    pub heartbeat_interval: Duration,
    /// SIGTERM → SIGKILL grace when the leader stops or preempts a task.
    pub stop_grace: Duration,
    /// How long an agent has to send `Register`.
    pub register_timeout: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            heartbeat_interval: Duration::from_secs(5),
            stop_grace: Duration::from_secs(15),
            register_timeout: Duration::from_secs(30),
        }
    }
}

/// The agent service of one replica.
pub struct AgentHub {
    s: Shared,
    cfg: HubConfig,
    preemption: PreemptionConfig,
}

impl AgentHub {
    /// The agent service over a replica's shared parts.
    pub fn new(s: Shared, cfg: HubConfig, preemption: PreemptionConfig) -> Self {
        AgentHub { s, cfg, preemption }
    }
}

fn leader_status(s: &Shared) -> Status {
    let m = s.raft.metrics().borrow().clone();
    let leader = m.current_leader.and_then(|id| {
        m.membership_config.membership().nodes().find(|(n, _)| **n == id).map(|(_, node)| (id, node.addr.clone()))
    });
    not_leader_status(leader)
}

/// Whether this replica leads now (a cheap local read: a check made on its
/// state before proposing is only sound on the leader, whose applied state
/// holds every acknowledged write).
pub(super) fn is_leader(s: &Shared) -> bool {
    s.raft.metrics().borrow().state == ServerState::Leader
}

#[tonic::async_trait]
impl AgentService for AgentHub {
    type ConnectStream = ReceiverStream<Result<v1::SchedulerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if !is_leader(&self.s) {
            return Err(leader_status(&self.s));
        }
        let (tx, rx) = mpsc::channel(1024);
        let caller = muster_tls::Caller::of(&req);
        let (s, cfg, preemption, inbound) = (self.s.clone(), self.cfg, self.preemption, req.into_inner());
        tokio::spawn(async move {
            if let Err(status) = Session::run(s, cfg, preemption, caller, inbound, tx.clone()).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Key = TaskKey;

fn key_of(t: &Option<v1::TaskRef>) -> Result<Key, Status> {
    let t = t.as_ref().ok_or_else(|| Status::invalid_argument("invalid task: is required"))?;
    Ok((t.alloc_id, t.task_index, t.epoch))
}

fn task_ref(k: Key) -> v1::TaskRef {
    v1::TaskRef { alloc_id: k.0, task_index: k.1, epoch: k.2 }
}

struct Session {
    s: Shared,
    cfg: HubConfig,
    preemption: PreemptionConfig,
    node: NodeId,
    tx: mpsc::Sender<Result<v1::SchedulerMessage, Status>>,
    /// What this stream has told its agent.
    sent: SentMemory,
}

impl Session {
    async fn run(
        s: Shared,
        cfg: HubConfig,
        preemption: PreemptionConfig,
        caller: muster_tls::Caller,
        mut inbound: Streaming<v1::AgentMessage>,
        tx: mpsc::Sender<Result<v1::SchedulerMessage, Status>>,
    ) -> Result<(), Status> {
        let first = tokio::time::timeout(cfg.register_timeout, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Register within the registration timeout"))??;
        let Some(v1::AgentMessage { msg: Some(In::Register(reg)) }) = first else {
            return Err(Status::invalid_argument("invalid stream: the first message must be Register"));
        };
        // The certificate fixes the node: every later message on this stream
        // is checked against `node`, so agent A can never act on B's tasks.
        super::auth::check_agent_node(&caller, &reg.node_id)?;
        let r = reg.resources.ok_or_else(|| Status::invalid_argument("invalid resources: is required"))?;
        let node = NodeId::new(reg.node_id);
        let mut labels: BTreeMap<String, String> = reg.labels.into_iter().collect();
        if !reg.address.is_empty() {
            labels.insert(ADDRESS_LABEL.to_string(), reg.address);
        }
        let register = Command::RegisterNode {
            node: node.clone(),
            resources: Resources { gpus: r.gpus, vram_mb: r.vram_mb, mem_mb: r.mem_mb, cpus: r.cpus },
            labels,
        };
        match s.proposer.propose(register).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {}
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        s.liveness.touch(&node);
        tracing::info!(node = %node, running = reg.running.len(), "agent registered");
        let mut session = Session {
            s,
            cfg,
            preemption,
            node,
            tx,
            sent: SentMemory::new(reg.running.iter().map(|t| (t.alloc_id, t.task_index, t.epoch))),
        };
        let max_checkpoint_bytes = session.s.reader.read(|st| st.limits().max_checkpoint_bytes as u64);
        session
            .send(Out::Registered(v1::Registered {
                node_id: session.node.to_string(),
                heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as u32,
                max_checkpoint_bytes,
            }))
            .await?;
        session.reconcile().await?;
        session.sync(false).await?;
        session.s.agents.attach(&session.node, &session.tx);
        session.ready_if_pending().await?;
        let result = session.serve(inbound).await;
        session.s.agents.detach(&session.node, &session.tx);
        result
    }

    /// Serves the stream: messages from the agent, and a sync whenever an
    /// applied entry touched this node (and only then: other nodes' entries
    /// never wake this stream). Ends when this replica stops leading.
    async fn serve(&mut self, mut inbound: Streaming<v1::AgentMessage>) -> Result<(), Status> {
        let session = self;
        let node = session.node.clone();
        let Some(slot) = session.s.reader.read(|st| st.node_slot(&node)) else {
            return Err(Status::internal("a registered node has no slot"));
        };
        let mut touched = session.s.reader.watch_touches(slot.0);
        let mut leading = session.s.leading.clone();
        if !*leading.borrow_and_update() {
            return Err(leader_status(&session.s));
        }
        // Whatever applied between the first sync and the watch is not missed.
        session.sync(false).await?;
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => session.handle(m).await?,
                    Ok(None) | Err(_) => {
                        tracing::info!(node = %session.node, "agent stream closed");
                        return Ok(());
                    }
                },
                () = touched.changed() => session.sync(false).await?,
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() {
                        return Err(leader_status(&session.s));
                    }
                }
            }
        }
    }

    async fn send(&self, msg: Out) -> Result<(), Status> {
        self.tx
            .send(Ok(v1::SchedulerMessage { msg: Some(msg) }))
            .await
            .map_err(|_| Status::cancelled("the agent went away"))
    }

    async fn refuse(&self, key: Key, status: &Status) -> Result<(), Status> {
        self.send(Out::Refused(v1::Refused {
            task: Some(task_ref(key)),
            code: format!("{:?}", status.code()).to_uppercase_snake(),
            message: status.message().to_string(),
        }))
        .await
    }

    /// At registration the agent's list of running tasks is authoritative:
    /// a task the state has running on this node that the agent does not
    /// run any more (the agent restarted, or never got its claim granted)
    /// has failed. A preempting task it does not list is left to sync: the
    /// agent acks (re-sending its checkpoint) when told `Preempt` again.
    async fn reconcile(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let gone: Vec<Key> = self.s.reader.read(|st| {
            let Some(slot) = st.node_slot(&node) else { return Vec::new() };
            st.tasks_on_node(slot)
                .filter_map(|(alloc, task)| {
                    let t = &st.alloc(alloc).expect("index names a known allocation").tasks[task as usize];
                    let key = (alloc, task, t.reservation_epoch);
                    (t.status == TaskStatus::Running && !self.sent.agent_running().contains(&key)).then_some(key)
                })
                .collect()
        });
        for key in gone {
            tracing::warn!(node = %self.node, alloc = key.0, task = key.1, "agent no longer runs a running task; failing it");
            let cmd =
                Command::FailTask { alloc: key.0, task: key.1, node: node.clone(), epoch: key.2, exit_code: None };
            if let Outcome::Accepted(_) = self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                self.s.admission_wake.notify_one();
            }
        }
        Ok(())
    }

    /// A node marked lost whose agent speaks again on a stream that stayed
    /// open (it was frozen, not disconnected) is registered again: the flag
    /// clears once, and the sync that follows stops what it ran for tasks
    /// that were re-placed meanwhile (their epochs moved on).
    async fn revive_if_lost(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let again = self.s.reader.read(|st| {
            let slot = st.node_slot(&node)?;
            let n = st.node(slot);
            (n.status == NodeStatus::Lost).then(|| Command::RegisterNode {
                node: node.clone(),
                resources: n.resources,
                labels: n.labels.clone(),
            })
        });
        if let Some(cmd) = again {
            tracing::info!(node = %self.node, "a lost node's agent is heard from again; registering it");
            if let Outcome::Accepted(_) = self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                self.s.admission_wake.notify_one();
            }
        }
        Ok(())
    }

    /// A new node is pending until its agent has registered and reconciled
    /// (and holds this stream): then it takes work.
    async fn ready_if_pending(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let pending =
            self.s.reader.read(|st| st.node_slot(&node).is_some_and(|s| st.node(s).status == NodeStatus::Pending));
        if pending {
            match self.s.proposer.propose(Command::MarkNodeReady { node }).await.map_err(propose_error_to_status)? {
                Outcome::Accepted(_) => self.s.admission_wake.notify_one(),
                Outcome::Rejected(r) => tracing::debug!(node = %self.node, rejection = %r, "node ready refused"),
            }
        }
        Ok(())
    }

    /// Sends what [`plan_sync`] decides for this node now: the node's
    /// status when it changed, new assignments, preempts and hints, stops.
    /// On a heartbeat (`repeat`) every preempt not yet acked is sent again.
    async fn sync(&mut self, repeat: bool) -> Result<(), Status> {
        let cfg = SyncConfig {
            stop_grace_ms: self.cfg.stop_grace.as_millis() as u32,
            preemption_grace_ms: self.preemption.grace_ms as u32,
        };
        let plan = self.s.reader.read(|st| plan_sync(st, &self.node, &self.sent, repeat, &cfg));
        if plan.is_empty() {
            self.sent.sent(&plan);
            return Ok(());
        }
        if let Some((status, deadline_ms)) = plan.notice {
            tracing::info!(node = %self.node, status = status.as_str(), "telling the agent its node status");
            self.send(Out::NodeNotice(v1::NodeNotice {
                status: super::convert::node_status_to_proto(status) as i32,
                detail: status_detail(status).to_string(),
                deadline_ms,
            }))
            .await?;
        }
        for a in &plan.assign {
            self.send(Out::Assign(v1::Assign {
                task: Some(task_ref(a.key)),
                gang_size: a.gang_size,
                command: a.command.clone(),
                env: a.env.iter().cloned().collect(),
                peers: a.peers.clone(),
                gpus: a.gpus,
                checkpoint: a.checkpoint.clone(),
                checkpoint_epoch: a.checkpoint_epoch,
                walltime_s: a.walltime_s,
                stall_timeout_s: a.stall_timeout_s,
                checkpointing: a.checkpointing,
            }))
            .await?;
        }
        for &(key, epoch, how) in &plan.preempt {
            let msg = match how {
                StopHow::Preempt { grace_ms } => {
                    Out::Preempt(v1::Preempt { task: Some(task_ref(key)), preemption_epoch: epoch, grace_ms })
                }
                StopHow::Hint => Out::CheckpointHint(v1::CheckpointHint {
                    task: Some(task_ref(key)),
                    preemption_epoch: epoch,
                    timeout_ms: self.preemption.checkpoint_timeout_ms.min(u64::from(u32::MAX)) as u32,
                    max_deferral_ms: self.preemption.max_deferral_ms.min(u64::from(u32::MAX)) as u32,
                    grace_ms: cfg.preemption_grace_ms,
                }),
            };
            self.send(msg).await?;
        }
        for &key in &plan.stop {
            self.send(Out::Stop(v1::Stop {
                task: Some(task_ref(key)),
                grace_ms: cfg.stop_grace_ms,
                reason: "the task is no longer placed on this node (cancelled, re-placed or failed)".into(),
            }))
            .await?;
        }
        self.sent.sent(&plan);
        Ok(())
    }

    async fn handle(&mut self, m: v1::AgentMessage) -> Result<(), Status> {
        self.s.liveness.touch(&self.node);
        match m.msg {
            None => Err(Status::invalid_argument("invalid message: empty")),
            Some(In::Register(_)) => Err(Status::invalid_argument("invalid message: Register twice on one stream")),
            Some(In::LogData(data)) => {
                if !self.s.agents.answer(&self.node, data) {
                    tracing::warn!(node = %self.node, "log data for a request this node was not asked; dropped");
                }
                Ok(())
            }
            Some(In::Heartbeat(h)) => {
                self.sent.agent_runs_now(h.running.iter().map(|t| (t.alloc_id, t.task_index, t.epoch)));
                self.revive_if_lost().await?;
                self.sync(true).await?;
                self.send(Out::HeartbeatAck(v1::HeartbeatAck {})).await
            }
            Some(In::Checkpoint(c)) => {
                let key = key_of(&c.task)?;
                let cmd = if c.on_exit {
                    Command::SaveExitCheckpoint {
                        alloc: key.0,
                        task: key.1,
                        node: self.node.clone(),
                        epoch: key.2,
                        data: c.data,
                    }
                } else {
                    Command::SaveCheckpoint {
                        alloc: key.0,
                        task: key.1,
                        node: self.node.clone(),
                        epoch: c.preemption_epoch,
                        data: c.data,
                    }
                };
                // Checked on the leader before proposing, so an upload that
                // would be refused costs no log entry: ownership, epoch,
                // status and size as apply checks them (apply checks again:
                // the state may move), then the archive itself, which no
                // agent could restore if it is malformed or names a path
                // outside its directory.
                let data = match &cmd {
                    Command::SaveCheckpoint { data, .. } | Command::SaveExitCheckpoint { data, .. } => data,
                    _ => unreachable!("an upload command"),
                };
                let refusal = match self.s.reader.read(|st| st.precheck(&cmd)) {
                    Err(r) => Some(rejection_to_status(&r)),
                    Ok(()) => checkpoint_blob::files(data)
                        .err()
                        .map(|e| Status::invalid_argument(format!("invalid checkpoint: {e}"))),
                };
                if let Some(status) = refusal {
                    metrics::counter!("muster_agent_uploads_refused_total").increment(1);
                    tracing::warn!(alloc_id = key.0, task = key.1, node = %self.node, refusal = %status.message(), "checkpoint refused");
                    return self.refuse(key, &status).await;
                }
                if let Outcome::Rejected(r) = self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    tracing::warn!(
                        alloc_id = key.0, task = key.1, epoch = c.preemption_epoch, node = %self.node, rejection = %r,
                        "checkpoint refused"
                    );
                    self.refuse(key, &rejection_to_status(&r)).await?;
                }
                Ok(())
            }
            Some(In::Preempted(p)) => {
                let key = key_of(&p.task)?;
                self.sent.agent_stopped(&key);
                let cmd = Command::ConfirmPreempted {
                    alloc: key.0,
                    task: key.1,
                    node: self.node.clone(),
                    epoch: p.preemption_epoch,
                    checkpoint_failed: p.checkpoint_failed,
                };
                match self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    Outcome::Accepted(_) => self.s.admission_wake.notify_one(),
                    Outcome::Rejected(r) => {
                        tracing::info!(
                            alloc_id = key.0, task = key.1, epoch = p.preemption_epoch, node = %self.node, rejection = %r,
                            "preempted ack refused"
                        );
                        self.refuse(key, &rejection_to_status(&r)).await?;
                    }
                }
                self.send(Out::Recorded(v1::Recorded { task: Some(task_ref(key)) })).await
            }
            Some(In::Claim(c)) => {
                let key = key_of(&c.task)?;
                let cmd = Command::StartTask { alloc: key.0, task: key.1, node: self.node.clone(), epoch: key.2 };
                match self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    Outcome::Accepted(events) => {
                        let attempt = events
                            .iter()
                            .find_map(|e| match e {
                                Event::TaskStarted { attempt, .. } => Some(*attempt),
                                _ => None,
                            })
                            .unwrap_or(1);
                        self.sent.agent_started(key);
                        self.send(Out::Granted(v1::ClaimGranted { task: Some(task_ref(key)), attempt })).await
                    }
                    Outcome::Rejected(r) => self.refuse(key, &rejection_to_status(&r)).await,
                }
            }
            Some(In::WatchdogTripped(w)) => {
                let key = key_of(&w.task)?;
                self.sent.agent_stopped(&key);
                let kind = WatchdogKind::parse(&w.kind)
                    .ok_or_else(|| Status::invalid_argument(format!("invalid kind: {:?} is not a watchdog", w.kind)))?;
                tracing::warn!(
                    alloc_id = key.0, task = key.1, node = %self.node, kind = kind.as_str(), detail = %w.detail,
                    "watchdog tripped"
                );
                let cmd =
                    Command::TripWatchdog { alloc: key.0, task: key.1, node: self.node.clone(), epoch: key.2, kind };
                match self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    Outcome::Accepted(_) => self.s.admission_wake.notify_one(),
                    Outcome::Rejected(r) => self.refuse(key, &rejection_to_status(&r)).await?,
                }
                self.send(Out::Recorded(v1::Recorded { task: Some(task_ref(key)) })).await
            }
            Some(In::CheckpointUnusable(u)) => {
                let key = key_of(&u.task)?;
                let cmd = Command::DropCheckpoint {
                    alloc: key.0,
                    task: key.1,
                    node: self.node.clone(),
                    epoch: key.2,
                    reason: agent_reason(u.reason),
                };
                if let Outcome::Rejected(r) = self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    tracing::info!(alloc_id = key.0, task = key.1, node = %self.node, rejection = %r, "checkpoint drop refused");
                }
                Ok(())
            }
            Some(In::Exited(e)) => {
                let key = key_of(&e.task)?;
                self.sent.agent_stopped(&key);
                let node = self.node.clone();
                let cmd = if e.exit_code == Some(0) && e.error.is_empty() {
                    Command::FinishTask { alloc: key.0, task: key.1, node, epoch: key.2 }
                } else if !e.error.is_empty() && e.exit_code.is_none() && e.signal.is_none() {
                    let reason = agent_reason(e.error);
                    Command::FailTaskToStart { alloc: key.0, task: key.1, node, epoch: key.2, reason }
                } else {
                    let exit_code = e.exit_code.or(e.signal.map(|s| 128 + s));
                    Command::FailTask { alloc: key.0, task: key.1, node, epoch: key.2, exit_code }
                };
                match self.s.proposer.propose(cmd).await.map_err(propose_error_to_status)? {
                    Outcome::Accepted(_) => self.s.admission_wake.notify_one(),
                    Outcome::Rejected(r) => self.refuse(key, &rejection_to_status(&r)).await?,
                }
                self.send(Out::Recorded(v1::Recorded { task: Some(task_ref(key)) })).await
            }
        }
    }
}

/// An agent's reason cut to what a command may carry.
/// What a node notice says about a status.
fn status_detail(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Draining => "draining: no new work; running tasks finish",
        NodeStatus::Stopping => "stopping: the drain deadline passed; remaining tasks are being moved",
        NodeStatus::Stopped => "stopped: the machine may be powered off",
        NodeStatus::Terminated => "terminated",
        NodeStatus::Pending => "pending",
        NodeStatus::Ready => "ready",
        NodeStatus::Lost => "lost",
    }
}

fn agent_reason(mut reason: String) -> String {
    if reason.len() > MAX_AGENT_REASON_BYTES {
        let mut cut = MAX_AGENT_REASON_BYTES - 3;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str("...");
    }
    reason
}

trait UpperSnake {
    fn to_uppercase_snake(&self) -> String;
}

impl UpperSnake for String {
    /// `PermissionDenied` → `PERMISSION_DENIED`.
    fn to_uppercase_snake(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22, item 7: a log reply is taken only from the node the request
    /// went to, and request ids cannot be guessed from earlier ones.
    #[tokio::test]
    async fn a_log_reply_counts_only_from_the_node_asked() {
        let registry = AgentRegistry::default();
        let (a, b) = (NodeId::new("node-a"), NodeId::new("node-b"));
        let (tx_a, mut rx_a) = mpsc::channel(4);
        let (tx_b, _rx_b) = mpsc::channel(4);
        registry.attach(&a, &tx_a);
        registry.attach(&b, &tx_b);
        let asking = registry.clone();
        let fetch =
            tokio::spawn(async move { asking.fetch_logs(&NodeId::new("node-a"), v1::FetchLogs::default()).await });
        let Some(Ok(v1::SchedulerMessage { msg: Some(Out::FetchLogs(req)) })) = rx_a.recv().await else {
            panic!("node-a was asked")
        };
        let forged =
            v1::LogData { request_id: req.request_id, data: b"injected".to_vec(), eof: true, ..Default::default() };
        assert!(!registry.answer(&b, forged), "node-b cannot answer node-a's request");
        let real = v1::LogData { request_id: req.request_id, data: b"real".to_vec(), ..Default::default() };
        assert!(registry.answer(&a, real));
        assert_eq!(fetch.await.unwrap().unwrap().data, b"real");

        let ids: std::collections::BTreeSet<u64> = (1..=64).map(unguessable_id).collect();
        assert_eq!(ids.len(), 64);
        let sequential = (1..=64u64).filter(|&n| ids.contains(&n) || ids.contains(&(req.request_id + n))).count();
        assert_eq!(sequential, 0, "ids are not a counter");
    }
}
