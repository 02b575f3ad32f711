//! Every acknowledged submission exists exactly once; a submission whose
//! every attempt timed out (or failed) may exist at most once; one that a
//! replica refused outright, every time it was sent, does not exist; nothing
//! exists that was never submitted.

use std::collections::BTreeMap;

use muster_proto::v1;

use super::CheckResult;
use crate::workload::{Op, is_refusal};

/// Checks the submit history against the final allocations.
pub fn acked_exactly_once(ops: &[Op], allocs: &[v1::Allocation]) -> CheckResult {
    let mut by_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for a in allocs {
        let key = a.spec.as_ref().map_or("", |s| s.idempotency_key.as_str());
        by_key.entry(key).or_default().push(a.id);
    }
    let mut acked: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    // Keys whose every submit so far was refused.
    let mut refused: BTreeMap<&str, bool> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.kind == "submit") {
        let e = acked.entry(op.key.as_str()).or_default();
        if op.outcome == "ok" {
            *e = op.alloc;
        }
        let was_refusal = op.outcome == "failed" && op.error.as_deref().is_some_and(is_refusal);
        *refused.entry(op.key.as_str()).or_insert(true) &= was_refusal;
    }
    let mut violations = Vec::new();
    let (mut ok, mut unknown) = (0, 0);
    for (key, id) in &acked {
        let found = by_key.get(key).map_or(&[][..], Vec::as_slice);
        match id {
            Some(id) => {
                ok += 1;
                if found != [*id] {
                    violations.push(format!("{key} was acknowledged as {id} but exists as {found:?}"));
                }
            }
            None if refused[key] && !found.is_empty() => {
                violations.push(format!("{key} was refused each time it was sent, but exists as {found:?}"));
            }
            None => {
                unknown += 1;
                if found.len() > 1 {
                    violations.push(format!("{key} (never acknowledged) exists {} times: {found:?}", found.len()));
                }
            }
        }
    }
    for (key, ids) in &by_key {
        if !acked.contains_key(key) {
            violations.push(format!("allocation(s) {ids:?} with key {key:?} were never submitted"));
        }
    }
    let checked = format!("{ok} acknowledged submissions exist once; {unknown} unacknowledged exist at most once");
    CheckResult::new("acked_exactly_once", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, outcome: &'static str, alloc: Option<u64>) -> Op {
        Op { key: key.into(), kind: "submit", invoke_ms: 0, complete_ms: 1, outcome, alloc, result: None, error: None }
    }

    fn alloc(id: u64, key: &str) -> v1::Allocation {
        v1::Allocation {
            id,
            spec: Some(v1::AllocationSpec { idempotency_key: key.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn lost_duplicated_and_phantom_allocations_are_caught() {
        let ops = [op("a", "unknown", None), op("a", "ok", Some(1)), op("b", "unknown", None), op("c", "ok", Some(3))];
        assert!(acked_exactly_once(&ops, &[alloc(1, "a"), alloc(3, "c")]).passed);
        assert!(acked_exactly_once(&ops, &[alloc(1, "a"), alloc(2, "b"), alloc(3, "c")]).passed, "unknown may exist");
        let lost = acked_exactly_once(&ops, &[alloc(1, "a")]);
        assert!(!lost.passed && lost.detail.contains("c was acknowledged as 3 but exists as []"), "{}", lost.detail);
        let twice = acked_exactly_once(&ops, &[alloc(1, "a"), alloc(2, "a"), alloc(3, "c")]);
        assert!(!twice.passed);
        let phantom = acked_exactly_once(&ops, &[alloc(1, "a"), alloc(3, "c"), alloc(4, "z")]);
        assert!(!phantom.passed && phantom.detail.contains("never submitted"));
        // A refusal is definite; a call that found no leader may have been
        // sent before the connection broke.
        let refused = Op { error: Some("Aborted: the write was refused".into()), ..op("d", "failed", None) };
        let no_leader = Op { error: Some("no leader answered (transport error)".into()), ..op("e", "failed", None) };
        let ops = [&ops[..], &[refused, no_leader]].concat();
        let fine = acked_exactly_once(&ops, &[alloc(1, "a"), alloc(3, "c"), alloc(5, "e")]);
        assert!(fine.passed, "{}", fine.detail);
        let applied = acked_exactly_once(&ops, &[alloc(1, "a"), alloc(3, "c"), alloc(4, "d")]);
        assert!(!applied.passed && applied.detail.contains("d was refused each time it was sent, but exists as [4]"));
    }
}
