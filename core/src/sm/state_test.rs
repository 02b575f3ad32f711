//! One test per transition and per rejection of [`State::apply`].

mod accounting;
mod arrays;
mod borrowing;
mod dependencies;
mod failfast;
mod history;
mod images;
mod lifecycle;
mod placement;
mod ports;
mod preemption;
mod retention;
mod teardown;
mod tokens;
mod trust;
mod vclusters;
mod watchdogs;
mod workflows;

use std::collections::BTreeMap;

use super::*;
use crate::testkit::*;

// ----- register node ------------------------------------------------------

#[test]
fn register_node_adds_a_pending_node_and_re_registration_updates_it() {
    let mut f = Fixture::new(0);
    let ev = f.ok(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels: BTreeMap::new() });
    assert_eq!(ev, vec![Event::NodeRegistered { node: n(0), updated: false }]);
    let slot = f.s.node_slot(&n(0)).unwrap();
    assert_eq!(f.s.node(slot).status, NodeStatus::Pending);
    assert!(f.s.free_gpu_index().is_empty(), "a pending node takes no work");
    assert_eq!(f.ok(Command::MarkNodeReady { node: n(0) }), vec![Event::NodeReady { node: n(0) }]);
    assert_eq!(f.s.node(slot).status, NodeStatus::Ready);
    assert_eq!(f.s.node(slot).registered_at_ms, 1_000);
    let labels = BTreeMap::from([("pool".to_string(), "a100".to_string())]);
    let bigger = Resources { gpus: 16, ..GPU_NODE };
    let ev = f.ok(Command::RegisterNode { node: n(0), resources: bigger, labels: labels.clone() });
    assert_eq!(ev, vec![Event::NodeRegistered { node: n(0), updated: true }]);
    assert_eq!(f.s.nodes().len(), 1);
    assert_eq!(f.s.node(slot).resources.gpus, 16);
    assert_eq!(f.s.node(slot).labels, labels);
}

#[test]
fn register_node_rejects_bad_fields() {
    let mut f = Fixture::new(0);
    let cases = [
        (NodeId::new(""), GPU_NODE, "node_id"),
        (n(1), Resources { cpus: 0, ..GPU_NODE }, "resources.cpus"),
        (n(1), Resources { mem_mb: 0, ..GPU_NODE }, "resources.mem_mb"),
        (n(1), Resources { vram_mb: 0, ..GPU_NODE }, "resources.vram_mb"),
    ];
    for (node, resources, field) in cases {
        match f.rejected(Command::RegisterNode { node, resources, labels: BTreeMap::new() }) {
            Rejection::InvalidNode { field: got, .. } => assert_eq!(got, field),
            other => panic!("expected InvalidNode({field}), got {other:?}"),
        }
    }
}

#[test]
fn re_registration_cannot_shrink_below_what_tasks_hold() {
    let mut f = Fixture::new(1);
    f.running(1, 6);
    let small = Resources { gpus: 4, ..GPU_NODE };
    assert_eq!(
        f.rejected(Command::RegisterNode { node: n(0), resources: small, labels: BTreeMap::new() }),
        Rejection::ShrinkBelowUsage(n(0))
    );
}

// ----- submit -------------------------------------------------------------

#[test]
fn submit_creates_a_queued_gang_of_blocked_tasks() {
    let mut f = Fixture::new(0);
    let id = f.submit(spec(4, 2));
    assert_eq!(id, 1);
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Queued);
    assert_eq!(a.submit_time_ms, 1_000);
    assert_eq!(a.tasks.len(), 4);
    assert!(a.tasks.iter().all(|t| t.status == TaskStatus::Blocked && t.node.is_none() && t.attempts == 0));
    assert_eq!(f.s.queue_len(), 1);
    assert_eq!(f.submit(spec(1, 0)), 2, "ids are assigned in log order");
}

