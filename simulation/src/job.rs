//! A job the simulator will submit: when, what, and how long it runs.

use muster_core::sm::{AllocSpec, ArrayIndices, WorkflowSpec};

/// One simulated submission: an allocation, a job array of it, or a
/// workflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Submit time, ms of simulated time.
    pub submit_ms: u64,
    /// What is submitted (unused for a workflow).
    pub spec: AllocSpec,
    /// How long each task runs when nothing fails, ms (each element's,
    /// for an array).
    pub duration_ms: u64,
    /// Submit it as a job array of these indices.
    pub array: Option<ArrayIndices>,
    /// Submit a workflow instead, and how long each step's tasks run, ms.
    pub workflow: Option<(WorkflowSpec, Vec<u64>)>,
}

impl Job {
    /// A plain allocation.
    pub fn plain(submit_ms: u64, spec: AllocSpec, duration_ms: u64) -> Job {
        Job { submit_ms, spec, duration_ms, array: None, workflow: None }
    }
}
