//! Dependencies: a dependent waits, is queued when they are met, and fails
//! at once (in a cascade) when they never can be.

use super::*;
use crate::sm::{After, AfterWhen, Dependency};

fn after(deps: &[(AllocId, AfterWhen)]) -> After {
    After { deps: deps.iter().map(|&(on, when)| Dependency { on, when }).collect(), ..After::default() }
}

fn dependent(on: &[(AllocId, AfterWhen)]) -> AllocSpec {
    AllocSpec { after: after(on), ..spec(1, 1) }
}

fn failed_reason(f: &Fixture, id: AllocId) -> String {
    let a = f.s.alloc(id).unwrap();
    assert_eq!(a.status, AllocStatus::Failed);
    a.history
        .iter()
        .find_map(|e| match &e.event {
            Event::AllocationFailed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .expect("a failure event")
}

#[test]
fn a_dependent_waits_unplaced_and_is_queued_when_its_dependency_succeeds() {
    let mut f = Fixture::new(2);
    let (a, epoch) = f.running(1, 1);
    let b = f.submit(dependent(&[(a, AfterWhen::Ok)]));
    assert_eq!(f.status(b), AllocStatus::Waiting);
    assert_eq!(f.s.dependents_of(a).collect::<Vec<_>>(), [b]);
    assert_eq!((f.s.waiting().collect::<Vec<_>>(), f.s.waiting_len()), (vec![b], 1));
    // Not queued: admission cannot place it.
    let r = f.rejected(Command::ReserveGang { alloc: b, epoch: 1, nodes: vec![n(1)] });
    assert!(matches!(r, Rejection::NotQueued { status: AllocStatus::Waiting, .. }), "{r:?}");
    f.t += 5_000;
    let events = f.ok(Command::FinishTask { alloc: a, task: 0, node: n(0), epoch });
    assert!(events.contains(&Event::DependenciesMet { alloc: b }), "{events:?}");
    assert_eq!(f.status(b), AllocStatus::Queued);
    assert_eq!(f.s.alloc(b).unwrap().queued_since_ms, f.t, "it queues from when it was released");
    assert_eq!(f.s.dependents_of(a).count(), 0);
    assert_eq!(f.s.waiting_len(), 0);
    f.reserve(b, &[1]);
}

#[test]
fn a_dependency_that_fails_ends_its_dependents_at_once_in_a_cascade() {
    let mut f = Fixture::new(1);
    let a = f.submit(AllocSpec { max_retries: 1, ..spec(1, 1) });
    let b = f.submit(dependent(&[(a, AfterWhen::Ok)]));
    let c = f.submit(dependent(&[(b, AfterWhen::Ok)]));
    let d = f.submit(dependent(&[(b, AfterWhen::NotOk)]));
    let epoch = f.reserve(a, &[0]);
    f.start(a, 0, 0, epoch);
    let events = f.fail(a, 0, 0, epoch);
    assert_eq!(f.status(a), AllocStatus::Failed);
    assert_eq!(failed_reason(&f, b), format!("dependency {a} failed"));
    assert_eq!(failed_reason(&f, c), format!("dependency {b} failed"), "the cascade ran in the same command");
    assert!(events.contains(&Event::DependenciesMet { alloc: d }), "{events:?}");
    assert_eq!(f.status(d), AllocStatus::Queued, "notok is met by a failure");
    assert!(f.s.alloc(b).unwrap().tasks.iter().all(|t| t.status == TaskStatus::Failed));
}

#[test]
fn kept_dependents_wait_on_what_cannot_happen_until_cancelled() {
    let mut f = Fixture::new(1);
    let a = f.submit(spec(1, 1));
    let keep = AllocSpec { after: After { keep_if_unsatisfiable: true, ..after(&[(a, AfterWhen::Ok)]) }, ..spec(1, 1) };
    let b = f.submit(keep);
    f.ok(Command::CancelAllocation { alloc: a });
    assert_eq!(f.status(b), AllocStatus::Waiting, "kept waiting");
    let e = crate::policy::explain(&f.s, b, f.t, &Default::default()).unwrap();
    assert_eq!(
        e.summary,
        format!("kept waiting for {a} (cancelled) to succeed, which can never happen: dependency {a} was cancelled")
    );
    f.ok(Command::CancelAllocation { alloc: b });
    assert_eq!(f.status(b), AllocStatus::Cancelled);
    assert_eq!(f.s.dependents_of(a).count(), 0);
}

#[test]
fn started_any_and_any_of_are_met_when_they_say() {
    let mut f = Fixture::new(2);
    let a = f.submit(spec(1, 1));
    let z = f.submit(spec(1, 1));
    let started = f.submit(dependent(&[(a, AfterWhen::Started)]));
    let any = f.submit(dependent(&[(a, AfterWhen::Any)]));
    let first = AllocSpec {
        after: After { any_of: true, ..after(&[(z, AfterWhen::Ok), (a, AfterWhen::Started)]) },
        ..spec(1, 1)
    };
    let first = f.submit(first);
    let both = f.submit(dependent(&[(a, AfterWhen::Started), (z, AfterWhen::Any)]));
    let e = crate::policy::explain(&f.s, first, f.t, &Default::default()).unwrap();
    assert_eq!(e.summary, format!("waiting for the first of {z} (queued) to succeed, {a} (queued) to start"));
    let epoch = f.reserve(a, &[0]);
    assert_eq!(f.status(started), AllocStatus::Waiting, "reserved is not started");
    f.t += 60_000;
    let events = f.ok(Command::StartTask { alloc: a, task: 0, node: n(0), epoch });
    assert!(events.contains(&Event::DependenciesMet { alloc: started }), "{events:?}");
    assert!(events.contains(&Event::DependenciesMet { alloc: first }), "{events:?}");
    assert_eq!(f.status(any), AllocStatus::Waiting);
    assert_eq!(f.status(both), AllocStatus::Waiting, "all of a list: z has not ended");
    f.t += 120_000;
    let e = crate::policy::explain(&f.s, any, f.t, &Default::default()).unwrap();
    assert_eq!(
        e.summary,
        format!(
            "waiting for {a} (running 2 min of its 1 h walltime) to end; planned to be queued in 58 min, if they run to \
             their walltime; planned start in 58 min on n0"
        )
    );
    // One not started yet: no plan.
    let e = crate::policy::explain(&f.s, both, f.t, &Default::default()).unwrap();
    assert_eq!(
        e.summary,
        format!("waiting for {a} (running 2 min of its 1 h walltime) to start and {z} (queued) to end")
    );
    f.ok(Command::CancelAllocation { alloc: z });
    assert_eq!(f.status(both), AllocStatus::Queued);
    f.ok(Command::FailTask { alloc: a, task: 0, node: n(0), epoch, exit_code: Some(3) });
    f.ok(Command::CancelAllocation { alloc: a });
    assert_eq!(f.status(any), AllocStatus::Queued, "any: however it ends");
}

#[test]
fn dependencies_already_decided_at_submit_settle_it_at_once() {
    let mut f = Fixture::new(1);
    let a = f.submit(spec(1, 1));
    f.ok(Command::CancelAllocation { alloc: a });
    let met = f.ok(Command::Submit { spec: dependent(&[(a, AfterWhen::NotOk)]) });
    let Event::Submitted { alloc: b, .. } = met[0] else { panic!("{met:?}") };
    assert_eq!(met[1..], [Event::DependenciesMet { alloc: b }]);
    assert_eq!(f.status(b), AllocStatus::Queued);
    let never = f.ok(Command::Submit { spec: dependent(&[(a, AfterWhen::Ok)]) });
    let Event::Submitted { alloc: c, .. } = never[0] else { panic!("{never:?}") };
    assert_eq!(failed_reason(&f, c), format!("dependency {a} was cancelled"));
}

#[test]
fn a_dependency_must_name_an_existing_older_allocation() {
    let mut f = Fixture::new(1);
    let a = f.submit(spec(1, 1));
    let r = f.rejected(Command::Submit { spec: dependent(&[(a + 1, AfterWhen::Ok)]) });
    assert!(r.to_string().contains(&format!("after: allocation {} does not exist", a + 1)), "{r}");
    let r = f.rejected(Command::Submit { spec: dependent(&[(a, AfterWhen::Ok), (a, AfterWhen::Any)]) });
    assert!(r.to_string().contains(&format!("after: allocation {a} is named twice")), "{r}");
    let r = f.rejected(Command::Submit { spec: dependent(&[(0, AfterWhen::Ok)]) });
    assert!(r.to_string().contains("after: 0 is not an allocation id"), "{r}");
    let many: Vec<(AllocId, AfterWhen)> = (1..=65).map(|i| (i, AfterWhen::Any)).collect();
    let r = f.rejected(Command::Submit { spec: dependent(&many) });
    assert!(r.to_string().contains("65 dependencies; the most is 64"), "{r}");
    let flags = AllocSpec { after: After { any_of: true, ..After::default() }, ..spec(1, 1) };
    assert!(f.rejected(Command::Submit { spec: flags }).to_string().contains("need a dependency"));
}

#[test]
fn a_forgotten_dependencys_outcome_still_counts() {
    let mut f = Fixture::new(1);
    let (a, epoch) = f.running(1, 1);
    f.ok(Command::FinishTask { alloc: a, task: 0, node: n(0), epoch });
    f.t += 10 * 60_000;
    f.ok(Command::ForgetFinished { retention_ms: 60_000, key_window_ms: 0, max: 10 });
    assert!(f.s.alloc(a).is_none(), "forgotten");
    let ok = f.ok(Command::Submit { spec: dependent(&[(a, AfterWhen::Ok)]) });
    assert!(matches!(ok[1], Event::DependenciesMet { .. }), "{ok:?}");
    let notok = f.ok(Command::Submit { spec: dependent(&[(a, AfterWhen::NotOk)]) });
    let Event::Submitted { alloc, .. } = notok[0] else { panic!() };
    assert_eq!(failed_reason(&f, alloc), format!("dependency {a} succeeded"));
    // A snapshot keeps the tombstone.
    let back = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(back.dependency_standing(&Dependency { on: a, when: AfterWhen::Ok }), crate::sm::Standing::Met);
}

#[test]
fn a_waiting_allocation_survives_a_snapshot_with_its_index() {
    let mut f = Fixture::new(1);
    let (a, epoch) = f.running(1, 1);
    let b = f.submit(dependent(&[(a, AfterWhen::Ok)]));
    let mut back = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(back.dependents_of(a).collect::<Vec<_>>(), [b]);
    let out = back.apply(&Command::FinishTask { alloc: a, task: 0, node: n(0), epoch }, &ApplyCtx { time_ms: f.t });
    assert!(matches!(out, Outcome::Accepted(ref e) if e.contains(&Event::DependenciesMet { alloc: b })), "{out:?}");
}

mod reference {
    //! Random pipelines against a reference model: after every command,
    //! each allocation's status is what a direct reading of the rules says.

    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Dependencies as (how far back, kind), any_of, keep.
        Submit(Vec<(usize, u8)>, bool, bool),
        Start(usize),
        Finish(usize),
        Fail(usize),
        Cancel(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (prop::collection::vec((1usize..6, 0u8..4), 0..4), any::<bool>(), prop::bool::weighted(0.2))
                .prop_map(|(d, any_of, keep)| Op::Submit(d, any_of, keep)),
            2 => (0usize..64).prop_map(Op::Start),
            2 => (0usize..64).prop_map(Op::Finish),
            1 => (0usize..64).prop_map(Op::Fail),
            1 => (0usize..64).prop_map(Op::Cancel),
        ]
    }

    const KINDS: [AfterWhen; 4] = [AfterWhen::Ok, AfterWhen::Any, AfterWhen::NotOk, AfterWhen::Started];

    /// The model's allocation.
    #[derive(Clone, Debug)]
    struct M {
        status: AllocStatus,
        started: bool,
        deps: Vec<(usize, AfterWhen)>,
        any_of: bool,
        keep: bool,
    }

    /// The rules, read directly: `Some(true)` met, `Some(false)` never.
    fn stands(kind: AfterWhen, dep: &M) -> Option<bool> {
        use AllocStatus::{Cancelled, Done, Failed};
        match kind {
            AfterWhen::Ok if dep.status == Done => Some(true),
            AfterWhen::Ok if matches!(dep.status, Failed | Cancelled) => Some(false),
            AfterWhen::NotOk if matches!(dep.status, Failed | Cancelled) => Some(true),
            AfterWhen::NotOk if dep.status == Done => Some(false),
            AfterWhen::Any if dep.status.is_terminal() => Some(true),
            AfterWhen::Started if dep.started => Some(true),
            AfterWhen::Started if dep.status.is_terminal() => Some(false),
            _ => None,
        }
    }

    /// Settles every waiting allocation until nothing changes.
    fn settle(model: &mut [M]) {
        loop {
            let mut changed = false;
            for i in 0..model.len() {
                if model[i].status != AllocStatus::Waiting {
                    continue;
                }
                let each: Vec<Option<bool>> = model[i].deps.iter().map(|&(on, k)| stands(k, &model[on])).collect();
                let verdict = if model[i].any_of {
                    if each.contains(&Some(true)) {
                        Some(true)
                    } else if each.iter().all(|s| *s == Some(false)) {
                        Some(false)
                    } else {
                        None
                    }
                } else if each.contains(&Some(false)) {
                    Some(false)
                } else if each.iter().all(|s| *s == Some(true)) {
                    Some(true)
                } else {
                    None
                };
                match verdict {
                    Some(true) => model[i].status = AllocStatus::Queued,
                    Some(false) if !model[i].keep => model[i].status = AllocStatus::Failed,
                    _ => continue,
                }
                changed = true;
            }
            if !changed {
                return;
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn statuses_follow_a_reference_model(ops in prop::collection::vec(op(), 1..40)) {
            let mut f = Fixture::new(4);
            let mut model: Vec<M> = Vec::new();
            let mut epochs: Vec<u64> = Vec::new();
            let id = |i: usize| i as AllocId + 1;
            let node = |i: usize| (i % 4) as u32;
            for op in ops {
                f.t += 1_000;
                match op {
                    Op::Submit(back, any_of, keep) => {
                        let n = model.len();
                        let mut deps: Vec<(usize, AfterWhen)> = Vec::new();
                        for (b, k) in back {
                            if b <= n && !deps.iter().any(|d| d.0 == n - b) {
                                deps.push((n - b, KINDS[k as usize]));
                            }
                        }
                        let (any_of, keep) = (any_of && !deps.is_empty(), keep && !deps.is_empty());
                        let after = After {
                            deps: deps.iter().map(|&(on, when)| Dependency { on: id(on), when }).collect(),
                            any_of,
                            keep_if_unsatisfiable: keep,
                        };
                        f.ok(Command::Submit { spec: AllocSpec { after, max_retries: 1, ..spec(1, 1) } });
                        let status = if deps.is_empty() { AllocStatus::Queued } else { AllocStatus::Waiting };
                        model.push(M { status, started: false, deps, any_of, keep });
                        epochs.push(0);
                    }
                    Op::Start(i) if !model.is_empty() => {
                        let i = i % model.len();
                        if model[i].status != AllocStatus::Queued {
                            continue;
                        }
                        let epoch = f.reserve(id(i), &[node(i)]);
                        f.start(id(i), 0, node(i), epoch);
                        epochs[i] = epoch;
                        model[i].status = AllocStatus::Running;
                        model[i].started = true;
                    }
                    Op::Finish(i) | Op::Fail(i) if !model.is_empty() => {
                        let i = i % model.len();
                        if model[i].status != AllocStatus::Running {
                            continue;
                        }
                        let finish = matches!(op, Op::Finish(_));
                        let (alloc, node, epoch) = (id(i), n(node(i)), epochs[i]);
                        if finish {
                            f.ok(Command::FinishTask { alloc, task: 0, node, epoch });
                        } else {
                            f.ok(Command::FailTask { alloc, task: 0, node, epoch, exit_code: Some(1) });
                        }
                        model[i].status = if finish { AllocStatus::Done } else { AllocStatus::Failed };
                    }
                    Op::Cancel(i) if !model.is_empty() => {
                        let i = i % model.len();
                        if !matches!(model[i].status, AllocStatus::Waiting | AllocStatus::Queued) {
                            continue;
                        }
                        f.ok(Command::CancelAllocation { alloc: id(i) });
                        model[i].status = AllocStatus::Cancelled;
                    }
                    _ => continue,
                }
                settle(&mut model);
                for (i, m) in model.iter().enumerate() {
                    prop_assert_eq!(f.status(id(i)), m.status, "allocation {} of {:?}", id(i), model);
                }
            }
        }
    }
}
