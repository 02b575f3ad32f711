//! Replaying the committed log: every replica keeps every entry it applied
//! (`muster server --keep-applied-log`), past compaction. Merged by index,
//! the replicas' records must agree (two replicas never applied different
//! entries at one index) and cover the log from entry 1 without a gap.
//! Applied from an empty state, the invariants of the state machine must
//! hold after every entry — no node over-committed, no gang partly reserved
//! or partly running outside a teardown, indexes in step — and the state at
//! the replicas' final applied index must have their digest.

use std::collections::BTreeMap;

use muster_core::sm::{ApplyCtx, Command, State};
use muster_proto::v1;
use muster_raft_store::{AppliedRecord, CommandBatch};

use super::CheckResult;

/// One replica's applied log.
#[derive(Clone, Debug)]
pub struct ReplicaLog {
    /// The replica.
    pub replica: u64,
    /// Its records, in file order.
    pub records: Vec<AppliedRecord<Command>>,
}

/// Merges the replicas' applied logs and replays them against the replicas'
/// final statuses.
pub fn committed_log_replays(logs: &[ReplicaLog], statuses: &[Option<v1::ReplicaStatus>]) -> CheckResult {
    replay_with(logs, statuses, State::check_invariants)
}

fn replay_with(
    logs: &[ReplicaLog],
    statuses: &[Option<v1::ReplicaStatus>],
    invariants: impl Fn(&State) -> Result<(), String>,
) -> CheckResult {
    let mut violations = Vec::new();
    // index → (term, batch, first replica to apply it)
    let mut merged: BTreeMap<u64, (u64, &Option<CommandBatch<Command>>, u64)> = BTreeMap::new();
    for log in logs {
        for r in &log.records {
            match merged.get(&r.index) {
                None => {
                    merged.insert(r.index, (r.term, &r.batch, log.replica));
                }
                Some(&(term, batch, by)) => {
                    if term != r.term || batch != &r.batch {
                        violations.push(format!(
                            "entry {}: replica {by} applied one from term {term}, replica {} another from term {}",
                            r.index, log.replica, r.term
                        ));
                    }
                }
            }
        }
    }
    let Some(&last) = merged.keys().next_back() else {
        violations.push("no replica kept an applied log".to_string());
        return CheckResult::new("committed_log_replays", violations, String::new());
    };
    let gaps: Vec<u64> = (1..=last).filter(|i| !merged.contains_key(i)).collect();
    if let Some(first) = gaps.first() {
        violations.push(format!(
            "{} entries between 1 and {last} were applied by no replica's log (the first is {first}): cannot replay",
            gaps.len()
        ));
        return CheckResult::new("committed_log_replays", violations, String::new());
    }
    // The index the replicas report, and the digest they report there.
    let reported: Vec<(u64, &str)> =
        statuses.iter().flatten().map(|s| (s.applied_index, s.state_digest.as_str())).collect();

    let mut state = State::default();
    let mut commands = 0usize;
    let mut digests_checked = 0usize;
    for (&index, &(_, batch, _)) in &merged {
        if let Some(batch) = batch {
            let ctx = ApplyCtx { time_ms: batch.time_ms };
            for cmd in &batch.commands {
                state.apply(cmd, &ctx);
            }
            commands += batch.commands.len();
            if let Err(broken) = invariants(&state) {
                violations.push(format!("after entry {index} (t={} ms): {broken}", batch.time_ms));
                break;
            }
        }
        let at_index: Vec<&str> = reported.iter().filter(|(i, _)| *i == index).map(|(_, d)| *d).collect();
        if !at_index.is_empty() {
            let digest = muster_scheduler::server::hex(&state.state_digest().0);
            for d in at_index {
                digests_checked += 1;
                if d != digest {
                    violations
                        .push(format!("replaying to entry {index} gives digest {digest}, a replica reports {d} there"));
                }
            }
        }
    }
    if violations.is_empty() && digests_checked < reported.len() {
        violations.push(format!(
            "the replicas report applied indexes {:?} but the applied logs end at {last}",
            reported.iter().map(|(i, _)| *i).collect::<Vec<_>>()
        ));
    }
    let checked = format!(
        "replayed entries 1..={last} ({commands} commands) from {} replicas' logs: invariants held after each, digest matched {digests_checked} replicas",
        logs.len()
    );
    CheckResult::new("committed_log_replays", violations, checked)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_core::sm::{AllocSpec, NodeId, Resources};

    use super::*;

    fn record(index: u64, term: u64, commands: Vec<Command>) -> AppliedRecord<Command> {
        AppliedRecord { index, term, batch: Some(CommandBatch { time_ms: 1_000 * index, commands }) }
    }

    fn register(node: &str) -> Command {
        let resources = Resources { gpus: 4, vram_mb: 16_000, mem_mb: 16_000, cpus: 8 };
        Command::RegisterNode { node: NodeId::new(node), resources, labels: BTreeMap::new() }
    }

    fn submit(gpus: u32) -> Command {
        let task = Resources { gpus, vram_mb: 100, mem_mb: 100, cpus: 1 };
        Command::Submit { spec: AllocSpec::new("u", 1, task, vec!["true".into()]) }
    }

    /// A blank entry, two nodes, a submit.
    fn history() -> Vec<AppliedRecord<Command>> {
        vec![
            AppliedRecord { index: 1, term: 1, batch: None },
            record(2, 1, vec![register("a"), register("b")]),
            record(3, 1, vec![submit(2)]),
        ]
    }

    fn status(applied_index: u64, records: &[AppliedRecord<Command>]) -> Option<v1::ReplicaStatus> {
        let mut state = State::default();
        for r in records.iter().filter(|r| r.index <= applied_index) {
            if let Some(b) = &r.batch {
                for c in &b.commands {
                    state.apply(c, &ApplyCtx { time_ms: b.time_ms });
                }
            }
        }
        let state_digest = muster_scheduler::server::hex(&state.state_digest().0);
        Some(v1::ReplicaStatus { applied_index, state_digest, ..Default::default() })
    }

    #[test]
    fn agreeing_logs_with_repeats_and_partial_copies_replay() {
        let h = history();
        let logs = vec![
            ReplicaLog { replica: 1, records: [h.clone(), h[2..].to_vec()].concat() },
            // A replica that installed a snapshot holds only the tail.
            ReplicaLog { replica: 2, records: h[2..].to_vec() },
        ];
        let r = committed_log_replays(&logs, &[status(3, &h), status(3, &h)]);
        assert!(r.passed, "{}", r.detail);
        assert!(r.detail.contains("1..=3 (3 commands)"), "{}", r.detail);
    }

    #[test]
    fn two_replicas_applying_different_entries_at_one_index_fail() {
        let h = history();
        let mut other = h.clone();
        other[2] = record(3, 2, vec![submit(1)]);
        let logs = vec![ReplicaLog { replica: 1, records: h.clone() }, ReplicaLog { replica: 2, records: other }];
        let r = committed_log_replays(&logs, &[status(3, &h)]);
        assert!(!r.passed);
        assert!(
            r.detail.contains("entry 3: replica 1 applied one from term 1, replica 2 another from term 2"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_gap_in_the_merged_log_fails() {
        let h = history();
        let logs = vec![ReplicaLog { replica: 1, records: vec![h[0].clone(), h[2].clone()] }];
        let r = committed_log_replays(&logs, &[status(3, &h)]);
        assert!(!r.passed);
        assert!(r.detail.contains("the first is 2"), "{}", r.detail);
    }

    #[test]
    fn a_digest_that_differs_from_the_replay_fails() {
        let h = history();
        let logs = vec![ReplicaLog { replica: 1, records: h.clone() }];
        let mut wrong = status(3, &h);
        wrong.as_mut().unwrap().state_digest = "00".into();
        let r = committed_log_replays(&logs, &[status(3, &h), wrong]);
        assert!(!r.passed);
        assert!(r.detail.contains("a replica reports 00"), "{}", r.detail);
        // Replicas that report an index the logs never reach fail too.
        let r = committed_log_replays(
            &logs,
            &[status(3, &h), Some(v1::ReplicaStatus { applied_index: 9, ..Default::default() })],
        );
        assert!(!r.passed);
        assert!(r.detail.contains("end at 3"), "{}", r.detail);
    }

    #[test]
    fn a_broken_invariant_fails_at_the_entry_that_broke_it_and_stops_the_replay() {
        let h = history();
        let logs = vec![ReplicaLog { replica: 1, records: h.clone() }];
        let no_allocations =
            |s: &State| if !s.allocs().is_empty() { Err("an allocation exists".to_string()) } else { Ok(()) };
        let r = replay_with(&logs, &[status(3, &h)], no_allocations);
        assert!(!r.passed);
        assert!(r.detail.contains("after entry 3 (t=3000 ms): an allocation exists"), "{}", r.detail);
        assert!(r.detail.starts_with("1 violation"), "{}", r.detail);
        assert!(committed_log_replays(&[], &[status(2, &h)]).detail.contains("no replica kept an applied log"));
    }
}
