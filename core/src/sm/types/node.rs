//! Nodes: their status, drain and history.

use super::*;

/// A node's lifecycle status (`docs/nodes.md` has the transition table).
/// Only `Ready` nodes take new reservations.
///
/// ```text
///   Pending ──▶ Ready ◀──▶ Draining ──▶ Stopping ──▶ Stopped ──▶ Terminated
///                 │  (cancel-drain: Draining ──▶ Ready)      ▲  │
///                 └──── stop (empty) from Ready, Draining, ──┘  │ restart
///                       Stopping or Lost                        ▼
///   Ready / Draining / Stopping ── silent while holding work ──▶ Lost ──▶ Ready
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Registered; its agent has not yet finished reconciling.
    Pending,
    /// Accepting reservations.
    Ready,
    /// Taking no new work; its tasks run to completion (or to the drain
    /// deadline). Stops by itself once empty.
    Draining,
    /// Its drain deadline passed: its remaining tasks are being preempted
    /// (checkpoint hint, or SIGTERM) and re-queued elsewhere. Stops once
    /// empty.
    Stopping,
    /// Empty and out of service; the agent was told, so the machine can be
    /// powered off. An operator may restart it.
    Stopped,
    /// Retired for good: its agent may not register under this name again.
    Terminated,
    /// Silent while holding work; its tasks were failed. Registering again
    /// makes it ready.
    Lost,
}

impl NodeStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [NodeStatus; 7] = [
        NodeStatus::Pending,
        NodeStatus::Ready,
        NodeStatus::Draining,
        NodeStatus::Stopping,
        NodeStatus::Stopped,
        NodeStatus::Terminated,
        NodeStatus::Lost,
    ];

    /// `pending`, `ready`, … (metric labels, CLI, errors).
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Pending => "pending",
            NodeStatus::Ready => "ready",
            NodeStatus::Draining => "draining",
            NodeStatus::Stopping => "stopping",
            NodeStatus::Stopped => "stopped",
            NodeStatus::Terminated => "terminated",
            NodeStatus::Lost => "lost",
        }
    }

    /// Whether tasks may hold capacity on a node in this status (it is
    /// watched for silence, and its tasks are failed when it is lost).
    pub fn may_hold_work(self) -> bool {
        matches!(self, NodeStatus::Ready | NodeStatus::Draining | NodeStatus::Stopping)
    }
}

/// An operator's drain of a node, kept while the node drains or stops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Entry time of the drain command.
    pub started_at_ms: u64,
    /// When the remaining tasks are preempted and the node stops (entry
    /// time; the leader compares its clock against it, so a new leader
    /// keeps the same deadline).
    pub deadline_ms: u64,
    /// Why, as the operator put it.
    pub reason: String,
    /// Who asked.
    pub by: String,
}

/// How many events a node keeps for `muster node get` and watchers.
pub const NODE_HISTORY_LIMIT: usize = 64;

/// A node as the state machine knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The operator-facing name.
    pub id: NodeId,
    /// Its position in the node table.
    pub slot: NodeSlot,
    /// What it has.
    pub resources: Resources,
    /// Free-form labels (pool, rack, GPU model); selectors come later.
    pub labels: BTreeMap<String, String>,
    /// Lifecycle status.
    pub status: NodeStatus,
    /// Entry time of the latest status change.
    pub status_since_ms: u64,
    /// The drain in progress: set exactly while `Draining` or `Stopping`.
    pub drain: Option<Drain>,
    /// Consumables held by reserved and running tasks.
    pub used: Usage,
    /// When it first registered (entry time).
    pub registered_at_ms: u64,
    /// Bumped by every event about this node.
    pub revision: u64,
    /// The latest events (at most [`NODE_HISTORY_LIMIT`]), oldest first.
    pub history: VecDeque<AllocEvent>,
}

impl Node {
    /// The vCluster the node belongs to (its `muster.vcluster` label).
    pub fn vcluster(&self) -> &str {
        self.labels.get(VCLUSTER_LABEL).map_or(DEFAULT_VCLUSTER, String::as_str)
    }

    /// Consumables not held by any reserved or running task.
    pub fn free(&self) -> Usage {
        Usage::of(&self.resources).minus(&self.used)
    }
}
