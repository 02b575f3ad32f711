//! Node lifecycle: every transition of docs/nodes.md's table, accepted where
//! the table allows it and refused (typed, changing nothing) everywhere else;
//! drains that complete, time out, are cancelled; retries on a draining node.

use super::*;

/// What an operator (or the leader) can ask of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Ready,
    Drain,
    CancelDrain,
    ExpireDrain,
    Stop,
    Restart,
    Terminate,
    Lose,
}

const ACTIONS: [Action; 8] = [
    Action::Ready,
    Action::Drain,
    Action::CancelDrain,
    Action::ExpireDrain,
    Action::Stop,
    Action::Restart,
    Action::Terminate,
    Action::Lose,
];

fn command(action: Action, node: NodeId) -> Command {
    let by = "ops".to_string();
    match action {
        Action::Ready => Command::MarkNodeReady { node },
        Action::Drain => Command::DrainNode { node, timeout_ms: 60_000, reason: "scale-down".into(), by },
        Action::CancelDrain => Command::CancelDrain { node, by },
        Action::ExpireDrain => Command::ExpireDrain { node },
        Action::Stop => Command::StopNode { node, reason: String::new(), by },
        Action::Restart => Command::RestartNode { node, by },
        Action::Terminate => Command::TerminateNode { node, by },
        Action::Lose => Command::MarkNodeLost { node },
    }
}

/// The table of docs/nodes.md: the status a node in `from` ends in after
/// `action`, `Err(true)` where the node's tasks stop it (busy), or
/// `Err(false)` where the transition is illegal. Draining and stopping
/// nodes always hold a task here (an empty one has stopped).
fn table(from: NodeStatus, action: Action) -> Result<NodeStatus, bool> {
    use NodeStatus::*;
    match (from, action) {
        (Pending, Action::Ready) => Ok(Ready),
        (Ready, Action::Drain) => Ok(Draining),
        (Draining, Action::CancelDrain) => Ok(Ready),
        (Draining, Action::ExpireDrain) => Ok(Stopping),
        (Ready | Lost, Action::Stop) => Ok(Stopped),
        (Draining | Stopping, Action::Stop) => Err(true),
        (Stopped, Action::Restart) => Ok(Ready),
        (Stopped, Action::Terminate) => Ok(Terminated),
        (Ready, Action::Lose) => Ok(Lost),
        (Draining | Stopping, Action::Lose) => Ok(Stopped),
        _ => Err(false),
    }
}

impl Fixture {
    fn node_status(&self, i: u32) -> NodeStatus {
        self.s.node(self.s.node_slot(&n(i)).unwrap()).status
    }

    fn node_of(&self, i: u32) -> &Node {
        self.s.node(self.s.node_slot(&n(i)).unwrap())
    }

    /// Registers node `i` and brings it to `status` (draining and stopping
    /// nodes hold a running single task; the clock may move).
    fn node_in(&mut self, i: u32, status: NodeStatus) {
        self.ok(Command::RegisterNode { node: n(i), resources: GPU_NODE, labels: BTreeMap::new() });
        if status == NodeStatus::Pending {
            return;
        }
        self.ok(Command::MarkNodeReady { node: n(i) });
        match status {
            NodeStatus::Ready => {}
            NodeStatus::Draining | NodeStatus::Stopping | NodeStatus::Lost => {
                self.running_on(1, 1, 0, &[i]);
                if status == NodeStatus::Lost {
                    self.ok(Command::MarkNodeLost { node: n(i) });
                    return;
                }
                self.ok(command(Action::Drain, n(i)));
                if status == NodeStatus::Stopping {
                    self.t += 60_000;
                    self.ok(Command::ExpireDrain { node: n(i) });
                }
            }
            NodeStatus::Stopped | NodeStatus::Terminated => {
                self.ok(command(Action::Stop, n(i)));
                if status == NodeStatus::Terminated {
                    self.ok(command(Action::Terminate, n(i)));
                }
            }
            NodeStatus::Pending => unreachable!(),
        }
        assert_eq!(self.node_status(i), status);
    }
}

