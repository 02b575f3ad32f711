//! Retention: finished allocations and idempotency keys leave the live
//! state after their windows, decided from the entry's own time.

use super::*;
use crate::sm::{After, AfterWhen, ArrayIndices, Dependency};

const HOUR: u64 = 3_600_000;

fn forget(retention_ms: u64, key_window_ms: u64) -> Command {
    Command::ForgetFinished { retention_ms, key_window_ms, max: 100 }
}

/// Submits `n` allocations and cancels each, a second apart; their ids.
fn cancelled_a_second_apart(f: &mut Fixture, n: usize) -> Vec<AllocId> {
    (0..n)
        .map(|_| {
            let id = f.submit(spec(1, 1));
            f.ok(Command::CancelAllocation { alloc: id });
            f.t += 1_000;
            id
        })
        .collect()
}

/// Submits an allocation with idempotency key `key` and cancels it; the
/// spec (to retry with) and its id.
fn keyed_and_cancelled(f: &mut Fixture, key: &str) -> (AllocSpec, AllocId) {
    let keyed = AllocSpec { idempotency_key: Some(key.into()), ..spec(1, 1) };
    let id = f.submit(keyed.clone());
    f.ok(Command::CancelAllocation { alloc: id });
    (keyed, id)
}

fn finish(f: &mut Fixture, id: AllocId, epoch: u64, gang: u32) {
    for i in 0..gang {
        f.ok(Command::FinishTask { alloc: id, task: i, node: n(i), epoch });
    }
    assert_eq!(f.status(id), AllocStatus::Done);
}

#[test]
fn a_finished_allocation_is_forgotten_only_after_the_retention_window() {
    let mut f = Fixture::new(2);
    let (done, epoch) = f.running(2, 1);
    let queued = f.submit(spec(1, 1));
    f.t += 1_000;
    finish(&mut f, done, epoch, 2);
    let ended = f.t;
    // Not yet: nothing is due, and a forget says so without changing anything.
    f.t = ended + HOUR - 1;
    assert!(!f.s.forget_due(f.t, HOUR));
    assert_eq!(f.rejected(forget(HOUR, HOUR)), Rejection::NothingToForget);
    f.t = ended + HOUR;
    assert!(f.s.forget_due(f.t, HOUR));
    assert_eq!(f.ok(forget(HOUR, HOUR)), vec![Event::Forgotten { allocs: 1, keys: 0, through_ms: ended }]);
    assert!(f.s.alloc(done).is_none());
    assert!(f.s.was_forgotten(done));
    assert_eq!(f.s.forgotten_allocs(), 1);
    // Live allocations are never forgotten, however old; unknown ids were
    // never forgotten.
    assert!(f.s.alloc(queued).is_some());
    assert!(!f.s.was_forgotten(queued) && !f.s.was_forgotten(99) && !f.s.was_forgotten(0));
    assert!(!f.s.forget_due(f.t + 100 * HOUR, HOUR));
    // Ids are never reused.
    assert!(f.submit(spec(1, 1)) > queued);
}

#[test]
fn forgetting_is_oldest_first_bounded_per_entry_and_the_same_on_every_replica() {
    let mut f = Fixture::new(1);
    let ids = cancelled_a_second_apart(&mut f, 5);
    let replica = f.s.clone();
    f.t += HOUR;
    let cmd = Command::ForgetFinished { retention_ms: HOUR, key_window_ms: 0, max: 2 };
    let events = f.ok(cmd.clone());
    assert!(matches!(events[..], [Event::Forgotten { allocs: 2, keys: 0, .. }]));
    assert!(f.s.alloc(ids[0]).is_none() && f.s.alloc(ids[1]).is_none() && f.s.alloc(ids[2]).is_some());
    // Another replica applying the same entry (same time) reaches the same state.
    let mut other = replica;
    other.apply(&cmd, &ApplyCtx { time_ms: f.t });
    assert_eq!(other.state_digest(), f.s.state_digest());
    assert_eq!(f.s.finished().map(|(_, id)| id).collect::<Vec<_>>(), ids[2..].to_vec());
}

