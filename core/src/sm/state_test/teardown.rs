//! Gang teardowns: stopping siblings, acks, forced ends, cancels during a teardown.

use super::*;

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
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
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
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
        stale
    );
    assert_eq!(
        f.rejected(Command::SaveCheckpoint {
            alloc: id,
            task: 1,
            node: n(1),
            epoch: 1,
            manifest: manifest(id, 1, "a", 3)
        }),
        stale
    );
    assert_eq!(
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 1, node: n(2), epoch: 2, checkpoint_failed: false }),
        Rejection::WrongNode { alloc: id, task: 1, node: n(2) }
    );
    // The trigger was never told to stop: nothing to ack.
    assert_eq!(
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 0, node: n(0), epoch: 0, checkpoint_failed: false }),
        Rejection::WrongTaskStatus {
            alloc: id,
            task: 0,
            status: TaskStatus::Blocked,
            expected: TaskStatus::Preempting
        }
    );
}

#[test]
fn a_checkpoint_is_stored_kept_for_later_attempts_and_retired_at_the_end() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    f.t = 5_000;
    let save = |name: &str, bytes| Command::SaveCheckpoint {
        alloc: id,
        task: 1,
        node: n(1),
        epoch: 1,
        manifest: manifest(id, 1, name, bytes),
    };
    let ev = f.ok(save("step-41", 7));
    assert_eq!(
        ev,
        vec![Event::CheckpointSaved {
            alloc: id,
            task: 1,
            epoch: 1,
            bytes: 7,
            after_ms: 4_000,
            preempted: false,
            seq: 1
        }]
    );
    // The same upload again (an agent re-sending after a reconnect) is the
    // same checkpoint; a newer one goes first.
    assert_eq!(f.ok(save("step-41", 7)), ev);
    f.ok(save("step-42", 8));
    f.ack(id, 1, 1, 1);
    let c = &f.task(id, 1).checkpoints;
    assert_eq!(
        c.iter().map(|m| (m.seq, m.epoch, m.saved_at_ms, m.bytes)).collect::<Vec<_>>(),
        [(2, 1, 5_000, 8), (1, 1, 5_000, 7)]
    );
    assert_eq!((c[0].writer.clone(), c[0].attempt, c[0].key.as_str()), (n(1), 1, "alloc-1/task-1/step-42"));
    let epoch = f.reserve(id, &[1, 0]);
    f.start(id, 0, 1, epoch);
    f.start(id, 1, 0, epoch);
    assert_eq!(f.task(id, 1).checkpoints.len(), 2, "the next attempt finds them");
    assert_eq!(f.s.checkpoints_to_delete(&n(1)).count(), 0, "nothing retired yet");
    f.ok(Command::FinishTask { alloc: id, task: 0, node: n(1), epoch });
    f.ok(Command::FinishTask { alloc: id, task: 1, node: n(0), epoch });
    assert_eq!(f.status(id), AllocStatus::Done);
    assert!(f.task(id, 1).checkpoints.is_empty(), "a finished allocation keeps no checkpoint");
    let retired: Vec<u64> = f.s.checkpoints_to_delete(&n(1)).map(|r| r.manifest.seq).collect();
    assert_eq!(retired, [1, 2], "their bytes are for their writer to delete");
}

#[test]
fn a_task_keeps_its_newest_checkpoints_and_its_writer_deletes_the_rest() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(1, 8);
    let exit = |name: &str| Command::SaveExitCheckpoint {
        alloc: id,
        task: 0,
        node: n(0),
        epoch,
        manifest: manifest(id, 0, name, 10),
    };
    for name in ["c1", "c2", "c3"] {
        f.ok(exit(name));
    }
    let kept: Vec<u64> = f.task(id, 0).checkpoints.iter().map(|m| m.seq).collect();
    assert_eq!(kept, [3, 2], "keep is 2 by default: the newest first");
    let retired: Vec<u64> = f.s.checkpoints_to_delete(&n(0)).map(|r| r.manifest.seq).collect();
    assert_eq!(retired, [1]);
    // Only the deleter may confirm a deletion; a number already forgotten
    // is skipped.
    assert_eq!(
        f.rejected(Command::ForgetCheckpoints { node: n(1), seqs: vec![1] }),
        Rejection::NotDeleter { node: n(1), seq: 1 }
    );
    assert_eq!(
        f.s.precheck(&Command::ForgetCheckpoints { node: n(1), seqs: vec![1] }),
        Err(Rejection::NotDeleter { node: n(1), seq: 1 })
    );
    let ev = f.ok(Command::ForgetCheckpoints { node: n(0), seqs: vec![1, 99] });
    assert_eq!(ev, vec![Event::CheckpointsDeleted { node: n(0), count: 1 }]);
    assert_eq!(f.s.checkpoints_to_delete(&n(0)).count(), 0);
    assert!(matches!(
        f.rejected(Command::ForgetCheckpoints { node: n(0), seqs: vec![7; MAX_FORGET_CHECKPOINTS + 1] }),
        Rejection::InvalidNode { .. }
    ));
    // The settings: keep 1 retires the older one at the next save.
    let settings = CheckpointSettings { keep: 1, ..CheckpointSettings::default() };
    f.ok(Command::SetCheckpointSettings { settings: settings.clone(), by: "admin-a".into() });
    assert_eq!(f.s.checkpoint_settings(), &settings);
    f.ok(exit("c4"));
    assert_eq!(f.task(id, 0).checkpoints.iter().map(|m| m.seq).collect::<Vec<_>>(), [4]);
    assert_eq!(f.s.checkpoints_to_delete(&n(0)).map(|r| r.manifest.seq).collect::<Vec<_>>(), [2, 3]);
    for bad in [
        CheckpointSettings { keep: 0, ..settings.clone() },
        CheckpointSettings { max_bytes: 10, ..settings.clone() },
        CheckpointSettings { store: CheckpointStore::Shared { root: "relative".into() }, ..settings.clone() },
    ] {
        assert!(matches!(
            f.rejected(Command::SetCheckpointSettings { settings: bad, by: "admin-a".into() }),
            Rejection::InvalidCheckpointSettings { .. }
        ));
    }
}