#[test]
fn submit_rejects_each_invalid_field_by_name() {
    let mut f = Fixture::new(0);
    let base = spec(2, 1);
    let cases: Vec<(AllocSpec, &str)> = vec![
        (AllocSpec { owner: String::new(), ..base.clone() }, "owner"),
        (AllocSpec { gang_size: 0, ..base.clone() }, "gang_size"),
        (AllocSpec { gang_size: 5000, ..base.clone() }, "gang_size"),
        (AllocSpec { preemption_class: 11, ..base.clone() }, "preemption_class"),
        (AllocSpec { walltime_s: 0, ..base.clone() }, "walltime_s"),
        (AllocSpec { max_retries: 0, ..base.clone() }, "max_retries"),
        (AllocSpec { command: vec![], ..base.clone() }, "command"),
        (AllocSpec { command: vec![String::new()], ..base.clone() }, "command"),
        (AllocSpec { command: vec!["x".repeat(70_000)], ..base.clone() }, "command"),
        (AllocSpec { env: BTreeMap::from([("A=B".into(), "1".into())]), ..base.clone() }, "env"),
        (AllocSpec { env: BTreeMap::from([("BIG".into(), "v".repeat(70_000))]), ..base.clone() }, "env"),
        (AllocSpec { resources: Resources { cpus: 0, ..res(1) }, ..base.clone() }, "resources.cpus"),
        (AllocSpec { resources: Resources { mem_mb: 0, ..res(1) }, ..base.clone() }, "resources.mem_mb"),
        (AllocSpec { resources: Resources { gpus: 65, ..res(1) }, ..base.clone() }, "resources.gpus"),
        (AllocSpec { resources: Resources { vram_mb: 1, ..res(0) }, ..base.clone() }, "resources.vram_mb"),
        (AllocSpec { idempotency_key: Some(String::new()), ..base.clone() }, "idempotency_key"),
        (AllocSpec { vcluster: "Not OK".into(), ..base.clone() }, "vcluster"),
        (AllocSpec { vcluster: String::new(), ..base.clone() }, "vcluster"),
        (AllocSpec { pids_max: crate::sm::MAX_PIDS_MAX + 1, ..base.clone() }, "pids_max"),
    ];
    for (bad, field) in cases {
        match f.rejected(Command::Submit { spec: bad }) {
            Rejection::InvalidSpec { field: got, .. } => assert_eq!(got, field),
            other => panic!("expected InvalidSpec({field}), got {other:?}"),
        }
    }
    assert_eq!(f.s.allocs().len(), 0, "nothing half-written");
}

#[test]
fn submit_with_the_same_idempotency_key_returns_the_same_allocation() {
    let mut f = Fixture::new(0);
    let keyed = AllocSpec { idempotency_key: Some("req-1".into()), ..spec(2, 1) };
    let id = f.submit(keyed.clone());
    f.t += 5_000;
    assert_eq!(f.ok(Command::Submit { spec: keyed.clone() }), vec![Event::Submitted { alloc: id, duplicate: true }]);
    assert_eq!(f.s.allocs().len(), 1);
    // Another owner may use the same key.
    let other = AllocSpec { owner: "bob".into(), ..keyed.clone() };
    assert_ne!(f.submit(other), id);
    // The same owner and key with a different spec is a conflict.
    let changed = AllocSpec { gang_size: 3, ..keyed };
    assert_eq!(
        f.rejected(Command::Submit { spec: changed }),
        Rejection::IdempotencyConflict { key: "req-1".into(), alloc: id }
    );
}

// ----- reserve gang --------------------------------------------------------

#[test]
fn reserve_places_the_whole_gang_and_holds_its_capacity() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 4));
    let ev = f.ok(Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![n(2), n(0), n(1)] });
    assert_eq!(ev, vec![Event::GangReserved { alloc: id, epoch: 1, nodes: vec![n(2), n(0), n(1)] }]);
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Reserved);
    assert_eq!(a.reservation_epoch, 1);
    assert_eq!(a.first_reserved_at_ms, Some(1_000));
    for t in &a.tasks {
        assert_eq!((t.status, t.reservation_epoch, t.reserved_at_ms), (TaskStatus::Reserved, 1, Some(1_000)));
    }
    assert_eq!(f.s.node(a.tasks[0].node.unwrap()).id, n(2));
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (4, 4, 4));
    assert_eq!(f.s.queue_len(), 0);
}

#[test]
fn reserve_rejections() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(2, 4));
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: 99, epoch: 1, nodes: vec![n(0), n(1)] }),
        Rejection::UnknownAllocation(99)
    );
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 2, nodes: vec![n(0), n(1)] }),
        Rejection::StaleReservationEpoch { alloc: id, expected: 1, got: 2 }
    );
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![n(0)] }),
        Rejection::WrongNodeCount { alloc: id, expected: 2, got: 1 }
    );
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![n(0), n(7)] }),
        Rejection::UnknownNode(n(7))
    );
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![n(1), n(1)] }),
        Rejection::NodeRepeated(n(1))
    );
    f.reserve(id, &[0, 1]);
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 2, nodes: vec![n(1), n(2)] }),
        Rejection::NotQueued { alloc: id, status: AllocStatus::Reserved }
    );
}

#[test]
fn reserved_capacity_is_not_promised_twice() {
    let mut f = Fixture::new(2);
    let first = f.submit(spec(2, 6));
    f.reserve(first, &[0, 1]); // reserved, not started: still holds 6 GPUs on each
    let second = f.submit(spec(1, 4));
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: second, epoch: 1, nodes: vec![n(0)] }),
        Rejection::InsufficientCapacity { node: n(0), alloc: second, task: 0 }
    );
    let fits = f.submit(spec(1, 2));
    f.reserve(fits, &[0]);
    assert_eq!(f.used_gpus(0), 8);
}

