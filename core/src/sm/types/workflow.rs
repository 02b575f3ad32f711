//! Workflows: several steps, each an allocation or a job array, submitted
//! together as one log entry (`muster submit --workflow pipeline.toml`),
//! with dependencies between steps by name.
//!
//! ```text
//!   preprocess ──ok──▶ train (4-rank gang) ──ok──▶ evaluate
//! ```
//!
//! A step may depend only on steps listed before it (or on existing
//! allocations), so no cycle can arise; the CLI orders steps for the user
//! and names a cycle when there is one.

use super::*;

/// The most steps one workflow may have.
pub const MAX_WORKFLOW_STEPS: usize = 64;

/// The longest step or workflow name, in bytes.
pub const MAX_STEP_NAME_BYTES: usize = 64;

/// One step: an allocation (or an array of them) and what it waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowStep {
    /// Its name, unique within the workflow (`[A-Za-z0-9._-]`).
    pub name: String,
    /// Its spec. `spec.after` names existing allocations only (and carries
    /// the `any_of` and `keep_if_unsatisfiable` flags for the whole list);
    /// the step's own idempotency key must be empty (the workflow's covers it).
    pub spec: AllocSpec,
    /// Make it a job array of these indices.
    pub array: Option<ArrayIndices>,
    /// Earlier steps it waits for, by position in the workflow.
    pub after_steps: Vec<(u32, AfterWhen)>,
    /// `--after-corr` an earlier array step, by position.
    pub corr_step: Option<u32>,
}

/// What `muster submit --workflow` sends: every step, accepted or refused
/// whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowSpec {
    /// Its name (shown; not unique).
    pub name: String,
    /// Who submitted it (every step's owner).
    pub owner: String,
    /// A retried submit with the same owner and key returns the same
    /// workflow.
    pub idempotency_key: Option<String>,
    /// The steps, each after every step it waits for.
    pub steps: Vec<WorkflowStep>,
}

/// A submitted workflow: its id and its steps' ids. Cancelling it cancels
/// every step not yet finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workflow {
    /// Its id (its steps' ids follow it).
    pub id: AllocId,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Each step's name and id (an allocation, or an array), in order.
    pub steps: Vec<(String, AllocId)>,
    /// Entry time of the submit.
    pub submit_time_ms: u64,
    /// Its idempotency key.
    pub idempotency_key: Option<String>,
    /// SHA-256 of the submitted spec's encoding: a retry must send the same.
    pub spec_sha256: [u8; 32],
}

/// Whether `name` may name a step or a workflow: 1 to
/// [`MAX_STEP_NAME_BYTES`] bytes of letters, digits, `.`, `_` and `-`.
pub fn valid_step_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STEP_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
