//! The checks of a chaos run, one per file. Each is a pure function of what
//! the run recorded (the submit history, the final allocations and their
//! events, the replicas' statuses, the execution journal), so each can be
//! tested on its own with a broken input.

mod acked;
mod agree;
mod checkpoints;
mod clock;
mod durable;
mod entries;
mod journal;
mod linearizable;
mod overbooked;
mod replay;
mod terminal;

pub use acked::acked_exactly_once;
pub use agree::{replicas_agree, replicas_agree_as_members};
pub use checkpoints::checkpoints_intact;
pub use clock::deadlines_on_time;
pub use durable::acked_entries_durable;
pub use entries::log_entries_bounded;
pub use journal::{Journal, journal_consistent};
pub use linearizable::client_api_linearizable;
pub use overbooked::gpus_never_overbooked;
pub use replay::{ReplicaLog, committed_log_replays};
pub use terminal::{all_terminal, is_terminal};

use serde::Serialize;

/// One check's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    /// The check.
    pub name: &'static str,
    /// Whether it held.
    pub passed: bool,
    /// What was checked, or the first violations.
    pub detail: String,
}

impl CheckResult {
    fn new(name: &'static str, violations: Vec<String>, checked: String) -> CheckResult {
        let passed = violations.is_empty();
        let detail = if passed {
            checked
        } else {
            let shown: Vec<&String> = violations.iter().take(10).collect();
            format!(
                "{} violation(s): {}",
                violations.len(),
                shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
            )
        };
        CheckResult { name, passed, detail }
    }
}
