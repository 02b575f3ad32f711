//! One test per transition and per rejection of [`State::apply`].

mod borrowing;
mod lifecycle;
mod tokens;
mod vclusters;

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
    assert_eq!(f.ok(Command::NodeReady { node: n(0) }), vec![Event::NodeReady { node: n(0) }]);
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
    assert_eq!(cmds, vec![Command::ForceDrain { alloc: id, epoch: 1 }]);
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
        "a1cfa181b9b62d3def1d166714c6455a56b0f036d9c38e8c952d7cecf0270f73"
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
    f.ok(Command::TaskPreempted { alloc: id, task: 1, node: n(0), epoch: 1, checkpoint_failed: false });
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

// ----- gang teardown ------------------------------------------------------------

impl Fixture {
    fn ack(&mut self, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64) -> Vec<Event> {
        self.ok(Command::TaskPreempted { alloc, task, node: n(node), epoch, checkpoint_failed: false })
    }

    fn attempts(&self, alloc: AllocId) -> Vec<u32> {
        self.s.alloc(alloc).unwrap().tasks.iter().map(|t| t.attempts).collect()
    }

    /// Cancels `alloc` and acks the stop of each of its tasks that ran, as
    /// their agents would: it ends cancelled, holding nothing.
    fn cancel_and_stop(&mut self, alloc: AllocId) {
        self.ok(Command::CancelAllocation { alloc });
        let a = self.s.alloc(alloc).unwrap();
        let stopping: Vec<(TaskIndex, NodeId, u64)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempting)
            .map(|t| (t.index, self.s.node(t.node.unwrap()).id.clone(), t.preemption_epoch))
            .collect();
        for (task, node, epoch) in stopping {
            self.ok(Command::TaskPreempted { alloc, task, node, epoch, checkpoint_failed: false });
        }
        assert_eq!(self.status(alloc), AllocStatus::Cancelled);
    }

    fn statuses(&self, alloc: AllocId) -> Vec<TaskStatus> {
        self.s.alloc(alloc).unwrap().tasks.iter().map(|t| t.status).collect()
    }
}

#[test]
fn a_failure_with_running_siblings_preempts_them_under_one_epoch_and_refunds_all_but_the_trigger() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.t = 2_000;
    let ev = f.fail(id, 0, 0, epoch);
    assert_eq!(
        ev,
        vec![
            Event::TaskFailed { alloc: id, task: 0, exit_code: Some(1), charged: true },
            Event::TeardownStarted {
                alloc: id,
                cause: TeardownCause::TaskFailed { trigger: 0 },
                epoch: 1,
                preempting: vec![(1, n(1)), (2, n(2))],
                released: 0
            }
        ]
    );
    use TaskStatus::*;
    assert_eq!(f.statuses(id), vec![Blocked, Preempting, Preempting]);
    assert_eq!(f.attempts(id), vec![1, 0, 0], "siblings refunded, the trigger keeps its attempt");
    assert_eq!(f.status(id), AllocStatus::TearingDown);
    let a = f.s.alloc(id).unwrap();
    assert_eq!(
        a.teardown,
        Some(Teardown {
            epoch: 1,
            cause: TeardownCause::TaskFailed { trigger: 0 },
            started_at_ms: 2_000,
            failed_checkpoints: 0
        })
    );
    assert_eq!((a.tasks[1].preemption_epoch, a.tasks[2].preemption_epoch), (1, 1));
    assert_eq!(f.s.queue_len(), 0, "a gang mid-teardown is not admissible");
    assert_eq!((f.used_gpus(0), f.used_gpus(1), f.used_gpus(2)), (0, 8, 8), "preempting tasks still hold their GPUs");

    f.t = 3_000;
    assert_eq!(
        f.ack(id, 1, 1, 1),
        vec![Event::TaskPreempted { alloc: id, task: 1, epoch: 1, forced: false, checkpoint_failed: false }]
    );
    assert_eq!(f.statuses(id), vec![Blocked, Preempted, Preempting]);
    assert_eq!(f.used_gpus(1), 0);
    assert_eq!(f.status(id), AllocStatus::TearingDown);
    f.t = 3_500;
    assert_eq!(
        f.ack(id, 2, 2, 1),
        vec![
            Event::TaskPreempted { alloc: id, task: 2, epoch: 1, forced: false, checkpoint_failed: false },
            Event::TeardownCompleted {
                alloc: id,
                epoch: 1,
                cause: TeardownCause::TaskFailed { trigger: 0 },
                outcome: TeardownOutcome::Blocked,
                drain_ms: 1_500,
                preempted_count: 0
            },
            Event::GangRequeued { alloc: id }
        ]
    );
    assert_eq!(f.statuses(id), vec![Blocked, Blocked, Blocked]);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert!(f.s.alloc(id).unwrap().teardown.is_none());
    assert!(f.s.alloc(id).unwrap().tasks.iter().all(|t| t.node.is_none()));
}

