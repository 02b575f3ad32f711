//! Failing fast: the same early failure twice ends the gang; the retry budget
//! is the gang's; retries back off and never preempt.

use super::*;
use crate::policy::{AdmissionConfig, PreemptionConfig, plan_admission, plan_preemptions};

fn fail_with(f: &mut Fixture, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64, tail: &str) -> Vec<Event> {
    f.ok(Command::FailTaskWithTail { alloc, task, node: n(node), epoch, exit_code: Some(2), tail: tail.into() })
}

/// Where python says a script is missing, as on node `node`'s work dir.
fn missing(node: u32) -> String {
    format!("python3: can't open file '/var/lib/muster/n{node}/work/train.py': [Errno 2] No such file or directory")
}

/// The gang's tasks that still run stop on their own (they fail while
/// being torn down, as ranks do when a peer dies).
fn siblings_fail(f: &mut Fixture, id: AllocId) {
    let stopping: Vec<(TaskIndex, u32, u64)> =
        f.s.alloc(id)
            .unwrap()
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempting)
            .map(|t| (t.index, t.node.unwrap().0, t.reservation_epoch))
            .collect();
    for (task, slot, epoch) in stopping {
        let node = f.s.node(NodeSlot(slot)).id.as_str()[1..].parse().unwrap();
        fail_with(f, id, task, node, epoch, &missing(node));
    }
}

fn place_all(f: &mut Fixture, id: AllocId, nodes: &[u32]) -> u64 {
    let epoch = f.reserve(id, nodes);
    for (i, &node) in nodes.iter().enumerate() {
        f.start(id, i as TaskIndex, node, epoch);
    }
    epoch
}

#[test]
fn a_gang_that_fails_the_same_way_twice_at_start_fails_with_the_error() {
    let mut f = Fixture::new(4);
    let id = f.submit(AllocSpec { max_retries: 10, ..spec(4, 8) });
    let epoch = place_all(&mut f, id, &[0, 1, 2, 3]);
    f.t += 300;
    fail_with(&mut f, id, 0, 0, epoch, &missing(0));
    siblings_fail(&mut f, id);
    assert_eq!(f.status(id), AllocStatus::Queued);
    let a = f.s.alloc(id).unwrap();
    assert_eq!((a.failures, a.give_up.as_deref()), (1, None));
    assert!(a.last_failure.as_ref().unwrap().early);
    // The second run fails first on another task and node: the same error
    // but for the node's path.
    f.t = a.retry_after_ms;
    let epoch = place_all(&mut f, id, &[1, 2, 3, 0]);
    f.t += 500;
    let events = fail_with(&mut f, id, 2, 3, epoch, &missing(3));
    assert!(events.iter().any(|e| matches!(e, Event::TeardownStarted { .. })), "{events:?}");
    siblings_fail(&mut f, id);
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Failed, "two identical early failures end it, with 8 retries left");
    assert_eq!(a.failures, 2);
    let reason = a.give_up.as_deref().unwrap();
    assert_eq!(
        reason,
        "task 2 failed the same way twice within 10 s of starting (exit code 2): python3: can't open file \
         '/var/lib/muster/n3/work/train.py': [Errno 2] No such file or directory"
    );
    assert!(a.history.iter().any(|e| matches!(&e.event, Event::AllocationFailed { reason: r, .. } if r == reason)));
}

#[test]
fn a_start_that_fails_twice_the_same_way_fails_the_allocation() {
    let mut f = Fixture::new(1);
    let id = f.submit(AllocSpec { max_retries: 5, ..spec(1, 1) });
    let why = "could not start \"trian.py\": No such file or directory (os error 2)";
    for round in 1..=2 {
        let epoch = place_all(&mut f, id, &[0]);
        f.ok(Command::FailTaskToStart { alloc: id, task: 0, node: n(0), epoch, reason: why.into() });
        f.t = f.t.max(f.s.alloc(id).unwrap().retry_after_ms);
        let expected = if round == 1 { AllocStatus::Queued } else { AllocStatus::Failed };
        assert_eq!(f.status(id), expected, "round {round}");
    }
    let a = f.s.alloc(id).unwrap();
    assert!(a.give_up.as_deref().unwrap().ends_with(&format!("(did not start): {why}")), "{:?}", a.give_up);
}