#[test]
fn every_legal_transition_is_accepted_and_every_other_refused_with_a_typed_error() {
    let (mut legal, mut illegal) = (0, 0);
    for from in NodeStatus::ALL {
        for action in ACTIONS {
            let mut f = Fixture::new(0);
            f.node_in(0, from);
            if action == Action::ExpireDrain {
                f.t += 60_000; // past any deadline
            }
            if (from, action) == (NodeStatus::Ready, Action::Drain) {
                f.running_on(1, 1, 0, &[0]); // an empty node would stop at once
            }
            match table(from, action) {
                Ok(to) => {
                    legal += 1;
                    f.ok(command(action, n(0)));
                    assert_eq!(f.node_status(0), to, "{from:?} --{action:?}-->");
                    assert_eq!(f.node_of(0).status_since_ms, f.t);
                }
                Err(true) => match f.rejected(command(action, n(0))) {
                    Rejection::NodeBusy { node, tasks: 1 } if node == n(0) => {}
                    other => panic!("{from:?} --{action:?}--> refused with {other}"),
                },
                Err(false) => {
                    illegal += 1;
                    match f.rejected(command(action, n(0))) {
                        Rejection::IllegalNodeTransition { node, from: got, allowed, .. } => {
                            assert_eq!((node, got), (n(0), from));
                            assert!(!allowed.contains(&from));
                        }
                        other => panic!("{from:?} --{action:?}--> refused with {other}"),
                    }
                }
            }
        }
    }
    assert_eq!((legal, illegal), (11, 43));
    // Unknown nodes are named.
    let mut f = Fixture::new(0);
    for action in ACTIONS {
        assert_eq!(f.rejected(command(action, n(7))), Rejection::UnknownNode(n(7)));
    }
}

#[test]
fn refusals_name_the_status_and_what_is_allowed() {
    let mut f = Fixture::new(1);
    f.ok(command(Action::Stop, n(0)));
    let r = f.rejected(command(Action::Drain, n(0)));
    assert_eq!(r.to_string(), "node n0 is stopped: cannot drain (allowed from ready)");
    let r = f.rejected(command(Action::CancelDrain, n(0)));
    assert_eq!(r.to_string(), "node n0 is stopped: cannot cancel a drain (allowed from draining)");
}

#[test]
fn a_drained_node_keeps_its_running_task_takes_no_new_work_and_stops_when_empty() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(1, 2); // on n0
    let ev = f.ok(command(Action::Drain, n(0)));
    assert_eq!(
        ev,
        vec![Event::DrainStarted {
            node: n(0),
            by: "ops".into(),
            reason: "scale-down".into(),
            deadline_ms: 61_000,
            tasks: 1
        }]
    );
    let drain = f.node_of(0).drain.clone().unwrap();
    assert_eq!((drain.started_at_ms, drain.deadline_ms, drain.by.as_str()), (1_000, 61_000, "ops"));
    let slot = f.s.node_slot(&n(0)).unwrap();
    assert!(!f.s.free_gpu_index().iter().any(|&(_, _, s)| s == slot), "a draining node is out of placement");
    let other = f.submit(spec(1, 1));
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: other, epoch: 1, nodes: vec![n(0)] }),
        Rejection::NodeNotReady(n(0))
    );
    assert_eq!(f.status(id), AllocStatus::Running);
    // Its last task finishes: the node stops.
    f.t = 5_000;
    let ev = f.ok(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch });
    assert!(ev.contains(&Event::DrainCompleted { node: n(0), drain_ms: 4_000 }), "{ev:?}");
    assert!(
        ev.contains(&Event::NodeStopped {
            node: n(0),
            by: None,
            reason: "drain completed: no work left".into(),
            drain_ms: Some(4_000)
        }),
        "{ev:?}"
    );
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
    assert_eq!(f.node_of(0).drain, None);
    let kinds: Vec<&Event> = f.node_of(0).history.iter().map(|h| &h.event).collect();
    assert!(
        matches!(
            kinds[..],
            [
                Event::NodeRegistered { .. },
                Event::NodeReady { .. },
                Event::DrainStarted { .. },
                Event::DrainCompleted { .. },
                Event::NodeStopped { .. }
            ]
        ),
        "{kinds:?}"
    );
    assert_eq!(f.node_of(0).revision, 5);
}

