//! Linearizability of the client API (Submit, Get, Cancel), checked with a
//! Wing–Gong search with Lowe's memoisation, object by object (an
//! allocation, named by its idempotency key; linearizability is local, so
//! checking each object alone checks the whole history).
//!
//! A history entry has an invocation time, and a completion time and result
//! when it was answered. An operation that timed out (`unknown`) may take
//! effect at any point after its invocation, or never: the search may place
//! it anywhere after its call, or leave it out. An operation that certainly
//! failed never took effect and is not part of the history.
//!
//! The model of one allocation, as a client sees it: absent → live (queued,
//! running, …) → terminal (done, failed, cancelled). The scheduler may end
//! a live allocation at any moment (done or failed): a step the model may
//! take before any operation. Once seen, an allocation never disappears; a
//! terminal status never changes. A successful cancel makes it cancelled, or
//! cancelling while its tasks stop (seen as tearing-down; the scheduler
//! then ends it cancelled at any moment), and a second cancel is refused.

use std::collections::{BTreeMap, HashSet};

use super::CheckResult;
use crate::workload::Op;

/// What a client may observe of one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Obj {
    /// Not submitted (or not yet).
    Absent,
    /// Submitted, not ended.
    Live,
    /// Cancelled while tasks ran: they are stopping (`tearing-down`). As an
    /// observation, a tearing-down allocation, which a live one may be too.
    Cancelling,
    /// Ended this way (`done`, `failed`, `cancelled`).
    Terminal(Ended),
    /// Ended, and then forgotten by the live state after the retention
    /// window (a get answers NOT_FOUND naming the retention).
    Forgotten,
}

/// How an allocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    /// Every task finished.
    Done,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// An operation on one allocation and what it returned (`None`: unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A submit; acknowledged or not.
    Submit,
    /// A get that found it live, found it ended, or did not find it.
    Get(Option<Obj>),
    /// A cancel: `Some(true)` it was cancelled (or is cancelling),
    /// `Some(false)` refused because it had already ended or was already
    /// being cancelled, `None` unknown.
    Cancel(Option<bool>),
}

/// One entry of an object's history.
#[derive(Clone, Debug)]
pub struct Entry {
    /// What.
    pub call: Call,
    /// Sent at.
    pub invoke_ms: u64,
    /// Answered at (`None`: never answered; it may or may not have applied).
    pub complete_ms: Option<u64>,
}

/// The states the object may be in after `call` from `s` (none: the
/// recorded answer is impossible from `s`).
fn step(s: Obj, call: &Call) -> Vec<Obj> {
    // The scheduler may end a live allocation before the call, and forget
    // an ended one.
    let before: Vec<Obj> = match s {
        Obj::Live => vec![Obj::Live, Obj::Terminal(Ended::Done), Obj::Terminal(Ended::Failed), Obj::Forgotten],
        Obj::Cancelling => vec![Obj::Cancelling, Obj::Terminal(Ended::Cancelled), Obj::Forgotten],
        Obj::Terminal(e) => vec![Obj::Terminal(e), Obj::Forgotten],
        other => vec![other],
    };
    let mut out = Vec::new();
    for s in before {
        match call {
            Call::Submit => match s {
                Obj::Absent => out.push(Obj::Live),
                // A retried submit with the same key finds the allocation.
                other => out.push(other),
            },
            Call::Get(None) => out.push(s),
            Call::Get(Some(seen)) => {
                // Tearing-down is what a cancelling allocation looks like,
                // and a live one during a teardown.
                if *seen == s || (*seen == Obj::Cancelling && s == Obj::Live) {
                    out.push(s);
                }
            }
            Call::Cancel(Some(true)) | Call::Cancel(None) if s == Obj::Live => {
                out.push(Obj::Terminal(Ended::Cancelled));
                out.push(Obj::Cancelling);
            }
            Call::Cancel(None) => out.push(s),
            Call::Cancel(Some(false)) => {
                if matches!(s, Obj::Terminal(_) | Obj::Cancelling) {
                    out.push(s);
                }
            }
            Call::Cancel(Some(true)) => {}
        }
    }
    out.sort_by_key(|o| format!("{o:?}"));
    out.dedup();
    out
}

