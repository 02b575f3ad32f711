//! Watchdog trips: retries elsewhere in the class, the cap, trips during a teardown.

use super::*;

#[test]
fn a_watchdog_trip_requeues_first_in_class_avoiding_the_node_and_refunds_the_attempt() {
    let mut f = Fixture::new(2);
    let other = f.submit(spec(1, 8)); // same class, submitted first
    let (id, epoch) = f.running(1, 8);
    let _ = other;
    let ev = f.trip(id, 0, 0, epoch, WatchdogKind::Stall);
    assert!(
        matches!(&ev[0], Event::WatchdogTripped { kind: WatchdogKind::Stall, trips: 1, retried: true, .. }),
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| matches!(e, Event::GangRequeued { .. })), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Queued);
    let t = f.task(id, 0);
    assert_eq!((t.attempts, t.runs, t.watchdog_trips, t.last_watchdog), (0, 1, 1, Some(WatchdogKind::Stall)));
    assert_eq!(f.used_gpus(0), 0, "its node is free in the same command");
    let first = f.s.queue().next().unwrap().alloc;
    assert_eq!(first, id, "a watchdog retry goes before an older submit of its class");
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(
        matches!(&plan.commands[0], Command::ReserveGang { alloc, nodes, .. } if *alloc == id && nodes == &vec![n(1)]),
        "retried on the other node: {:?}",
        plan.commands
    );
    // Placed: the bump and the avoidance are spent.
    f.reserve(id, &[1]);
    let a = f.s.alloc(id).unwrap();
    assert!(!a.retry_first && a.avoid_nodes.is_empty());
}

#[test]
fn with_only_the_tripped_node_left_it_retries_there() {
    let mut f = Fixture::new(1);
    let (id, epoch) = f.running(1, 8);
    f.trip(id, 0, 0, epoch, WatchdogKind::Budget);
    let plan = crate::policy::plan_admission(&f.s, f.t, &Default::default());
    assert!(matches!(&plan.commands[0], Command::ReserveGang { nodes, .. } if nodes == &vec![n(0)]), "{plan:?}");
}

#[test]
fn past_the_watchdog_cap_the_allocation_fails_with_the_reason() {
    let mut f = Fixture::new(1);
    let (id, mut epoch) = f.running(1, 8);
    for trip in 1..=4 {
        let ev = f.trip(id, 0, 0, epoch, WatchdogKind::Stall);
        if trip <= 3 {
            assert_eq!(f.status(id), AllocStatus::Queued, "trip {trip}");
            epoch = f.reserve(id, &[0]);
            f.start(id, 0, 0, epoch);
        } else {
            assert!(matches!(&ev[0], Event::WatchdogTripped { trips: 4, retried: false, .. }), "{ev:?}");
            let reason = ev.iter().find_map(|e| match e {
                Event::AllocationFailed { reason, .. } => Some(reason.clone()),
                _ => None,
            });
            assert_eq!(reason.as_deref(), Some("task 0 tripped the stall watchdog after 3 retries"));
        }
    }
    assert_eq!(f.status(id), AllocStatus::Failed);
    assert_eq!(f.task(id, 0).attempts, 0, "watchdog trips never used the retry budget");
}

#[test]
fn a_trip_in_a_gang_tears_the_siblings_down() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    let ev = f.trip(id, 1, 1, epoch, WatchdogKind::GpuHealth);
    assert!(
        ev.iter().any(|e| matches!(e, Event::TeardownStarted { cause: TeardownCause::TaskFailed { trigger: 1 }, .. })),
        "{ev:?}"
    );
    assert_eq!(f.attempts(id), vec![0, 0, 0], "the tripped task and its siblings are refunded");
    f.ack(id, 0, 0, 1);
    f.ack(id, 2, 2, 1);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!(f.s.alloc(id).unwrap().avoid_nodes, vec![f.s.node_slot(&n(1)).unwrap()]);
    // A stale report is refused; a trip of a preempting task just stops it.
    assert!(matches!(
        f.rejected(Command::TripWatchdog { alloc: id, task: 0, node: n(0), epoch, kind: WatchdogKind::Stall }),
        Rejection::WrongTaskStatus { .. } | Rejection::WrongNode { .. } | Rejection::StaleTaskEpoch { .. }
    ));
}