#[test]
fn draining_an_empty_node_stops_it_in_the_same_command() {
    let mut f = Fixture::new(1);
    let ev = f.ok(command(Action::Drain, n(0)));
    assert!(
        matches!(
            ev[..],
            [
                Event::DrainStarted { tasks: 0, .. },
                Event::DrainCompleted { drain_ms: 0, .. },
                Event::NodeStopped { .. }
            ]
        ),
        "{ev:?}"
    );
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
}

#[test]
fn cancel_drain_returns_the_node_to_service_and_records_who() {
    let mut f = Fixture::new(1);
    f.running(1, 1);
    f.ok(command(Action::Drain, n(0)));
    let ev = f.ok(Command::CancelDrain { node: n(0), by: "bob".into() });
    assert_eq!(ev, vec![Event::DrainCancelled { node: n(0), by: "bob".into() }]);
    assert_eq!(f.node_status(0), NodeStatus::Ready);
    assert_eq!(f.node_of(0).drain, None);
    let slot = f.s.node_slot(&n(0)).unwrap();
    assert!(f.s.free_gpu_index().iter().any(|&(_, _, s)| s == slot), "ready again: back in placement");
    let other = f.submit(spec(1, 1));
    f.reserve(other, &[0]);
}

#[test]
fn at_the_deadline_a_gang_on_the_node_is_preempted_with_a_checkpoint_hint_and_suspended_uncharged() {
    let mut f = Fixture::new(4);
    let (id, _) = f.running(2, 4); // n0, n1
    f.ok(Command::DrainNode { node: n(0), timeout_ms: 5_000, reason: String::new(), by: "ops".into() });
    f.t = 5_999;
    assert_eq!(
        f.rejected(Command::ExpireDrain { node: n(0) }),
        Rejection::DrainNotExpired { node: n(0), deadline_ms: 6_000 }
    );
    f.t = 6_000;
    let ev = f.ok(Command::ExpireDrain { node: n(0) });
    assert_eq!(ev[0], Event::DrainTimedOut { node: n(0), allocs: vec![id] });
    let Event::TeardownStarted { cause: TeardownCause::NodeDrain, preempting, epoch, .. } = &ev[1] else {
        panic!("{ev:?}")
    };
    assert_eq!(preempting, &vec![(0, n(0)), (1, n(1))], "the whole gang stops: its peers cannot run alone");
    assert!(f.s.alloc(id).unwrap().teardown.unwrap().asks_checkpoint());
    assert_eq!(f.node_status(0), NodeStatus::Stopping);
    assert_eq!(f.task(id, 0).attempts, 0, "refunded: a drain is not the gang's fault");
    // Both tasks checkpoint and ack: the gang is suspended; n0 stops.
    f.ok(Command::SaveCheckpoint { alloc: id, task: 0, node: n(0), epoch: *epoch, manifest: manifest(id, 0, "c", 2) });
    f.ack(id, 0, 0, *epoch);
    assert_eq!(f.node_status(0), NodeStatus::Stopped, "it holds nothing; the gang's task on n1 is not its business");
    let ev = f.ack(id, 1, 1, *epoch);
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::TeardownCompleted { outcome: TeardownOutcome::Suspended, cause: TeardownCause::NodeDrain, .. }
        )),
        "{ev:?}"
    );
    assert_eq!(f.status(id), AllocStatus::Suspended);
    assert_eq!(f.attempts(id), vec![0, 0]);
    assert_eq!(f.task(id, 0).checkpoints.len(), 1, "it resumes from its checkpoint");
    // It resumes elsewhere, never on the stopping node.
    let epoch = f.s.alloc(id).unwrap().reservation_epoch + 1;
    assert_eq!(
        f.rejected(Command::ReserveGang { alloc: id, epoch, nodes: vec![n(0), n(2)] }),
        Rejection::NodeNotReady(n(0))
    );
    // Its checkpoint is on the stopped node's disk, whose agent may still
    // serve it; once the node is terminated it is out of reach, so the
    // attempt starts afresh, and says so.
    assert_eq!(crate::sync::restore_list(&f.s, f.task(id, 0), &n(2)).len(), 1);
    let cfg = crate::policy::PreemptionConfig::default();
    let notes = crate::policy::explain(&f.s, id, f.t, &cfg).unwrap().checkpoints;
    assert_eq!(notes, ["task 0 resumes from checkpoint 1 (2 B, attempt 1, on n0's disk)"]);
    f.ok(Command::TerminateNode { node: n(0), by: "ops".into() });
    let notes = crate::policy::explain(&f.s, id, f.t, &cfg).unwrap().checkpoints;
    assert_eq!(notes, ["task 0's checkpoints are on n0, which is gone: it starts afresh"]);
    let ev = f.ok(Command::ReserveGang { alloc: id, epoch, nodes: vec![n(2), n(3)] });
    assert!(
        ev.contains(&Event::CheckpointUnreachable { alloc: id, task: 0, seq: 1, writer: n(0), from: None }),
        "{ev:?}"
    );
    assert!(crate::sync::restore_list(&f.s, f.task(id, 0), &n(2)).is_empty());
}