#[test]
fn reserve_respects_vram_per_gpu() {
    let mut f = Fixture::new(1);
    let big = AllocSpec { resources: Resources { vram_mb: 90_000, ..res(1) }, ..spec(1, 1) };
    let id = f.submit(big);
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![n(0)] }),
        Rejection::InsufficientCapacity { node: n(0), alloc: id, task: 0 }
    );
}

// ----- rollback -------------------------------------------------------------

#[test]
fn rollback_returns_an_unclaimed_gang_to_the_queue() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(2, 8));
    let epoch = f.reserve(id, &[0, 1]);
    let ev = f.ok(Command::RollbackGang { alloc: id, epoch });
    assert_eq!(ev, vec![Event::GangRolledBack { alloc: id, epoch }, Event::GangRequeued { alloc: id }]);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert!(f.s.alloc(id).unwrap().tasks.iter().all(|t| t.status == TaskStatus::Blocked && t.node.is_none()));
    assert_eq!((f.used_gpus(0), f.used_gpus(1)), (0, 0));
    // The epoch is not reused: the next reservation is epoch 2.
    assert_eq!(f.reserve(id, &[1, 0]), 2);
}

#[test]
fn rollback_rejections() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(2, 8));
    assert_eq!(f.rejected(Command::RollbackGang { alloc: id, epoch: 0 }), Rejection::NothingReserved { alloc: id });
    let epoch = f.reserve(id, &[0, 1]);
    assert_eq!(
        f.rejected(Command::RollbackGang { alloc: id, epoch: epoch + 1 }),
        Rejection::StaleReservationEpoch { alloc: id, expected: epoch, got: epoch + 1 }
    );
    f.ok(Command::RollbackGang { alloc: id, epoch });
    assert_eq!(f.rejected(Command::RollbackGang { alloc: id, epoch }), Rejection::NothingReserved { alloc: id });
}

#[test]
fn rollback_after_a_task_finished_fails_the_gang() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(2, 8));
    let epoch = f.reserve(id, &[0, 1]);
    f.start(id, 0, 0, epoch);
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch });
    let ev = f.ok(Command::RollbackGang { alloc: id, epoch });
    assert!(matches!(ev[1], Event::AllocationFailed { .. }), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Failed);
    assert_eq!(f.task(id, 0).status, TaskStatus::Done, "the finished task keeps its result");
    assert_eq!(f.task(id, 1).status, TaskStatus::Failed);
}

// ----- start ------------------------------------------------------------------

#[test]
fn start_claims_a_reserved_task_and_counts_the_attempt() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(2, 1));
    let epoch = f.reserve(id, &[0, 1]);
    f.t = 2_000;
    let ev = f.ok(Command::StartTask { alloc: id, task: 1, node: n(1), epoch });
    assert_eq!(ev, vec![Event::TaskStarted { alloc: id, task: 1, node: n(1), attempt: 1 }]);
    assert_eq!(f.task(id, 1).status, TaskStatus::Running);
    assert_eq!(f.task(id, 1).started_at_ms, Some(2_000));
    assert_eq!(f.status(id), AllocStatus::Reserved, "one task still unclaimed");
    f.start(id, 0, 0, epoch);
    assert_eq!(f.status(id), AllocStatus::Running);
}

#[test]
fn start_refuses_the_wrong_node_a_stale_epoch_and_a_blocked_task() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(1, 1));
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 0, node: n(0), epoch: 0 }),
        Rejection::WrongTaskStatus { alloc: id, task: 0, status: TaskStatus::Blocked, expected: TaskStatus::Reserved }
    );
    let old = f.reserve(id, &[0]);
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 0, node: n(1), epoch: old }),
        Rejection::WrongNode { alloc: id, task: 0, node: n(1) }
    );
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 3, node: n(0), epoch: old }),
        Rejection::UnknownTask { alloc: id, task: 3 }
    );
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 0, node: n(9), epoch: old }),
        Rejection::UnknownNode(n(9))
    );
    // Roll back and re-place on the same node: the old epoch no longer claims.
    f.ok(Command::RollbackGang { alloc: id, epoch: old });
    let new = f.reserve(id, &[0]);
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 0, node: n(0), epoch: old }),
        Rejection::StaleTaskEpoch { alloc: id, task: 0, current: new, got: old }
    );
    f.start(id, 0, 0, new);
    assert_eq!(
        f.rejected(Command::StartTask { alloc: id, task: 0, node: n(0), epoch: new }),
        Rejection::WrongTaskStatus { alloc: id, task: 0, status: TaskStatus::Running, expected: TaskStatus::Reserved }
    );
}

// ----- finish -------------------------------------------------------------------

