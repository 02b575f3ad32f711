//! Priority preemption: decisions applied, held nodes, victims suspended and resumed.

use super::*;

#[test]
fn a_preemption_stops_the_victims_holds_the_nodes_and_reserves_the_preemptor_at_the_last_release() {
    let mut f = Fixture::new(2);
    let (v1, e1) = f.running_on(1, 8, 2, &[0]);
    let (v2, e2) = f.running_on(1, 8, 2, &[1]);
    let p = f.queued(2, 8, 8);
    let submit_time = f.s.alloc(v1).unwrap().submit_time_ms;
    f.t = 10_000;
    let ev = f.preempt(p, &[(v1, e1), (v2, e2)], &[0, 1]).events().to_vec();
    assert!(
        matches!(&ev[0], Event::PreemptionDecided { alloc, victims, reason: PreemptReason::Priority, .. }
        if *alloc == p && victims == &vec![v1, v2]),
        "{ev:?}"
    );
    assert!(
        matches!(&ev[1], Event::TeardownStarted { alloc, cause: TeardownCause::Preempted { by, .. }, epoch: 1, .. }
        if *alloc == v1 && *by == p),
        "{ev:?}"
    );
    assert_eq!(f.status(v1), AllocStatus::TearingDown);
    assert_eq!(f.attempts(v1), vec![0], "a victim is refunded");
    assert_eq!(f.s.held_for(f.s.node_slot(&n(0)).unwrap()), Some(p));
    assert!(f.s.queue().all(|k| k.alloc != p), "a nominated preemptor waits outside the queue");
    assert!(f.s.free_gpu_index().is_empty(), "held nodes are not offered to admission");

    // A third job cannot take a held node, even once it is free.
    let thief = f.queued(1, 8, 5);
    f.t = 11_000;
    f.ok(Command::SaveCheckpoint { alloc: v1, task: 0, node: n(0), epoch: 1, manifest: manifest(v1, 0, "step-7", 6) });
    let ev = f.ack(v1, 0, 0, 1);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::TeardownCompleted { outcome: TeardownOutcome::Suspended, preempted_count: 1, .. }
        )),
        "{ev:?}"
    );
    assert!(!ev.iter().any(|e| matches!(e, Event::GangReserved { .. })), "one victim still holds a node");
    let r = f.rejected(Command::ReserveGang { alloc: thief, epoch: 1, nodes: vec![n(0)] });
    assert_eq!(r, Rejection::NodeHeld { node: n(0), holder: p });
    assert_eq!(f.status(v1), AllocStatus::Suspended);
    let a = f.s.alloc(v1).unwrap();
    assert_eq!((a.preempted_count, a.submit_time_ms, a.suspended), (1, submit_time, true));
    assert_eq!(a.tasks[0].checkpoints.len(), 1);
    assert!(f.s.queue().any(|k| k.alloc == v1), "a suspended gang is queued again");

    // The last release reserves the preemptor on its held nodes, in the same command.
    f.t = 12_000;
    let ev = f.ack(v2, 0, 1, 1);
    let reserved = ev.iter().find_map(|e| match e {
        Event::GangReserved { alloc, nodes, .. } if *alloc == p => Some(nodes.clone()),
        _ => None,
    });
    assert_eq!(reserved, Some(vec![n(0), n(1)]), "{ev:?}");
    assert_eq!(f.status(p), AllocStatus::Reserved);
    assert!(f.s.alloc(p).unwrap().nomination.is_none());
    assert_eq!(f.s.held_nodes().count(), 0);

    // The suspended victim resumes later: placed, its resume flag clears, its count stays.
    f.ok(Command::CancelAllocation { alloc: p });
    let epoch = f.reserve(v1, &[0]);
    assert_eq!(f.status(v1), AllocStatus::Reserved);
    assert_eq!(f.s.alloc(v1).unwrap().preempted_count, 1);
    assert!(!f.s.alloc(v1).unwrap().suspended);
    f.start(v1, 0, 0, epoch);
}

