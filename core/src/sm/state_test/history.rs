//! Attempt logs and job-history records: what a finished allocation leaves
//! behind once the live state forgets it.

use super::*;
use crate::history::JobRecord;

fn only_record(f: &mut Fixture) -> JobRecord {
    let mut records = f.s.take_finished_records();
    assert_eq!(records.len(), 1, "{records:#?}");
    records.remove(0)
}

#[test]
fn a_retried_gang_records_every_attempt_of_every_task() {
    let mut f = Fixture::new(2);
    f.t = 10_000;
    let (id, e1) = f.running(2, 4);
    assert!(f.s.take_finished_records().is_empty(), "nothing finished yet");
    // Task 0 fails after 5 s; task 1 is stopped as a bystander.
    f.t = 15_000;
    f.fail(id, 0, 0, e1);
    f.t = 16_000;
    let stop_epoch = f.s.alloc(id).unwrap().tasks[1].preemption_epoch;
    f.ack(id, 1, 1, stop_epoch);
    assert_eq!(f.status(id), AllocStatus::Queued);
    // The second attempt runs both to completion.
    f.t = 20_000;
    let e2 = f.reserve(id, &[1, 0]);
    f.start(id, 0, 1, e2);
    f.start(id, 1, 0, e2);
    f.t = 30_000;
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(1), epoch: e2 });
    f.t = 32_000;
    f.ok(Command::FinishTask { alloc: id, task: 1, node: n(0), epoch: e2 });
    assert_eq!(f.status(id), AllocStatus::Done);

    let r = only_record(&mut f);
    assert_eq!((r.seq, r.id, r.status, r.reason.as_str()), (1, id, AllocStatus::Done, ""));
    assert_eq!((r.owner.as_str(), r.vcluster.as_str(), r.gang_size), ("alice", "default", 2));
    assert_eq!((r.submit_ms, r.start_ms, r.end_ms), (10_000, Some(10_000), 32_000));
    type Row<'a> = (u32, u32, &'a str, AttemptEnd, Option<i32>, u64, u64);
    let summary: Vec<Row> =
        r.attempts.iter().map(|a| (a.task, a.run, a.node.as_str(), a.end, a.exit_code, a.start_ms, a.end_ms)).collect();
    assert_eq!(
        summary,
        vec![
            (0, 1, "n0", AttemptEnd::Failed, Some(1), 10_000, 15_000),
            (0, 2, "n1", AttemptEnd::Done, Some(0), 20_000, 30_000),
            (1, 1, "n1", AttemptEnd::Stopped, None, 10_000, 16_000),
            (1, 2, "n0", AttemptEnd::Done, Some(0), 20_000, 32_000),
        ]
    );
    // 4 GPUs × (5 + 10 + 6 + 12) s.
    assert_eq!(r.gpu_seconds, 4 * 33);
    assert!(f.s.take_finished_records().is_empty(), "taken once");
}

#[test]
fn preemption_watchdog_node_loss_and_cancel_are_told_apart() {
    let mut f = Fixture::new(4);
    // A victim of a priority preemption.
    let (v, ev) = f.running_on(1, 8, 2, &[0]);
    let p = f.queued(1, 8, 8);
    f.t += 10_000;
    assert!(f.preempt(p, &[(v, ev)], &[0]).is_accepted());
    f.ack(v, 0, 0, 1);
    // A watchdog trip.
    let (w, ew) = f.running_on(1, 8, 0, &[1]);
    f.trip(w, 0, 1, ew, WatchdogKind::Stall);
    // A lost node.
    let (l, _) = f.running_on(1, 8, 0, &[2]);
    f.ok(Command::MarkNodeLost { node: n(2) });
    // A cancel of a running task.
    let (c, _) = f.running_on(1, 8, 0, &[3]);
    f.cancel_and_stop(c);
    let first = |id: AllocId| f.s.alloc(id).unwrap().tasks[0].attempt_log[0].clone();
    let a = first(v);
    assert_eq!((a.end, a.preempted, a.watchdog), (AttemptEnd::Stopped, true, None));
    let a = first(w);
    assert_eq!((a.end, a.watchdog), (AttemptEnd::Failed, Some(WatchdogKind::Stall)));
    assert_eq!(first(l).end, AttemptEnd::Lost);
    assert_eq!(first(c).end, AttemptEnd::Cancelled);
    let r = only_record(&mut f);
    assert_eq!((r.id, r.status, r.reason.as_str()), (c, AllocStatus::Cancelled, "cancelled"));
}

#[test]
fn a_decoded_snapshot_offers_the_records_it_holds_in_finish_order_and_forgotten_ones_are_gone() {
    let mut f = Fixture::new(1);
    let a = f.submit(spec(1, 1));
    let b = f.submit(spec(1, 1));
    let c = f.submit(spec(1, 1));
    f.ok(Command::CancelAllocation { alloc: b });
    f.t += 1_000;
    f.ok(Command::CancelAllocation { alloc: a });
    f.t += 1_000;
    f.ok(Command::CancelAllocation { alloc: c });
    let live: Vec<(u64, AllocId)> = f.s.take_finished_records().iter().map(|r| (r.seq, r.id)).collect();
    assert_eq!(live, vec![(1, b), (2, a), (3, c)]);
    f.t += 60_000;
    f.ok(Command::ForgetFinished { retention_ms: 60_000, key_window_ms: 0, max: 1 });
    let mut restored = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    let again: Vec<(u64, AllocId)> = restored.take_finished_records().iter().map(|r| (r.seq, r.id)).collect();
    assert_eq!(again, vec![(2, a), (3, c)], "b was forgotten; the rest come back with the same numbers");
    assert_eq!(restored.finished_total(), 3);
}

#[test]
fn a_task_retried_more_often_than_the_log_keeps_counts_the_dropped_attempts() {
    let mut f = Fixture::new(1);
    let mut sp = spec(1, 1);
    sp.max_retries = 100;
    let id = f.submit(sp);
    let runs = ATTEMPT_LOG_LIMIT as u32 + 3;
    for _ in 0..runs {
        let e = f.reserve(id, &[0]);
        f.start(id, 0, 0, e);
        f.fail(id, 0, 0, e);
    }
    let t = &f.s.alloc(id).unwrap().tasks[0];
    assert_eq!((t.attempt_log.len(), t.attempts_dropped), (ATTEMPT_LOG_LIMIT, 3));
    assert_eq!(t.attempt_log.first().unwrap().run, 4);
    assert_eq!(t.attempt_log.last().unwrap().run, runs);
}
