//! GPUs are never double-booked: at no moment do the attempts running on a
//! node (from their `start` line to their last journal line) ask for more
//! GPUs than the node has. A cancel, a teardown or a preemption that freed
//! a task's GPUs while its process still ran would let the next job start on
//! them, and the two attempts' journal lines would overlap on that node.

use std::collections::BTreeMap;

use muster_proto::v1;

use super::CheckResult;
use super::journal::Journal;

/// An attempt: (allocation, task, attempt number).
type Who = (u64, u32, u32);

/// Checks that the attempts on each node never together hold more than
/// `gpus_per_node` GPUs, each asking for its allocation's per-task GPUs.
pub fn gpus_never_overbooked(journal: &Journal, allocs: &[v1::Allocation], gpus_per_node: u32) -> CheckResult {
    let gpus: BTreeMap<u64, u32> =
        allocs.iter().map(|a| (a.id, a.spec.as_ref().and_then(|s| s.resources).map_or(0, |r| r.gpus))).collect();
    // Per node: (time, +gpus at a start / -gpus after a last line, who).
    let mut edges: BTreeMap<&str, Vec<(u64, i64, Who)>> = BTreeMap::new();
    for (&(alloc, task, attempt), a) in &journal.attempts {
        let g = i64::from(gpus.get(&alloc).copied().unwrap_or(0));
        if g == 0 {
            continue;
        }
        let e = edges.entry(a.node.as_str()).or_default();
        e.push((a.start_ms, g, (alloc, task, attempt)));
        // Its GPUs are free only after its last line: an attempt whose
        // last line and a next one's start share a millisecond overlap.
        e.push((a.last_ms + 1, -g, (alloc, task, attempt)));
    }
    let mut violations = Vec::new();
    for (node, mut e) in edges {
        // Frees before takes at the same instant.
        e.sort_by_key(|&(t, d, who)| (t, d, who));
        let mut used = 0i64;
        let mut running: BTreeMap<Who, i64> = BTreeMap::new();
        for (t, d, who) in e {
            used += d;
            if d > 0 {
                running.insert(who, d);
            } else {
                running.remove(&who);
            }
            if used > i64::from(gpus_per_node) {
                let who: Vec<String> =
                    running.iter().map(|((a, t, n), g)| format!("{a}/{t} attempt {n} ({g} GPUs)")).collect();
                violations
                    .push(format!("node {node} at {t}: {used} GPUs in use of {gpus_per_node}: {}", who.join(", ")));
            }
        }
    }
    let checked = format!(
        "{} attempts on {gpus_per_node}-GPU nodes, never more GPUs in use on a node than it has",
        journal.attempts.len()
    );
    CheckResult::new("gpus_never_overbooked", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, gpus: u32) -> v1::Allocation {
        v1::Allocation {
            id,
            spec: Some(v1::AllocationSpec {
                resources: Some(v1::Resources { gpus, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_started_on_gpus_a_stopping_one_still_holds_is_caught() {
        let allocs = [alloc(1, 4), alloc(2, 4), alloc(3, 2)];
        // Allocation 1 ends at 1300; 2 starts on the same node at 1400.
        let good = "start 1 0 1 1 c1 1000\nbeat 1 0 1 1 c1 1250\nend 1 0 1 1 c1 1300\n\
                    start 2 0 1 1 c1 1400\nend 2 0 1 1 c1 1900\nstart 3 0 1 1 c2 1000\nend 3 0 1 1 c2 1500\n";
        let r = gpus_never_overbooked(&Journal::parse(good), &allocs, 4);
        assert!(r.passed, "{}", r.detail);
        // Allocation 1 was cancelled but still ran (in its SIGTERM grace)
        // when 2 started on its GPUs.
        let overbooked = format!("{good}beat 1 0 1 1 c1 1600\n");
        let r = gpus_never_overbooked(&Journal::parse(&overbooked), &allocs, 4);
        assert!(!r.passed && r.detail.contains("node c1 at 1400: 8 GPUs in use of 4"), "{}", r.detail);
    }
}