/// Whether `history` (at most 64 entries) has a linearization from `Absent`.
pub fn linearizable(history: &[Entry]) -> bool {
    assert!(history.len() <= 64, "one object's history is at most 64 operations");
    // Answered operations must all be placed; unanswered ones may be left out.
    let must: u64 = history.iter().enumerate().filter(|(_, e)| e.complete_ms.is_some()).fold(0, |m, (i, _)| m | 1 << i);
    let mut seen: HashSet<(u64, Obj)> = HashSet::new();
    let mut stack = vec![(0u64, Obj::Absent)];
    while let Some((done, s)) = stack.pop() {
        if done & must == must {
            return true;
        }
        if !seen.insert((done, s)) {
            continue;
        }
        // The earliest answer among the operations not yet placed: an
        // operation invoked after it cannot come next.
        let horizon = history
            .iter()
            .enumerate()
            .filter(|(i, _)| done & (1 << i) == 0)
            .filter_map(|(_, e)| e.complete_ms)
            .min()
            .unwrap_or(u64::MAX);
        for (i, e) in history.iter().enumerate() {
            if done & (1 << i) != 0 || e.invoke_ms > horizon {
                continue;
            }
            for next in step(s, &e.call) {
                stack.push((done | 1 << i, next));
            }
            if e.complete_ms.is_none() {
                // Never took effect: drop it.
                stack.push((done | 1 << i, s));
            }
        }
    }
    false
}

fn ended(name: &str) -> Option<Obj> {
    Some(match name {
        "done" => Obj::Terminal(Ended::Done),
        "failed" => Obj::Terminal(Ended::Failed),
        "cancelled" => Obj::Terminal(Ended::Cancelled),
        "absent" => Obj::Absent,
        "forgotten" => Obj::Forgotten,
        "tearing_down" | "tearing-down" => Obj::Cancelling,
        _ => Obj::Live,
    })
}

