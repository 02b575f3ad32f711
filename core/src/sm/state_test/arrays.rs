//! Job arrays: one entry, elements materialised within the throttle and
//! the window, cancelled whole, by range or one by one, correlated, and
//! named as dependencies.

use super::*;
use crate::sm::{ARRAY_WINDOW, After, AfterWhen, ArrayIndices, Dependency};

fn indices(expr: &str) -> ArrayIndices {
    ArrayIndices::parse(expr).unwrap()
}

fn submit_array(f: &mut Fixture, spec: AllocSpec, expr: &str, corr: Option<AllocId>) -> AllocId {
    let events = f.ok(Command::SubmitArray { spec, indices: indices(expr), corr, secrets: Default::default() });
    match events[0] {
        Event::ArraySubmitted { array, duplicate: false, .. } => array,
        ref other => panic!("unexpected {other:?}"),
    }
}

/// The live (materialised, not ended) elements of `array`.
fn live(f: &Fixture, array: AllocId) -> Vec<AllocId> {
    f.s.array_live(array).collect()
}

/// Runs element `e` to success on node `node`.
fn run_to_done(f: &mut Fixture, e: AllocId, node: u32) -> Vec<Event> {
    let epoch = f.reserve(e, &[node]);
    f.start(e, 0, node, epoch);
    f.ok(Command::FinishTask { alloc: e, task: 0, node: n(node), epoch })
}

#[test]
fn an_array_is_one_entry_and_materialises_only_what_its_throttle_allows() {
    let mut f = Fixture::new(4);
    let a = submit_array(&mut f, spec(1, 1), "0-99%3", None);
    assert_eq!(live(&f, a), [a + 1, a + 2, a + 3], "the throttle's worth, in index order");
    assert!(f.s.alloc(a).is_none(), "the array is no allocation");
    let counts = f.s.array_counts(f.s.array(a).unwrap());
    assert_eq!((counts.pending, counts.by_status.get(&AllocStatus::Queued)), (97, Some(&3)));
    // The next submit gets the id after the last element.
    assert_eq!(f.submit(spec(1, 1)), a + 101);
    // Placing one does not free a place: the throttle counts running ones.
    let epoch = f.reserve(a + 1, &[0]);
    f.start(a + 1, 0, 0, epoch);
    assert_eq!(live(&f, a).len(), 3);
    let events = f.ok(Command::FinishTask { alloc: a + 1, task: 0, node: n(0), epoch });
    assert!(events.contains(&Event::Submitted { alloc: a + 4, duplicate: false }), "{events:?}");
    assert_eq!(live(&f, a), [a + 2, a + 3, a + 4]);
    assert_eq!(f.s.array(a).unwrap().done, 1);
    // Its job record names its array and index (history and usage group by it).
    let records = f.s.take_finished_records();
    assert_eq!(records.iter().map(|r| (r.id, r.array)).collect::<Vec<_>>(), [(a + 1, Some((a, 0)))]);
    // Each element knows its array and index, and gets them in its env.
    let (array, position) = f.s.array_of(a + 4).unwrap();
    assert_eq!((array.id, position), (a, 3));
    let env: BTreeMap<String, String> = array.element_env(position).into_iter().collect();
    assert_eq!(env["MUSTER_ARRAY_INDEX"], "3");
    assert_eq!(env["SLURM_ARRAY_TASK_ID"], "3");
    assert_eq!(env["MUSTER_ARRAY_COUNT"], "100");
    assert_eq!(env["SLURM_ARRAY_JOB_ID"], a.to_string());
    assert_eq!((env["SLURM_ARRAY_TASK_MIN"].as_str(), env["SLURM_ARRAY_TASK_MAX"].as_str()), ("0", "99"));
}