#[test]
fn finishing_every_task_completes_the_allocation_and_frees_its_nodes() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.t = 9_000;
    assert_eq!(
        f.ok(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch }),
        vec![Event::TaskFinished { alloc: id, task: 0 }]
    );
    assert_eq!(f.status(id), AllocStatus::Running);
    assert_eq!(f.used_gpus(0), 0);
    assert_eq!(
        f.ok(Command::FinishTask { alloc: id, task: 1, node: n(1), epoch }),
        vec![Event::TaskFinished { alloc: id, task: 1 }, Event::AllocationDone { alloc: id }]
    );
    assert_eq!(f.status(id), AllocStatus::Done);
    assert_eq!(f.s.alloc(id).unwrap().finished_at_ms, Some(9_000));
    assert_eq!(
        f.rejected(Command::FinishTask { alloc: id, task: 1, node: n(1), epoch }),
        Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Done }
    );
}

/// What [`State::held_gpus`] must equal: every live allocation's placed
/// tasks, walked one by one.
fn held_gpus_by_walking(s: &State) -> (u64, u64) {
    let (mut reserved, mut running) = (0, 0);
    for a in s.allocs().values().filter(|a| !a.status.is_terminal()) {
        for t in a.tasks.iter().filter(|t| t.node.is_some()) {
            match t.status {
                TaskStatus::Running | TaskStatus::Preempting => running += u64::from(a.spec.resources.gpus),
                TaskStatus::Reserved => reserved += u64::from(a.spec.resources.gpus),
                _ => {}
            }
        }
    }
    (reserved, running)
}

#[test]
fn held_gpus_counts_reserved_running_and_stopping_tasks_and_ignores_the_queue() {
    let mut f = Fixture::new(5);
    let check = |f: &Fixture, want: (u64, u64)| {
        assert_eq!(f.s.held_gpus(), want);
        assert_eq!(held_gpus_by_walking(&f.s), want);
    };
    check(&f, (0, 0));
    for _ in 0..50 {
        f.submit(spec(4, 8)); // never fits beside the rest: stays queued
    }
    check(&f, (0, 0));
    let (running, epoch) = f.running(2, 4); // n0, n1
    check(&f, (0, 8));
    let reserved = f.submit(spec(2, 2));
    let r_epoch = f.reserve(reserved, &[2, 3]);
    check(&f, (4, 8));
    f.start(reserved, 0, 2, r_epoch);
    check(&f, (2, 10));
    // A cancelled running task holds its GPUs while it stops; its
    // unstarted sibling lets go at once.
    f.ok(Command::CancelAllocation { alloc: reserved });
    check(&f, (0, 10));
    f.ack(reserved, 0, 2, f.s.alloc(reserved).unwrap().tasks[0].preemption_epoch);
    check(&f, (0, 8));
    f.ok(Command::FinishTask { alloc: running, task: 0, node: n(0), epoch });
    check(&f, (0, 4));
    f.ok(Command::FinishTask { alloc: running, task: 1, node: n(1), epoch });
    check(&f, (0, 0));
}

#[test]
fn queued_by_class_counts_the_queue_as_it_changes() {
    let mut f = Fixture::new(2);
    let by_walking = |f: &Fixture| {
        let mut m = BTreeMap::new();
        for k in f.s.queue() {
            *m.entry(k.class.0).or_insert(0u32) += 1;
        }
        m
    };
    let a = f.queued(1, 8, 0);
    let b = f.queued(1, 8, 3);
    f.queued(1, 8, 3);
    assert_eq!(f.s.queued_by_class(), &BTreeMap::from([(0, 1), (3, 2)]));
    f.reserve(a, &[0]);
    f.ok(Command::CancelAllocation { alloc: b });
    assert_eq!(f.s.queued_by_class(), &BTreeMap::from([(3, 1)]));
    assert_eq!(f.s.queued_by_class(), &by_walking(&f));
}

#[test]
fn finish_refuses_a_task_that_is_not_running() {
    let mut f = Fixture::new(1);
    let id = f.submit(spec(1, 1));
    let epoch = f.reserve(id, &[0]);
    assert_eq!(
        f.rejected(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch }),
        Rejection::WrongTaskStatus { alloc: id, task: 0, status: TaskStatus::Reserved, expected: TaskStatus::Running }
    );
}

// ----- fail ---------------------------------------------------------------------

