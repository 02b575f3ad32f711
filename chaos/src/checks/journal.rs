//! The execution journal against the committed history:
//!
//! - every attempt that ran was granted: its start matches a committed
//!   `task_started` (same task, node and attempt number) — so no deposed
//!   leader, stale epoch or confused agent got an assignment executed;
//! - no attempt started twice (on two nodes, or twice on one);
//! - no task ran on two nodes at once, and no attempt ran on after a later
//!   attempt of its task had started (it was superseded): each attempt's last
//!   journal line comes no later than the next attempt's start;
//! - no two placements of a gang ran at once: every rank of a placement
//!   (reservation epoch) had written its last line before any rank of a
//!   later placement started. A rank left running when its gang was placed
//!   again would talk to the wrong peers, or write their checkpoints.
//!
//! Each task appends `start|beat|end|lost ALLOC TASK ATTEMPT EPOCH NODE MS`
//! lines (beats every 250 ms; `end` also on SIGTERM; `lost` when a rank
//! gave up on its peers).

use std::collections::{BTreeMap, BTreeSet};

use muster_proto::v1;

use super::CheckResult;

/// One attempt, as its lines tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Its epoch (`MUSTER_EPOCH`).
    pub epoch: u64,
    /// Its node.
    pub node: String,
    /// Its first line (`start`), ms.
    pub start_ms: u64,
    /// Its last line, ms.
    pub last_ms: u64,
    /// How many `start` lines it wrote.
    pub starts: u32,
}

/// The journal, by (allocation, task, attempt).
#[derive(Clone, Debug, Default)]
pub struct Journal {
    /// Attempts by (allocation, task, attempt number).
    pub attempts: BTreeMap<(u64, u32, u32), Attempt>,
    /// Lines that did not parse.
    pub bad_lines: Vec<String>,
    /// Ranks that resumed from their own intact state (large-checkpoint
    /// workload).
    pub resumed: usize,
    /// Ranks that resumed from state that was not theirs, or was torn.
    pub corrupt: Vec<String>,
}

impl Journal {
    /// Parses the journal's text.
    pub fn parse(text: &str) -> Journal {
        let mut j = Journal::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let parsed = (f.len() == 7)
                .then(|| {
                    Some((
                        f[0],
                        f[1].parse().ok()?,
                        f[2].parse().ok()?,
                        f[3].parse().ok()?,
                        f[4].parse().ok()?,
                        f[5],
                        f[6].parse().ok()?,
                    ))
                })
                .flatten();
            let Some((what, alloc, task, attempt, epoch, node, ms)) = parsed else {
                j.bad_lines.push(line.to_string());
                continue;
            };
            let a = j.attempts.entry((alloc, task, attempt)).or_insert(Attempt {
                epoch,
                node: node.to_string(),
                start_ms: ms,
                last_ms: ms,
                starts: 0,
            });
            match what {
                "resumed" => j.resumed += 1,
                "corrupt" => j.corrupt.push(format!("task {task} of allocation {alloc}, attempt {attempt}, on {node}")),
                _ => {}
            }
            if what == "start" {
                a.starts += 1;
            } else if a.node != node || a.epoch != epoch {
                a.starts += 1; // the same attempt number running elsewhere: a second start
            }
            a.start_ms = a.start_ms.min(ms);
            a.last_ms = a.last_ms.max(ms);
        }
        j
    }
}

/// `(task, node, attempt)` of a `task_started` event's detail ("task 1
/// started on c2 (attempt 3)").
pub fn parse_started(detail: &str) -> Option<(u32, String, u32)> {
    let rest = detail.strip_prefix("task ")?;
    let (task, rest) = rest.split_once(" started on ")?;
    let (node, rest) = rest.split_once(" (attempt ")?;
    let attempt = rest.strip_suffix(')')?;
    Some((task.parse().ok()?, node.to_string(), attempt.parse().ok()?))
}

/// Checks the journal against each allocation's committed events.
pub fn journal_consistent(journal: &Journal, histories: &BTreeMap<u64, Vec<v1::AllocationEvent>>) -> CheckResult {
    let mut granted: BTreeSet<(u64, u32, String, u32)> = BTreeSet::new();
    for (&alloc, events) in histories {
        for e in events.iter().filter(|e| e.kind == "task_started") {
            if let Some((task, node, attempt)) = parse_started(&e.detail) {
                granted.insert((alloc, task, node, attempt));
            }
        }
    }
    let mut violations = Vec::new();
    for line in &journal.bad_lines {
        violations.push(format!("unparsable journal line {line:?}"));
    }
    let mut by_task: BTreeMap<(u64, u32), Vec<(u32, &Attempt)>> = BTreeMap::new();
    for (&(alloc, task, attempt), a) in &journal.attempts {
        if a.starts != 1 {
            violations.push(format!("allocation {alloc} task {task} attempt {attempt} started {} times", a.starts));
        }
        // Truncated histories (over 256 events) cannot vouch; all others must.
        let known = histories.get(&alloc).is_some_and(|h| h.first().is_some_and(|e| !e.truncated));
        if known && !granted.contains(&(alloc, task, a.node.clone(), attempt)) {
            violations.push(format!(
                "allocation {alloc} task {task} attempt {attempt} ran on {} (epoch {}) without a committed start",
                a.node, a.epoch
            ));
        }
        by_task.entry((alloc, task)).or_default().push((attempt, a));
    }
    for ((alloc, task), mut attempts) in by_task {
        attempts.sort_by_key(|(_, a)| a.start_ms);
        for w in attempts.windows(2) {
            let ((n1, a1), (n2, a2)) = (w[0], w[1]);
            if a1.last_ms > a2.start_ms {
                violations.push(format!(
                    "allocation {alloc} task {task}: attempt {n1} on {} still ran at {} after attempt {n2} started on {} at {}",
                    a1.node, a1.last_ms, a2.node, a2.start_ms
                ));
            }
        }
    }
    violations.extend(placements_overlapping(journal));
    let checked = format!(
        "{} attempts, each granted, started once, none overlapping, no gang's placements overlapping",
        journal.attempts.len()
    );
    CheckResult::new("journal_consistent", violations, checked)
}