#[test]
fn without_a_throttle_the_window_bounds_what_is_materialised() {
    let mut f = Fixture::new(1);
    let a = submit_array(&mut f, spec(1, 1), "0-4999", None);
    assert_eq!(live(&f, a).len() as u64, ARRAY_WINDOW);
    assert_eq!(f.s.array_counts(f.s.array(a).unwrap()).pending, 5000 - ARRAY_WINDOW);
    // One placed makes room for one more unplaced.
    f.reserve(a + 1, &[0]);
    assert_eq!(live(&f, a).len() as u64, ARRAY_WINDOW + 1);
}

#[test]
fn raising_the_throttle_materialises_at_once_and_lowering_stops_new_ones() {
    let mut f = Fixture::new(8);
    let a = submit_array(&mut f, spec(1, 1), "1-20%2", None);
    assert_eq!(live(&f, a).len(), 2);
    let events = f.ok(Command::SetArrayThrottle { array: a, throttle: 5, by: "alice".into() });
    assert_eq!(events[0], Event::ArrayThrottled { array: a, throttle: 5, by: "alice".into() });
    assert_eq!(live(&f, a).len(), 5);
    for (i, e) in live(&f, a).into_iter().enumerate() {
        let epoch = f.reserve(e, &[i as u32]);
        f.start(e, 0, i as u32, epoch);
    }
    f.ok(Command::SetArrayThrottle { array: a, throttle: 1, by: "alice".into() });
    // Running ones run on; none is materialised until fewer than 1 live.
    f.ok(Command::FinishTask { alloc: a + 1, task: 0, node: n(0), epoch: 1 });
    assert_eq!(live(&f, a).len(), 4);
    let r = f.rejected(Command::SetArrayThrottle { array: a, throttle: 21, by: "alice".into() });
    assert!(r.to_string().contains("throttle: 21 is more than the array's 20 elements"), "{r}");
    let r = f.rejected(Command::SetArrayThrottle { array: a + 1, throttle: 1, by: "alice".into() });
    assert_eq!(r, Rejection::UnknownArray(a + 1));
}

/// In a `reject`-mode vCluster an array counts as many elements as its
/// throttle lets be live at once, at submit and when the throttle is raised.
#[test]
fn a_reject_mode_quota_counts_what_the_throttle_lets_run() {
    use crate::sm::{HomeNodes, OverQuota, Quota, VClusterSpec, VClusterType};
    let mut f = Fixture::new(8);
    let vc = VClusterSpec {
        vtype: VClusterType::HpcBatch,
        home: HomeNodes::default_for("small"),
        quota: Quota { max_gpus: Some(8), max_nodes: None, max_allocations: Some(4) },
        borrow_limit_pct: 0,
        over_quota: OverQuota::Reject,
        checkpoints: crate::sm::VcCheckpoints::default(),
    };
    f.ok(Command::CreateVCluster { name: "small".into(), spec: vc, by: "admin".into() });
    let small = || AllocSpec { vcluster: "small".into(), ..spec(1, 1) };
    let submit = |expr: &str| Command::SubmitArray {
        spec: small(),
        indices: indices(expr),
        corr: None,
        secrets: Default::default(),
    };
    let r = f.rejected(submit("0-99"));
    let expect = "need 0 GPUs, 100 elements of this array at once 100, at most 8 (a lower throttle";
    assert!(matches!(&r, Rejection::OverQuota { reason, .. } if reason.contains(expect)), "{r:?}");
    let r = f.rejected(submit("0-99%5"));
    assert!(r.to_string().contains("5 elements of this array at once"), "{r}");
    let a = submit_array(&mut f, small(), "0-99%3", None);
    assert_eq!(live(&f, a).len(), 3);
    // Raising it past the quota is refused; to what fits, accepted.
    let raise = |throttle| Command::SetArrayThrottle { array: a, throttle, by: "alice".into() };
    let r = f.rejected(raise(0));
    assert!(r.to_string().contains("need 3 GPUs, 97 elements of this array at once 97, at most 8"), "{r}");
    f.ok(raise(4));
    assert_eq!(live(&f, a).len(), 4);
    // A plain submit is refused now, and its GPU quota is counted the same way.
    assert!(matches!(f.rejected(Command::Submit { spec: small() }), Rejection::OverQuota { .. }));
    let r = f.rejected(Command::SubmitArray {
        spec: AllocSpec { vcluster: "small".into(), ..spec(1, 4) },
        indices: indices("0-9%3"),
        corr: None,
        secrets: Default::default(),
    });
    assert!(r.to_string().contains("need 4 GPUs, 3 elements of this array at once 12, at most 8"), "{r}");
}