#[test]
fn a_teardown_releases_unclaimed_siblings_and_leaves_blocked_ones() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 8));
    let epoch = f.reserve(id, &[0, 1, 2]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    let ev = f.fail(id, 1, 1, epoch);
    assert!(
        matches!(&ev[1], Event::TeardownStarted { cause: TeardownCause::TaskFailed { trigger: 1 }, preempting, released: 1, .. } if preempting == &vec![(0, n(0))]),
        "{ev:?}"
    );
    assert_eq!(f.statuses(id), vec![TaskStatus::Preempting, TaskStatus::Blocked, TaskStatus::Blocked]);
    assert_eq!(f.used_gpus(2), 0, "the unclaimed reservation is released at once");
}

/// The seed's retrace, MaxRetries = 3: A fails every round; after three real
/// failures the gang fails, never looping.
#[test]
fn the_retry_budget_trace_converges_with_a_3_b_1_c_1() {
    let mut f = Fixture::new(3);
    let id = f.submit(AllocSpec { max_retries: 3, ..spec(3, 8) });
    for round in 1..=3u32 {
        let epoch = f.reserve(id, &[0, 1, 2]);
        for i in 0..3 {
            f.start(id, i, i, epoch);
        }
        assert_eq!(f.attempts(id), vec![round, 1, 1], "claim-time counts in round {round}");
        let runs: Vec<u32> = f.s.alloc(id).unwrap().tasks.iter().map(|t| t.runs).collect();
        assert_eq!(runs, vec![round; 3], "runs are never refunded: attempt logs keep distinct numbers");
        f.fail(id, 0, 0, epoch);
        assert_eq!(f.attempts(id), vec![round, 0, 0]);
        let pe = f.s.alloc(id).unwrap().preemption_epoch;
        assert_eq!(pe, u64::from(round), "one new preemption epoch per teardown");
        f.ack(id, 1, 1, pe);
        let ev = f.ack(id, 2, 2, pe);
        if round < 3 {
            assert!(matches!(ev[1], Event::TeardownCompleted { outcome: TeardownOutcome::Blocked, .. }), "{ev:?}");
            assert_eq!(f.status(id), AllocStatus::Queued);
        } else {
            assert!(matches!(ev[1], Event::TeardownCompleted { outcome: TeardownOutcome::Failed, .. }), "{ev:?}");
            assert!(
                matches!(&ev[2], Event::AllocationFailed { reason, .. } if reason.contains("task 0 failed 3 times"))
            );
            assert_eq!(f.status(id), AllocStatus::Failed);
            assert_eq!(f.statuses(id), vec![TaskStatus::Failed; 3]);
        }
    }
    assert_eq!(f.attempts(id), vec![3, 0, 0]);
}

#[test]
fn one_exhausted_member_fails_the_gang_at_completion() {
    let mut f = Fixture::new(2);
    let id = f.submit(AllocSpec { max_retries: 1, ..spec(2, 8) });
    let epoch = f.reserve(id, &[0, 1]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    f.fail(id, 1, 1, epoch);
    let ev = f.ack(id, 0, 0, 1);
    assert!(matches!(ev[1], Event::TeardownCompleted { outcome: TeardownOutcome::Failed, .. }), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Failed);
}

#[test]
fn a_done_sibling_at_completion_fails_the_gang_and_keeps_its_done_row() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.ok(Command::FinishTask { alloc: id, task: 2, node: n(2), epoch });
    f.fail(id, 0, 0, epoch);
    assert_eq!(f.statuses(id), vec![TaskStatus::Blocked, TaskStatus::Preempting, TaskStatus::Done]);
    let ev = f.ack(id, 1, 1, 1);
    assert!(matches!(ev[1], Event::TeardownCompleted { outcome: TeardownOutcome::Failed, .. }), "{ev:?}");
    assert!(matches!(&ev[2], Event::AllocationFailed { reason, .. } if reason.contains("task 2 finished")), "{ev:?}");
    assert_eq!(f.statuses(id), vec![TaskStatus::Failed, TaskStatus::Failed, TaskStatus::Done]);
}