#[test]
fn the_stopping_node_stops_when_its_last_preempted_task_leaves() {
    let mut f = Fixture::new(2);
    let (id, _) = f.running(1, 1);
    f.ok(Command::DrainNode { node: n(0), timeout_ms: 0, reason: String::new(), by: "ops".into() });
    let ev = f.ok(Command::ExpireDrain { node: n(0) });
    let epoch = f.s.alloc(id).unwrap().preemption_epoch;
    assert!(matches!(ev[1], Event::TeardownStarted { cause: TeardownCause::NodeDrain, .. }));
    let ev = f.ack(id, 0, 0, epoch);
    assert!(
        ev.contains(&Event::NodeStopped {
            node: n(0),
            by: None,
            reason: "drain deadline passed: its remaining work was moved".into(),
            drain_ms: Some(0)
        }),
        "{ev:?}"
    );
    assert!(!ev.iter().any(|e| matches!(e, Event::DrainCompleted { .. })), "it timed out, not completed");
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
}

#[test]
fn at_the_deadline_an_unclaimed_reservation_there_is_requeued_uncharged() {
    let mut f = Fixture::new(2);
    let id = f.submit(spec(1, 1));
    f.reserve(id, &[0]);
    f.ok(Command::DrainNode { node: n(0), timeout_ms: 0, reason: String::new(), by: "ops".into() });
    let ev = f.ok(Command::ExpireDrain { node: n(0) });
    assert!(ev.contains(&Event::GangRequeued { alloc: id }), "{ev:?}");
    assert_eq!(f.status(id), AllocStatus::Queued);
    assert_eq!(f.task(id, 0).attempts, 0);
    assert_eq!(f.node_status(0), NodeStatus::Stopped, "nothing was left there: stopped in the same command");
}