#[test]
fn cancel_reaches_one_element_a_range_or_the_whole_array() {
    let mut f = Fixture::new(2);
    let a = submit_array(&mut f, spec(1, 1), "0-9%2", None);
    // An element not yet materialised (index 5): its position is skipped.
    let events = f.ok(Command::CancelAllocation { alloc: a + 6 });
    assert_eq!(events, [Event::ArrayCancelled { array: a, skipped: 1 }]);
    let r = f.rejected(Command::CancelAllocation { alloc: a + 6 });
    assert_eq!(r, Rejection::AlreadyTerminal { alloc: a + 6, status: AllocStatus::Cancelled });
    // A range: index 0 is materialised (cancelled like any allocation),
    // 3-4 are not.
    let epoch = f.reserve(a + 1, &[0]);
    f.start(a + 1, 0, 0, epoch);
    let events = f.ok(Command::CancelArrayElements { array: a, indices: indices("0,3-4") });
    assert!(events.contains(&Event::ArrayCancelled { array: a, skipped: 2 }), "{events:?}");
    assert!(matches!(events.last(), Some(Event::TeardownStarted { alloc, .. }) if *alloc == a + 1), "{events:?}");
    let stop = f.task(a + 1, 0).preemption_epoch;
    f.ack(a + 1, 0, 0, stop);
    assert_eq!(f.status(a + 1), AllocStatus::Cancelled);
    let r = f.rejected(Command::CancelArrayElements { array: a, indices: indices("42") });
    assert!(r.to_string().contains(&format!("indices: array {a} has no element with index 42")), "{r}");
    // Materialisation skips the cancelled positions.
    let mut ran = Vec::new();
    while let Some(e) = live(&f, a).first().copied() {
        ran.push(f.s.array_of(e).unwrap().1);
        if ran.len() == 3 {
            break;
        }
        run_to_done(&mut f, e, 0);
    }
    assert_eq!(ran, [1, 2, 6], "0 ran and was cancelled; 3, 4 and 5 were skipped");
    // The whole array: live ones cancelled, the rest never materialised.
    let events = f.ok(Command::CancelAllocation { alloc: a });
    assert!(events.contains(&Event::ArrayCancelled { array: a, skipped: 2 }), "8 and 9: {events:?}");
    let finished = events.iter().find(|e| matches!(e, Event::ArrayFinished { .. })).expect("finished");
    assert_eq!(*finished, Event::ArrayFinished { array: a, done: 2, failed: 0, cancelled: 8 });
    assert_eq!(f.s.array(a).unwrap().final_status(), Some(AllocStatus::Cancelled));
    let r = f.rejected(Command::CancelAllocation { alloc: a });
    assert!(matches!(r, Rejection::AlreadyTerminal { status: AllocStatus::Cancelled, .. }), "{r:?}");
}

