//! Allocations: status, history, and the whole record.

use super::*;

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
    /// The status's name (snake case).
    pub fn as_str(self) -> &'static str {
        match self {
            AllocStatus::Queued => "queued",
            AllocStatus::Suspended => "suspended",
            AllocStatus::Reserved => "reserved",
            AllocStatus::Running => "running",
            AllocStatus::TearingDown => "tearing_down",
            AllocStatus::Done => "done",
            AllocStatus::Failed => "failed",
            AllocStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the name [`AllocStatus::as_str`] gives.
    pub fn parse(s: &str) -> Option<AllocStatus> {
        [
            AllocStatus::Queued,
            AllocStatus::Suspended,
            AllocStatus::Reserved,
            AllocStatus::Running,
            AllocStatus::TearingDown,
            AllocStatus::Done,
            AllocStatus::Failed,
            AllocStatus::Cancelled,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }

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
    /// The allocation's status once the command that recorded this event
    /// was applied (`None` in a node's history), so that a watch replaying
    /// history shows each event beside the status it led to.
    pub status: Option<AllocStatus>,
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
    /// Its place among all allocations in the order they finished (1 for
    /// the first; 0 while live): the job history's sequence number.
    pub finish_seq: u64,
    /// The rendezvous ports it holds on task 0's node (lowest free ones of
    /// the node's range, picked when the gang is placed; released with
    /// task 0's capacity).
    pub ports: Vec<u16>,
    /// The names of its secrets (kept after the values are dropped, when
    /// it finishes).
    pub secret_names: Vec<String>,
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