#[test]
fn a_forget_with_bad_parameters_is_refused() {
    let mut f = Fixture::new(0);
    let id = f.submit(spec(1, 1));
    f.ok(Command::CancelAllocation { alloc: id });
    f.t += HOUR;
    for cmd in [
        Command::ForgetFinished { retention_ms: MIN_RETENTION_MS - 1, key_window_ms: 0, max: 10 },
        Command::ForgetFinished { retention_ms: HOUR, key_window_ms: 0, max: 0 },
        Command::ForgetFinished { retention_ms: HOUR, key_window_ms: 0, max: MAX_FORGET_PER_ENTRY + 1 },
    ] {
        assert!(matches!(f.rejected(cmd), Rejection::InvalidForget(_)));
    }
}

#[test]
fn an_idempotency_key_outlives_its_forgotten_allocation_until_its_window_ends() {
    let mut f = Fixture::new(1);
    let submitted = f.t;
    let (keyed, id) = keyed_and_cancelled(&mut f, "req-7");
    f.t += HOUR;
    f.ok(forget(HOUR, 24 * HOUR));
    assert!(f.s.alloc(id).is_none());
    assert_eq!(f.s.forgotten_keys(), 1);
    // A retry of the same submit finds what it made; it is not run again.
    assert_eq!(f.ok(Command::Submit { spec: keyed.clone() }), vec![Event::Submitted { alloc: id, duplicate: true }]);
    assert!(f.s.allocs().is_empty());
    // A different spec under the key is still a conflict.
    let changed = AllocSpec { gang_size: 2, ..keyed.clone() };
    assert_eq!(
        f.rejected(Command::Submit { spec: changed }),
        Rejection::IdempotencyConflict { key: "req-7".into(), alloc: id }
    );
    // The snapshot carries the key (and its index is rebuilt).
    let restored = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(restored, f.s);
    restored.check_invariants().unwrap();
    // Once the window has passed, the key goes; the next submit is new.
    f.t = submitted + 24 * HOUR;
    assert!(f.s.forget_due(f.t, HOUR));
    assert_eq!(f.ok(forget(HOUR, 24 * HOUR)), vec![Event::Forgotten { allocs: 0, keys: 1, through_ms: 0 }]);
    assert_eq!(f.s.forgotten_keys(), 0);
    assert!(f.submit(keyed) > id);
}

#[test]
fn a_key_whose_window_ended_before_its_allocation_is_dropped_with_it() {
    let mut f = Fixture::new(1);
    let (keyed, id) = keyed_and_cancelled(&mut f, "old");
    f.t += 2 * HOUR;
    f.ok(forget(HOUR, HOUR));
    assert_eq!(f.s.forgotten_keys(), 0);
    assert!(f.submit(keyed) > id, "the key's window had ended: a new allocation");
}

#[test]
fn forgotten_allocations_leave_quotas_and_indexes_as_a_rebuild_would() {
    let mut f = Fixture::new(2);
    let (a, ea) = f.running(2, 4);
    finish(&mut f, a, ea, 2);
    let b = f.submit(spec(2, 4));
    f.t += HOUR;
    f.ok(forget(HOUR, 0));
    // The fixture checks the derived indexes against a rebuild after every
    // command; the queued gang still places on the freed nodes.
    let epoch = f.reserve(b, &[0, 1]);
    assert_eq!(epoch, 1);
    assert_eq!(f.s.allocs().len(), 1);
}