#[test]
fn a_manifest_must_name_its_own_task_and_a_store_the_allocation_uses() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(1, 8);
    let other = f.submit(spec(1, 8));
    let other_epoch = f.reserve(other, &[1]);
    f.start(other, 0, 1, other_epoch);
    let exit = |m: ManifestUpload| Command::SaveExitCheckpoint { alloc: id, task: 0, node: n(0), epoch, manifest: m };
    // Someone else's checkpoint, by key: refused, so no task can be made to
    // restore another job's state.
    let theirs = manifest(other, 0, "x", 1);
    assert!(matches!(f.rejected(exit(theirs)), Rejection::InvalidCheckpoint { field, .. } if field == "key"));
    let shared = CheckpointStore::Shared { root: "/mnt/ckpt".into() };
    let elsewhere = ManifestUpload { store: shared.clone(), ..manifest(id, 0, "x", 1) };
    assert!(
        matches!(f.rejected(exit(elsewhere.clone())), Rejection::InvalidCheckpoint { field, .. } if field == "store")
    );
    // Once the cluster's store is that path, the same manifest is taken.
    let settings = CheckpointSettings { store: shared.clone(), ..CheckpointSettings::default() };
    f.ok(Command::SetCheckpointSettings { settings, by: "admin-a".into() });
    f.ok(exit(elsewhere));
    assert_eq!(f.task(id, 0).checkpoints[0].store, shared);
    // A shared store's retired checkpoints are its writer's to delete, and
    // pass to another ready node once the writer is terminated.
    f.cancel_and_stop(id);
    assert_eq!(f.s.checkpoints_to_delete(&n(0)).count(), 1);
    f.ok(Command::DrainNode { node: n(0), timeout_ms: 0, reason: "gone".into(), by: "admin-a".into() });
    f.cancel_and_stop(other);
    f.ok(Command::TerminateNode { node: n(0), by: "admin-a".into() });
    assert_eq!(f.s.checkpoints_to_delete(&n(0)).count(), 0);
    assert_eq!(f.s.checkpoints_to_delete(&n(1)).count(), 1, "a ready node deletes it now");
}

