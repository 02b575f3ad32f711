//! Every allocation reached a terminal status in the liveness phase (all
//! faults healed): nothing is stuck.

use muster_proto::v1;

use super::CheckResult;

/// Whether an allocation's status (the API's number) is final: done,
/// failed or cancelled.
pub fn is_terminal(status: i32) -> bool {
    matches!(
        v1::AllocationStatus::try_from(status),
        Ok(v1::AllocationStatus::Done | v1::AllocationStatus::Failed | v1::AllocationStatus::Cancelled)
    )
}

/// Checks the final allocations.
pub fn all_terminal(allocs: &[v1::Allocation]) -> CheckResult {
    let violations: Vec<String> = allocs
        .iter()
        .filter(|a| !is_terminal(a.status))
        .map(|a| {
            let status = v1::AllocationStatus::try_from(a.status).map_or("?", |s| s.as_str_name());
            format!("allocation {} is still {status}", a.id)
        })
        .collect();
    let done = allocs.iter().filter(|a| a.status == v1::AllocationStatus::Done as i32).count();
    let checked = format!("{} allocations terminal ({done} done)", allocs.len());
    CheckResult::new("all_terminal", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_allocation_fails() {
        let a = |id, s: v1::AllocationStatus| v1::Allocation { id, status: s as i32, ..Default::default() };
        assert!(all_terminal(&[a(1, v1::AllocationStatus::Done), a(2, v1::AllocationStatus::Failed)]).passed);
        let r = all_terminal(&[a(1, v1::AllocationStatus::Done), a(2, v1::AllocationStatus::Running)]);
        assert!(!r.passed && r.detail.contains("allocation 2 is still"), "{}", r.detail);
    }
}