#[test]
fn a_failed_single_task_is_requeued_until_its_retries_are_spent() {
    let mut f = Fixture::new(1);
    let id = f.submit(AllocSpec { max_retries: 2, ..spec(1, 1) });
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    let ev = f.fail(id, 0, 0, epoch);
    assert_eq!(
        ev,
        vec![
            Event::TaskFailed { alloc: id, task: 0, exit_code: Some(1), charged: true },
            Event::GangRequeued { alloc: id }
        ]
    );
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!(f.used_gpus(0), 0);
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    assert_eq!(f.task(id, 0).attempts, 2);
    let ev = f.fail(id, 0, 0, epoch);
    assert!(matches!(&ev[1], Event::AllocationFailed { reason, .. } if reason.contains("failed 2 times")), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Failed);
    assert_eq!(f.task(id, 0).status, TaskStatus::Failed);
}

#[test]
fn a_gang_failure_releases_unclaimed_siblings_at_once() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 8));
    let epoch = f.reserve(id, &[0, 1, 2]);
    f.start(id, 0, 0, epoch);
    f.fail(id, 0, 0, epoch);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (0, 0, 0));
}

#[test]
fn a_gang_with_a_finished_task_fails_instead_of_rerunning_it() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch });
    let ev = f.fail(id, 1, 1, epoch);
    assert!(matches!(&ev[1], Event::AllocationFailed { reason, .. } if reason.contains("task 0 finished")), "{ev:?}");
    assert_eq!(f.task(id, 0).status, TaskStatus::Done);
    assert_eq!(f.task(id, 1).status, TaskStatus::Failed);
}

#[test]
fn fail_refuses_reports_from_another_node_or_an_old_epoch() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(1, 8);
    assert_eq!(
        f.rejected(Command::FailTask { alloc: id, task: 0, node: n(1), epoch, exit_code: None }),
        Rejection::WrongNode { alloc: id, task: 0, node: n(1) }
    );
    assert_eq!(
        f.rejected(Command::FailTask { alloc: id, task: 0, node: n(0), epoch: epoch + 1, exit_code: None }),
        Rejection::StaleTaskEpoch { alloc: id, task: 0, current: epoch, got: epoch + 1 }
    );
}

// ----- cancel -------------------------------------------------------------------

#[test]
fn cancel_holds_a_running_task_capacity_until_its_agent_confirms_the_stop() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 8));
    let epoch = f.reserve(id, &[0, 1, 2]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    f.ok(Command::FinishTask { alloc: id, task: 1, node: n(1), epoch });
    let ev = f.ok(Command::CancelAllocation { alloc: id });
    assert_eq!(
        ev,
        vec![Event::TeardownStarted {
            alloc: id,
            cause: TeardownCause::Cancelled { preempted_by: None },
            epoch: 1,
            preempting: vec![(0, n(0))],
            released: 1,
        }]
    );
    // The unclaimed reservation is free at once; the running task's GPUs are
    // not: its process may still be in its SIGTERM grace.
    assert_eq!(f.status(id), AllocStatus::TearingDown);
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (8, 0, 0));
    let other = f.submit(spec(1, 8));
    let plan = crate::policy::plan_admission(&f.s, f.t, &crate::policy::AdmissionConfig::default());
    assert!(
        plan.commands.iter().all(|c| !matches!(c, Command::ReserveGang { nodes, .. } if nodes.contains(&n(0)))),
        "node-0 is still held by the cancelled task: {:?}",
        plan.commands
    );
    assert!(f.s.alloc(other).is_some());
    assert_eq!(f.rejected(Command::CancelAllocation { alloc: id }), Rejection::AlreadyCancelling { alloc: id });
    assert_eq!(f.s.precheck(&Command::CancelAllocation { alloc: id }), Err(Rejection::AlreadyCancelling { alloc: id }));

    let ev = f.ack(id, 0, 0, 1);
    assert_eq!(ev.last(), Some(&Event::AllocationCancelled { alloc: id, stopped: vec![(0, n(0))] }), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Cancelled);
    assert_eq!(f.statuses(id), vec![TaskStatus::Cancelled, TaskStatus::Done, TaskStatus::Cancelled]);
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (0, 0, 0));
    assert_eq!(f.attempts(id), vec![0, 1, 0], "a cancel charges nothing");
    assert_eq!(
        f.rejected(Command::CancelAllocation { alloc: id }),
        Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Cancelled }
    );
    assert_eq!(f.rejected(Command::CancelAllocation { alloc: 42 }), Rejection::UnknownAllocation(42));
}

#[test]
fn a_cancelled_task_that_never_acks_is_forced_at_the_teardown_deadline() {
    let mut f = Fixture::new(2);
    let (id, _) = f.running(2, 8);
    f.ok(Command::CancelAllocation { alloc: id });
    let cfg = crate::policy::PreemptionConfig::default();
    let force = crate::policy::DEFAULT_FORCE_AFTER_MS;
    assert!(crate::policy::plan_forced_teardowns(&f.s, f.t + force - 1, force, &cfg).is_empty());
    let cmds = crate::policy::plan_forced_teardowns(&f.s, f.t + force, force, &cfg);
    assert_eq!(cmds, vec![Command::ForceTeardown { alloc: id, epoch: 1 }]);
    f.t += force;
    let ev = f.ok(cmds[0].clone());
    assert!(matches!(ev.last(), Some(Event::AllocationCancelled { stopped, .. }) if stopped.len() == 2), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Cancelled);
    assert_eq!(f.attempts(id), vec![0, 0], "a forced cancel charges nothing");
    assert_eq!((f.used_gpus(0), f.used_gpus(1)), (0, 0));
}