#[test]
fn after_corr_pairs_element_k_with_element_k() {
    let mut f = Fixture::new(4);
    let a = submit_array(&mut f, AllocSpec { max_retries: 1, ..spec(1, 1) }, "0-3", None);
    let b = submit_array(&mut f, spec(1, 1), "1-3", Some(a));
    // B's elements wait, each for A's element with its index.
    let waits: Vec<AllocId> = live(&f, b).iter().map(|&e| f.s.alloc(e).unwrap().spec.after.deps[0].on).collect();
    assert_eq!(waits, [a + 2, a + 3, a + 4]);
    assert!(live(&f, b).iter().all(|&e| f.status(e) == AllocStatus::Waiting));
    let events = run_to_done(&mut f, a + 3, 0);
    assert!(events.contains(&Event::DependenciesMet { alloc: b + 2 }), "index 2 with index 2: {events:?}");
    assert_eq!([f.status(b + 1), f.status(b + 3)], [AllocStatus::Waiting; 2]);
    let epoch = f.reserve(a + 2, &[1]);
    f.start(a + 2, 0, 1, epoch);
    f.fail(a + 2, 0, 1, epoch);
    let e = f.s.alloc(b + 1).unwrap();
    assert_eq!(e.status, AllocStatus::Failed);
    assert!(
        e.history.iter().any(
            |h| h.event == Event::AllocationFailed { alloc: b + 1, reason: format!("dependency {} failed", a + 2) }
        )
    );
    // A corr array must hold every index; it must be an array.
    let r = f.rejected(Command::SubmitArray {
        spec: spec(1, 1),
        indices: indices("3-4"),
        corr: Some(a),
        secrets: Default::default(),
    });
    assert!(r.to_string().contains(&format!("after_corr: array {a} has no element with index 4")), "{r}");
    let plain = f.submit(spec(1, 1));
    let r = f.rejected(Command::SubmitArray {
        spec: spec(1, 1),
        indices: indices("0"),
        corr: Some(plain),
        secrets: Default::default(),
    });
    assert!(r.to_string().contains("is not an array"), "{r}");
}

#[test]
fn a_dependency_on_an_array_waits_for_all_and_fails_on_the_first_failure() {
    let mut f = Fixture::new(2);
    let a = submit_array(&mut f, AllocSpec { max_retries: 1, ..spec(1, 1) }, "0-2", None);
    let dep =
        |on, when| AllocSpec { after: After { deps: vec![Dependency { on, when }], ..After::default() }, ..spec(1, 1) };
    let ok = f.submit(dep(a, AfterWhen::Ok));
    let any = f.submit(dep(a, AfterWhen::Any));
    let started = f.submit(dep(a, AfterWhen::Started));
    // An element not yet materialised may be named too.
    let b = submit_array(&mut f, spec(1, 1), "0-9%1", None);
    let on_unmade = f.submit(dep(b + 6, AfterWhen::Any)); // index 5
    assert_eq!(f.status(on_unmade), AllocStatus::Waiting);
    let e = crate::policy::explain(&f.s, on_unmade, f.t, &Default::default()).unwrap();
    assert_eq!(e.summary, format!("waiting for {} (element of array {b}, not started yet) to end", b + 6));
    let e = crate::policy::explain(&f.s, ok, f.t, &Default::default()).unwrap();
    assert_eq!(e.summary, format!("waiting for {a} (an array, 0 of 3 elements ended, 0 to come) to succeed"));
    run_to_done(&mut f, a + 1, 0);
    assert_eq!(f.status(started), AllocStatus::Queued, "one element started");
    assert_eq!(f.status(ok), AllocStatus::Waiting);
    let epoch = f.reserve(a + 2, &[0]);
    f.start(a + 2, 0, 0, epoch);
    f.fail(a + 2, 0, 0, epoch);
    assert_eq!(f.status(ok), AllocStatus::Failed, "ok can never be met once an element failed");
    assert_eq!(f.status(any), AllocStatus::Waiting, "the array has not ended");
    run_to_done(&mut f, a + 3, 1);
    assert_eq!(f.status(any), AllocStatus::Queued);
    // Cancelling the named element before it is materialised settles its
    // dependent.
    f.ok(Command::CancelArrayElements { array: b, indices: indices("5") });
    assert_eq!(f.status(on_unmade), AllocStatus::Queued, "any: however it ends");
}

