//! Workflows: steps submitted in one entry, accepted or refused whole,
//! run in order, cancelled together.

use super::*;
use crate::sm::{AfterWhen, ArrayIndices, HomeNodes, OverQuota, Quota, VClusterSpec, WorkflowSpec, WorkflowStep};

fn step(name: &str, spec: AllocSpec, after: &[(u32, AfterWhen)]) -> WorkflowStep {
    WorkflowStep { name: name.into(), spec, array: None, after_steps: after.to_vec(), corr_step: None }
}

fn pipeline(key: Option<&str>) -> WorkflowSpec {
    let owner = spec(1, 1).owner;
    WorkflowSpec {
        name: "pipeline".into(),
        owner,
        idempotency_key: key.map(Into::into),
        steps: vec![
            step("preprocess", AllocSpec { max_retries: 1, ..spec(1, 0) }, &[]),
            step("train", AllocSpec { max_retries: 1, ..spec(2, 1) }, &[(0, AfterWhen::Ok)]),
            step("evaluate", spec(1, 1), &[(1, AfterWhen::Ok)]),
        ],
    }
}

/// Submits `wf`; its id and its steps' ids.
fn submit(f: &mut Fixture, wf: WorkflowSpec) -> (AllocId, Vec<AllocId>) {
    let events = f.ok(Command::SubmitWorkflow { workflow: wf });
    let Event::WorkflowSubmitted { workflow, duplicate: false, .. } = events[0] else { panic!("{events:?}") };
    let ids = f.s.workflow(workflow).unwrap().steps.iter().map(|&(_, id)| id).collect();
    (workflow, ids)
}

#[test]
fn a_three_step_workflow_runs_in_order_and_a_failed_step_ends_the_next_at_once() {
    let mut f = Fixture::new(2);
    let (w, ids) = submit(&mut f, pipeline(None));
    assert_eq!(ids, [w + 1, w + 2, w + 3], "the steps take the ids after the workflow");
    let [pre, train, eval] = ids[..] else { unreachable!() };
    assert_eq!(f.s.alloc(train).unwrap().spec.after.deps, [crate::sm::Dependency { on: pre, when: AfterWhen::Ok }]);
    assert_eq!(
        [f.status(pre), f.status(train), f.status(eval)],
        [AllocStatus::Queued, AllocStatus::Waiting, AllocStatus::Waiting]
    );
    let epoch = f.reserve(pre, &[0]);
    // Its tasks are told their workflow and step.
    let cfg = crate::sync::SyncConfig { stop_grace_ms: 1_000, preemption_grace_ms: 1_000 };
    let plan = crate::sync::plan_sync(&f.s, &n(0), &Default::default(), false, &cfg);
    let env: BTreeMap<String, String> = plan.assign[0].env.iter().cloned().collect();
    assert_eq!(
        (env["MUSTER_WORKFLOW_ID"].as_str(), env["MUSTER_WORKFLOW_STEP"].as_str()),
        (w.to_string().as_str(), "preprocess")
    );
    f.start(pre, 0, 0, epoch);
    f.ok(Command::FinishTask { alloc: pre, task: 0, node: n(0), epoch });
    assert_eq!(f.status(train), AllocStatus::Queued);
    let epoch = f.reserve(train, &[0, 1]);
    f.start(train, 0, 0, epoch);
    f.start(train, 1, 1, epoch);
    f.fail(train, 0, 0, epoch);
    f.ack(train, 1, 1, f.task(train, 1).preemption_epoch);
    let e = f.s.alloc(eval).unwrap();
    assert_eq!(e.status, AllocStatus::Failed);
    assert!(
        e.history
            .iter()
            .any(|h| h.event == Event::AllocationFailed { alloc: eval, reason: format!("dependency {train} failed") }),
        "{:?}",
        e.history
    );
}

#[test]
fn a_workflow_is_refused_whole_naming_the_step_and_field() {
    let mut f = Fixture::new(1);
    let before = f.s.next_alloc_id();
    let mut bad = pipeline(None);
    bad.steps[2].spec.gang_size = 0;
    let r = f.rejected(Command::SubmitWorkflow { workflow: bad });
    assert!(r.to_string().contains("steps[evaluate].gang_size"), "{r}");
    assert_eq!(f.s.next_alloc_id(), before, "nothing was made, not even the first steps");
    let mut forward = pipeline(None);
    forward.steps[0].after_steps = vec![(2, AfterWhen::Ok)];
    let r = f.rejected(Command::SubmitWorkflow { workflow: forward });
    assert!(r.to_string().contains("steps[preprocess].after: a step waits only for steps before it"), "{r}");
    let mut twice = pipeline(None);
    twice.steps[2].name = "train".into();
    assert!(f.rejected(Command::SubmitWorkflow { workflow: twice }).to_string().contains("two steps are named train"));
    let mut keyed = pipeline(None);
    keyed.steps[1].spec.idempotency_key = Some("k".into());
    let r = f.rejected(Command::SubmitWorkflow { workflow: keyed });
    assert!(r.to_string().contains("steps[train].idempotency_key"), "{r}");
    let mut named = pipeline(None);
    named.steps[1].name = "train step".into();
    assert!(f.rejected(Command::SubmitWorkflow { workflow: named }).to_string().contains("steps[1].name"));
    let empty = WorkflowSpec { steps: vec![], ..pipeline(None) };
    assert!(f.rejected(Command::SubmitWorkflow { workflow: empty }).to_string().contains("0 steps"));
}