#[test]
fn failures_that_differ_or_come_late_keep_their_budget_which_is_the_gangs() {
    let mut f = Fixture::new(3);
    let id = f.submit(AllocSpec { max_retries: 3, ..spec(3, 8) });
    // Run 1: task 0 fails late; run 2: task 1 fails early; run 3: task 2
    // fails early with another error. Three different tasks, one failure
    // each: per-task counting would allow 9 runs; the gang's budget is 3.
    let runs: [(TaskIndex, u64, &str); 3] =
        [(0, 60_000, "CUDA error: an illegal memory access"), (1, 100, "NCCL timeout"), (2, 100, "Killed")];
    for (run, (task, after_ms, tail)) in runs.into_iter().enumerate() {
        let epoch = place_all(&mut f, id, &[0, 1, 2]);
        f.t += after_ms;
        fail_with(&mut f, id, task, task, epoch, tail);
        for t in [0, 1, 2].into_iter().filter(|&t| t != task) {
            f.ack(id, t, t, f.task(id, t).preemption_epoch);
        }
        let a = f.s.alloc(id).unwrap();
        assert_eq!(a.failures, run as u32 + 1);
        assert_eq!(a.give_up, None, "run {run}: no two identical early failures in a row");
        if run < 2 {
            assert_eq!(a.status, AllocStatus::Queued, "run {run}");
            f.t = a.retry_after_ms;
        }
    }
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Failed);
    let failed = a.history.iter().find_map(|e| match &e.event {
        Event::AllocationFailed { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(failed.as_deref(), Some("the gang failed 3 times, task 2 last; last error: Killed"));
}

#[test]
fn the_same_failure_late_in_a_run_is_retried() {
    let mut f = Fixture::new(1);
    let id = f.submit(AllocSpec { max_retries: 5, ..spec(1, 1) });
    for _ in 0..3 {
        let epoch = place_all(&mut f, id, &[0]);
        f.t += 20_000;
        fail_with(&mut f, id, 0, 0, epoch, "Segmentation fault");
        assert_eq!(f.status(id), AllocStatus::Queued, "a failure 20 s in is not a start failure");
        f.t = f.s.alloc(id).unwrap().retry_after_ms;
    }
}

#[test]
fn a_failed_gang_backs_off_exponentially_and_the_leader_knows_when() {
    let mut f = Fixture::new(1);
    let id = f.submit(AllocSpec { max_retries: 100, ..spec(1, 1) });
    let cfg = AdmissionConfig::default();
    let mut waits = Vec::new();
    for run in 0..8u64 {
        let epoch = place_all(&mut f, id, &[0]);
        f.t += 30_000; // late failures: retried
        fail_with(&mut f, id, 0, 0, epoch, &format!("error {run}"));
        let after = f.s.alloc(id).unwrap().retry_after_ms;
        waits.push(after - f.t);
        assert_eq!(f.s.next_retry_after(f.t), Some(after));
        let early = plan_admission(&f.s, after - 1, &cfg);
        assert!(early.commands.is_empty() && early.stats.backoff_waits == 1, "{early:?}");
        let due = plan_admission(&f.s, after, &cfg);
        assert!(matches!(due.commands[..], [Command::ReserveGang { alloc, .. }] if alloc == id), "{due:?}");
        f.t = after;
    }
    assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]);
}

