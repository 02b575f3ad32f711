//! The nouns of the state machine: nodes, allocations, tasks and their statuses.
//!
//! Everything here is plain data. Transitions live in `state/`; validation of
//! user input lives in `validate.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};

/// An allocation's id, assigned by the state machine in log order (1, 2, 3, …).
pub type AllocId = u64;

/// A task's index inside its gang (0 ..= gang_size - 1).
pub type TaskIndex = u32;

/// A node's operator-facing name (the agent registers with it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub String);

impl NodeId {
    /// Builds a node id from anything string-like.
    pub fn new(id: impl Into<String>) -> Self {
        NodeId(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's dense position in [`crate::sm::State`]'s node table, assigned in
/// registration order and never reused. Tasks refer to nodes by slot so that
/// placement does not hash or compare strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeSlot(pub u32);

/// Resources, on a node (what it has) or on a task (what it needs).
///
/// `gpus`, `mem_mb` and `cpus` are consumed: the tasks placed on a node may
/// not add up to more than the node has. `vram_mb` is memory **per GPU**: on a
/// node, what each of its GPUs has; on a task, the least each of its GPUs must
/// have. It is a constraint, not a consumable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// Whole GPUs.
    pub gpus: u32,
    /// Memory per GPU, in MiB.
    pub vram_mb: u64,
    /// Host memory, in MiB.
    pub mem_mb: u64,
    /// CPU cores.
    pub cpus: u32,
}

/// The consumable part of [`Resources`]: what is in use on a node, or free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Whole GPUs.
    pub gpus: u32,
    /// Host memory, in MiB.
    pub mem_mb: u64,
    /// CPU cores.
    pub cpus: u32,
}

impl Usage {
    /// What a task of these resources consumes.
    pub fn of(r: &Resources) -> Usage {
        Usage { gpus: r.gpus, mem_mb: r.mem_mb, cpus: r.cpus }
    }

    /// Whether `need` fits inside `self` (read as free capacity).
    pub fn covers(&self, need: &Usage) -> bool {
        self.gpus >= need.gpus && self.mem_mb >= need.mem_mb && self.cpus >= need.cpus
    }

    /// `self + other`, saturating (capacity never wraps).
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            gpus: self.gpus.saturating_add(other.gpus),
            mem_mb: self.mem_mb.saturating_add(other.mem_mb),
            cpus: self.cpus.saturating_add(other.cpus),
        }
    }

    /// `self - other`, saturating at zero.
    pub fn minus(&self, other: &Usage) -> Usage {
        Usage {
            gpus: self.gpus.saturating_sub(other.gpus),
            mem_mb: self.mem_mb.saturating_sub(other.mem_mb),
            cpus: self.cpus.saturating_sub(other.cpus),
        }
    }
}

/// Whether a task of resources `need` may go on a node of resources `node`
/// whose free consumables are `free`.
pub fn fits(need: &Resources, node: &Resources, free: &Usage) -> bool {
    free.covers(&Usage::of(need)) && (need.gpus == 0 || node.vram_mb >= need.vram_mb)
}

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

/// How an allocation saves and restores its progress when preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CheckpointMode {
    /// The scheduler asks for a checkpoint before preempting.
    Auto,
    /// The task checkpoints on its own schedule; the scheduler only signals.
    Manual,
    /// The task cannot checkpoint; preemption loses its progress.
    None,
}

/// The kind of a vCluster: it decides how its allocations may be preempted
/// (the preemption-policy seed's per-vCluster table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VClusterType {
    /// Class-based, checkpoint-aware preemption.
    #[default]
    HpcBatch,
    /// Preemptible; the checkpoint term of its cost is weighted double.
    MlTraining,
    /// Preempted only where it runs on borrowed nodes (another vCluster's).
    Service,
    /// Never preempted (class 10, no exceptions).
    Sensitive,
    /// Preemptible; short-lived, so its remaining-walltime value counts half.
    Interactive,
}

