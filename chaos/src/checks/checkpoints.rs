//! The large-checkpoint workload (`muster chaos --checkpoint-mb N`): every
//! rank that resumed found the state a rank of its task wrote, byte for
//! byte. A checkpoint restored torn, truncated or from another task fails
//! this check.

use super::{CheckResult, Journal};

/// Checks the ranks' `resumed` and `corrupt` journal lines.
pub fn checkpoints_intact(journal: &Journal, checkpoint_mb: u32) -> CheckResult {
    let checked = if checkpoint_mb == 0 {
        "no large-checkpoint workload".to_string()
    } else {
        format!(
            "{} rank(s) resumed from their own {checkpoint_mb} MiB state, {} found it corrupt",
            journal.resumed,
            journal.corrupt.len()
        )
    };
    let violations = journal.corrupt.iter().map(|c| format!("{c} resumed from a corrupt checkpoint")).collect();
    CheckResult::new("checkpoints_intact", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_that_resumed_from_corrupt_state_fails() {
        let ok = Journal::parse("start 1 0 1 1 n1 10\nresumed 1 0 2 2 n2 20\n");
        let r = checkpoints_intact(&ok, 8);
        assert!(r.passed && r.detail.contains("1 rank(s) resumed"), "{}", r.detail);
        let bad = Journal::parse("start 1 0 2 2 n2 20\ncorrupt 1 0 2 2 n2 21\n");
        let r = checkpoints_intact(&bad, 8);
        assert!(!r.passed && r.detail.contains("task 0 of allocation 1, attempt 2, on n2"), "{}", r.detail);
    }
}
