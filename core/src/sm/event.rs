//! Events and outcomes: what `apply` reports back.
//!
//! Events are past tense. The shell derives metrics, logs, agent pushes and
//! watch streams from them; the state machine itself emits nothing.

use serde::{Deserialize, Serialize};

use super::rejection::Rejection;
use super::types::{AllocId, NodeId, TaskIndex, TeardownCause, TeardownOutcome, TokenRole};

/// Something that happened while applying a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A bearer token was created.
    TokenCreated {
        /// Its id.
        id: String,
        /// Its holder.
        name: String,
        /// What it allows.
        role: TokenRole,
        /// The admin.
        by: String,
    },
    /// A bearer token was revoked.
    TokenRevoked {
        /// Its id.
        id: String,
        /// The admin.
        by: String,
    },
    /// A vCluster was created.
    VClusterCreated {
        /// Its name.
        name: String,
        /// The admin.
        by: String,
    },
    /// A vCluster's spec was changed.
    VClusterUpdated {
        /// Its name.
        name: String,
        /// Its new revision.
        revision: u64,
        /// The admin.
        by: String,
    },
    /// A node joined (`updated == false`) or re-registered.
    NodeRegistered {
        /// The node.
        node: NodeId,
        /// Whether it was already known.
        updated: bool,
    },
    /// An admin admitted node `node` (or withdrew its admission).
    NodeAdmitted {
        /// The node.
        node: NodeId,
        /// Whether it is admitted now.
        admitted: bool,
    },
    /// An admin changed node `node`'s labels.
    NodeLabelled {
        /// The node.
        node: NodeId,
        /// The admin.
        by: String,
    },
    /// A node was marked lost; these tasks were on it (reason `node_lost`).
    NodeLost {
        /// The node.
        node: NodeId,
        /// The tasks it held.
        tasks: Vec<(AllocId, TaskIndex)>,
    },
    /// A pending node took its first work-ready step.
    NodeReady {
        /// The node.
        node: NodeId,
    },
    /// An operator started draining a node.
    DrainStarted {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
        /// Why.
        reason: String,
        /// When its remaining tasks are preempted (entry time, ms).
        deadline_ms: u64,
        /// Tasks holding capacity on it at the start.
        tasks: u32,
    },
    /// An operator cancelled a drain; the node is ready again.
    DrainCancelled {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// A draining node's last task left: it stops.
    DrainCompleted {
        /// The node.
        node: NodeId,
        /// From the drain's start to now, ms.
        drain_ms: u64,
    },
    /// A draining node reached its deadline with work left: it is stopping,
    /// and these gangs are preempted (or their unclaimed reservations
    /// released) to resume elsewhere.
    DrainTimedOut {
        /// The node.
        node: NodeId,
        /// The allocations that held capacity on it.
        allocs: Vec<AllocId>,
    },
    /// A node stopped (its agent is told, so the machine can be powered off).
    NodeStopped {
        /// The node.
        node: NodeId,
        /// Who asked, when an operator stopped it directly.
        by: Option<String>,
        /// Why, in words.
        reason: String,
        /// From its drain's start to now, when a drain ended here.
        drain_ms: Option<u64>,
    },
    /// An operator returned a stopped node to service.
    NodeRestarted {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// An operator retired a stopped node for good.
    NodeTerminated {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// A single task failed on its draining node and was reserved there
    /// again (the worker-draining seed's retry on the same worker).
    RetriedOnDrainingNode {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The draining node.
        node: NodeId,
        /// The new reservation epoch.
        epoch: u64,
        /// Retries on this node so far, this one included.
        retry: u32,
    },
    /// An allocation was created, or a retried submit found it again.
    Submitted {
        /// The allocation.
        alloc: AllocId,
        /// Whether this was a retry of an earlier submit with the same key.
        duplicate: bool,
    },
    /// A gang was placed.
    GangReserved {
        /// The allocation.
        alloc: AllocId,
        /// The new reservation epoch.
        epoch: u64,
        /// Task `i` went to `nodes[i]`.
        nodes: Vec<NodeId>,
    },
    /// An unclaimed reservation went back to the queue.
    GangRolledBack {
        /// The allocation.
        alloc: AllocId,
        /// The rolled-back epoch.
        epoch: u64,
    },
    /// A task was claimed and started.
    TaskStarted {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Where.
        node: NodeId,
        /// Its attempt number (1 for the first; counts every start, refunded
        /// or not).
        attempt: u32,
    },
    /// A task exited successfully.
    TaskFinished {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
    },
    /// A task failed. `charged` says whether the attempt counted against the
    /// retry budget (a bystander of a sibling's failure is refunded).
    TaskFailed {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Its exit code.
        exit_code: Option<i32>,
        /// Whether the attempt was charged.
        charged: bool,
    },
    /// A task failed (or its node was lost, or its reservation went stale)
    /// while siblings ran, or a preemption chose the gang: its running tasks
    /// must stop.
    TeardownStarted {
        /// The allocation.
        alloc: AllocId,
        /// Why.
        cause: TeardownCause,
        /// The new preemption epoch.
        epoch: u64,
        /// The siblings moved running → preempting, with their nodes: each
        /// node's agent is told `Preempt{epoch}`.
        preempting: Vec<(TaskIndex, NodeId)>,
        /// How many unclaimed siblings were released to blocked.
        released: u32,
    },
    /// A preempting task stopped: acknowledged by its agent, or forced.
    TaskPreempted {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The teardown's preemption epoch.
        epoch: u64,
        /// Whether it was forced (timeout, or node lost) rather than acked.
        forced: bool,
        /// A preempted task that did not checkpoint in time (charged).
        checkpoint_failed: bool,
    },
    /// A preempting task's checkpoint was stored.
    CheckpointSaved {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The teardown's preemption epoch.
        epoch: u64,
        /// Its size.
        bytes: u64,
        /// From the teardown's start (the hint) to now, ms.
        after_ms: u64,
        /// Whether it was saved for a priority preemption.
        preempted: bool,
        /// Its manifest's number.
        seq: u64,
    },
    /// No task of the gang runs or is preempting any more.
    TeardownCompleted {
        /// The allocation.
        alloc: AllocId,
        /// The teardown's preemption epoch.
        epoch: u64,
        /// Why it was torn down.
        cause: TeardownCause,
        /// Blocked (requeued), suspended or failed.
        outcome: TeardownOutcome,
        /// From the start to now (entry times), ms.
        drain_ms: u64,
        /// Priority preemptions the allocation has gone through, this one
        /// included.
        preempted_count: u32,
    },
    /// A preemption decision committed: the victims are told to checkpoint
    /// and stop, and the nodes are held for the preemptor.
    PreemptionDecided {
        /// The preemptor.
        alloc: AllocId,
        /// The victims.
        victims: Vec<AllocId>,
        /// The nodes held, by task index.
        nodes: Vec<NodeId>,
        /// Priority or sensitive.
        reason: crate::sm::PreemptReason,
        /// Each victim's vCluster, in victim order (metric label).
        victim_vclusters: Vec<String>,
    },
    /// A preemptor's held nodes were let go without a reservation (the hold
    /// expired, or a held node stopped being usable).
    NominationDropped {
        /// The preemptor.
        alloc: AllocId,
        /// Why, in words.
        reason: String,
    },
    /// A watchdog stopped a task.
    WatchdogTripped {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Where it ran.
        node: NodeId,
        /// Which watchdog.
        kind: crate::sm::WatchdogKind,
        /// The task's trips so far, this one included.
        trips: u32,
        /// Whether it is retried (within the cap) or its allocation fails.
        retried: bool,
    },
    /// The whole gang is blocked again and eligible for admission.
    GangRequeued {
        /// The allocation.
        alloc: AllocId,
    },
    /// Every task finished.
    AllocationDone {
        /// The allocation.
        alloc: AllocId,
    },
    /// The allocation failed for good.
    AllocationFailed {
        /// The allocation.
        alloc: AllocId,
        /// Why, in words.
        reason: String,
    },
    /// The allocation was cancelled; `running` tasks must be stopped.
    AllocationCancelled {
        /// The allocation.
        alloc: AllocId,
        /// The tasks that were running or reserved, with their nodes.
        stopped: Vec<(TaskIndex, NodeId)>,
    },
    /// A stored checkpoint could not be restored on the task's node: the
    /// task runs without it, and it is dropped.
    CheckpointDropped {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The node that could not restore it.
        node: NodeId,
        /// What the agent said.
        reason: String,
        /// Its manifest's number.
        seq: u64,
    },
    /// A placed task's newest checkpoint is on a node that is gone (lost,
    /// stopped or terminated): its attempt restores an older one, or starts
    /// afresh when none is reachable.
    CheckpointUnreachable {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The newest manifest it cannot reach.
        seq: u64,
        /// The node that holds it.
        writer: NodeId,
        /// The manifest it restores instead (`None`: a fresh start).
        from: Option<u64>,
    },
    /// An admin changed the cluster's checkpoint settings.
    CheckpointSettingsChanged {
        /// The new settings.
        settings: super::types::CheckpointSettings,
        /// The admin.
        by: String,
    },
    /// A node's agent deleted retired checkpoints' bytes; the state forgot
    /// them.
    CheckpointsDeleted {
        /// The node.
        node: NodeId,
        /// How many.
        count: u32,
    },
    /// A claimed task's process could not be started (program not found, a
    /// checkpoint that cannot be restored, …); a `TaskFailed` follows.
    TaskStartFailed {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The node it was to run on.
        node: NodeId,
        /// What the agent said.
        reason: String,
    },
    /// Finished allocations past the detail window were compacted (their
    /// job-history records hold what the live state dropped).
    Compacted {
        /// Allocations compacted.
        allocs: u32,
        /// The newest allocation end compacted (entry time, ms).
        through_ms: u64,
    },
    /// Finished allocations past the retention window, and idempotency
    /// keys past theirs, left the live state (their records are in the job
    /// history).
    Forgotten {
        /// Allocations forgotten.
        allocs: u32,
        /// Idempotency keys forgotten.
        keys: u32,
        /// The newest allocation end forgotten (entry time, ms; 0: none).
        through_ms: u64,
    },
    /// The kernel killed a process of an attempt for going over its memory
    /// limit (reported with the attempt's end; the attempt ends
    /// `oom_killed`, and its failure says so).
    OutOfMemory {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// Where it ran.
        node: NodeId,
        /// The attempt (`MUSTER_ATTEMPT`).
        run: u32,
        /// Its memory limit, bytes.
        limit_bytes: u64,
        /// The most it held, bytes.
        peak_bytes: u64,
    },
    /// Admission named a new reason a queued allocation waits
    /// (`Command::NoteWaits`).
    WaitChanged {
        /// The allocation.
        alloc: AllocId,
        /// The reason.
        wait: super::types::Wait,
        /// What holds it.
        holders: Vec<super::types::WaitHolder>,
    },
    /// A waiting allocation's dependencies are met: it is queued.
    DependenciesMet {
        /// The allocation.
        alloc: AllocId,
    },
    /// A job array was created, or a retried submit found it again.
    ArraySubmitted {
        /// The array.
        array: AllocId,
        /// How many elements it has.
        count: u64,
        /// Whether this was a retry of an earlier submit with the same key.
        duplicate: bool,
    },
    /// Elements of an array were cancelled (the materialised ones also
    /// get their own events).
    ArrayCancelled {
        /// The array.
        array: AllocId,
        /// Elements cancelled before they were materialised.
        skipped: u64,
    },
    /// An array's throttle changed.
    ArrayThrottled {
        /// The array.
        array: AllocId,
        /// The new throttle (0: no limit).
        throttle: u32,
        /// Who changed it.
        by: String,
    },
    /// Every element of an array has ended.
    ArrayFinished {
        /// The array.
        array: AllocId,
        /// Elements done.
        done: u64,
        /// Elements failed.
        failed: u64,
        /// Elements cancelled.
        cancelled: u64,
    },
    /// A workflow was submitted (its steps have their own events), or a
    /// retried submit found it again.
    WorkflowSubmitted {
        /// The workflow.
        workflow: AllocId,
        /// How many steps it has.
        steps: u32,
        /// Whether this was a retry of an earlier submit with the same key.
        duplicate: bool,
    },
    /// A task's image could not be pulled on its node: the attempt never
    /// ran and is not charged; the gang is placed again (elsewhere when it
    /// can be) or, at the last allowed pull failure, fails.
    ImagePullFailed {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The node that could not pull it.
        node: NodeId,
        /// What the registry or the cache said.
        reason: String,
        /// The allocation's pull failures so far, this one included.
        failures: u32,
        /// Whether it is placed again (or fails).
        retried: bool,
    },
    /// The image digests a node's cache holds changed.
    NodeImagesChanged {
        /// The node.
        node: NodeId,
        /// How many it holds now.
        count: u32,
    },
}

impl Event {
    /// The allocation the event is about, if it is about exactly one.
    pub fn alloc(&self) -> Option<AllocId> {
        match self {
            Event::TokenCreated { .. }
            | Event::TokenRevoked { .. }
            | Event::VClusterCreated { .. }
            | Event::VClusterUpdated { .. }
            | Event::NodeRegistered { .. }
            | Event::NodeImagesChanged { .. }
            | Event::NodeAdmitted { .. }
            | Event::NodeLabelled { .. }
            | Event::NodeLost { .. }
            | Event::NodeReady { .. }
            | Event::DrainStarted { .. }
            | Event::DrainCancelled { .. }
            | Event::DrainCompleted { .. }
            | Event::DrainTimedOut { .. }
            | Event::NodeStopped { .. }
            | Event::NodeRestarted { .. }
            | Event::NodeTerminated { .. }
            | Event::Forgotten { .. }
            | Event::Compacted { .. }
            | Event::CheckpointSettingsChanged { .. }
            | Event::CheckpointsDeleted { .. } => None,
            Event::Submitted { alloc, .. }
            | Event::GangReserved { alloc, .. }
            | Event::GangRolledBack { alloc, .. }
            | Event::TaskStarted { alloc, .. }
            | Event::TaskFinished { alloc, .. }
            | Event::TaskFailed { alloc, .. }
            | Event::TeardownStarted { alloc, .. }
            | Event::TaskPreempted { alloc, .. }
            | Event::CheckpointSaved { alloc, .. }
            | Event::TeardownCompleted { alloc, .. }
            | Event::PreemptionDecided { alloc, .. }
            | Event::NominationDropped { alloc, .. }
            | Event::WatchdogTripped { alloc, .. }
            | Event::RetriedOnDrainingNode { alloc, .. }
            | Event::GangRequeued { alloc }
            | Event::AllocationDone { alloc }
            | Event::AllocationFailed { alloc, .. }
            | Event::DependenciesMet { alloc }
            | Event::WaitChanged { alloc, .. }
            | Event::AllocationCancelled { alloc, .. }
            | Event::TaskStartFailed { alloc, .. }
            | Event::ImagePullFailed { alloc, .. }
            | Event::CheckpointDropped { alloc, .. }
            | Event::CheckpointUnreachable { alloc, .. }
            | Event::OutOfMemory { alloc, .. } => Some(*alloc),
            Event::ArraySubmitted { array, .. }
            | Event::ArrayCancelled { array, .. }
            | Event::ArrayThrottled { array, .. }
            | Event::ArrayFinished { array, .. } => Some(*array),
            Event::WorkflowSubmitted { workflow, .. } => Some(*workflow),
        }
    }
}

impl Event {
    /// The node the event is about, if it is a node lifecycle event.
    pub fn node(&self) -> Option<&NodeId> {
        match self {
            Event::NodeRegistered { node, .. }
            | Event::NodeLost { node, .. }
            | Event::NodeReady { node }
            | Event::DrainStarted { node, .. }
            | Event::DrainCancelled { node, .. }
            | Event::DrainCompleted { node, .. }
            | Event::DrainTimedOut { node, .. }
            | Event::NodeStopped { node, .. }
            | Event::NodeRestarted { node, .. }
            | Event::NodeTerminated { node, .. } => Some(node),
            _ => None,
        }
    }
}

/// The result of applying one command: accepted with its events, or rejected
/// (and nothing changed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The command took effect.
    Accepted(Vec<Event>),
    /// The command was refused; the state is untouched.
    Rejected(Rejection),
}

impl Outcome {
    /// Whether the command took effect.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Outcome::Accepted(_))
    }

    /// The events, empty when rejected.
    pub fn events(&self) -> &[Event] {
        match self {
            Outcome::Accepted(events) => events,
            Outcome::Rejected(_) => &[],
        }
    }

    /// The rejection, if any.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Outcome::Accepted(_) => None,
            Outcome::Rejected(r) => Some(r),
        }
    }
}