impl VClusterType {
    /// The API spelling: `hpc-batch`, `ml-training`, `service`, `sensitive`,
    /// `interactive`.
    pub fn as_str(self) -> &'static str {
        match self {
            VClusterType::HpcBatch => "hpc-batch",
            VClusterType::MlTraining => "ml-training",
            VClusterType::Service => "service",
            VClusterType::Sensitive => "sensitive",
            VClusterType::Interactive => "interactive",
        }
    }

    /// Parses the API spelling.
    pub fn parse(s: &str) -> Option<VClusterType> {
        Some(match s {
            "hpc-batch" => VClusterType::HpcBatch,
            "ml-training" => VClusterType::MlTraining,
            "service" => VClusterType::Service,
            "sensitive" => VClusterType::Sensitive,
            "interactive" => VClusterType::Interactive,
            _ => return None,
        })
    }
}

/// Which watchdog stopped a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WatchdogKind {
    /// It ran for its whole walltime budget.
    Budget,
    /// It stopped beating, and its GPU was idle and its memory static.
    Stall,
    /// Its GPU was idle and its memory static for the health window.
    GpuHealth,
}

impl WatchdogKind {
    /// `budget`, `stall` or `gpu_health` (API, metric labels, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            WatchdogKind::Budget => "budget",
            WatchdogKind::Stall => "stall",
            WatchdogKind::GpuHealth => "gpu_health",
        }
    }

    /// Parses the API spelling.
    pub fn parse(s: &str) -> Option<WatchdogKind> {
        Some(match s {
            "budget" => WatchdogKind::Budget,
            "stall" => WatchdogKind::Stall,
            "gpu_health" => WatchdogKind::GpuHealth,
            _ => return None,
        })
    }
}

/// The node label naming the vCluster a node belongs to (absent: the default
/// vCluster). A task on a node of another vCluster runs on borrowed capacity.
pub const VCLUSTER_LABEL: &str = "muster.vcluster";

/// The default checkpoint-time estimate of an `Auto` allocation that gives
/// none, in seconds.
pub const DEFAULT_CHECKPOINT_ESTIMATE_S: u32 = 60;

/// What a user submits: one gang of `gang_size` identical tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSpec {
    /// Who submitted it (user or service account).
    pub owner: String,
    /// N: how many tasks must be placed together (1 for a plain job).
    pub gang_size: u32,
    /// What each task needs.
    pub resources: Resources,
    /// 0 (first to be preempted) ..= 10 (never preempted).
    pub preemption_class: u8,
    /// Tie-breaker within a class: higher goes first.
    pub priority: i32,
    /// How progress survives preemption.
    pub checkpoint: CheckpointMode,
    /// The wall-clock budget of one attempt, in seconds.
    pub walltime_s: u64,
    /// How many failed attempts a task may accumulate before its gang fails
    /// (the seed's `MaxRetries`: 3 means the third real failure is terminal).
    pub max_retries: u32,
    /// argv of each task's process.
    pub command: Vec<String>,
    /// Extra environment of each task's process.
    pub env: BTreeMap<String, String>,
    /// A retried submit with the same owner and key returns the same allocation.
    pub idempotency_key: Option<String>,
    /// The vCluster it belongs to (quotas and borrowing come with the
    /// vCluster issue; every allocation already names one).
    pub vcluster: String,
    /// Its vCluster's type (how it may be preempted).
    pub vcluster_type: VClusterType,
    /// A sensitive allocation (class 10 only) is never preempted.
    pub sensitive: bool,
    /// How long a checkpoint takes, as the user estimates it (seconds); the
    /// preemption cost of an `Auto` allocation counts it.
    pub checkpoint_estimate_s: u32,
    /// The stall watchdog's window in seconds (0: off). Opt-in: a task that
    /// beats (touches `MUSTER_PROGRESS_FILE`) and then stays silent this
    /// long, with its GPU idle and memory static, is stopped and retried.
    pub stall_timeout_s: u32,
}