/// The allocations (in shared chunks) and each node's history (shared,
/// copied on its next event) are shared by the encoding copy taken under the
/// state's lock (a pointer, not a walk of every allocation and event),
/// later applies leave the copy as it was, and both encode as the
/// `BTreeMap` and bare `VecDeque` they replaced did, so the snapshot format and
/// its digests hold.
#[test]
fn the_encoding_copy_shares_the_allocations_and_is_untouched_by_later_applies() {
    let mut f = Fixture::new(2);
    let (a, epoch) = f.running(1, 1);
    let copy = f.s.encoding_copy();
    let (snap, digest) = (f.s.to_snapshot(), f.s.state_digest());
    assert!(copy.allocs().shares_all(f.s.allocs()), "the copy walked the allocations");
    let shared = std::sync::Arc::ptr_eq(&copy.node(NodeSlot(0)).history, &f.s.node(NodeSlot(0)).history);
    assert!(shared, "the copy walked a node's history");
    f.ok(Command::FinishTask { alloc: a, task: 0, node: n(0), epoch });
    f.submit(spec(1, 1));
    f.ok(Command::DrainNode { node: n(1), timeout_ms: HOUR, reason: String::new(), by: "ops".into() });
    assert_eq!(copy.to_snapshot(), snap);
    assert_eq!(copy.state_digest(), digest);
    assert_ne!(f.s.to_snapshot(), snap);
    assert_eq!(copy.alloc(a).unwrap().status, AllocStatus::Running);
    // The same entries encode to the same bytes as a BTreeMap.
    let ordered: std::collections::BTreeMap<AllocId, Allocation> =
        f.s.allocs().iter().map(|(id, a)| (*id, Allocation::clone(a))).collect();
    let chunked: AllocMap = f.s.allocs().clone();
    assert_eq!(postcard::to_allocvec(&ordered).unwrap(), postcard::to_allocvec(&chunked).unwrap());
    let back: AllocMap = postcard::from_bytes(&postcard::to_allocvec(&ordered).unwrap()).unwrap();
    assert_eq!(back, chunked);
    let history = &f.s.node(NodeSlot(0)).history;
    let deque: std::collections::VecDeque<AllocEvent> = history.iter().cloned().collect();
    assert!(!deque.is_empty());
    assert_eq!(postcard::to_allocvec(&deque).unwrap(), postcard::to_allocvec(history).unwrap());
    // The drain reached the node's history, not the copy's.
    assert!(copy.node(NodeSlot(1)).history.len() < f.s.node(NodeSlot(1)).history.len());
}

fn compact(detail_ms: u64) -> Command {
    Command::CompactFinished { detail_ms, keep_whole: MAX_KEEP_WHOLE, max: 100 }
}

const MINUTE: u64 = 60_000;

