//! Deterministic rejections: the typed reasons `apply` refuses a command.
//!
//! A rejection is part of the outcome, replicated like any other result. It is
//! never a panic and never leaves the state half-changed.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::types::{AllocId, AllocStatus, NodeId, NodeStatus, TaskIndex, TaskStatus};

/// Why a command was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum Rejection {
    /// A field of a submitted allocation is out of range or malformed.
    #[error("invalid allocation: {field}: {reason}")]
    InvalidSpec {
        /// The offending field, as named in the API.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A field of a node registration is out of range or malformed.
    #[error("invalid node: {field}: {reason}")]
    InvalidNode {
        /// The offending field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No such node.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// No such allocation.
    #[error("unknown allocation {0}")]
    UnknownAllocation(AllocId),
    /// The allocation has no task with that index.
    #[error("allocation {alloc} has no task {task}")]
    UnknownTask {
        /// The allocation.
        alloc: AllocId,
        /// The index asked for.
        task: TaskIndex,
    },
    /// The same owner and idempotency key were used for a different spec.
    #[error("idempotency key {key:?} already names allocation {alloc} with a different spec")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The allocation it names.
        alloc: AllocId,
    },
    /// Only a gang whose tasks are all blocked can be reserved.
    #[error("allocation {alloc} is {status:?}, not queued")]
    NotQueued {
        /// The allocation.
        alloc: AllocId,
        /// Its status.
        status: AllocStatus,
    },
    /// A reservation or rollback named an epoch that is not the expected one:
    /// the plan it came from is stale.
    #[error("allocation {alloc}: reservation epoch {got} is stale (expected {expected})")]
    StaleReservationEpoch {
        /// The allocation.
        alloc: AllocId,
        /// The epoch required.
        expected: u64,
        /// The epoch given.
        got: u64,
    },
    /// A reservation must name exactly one node per task.
    #[error("allocation {alloc}: {got} nodes given for a gang of {expected}")]
    WrongNodeCount {
        /// The allocation.
        alloc: AllocId,
        /// The gang size.
        expected: u32,
        /// The nodes given.
        got: u32,
    },
    /// A gang's tasks must go on distinct nodes.
    #[error("node {0} named twice in one reservation")]
    NodeRepeated(NodeId),
    /// The node does not take new reservations.
    #[error("node {0} is not ready")]
    NodeNotReady(NodeId),
    /// A lifecycle command that the node's status does not allow (the
    /// worker-draining seed's 409; `docs/nodes.md` has the table).
    #[error("node {node} is {}: cannot {action} (allowed from {})", from.as_str(), allowed_names(allowed))]
    IllegalNodeTransition {
        /// The node.
        node: NodeId,
        /// Its status.
        from: NodeStatus,
        /// What was asked (`drain`, `cancel-drain`, `stop`, …).
        action: String,
        /// The statuses the action is allowed from.
        allowed: Vec<NodeStatus>,
    },
    /// A direct stop of a node that still holds tasks.
    #[error("node {node} still holds {tasks} task(s): drain it (a drain with timeout 0 moves them now)")]
    NodeBusy {
        /// The node.
        node: NodeId,
        /// Tasks holding capacity on it.
        tasks: u32,
    },
    /// A drain expiry before the drain's deadline.
    #[error("node {node}'s drain lasts until {deadline_ms}")]
    DrainNotExpired {
        /// The node.
        node: NodeId,
        /// The deadline.
        deadline_ms: u64,
    },
    /// A token request is malformed.
    #[error("invalid token: {field}: {reason}")]
    InvalidToken {
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A token with this id exists.
    #[error("token {0} already exists")]
    TokenExists(String),
    /// A vCluster request is malformed.
    #[error("invalid vcluster: {field}: {reason}")]
    InvalidVCluster {
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Reserving the gang would take its vCluster past a hard quota (it
    /// stays queued).
    #[error("allocation {alloc} waits: {reason}")]
    QuotaExceeded {
        /// The allocation.
        alloc: AllocId,
        /// Which quota, in words.
        reason: String,
    },
    /// Reserving the gang would put it on another vCluster's nodes past
    /// what its vCluster may borrow (or it may never run there).
    #[error("allocation {alloc} may not borrow those nodes: {reason}")]
    BorrowRefused {
        /// The allocation.
        alloc: AllocId,
        /// Why, in words.
        reason: String,
    },
    /// A submission past its vCluster's hard quota (reject mode, or a gang
    /// larger than the quota itself).
    #[error("over quota: {reason}")]
    OverQuota {
        /// The vCluster.
        vcluster: String,
        /// Which quota, in words.
        reason: String,
    },
    /// A vCluster with this name exists.
    #[error("vcluster {0} already exists")]
    VClusterExists(String),
    /// No vCluster has this name.
    #[error("no vcluster {0}")]
    UnknownVCluster(String),
    /// No token has this id.
    #[error("no token {0}")]
    UnknownToken(String),
    /// The token was revoked already.
    #[error("token {0} is already revoked")]
    TokenRevoked(String),
    /// A registration claims more than the node was admitted for.
    #[error("node {node} is not admitted for this: {reason}")]
    NotAdmitted {
        /// The node.
        node: NodeId,
        /// What it claimed beyond its admission.
        reason: String,
    },
    /// A terminated node's agent tried to register again.
    #[error("node {0} was terminated; register the machine under a new name")]
    NodeTerminated(NodeId),
    /// The node lacks free capacity for the task.
    #[error("node {node} cannot fit task {task} of allocation {alloc}")]
    InsufficientCapacity {
        /// The node.
        node: NodeId,
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
    },
    /// A node does not meet one of the gang's label constraints.
    #[error("node {node} does not meet constraint {constraint} of allocation {alloc}")]
    ConstraintUnmet {
        /// The node.
        node: NodeId,
        /// The allocation.
        alloc: AllocId,
        /// The constraint, as written.
        constraint: String,
    },
    /// A gang that must be packed was placed across values of its topology
    /// label (or on a node without it).
    #[error("allocation {alloc} must run under one value of label {key}")]
    PackingBroken {
        /// The allocation.
        alloc: AllocId,
        /// The topology label.
        key: String,
    },
    /// Task 0's node has fewer free rendezvous ports than the gang asks for.
    #[error("node {node} has {free} free rendezvous port(s); allocation {alloc} needs {wanted} on task 0's node")]
    NoFreePorts {
        /// The node.
        node: NodeId,
        /// The allocation.
        alloc: AllocId,
        /// Ports the gang asks for.
        wanted: u32,
        /// Ports free there.
        free: u32,
    },
    /// A re-registration would leave the node with less than its tasks hold.
    #[error("node {0} cannot shrink below the capacity its tasks hold")]
    ShrinkBelowUsage(NodeId),
    /// The task is not in the status the command needs.
    #[error("allocation {alloc} task {task} is {status:?}, expected {expected:?}")]
    WrongTaskStatus {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Its status.
        status: TaskStatus,
        /// The status required.
        expected: TaskStatus,
    },
    /// A node spoke about a task that is not placed on it.
    #[error("allocation {alloc} task {task} is not placed on node {node}")]
    WrongNode {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The node that spoke.
        node: NodeId,
    },
    /// A claim or report carried an old reservation epoch.
    #[error("allocation {alloc} task {task}: epoch {got} is stale (current {current})")]
    StaleTaskEpoch {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The current epoch.
        current: u64,
        /// The epoch given.
        got: u64,
    },
    /// An ack, checkpoint or forced teardown named a preemption epoch that is not
    /// the task's (or teardown's) current one: it belongs to an earlier round.
    #[error("allocation {alloc}: preemption epoch {got} is stale (current {current})")]
    StalePreemptionEpoch {
        /// The allocation.
        alloc: AllocId,
        /// The current preemption epoch.
        current: u64,
        /// The epoch given.
        got: u64,
    },
    /// A forced teardown for an allocation with no teardown in progress.
    #[error("allocation {alloc} is not being torn down")]
    NotTearingDown {
        /// The allocation.
        alloc: AllocId,
    },
    /// A checkpoint over the size limit.
    #[error(
        "checkpoint of allocation {alloc} task {task} is {bytes} bytes, over the {limit}-byte limit \
         (its vCluster's, or the cluster's)"
    )]
    CheckpointTooLarge {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A checkpoint for an allocation submitted with `checkpoint: none`.
    #[error("allocation {alloc} was submitted with checkpoint mode none; it takes no checkpoints")]
    CheckpointDisabled {
        /// The allocation.
        alloc: AllocId,
    },
    /// Nothing is reserved to roll back.
    #[error("allocation {alloc} holds no reservation")]
    NothingReserved {
        /// The allocation.
        alloc: AllocId,
    },
    /// The allocation already reached a terminal status.
    #[error("allocation {alloc} is already {status:?}")]
    AlreadyTerminal {
        /// The allocation.
        alloc: AllocId,
        /// Its status.
        status: AllocStatus,
    },
    /// The allocation is already being cancelled: its tasks are stopping.
    #[error("allocation {alloc} is already being cancelled; its tasks are stopping")]
    AlreadyCancelling {
        /// The allocation.
        alloc: AllocId,
    },
    /// A preemption named a victim that may not be preempted for it.
    #[error("allocation {victim} cannot be preempted for allocation {alloc}: {reason}")]
    NotPreemptible {
        /// The preemptor.
        alloc: AllocId,
        /// The victim.
        victim: AllocId,
        /// Why, in words.
        reason: String,
    },
    /// A usage report wrapped something other than an attempt's end
    /// report.
    #[error("a usage report carries an attempt's end report, not {command}")]
    NotAnEndReport {
        /// The command it carried.
        command: String,
    },
    /// A node is held for another allocation's preemption.
    #[error("node {node} is held for allocation {holder}")]
    NodeHeld {
        /// The node.
        node: NodeId,
        /// The preemptor it is held for.
        holder: AllocId,
    },
    /// The allocation is waiting on nodes held for it; it cannot be placed
    /// elsewhere or nominated again.
    #[error("allocation {alloc} already waits for nodes held for it")]
    AlreadyNominated {
        /// The allocation.
        alloc: AllocId,
    },
    /// An expiry for an allocation that holds no nodes.
    #[error("allocation {alloc} holds no nodes")]
    NotNominated {
        /// The allocation.
        alloc: AllocId,
    },
    /// A hold whose deadline the entry's time has not reached.
    #[error("allocation {alloc}'s hold lasts until {expires_at_ms}")]
    NominationNotExpired {
        /// The allocation.
        alloc: AllocId,
        /// When it expires.
        expires_at_ms: u64,
    },
    /// A forget with nothing past its window at the entry's time.
    #[error("nothing to forget: no finished allocation or idempotency key is past its retention")]
    NothingToForget,
    /// A compaction with nothing past its window at the entry's time.
    #[error("nothing to compact: no finished allocation is past the detail window")]
    NothingToCompact,
    /// A forget whose parameters make no sense.
    #[error("invalid forget: {0}")]
    InvalidForget(String),
    /// A `NoteWaits` over its bounds.
    #[error("invalid wait notes: {0}")]
    InvalidWaitNotes(String),
    /// A checkpoint manifest that does not fit its task: a key not named for
    /// it, or a store the allocation may not use.
    #[error("invalid checkpoint of allocation {alloc} task {task}: {field}: {reason}")]
    InvalidCheckpoint {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The manifest's field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The task holds no checkpoint with this number.
    #[error("allocation {alloc} task {task} holds no checkpoint {seq}")]
    UnknownCheckpoint {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The manifest's number.
        seq: u64,
    },
    /// A node confirmed deleting a checkpoint that is another node's to
    /// delete.
    #[error("checkpoint {seq} is not node {node}'s to delete")]
    NotDeleter {
        /// The node.
        node: NodeId,
        /// The manifest's number.
        seq: u64,
    },
    /// Checkpoint settings out of range.
    #[error("invalid checkpoint settings: {field}: {reason}")]
    InvalidCheckpointSettings {
        /// The setting.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The command names an array that does not exist.
    #[error("unknown array {0}")]
    UnknownArray(AllocId),
}

fn allowed_names(allowed: &[NodeStatus]) -> String {
    allowed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}