/// The vCluster of an allocation that names none.
pub const DEFAULT_VCLUSTER: &str = "default";

impl AllocSpec {
    /// A spec with the defaults users get when they leave fields out: class 0,
    /// priority 0, checkpoint `Auto` taking about a minute, one hour of
    /// walltime, 3 retries, no env, no idempotency key, the default vCluster
    /// of type hpc-batch, not sensitive.
    pub fn new(owner: impl Into<String>, gang_size: u32, resources: Resources, command: Vec<String>) -> AllocSpec {
        AllocSpec {
            owner: owner.into(),
            gang_size,
            resources,
            preemption_class: 0,
            priority: 0,
            checkpoint: CheckpointMode::Auto,
            walltime_s: 3600,
            max_retries: 3,
            command,
            env: BTreeMap::new(),
            idempotency_key: None,
            vcluster: DEFAULT_VCLUSTER.to_string(),
            vcluster_type: VClusterType::HpcBatch,
            sensitive: false,
            checkpoint_estimate_s: DEFAULT_CHECKPOINT_ESTIMATE_S,
            stall_timeout_s: 0,
        }
    }

    /// Marked sensitive, or in a sensitive vCluster (class 10 only).
    pub fn is_sensitive(&self) -> bool {
        self.sensitive || self.vcluster_type == VClusterType::Sensitive
    }

    /// Whether no preemption may ever choose it, whatever its state: class
    /// 10, sensitive, a sensitive vCluster, or checkpoint `none` at class 7
    /// or above (all progress lost, high priority).
    pub fn never_preempted(&self) -> Option<&'static str> {
        if self.preemption_class >= crate::sm::MAX_PREEMPTION_CLASS {
            Some("class 10 is never preempted")
        } else if self.is_sensitive() {
            Some("sensitive allocations are never preempted")
        } else if self.checkpoint == CheckpointMode::None && self.preemption_class >= 7 {
            Some("checkpoint none at class 7 or above is non-preemptible")
        } else {
            None
        }
    }
}

/// A task's status. (A suspended gang's tasks are blocked; suspension is the
/// allocation's status.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Waiting for its gang to be placed.
    Blocked,
    /// Placed on a node by a reservation; not yet claimed.
    Reserved,
    /// Claimed by its node's agent; its process runs.
    Running,
    /// Its gang is being torn down (a sibling failed) or preempted (a higher
    /// class needs its nodes): its agent has been told to stop the process
    /// (after a checkpoint hint, or SIGTERM, grace, SIGKILL), may upload a
    /// checkpoint, and must acknowledge with the task's preemption epoch.
    /// Still holds capacity.
    Preempting,
    /// Stopped for a teardown (acknowledged, or forced at the timeout); waits
    /// for the rest of its gang to stop. Holds nothing.
    Preempted,
    /// Exited successfully.
    Done,
    /// Out of retries, or its gang failed.
    Failed,
    /// Cancelled by a user or operator.
    Cancelled,
}

impl Task {
    /// The node its latest attempt ran on.
    pub fn last_node(&self) -> Option<NodeSlot> {
        self.run_nodes.last().copied()
    }

    /// The node attempt `run` (1 for the first) ran on.
    pub fn run_node(&self, run: u32) -> Option<NodeSlot> {
        self.run_nodes.get((run as usize).checked_sub(1)?).copied()
    }
}

impl TaskStatus {
    /// Whether the task holds capacity on a node.
    pub fn holds_capacity(self) -> bool {
        matches!(self, TaskStatus::Reserved | TaskStatus::Running | TaskStatus::Preempting)
    }

