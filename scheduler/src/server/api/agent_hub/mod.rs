//! The leader's end of the agent streams (`muster.v1.AgentService.Connect`).
//!
//! ```text
//!   Register ──▶ RegisterNode (Raft) ──▶ Registered ──▶ sync
//!   an entry touching this node ──▶ sync: what `plan_sync` plans (a notice,
//!                                 Assign, Preempt | CheckpointHint, Stop)
//!   Claim ──▶ StartTask (Raft) ──▶ ClaimGranted | Refused
//!   TaskExited ──▶ FinishTask | FailTask (Raft)
//!   Heartbeat ──▶ liveness (memory only) ──▶ sync (and Preempt again, for every
//!                 preempting task not yet acked) ──▶ HeartbeatAck
//!   CheckpointUpload{manifest} ──▶ SaveCheckpoint, or SaveExitCheckpoint when on_exit (Raft)
//!   CheckpointsDeleted ──▶ ForgetCheckpoints (Raft)
//!   Preempted ──▶ ConfirmPreempted (Raft) ──▶ Recorded (| Refused ABORTED: stale epoch)
//! ```
//!
//! A stream's messages are read in order, and their commands are queued for
//! the log in that order, but the stream does not wait for one command's
//! outcome before reading the next message: up to 64 wait at once, each
//! answered (`ClaimGranted`, `Recorded`, `Refused`) when its outcome comes.
//! A node that claims eight tasks at once waits one commit, not eight, and
//! its heartbeats are answered while its claims are in the log's queue.
//!
//! What to send is decided by the pure `muster_core::sync::plan_sync`; this
//! module only sends it. A stream wakes when an entry touched its node
//! (`session.rs`), on each heartbeat, and when it registers; the leader's
//! [`LeaderWork`] keeps when each node was last heard from, the streams and
//! the log requests waiting for an agent. Nothing about a teardown lives
//! in a stream's memory: a new leader's first sync finds the preempting
//! tasks in the replicated state and signals them again.
//!
//! The node id is fixed by the stream's `Register`: every later command is
//! made for that node, so an agent can only claim or report tasks placed on
//! its own node; anything else is refused with `PERMISSION_DENIED`. Only the
//! leader serves streams; when this replica stops leading, each stream ends
//! with UNAVAILABLE and the new leader's address, and agents reconnect there
//! with their running tasks (which keep running).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use muster_core::sync::{SentMemory, StopHow, SyncConfig, TaskKey, plan_sync};
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as In;
use muster_proto::v1::agent_service_server::AgentService;
use muster_proto::v1::scheduler_message::Msg as Out;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{not_leader_status, propose_error_to_status, rejection_to_status};
use crate::policy::PreemptionConfig;
use crate::server::leader::{LeaderWork, Outbound, OutboundStream};
use crate::server::policies::BugInjector;
use crate::server::raft::Consensus;
use crate::server::raft::leader_watch::SuccessorHint;
use crate::sm::{
    Command, Event, MAX_AGENT_REASON_BYTES, MAX_FORGET_CHECKPOINTS, NodeId, NodeStatus, Outcome, PORTS_LABEL,
    PortRange, Resources, TaskStatus, WatchdogKind,
};

pub use muster_core::sync::{ADDRESS_LABEL, CHECKPOINT_ADDRESS_LABEL};

mod budget;
mod session;

pub use budget::{AgentBudgets, BudgetLimits};
use session::Session;

pub use muster_proto::MAX_AGENT_MESSAGE_BYTES;

/// Agent-stream settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubConfig {
    /// How often agents heartbeat.
    pub heartbeat_interval: Duration,
    /// SIGTERM → SIGKILL grace when the leader stops or preempts a task.
    pub stop_grace: Duration,
    /// How long an agent has to send `Register`.
    pub register_timeout: Duration,
    /// A silent node holding work is marked lost after this long (agents
    /// are told, and fence themselves in half of it; the leader's node-lost
    /// pass reads the same setting).
    pub node_lost_after: Duration,
    /// Refuse the registration of a node no admin admitted
    /// (`muster server --node-admission required`).
    pub admission_required: bool,
    /// Streams a second a successor is to take after a failover: agents
    /// spread their reconnects over the streams this leader holds at this
    /// rate (see [`reconnect_spread`]).
    pub reconnect_rate: u32,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            heartbeat_interval: Duration::from_secs(5),
            stop_grace: Duration::from_secs(15),
            register_timeout: Duration::from_secs(30),
            node_lost_after: Duration::from_secs(30),
            admission_required: false,
            reconnect_rate: DEFAULT_RECONNECT_RATE,
        }
    }
}

/// Agent streams a second a successor takes after a failover, by default.
/// Measured with the fleet bench (docs/performance.md, "Failover"): on two
/// cores shared by three replicas and 10,000 agents, a successor took about
/// this many registrations a second (a TLS handshake, a `RegisterNode`
/// command and a first sync each) while it placed tasks.
pub const DEFAULT_RECONNECT_RATE: u32 = 2_000;