/// Each allocation's placements (epochs) in order: a rank of an earlier
/// one that still ran after a rank of a later one started.
fn placements_overlapping(journal: &Journal) -> Vec<String> {
    // (allocation, epoch) → the latest line of any rank (its time, task,
    // node) and the earliest start (its time, task, node).
    type Rank = (u64, u32, String);
    let mut spans: BTreeMap<(u64, u64), (Rank, Rank)> = BTreeMap::new();
    for (&(alloc, task, _), a) in &journal.attempts {
        let last = (a.last_ms, task, a.node.clone());
        let first = (a.start_ms, task, a.node.clone());
        let span = spans.entry((alloc, a.epoch)).or_insert_with(|| (last.clone(), first.clone()));
        if last.0 > span.0.0 {
            span.0 = last;
        }
        if first.0 < span.1.0 {
            span.1 = first;
        }
    }
    let mut violations = Vec::new();
    let mut latest: Option<(u64, u64, Rank)> = None; // (alloc, epoch, latest line so far)
    for (&(alloc, epoch), (last, first)) in &spans {
        match &latest {
            Some((a, e, before)) if *a == alloc && before.0 > first.0 => violations.push(format!(
                "allocation {alloc}: task {} of placement {e} still ran on {} at {} after task {} of placement {epoch} started on {} at {}",
                before.1, before.2, before.0, first.1, first.2, first.0
            )),
            _ => {}
        }
        let keep = latest.as_ref().is_some_and(|(a, _, before)| *a == alloc && before.0 >= last.0);
        if !keep {
            latest = Some((alloc, epoch, last.clone()));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(task: u32, node: &str, attempt: u32) -> v1::AllocationEvent {
        let (kind, detail) =
            muster_scheduler::server::api::convert::describe_event(&muster_core::sm::Event::TaskStarted {
                alloc: 1,
                task,
                node: muster_core::sm::NodeId::new(node),
                attempt,
            });
        v1::AllocationEvent { id: 1, kind: kind.into(), detail, ..Default::default() }
    }

    #[test]
    fn the_event_text_parses() {
        assert_eq!(parse_started(&started(2, "c3", 7).detail), Some((2, "c3".into(), 7)));
    }

    #[test]
    fn ungranted_repeated_and_overlapping_attempts_are_caught() {
        let histories = BTreeMap::from([(1, vec![started(0, "c1", 1), started(0, "c2", 2)])]);
        let good = "start 1 0 1 1 c1 1000\nbeat 1 0 1 1 c1 1250\nend 1 0 1 1 c1 1300\nstart 1 0 2 2 c2 1400\nend 1 0 2 2 c2 1900\n";
        let r = journal_consistent(&Journal::parse(good), &histories);
        assert!(r.passed, "{}", r.detail);
        // Attempt 1 still beating after attempt 2 started.
        let overlap = format!("{good}beat 1 0 1 1 c1 1500\n");
        let r = journal_consistent(&Journal::parse(&overlap), &histories);
        assert!(!r.passed && r.detail.contains("still ran at 1500"), "{}", r.detail);
        // An attempt that was never granted (a deposed leader's assignment).
        let rogue = format!("{good}start 1 0 3 3 c3 2000\n");
        let r = journal_consistent(&Journal::parse(&rogue), &histories);
        assert!(!r.passed && r.detail.contains("without a committed start"), "{}", r.detail);
        // The same attempt started on two nodes.
        let twice = format!("{good}start 1 0 2 2 c3 1500\n");
        let r = journal_consistent(&Journal::parse(&twice), &histories);
        assert!(!r.passed && r.detail.contains("started 2 times"), "{}", r.detail);
    }

    /// A gang's rank left running (task 1 of placement 1, which never
    /// ended) while the gang was placed again: each task's own attempts do
    /// not overlap, but the placements do.
    #[test]
    fn a_rank_running_on_into_the_gangs_next_placement_is_caught() {
        let histories = BTreeMap::from([(
            1,
            vec![started(0, "c1", 1), started(1, "c2", 1), started(0, "c3", 2), started(1, "c4", 2)],
        )]);
        let good = "start 1 0 1 1 c1 1000\nstart 1 1 1 1 c2 1010\nlost 1 1 1 1 c2 3000\nend 1 0 1 1 c1 3500\n\
                    start 1 0 2 2 c3 4000\nstart 1 1 2 2 c4 4010\nend 1 0 2 2 c3 6000\nend 1 1 2 2 c4 6000\n";
        let r = journal_consistent(&Journal::parse(good), &histories);
        assert!(r.passed, "{}", r.detail);
        // Task 0 of the first placement beats on after the second started.
        let spared = good.replace("end 1 0 1 1 c1 3500", "beat 1 0 1 1 c1 4500");
        let r = journal_consistent(&Journal::parse(&spared), &histories);
        assert!(!r.passed, "{}", r.detail);
        assert!(
            r.detail.contains(
                "task 0 of placement 1 still ran on c1 at 4500 after task 0 of placement 2 started on c3 at 4000"
            ),
            "{}",
            r.detail
        );
        // Another allocation's placements are another matter.
        let other = good.replace("start 1 0 2 2 c3 4000", "start 2 0 1 1 c3 2000");
        let r = placements_overlapping(&Journal::parse(&other));
        assert!(r.is_empty(), "{r:?}");
    }
}
