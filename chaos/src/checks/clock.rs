//! Replicated time against real time. Every replicated deadline (a forced
//! teardown, a held node's expiry, a drain's timeout, retention, a token's
//! expiry) compares the replicated clock, the time of the entries, with a
//! time that an earlier entry set. A deadline fires early exactly by how
//! much more the replicated clock advanced than real time did between the
//! two entries, and late by how much less.
//!
//! The history pins entries to real time: the entry that created an
//! acknowledged allocation was proposed after the first submit with its
//! key was sent and before the first acknowledgement came back, both on
//! the harness's clock, which no fault moves. Over these entries:
//! - **bounds**: the replicated clock is never ahead of real time by more
//!   than the largest forward skew injected into any replica, nor behind it
//!   by more than the largest backward skew (plus [`SLACK_MS`]);
//! - **pace**: within one leader's term it advances at 0.9–1.1× real time
//!   (plus [`SLACK_MS`]) over any stretch, whatever that leader's clock did:
//!   a deadline of D set and fired in one term fires between D / 1.1 and
//!   D / 0.9 after it was set.

use std::collections::BTreeMap;

use muster_core::sm::Command;
use muster_raft_store::CommandBatch;

use super::CheckResult;
use super::replay::ReplicaLog;
use crate::workload::Op;

/// What the measurements may be off by, ms, beyond the submits' own spans.
pub const SLACK_MS: i64 = 250;

/// The pace the replicated clock keeps within a term, ‰ of real time
/// either way (`muster_clock::SLEW_PER_MILLE`).
const PACE_PER_MILLE: i64 = muster_clock::SLEW_PER_MILLE as i64;

/// One entry pinned to real time.
#[derive(Clone, Copy, Debug)]
struct Pin {
    index: u64,
    term: u64,
    /// The replicated clock once it applied.
    at: i64,
    /// Real time, between these.
    lo: i64,
    hi: i64,
}

