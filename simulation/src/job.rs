//! A job the simulator will submit: when, what, and how long it runs.

use muster_core::sm::AllocSpec;

/// One simulated submission.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Submit time, ms of simulated time.
    pub submit_ms: u64,
    /// What is submitted.
    pub spec: AllocSpec,
    /// How long each task runs when nothing fails, ms.
    pub duration_ms: u64,
}