#[test]
fn a_single_task_failing_on_its_draining_node_is_retried_there_three_times_then_requeued() {
    let mut f = Fixture::new(2);
    let mut sp = spec(1, 1);
    sp.max_retries = 10;
    let id = f.submit(sp);
    let mut epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    f.ok(command(Action::Drain, n(0)));
    for retry in 1..=3 {
        let ev = f.fail(id, 0, 0, epoch);
        epoch += 1;
        assert_eq!(
            ev,
            vec![
                Event::TaskFailed { alloc: id, task: 0, exit_code: Some(1), charged: true },
                Event::RetriedOnDrainingNode { alloc: id, task: 0, node: n(0), epoch, retry },
            ]
        );
        assert_eq!(f.task(id, 0).status, TaskStatus::Reserved);
        assert_eq!(f.task(id, 0).reservation_epoch, epoch);
        assert_eq!(f.used_gpus(0), 1, "its capacity never left the node");
        assert_eq!(f.node_status(0), NodeStatus::Draining);
        // A stale claim of the failed attempt is refused; the new one starts.
        assert!(matches!(
            f.rejected(Command::StartTask { alloc: id, task: 0, node: n(0), epoch: epoch - 1 }),
            Rejection::StaleTaskEpoch { .. }
        ));
        f.start(id, 0, 0, epoch);
    }
    // The fourth failure goes back to the queue (elsewhere); the node empties and stops.
    let ev = f.fail(id, 0, 0, epoch);
    assert!(ev.contains(&Event::GangRequeued { alloc: id }), "{ev:?}");
    assert_eq!(f.task(id, 0).attempts, 4);
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
    f.reserve(id, &[1]);
    assert_eq!(f.task(id, 0).drain_retries, 0, "a new placement starts a new count");
}

#[test]
fn a_task_out_of_retries_on_a_draining_node_fails_instead_of_retrying() {
    let mut f = Fixture::new(1);
    let mut sp = spec(1, 1);
    sp.max_retries = 1;
    let id = f.submit(sp);
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    f.ok(command(Action::Drain, n(0)));
    let ev = f.fail(id, 0, 0, epoch);
    assert!(ev.iter().any(|e| matches!(e, Event::AllocationFailed { .. })), "{ev:?}");
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
}

#[test]
fn a_gang_task_failing_on_a_draining_node_goes_through_teardown() {
    let mut f = Fixture::new(2);
    let (id, epoch) = f.running(2, 1);
    f.ok(command(Action::Drain, n(0)));
    let ev = f.fail(id, 0, 0, epoch);
    assert!(
        ev.iter().any(|e| matches!(e, Event::TeardownStarted { cause: TeardownCause::TaskFailed { trigger: 0 }, .. })),
        "{ev:?}"
    );
    assert!(!ev.iter().any(|e| matches!(e, Event::RetriedOnDrainingNode { .. })));
    assert_eq!(f.node_status(0), NodeStatus::Stopped, "its task left: the drain completed");
}

#[test]
fn no_retry_on_a_stopping_node() {
    let mut f = Fixture::new(2);
    let mut sp = spec(1, 1);
    sp.max_retries = 10;
    let id = f.submit(sp);
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    f.ok(Command::DrainNode { node: n(0), timeout_ms: 0, reason: String::new(), by: "ops".into() });
    f.ok(Command::ExpireDrain { node: n(0) });
    // Its process fails on the way down: it has simply stopped.
    let ev = f.fail(id, 0, 0, epoch);
    assert!(!ev.iter().any(|e| matches!(e, Event::RetriedOnDrainingNode { .. })), "{ev:?}");
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
    assert_eq!(f.status(id), AllocStatus::Suspended);
}

#[test]
fn a_draining_node_that_goes_silent_is_stopped_not_lost() {
    let mut f = Fixture::new(2);
    let (id, _) = f.running(1, 1);
    f.ok(command(Action::Drain, n(0)));
    let ev = f.ok(Command::MarkNodeLost { node: n(0) });
    assert!(ev.iter().any(|e| matches!(e, Event::NodeStopped { by: None, .. })), "{ev:?}");
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
    assert_eq!(f.status(id), AllocStatus::Queued);
    // Its agent coming back does not return it to service.
    f.ok(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels: BTreeMap::new() });
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
}