#[test]
fn a_quota_counts_the_earlier_steps_of_the_same_workflow() {
    let mut f = Fixture::new(1);
    let vc = VClusterSpec {
        vtype: VClusterType::HpcBatch,
        home: HomeNodes::default_for("small"),
        quota: Quota { max_gpus: None, max_nodes: None, max_allocations: Some(2) },
        borrow_limit_pct: 0,
        over_quota: OverQuota::Reject,
        checkpoints: crate::sm::VcCheckpoints::default(),
    };
    f.ok(Command::CreateVCluster { name: "small".into(), spec: vc, by: "admin".into() });
    let mut wf = pipeline(None);
    for s in &mut wf.steps {
        s.spec.vcluster = "small".into();
    }
    let r = f.rejected(Command::SubmitWorkflow { workflow: wf });
    assert!(matches!(&r, Rejection::OverQuota { reason, .. } if reason.contains("2 live, at most 2")), "{r:?}");
    // An array step counts as many elements as its throttle lets be live
    // at once, for itself and the steps after it: the entry is refused
    // whole (were it counted as one, the next step's own submit would be
    // refused after the array was made).
    let two = |array: &str| {
        let mut two = pipeline(None);
        two.steps.truncate(2);
        two.steps[0].array = Some(ArrayIndices::parse(array).unwrap());
        for s in &mut two.steps {
            s.spec.vcluster = "small".into();
        }
        Command::SubmitWorkflow { workflow: two }
    };
    let r = f.rejected(two("0-9"));
    let expect = "0 live and 10 elements of this array at once, at most 2";
    assert!(matches!(&r, Rejection::OverQuota { reason, .. } if reason.contains(expect)), "{r:?}");
    let r = f.rejected(two("0-9%2"));
    assert!(matches!(&r, Rejection::OverQuota { reason, .. } if reason.contains("2 live, at most 2")), "{r:?}");
    f.ok(two("0-9%1"));
}

#[test]
fn any_of_may_rest_on_dependencies_on_earlier_steps_alone() {
    let mut f = Fixture::new(1);
    let mut wf = pipeline(None);
    wf.steps[2].after_steps = vec![(0, AfterWhen::Ok), (1, AfterWhen::Ok)];
    wf.steps[2].spec.after.any_of = true;
    let (_, ids) = submit(&mut f, wf);
    assert!(f.s.alloc(ids[2]).unwrap().spec.after.any_of);
    let mut none = pipeline(None);
    none.steps[0].spec.after.keep_if_unsatisfiable = true;
    let r = f.rejected(Command::SubmitWorkflow { workflow: none });
    assert!(r.to_string().contains("steps[preprocess].after"), "{r}");
}

#[test]
fn a_retried_workflow_is_the_same_one_and_cancelling_it_cancels_every_step_left() {
    let mut f = Fixture::new(1);
    let (w, ids) = submit(&mut f, pipeline(Some("nightly")));
    let again = f.ok(Command::SubmitWorkflow { workflow: pipeline(Some("nightly")) });
    assert_eq!(again, [Event::WorkflowSubmitted { workflow: w, steps: 3, duplicate: true }]);
    let mut other = pipeline(Some("nightly"));
    other.name = "changed".into();
    let r = f.rejected(Command::SubmitWorkflow { workflow: other });
    assert!(matches!(r, Rejection::IdempotencyConflict { alloc, .. } if alloc == w), "{r:?}");
    f.ok(Command::CancelAllocation { alloc: w });
    assert!(ids.iter().all(|&id| f.status(id) == AllocStatus::Cancelled));
    let r = f.rejected(Command::CancelAllocation { alloc: w });
    assert!(matches!(r, Rejection::AlreadyTerminal { .. }), "{r:?}");
}