#[test]
fn a_task_that_fails_or_finishes_while_cancelled_still_ends_cancelled_uncharged() {
    let mut f = Fixture::new(3);
    let (id, _) = f.running(3, 8);
    f.ok(Command::CancelAllocation { alloc: id });
    f.ok(Command::FailTask { alloc: id, task: 0, node: n(0), epoch: 1, exit_code: Some(143) });
    f.ok(Command::FinishTask { alloc: id, task: 1, node: n(1), epoch: 1 });
    assert_eq!(f.status(id), AllocStatus::TearingDown);
    assert_eq!(f.used_gpus(2), 8);
    f.ack(id, 2, 2, 1);
    assert_eq!(f.status(id), AllocStatus::Cancelled);
    assert_eq!(f.statuses(id), vec![TaskStatus::Cancelled, TaskStatus::Done, TaskStatus::Cancelled]);
    assert_eq!(f.attempts(id), vec![0, 0, 0]);
}

#[test]
fn cancel_of_a_queued_allocation_removes_it_from_the_queue() {
    let mut f = Fixture::new(0);
    let id = f.submit(spec(2, 1));
    f.ok(Command::CancelAllocation { alloc: id });
    assert_eq!(f.s.queue_len(), 0);
}

// ----- clock, snapshot, digest -------------------------------------------------

#[test]
fn the_clock_never_goes_back() {
    let mut f = Fixture::new(0);
    f.t = 10_000;
    f.submit(spec(1, 1));
    f.t = 5_000; // a leader with a slower clock
    let id = f.submit(spec(1, 1));
    assert_eq!(f.s.now_ms(), 10_000);
    assert_eq!(f.s.alloc(id).unwrap().submit_time_ms, 10_000);
}

#[test]
fn snapshot_restores_the_same_state_and_digest() {
    let mut f = Fixture::new(3);
    f.running(2, 4);
    let queued = f.submit(AllocSpec { idempotency_key: Some("k".into()), ..spec(3, 8) });
    let bytes = f.s.to_snapshot();
    assert!(bytes.starts_with(SNAPSHOT_MAGIC));
    let restored = State::from_snapshot(&bytes).unwrap();
    assert_eq!(restored, f.s, "indexes rebuilt equal too");
    assert_eq!(restored.state_digest(), f.s.state_digest());
    assert_eq!(restored.queue().map(|k| k.alloc).collect::<Vec<_>>(), vec![queued]);
    // The restored replica keeps honouring idempotency keys.
    let mut replica = restored;
    let dup = replica.apply(
        &Command::Submit { spec: AllocSpec { idempotency_key: Some("k".into()), ..spec(3, 8) } },
        &ApplyCtx { time_ms: 0 },
    );
    assert_eq!(dup.events(), &[Event::Submitted { alloc: queued, duplicate: true }]);
}

#[test]
fn an_encoding_copy_encodes_as_the_state_did_when_it_was_taken() {
    let mut f = Fixture::new(3);
    let (running, _) = f.running(2, 4);
    f.submit(AllocSpec { idempotency_key: Some("k".into()), ..spec(3, 8) });
    let (bytes, digest) = (f.s.to_snapshot(), f.s.state_digest());
    let copy = f.s.encoding_copy();
    assert_eq!(copy.to_snapshot(), bytes, "the same bytes");
    assert_eq!(copy.state_digest(), digest);
    // Changes to the state after the copy (to a shared allocation, and a
    // new one) leave the copy as it was.
    f.cancel_and_stop(running);
    f.submit(spec(1, 1));
    assert_ne!(f.s.state_digest(), digest);
    assert_eq!(copy.to_snapshot(), bytes, "the copy did not move");
    assert_eq!(State::from_snapshot(&copy.to_snapshot()).unwrap().state_digest(), digest);
}

#[test]
fn snapshot_refuses_foreign_or_newer_bytes() {
    let f = Fixture::new(1);
    let mut bytes = f.s.to_snapshot();
    assert!(matches!(State::from_snapshot(b"not a snapshot"), Err(SnapshotError::BadMagic)));
    assert!(matches!(State::from_snapshot(SNAPSHOT_MAGIC), Err(SnapshotError::BadMagic)));
    bytes[8] = 99;
    assert!(matches!(State::from_snapshot(&bytes), Err(SnapshotError::UnsupportedVersion { found: 99, .. })));
    let mut truncated = f.s.to_snapshot();
    truncated.truncate(truncated.len() - 3);
    assert!(matches!(State::from_snapshot(&truncated), Err(SnapshotError::Decode(_))));
}