#[test]
fn an_exiting_task_saves_its_checkpoint_by_its_attempt_while_running_or_stopping_and_it_survives_the_requeue() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    let save = |task: TaskIndex, node: u32, epoch: u64, name: &str, bytes: u64| Command::SaveExitCheckpoint {
        alloc: id,
        task,
        node: n(node),
        epoch,
        manifest: manifest(id, task, name, bytes),
    };
    // The killed rank: still running when its exit upload arrives.
    f.t = 2_000;
    let ev = f.ok(save(0, 0, epoch, "step-7", 6));
    assert_eq!(
        ev,
        vec![Event::CheckpointSaved { alloc: id, task: 0, epoch: 0, bytes: 6, after_ms: 0, preempted: false, seq: 1 }]
    );
    f.fail(id, 0, 0, epoch);
    // A peer that exited on its own after the teardown began: stopping.
    f.ok(save(1, 1, epoch, "step-8", 6));
    f.ok(Command::FailTask { alloc: id, task: 1, node: n(1), epoch, exit_code: Some(1) });
    // Fenced by the attempt and the node: a stale attempt or another node is refused.
    assert_eq!(
        f.rejected(save(2, 2, epoch + 1, "x", 1)),
        Rejection::StaleTaskEpoch { alloc: id, task: 2, current: epoch, got: epoch + 1 }
    );
    assert_eq!(f.rejected(save(2, 1, epoch, "x", 1)), Rejection::WrongNode { alloc: id, task: 2, node: n(1) });
    assert!(matches!(
        f.rejected(save(2, 2, epoch, "x", DEFAULT_MAX_CHECKPOINT_BYTES + 1)),
        Rejection::CheckpointTooLarge { .. }
    ));
    f.ok(save(2, 2, epoch, "step-9", 6));
    f.ack(id, 2, 2, 1);
    // Once a task's exit is recorded, a late upload of its attempt is refused.
    assert!(matches!(f.rejected(save(0, 0, epoch, "late", 1)), Rejection::WrongTaskStatus { .. }));
    assert_eq!(f.status(id), AllocStatus::Queued);
    let kept: Vec<String> = (0..3).map(|t| f.task(id, t).checkpoints[0].key.clone()).collect();
    assert_eq!(kept, ["alloc-1/task-0/step-7", "alloc-1/task-1/step-8", "alloc-1/task-2/step-9"]);
    let none = f.submit(AllocSpec { checkpoint: CheckpointMode::None, ..spec(1, 0) });
    assert_eq!(
        f.rejected(Command::SaveExitCheckpoint {
            alloc: none,
            task: 0,
            node: n(0),
            epoch: 0,
            manifest: manifest(none, 0, "x", 1)
        }),
        Rejection::CheckpointDisabled { alloc: none }
    );
}

#[test]
fn an_unusable_checkpoint_is_dropped_without_a_charge_and_uploads_are_checked_without_the_log() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    let upload = |task: TaskIndex, node: u32, epoch: u64, bytes: u64| Command::SaveCheckpoint {
        alloc: id,
        task,
        node: n(node),
        epoch,
        manifest: manifest(id, task, "c", bytes),
    };
    // The leader's check before proposing refuses exactly what apply would.
    let before = f.s.state_digest();
    assert_eq!(f.s.precheck(&upload(1, 1, 1, 2)), Ok(()));
    assert_eq!(f.s.precheck(&upload(1, 0, 1, 1)), Err(Rejection::WrongNode { alloc: id, task: 1, node: n(0) }));
    assert!(matches!(f.s.precheck(&upload(1, 1, 0, 1)), Err(Rejection::StalePreemptionEpoch { .. })));
    let big = upload(1, 1, 1, DEFAULT_MAX_CHECKPOINT_BYTES + 1);
    assert!(matches!(f.s.precheck(&big), Err(Rejection::CheckpointTooLarge { .. })));
    assert_eq!(f.s.precheck(&big), Err(f.rejected(big.clone())), "the same refusal as apply's");
    assert_eq!(f.s.state_digest(), before, "checking changes nothing");
    f.ok(upload(1, 1, 1, 6));
    f.ack(id, 1, 1, 1);
    // The next attempt's node cannot restore it: dropped, the task runs on.
    let epoch = f.reserve(id, &[1, 0]);
    f.start(id, 0, 1, epoch);
    f.start(id, 1, 0, epoch);
    let drop =
        |seq: u64, reason: String| Command::DropCheckpoint { alloc: id, task: 1, node: n(0), epoch, seq, reason };
    assert_eq!(f.rejected(drop(9, "x".into())), Rejection::UnknownCheckpoint { alloc: id, task: 1, seq: 9 });
    let ev = f.ok(drop(1, "cannot unpack".into()));
    assert_eq!(
        ev,
        vec![Event::CheckpointDropped { alloc: id, task: 1, node: n(0), reason: "cannot unpack".into(), seq: 1 }]
    );
    assert!(f.task(id, 1).checkpoints.is_empty());
    assert_eq!(f.s.checkpoints_to_delete(&n(1)).count(), 1, "its bytes are deleted by its writer");
    assert_eq!(f.status(id), AllocStatus::Running);
    assert_eq!(f.attempts(id), vec![2, 1], "only task 0's own failure is charged");
    assert!(matches!(f.rejected(drop(1, "x".repeat(2_000))), Rejection::InvalidNode { .. }));
}