#[test]
fn a_preempting_task_that_exits_on_its_own_is_preempted_or_done() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.fail(id, 0, 0, epoch);
    // Task 1's process dies before the preempt reaches it: preempted, not charged.
    let ev = f.fail(id, 1, 1, epoch);
    assert_eq!(
        ev,
        vec![
            Event::TaskFailed { alloc: id, task: 1, exit_code: Some(1), charged: false },
            Event::TaskPreempted { alloc: id, task: 1, epoch: 1, forced: false, checkpoint_failed: false }
        ]
    );
    assert_eq!(f.attempts(id), vec![1, 0, 0]);
    // Task 2 finished its work meanwhile: done, and the gang cannot restart whole.
    let ev = f.ok(Command::FinishTask { alloc: id, task: 2, node: n(2), epoch });
    assert!(matches!(ev[1], Event::TeardownCompleted { outcome: TeardownOutcome::Failed, .. }), "{ev:?}");
    assert_eq!(f.task(id, 2).status, TaskStatus::Done);
}

#[test]
fn acks_and_checkpoints_with_a_stale_epoch_or_from_elsewhere_are_refused() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    f.ack(id, 1, 1, 1);
    // Round 2, torn down again: epoch 2.
    let epoch = f.reserve(id, &[0, 1]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    // A late ack of round 1 while the task runs again.
    assert_eq!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
        Rejection::WrongTaskStatus {
            alloc: id,
            task: 1,
            status: TaskStatus::Running,
            expected: TaskStatus::Preempting
        }
    );
    f.fail(id, 0, 0, epoch);
    let stale = Rejection::StalePreemptionEpoch { alloc: id, current: 2, got: 1 };
    assert_eq!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
        stale
    );
    assert_eq!(
        f.rejected(Command::SaveCheckpoint { alloc: id, task: 1, node: n(1), epoch: 1, data: vec![1, 2, 3] }),
        stale
    );
    assert_eq!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 1, node: n(2), epoch: 2, checkpoint_failed: false }),
        Rejection::WrongNode { alloc: id, task: 1, node: n(2) }
    );
    // The trigger was never told to stop: nothing to ack.
    assert_eq!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 0, node: n(0), epoch: 0, checkpoint_failed: false }),
        Rejection::WrongTaskStatus {
            alloc: id,
            task: 0,
            status: TaskStatus::Blocked,
            expected: TaskStatus::Preempting
        }
    );
}

#[test]
fn a_checkpoint_is_stored_kept_for_later_attempts_and_dropped_at_the_end() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    f.t = 5_000;
    let ev = f.ok(Command::SaveCheckpoint { alloc: id, task: 1, node: n(1), epoch: 1, data: b"step=41".to_vec() });
    assert_eq!(
        ev,
        vec![Event::CheckpointSaved { alloc: id, task: 1, epoch: 1, bytes: 7, after_ms: 4_000, preempted: false }]
    );
    // A second upload of the same round replaces the first.
    f.ok(Command::SaveCheckpoint { alloc: id, task: 1, node: n(1), epoch: 1, data: b"step=42".to_vec() });
    f.ack(id, 1, 1, 1);
    let c = f.task(id, 1).checkpoint.clone().unwrap();
    assert_eq!((c.epoch, c.saved_at_ms, c.data.as_slice()), (1, 5_000, &b"step=42"[..]));
    let epoch = f.reserve(id, &[1, 0]);
    f.start(id, 0, 1, epoch);
    f.start(id, 1, 0, epoch);
    assert!(f.task(id, 1).checkpoint.is_some(), "the next attempt finds it");
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(1), epoch });
    f.ok(Command::FinishTask { alloc: id, task: 1, node: n(0), epoch });
    assert_eq!(f.status(id), AllocStatus::Done);
    assert!(f.task(id, 1).checkpoint.is_none(), "a finished allocation keeps no checkpoint");
}