#[test]
fn digest_is_stable_and_sensitive() {
    let a = Fixture::new(2);
    let b = Fixture::new(2);
    assert_eq!(a.s.state_digest(), b.s.state_digest());
    // Pinned: a change to the encoding or hash shows up here and must bump
    // the snapshot format version.
    assert_eq!(
        State::default().state_digest().to_string(),
        "f06af98f6abbd9c2239fe4155f64d470f44e458d620297dd055352208f507f7e"
    );
    let mut c = Fixture::new(2);
    c.submit(spec(1, 1));
    assert_ne!(a.s.state_digest(), c.s.state_digest());
}

// ----- lost nodes -----------------------------------------------------------

#[test]
fn a_lost_node_fails_its_running_task_and_takes_no_more_work() {
    let mut f = Fixture::new(2);
    let (id, _) = f.running(1, 8); // on n0
    let ev = f.ok(Command::MarkNodeLost { node: n(0) });
    assert_eq!(ev[0], Event::NodeLost { node: n(0), tasks: vec![(id, 0)] });
    assert!(ev.contains(&Event::TaskFailed { alloc: id, task: 0, exit_code: None, charged: true }), "{ev:?}");
    assert!(ev.contains(&Event::GangRequeued { alloc: id }), "{ev:?}");
    let slot = f.s.node_slot(&n(0)).unwrap();
    assert_eq!(f.s.node(slot).status, NodeStatus::Lost);
    assert_eq!(f.used_gpus(0), 0);
    assert!(!f.s.free_gpu_index().iter().any(|&(_, _, s)| s == slot), "a lost node is out of placement");
    let epoch = f.s.alloc(id).unwrap().reservation_epoch + 1;
    assert_eq!(f.rejected(Command::ReserveGang { alloc: id, epoch, nodes: vec![n(0)] }), Rejection::NodeNotReady(n(0)));
    assert!(matches!(
        f.rejected(Command::MarkNodeLost { node: n(0) }),
        Rejection::IllegalNodeTransition { from: NodeStatus::Lost, .. }
    ));
    assert_eq!(f.rejected(Command::MarkNodeLost { node: n(9) }), Rejection::UnknownNode(n(9)));
    // Registering again brings it back.
    f.ok(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels: BTreeMap::new() });
    assert_eq!(f.s.node(slot).status, NodeStatus::Ready);
    f.reserve(id, &[0]);
}

#[test]
fn a_lost_node_under_a_running_gang_starts_a_teardown() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.ok(Command::MarkNodeLost { node: n(1) });
    assert_eq!(f.status(id), AllocStatus::TearingDown);
    assert_eq!(f.task(id, 1).attempts, 1, "the lost task's attempt is charged");
    // The survivors fail in turn as bystanders, then the gang is requeued.
    f.fail(id, 0, 0, epoch);
    f.fail(id, 2, 2, epoch);
    assert_eq!(f.status(id), AllocStatus::Queued);
    let attempts: Vec<u32> = f.s.alloc(id).unwrap().tasks.iter().map(|t| t.attempts).collect();
    assert_eq!(attempts, vec![0, 1, 0]);
}

#[test]
fn a_lost_node_under_an_unclaimed_gang_releases_the_whole_reservation() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 8));
    f.reserve(id, &[0, 1, 2]);
    f.ok(Command::MarkNodeLost { node: n(2) });
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (0, 0, 0));
    assert!(f.s.alloc(id).unwrap().tasks.iter().all(|t| t.attempts == 0), "nothing ran, nothing is charged");
}

#[test]
fn tasks_on_node_follows_placement() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(2, 1));
    let epoch = f.reserve(id, &[1, 0]);
    let (s0, s1) = (f.s.node_slot(&n(0)).unwrap(), f.s.node_slot(&n(1)).unwrap());
    assert_eq!(f.s.tasks_on_node(s1).collect::<Vec<_>>(), vec![(id, 0)]);
    f.start(id, 1, 0, epoch);
    assert_eq!(f.s.tasks_on_node(s0).collect::<Vec<_>>(), vec![(id, 1)]);
    f.ok(Command::CancelAllocation { alloc: id });
    assert_eq!(f.s.tasks_on_node(s0).collect::<Vec<_>>(), vec![(id, 1)], "stopping, not yet stopped");
    assert_eq!(f.s.tasks_on_node(s1).count(), 0);
    f.ok(Command::ConfirmPreempted { alloc: id, task: 1, node: n(0), epoch: 1, checkpoint_failed: false });
    assert_eq!(f.s.tasks_on_node(s0).count() + f.s.tasks_on_node(s1).count(), 0);
}

