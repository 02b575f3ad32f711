//! What a replica's services read but never change after it starts (its
//! policy settings), and the one deliberate bug a chaos test may ask it to
//! carry. Each service that needs them holds its own `Arc`; neither is part
//! of the [`Consensus`](super::raft::Consensus) handle.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_core::policy::{AdmissionConfig, PreemptionConfig};

/// The replica's settings that decide answers: preemption and admission
/// knobs (explanations, dry runs and scale-down plans use them), default
/// walltimes by class, the default drain timeout.
#[derive(Clone, Debug)]
pub struct Policies {
    preemption: PreemptionConfig,
    admission: AdmissionConfig,
    walltime_defaults: BTreeMap<u8, u64>,
    drain_timeout: Duration,
    registry: Option<std::sync::Arc<muster_registry::Registry>>,
}

impl Policies {
    /// The settings, as the replica was started with them.
    pub fn new(
        preemption: PreemptionConfig,
        admission: AdmissionConfig,
        walltime_defaults: BTreeMap<u8, u64>,
        drain_timeout: Duration,
    ) -> Policies {
        Policies { preemption, admission, walltime_defaults, drain_timeout, registry: None }
    }

    /// Resolves submits' image tags through `registry`.
    pub fn with_registry(mut self, registry: Option<std::sync::Arc<muster_registry::Registry>>) -> Policies {
        self.registry = registry;
        self
    }

    /// The registry client that resolves image tags at submit, if any.
    pub fn registry(&self) -> Option<&muster_registry::Registry> {
        self.registry.as_deref()
    }

    /// Priority-preemption knobs.
    pub fn preemption(&self) -> PreemptionConfig {
        self.preemption
    }

    /// Admission knobs.
    pub fn admission(&self) -> AdmissionConfig {
        self.admission
    }

    /// The walltime (seconds) a submit of `class` that gives none gets,
    /// where the operator set one for the class.
    pub fn walltime_default(&self, class: u8) -> Option<u64> {
        self.walltime_defaults.get(&class).copied()
    }

    /// The drain timeout when neither the request nor the node gives one.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
    }
}

/// The deliberate bug this replica carries, if any (`muster server
/// --inject-bug`, for tests of the chaos checks only), and the state the
/// bug needs.
#[derive(Debug, Default)]
pub struct BugInjector {
    bug: Option<InjectedBug>,
    /// Submits acknowledged but not yet proposed (`ack-before-commit`).
    unproposed: AtomicU64,
}

impl BugInjector {
    /// Carries `bug` (none: behaves correctly).
    pub fn new(bug: Option<InjectedBug>) -> BugInjector {
        BugInjector { bug, unproposed: AtomicU64::new(0) }
    }

    /// Whether this replica carries `bug`.
    pub fn has(&self, bug: InjectedBug) -> bool {
        self.bug == Some(bug)
    }

    /// `ack-before-commit`: notes a submit acknowledged ahead of its
    /// proposal, and returns how many were already pending.
    pub fn hold_unproposed(&self) -> u64 {
        self.unproposed.fetch_add(1, Ordering::SeqCst)
    }

    /// `ack-before-commit`: a held submit has been proposed.
    pub fn release_unproposed(&self) {
        self.unproposed.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Deliberate bugs the chaos harness must catch (`muster server --inject-bug`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedBug {
    /// Acknowledge a submit with the id it will get before proposing it, and
    /// propose it a second later: a leader lost in that second loses an
    /// acknowledged allocation.
    AckBeforeCommit,
    /// The log store acknowledges appended entries without fsyncing them: a
    /// power loss of a majority loses acknowledged allocations.
    AckBeforeFsync,
    /// The log store acknowledges appended entries even when their fsync
    /// failed, and keeps writing ("fsyncgate").
    AckDespiteFsyncError,
    /// The leader stamps entries, and compares deadlines, with its raw wall
    /// clock rather than the paced replicated time: a jump of its clock
    /// fires every deadline within the jump at once.
    UnpacedLeaderClock,
    /// A voter removed from the cluster stays on as a learner: the leader
    /// keeps replicating to a machine that was taken away, for ever.
    RemovedVotersLinger,
    /// The log store acknowledges appended entries even when their write
    /// failed (a full disk), leaving the torn record in the log.
    AckDespiteWriteError,
    /// When a gang is torn down because one of its tasks failed, the leader
    /// never tells the gang's other ranks to stop: they run on after the
    /// force deadline while the gang is placed again.
    SpareFailedGangPeers,
    /// A submit whose write has not committed within
    /// [`SLOW_WRITE_REFUSED_AFTER`] is answered ABORTED, a definite refusal,
    /// though the entry stays proposed and may commit: the answer must
    /// have been "did not complete" (the client cannot know).
    RefuseSlowWrites,
}

/// How long a submit waits with the injected bug `refuse-slow-writes`.
pub const SLOW_WRITE_REFUSED_AFTER: Duration = Duration::from_millis(250);

impl InjectedBug {
    /// Parses the flag's value.
    pub fn parse(s: &str) -> Option<InjectedBug> {
        match s {
            "ack-before-commit" => Some(InjectedBug::AckBeforeCommit),
            "ack-before-fsync" => Some(InjectedBug::AckBeforeFsync),
            "ack-despite-fsync-error" => Some(InjectedBug::AckDespiteFsyncError),
            "unpaced-leader-clock" => Some(InjectedBug::UnpacedLeaderClock),
            "removed-voters-linger" => Some(InjectedBug::RemovedVotersLinger),
            "ack-despite-write-error" => Some(InjectedBug::AckDespiteWriteError),
            "spare-failed-gang-peers" => Some(InjectedBug::SpareFailedGangPeers),
            "refuse-slow-writes" => Some(InjectedBug::RefuseSlowWrites),
            _ => None,
        }
    }

    /// Every bug's flag value.
    pub const NAMES: &'static [&'static str] = &[
        "ack-before-commit",
        "ack-before-fsync",
        "ack-despite-fsync-error",
        "ack-despite-write-error",
        "unpaced-leader-clock",
        "removed-voters-linger",
        "spare-failed-gang-peers",
        "refuse-slow-writes",
    ];
}