#[test]
fn an_exiting_task_saves_its_checkpoint_by_its_attempt_while_running_or_stopping_and_it_survives_the_requeue() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    let save = |task: TaskIndex, node: u32, epoch: u64, data: &[u8]| Command::SaveExitCheckpoint {
        alloc: id,
        task,
        node: n(node),
        epoch,
        data: data.to_vec(),
    };
    // The killed rank: still running when its exit upload arrives.
    f.t = 2_000;
    let ev = f.ok(save(0, 0, epoch, b"step=7"));
    assert_eq!(
        ev,
        vec![Event::CheckpointSaved { alloc: id, task: 0, epoch: 0, bytes: 6, after_ms: 0, preempted: false }]
    );
    f.fail(id, 0, 0, epoch);
    // A peer that exited on its own after the teardown began: stopping.
    f.ok(save(1, 1, epoch, b"step=8"));
    f.ok(Command::FailTask { alloc: id, task: 1, node: n(1), epoch, exit_code: Some(1) });
    // Fenced by the attempt and the node: a stale attempt or another node is refused.
    assert_eq!(
        f.rejected(save(2, 2, epoch + 1, b"x")),
        Rejection::StaleTaskEpoch { alloc: id, task: 2, current: epoch, got: epoch + 1 }
    );
    assert_eq!(f.rejected(save(2, 1, epoch, b"x")), Rejection::WrongNode { alloc: id, task: 2, node: n(1) });
    assert!(matches!(
        f.rejected(save(2, 2, epoch, &vec![0; DEFAULT_MAX_CHECKPOINT_BYTES + 1])),
        Rejection::CheckpointTooLarge { .. }
    ));
    f.ok(save(2, 2, epoch, b"step=9"));
    f.ack(id, 2, 2, 1);
    // Once a task's exit is recorded, a late upload of its attempt is refused.
    assert!(matches!(f.rejected(save(0, 0, epoch, b"late")), Rejection::WrongTaskStatus { .. }));
    assert_eq!(f.status(id), AllocStatus::Queued);
    let kept: Vec<Vec<u8>> = (0..3).map(|t| f.task(id, t).checkpoint.clone().unwrap().data).collect();
    assert_eq!(kept, vec![b"step=7".to_vec(), b"step=8".to_vec(), b"step=9".to_vec()]);
    let none = f.submit(AllocSpec { checkpoint: CheckpointMode::None, ..spec(1, 0) });
    assert_eq!(
        f.rejected(Command::SaveExitCheckpoint { alloc: none, task: 0, node: n(0), epoch: 0, data: vec![1] }),
        Rejection::CheckpointDisabled { alloc: none }
    );
}

#[test]
fn an_unusable_checkpoint_is_dropped_without_a_charge_and_uploads_are_checked_without_the_log() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    let upload = |task: TaskIndex, node: u32, epoch: u64, data: Vec<u8>| Command::SaveCheckpoint {
        alloc: id,
        task,
        node: n(node),
        epoch,
        data,
    };
    // The leader's check before proposing refuses exactly what apply would.
    let before = f.s.state_digest();
    assert_eq!(f.s.precheck(&upload(1, 1, 1, b"ok".to_vec())), Ok(()));
    assert_eq!(
        f.s.precheck(&upload(1, 0, 1, b"x".to_vec())),
        Err(Rejection::WrongNode { alloc: id, task: 1, node: n(0) })
    );
    assert!(matches!(f.s.precheck(&upload(1, 1, 0, b"x".to_vec())), Err(Rejection::StalePreemptionEpoch { .. })));
    let big = upload(1, 1, 1, vec![0; DEFAULT_MAX_CHECKPOINT_BYTES + 1]);
    assert!(matches!(f.s.precheck(&big), Err(Rejection::CheckpointTooLarge { .. })));
    assert_eq!(f.s.precheck(&big), Err(f.rejected(big.clone())), "the same refusal as apply's");
    assert_eq!(f.s.state_digest(), before, "checking changes nothing");
    f.ok(upload(1, 1, 1, b"step=3".to_vec()));
    f.ack(id, 1, 1, 1);
    // The next attempt's node cannot restore it: dropped, the task runs on.
    let epoch = f.reserve(id, &[1, 0]);
    f.start(id, 0, 1, epoch);
    f.start(id, 1, 0, epoch);
    let drop = Command::DropCheckpoint { alloc: id, task: 1, node: n(0), epoch, reason: "cannot unpack".into() };
    let ev = f.ok(drop);
    assert_eq!(ev, vec![Event::CheckpointDropped { alloc: id, task: 1, node: n(0), reason: "cannot unpack".into() }]);
    assert!(f.task(id, 1).checkpoint.is_none());
    assert_eq!(f.status(id), AllocStatus::Running);
    assert_eq!(f.attempts(id), vec![2, 1], "only task 0's own failure is charged");
    let long = Command::DropCheckpoint { alloc: id, task: 1, node: n(0), epoch, reason: "x".repeat(2_000) };
    assert!(matches!(f.rejected(long), Rejection::InvalidNode { .. }));
}