// ----- history ----------------------------------------------------------------

#[test]
fn every_event_bumps_the_allocation_revision_and_is_kept_for_watchers() {
    let mut f = Fixture::new(1);
    let keyed = AllocSpec { idempotency_key: Some("w".into()), ..spec(1, 1) };
    let id = f.submit(keyed.clone());
    f.ok(Command::Submit { spec: keyed }); // a duplicate changes nothing
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch });
    let a = f.s.alloc(id).unwrap();
    let kinds: Vec<(u64, &Event)> = a.history.iter().map(|h| (h.revision, &h.event)).collect();
    assert_eq!(a.revision, 5);
    assert_eq!(kinds.len(), 5);
    assert!(matches!(kinds[0], (1, Event::Submitted { duplicate: false, .. })));
    assert!(matches!(kinds[1], (2, Event::GangReserved { .. })));
    assert!(matches!(kinds[2], (3, Event::TaskStarted { .. })));
    assert!(matches!(kinds[3], (4, Event::TaskFinished { .. })));
    assert!(matches!(kinds[4], (5, Event::AllocationDone { .. })));
}

#[test]
fn history_is_bounded() {
    let mut f = Fixture::new(1);
    let id = f.submit(AllocSpec { max_retries: 100, ..spec(1, 1) });
    for _ in 0..100 {
        let epoch = f.reserve(id, &[0]);
        f.ok(Command::RollbackGang { alloc: id, epoch });
    }
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.revision, 1 + 100 * 3);
    assert_eq!(a.history.len(), HISTORY_LIMIT);
    assert_eq!(a.history.front().unwrap().revision, a.revision - HISTORY_LIMIT as u64 + 1);
}

/// Apply names the nodes each command touched, so that the agent hub wakes
/// only their streams: a placement, a stop and a drain touch their node and
/// no other; a submit touches none, and neither does a start (its agent
/// hears of it on its own stream, and no other agent has anything to hear).
#[test]
fn apply_names_exactly_the_nodes_it_touched() {
    let mut s = State::default();
    let t = ApplyCtx { time_ms: 1_000 };
    for i in 0..3 {
        let node = NodeId::new(format!("n{i}"));
        let resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_000_000, cpus: 64 };
        assert!(
            s.apply(&Command::RegisterNode { node: node.clone(), resources, labels: BTreeMap::new() }, &t)
                .is_accepted()
        );
        assert!(s.apply(&Command::MarkNodeReady { node }, &t).is_accepted());
    }
    s.take_touched_nodes();
    let spec = AllocSpec::new("u", 1, Resources { gpus: 8, vram_mb: 1, mem_mb: 1, cpus: 1 }, vec!["x".into()]);
    let out = s.apply(&Command::Submit { spec }, &t);
    let [Event::Submitted { alloc, .. }] = out.events()[..] else { panic!("{out:?}") };
    assert!(s.take_touched_nodes().is_empty(), "a queued submit touches no node");
    let n1 = NodeId::new("n1");
    let one = |s: &mut State| s.take_touched_nodes().into_iter().collect::<Vec<_>>();
    assert!(s.apply(&Command::ReserveGang { alloc, epoch: 1, nodes: vec![n1.clone()] }, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(1)]);
    assert!(s.apply(&Command::StartTask { alloc, task: 0, node: n1.clone(), epoch: 1 }, &t).is_accepted());
    assert!(s.take_touched_nodes().is_empty(), "a start touches no node");
    assert!(s.apply(&Command::CancelAllocation { alloc }, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(1)], "a stopping task's node hears of it");
    let ack = Command::ConfirmPreempted { alloc, task: 0, node: n1, epoch: 1, checkpoint_failed: false };
    assert!(s.apply(&ack, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(1)], "the node it left");
    let drain = Command::DrainNode { node: NodeId::new("n2"), timeout_ms: 1, reason: "r".into(), by: "op".into() };
    assert!(s.apply(&drain, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(2)]);
    // A rejected command touches nothing.
    assert!(!s.apply(&Command::MarkNodeReady { node: NodeId::new("n2") }, &t).is_accepted());
    assert!(s.take_touched_nodes().is_empty());
    // The set is not state: a restored copy (which holds none) is equal,
    // digest and all.
    let resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_000_000, cpus: 64 };
    let again = Command::RegisterNode { node: NodeId::new("n0"), resources, labels: BTreeMap::new() };
    assert!(s.apply(&again, &t).is_accepted());
    let restored = State::from_snapshot(&s.to_snapshot()).unwrap();
    assert_eq!(restored, s);
    assert_eq!(restored.state_digest(), s.state_digest());
    assert_eq!(one(&mut s), [NodeSlot(0)]);
}