#[test]
fn apply_refuses_every_victim_the_rules_protect() {
    let mut f = Fixture::new(6);
    let (same, e_same) = f.running_on(1, 8, 8, &[0]);
    let mut sp = spec(1, 8);
    sp.preemption_class = 10;
    sp.sensitive = true;
    let sensitive = f.submit(sp);
    let e_sens = f.reserve(sensitive, &[1]);
    f.start(sensitive, 0, 1, e_sens);
    let mut sp = spec(1, 8);
    sp.preemption_class = 7;
    sp.checkpoint = CheckpointMode::None;
    let none7 = f.submit(sp);
    let e_none7 = f.reserve(none7, &[2]);
    f.start(none7, 0, 2, e_none7);
    let reserved = f.queued(1, 8, 1);
    let e_res = f.reserve(reserved, &[3]);
    let (low, e_low) = f.running_on(1, 4, 1, &[4]);
    let p = f.queued(1, 8, 8);
    let hi = f.queued(1, 8, 9);

    let not = |r: Rejection| matches!(r, Rejection::NotPreemptible { .. });
    let r = f.preempt(p, &[(same, e_same)], &[0]).rejection().cloned().unwrap();
    assert!(not(r.clone()) && r.to_string().contains("class 8 is not below 8"), "{r}");
    let r = f.preempt(hi, &[(sensitive, e_sens)], &[1]).rejection().cloned().unwrap();
    assert!(r.to_string().contains("never preempted"), "{r}");
    let r = f.preempt(hi, &[(none7, e_none7)], &[2]).rejection().cloned().unwrap();
    assert!(r.to_string().contains("checkpoint none at class 7"), "{r}");
    let r = f.preempt(p, &[(reserved, e_res)], &[3]).rejection().cloned().unwrap();
    assert!(r.to_string().contains("not running whole"), "{r}");
    assert!(matches!(
        f.preempt(p, &[(low, e_low + 1)], &[4]).rejection(),
        Some(Rejection::StaleReservationEpoch { .. })
    ));
    // Node 4 keeps 4 GPUs busy without the victim? No: the victim holds 4 of 8;
    // node 0's task is not a victim, so node 0 cannot take 8 GPUs.
    assert!(matches!(f.preempt(p, &[(low, e_low)], &[0]).rejection(), Some(Rejection::InsufficientCapacity { .. })));
    assert!(matches!(f.preempt(p, &[], &[4]).rejection(), Some(Rejection::NotPreemptible { .. })));
    assert!(matches!(f.preempt(p, &[(low, e_low)], &[4, 5]).rejection(), Some(Rejection::WrongNodeCount { .. })));
    assert!(matches!(f.preempt(same, &[(low, e_low)], &[4]).rejection(), Some(Rejection::NotQueued { .. })));
    // A valid one, then the same preemptor again, and a node already held.
    assert!(f.preempt(p, &[(low, e_low)], &[4]).is_accepted());
    assert!(matches!(
        f.preempt(p, &[(low, e_low)], &[4]).rejection(),
        Some(Rejection::NotQueued { .. } | Rejection::AlreadyNominated { .. })
    ));
    let other = f.queued(1, 1, 9);
    assert!(matches!(
        f.preempt(other, &[(none7, e_none7)], &[4]).rejection(),
        Some(Rejection::NodeHeld { .. } | Rejection::NotPreemptible { .. })
    ));
}

#[test]
fn an_unresponsive_victim_is_charged_and_its_gang_requeued_not_suspended() {
    let mut f = Fixture::new(2);
    let (v, e) = f.running_on(2, 8, 1, &[0, 1]);
    let p = f.queued(1, 8, 6);
    assert!(f.preempt(p, &[(v, e)], &[0]).is_accepted());
    f.ack(v, 0, 0, 1);
    let ev = f.ok(Command::ConfirmPreempted { alloc: v, task: 1, node: n(1), epoch: 1, checkpoint_failed: true });
    assert!(ev.iter().any(|e| matches!(e, Event::TaskPreempted { task: 1, checkpoint_failed: true, .. })));
    assert!(ev.iter().any(|e| matches!(e, Event::TeardownCompleted { outcome: TeardownOutcome::Blocked, .. })));
    assert_eq!(f.status(v), AllocStatus::Queued, "requeued, not suspended");
    assert_eq!(f.attempts(v), vec![0, 1], "only the unresponsive task is charged");
    assert_eq!(f.s.alloc(v).unwrap().preempted_count, 0, "charged and requeued, not suspended: not counted");
    assert_eq!(f.status(p), AllocStatus::Reserved);
}