/// Submits an allocation that waits for `on` to end well; its id.
fn dependent(f: &mut Fixture, on: AllocId) -> AllocId {
    let after = After { deps: vec![Dependency { on, when: AfterWhen::Ok }], ..After::default() };
    match f.ok(Command::Submit { spec: AllocSpec { after, ..spec(1, 1) } })[0] {
        Event::Submitted { alloc, duplicate: false } => alloc,
        ref other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_finished_allocation_is_compacted_after_the_detail_window_and_keeps_its_outcome() {
    let mut f = Fixture::new(2);
    let (done, epoch) = f.running(2, 1);
    let never_ran = f.submit(spec(1, 1));
    let queued = f.submit(spec(1, 1));
    f.ok(Command::CancelAllocation { alloc: never_ran });
    f.t += 1_000;
    finish(&mut f, done, epoch, 2);
    let ended = f.t;
    f.t = ended + MINUTE - 1;
    assert!(f.s.compact_due(f.t, MINUTE, MAX_KEEP_WHOLE), "the cancel, ended a second earlier, is due");
    assert_eq!(f.ok(compact(MINUTE)), vec![Event::Compacted { allocs: 1, through_ms: ended - 1_000 }]);
    assert!(f.s.alloc(never_ran).is_none() && f.s.alloc(done).is_some());
    assert_eq!(f.rejected(compact(MINUTE)), Rejection::NothingToCompact);
    f.t = ended + MINUTE;
    assert_eq!(f.ok(compact(MINUTE)), vec![Event::Compacted { allocs: 1, through_ms: ended }]);
    assert!(!f.s.compact_due(f.t + 100 * HOUR, MINUTE, 0), "nothing left to compact");
    let c = f.s.compacted(done).expect("compacted").clone();
    assert_eq!((c.status, c.started, c.end_ms), (AllocStatus::Done, true, ended));
    let c = f.s.compacted(never_ran).unwrap();
    assert_eq!((c.status, c.started), (AllocStatus::Cancelled, false));
    // Held, not forgotten: the whole allocation is gone, the outcome stays.
    assert!(f.s.alloc(done).is_none() && f.s.holds(done) && !f.s.was_forgotten(done));
    assert_eq!(f.s.compacted_len(), 2);
    assert!(f.s.alloc(queued).is_some(), "live allocations are never compacted");
    // A cancel is refused as for any finished allocation.
    assert_eq!(
        f.rejected(Command::CancelAllocation { alloc: done }),
        Rejection::AlreadyTerminal { alloc: done, status: AllocStatus::Done }
    );
    // Dependencies named on it later still see how it ended.
    let after_done = dependent(&mut f, done);
    assert_eq!(f.status(after_done), AllocStatus::Queued);
    let after_cancel = dependent(&mut f, never_ran);
    assert_eq!(f.status(after_cancel), AllocStatus::Failed);
    // Snapshots carry it, and a restored replica rebuilds its indexes.
    let restored = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(restored, f.s);
    restored.check_invariants().unwrap();
    assert_eq!(restored.state_digest(), f.s.state_digest());
    // Retention forgets it later, oldest first, into a tombstone.
    f.t = ended + HOUR;
    f.ok(forget(HOUR, 0));
    assert!(!f.s.holds(done) && f.s.was_forgotten(done) && f.s.compacted(done).is_none());
    assert_eq!(f.s.forgotten_allocs(), 2);
    let late = dependent(&mut f, done);
    assert_eq!(f.status(late), AllocStatus::Queued, "the tombstone answers");
}

#[test]
fn a_compaction_is_bounded_per_entry_the_same_on_every_replica_and_refuses_bad_parameters() {
    let mut f = Fixture::new(1);
    let ids = cancelled_a_second_apart(&mut f, 5);
    f.t += MINUTE;
    let replica = f.s.clone();
    let cmd = Command::CompactFinished { detail_ms: MINUTE, keep_whole: MAX_KEEP_WHOLE, max: 2 };
    assert!(matches!(f.ok(cmd.clone())[..], [Event::Compacted { allocs: 2, .. }]));
    assert!(f.s.compacted(ids[0]).is_some() && f.s.compacted(ids[1]).is_some() && f.s.alloc(ids[2]).is_some());
    let mut other = replica;
    other.apply(&cmd, &ApplyCtx { time_ms: f.t });
    assert_eq!(other.state_digest(), f.s.state_digest());
    // Every finished allocation, compacted or not, in the order retention takes them.
    assert_eq!(f.s.finished().map(|(_, id)| id).collect::<Vec<_>>(), ids);
    for cmd in [
        Command::CompactFinished { detail_ms: MIN_RETENTION_MS - 1, keep_whole: 0, max: 10 },
        Command::CompactFinished { detail_ms: MINUTE, keep_whole: MAX_KEEP_WHOLE + 1, max: 10 },
        Command::CompactFinished { detail_ms: MINUTE, keep_whole: 0, max: 0 },
        Command::CompactFinished { detail_ms: MINUTE, keep_whole: 0, max: MAX_FORGET_PER_ENTRY + 1 },
    ] {
        assert!(matches!(f.rejected(cmd), Rejection::InvalidForget(_)));
    }
}

#[test]
fn a_compacted_allocation_keeps_its_idempotency_key_until_it_is_forgotten_and_the_window_ends() {
    let mut f = Fixture::new(1);
    let submitted = f.t;
    let (keyed, id) = keyed_and_cancelled(&mut f, "req-9");
    f.t += MINUTE;
    f.ok(compact(MINUTE));
    assert!(f.s.alloc(id).is_none() && f.s.compacted(id).unwrap().key.is_some());
    // A retry finds what it made; a different spec under the key conflicts.
    assert_eq!(f.ok(Command::Submit { spec: keyed.clone() }), vec![Event::Submitted { alloc: id, duplicate: true }]);
    let changed = AllocSpec { gang_size: 2, ..keyed.clone() };
    assert_eq!(
        f.rejected(Command::Submit { spec: changed.clone() }),
        Rejection::IdempotencyConflict { key: "req-9".into(), alloc: id }
    );
    // Forgotten: the key moves to a tombstone with the same hash.
    f.t += HOUR;
    f.ok(forget(HOUR, 24 * HOUR));
    assert_eq!(f.s.forgotten_keys(), 1);
    assert_eq!(f.ok(Command::Submit { spec: keyed.clone() }), vec![Event::Submitted { alloc: id, duplicate: true }]);
    assert_eq!(
        f.rejected(Command::Submit { spec: changed }),
        Rejection::IdempotencyConflict { key: "req-9".into(), alloc: id }
    );
    f.t = submitted + 24 * HOUR;
    f.ok(forget(HOUR, 24 * HOUR));
    assert!(f.submit(keyed) > id, "the key's window had ended: a new allocation");
}

#[test]
fn an_array_is_forgotten_only_once_its_compacted_elements_are() {
    let mut f = Fixture::new(2);
    let events = f.ok(Command::SubmitArray {
        spec: spec(1, 1),
        indices: ArrayIndices::parse("0-1").unwrap(),
        corr: None,
        secrets: Default::default(),
    });
    let Event::ArraySubmitted { array, .. } = events[0] else { panic!("{events:?}") };
    f.ok(Command::CancelAllocation { alloc: array });
    f.t += MINUTE;
    f.ok(compact(MINUTE));
    assert!(f.s.compacted(array + 1).is_some() && f.s.compacted(array + 2).is_some());
    assert!(f.s.array(array).unwrap().finished_at_ms.is_some());
    assert!(!f.s.was_forgotten(array + 1));
    // The array and its compacted elements go together.
    f.t += HOUR;
    f.ok(forget(HOUR, 0));
    assert!(f.s.array(array).is_none() && !f.s.holds(array + 1) && f.s.was_forgotten(array + 2));
}

#[test]
fn beyond_the_most_held_whole_the_oldest_are_compacted_before_their_window_ends() {
    let mut f = Fixture::new(1);
    let ids = cancelled_a_second_apart(&mut f, 5);
    assert!(!f.s.compact_due(f.t, HOUR, 5) && f.s.compact_due(f.t, HOUR, 4));
    let cmd = |keep_whole| Command::CompactFinished { detail_ms: HOUR, keep_whole, max: 100 };
    assert_eq!(f.rejected(cmd(5)), Rejection::NothingToCompact);
    assert!(matches!(f.ok(cmd(2))[..], [Event::Compacted { allocs: 3, .. }]));
    assert_eq!(f.s.detailed_len(), 2);
    assert!(ids[..3].iter().all(|&id| f.s.compacted(id).is_some()), "the oldest three");
    assert!(ids[3..].iter().all(|&id| f.s.alloc(id).is_some()), "the newest two stay whole");
    // Past the window, the rest go too, whatever the count.
    f.t += HOUR;
    assert!(matches!(f.ok(cmd(2))[..], [Event::Compacted { allocs: 2, .. }]));
    assert_eq!(f.s.detailed_len(), 0);
}

#[test]
fn an_allocation_compacted_after_a_later_id_that_ended_in_the_same_millisecond_is_forgotten_first() {
    let mut f = Fixture::new(1);
    let (first, second, third) = (f.submit(spec(1, 1)), f.submit(spec(1, 1)), f.submit(spec(1, 1)));
    let compact_all = Command::CompactFinished { detail_ms: HOUR, keep_whole: 0, max: 100 };
    // The higher id ends and is compacted first; the lower one ends in the
    // same millisecond and is compacted after it.
    f.ok(Command::CancelAllocation { alloc: second });
    f.ok(compact_all.clone());
    f.ok(Command::CancelAllocation { alloc: first });
    f.ok(compact_all);
    assert!(f.s.compacted(first).is_some() && f.s.compacted(second).is_some());
    f.t += 1_000;
    f.ok(Command::CancelAllocation { alloc: third });
    let ended = f.t;
    // Retention's order is (end, id), whole and compacted together.
    assert_eq!(f.s.finished().collect::<Vec<_>>(), [(ended - 1_000, first), (ended - 1_000, second), (ended, third)]);
    f.t = ended + HOUR;
    let one = Command::ForgetFinished { retention_ms: HOUR, key_window_ms: 0, max: 1 };
    f.ok(one.clone());
    assert!(!f.s.holds(first) && f.s.holds(second) && f.s.holds(third));
    f.ok(one);
    assert!(!f.s.holds(second) && f.s.holds(third));
    f.ok(forget(HOUR, 0));
    assert_eq!(f.s.finished().count(), 0);
}