#[test]
fn a_retried_array_submit_finds_the_array_and_a_changed_one_conflicts() {
    let mut f = Fixture::new(1);
    let keyed = AllocSpec { idempotency_key: Some("sweep-1".into()), ..spec(1, 1) };
    let a = submit_array(&mut f, keyed.clone(), "0-9", None);
    let again = f.ok(Command::SubmitArray {
        spec: keyed.clone(),
        indices: indices("0-9"),
        corr: None,
        secrets: Default::default(),
    });
    assert_eq!(again, [Event::ArraySubmitted { array: a, count: 10, duplicate: true }]);
    let r = f.rejected(Command::SubmitArray {
        spec: keyed.clone(),
        indices: indices("0-19"),
        corr: None,
        secrets: Default::default(),
    });
    assert!(matches!(r, Rejection::IdempotencyConflict { alloc, .. } if alloc == a), "{r:?}");
    let r = f.rejected(Command::Submit { spec: keyed });
    assert!(matches!(r, Rejection::IdempotencyConflict { alloc, .. } if alloc == a), "{r:?}");
    assert!(f.s.alloc(a + 1).unwrap().spec.idempotency_key.is_none(), "the array holds the key");
}

#[test]
fn a_finished_array_is_forgotten_after_its_elements_and_its_outcome_kept() {
    let mut f = Fixture::new(1);
    let a = submit_array(&mut f, spec(1, 1), "0-1", None);
    run_to_done(&mut f, a + 1, 0);
    let events = run_to_done(&mut f, a + 2, 0);
    assert!(events.contains(&Event::ArrayFinished { array: a, done: 2, failed: 0, cancelled: 0 }), "{events:?}");
    let snap = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(snap, f.s, "a snapshot keeps the array");
    f.t += 10 * 60_000;
    f.ok(Command::ForgetFinished { retention_ms: 60_000, key_window_ms: 0, max: 10 });
    assert!(f.s.array(a).is_none() && f.s.alloc(a + 1).is_none(), "forgotten");
    let ok = f.ok(Command::Submit {
        spec: AllocSpec {
            after: After { deps: vec![Dependency { on: a, when: AfterWhen::Ok }], ..After::default() },
            ..spec(1, 1)
        },
    });
    assert!(matches!(ok[1], Event::DependenciesMet { .. }), "the tombstone answers: {ok:?}");
}

#[test]
fn bad_arrays_are_refused_naming_the_field() {
    let mut f = Fixture::new(1);
    let bad = crate::sm::ArrayIndices { ranges: vec![], throttle: 0 };
    let r =
        f.rejected(Command::SubmitArray { spec: spec(1, 1), indices: bad, corr: None, secrets: Default::default() });
    assert!(r.to_string().contains("array: the array names no index"), "{r}");
    let r = f.rejected(Command::SubmitArray {
        spec: spec(0, 1),
        indices: indices("0-3"),
        corr: None,
        secrets: Default::default(),
    });
    assert!(r.to_string().contains("gang_size"), "{r}");
}

mod reference {
    //! Random arrays against a reference model: what each operation did
    //! to which index is recorded, and after every command the state
    //! agrees with it: elements appear in index order skipping exactly the
    //! cancelled ones, never more live than the throttle (unless it was
    //! lowered below what already ran), a correlated element never starts
    //! before its partner succeeded, and a finished array's counts are the
    //! outcomes the model recorded.

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[derive(Clone, Debug)]
    enum Op {
        /// Elements, throttle, correlate with an earlier array (how far back).
        Submit(u32, u32, Option<usize>),
        /// Place and start the k-th live element of an array.
        Start(usize, usize),
        /// Finish (true) or fail the k-th running element.
        End(usize, usize, bool),
        /// Cancel the element at position p of an array.
        CancelOne(usize, u64),
        /// Cancel positions from..from+len by index.
        CancelRange(usize, u64, u64),
        /// Cancel the whole array.
        CancelAll(usize),
        /// Set the throttle.
        Throttle(usize, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (1u32..12, 0u32..4, prop::option::of(0usize..3)).prop_map(|(c, t, k)| Op::Submit(c, t, k)),
            4 => (0usize..4, 0usize..4).prop_map(|(a, k)| Op::Start(a, k)),
            4 => (0usize..4, 0usize..4, prop::bool::weighted(0.7)).prop_map(|(a, k, ok)| Op::End(a, k, ok)),
            1 => (0usize..4, 0u64..12).prop_map(|(a, p)| Op::CancelOne(a, p)),
            1 => (0usize..4, 0u64..12, 1u64..4).prop_map(|(a, p, l)| Op::CancelRange(a, p, l)),
            1 => (0usize..4).prop_map(Op::CancelAll),
            1 => (0usize..4, 0u32..5).prop_map(|(a, t)| Op::Throttle(a, t)),
        ]
    }

