//! Attempts' usage from their cgroups (`Command::Accounted`): kept with the
//! attempt and its history record; an OOM kill is an outcome of its own,
//! the job's failure (never the node's), and the same OOM twice in a row
//! fails the gang.

use super::*;
use crate::sm::{AttemptUsage, OomKill};

fn usage(peak_mb: u64, limit_mb: u64, oom_kills: u32) -> AttemptUsage {
    AttemptUsage {
        peak_memory_bytes: peak_mb << 20,
        cpu_ms: 2_500,
        oom_kills,
        memory_limit_bytes: limit_mb << 20,
        gpu_util_pct: Some(55),
        peak_gpu_memory_bytes: 3 << 30,
    }
}

fn oom_fail(f: &mut Fixture, id: AllocId, node: u32, epoch: u64) -> Vec<Event> {
    let tail =
        "muster: out of memory: the kernel killed 1 process(es) of this task at its 512 MiB limit (peak 512 MiB)";
    let report =
        Command::FailTaskWithTail { alloc: id, task: 0, node: n(node), epoch, exit_code: Some(137), tail: tail.into() };
    f.ok(Command::Accounted { usage: usage(512, 512, 1), report: Box::new(report) })
}

#[test]
fn usage_goes_with_the_attempt_and_into_its_history_record() {
    let mut f = Fixture::new(1);
    f.t = 10_000;
    let (id, epoch) = f.running(1, 1);
    f.t = 20_000;
    let report = Command::FinishTask { alloc: id, task: 0, node: n(0), epoch };
    let events = f.ok(Command::Accounted { usage: usage(300, 1024, 0), report: Box::new(report) });
    assert!(!events.iter().any(|e| matches!(e, Event::OutOfMemory { .. })), "{events:?}");
    assert_eq!(f.status(id), AllocStatus::Done);
    let a = f.s.alloc(id).unwrap();
    let attempt = &a.tasks[0].attempt_log[0];
    assert_eq!((attempt.end, attempt.usage), (AttemptEnd::Done, Some(usage(300, 1024, 0))));
    let records = f.s.take_finished_records();
    assert_eq!(records[0].attempts[0].usage, Some(usage(300, 1024, 0)));
}

#[test]
fn an_oom_kill_is_its_own_outcome_and_the_same_oom_twice_fails_the_gang() {
    let mut f = Fixture::new(2);
    let id = f.submit(AllocSpec { max_retries: 10, ..spec(1, 1) });
    f.t = 1_000;
    let epoch = f.reserve(id, &[0]);
    f.start(id, 0, 0, epoch);
    // Late (a minute in): the early-failure rule does not apply.
    f.t = 61_000;
    let events = oom_fail(&mut f, id, 0, epoch);
    let oom = events.iter().find_map(|e| match e {
        Event::OutOfMemory { task, node, run, limit_bytes, peak_bytes, .. } => {
            Some((*task, node.as_str().to_string(), *run, *limit_bytes, *peak_bytes))
        }
        _ => None,
    });
    assert_eq!(oom, Some((0, "n0".to_string(), 1, 512 << 20, 512 << 20)), "{events:?}");
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Queued, "retried: one OOM kill may be bad luck");
    assert_eq!(a.tasks[0].attempt_log[0].end, AttemptEnd::OomKilled);
    let failure = a.last_failure.clone().unwrap();
    assert_eq!(failure.oom, Some(OomKill { limit_bytes: 512 << 20, peak_bytes: 512 << 20 }));
    assert!(!failure.early);
    assert_eq!(failure.how(), "out of memory at its 512 MiB limit (peak 512 MiB), exit code 137");
    // The job's fault, not the node's: the node stays ready and uncharged.
    assert!(f.s.nodes().iter().all(|node| node.status == NodeStatus::Ready));
    assert_eq!(a.failures, 1);

    // The second run, on the other node, runs out at the same limit.
    f.t = a.retry_after_ms.max(f.t);
    let epoch = f.reserve(id, &[1]);
    f.start(id, 0, 1, epoch);
    f.t += 120_000;
    oom_fail(&mut f, id, 1, epoch);
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Failed, "a third run at that limit would end the same way");
    assert_eq!(
        a.give_up.as_deref(),
        Some("task 0 ran out of memory at its 512 MiB limit (peak 512 MiB) twice in a row: raise --mem-mb")
    );
    let ends: Vec<AttemptEnd> = a.tasks[0].attempt_log.iter().map(|at| at.end).collect();
    assert_eq!(ends, vec![AttemptEnd::OomKilled, AttemptEnd::OomKilled]);
}

#[test]
fn a_usage_report_carries_only_an_end_report() {
    let mut f = Fixture::new(1);
    let (id, epoch) = f.running(1, 1);
    let start = Command::StartTask { alloc: id, task: 0, node: n(0), epoch };
    let r = f.rejected(Command::Accounted { usage: usage(1, 1, 0), report: Box::new(start) });
    assert!(matches!(r, Rejection::NotAnEndReport { .. }), "{r:?}");
    let nested = Command::Accounted {
        usage: usage(1, 1, 0),
        report: Box::new(Command::FinishTask { alloc: id, task: 0, node: n(0), epoch }),
    };
    let r = f.rejected(Command::Accounted { usage: usage(1, 1, 0), report: Box::new(nested) });
    assert!(matches!(r, Rejection::NotAnEndReport { .. }), "{r:?}");
    // Another node's report is refused as the report alone would be, and
    // records nothing.
    let report = Command::FinishTask { alloc: id, task: 0, node: n(1), epoch };
    f.rejected(Command::Accounted { usage: usage(1, 1, 1), report: Box::new(report) });
    assert_eq!(f.s.alloc(id).unwrap().tasks[0].attempt_log[0].usage, None);
}