#[test]
fn checkpoints_over_the_cap_or_of_a_no_checkpoint_allocation_are_refused() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    let cap = DEFAULT_MAX_CHECKPOINT_BYTES;
    let err = f.rejected(Command::SaveCheckpoint { alloc: id, task: 1, node: n(1), epoch: 1, data: vec![0; cap + 1] });
    assert_eq!(err, Rejection::CheckpointTooLarge { alloc: id, task: 1, bytes: cap as u64 + 1, limit: cap as u64 });
    assert!(err.to_string().contains("over the 4194304-byte limit"), "{err}");
    f.ok(Command::SaveCheckpoint { alloc: id, task: 1, node: n(1), epoch: 1, data: vec![0; cap] });
    // Only a preempting task may save.
    assert_eq!(
        f.rejected(Command::SaveCheckpoint { alloc: id, task: 0, node: n(0), epoch: 0, data: vec![1] }),
        Rejection::WrongTaskStatus {
            alloc: id,
            task: 0,
            status: TaskStatus::Blocked,
            expected: TaskStatus::Preempting
        }
    );
    let none = f.submit(AllocSpec { checkpoint: CheckpointMode::None, ..spec(1, 0) });
    assert_eq!(
        f.rejected(Command::SaveCheckpoint { alloc: none, task: 0, node: n(0), epoch: 0, data: vec![1] }),
        Rejection::CheckpointDisabled { alloc: none }
    );
}

#[test]
fn force_drain_moves_stuck_tasks_and_completes_in_the_same_command() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.t = 10_000;
    f.fail(id, 0, 0, epoch);
    f.ack(id, 1, 1, 1);
    assert_eq!(crate::policy::plan_forced_teardowns(&f.s, 54_999, 45_000, &Default::default()), vec![]);
    let plan = crate::policy::plan_forced_teardowns(&f.s, 55_000, 45_000, &Default::default());
    assert_eq!(plan, vec![Command::ForceDrain { alloc: id, epoch: 1 }]);
    assert_eq!(
        f.rejected(Command::ForceDrain { alloc: id, epoch: 2 }),
        Rejection::StalePreemptionEpoch { alloc: id, current: 1, got: 2 }
    );
    f.t = 55_000;
    let ev = f.ok(plan[0].clone());
    assert_eq!(
        ev,
        vec![
            Event::TaskPreempted { alloc: id, task: 2, epoch: 1, forced: true, checkpoint_failed: false },
            Event::TeardownCompleted {
                alloc: id,
                epoch: 1,
                cause: TeardownCause::TaskFailed { trigger: 0 },
                outcome: TeardownOutcome::Blocked,
                drain_ms: 45_000,
                preempted_count: 0
            },
            Event::GangRequeued { alloc: id }
        ]
    );
    assert_eq!(f.used_gpus(2), 0);
    assert_eq!(f.rejected(Command::ForceDrain { alloc: id, epoch: 1 }), Rejection::NotTearingDown { alloc: id });
    // The late ack of the forced task is refused: the task is blocked now.
    assert!(matches!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 2, node: n(2), epoch: 1, checkpoint_failed: false }),
        Rejection::WrongTaskStatus { status: TaskStatus::Blocked, .. }
    ));
}

#[test]
fn losing_the_node_of_a_preempting_task_preempts_it() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.fail(id, 0, 0, epoch);
    f.ack(id, 1, 1, 1);
    let ev = f.ok(Command::MarkNodeLost { node: n(2) });
    assert_eq!(ev[1], Event::TaskPreempted { alloc: id, task: 2, epoch: 1, forced: true, checkpoint_failed: false });
    assert!(matches!(ev[2], Event::TeardownCompleted { outcome: TeardownOutcome::Blocked, .. }), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Queued);
}