    /// Whether the task will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Done | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// One member of a gang.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Its index in the gang.
    pub index: TaskIndex,
    /// Its status.
    pub status: TaskStatus,
    /// The node it is reserved on or runs on.
    pub node: Option<NodeSlot>,
    /// Claims charged against the retry budget (refunded when the task was
    /// only a bystander of a sibling's failure).
    pub attempts: u32,
    /// Attempts started, never refunded: numbers `MUSTER_ATTEMPT` and the
    /// attempt logs (a refunded bystander's next run must not reuse a number).
    pub runs: u32,
    /// The reservation epoch it was placed under (0: never placed).
    pub reservation_epoch: u64,
    /// When its current reservation was made.
    pub reserved_at_ms: Option<u64>,
    /// When its current attempt started.
    pub started_at_ms: Option<u64>,
    /// When it last left `Running`.
    pub finished_at_ms: Option<u64>,
    /// The exit code of its last attempt, if it exited with one.
    pub exit_code: Option<i32>,
    /// The node each attempt ran on, in order (run `n` on `run_nodes[n - 1]`;
    /// kept after it ends: each attempt's logs live on its node).
    pub run_nodes: Vec<NodeSlot>,
    /// The gang teardown this task was last told to stop for (0: never).
    /// Acks and checkpoint uploads must carry it.
    pub preemption_epoch: u64,
    /// The latest checkpoint saved while it was preempting; given to every
    /// later attempt until a newer one replaces it.
    pub checkpoint: Option<Checkpoint>,
    /// Times a watchdog stopped it (retried elsewhere up to the cap; not
    /// charged to the retry budget).
    pub watchdog_trips: u32,
    /// The watchdog that stopped its latest stopped attempt, if one did.
    pub last_watchdog: Option<WatchdogKind>,
    /// Failures retried in place on its draining node since it was last
    /// placed by admission (the worker-draining seed: at most 3).
    pub drain_retries: u32,
}

/// Opaque bytes a task left in its checkpoint directory while being
/// preempted. The scheduler never parses them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The preemption epoch it was saved under.
    pub epoch: u64,
    /// Entry time of the save.
    pub saved_at_ms: u64,
    /// The bytes (the agent's archive of the directory).
    pub data: Vec<u8>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("epoch", &self.epoch)
            .field("saved_at_ms", &self.saved_at_ms)
            .field("bytes", &self.data.len())
            .finish()
    }
}

/// Why a gang is being torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TeardownCause {
    /// One task failed (or its node was lost, or its reservation went
    /// stale) while siblings ran; that task keeps its charged attempt.
    TaskFailed {
        /// The task whose failure started it.
        trigger: TaskIndex,
    },
    /// A higher-class allocation needs the gang's nodes (priority
    /// preemption): every task is asked to checkpoint and stop.
    Preempted {
        /// The allocation the nodes are freed for.
        by: AllocId,
        /// Why (`priority`, or `sensitive` for a sensitive claim).
        reason: PreemptReason,
    },
    /// A node the gang runs on reached its drain deadline: every task is
    /// asked to checkpoint and stop, and the gang resumes elsewhere.
    NodeDrain,
    /// A user or operator cancelled the allocation while tasks ran: every
    /// task is stopped (SIGTERM, grace, SIGKILL) and keeps its capacity
    /// until its agent confirms it stopped or the force deadline passes;
    /// then the allocation is cancelled.
    Cancelled {
        /// The preemptor that waits for these nodes, when the cancel came
        /// during a priority preemption or reclamation.
        preempted_by: Option<AllocId>,
    },
}

/// Why a preemption happened (the `reason` label of `muster_preemptions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PreemptReason {
    /// A higher-class allocation could not be placed otherwise.
    Priority,
    /// A sensitive (class 10) allocation claimed the nodes.
    Sensitive,
    /// The nodes' home vCluster took back what it had lent (elastic
    /// reclamation): borrowed work is preempted whatever its class.
    Reclaim,
}

impl PreemptReason {
    /// `priority`, `sensitive` or `reclaim`.
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptReason::Priority => "priority",
            PreemptReason::Sensitive => "sensitive",
            PreemptReason::Reclaim => "reclaim",
        }
    }
}

