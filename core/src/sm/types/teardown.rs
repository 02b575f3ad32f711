//! Teardowns, their causes and outcomes, and held nodes (nominations).

use super::*;

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