#[test]
fn checkpoints_over_the_cap_or_of_a_no_checkpoint_allocation_are_refused() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 8);
    f.fail(id, 0, 0, epoch);
    let cap = DEFAULT_MAX_CHECKPOINT_BYTES;
    let save = |alloc, task, node, epoch, bytes| Command::SaveCheckpoint {
        alloc,
        task,
        node: n(node),
        epoch,
        manifest: manifest(alloc, task, "c", bytes),
    };
    let err = f.rejected(save(id, 1, 1, 1, cap + 1));
    assert_eq!(err, Rejection::CheckpointTooLarge { alloc: id, task: 1, bytes: cap + 1, limit: cap });
    assert!(err.to_string().contains("over the 68719476736-byte limit"), "{err}");
    f.ok(save(id, 1, 1, 1, cap));
    // Only a preempting task may save.
    assert_eq!(
        f.rejected(save(id, 0, 0, 0, 1)),
        Rejection::WrongTaskStatus {
            alloc: id,
            task: 0,
            status: TaskStatus::Blocked,
            expected: TaskStatus::Preempting
        }
    );
    let none = f.submit(AllocSpec { checkpoint: CheckpointMode::None, ..spec(1, 0) });
    assert_eq!(f.rejected(save(none, 0, 0, 0, 1)), Rejection::CheckpointDisabled { alloc: none });
    // A vCluster's own cap wins over the cluster's.
    let mut vspec = VClusterSpec::default_for("small");
    vspec.checkpoints = VcCheckpoints { store: None, max_bytes: Some(2 << 20) };
    vspec.borrow_limit_pct = 100;
    f.ok(Command::CreateVCluster { name: "small".into(), spec: vspec, by: "admin-a".into() });
    let small = f.submit(AllocSpec { vcluster: "small".into(), ..spec(1, 8) });
    let epoch = f.reserve(small, &[0]);
    f.start(small, 0, 0, epoch);
    let exit = |bytes| Command::SaveExitCheckpoint {
        alloc: small,
        task: 0,
        node: n(0),
        epoch,
        manifest: manifest(small, 0, "c", bytes),
    };
    assert_eq!(
        f.rejected(exit((2 << 20) + 1)),
        Rejection::CheckpointTooLarge { alloc: small, task: 0, bytes: (2 << 20) + 1, limit: 2 << 20 }
    );
    f.ok(exit(2 << 20));
}

#[test]
fn force_teardown_moves_stuck_tasks_and_completes_in_the_same_command() {
    let mut f = Fixture::new(3);
    let (id, epoch) = f.running(3, 8);
    f.t = 10_000;
    f.fail(id, 0, 0, epoch);
    f.ack(id, 1, 1, 1);
    assert_eq!(crate::policy::plan_forced_teardowns(&f.s, 54_999, 45_000, &Default::default()), vec![]);
    let plan = crate::policy::plan_forced_teardowns(&f.s, 55_000, 45_000, &Default::default());
    assert_eq!(plan, vec![Command::ForceTeardown { alloc: id, epoch: 1 }]);
    assert_eq!(
        f.rejected(Command::ForceTeardown { alloc: id, epoch: 2 }),
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
    assert_eq!(f.rejected(Command::ForceTeardown { alloc: id, epoch: 1 }), Rejection::NotTearingDown { alloc: id });
    // The late ack of the forced task is refused: the task is blocked now.
    assert!(matches!(
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 2, node: n(2), epoch: 1, checkpoint_failed: false }),
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
        f.rejected(Command::ConfirmPreempted { alloc: id, task: 1, node: n(1), epoch: 1, checkpoint_failed: false }),
        Rejection::StalePreemptionEpoch { alloc: id, current: 2, got: 1 }
    );
    f.ack(id, 1, 1, 2);
    let ev = f.ack(id, 2, 2, 2);
    assert_eq!(ev.last(), Some(&Event::AllocationCancelled { alloc: id, stopped: vec![(1, n(1)), (2, n(2))] }));
    assert!(f.s.alloc(id).unwrap().teardown.is_none());
    assert_eq!((f.used_gpus(1), f.used_gpus(2)), (0, 0));
    assert_eq!(f.status(id), AllocStatus::Cancelled);
}

#[test]
fn a_job_may_choose_only_node_or_a_store_within_one_an_operator_configured() {
    let mut f = Fixture::new(1);
    let with = |store: &str| AllocSpec { checkpoint_store: Some(CheckpointStore::parse(store).unwrap()), ..spec(1, 1) };
    f.submit(with("node"));
    let refused = f.rejected(Command::Submit { spec: with("/etc/cron.d") });
    assert!(matches!(&refused, Rejection::InvalidSpec { field, .. } if field == "checkpoint_store"), "{refused:?}");
    let settings = CheckpointSettings { store: CheckpointStore::parse("/mnt/ckpt").unwrap(), ..Default::default() };
    f.ok(Command::SetCheckpointSettings { settings, by: "admin-a".into() });
    f.submit(with("/mnt/ckpt/team-a"));
    assert!(matches!(f.rejected(Command::Submit { spec: with("/mnt/ckpt-other") }), Rejection::InvalidSpec { .. }));
    // A vCluster's store is allowed too.
    let mut vspec = VClusterSpec::default_for("ml");
    vspec.checkpoints.store = Some(CheckpointStore::parse("s3://bucket/ml").unwrap());
    f.ok(Command::CreateVCluster { name: "ml".into(), spec: vspec, by: "admin-a".into() });
    f.submit(with("s3://bucket/ml/alice"));
}