#[test]
fn a_stopped_node_restarts_only_on_request_and_a_terminated_one_never_registers_again() {
    let mut f = Fixture::new(1);
    f.ok(command(Action::Stop, n(0)));
    f.ok(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels: BTreeMap::new() });
    assert_eq!(f.node_status(0), NodeStatus::Stopped);
    assert_eq!(f.ok(command(Action::Restart, n(0))), vec![Event::NodeRestarted { node: n(0), by: "ops".into() }]);
    assert_eq!(f.node_status(0), NodeStatus::Ready);
    f.ok(command(Action::Stop, n(0)));
    f.ok(command(Action::Terminate, n(0)));
    assert_eq!(
        f.rejected(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels: BTreeMap::new() }),
        Rejection::NodeTerminated(n(0))
    );
}

#[test]
fn draining_a_held_node_lets_the_preemptor_go() {
    let mut f = Fixture::new(1);
    let (victim, epoch) = f.running_on(1, 8, 1, &[0]);
    let p = f.queued(1, 8, 5);
    assert!(f.preempt(p, &[(victim, epoch)], &[0]).is_accepted());
    let ev = f.ok(command(Action::Drain, n(0)));
    assert!(ev.iter().any(|e| matches!(e, Event::NominationDropped { alloc, .. } if *alloc == p)), "{ev:?}");
    assert_eq!(f.s.held_for(f.s.node_slot(&n(0)).unwrap()), None);
    assert!(f.s.alloc(p).unwrap().nomination.is_none());
}

#[test]
fn lifecycle_requests_are_validated_by_field() {
    let mut f = Fixture::new(1);
    fn bad(field: &'static str) -> impl Fn(Rejection) -> bool {
        move |r| matches!(r, Rejection::InvalidNode { field: got, .. } if got == field)
    }
    let drain = |timeout_ms, reason: &str, by: &str| Command::DrainNode {
        node: n(0),
        timeout_ms,
        reason: reason.into(),
        by: by.into(),
    };
    assert!(bad("by")(f.rejected(drain(1_000, "", ""))));
    assert!(bad("reason")(f.rejected(drain(1_000, &"x".repeat(MAX_REASON_BYTES + 1), "ops"))));
    assert!(bad("reason")(f.rejected(drain(1_000, "a\nb", "ops"))));
    assert!(bad("timeout")(f.rejected(drain(u64::MAX, "", "ops"))));
    assert!(bad("by")(f.rejected(Command::StopNode { node: n(0), reason: String::new(), by: String::new() })));
    // The drain timeout is an admin's label (a node may not report it),
    // and its value is checked when it is set.
    let labels = BTreeMap::from([(DRAIN_TIMEOUT_LABEL.to_string(), "4 weeks".to_string())]);
    assert!(bad("labels")(f.rejected(Command::RegisterNode {
        node: n(1),
        resources: GPU_NODE,
        labels: labels.clone()
    })));
    let set = Command::LabelNode { node: n(0), set: labels, remove: vec![], by: "ops".into() };
    assert!(bad("labels.muster.drain-timeout")(f.rejected(set)));
    // A label value that displays in another order than it compares (the
    // probe's U+202E) is refused, as is a bidirectional control in a name.
    let labels = BTreeMap::from([("gpu.model".to_string(), "H100\u{202E}".to_string())]);
    assert!(bad("labels")(f.rejected(Command::RegisterNode { node: n(1), resources: GPU_NODE, labels })));
    let labels = BTreeMap::new();
    let node = NodeId::new("gpu\u{2066}01");
    assert!(bad("node_id")(f.rejected(Command::RegisterNode { node, resources: GPU_NODE, labels })));
}