#[test]
fn array_steps_pair_with_an_earlier_array_step() {
    let mut f = Fixture::new(2);
    let owner = spec(1, 1).owner;
    let idx = |e: &str| Some(ArrayIndices::parse(e).unwrap());
    let wf = WorkflowSpec {
        name: "sweep".into(),
        owner,
        idempotency_key: None,
        steps: vec![
            WorkflowStep { array: idx("0-3"), ..step("train", spec(1, 1), &[]) },
            WorkflowStep { array: idx("0-3"), corr_step: Some(0), ..step("eval", spec(1, 1), &[]) },
        ],
    };
    let (w, ids) = submit(&mut f, wf.clone());
    let (train, eval) = (ids[0], ids[1]);
    assert_eq!((train, eval), (w + 1, w + 6), "each array takes its elements' ids");
    let deps = &f.s.alloc(eval + 3).unwrap().spec.after.deps;
    assert_eq!(deps[0].on, train + 3, "element 2 waits for element 2");
    let mut bad = wf;
    bad.steps[1].array = idx("3-4");
    let r = f.rejected(Command::SubmitWorkflow { workflow: bad });
    assert!(r.to_string().contains("steps[eval].after_corr: step train has no element with index 4"), "{r}");
}

mod fuzz {
    //! Random workflows, good and bad: apply never panics (every step it
    //! makes was checked first), and a refused one changes nothing.

    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    struct RawStep {
        gang: u32,
        gpus: u32,
        array: Option<(u32, u32)>,
        after: Vec<(u32, u8)>,
        corr: Option<u32>,
        any_of: bool,
        keep: bool,
        small: bool,
        existing: Option<u64>,
    }

    fn raw() -> impl Strategy<Value = RawStep> {
        (
            prop_oneof![9 => 1u32..3, 1 => Just(0u32)],
            0u32..3,
            prop::option::of((1u32..30, 0u32..5)),
            prop::collection::vec((0u32..12, 0u8..4), 0..3),
            prop::option::of(0u32..6),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.6),
            prop::option::of(1u64..12),
        )
            .prop_map(|(gang, gpus, array, after, corr, any_of, keep, small, existing)| RawStep {
                gang,
                gpus,
                array,
                after,
                corr,
                any_of,
                keep,
                small,
                existing,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn random_workflows_are_accepted_whole_or_refused_unchanged(steps in prop::collection::vec(raw(), 1..6)) {
            let mut f = Fixture::new(2);
            let vc = VClusterSpec {
                vtype: VClusterType::HpcBatch,
                home: HomeNodes::default_for("small"),
                quota: Quota { max_gpus: Some(40), max_nodes: None, max_allocations: Some(12) },
                borrow_limit_pct: 0,
                over_quota: OverQuota::Reject,
                checkpoints: crate::sm::VcCheckpoints::default(),
            };
            f.ok(Command::CreateVCluster { name: "small".into(), spec: vc, by: "admin".into() });
            // Some existing allocations (and an array) to name.
            for _ in 0..3 {
                f.submit(spec(1, 0));
            }
            let owner = spec(1, 1).owner;
            let whens = [AfterWhen::Ok, AfterWhen::Any, AfterWhen::NotOk, AfterWhen::Started];
            let wf = WorkflowSpec {
                name: "fuzz".into(),
                owner,
                idempotency_key: None,
                steps: steps
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let mut s = AllocSpec { max_retries: 1, ..spec(r.gang, r.gpus) };
                        if r.small {
                            s.vcluster = "small".into();
                        }
                        // One of the three allocations made above, or (rarely)
                        // one that does not exist.
                        if let Some(id) = r.existing {
                            let on = if id <= 10 { id % 3 + 1 } else { 99 };
                            s.after.deps.push(crate::sm::Dependency { on, when: AfterWhen::Any });
                        }
                        s.after.any_of = r.any_of;
                        s.after.keep_if_unsatisfiable = r.keep;
                        WorkflowStep {
                            name: format!("s{i}"),
                            spec: s,
                            array: r.array.map(|(n, t)| ArrayIndices {
                                ranges: vec![crate::sm::ArrayRange { first: 0, last: n - 1, step: 1 }],
                                throttle: t.min(n),
                            }),
                            // Earlier steps; rarely itself or a later one (refused).
                            after_steps: r
                                .after
                                .iter()
                                .filter(|&&(on, _)| i > 0 || on == 11)
                                .map(|&(on, w)| (if on == 11 { on } else { on % i as u32 }, whens[w as usize]))
                                .collect(),
                            corr_step: r.corr.filter(|_| r.array.is_some() && i > 0).map(|c| c % i as u32),
                        }
                    })
                    .collect(),
            };
            let mut before = f.s.clone();
            before.advance_clock(f.t);
            match f.apply(Command::SubmitWorkflow { workflow: wf.clone() }) {
                Outcome::Accepted(_) => {
                    let w = f.s.workflows().last().expect("made").clone();
                    prop_assert_eq!(w.steps.len(), wf.steps.len());
                }
                Outcome::Rejected(_) => prop_assert_eq!(&f.s, &before, "a refused workflow changed the state"),
            }
        }
    }
}