/// Checks the replicated clock against real time (see the module's text).
/// `ahead_ms` and `behind_ms` are the largest skews the run injected.
pub fn deadlines_on_time(logs: &[ReplicaLog], ops: &[Op], ahead_ms: u64, behind_ms: u64) -> CheckResult {
    let mut violations = Vec::new();
    // Real time of each key's creating entry: after its first submit was
    // sent, before its first acknowledgement.
    let mut spans: BTreeMap<&str, (u64, Option<u64>)> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind == "submit") {
        let s = spans.entry(o.key.as_str()).or_insert((o.invoke_ms, None));
        s.0 = s.0.min(o.invoke_ms);
        if o.outcome == "ok" {
            s.1 = Some(s.1.map_or(o.complete_ms, |c| c.min(o.complete_ms)));
        }
    }
    let mut merged: BTreeMap<u64, (u64, &CommandBatch<Command>)> = BTreeMap::new();
    for log in logs {
        for r in &log.records {
            if let Some(b) = &r.batch {
                merged.entry(r.index).or_insert((r.term, b));
            }
        }
    }
    let mut pins = Vec::new();
    let mut clock = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for (&index, &(term, batch)) in &merged {
        clock = clock.max(batch.time_ms);
        for cmd in &batch.commands {
            let Command::Submit { spec } = cmd else { continue };
            let Some(key) = spec.idempotency_key.as_deref() else { continue };
            if !seen.insert(key) {
                continue;
            }
            if let Some(&(lo, Some(hi))) = spans.get(key) {
                pins.push(Pin { index, term, at: clock as i64, lo: lo as i64, hi: hi as i64 });
            }
        }
    }
    // Bounds.
    let (ahead, behind) = (ahead_ms as i64 + SLACK_MS, behind_ms as i64 + SLACK_MS);
    for p in &pins {
        if p.at - p.hi > ahead {
            violations.push(format!(
                "entry {} (term {}): the replicated clock ran {} ms ahead of real time; the most injected was {ahead_ms} ms",
                p.index, p.term, p.at - p.hi
            ));
        }
        if p.lo - p.at > behind {
            violations.push(format!(
                "entry {} (term {}): the replicated clock ran {} ms behind real time; the most injected was {behind_ms} ms",
                p.index, p.term, p.lo - p.at
            ));
        }
    }
    // Pace within each term: for pins i before j, the clock advanced at
    // most 1.1× (and at least 0.9×) the real time between them. Scaled by
    // 1000: at_j - at_i <= 1.1 (hi_j - lo_i) + slack, i.e.
    // (1000 at_j - 1100 hi_j) - (1000 at_i - 1100 lo_i) <= 1000 slack.
    // Each term reports its worst stretch each way, and how many entries
    // ended one.
    let (fast, slow) = (1000 + PACE_PER_MILLE, 1000 - PACE_PER_MILLE);
    let mut i = 0;
    while i < pins.len() {
        let term = pins[i].term;
        let mut min_fast: Option<(i64, usize)> = None;
        let mut max_slow: Option<(i64, usize)> = None;
        // (excess, message, entries) each way.
        let mut worst: [(i64, String, usize); 2] = Default::default();
        let mut j = i;
        while j < pins.len() && pins[j].term == term {
            let p = pins[j];
            if let Some((m, k)) = min_fast
                && 1000 * p.at - fast * p.hi - m > 1000 * SLACK_MS
            {
                let q = pins[k];
                let excess = (p.at - q.at) - (p.hi - q.lo);
                worst[0].2 += 1;
                if excess > worst[0].0 {
                    worst[0].0 = excess;
                    worst[0].1 = format!(
                        "term {term}: from entry {} to entry {} the replicated clock advanced {} ms while real time advanced at most {} ms (more than 1.1×)",
                        q.index,
                        p.index,
                        p.at - q.at,
                        p.hi - q.lo
                    );
                }
            }
            if let Some((m, k)) = max_slow
                && m - (1000 * p.at - slow * p.lo) > 1000 * SLACK_MS
            {
                let q = pins[k];
                let excess = (p.lo - q.hi) - (p.at - q.at);
                worst[1].2 += 1;
                if excess > worst[1].0 {
                    worst[1].0 = excess;
                    worst[1].1 = format!(
                        "term {term}: from entry {} to entry {} the replicated clock advanced {} ms while real time advanced at least {} ms (less than 0.9×)",
                        q.index,
                        p.index,
                        p.at - q.at,
                        p.lo - q.hi
                    );
                }
            }
            let f = 1000 * p.at - fast * p.lo;
            if min_fast.is_none_or(|(m, _)| f < m) {
                min_fast = Some((f, j));
            }
            let s = 1000 * p.at - slow * p.hi;
            if max_slow.is_none_or(|(m, _)| s > m) {
                max_slow = Some((s, j));
            }
            j += 1;
        }
        for (_, message, entries) in worst.into_iter().filter(|w| w.2 > 0) {
            violations.push(format!("{message}; {entries} entries of the term ended such a stretch"));
        }
        i = j;
    }
    let terms = pins.iter().map(|p| p.term).collect::<std::collections::BTreeSet<_>>().len();
    if pins.is_empty() {
        violations.push("no acknowledged submit was found in the applied log: nothing pins it to real time".into());
    }
    let most_ahead = pins.iter().map(|p| p.at - p.hi).max().unwrap_or(0).max(0);
    let most_behind = pins.iter().map(|p| p.lo - p.at).max().unwrap_or(0).max(0);
    CheckResult::new(
        "deadlines_on_time",
        violations,
        format!(
            "{} entries pinned to real time over {terms} terms: the replicated clock ran at 0.9–1.1× real time in each term, at most {most_ahead} ms ahead and {most_behind} ms behind it (skews injected: {ahead_ms} ms ahead, {behind_ms} ms behind)",
            pins.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use muster_core::sm::{AllocSpec, Resources};
    use muster_raft_store::AppliedRecord;

    use super::*;

    /// One submit a second for `n` seconds of real time from 1,000,000 ms,
    /// each acknowledged within 20 ms; the entry of second `s` in term
    /// `term(s)` stamped `stamp(s)`.
    fn run(n: u64, term: impl Fn(u64) -> u64, stamp: impl Fn(u64) -> u64) -> (Vec<ReplicaLog>, Vec<Op>) {
        let mut records = Vec::new();
        let mut ops = Vec::new();
        for s in 0..n {
            let key = format!("k{s}");
            let real = 1_000_000 + s * 1000;
            let mut spec = AllocSpec::new("chaos", 1, Resources { gpus: 1, vram_mb: 1, mem_mb: 1, cpus: 1 }, vec![]);
            spec.idempotency_key = Some(key.clone());
            records.push(AppliedRecord {
                index: s + 1,
                term: term(s),
                batch: Some(CommandBatch { time_ms: stamp(s), commands: vec![Command::Submit { spec }] }),
            });
            ops.push(Op {
                key,
                kind: "submit",
                invoke_ms: real - 10,
                complete_ms: real + 10,
                outcome: "ok",
                alloc: Some(s + 1),
                result: None,
                error: None,
            });
        }
        (vec![ReplicaLog { replica: 1, records }], ops)
    }

    fn real(s: u64) -> u64 {
        1_000_000 + s * 1000
    }

    #[test]
    fn a_clock_that_keeps_real_time_passes() {
        let (logs, ops) = run(30, |_| 1, real);
        let r = deadlines_on_time(&logs, &ops, 0, 0);
        assert!(r.passed, "{}", r.detail);
        assert!(r.detail.contains("30 entries pinned"), "{}", r.detail);
    }

    #[test]
    fn a_leader_stamping_a_jump_forward_fails_its_pace() {
        // The bug: a minute's jump of the leader's clock reaches its
        // entries at once (a minute ahead was injected, so only the pace
        // catches it).
        let (logs, ops) = run(30, |_| 1, |s| real(s) + if s >= 10 { 60_000 } else { 0 });
        let r = deadlines_on_time(&logs, &ops, 60_000, 0);
        assert!(!r.passed);
        assert!(r.detail.contains("more than 1.1×") && r.detail.contains("term 1"), "{}", r.detail);
        // Without the skew injected, the bound catches it too.
        let r = deadlines_on_time(&logs, &ops, 0, 0);
        assert!(r.detail.contains("ahead of real time; the most injected was 0 ms"), "{}", r.detail);
    }

    #[test]
    fn a_frozen_clock_fails_its_pace() {
        // A leader whose clock went a minute back, stamping its raw clock:
        // the applied time stands still.
        let (logs, ops) = run(30, |_| 1, |s| if s >= 10 { real(s) - 60_000 } else { real(s) });
        let r = deadlines_on_time(&logs, &ops, 0, 60_000);
        assert!(!r.passed);
        assert!(r.detail.contains("less than 0.9×"), "{}", r.detail);
    }

    #[test]
    fn a_paced_jump_and_a_skewed_successor_pass() {
        // A 10 % catch-up of a jump within term 1, then a successor 5 s ahead
        // from term 2 on, within the 5 s injected.
        let stamp = |s: u64| match s {
            0..10 => real(s),
            10..20 => real(s) + (s - 9) * 100,
            _ => real(s) + 5_000,
        };
        let (logs, ops) = run(30, |s| if s < 20 { 1 } else { 2 }, stamp);
        let r = deadlines_on_time(&logs, &ops, 5_000, 0);
        assert!(r.passed, "{}", r.detail);
        // The same successor with no skew injected: ahead of real time.
        let r = deadlines_on_time(&logs, &ops, 0, 0);
        assert!(!r.passed && r.detail.contains("ran 4990 ms ahead"), "{}", r.detail);
    }

    #[test]
    fn a_log_with_no_acknowledged_submit_cannot_pass() {
        let (logs, _) = run(3, |_| 1, real);
        let r = deadlines_on_time(&logs, &[], 0, 0);
        assert!(!r.passed && r.detail.contains("nothing pins it"), "{}", r.detail);
    }
}