/// The gang-scheduling seed's stuck state: two tasks run, the third node dies
/// before claiming. The teardown brings the gang back whole, and it completes
/// on healthy nodes.
#[test]
fn the_stuck_state_is_torn_down_and_the_gang_completes_elsewhere() {
    let mut f = Fixture::new(4);
    let id = f.submit(spec(3, 8));
    let epoch = f.reserve(id, &[0, 1, 2]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    let ev = f.ok(Command::MarkNodeLost { node: n(2) });
    assert_eq!(ev[1], Event::TaskFailed { alloc: id, task: 2, exit_code: None, charged: false });
    assert!(
        matches!(&ev[2], Event::TeardownStarted { cause: TeardownCause::TaskFailed { trigger: 2 }, preempting, .. } if preempting.len() == 2),
        "{ev:?}"
    );
    f.ack(id, 0, 0, 1);
    f.ack(id, 1, 1, 1);
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!(f.attempts(id), vec![0, 0, 0], "the reserved task never ran: nothing is charged");
    let plan = crate::policy::plan_admission(&f.s, f.t, &crate::policy::AdmissionConfig::default());
    let Command::ReserveGang { nodes, .. } = &plan.commands[0] else { panic!("{plan:?}") };
    assert!(!nodes.contains(&n(2)), "the lost node is not used again: {nodes:?}");
    f.ok(plan.commands[0].clone());
    let epoch = f.s.alloc(id).unwrap().reservation_epoch;
    let nodes: Vec<u32> = f.s.alloc(id).unwrap().tasks.iter().map(|t| t.node.unwrap().0).collect();
    for (task, node) in nodes.iter().enumerate() {
        f.start(id, task as TaskIndex, *node, epoch);
    }
    for (task, node) in nodes.iter().enumerate() {
        f.ok(Command::FinishTask { alloc: id, task: task as TaskIndex, node: n(*node), epoch });
    }
    assert_eq!(f.status(id), AllocStatus::Done);
}

/// The same stuck state when the node stays up but never claims: the stale
/// reservation's rollback triggers the teardown.
#[test]
fn a_stale_reservation_with_running_siblings_triggers_a_teardown() {
    let mut f = Fixture::new(3);
    let id = f.submit(spec(3, 8));
    let epoch = f.reserve(id, &[0, 1, 2]);
    f.start(id, 0, 0, epoch);
    f.start(id, 1, 1, epoch);
    let cfg = crate::policy::AdmissionConfig::default();
    f.t += cfg.stale_reservation_ms;
    let plan = crate::policy::plan_admission(&f.s, f.t, &cfg);
    assert_eq!(plan.commands, vec![Command::RollbackGang { alloc: id, epoch }]);
    let ev = f.ok(plan.commands[0].clone());
    assert_eq!(ev[0], Event::GangRolledBack { alloc: id, epoch });
    assert_eq!(ev[1], Event::TaskFailed { alloc: id, task: 2, exit_code: None, charged: false });
    assert!(matches!(&ev[2], Event::TeardownStarted { cause: TeardownCause::TaskFailed { trigger: 2 }, .. }), "{ev:?}");
    assert_eq!(f.statuses(id), vec![TaskStatus::Preempting, TaskStatus::Preempting, TaskStatus::Blocked]);
    assert_eq!(f.attempts(id), vec![0, 0, 0], "a reservation that never started is not charged");
    assert_eq!(f.s.alloc(id).unwrap().avoid_nodes, vec![f.s.node_slot(&n(2)).unwrap()], "the node that never claimed");
}

/// Issue 22, item 4: a frozen node holding only a reservation of a gang is
/// lost again and again; the gang, which never failed on its own, is never
/// charged for it and never runs out of retries.
#[test]
fn losing_a_reserved_node_again_and_again_never_charges_the_gang() {
    let mut f = Fixture::new(6);
    let mut a = spec(2, 8);
    a.max_retries = 2;
    let id = f.submit(a);
    for round in 0..4u32 {
        let (run, frozen) = (2 * round % 6, (2 * round + 1) % 6);
        let epoch = f.reserve(id, &[run, frozen]);
        f.start(id, 0, run, epoch);
        f.ok(Command::MarkNodeLost { node: n(frozen) });
        let pe = f.s.alloc(id).unwrap().preemption_epoch;
        f.ack(id, 0, run, pe);
        assert_eq!(f.status(id), AllocStatus::Queued, "round {round}");
        assert_eq!(f.attempts(id), vec![0, 0], "round {round}: only started tasks are charged");
        // The frozen node thaws and registers again (ready at once).
        f.ok(Command::RegisterNode { node: n(frozen), resources: GPU_NODE, labels: BTreeMap::new() });
    }
}

#[test]
fn cancel_during_a_teardown_moves_the_stopping_tasks_to_a_cancel_round_and_holds_their_capacity() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.fail(id, 0, 0, epoch);
    let ev = f.ok(Command::CancelAllocation { alloc: id });
    assert_eq!(
        ev,
        vec![Event::TeardownStarted {
            alloc: id,
            cause: TeardownCause::Cancelled { preempted_by: None },
            epoch: 2,
            preempting: vec![(1, n(1)), (2, n(2))],
            released: 0,
        }]
    );
    assert_eq!((f.used_gpus(1), f.used_gpus(2)), (8, 8), "the siblings may still run");
    assert_eq!(f.attempts(id), vec![1, 0, 0], "the bystanders are not refunded twice");
    assert_eq!(
        f.rejected(Command::TaskPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
        Rejection::StalePreemptionEpoch { alloc: id, current: 2, got: 1 }
    );
    f.ack(id, 1, 1, 2);
    let ev = f.ack(id, 2, 2, 2);
    assert_eq!(ev.last(), Some(&Event::AllocationCancelled { alloc: id, stopped: vec![(1, n(1)), (2, n(2))] }));
    assert!(f.s.alloc(id).unwrap().teardown.is_none());
    assert_eq!((f.used_gpus(1), f.used_gpus(2)), (0, 0));
    assert_eq!(f.status(id), AllocStatus::Cancelled);
}

// ----- priority preemption ------------------------------------------------------

impl Fixture {
    /// Submits a gang of `gang` × `gpus` at `class` and runs it on `nodes`.
    fn running_on(&mut self, gang: u32, gpus: u32, class: u8, nodes: &[u32]) -> (AllocId, u64) {
        let mut sp = spec(gang, gpus);
        sp.preemption_class = class;
        let id = self.submit(sp);
        let epoch = self.reserve(id, nodes);
        for (i, &node) in nodes.iter().enumerate() {
            self.start(id, i as TaskIndex, node, epoch);
        }
        (id, epoch)
    }

    fn queued(&mut self, gang: u32, gpus: u32, class: u8) -> AllocId {
        let mut sp = spec(gang, gpus);
        sp.preemption_class = class;
        self.submit(sp)
    }

    fn preempt(&mut self, alloc: AllocId, victims: &[(AllocId, u64)], nodes: &[u32]) -> Outcome {
        self.apply(Command::Preempt {
            alloc,
            victims: victims.to_vec(),
            nodes: nodes.iter().map(|&i| n(i)).collect(),
            hold_ms: 60_000,
        })
    }
}

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
    f.ok(Command::SaveCheckpoint { alloc: v1, task: 0, node: n(0), epoch: 1, data: b"step=7".to_vec() });
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
    assert!(a.tasks[0].checkpoint.is_some());
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
    let ev = f.ok(Command::TaskPreempted { alloc: v, task: 1, node: n(1), epoch: 1, checkpoint_failed: true });
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
    let ev = f.ok(Command::ForceDrain { alloc: v, epoch: 1 });
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

// ----- watchdog trips -------------------------------------------------------------

impl Fixture {
    fn trip(&mut self, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64, kind: WatchdogKind) -> Vec<Event> {
        self.ok(Command::TripWatchdog { alloc, task, node: n(node), epoch, kind })
    }
}

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

/// Apply names the nodes each command touched, so that the agent hub wakes
/// only their streams: a placement, a start, a stop and a drain touch
/// their node and no other; a submit touches none.
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
        assert!(s.apply(&Command::NodeReady { node }, &t).is_accepted());
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
    assert_eq!(one(&mut s), [NodeSlot(1)]);
    assert!(s.apply(&Command::CancelAllocation { alloc }, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(1)], "a stopping task's node hears of it");
    let ack = Command::TaskPreempted { alloc, task: 0, node: n1, epoch: 1, checkpoint_failed: false };
    assert!(s.apply(&ack, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(1)], "the node it left");
    let drain = Command::DrainNode { node: NodeId::new("n2"), timeout_ms: 1, reason: "r".into(), by: "op".into() };
    assert!(s.apply(&drain, &t).is_accepted());
    assert_eq!(one(&mut s), [NodeSlot(2)]);
    // A rejected command touches nothing.
    assert!(!s.apply(&Command::NodeReady { node: NodeId::new("n2") }, &t).is_accepted());
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