/// A gang teardown in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Teardown {
    /// The allocation's preemption epoch for this round.
    pub epoch: u64,
    /// Why.
    pub cause: TeardownCause,
    /// Entry time of the start: the forced-teardown deadline counts from here.
    pub started_at_ms: u64,
    /// Tasks of a preemption that did not checkpoint in time (unresponsive,
    /// or forced): each was charged an attempt, and the gang is requeued
    /// rather than suspended.
    pub failed_checkpoints: u32,
}

impl Teardown {
    /// The preemptor, when this teardown is a priority preemption.
    pub fn preempted_by(&self) -> Option<AllocId> {
        match self.cause {
            TeardownCause::Preempted { by, .. } => Some(by),
            TeardownCause::Cancelled { preempted_by } => preempted_by,
            TeardownCause::TaskFailed { .. } | TeardownCause::NodeDrain => None,
        }
    }

    /// Whether this teardown ends in the allocation's cancellation.
    pub fn is_cancel(&self) -> bool {
        matches!(self.cause, TeardownCause::Cancelled { .. })
    }

    /// Whether the gang is stopped through no fault of its own, for its
    /// nodes (a preemption or a node drain's deadline): its tasks are asked
    /// to checkpoint first, one that does not in time is charged, and a gang
    /// whose every task stopped in time is suspended rather than requeued.
    pub fn asks_checkpoint(&self) -> bool {
        matches!(self.cause, TeardownCause::Preempted { .. } | TeardownCause::NodeDrain)
    }
}

/// Nodes held for a preemptor while its victims checkpoint and stop: no other
/// gang may be reserved there, and the moment the last victim releases its
/// nodes the preemptor is reserved on them (in the same command).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nomination {
    /// Task `i` goes to `nodes[i]`.
    pub nodes: Vec<NodeSlot>,
    /// Victims that still hold capacity.
    pub waiting_for: Vec<AllocId>,
    /// Entry time of the decision.
    pub decided_at_ms: u64,
    /// The hold ends here if the preemptor has not been reserved.
    pub expires_at_ms: u64,
}

/// How a teardown ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TeardownOutcome {
    /// The whole gang is blocked again, ready for re-admission.
    Blocked,
    /// A preempted gang checkpointed and stopped: it is queued again as
    /// suspended, to resume from its checkpoints.
    Suspended,
    /// A task is out of retries, or a task had already finished: the gang
    /// cannot be restarted whole and failed.
    Failed,
}

impl TeardownOutcome {
    /// `blocked`, `suspended` or `failed` (metric labels, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            TeardownOutcome::Blocked => "blocked",
            TeardownOutcome::Suspended => "suspended",
            TeardownOutcome::Failed => "failed",
        }
    }
}

/// An allocation's status, derived from its tasks after every transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AllocStatus {
    /// Every task is blocked: waiting for admission.
    Queued,
    /// Preempted for a higher class: every task is blocked, and the gang is
    /// queued again with its original submit time, to resume from its
    /// checkpoints.
    Suspended,
    /// Placed; some tasks not yet claimed.
    Reserved,
    /// Every unfinished task runs.
    Running,
    /// A gang teardown is in progress: siblings of a failed task are being
    /// stopped; the gang returns to the queue (or fails) once none runs.
    TearingDown,
    /// Every task exited successfully.
    Done,
    /// Out of retries, or could not be restarted whole.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl AllocStatus {
    /// Whether the allocation will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, AllocStatus::Done | AllocStatus::Failed | AllocStatus::Cancelled)
    }
}

/// How many events an allocation keeps for watchers (older ones are dropped).
pub const HISTORY_LIMIT: usize = 256;

/// One entry of an allocation's or a node's history, for `Watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocEvent {
    /// The allocation's (node's) revision after this event (1 for the first).
    pub revision: u64,
    /// Entry time.
    pub time_ms: u64,
    /// What happened.
    pub event: crate::sm::Event,
}