#[test]
fn a_gang_that_failed_before_never_preempts() {
    let mut f = Fixture::new(2);
    let (low, _) = f.running_on(1, 8, 1, &[0]);
    let mut sp = spec(2, 8);
    sp.preemption_class = 5;
    sp.max_retries = 5;
    let high = f.submit(sp);
    let cfg = PreemptionConfig::default();
    f.t += 600_000; // past its minimum runtime, far from its walltime's end
    // Before any failure it may preempt the class-1 job.
    assert_eq!(plan_preemptions(&f.s, f.t, &cfg).len(), 1);
    // It runs elsewhere after all, fails, and is queued again.
    f.ok(Command::CancelAllocation { alloc: low });
    f.ack(low, 0, 0, f.task(low, 0).preemption_epoch);
    let epoch = place_all(&mut f, high, &[0, 1]);
    f.t += 60_000;
    fail_with(&mut f, high, 0, 0, epoch, "RuntimeError: out of memory");
    f.ack(high, 1, 1, f.task(high, 1).preemption_epoch);
    f.t += 120_000;
    let (low2, low2_epoch) = f.running_on(1, 8, 1, &[0]);
    f.t += 600_000;
    assert_eq!(f.status(high), AllocStatus::Queued);
    assert!(plan_preemptions(&f.s, f.t, &cfg).is_empty(), "a retry waits for free nodes");
    let refused = f.preempt(high, &[(low2, low2_epoch)], &[0, 1]);
    assert!(
        matches!(&refused, Outcome::Rejected(Rejection::NotPreemptible { reason, .. }) if reason.contains("failed before")),
        "{refused:?}"
    );
    let e = crate::policy::explain(&f.s, high, f.t, &cfg).unwrap();
    assert!(matches!(e.preemption, Some(Err(crate::policy::NoPreemption::Retry { failures: 1 }))), "{e:?}");
}

#[test]
fn a_lost_node_spends_the_budget_but_neither_backs_off_nor_bars_preemption() {
    let mut f = Fixture::new(2);
    let (id, _) = f.running(1, 8);
    f.ok(Command::MarkNodeLost { node: n(0) });
    let a = f.s.alloc(id).unwrap();
    assert_eq!((a.status, a.failures, a.retry_after_ms, a.failed_before()), (AllocStatus::Queued, 1, 0, false));
}

#[test]
fn a_tail_over_the_limit_is_refused() {
    let mut f = Fixture::new(1);
    let (id, epoch) = f.running(1, 1);
    let tail = "x".repeat(MAX_FAILURE_TAIL_BYTES + 1);
    let r = f.rejected(Command::FailTaskWithTail { alloc: id, task: 0, node: n(0), epoch, exit_code: Some(1), tail });
    assert!(matches!(r, Rejection::InvalidNode { ref field, .. } if field == "tail"), "{r:?}");
}

#[test]
fn signatures_mask_paths_and_numbers_and_tails_keep_the_last_lines() {
    let failure = |tail: &str| Failure {
        task: 0,
        run: 1,
        exit_code: Some(1),
        not_started: false,
        tail: Some(tail.into()),
        early: true,
        at_ms: 0,
        oom: None,
    };
    let a = failure("rank 3: open /data/n1/x.bin failed after 12 tries");
    let b = failure("rank 0: open /data/n7/x.bin failed after 3 tries\n");
    let c = failure("rank 0: permission denied");
    assert_eq!(a.signature(), b.signature());
    assert_ne!(a.signature(), c.signature());
    assert_eq!(Failure { tail: None, ..a.clone() }.signature(), None, "no tail, nothing to compare");
    assert_eq!(a.error_line(), Some("rank 3: open /data/n1/x.bin failed after 12 tries"));
    let long: String = (0..20).map(|i| format!("line {i}\n\n")).collect();
    assert_eq!(failure_tail(&long), (12..20).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n"));
    let huge = format!("first\n{}é", "y".repeat(5_000));
    let cut = failure_tail(&huge);
    assert!(cut.len() <= MAX_FAILURE_TAIL_BYTES && cut.ends_with('é') && !cut.contains("first"), "{}", cut.len());
}
