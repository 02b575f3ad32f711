//! What a replica's services read but never change after it starts (its
//! policy settings), and the one deliberate bug a chaos test may ask it to
//! carry. Each service that needs them holds its own `Arc`; neither is part
//! of [`super::replica::Shared`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_core::policy::{AdmissionConfig, PreemptionConfig};

use super::replica::InjectedBug;

/// The replica's settings that decide answers: preemption and admission
/// knobs (explanations, dry runs and scale-down plans use them), default
/// walltimes by class, the default drain timeout.
#[derive(Clone, Debug)]
pub struct Policies {
    preemption: PreemptionConfig,
    admission: AdmissionConfig,
    walltime_defaults: BTreeMap<u8, u64>,
    drain_timeout: Duration,
}

impl Policies {
    /// The settings, as the replica was started with them.
    pub fn new(
        preemption: PreemptionConfig,
        admission: AdmissionConfig,
        walltime_defaults: BTreeMap<u8, u64>,
        drain_timeout: Duration,
    ) -> Policies {
        Policies { preemption, admission, walltime_defaults, drain_timeout }
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