/// An allocation and its gang of tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Its id.
    pub id: AllocId,
    /// What was submitted.
    pub spec: AllocSpec,
    /// Entry time of the submit. Never reset by a requeue.
    pub submit_time_ms: u64,
    /// Entry time it last became queued (or suspended): its submit, or the
    /// end of the teardown or rollback that sent it back. A reclamation's
    /// return grace counts from here.
    pub queued_since_ms: u64,
    /// Status, derived from the tasks (or terminal).
    pub status: AllocStatus,
    /// The epoch of the latest reservation (0: never reserved).
    pub reservation_epoch: u64,
    /// When the gang was first reserved.
    pub first_reserved_at_ms: Option<u64>,
    /// When the allocation reached a terminal status.
    pub finished_at_ms: Option<u64>,
    /// The gang's tasks, by index.
    pub tasks: Vec<Task>,
    /// Bumped by every event about this allocation.
    pub revision: u64,
    /// The latest events (at most [`HISTORY_LIMIT`]), oldest first.
    pub history: VecDeque<AllocEvent>,
    /// Bumped by every teardown (0: never torn down).
    pub preemption_epoch: u64,
    /// The teardown in progress, if any.
    pub teardown: Option<Teardown>,
    /// How many priority preemptions it went through.
    pub preempted_count: u32,
    /// Set when a preemption suspended it; cleared when it is reserved
    /// again (its next attempt resumes from its checkpoints).
    pub suspended: bool,
    /// Nodes held for it while its victims stop (it is a preemptor).
    pub nomination: Option<Nomination>,
    /// Requeued after a watchdog trip: first in its class until placed.
    pub retry_first: bool,
    /// Nodes where a task of it tripped a watchdog since it was last
    /// placed: admission places it elsewhere when it can.
    pub avoid_nodes: Vec<NodeSlot>,
}

impl Allocation {
    /// Whether every task is blocked and the allocation is not terminal
    /// (queued or suspended): the only shape admission may place.
    pub fn is_queued(&self) -> bool {
        matches!(self.status, AllocStatus::Queued | AllocStatus::Suspended)
    }

    /// When the gang last (re)started: its latest running task's start.
    pub fn running_since_ms(&self) -> Option<u64> {
        self.tasks.iter().filter(|t| t.status == TaskStatus::Running).filter_map(|t| t.started_at_ms).max()
    }

    /// Whether any task is reserved but not yet claimed.
    pub fn has_reserved(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Reserved)
    }

    /// Whether any task has started in the current reservation.
    pub fn has_running(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Running)
    }

    /// Whether any task is still being stopped for a teardown.
    pub fn has_preempting(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Preempting)
    }
}

/// What a bearer token lets its holder do (docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TokenRole {
    /// Everything but Raft and the agent stream.
    Admin,
    /// Submit, cancel, read.
    Client,
    /// Read only.
    Reader,
}

impl TokenRole {
    /// `admin`, `client` or `reader`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::Client => "client",
            TokenRole::Reader => "reader",
        }
    }

    /// Parses [`TokenRole::as_str`]'s words.
    pub fn parse(s: &str) -> Option<TokenRole> {
        match s {
            "admin" => Some(TokenRole::Admin),
            "client" => Some(TokenRole::Client),
            "reader" => Some(TokenRole::Reader),
            _ => None,
        }
    }
}

/// A bearer token. Only the SHA-256 of its secret is stored; the secret is
/// shown once, when it is created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// Its id (part of the secret, so a check finds it without a scan).
    pub id: String,
    /// Who or what holds it.
    pub name: String,
    /// What it allows.
    pub role: TokenRole,
    /// SHA-256 of the secret.
    pub sha256: [u8; 32],
    /// When it was created (entry time).
    pub created_ms: u64,
    /// It stops working at this wall-clock time.
    pub expires_ms: u64,
    /// The admin who created it.
    pub created_by: String,
    /// When and by whom it was revoked.
    pub revoked: Option<(u64, String)>,
}
