//! Every allocation reached a terminal status in the liveness phase (all
//! faults healed): nothing is stuck.

use muster_proto::v1;

use super::CheckResult;

/// Checks the final allocations.
pub fn all_terminal(allocs: &[v1::Allocation]) -> CheckResult {
    let terminal = |s: i32| {
        matches!(
            v1::AllocationStatus::try_from(s),
            Ok(v1::AllocationStatus::Done | v1::AllocationStatus::Failed | v1::AllocationStatus::Cancelled)
        )
    };
    let violations: Vec<String> = allocs
        .iter()
        .filter(|a| !terminal(a.status))
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