/// Builds each allocation's history from the recorded operations and checks
/// every one.
pub fn client_api_linearizable(ops: &[Op]) -> CheckResult {
    let mut by_key: BTreeMap<&str, Vec<Entry>> = BTreeMap::new();
    for op in ops {
        let complete_ms = (op.outcome == "ok").then_some(op.complete_ms);
        let call = match (op.kind, op.outcome) {
            (_, "failed") => continue,
            ("submit", _) => Call::Submit,
            ("get", "ok") => Call::Get(op.result.as_deref().and_then(ended)),
            ("get", _) => Call::Get(None),
            ("cancel", "ok") if op.result.as_deref() == Some("absent") => Call::Get(Some(Obj::Absent)),
            ("cancel", "ok") if op.result.as_deref() == Some("forgotten") => Call::Get(Some(Obj::Forgotten)),
            ("cancel", "ok") => Call::Cancel(Some(op.result.as_deref() == Some("cancelled"))),
            ("cancel", _) => Call::Cancel(None),
            _ => continue,
        };
        let entries = by_key.entry(op.key.as_str()).or_default();
        if entries.len() < 64 {
            entries.push(Entry { call, invoke_ms: op.invoke_ms, complete_ms });
        }
    }
    let violations: Vec<String> = by_key
        .iter()
        .filter(|(_, h)| !linearizable(h))
        .map(|(key, h)| {
            let ops: Vec<String> = h
                .iter()
                .map(|e| {
                    format!("{:?}@{}..{}", e.call, e.invoke_ms, e.complete_ms.map_or("?".into(), |c| c.to_string()))
                })
                .collect();
            format!("{key}: no linearization of [{}]", ops.join(", "))
        })
        .collect();
    let checked =
        format!("{} allocations' Submit/Get/Cancel histories linearizable ({} operations)", by_key.len(), ops.len());
    CheckResult::new("linearizable", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(call: Call, invoke_ms: u64, complete_ms: Option<u64>) -> Entry {
        Entry { call, invoke_ms, complete_ms }
    }

    const LIVE: Option<Obj> = Some(Obj::Live);
    const ABSENT: Option<Obj> = Some(Obj::Absent);
    const DONE: Option<Obj> = Some(Obj::Terminal(Ended::Done));

    #[test]
    fn sequential_histories() {
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Get(LIVE), 2, Some(3)),
            e(Call::Get(DONE), 4, Some(5))
        ]));
        // A get after an acknowledged submit must find it.
        assert!(!linearizable(&[e(Call::Submit, 0, Some(1)), e(Call::Get(ABSENT), 2, Some(3))]));
        // Ended allocations stay ended.
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Get(DONE), 2, Some(3)),
            e(Call::Get(LIVE), 4, Some(5))
        ]));
        // A successful cancel is seen by later gets.
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(true)), 2, Some(3)),
            e(Call::Get(Some(Obj::Terminal(Ended::Cancelled))), 4, Some(5))
        ]));
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(true)), 2, Some(3)),
            e(Call::Get(DONE), 4, Some(5))
        ]));
        // A cancel refused as already ended needs it to have ended first.
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(false)), 2, Some(3)),
            e(Call::Get(DONE), 4, Some(5))
        ]));
    }

    #[test]
    fn an_ended_allocation_may_be_forgotten_and_stays_forgotten() {
        const FORGOTTEN: Option<Obj> = Some(Obj::Forgotten);
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Get(DONE), 2, Some(3)),
            e(Call::Get(FORGOTTEN), 4, Some(5)),
            e(Call::Get(FORGOTTEN), 6, Some(7))
        ]));
        // Forgotten without having been seen to end: it ended in between.
        assert!(linearizable(&[e(Call::Submit, 0, Some(1)), e(Call::Get(FORGOTTEN), 2, Some(3))]));
        // Never forgotten before it was submitted, and never back again.
        assert!(!linearizable(&[e(Call::Get(FORGOTTEN), 0, Some(1)), e(Call::Submit, 2, Some(3))]));
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Get(FORGOTTEN), 2, Some(3)),
            e(Call::Get(DONE), 4, Some(5))
        ]));
        // Forgetting is not losing: absent after an acknowledged submit is
        // still a violation.
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Get(DONE), 2, Some(3)),
            e(Call::Get(ABSENT), 4, Some(5))
        ]));
    }

    #[test]
    fn concurrent_and_unknown_operations() {
        // A get concurrent with the submit may see it absent or live.
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(10)),
            e(Call::Get(ABSENT), 1, Some(2)),
            e(Call::Get(LIVE), 3, Some(4))
        ]));
        // But not absent after having seen it live.
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(10)),
            e(Call::Get(LIVE), 1, Some(2)),
            e(Call::Get(ABSENT), 3, Some(4))
        ]));
        // A timed-out submit may have taken effect, later or never.
        assert!(linearizable(&[
            e(Call::Submit, 0, None),
            e(Call::Get(ABSENT), 5, Some(6)),
            e(Call::Get(LIVE), 7, Some(8))
        ]));
        assert!(linearizable(&[e(Call::Submit, 0, None), e(Call::Get(ABSENT), 5, Some(6))]));
        // A cancel of a running allocation: tearing down, then cancelled;
        // never live again, never done, and a second cancel is refused.
        let cancelling = Some(Obj::Cancelling);
        let cancelled = Some(Obj::Terminal(Ended::Cancelled));
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(true)), 2, Some(3)),
            e(Call::Get(cancelling), 4, Some(5)),
            e(Call::Cancel(Some(false)), 6, Some(7)),
            e(Call::Get(cancelled), 8, Some(9))
        ]));
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(true)), 2, Some(3)),
            e(Call::Get(LIVE), 4, Some(5))
        ]));
        assert!(!linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(Some(true)), 2, Some(3)),
            e(Call::Get(cancelled), 4, Some(5)),
            e(Call::Get(cancelling), 6, Some(7))
        ]));
        // A timed-out cancel may explain a cancelled allocation.
        assert!(linearizable(&[
            e(Call::Submit, 0, Some(1)),
            e(Call::Cancel(None), 2, None),
            e(Call::Get(Some(Obj::Terminal(Ended::Cancelled))), 5, Some(6))
        ]));
    }

    #[test]
    fn a_buggy_history_from_ops_fails() {
        let op = |kind, outcome, result: Option<&str>, invoke_ms, complete_ms| Op {
            key: "k".into(),
            kind,
            invoke_ms,
            complete_ms,
            outcome,
            alloc: Some(1),
            result: result.map(str::to_string),
            error: None,
        };
        let ok = [op("submit", "ok", None, 0, 1), op("get", "ok", Some("running"), 2, 3)];
        assert!(client_api_linearizable(&ok).passed);
        let lost = [op("submit", "ok", None, 0, 1), op("get", "ok", Some("absent"), 2, 3)];
        let r = client_api_linearizable(&lost);
        assert!(!r.passed && r.detail.contains("k: no linearization"), "{}", r.detail);
    }
}