    /// What the model knows of one array.
    #[derive(Default)]
    struct Model {
        id: AllocId,
        count: u64,
        corr: Option<AllocId>,
        /// Positions cancelled while not materialised (the model's view).
        cancelled_early: BTreeSet<u64>,
        /// Outcome per position, once ended.
        ended: BTreeMap<u64, AllocStatus>,
        /// Positions seen materialised, in the order they appeared.
        seen: Vec<u64>,
        /// The highest throttle it ever had (0: none).
        throttle_peak: u32,
        unthrottled: bool,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        #[test]
        fn arrays_follow_a_reference_model(ops in prop::collection::vec(op(), 1..60)) {
            let mut f = Fixture::new(16);
            let mut models: Vec<Model> = Vec::new();
            for o in ops {
                f.t += 1_000;
                let pick = |k: usize, n: usize| (n > 0).then(|| k % n);
                match o {
                    Op::Submit(count, throttle, back) => {
                        let throttle = throttle.min(count);
                        let corr = back.and_then(|k| models.len().checked_sub(k + 1)).map(|i| &models[i]);
                        let corr = corr.filter(|m| m.count >= u64::from(count)).map(|m| m.id);
                        let indices = ArrayIndices {
                            ranges: vec![crate::sm::ArrayRange { first: 0, last: count - 1, step: 1 }],
                            throttle,
                        };
                        let spec = AllocSpec { max_retries: 1, ..spec(1, 1) };
                        let events = f.ok(Command::SubmitArray { spec, indices, corr, secrets: Default::default() });
                        let Event::ArraySubmitted { array, .. } = events[0] else { panic!("{events:?}") };
                        models.push(Model {
                            id: array,
                            count: u64::from(count),
                            corr,
                            throttle_peak: throttle,
                            unthrottled: throttle == 0,
                            ..Model::default()
                        });
                    }
                    Op::Start(a, k) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let queued: Vec<AllocId> =
                            f.s.array_live(models[a].id).filter(|&e| f.status(e) == AllocStatus::Queued).collect();
                        let Some(k) = pick(k, queued.len()) else { continue };
                        let e = queued[k];
                        let Some(node) = (0..16).find(|&i| f.used_gpus(i) < 8) else { continue };
                        let epoch = f.reserve(e, &[node]);
                        f.start(e, 0, node, epoch);
                    }
                    Op::End(a, k, ok) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let running: Vec<AllocId> =
                            f.s.array_live(models[a].id).filter(|&e| f.status(e) == AllocStatus::Running).collect();
                        let Some(k) = pick(k, running.len()) else { continue };
                        let e = running[k];
                        let t = f.task(e, 0);
                        let (node, epoch) = (t.node.unwrap(), t.reservation_epoch);
                        let node = f.s.node(node).id.clone();
                        if ok {
                            f.ok(Command::FinishTask { alloc: e, task: 0, node, epoch });
                        } else {
                            f.ok(Command::FailTask { alloc: e, task: 0, node, epoch, exit_code: Some(1) });
                        }
                    }
                    Op::CancelOne(a, p) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let m = &mut models[a];
                        let p = p % m.count;
                        let e = m.id + 1 + p;
                        let held = f.s.alloc(e).is_some();
                        if let Outcome::Accepted(_) = f.apply(Command::CancelAllocation { alloc: e })
                            && !held
                        {
                            m.cancelled_early.insert(p);
                        }
                        // A held element is cancelled (or stops) like any allocation.
                    }
                    Op::CancelRange(a, from, len) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let m = &mut models[a];
                        let from = from % m.count;
                        let last = (from + len - 1).min(m.count - 1);
                        let unheld: Vec<u64> = (from..=last)
                            .filter(|&p| f.s.alloc(m.id + 1 + p).is_none() && !m.ended.contains_key(&p))
                            .collect();
                        let indices = ArrayIndices {
                            ranges: vec![crate::sm::ArrayRange { first: from as u32, last: last as u32, step: 1 }],
                            throttle: 0,
                        };
                        if f.apply(Command::CancelArrayElements { array: m.id, indices }).is_accepted() {
                            m.cancelled_early.extend(unheld);
                        }
                    }
                    Op::CancelAll(a) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let m = &mut models[a];
                        let unheld: Vec<u64> = (0..m.count)
                            .filter(|&p| f.s.alloc(m.id + 1 + p).is_none() && !m.ended.contains_key(&p))
                            .collect();
                        if f.apply(Command::CancelAllocation { alloc: m.id }).is_accepted() {
                            m.cancelled_early.extend(unheld);
                        }
                    }
                    Op::Throttle(a, t) => {
                        let Some(a) = pick(a, models.len()) else { continue };
                        let m = &mut models[a];
                        let t = t.min(m.count as u32);
                        if f.apply(Command::SetArrayThrottle { array: m.id, throttle: t, by: "u".into() }).is_accepted() {
                            m.throttle_peak = m.throttle_peak.max(t);
                            m.unthrottled |= t == 0;
                        }
                    }
                }
                // Let every cancelled element's stop be acknowledged.
                let stopping: Vec<(AllocId, TaskIndex, u32, u64)> = models
                    .iter()
                    .flat_map(|m| f.s.array_live(m.id).collect::<Vec<_>>())
                    .filter_map(|e| {
                        let t = f.task(e, 0);
                        (t.status == TaskStatus::Preempting).then(|| (e, 0, t.node.unwrap().0, t.preemption_epoch))
                    })
                    .collect();
                for (e, task, node, epoch) in stopping {
                    f.ack(e, task, node, epoch);
                }
                // Check the state against the model.
                for m in &mut models {
                    let array = f.s.array(m.id).unwrap().clone();
                    for p in 0..m.count {
                        let Some(e) = f.s.alloc(m.id + 1 + p) else { continue };
                        if !m.seen.contains(&p) {
                            m.seen.push(p);
                        }
                        if e.status.is_terminal() {
                            m.ended.entry(p).or_insert(e.status);
                        }
                        if let Some(corr) = m.corr
                            && e.ever_started()
                        {
                            let partner = f.s.alloc(corr + 1 + p).unwrap();
                            prop_assert_eq!(partner.status, AllocStatus::Done, "element {} started early", e.id);
                        }
                    }
                    // In order, skipping exactly the cancelled positions.
                    let mut sorted = m.seen.clone();
                    sorted.sort_unstable();
                    prop_assert_eq!(&m.seen, &sorted, "materialised out of order");
                    let expected: Vec<u64> = (0..m.count)
                        .filter(|p| !m.cancelled_early.contains(p))
                        .take(m.seen.len())
                        .collect();
                    prop_assert_eq!(&m.seen, &expected, "skipped the wrong positions");
                    let live = f.s.array_live(m.id).count() as u32;
                    if !m.unthrottled {
                        prop_assert!(live <= m.throttle_peak, "{} live over the throttle {}", live, m.throttle_peak);
                    }
                    let outcome = |s| m.ended.values().filter(|&&v| v == s).count() as u64;
                    prop_assert_eq!(array.done, outcome(AllocStatus::Done));
                    prop_assert_eq!(array.failed, outcome(AllocStatus::Failed));
                    prop_assert_eq!(array.cancelled, outcome(AllocStatus::Cancelled) + m.cancelled_early.len() as u64);
                    let all_ended = m.ended.len() as u64 + m.cancelled_early.len() as u64 == m.count;
                    prop_assert_eq!(array.finished_at_ms.is_some(), all_ended);
                }
            }
        }
    }
}