#[test]
fn a_victim_forced_at_the_deadline_is_charged_and_one_out_of_retries_fails() {
    let mut f = Fixture::new(1);
    let mut sp = spec(1, 8);
    sp.preemption_class = 1;
    sp.max_retries = 1;
    let v = f.submit(sp);
    let e = f.reserve(v, &[0]);
    f.start(v, 0, 0, e);
    let p = f.queued(1, 8, 6);
    assert!(f.preempt(p, &[(v, e)], &[0]).is_accepted());
    let ev = f.ok(Command::ForceTeardown { alloc: v, epoch: 1 });
    assert!(ev.iter().any(|e| matches!(e, Event::TaskPreempted { forced: true, checkpoint_failed: true, .. })));
    assert_eq!(f.status(v), AllocStatus::Failed, "1 of 1 retries used");
    assert_eq!(f.status(p), AllocStatus::Reserved);
}

#[test]
fn a_hold_expires_only_at_its_deadline_and_the_preemptor_queues_again() {
    let mut f = Fixture::new(1);
    let (v, e) = f.running_on(1, 8, 1, &[0]);
    let p = f.queued(1, 8, 6);
    f.t = 5_000;
    assert!(f.preempt(p, &[(v, e)], &[0]).is_accepted());
    f.t = 64_999;
    assert_eq!(
        f.rejected(Command::ExpireNomination { alloc: p }),
        Rejection::NominationNotExpired { alloc: p, expires_at_ms: 65_000 }
    );
    f.t = 65_000;
    let ev = f.ok(Command::ExpireNomination { alloc: p });
    assert!(matches!(&ev[0], Event::NominationDropped { .. }));
    assert!(f.s.queue().any(|k| k.alloc == p));
    assert_eq!(f.rejected(Command::ExpireNomination { alloc: p }), Rejection::NotNominated { alloc: p });
    // The victim still stops and suspends; nobody is reserved for it.
    let ev = f.ack(v, 0, 0, 1);
    assert!(!ev.iter().any(|e| matches!(e, Event::GangReserved { .. })));
    assert_eq!(f.status(v), AllocStatus::Suspended);
}

#[test]
fn cancelling_the_preemptor_frees_its_holds_and_cancelling_a_victim_counts_as_its_release() {
    let mut f = Fixture::new(2);
    let (v1, e1) = f.running_on(1, 8, 1, &[0]);
    let (v2, e2) = f.running_on(1, 8, 1, &[1]);
    let p = f.queued(1, 8, 6);
    assert!(f.preempt(p, &[(v1, e1)], &[0]).is_accepted());
    f.ok(Command::CancelAllocation { alloc: p });
    assert_eq!(f.s.held_nodes().count(), 0);
    f.ack(v1, 0, 0, 1);
    assert_eq!(f.status(v1), AllocStatus::Suspended);

    let q = f.queued(1, 8, 6);
    assert!(f.preempt(q, &[(v2, e2)], &[1]).is_accepted());
    let ev = f.ok(Command::CancelAllocation { alloc: v2 });
    assert!(!ev.iter().any(|e| matches!(e, Event::GangReserved { .. })), "the victim still stops: {ev:?}");
    let ev = f.ack(v2, 0, 1, 2);
    assert!(ev.iter().any(|e| matches!(e, Event::GangReserved { alloc, .. } if *alloc == q)), "{ev:?}");
    assert_eq!(f.status(v2), AllocStatus::Cancelled);
}

#[test]
fn a_held_node_lost_before_the_release_drops_the_hold() {
    let mut f = Fixture::new(2);
    let (v, e) = f.running_on(1, 8, 1, &[0]);
    let p = f.queued(1, 8, 6);
    assert!(f.preempt(p, &[(v, e)], &[0]).is_accepted());
    let ev = f.ok(Command::MarkNodeLost { node: n(0) });
    assert!(ev.iter().any(|e| matches!(e, Event::NominationDropped { alloc, .. } if *alloc == p)), "{ev:?}");
    assert!(f.s.queue().any(|k| k.alloc == p));
}

#[test]
fn sensitive_specs_must_be_class_ten() {
    let mut f = Fixture::new(0);
    let mut sp = spec(1, 1);
    sp.sensitive = true;
    sp.preemption_class = 9;
    let r = f.rejected(Command::Submit { spec: sp.clone() });
    assert!(r.to_string().contains("sensitive allocations are class 10"), "{r}");
    sp.preemption_class = 10;
    f.submit(sp);
    let mut sp = spec(1, 1);
    sp.checkpoint_estimate_s = 0;
    assert!(f.rejected(Command::Submit { spec: sp }).to_string().contains("checkpoint_estimate_s"));
}