/// The window over which a leader's agents spread their reconnects when
/// their streams break: `streams` at `rate` a second, and at most a sixth
/// of the node-lost window. An agent fences itself when no leader has
/// answered it for half of that window; its last answer may be a heartbeat
/// interval old when the leader dies, so the spread keeps well inside it.
pub fn reconnect_spread(streams: usize, rate: u32, node_lost_after: Duration) -> Duration {
    let ms = (streams as u64).saturating_mul(1_000) / u64::from(rate.max(1));
    Duration::from_millis(ms).min(node_lost_after / 6)
}

/// The agent service of one replica.
pub struct AgentHub {
    s: Consensus,
    cfg: HubConfig,
    preemption: PreemptionConfig,
    own: HubHandles,
}

/// What the hub holds besides the consensus: the leader work its streams
/// feed (heartbeats, the streams themselves, admission wake-ups), what
/// each node's commands may cost the log, who to name while a leader's
/// successor is elected, and the replica's injected bug (tests only).
#[derive(Clone)]
pub(super) struct HubHandles {
    work: LeaderWork,
    budgets: AgentBudgets,
    successor: SuccessorHint,
    bugs: Arc<BugInjector>,
}

impl AgentHub {
    /// The agent service over a replica's consensus and leader work.
    pub fn new(
        s: Consensus,
        work: LeaderWork,
        cfg: HubConfig,
        preemption: PreemptionConfig,
        successor: SuccessorHint,
        bugs: Arc<BugInjector>,
    ) -> Self {
        let budgets = AgentBudgets::new(s.clock().clone(), BudgetLimits::default());
        AgentHub { s, cfg, preemption, own: HubHandles { work, budgets, successor, bugs } }
    }
}

/// UNAVAILABLE naming the leader an agent should go to: the one this
/// replica follows, or, while a gone leader's successor is being elected,
/// that successor once known (a bounded wait).
async fn leader_status(successor: &SuccessorHint) -> Status {
    not_leader_status(successor.get().await)
}

#[tonic::async_trait]
impl AgentService for AgentHub {
    type ConnectStream = OutboundStream;

    async fn connect(
        &self,
        req: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if !self.s.is_leader() {
            // During an election, name the successor rather than a leader
            // that is gone; this replica may turn out to be it.
            let status = leader_status(&self.own.successor).await;
            if !self.s.is_leader() {
                return Err(status);
            }
        }
        let (tx, rx) = mpsc::channel(1024);
        let peer = Peer { caller: muster_tls::Caller::of(&req), cert_sha256: peer_cert_sha256(&req) };
        let (s, cfg, preemption, inbound) = (self.s.clone(), self.cfg, self.preemption, req.into_inner());
        let own = self.own.clone();
        tokio::spawn(async move {
            let run = Session::run(s, own, cfg, preemption, peer, inbound, tx.clone());
            if let Err(status) = run.await {
                let _ = tx.send(Box::new(Err(status))).await;
            }
        });
        Ok(Response::new(OutboundStream(rx)))
    }
}

type Key = TaskKey;

/// Who opened a stream: the authorised caller, and the certificate it
/// presented.
pub(super) struct Peer {
    caller: muster_tls::Caller,
    cert_sha256: Option<[u8; 32]>,
}

/// The SHA-256 of the DER of the certificate the connection presented, if
/// it presented one (what `muster node admit --cert` pins).
fn peer_cert_sha256<T>(req: &Request<T>) -> Option<[u8; 32]> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let certs = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>()?.peer_certs()?;
    let leaf = certs.first()?;
    Some(<sha2::Sha256 as sha2::Digest>::digest(leaf.as_ref()).into())
}

fn key_of(t: &Option<v1::TaskRef>) -> Result<Key, Status> {
    let t = t.as_ref().ok_or_else(|| Status::invalid_argument("invalid task: is required"))?;
    Ok((t.alloc_id, t.task_index, t.epoch))
}

fn task_ref(k: Key) -> v1::TaskRef {
    v1::TaskRef { alloc_id: k.0, task_index: k.1, epoch: k.2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet's reconnects are spread over its streams at the rate, and
    /// never past a sixth of the node-lost window (where agents would
    /// start fencing before their turn came).
    #[test]
    fn a_fleets_reconnects_spread_over_its_streams_at_the_rate() {
        let lost = Duration::from_secs(30);
        assert_eq!(reconnect_spread(10_000, 2_000, lost), Duration::from_secs(5));
        assert_eq!(reconnect_spread(3, 2_000, lost), Duration::from_millis(1));
        assert_eq!(reconnect_spread(0, 2_000, lost), Duration::ZERO);
        assert_eq!(reconnect_spread(50_000, 2_000, lost), Duration::from_secs(5), "capped");
        assert_eq!(reconnect_spread(5_000, 2_000, Duration::from_secs(6)), Duration::from_secs(1), "capped");
        assert_eq!(reconnect_spread(7, 0, lost), Duration::from_millis(5_000), "a zero rate is one a second");
    }
}
