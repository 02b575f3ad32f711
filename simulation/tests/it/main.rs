//! Whole simulations: determinism, invariants under failures and lost
//! claims, and trace replay.

use std::path::Path;

use muster_core::policy::{AdmissionConfig, Order};
use muster_core::sm::{AllocStatus, Resources};
use muster_sim::{SimConfig, Simulation, WorkloadConfig, load_trace};

const NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };

fn synthetic(seed: u64, nodes: u32, check_every: u64) -> SimConfig {
    SimConfig {
        nodes,
        node: NODE,
        seed,
        failure_prob: 0.05,
        lost_claim_prob: 0.01,
        check_every,
        ..SimConfig::default()
    }
}

fn run(seed: u64, nodes: u32, allocations: u32, check_every: u64) -> muster_sim::Report {
    let workload = WorkloadConfig { allocations, ..WorkloadConfig::default() };
    let jobs = workload.generate(seed, &NODE, u64::from(nodes) * 8);
    let (report, state) = Simulation::new(synthetic(seed, nodes, check_every), jobs).run().unwrap();
    assert_eq!(report.state_digest, state.state_digest().to_string());
    report
}

#[test]
fn t10_same_seed_same_digest_and_report() {
    let a = run(7, 40, 600, 0);
    let b = run(7, 40, 600, 0);
    assert_eq!(a, b);
    let c = run(8, 40, 600, 0);
    assert_ne!(a.state_digest, c.state_digest, "a different seed is a different run");
}

/// Every invariant after every command, with failures, teardowns and lost
/// claims (stale reservations) all happening.
#[test]
fn t20_invariants_hold_through_failures_and_lost_claims() {
    let r = run(3, 24, 400, 1);
    assert_eq!(r.allocations, 400);
    assert_eq!(r.completed + r.failed + r.unfinished, 400);
    assert_eq!(r.unfinished, 0, "every gang fits this cluster, so everything ends");
    assert!(r.task_failures > 0, "the failure path ran: {r:?}");
    assert!(r.rollbacks > 0, "the stale-reservation path ran: {r:?}");
    assert!(r.rejected_reports > 0, "stale reports were refused: {r:?}");
    assert!(r.utilisation > 0.0 && r.utilisation <= 1.0, "{r:?}");
}

#[test]
fn t30_a_gang_larger_than_the_cluster_stays_queued_and_the_run_still_ends() {
    let workload = WorkloadConfig { allocations: 50, gang_mix: vec![(1, 1), (1, 16)], ..WorkloadConfig::default() };
    let jobs = workload.generate(5, &NODE, 8 * 8);
    let big = jobs.iter().filter(|j| j.spec.gang_size == 16).count() as u64;
    let (report, state) = Simulation::new(synthetic(5, 8, 0), jobs).run().unwrap();
    assert!(big > 0);
    assert_eq!(report.unfinished, big);
    assert!(state.allocs().values().filter(|a| a.spec.gang_size == 16).all(|a| a.status == AllocStatus::Queued));
}

#[test]
fn t40_trace_prefix_replays_deterministically_under_both_policies() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/philly.csv.gz");
    let jobs = load_trace(&path, &NODE, Some(3_000)).unwrap();
    let mut digests = Vec::new();
    for order in [Order::LargestFirst, Order::Fifo, Order::LargestFirst] {
        let cfg = SimConfig {
            nodes: 16,
            node: NODE,
            admission: AdmissionConfig { order, ..AdmissionConfig::default() },
            ..SimConfig::default()
        };
        let (r, _) = Simulation::new(cfg, jobs.clone()).run().unwrap();
        assert_eq!(r.completed, 3_000, "{r:?}");
        assert_eq!(r.task_failures, 0);
        digests.push(r.state_digest);
    }
    assert_eq!(digests[0], digests[2]);
}

/// Priority preemption in the simulator: with every invariant checked after
/// every ten commands, decisions are made, victims suspend and resume, every
/// allocation still ends, and the same seed gives the same digest.
#[test]
fn t50_preemption_keeps_invariants_and_determinism_and_everything_ends() {
    let sim = |seed| {
        let workload = WorkloadConfig { allocations: 400, ..WorkloadConfig::default() };
        let jobs = workload.generate(seed, &NODE, 24 * 8);
        let cfg = SimConfig {
            preemption: Some(muster_core::policy::PreemptionConfig {
                min_runtime_ms: 60_000,
                near_completion_ms: 60_000,
                ..Default::default()
            }),
            ..synthetic(seed, 24, 10)
        };
        Simulation::new(cfg, jobs).run().unwrap()
    };
    let (a, state) = sim(5);
    assert!(a.preemptions > 0, "preemptions happened: {a:?}");
    assert_eq!(a.unfinished, 0, "everything ends: {a:?}");
    let resumed = state.allocs().values().filter(|x| x.preempted_count > 0 && x.status == AllocStatus::Done).count();
    assert!(resumed > 0, "preempted allocations resumed and finished");
    let (b, _) = sim(5);
    assert_eq!(a, b, "the same seed, the same run");
}

/// A run with nothing failing, every agent claiming and one preemption
/// class: the setting in which EASY backfill promises that the gang with a
/// planned start is never delayed by work placed ahead of it (a higher
/// class may take its nodes, as it may preempt it).
fn backfill_run(seed: u64, nodes: u32, allocations: u32, order: Order, all_at_once: bool) -> muster_sim::Report {
    // Gangs of up to 8 nodes, so every gang fits the cluster and ends.
    let gang_mix = vec![(60, 1), (15, 2), (12, 4), (9, 8)];
    let workload = WorkloadConfig { allocations, target_load: 2.0, gang_mix, ..WorkloadConfig::default() };
    let mut jobs = workload.generate(seed, &NODE, u64::from(nodes) * 8);
    for j in &mut jobs {
        j.spec.preemption_class = 0;
        if all_at_once {
            j.submit_ms = 0;
        }
    }
    let cfg = SimConfig {
        nodes,
        node: NODE,
        seed,
        admission: AdmissionConfig { order, backfill: true, ..AdmissionConfig::default() },
        check_every: 50,
        ..SimConfig::default()
    };
    Simulation::new(cfg, jobs).run().unwrap().0
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Backfill never delays the reserved gang: every gang given a planned
    /// start is reserved by it. FIFO with arrivals over time (a later
    /// arrival never ranks ahead of the head), and largest-first with
    /// everything submitted at once (the ranking never changes).
    #[test]
    fn t60_backfill_never_delays_the_gang_with_a_planned_start(
        seed in 0u64..1_000_000,
        nodes in 8u32..20,
        allocations in 20u32..120,
        fifo in proptest::bool::ANY,
    ) {
        let order = if fifo { Order::Fifo } else { Order::LargestFirst };
        let r = backfill_run(seed, nodes, allocations, order, !fifo);
        proptest::prop_assert_eq!(r.planned_start_late, 0, "{:?}", r);
        proptest::prop_assert_eq!(r.unfinished, 0, "{:?}", r);
    }
}

/// The property above is not vacuous: gangs do get planned starts and
/// smaller ones run ahead of them.
#[test]
fn t61_backfill_plans_starts_and_runs_work_ahead_of_them() {
    for order in [Order::Fifo, Order::LargestFirst] {
        let r = backfill_run(11, 12, 200, order, order == Order::LargestFirst);
        assert!(r.planned_starts > 0, "{order:?}: {r:?}");
        assert!(r.backfilled > 0, "{order:?}: {r:?}");
        assert_eq!(r.planned_start_late, 0, "{order:?}: {r:?}");
    }
}

/// Backfill on and off over a prefix of the Philly trace: with FIFO
/// (EASY against plain first-come-first-served) backfill cuts the mean
/// queueing delay; with largest-first it bounds how long large gangs wait.
#[test]
fn t62_philly_prefix_backfill_on_and_off() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/philly.csv.gz");
    let jobs = load_trace(&path, &NODE, Some(4_000)).unwrap();
    let sim = |order, backfill| {
        let cfg = SimConfig {
            nodes: 12,
            node: NODE,
            admission: AdmissionConfig { order, backfill, ..AdmissionConfig::default() },
            ..SimConfig::default()
        };
        Simulation::new(cfg, jobs.clone()).run().unwrap().0
    };
    let (fifo, easy) = (sim(Order::Fifo, false), sim(Order::Fifo, true));
    assert_eq!((fifo.completed, easy.completed), (4_000, 4_000));
    assert!(
        easy.queue_delay_s.mean < fifo.queue_delay_s.mean,
        "EASY backfill cuts FIFO's mean delay: {} s against {} s",
        easy.queue_delay_s.mean,
        fifo.queue_delay_s.mean
    );
    assert!(easy.backfilled > 0 && fifo.backfilled == 0 && fifo.planned_starts == 0);
    let (greedy, reserved) = (sim(Order::LargestFirst, false), sim(Order::LargestFirst, true));
    assert_eq!((greedy.completed, reserved.completed), (4_000, 4_000));
    assert!(
        reserved.queue_delay_large_s.max <= greedy.queue_delay_large_s.max,
        "planned starts bound the wait of large gangs: {} s against {} s",
        reserved.queue_delay_large_s.max,
        greedy.queue_delay_large_s.max
    );
}

/// Crashed nodes: the leader's tick marks them lost, their tasks fail over,
/// the nodes come back, every invariant holds after every ten commands,
/// everything ends, and the same seed gives the same run.
#[test]
fn t25_crashed_nodes_are_marked_lost_and_their_work_fails_over() {
    let sim = |seed| {
        let workload = WorkloadConfig { allocations: 300, ..WorkloadConfig::default() };
        let jobs = workload.generate(seed, &NODE, 16 * 8);
        let cfg = SimConfig { node_failures: 6, failure_prob: 0.0, lost_claim_prob: 0.0, ..synthetic(seed, 16, 10) };
        Simulation::new(cfg, jobs).run().unwrap()
    };
    let (a, _) = sim(11);
    assert!(a.nodes_lost > 0, "the tick marked crashed nodes lost: {a:?}");
    assert_eq!(a.unfinished, 0, "everything ends: {a:?}");
    assert_eq!(a.completed + a.failed, 300);
    let (b, _) = sim(11);
    assert_eq!(a, b, "the same seed, the same run");
}

/// Synthetic job arrays and three-step workflows, with failures and lost
/// claims: every invariant after every command, every workflow's makespan
/// measured, each workflow's steps in order (a step started only after the
/// one before it ended), and the same seed the same run.
#[test]
fn t70_arrays_and_workflows_run_to_the_end_in_order_and_deterministically() {
    let go = || {
        let workload =
            WorkloadConfig { allocations: 100, array_share: 0.3, workflow_share: 0.3, ..WorkloadConfig::default() };
        let jobs = workload.generate(11, &NODE, 16 * 8);
        let (arrays, workflows) = (
            jobs.iter().filter(|j| j.array.is_some()).count() as u64,
            jobs.iter().filter(|j| j.workflow.is_some()).count() as u64,
        );
        let (report, state) = Simulation::new(synthetic(11, 16, 7), jobs).run().unwrap();
        (report, state, arrays, workflows)
    };
    let (r, state, arrays, workflows) = go();
    assert!(arrays > 15 && workflows > 15, "{arrays} arrays, {workflows} workflows");
    assert_eq!((r.arrays, r.workflows), (arrays, workflows));
    assert_eq!(r.unfinished, 0, "everything ends: {r:?}");
    assert_eq!(r.workflow_makespan_s.count, workflows, "every workflow's makespan: {r:?}");
    for w in state.workflows() {
        let ends: Vec<(u64, Option<u64>)> = w
            .steps
            .iter()
            .map(|(_, id)| {
                let a = state.alloc(*id).expect("a plain step");
                (a.submit_time_ms, a.tasks.iter().filter_map(|t| t.started_at_ms).min())
            })
            .collect();
        let finished: Vec<Option<u64>> =
            w.steps.iter().map(|(_, id)| state.alloc(*id).unwrap().finished_at_ms).collect();
        for k in 1..w.steps.len() {
            if let (Some(start), Some(before)) = (ends[k].1, finished[k - 1]) {
                assert!(start >= before, "workflow {}: step {k} started before step {} ended", w.id, k - 1);
            }
        }
    }
    let (again, _, _, _) = go();
    assert_eq!(r, again, "the same seed, the same run");
}

mod replay {
    use muster_core::history::JobRecord;
    use muster_core::policy::PreemptionConfig;
    use muster_core::sm::{AfterWhen, AllocStatus, Dependency, State, VClusterSpec};
    use muster_sim::replay::{ReplaySettings, compare, replay, workload_of};
    use muster_sim::{FleetNode, SimConfig, Simulation, WorkloadConfig};

    use super::NODE;

    fn fleet(n: usize, prefix: &str) -> Vec<FleetNode> {
        (0..n)
            .map(|i| FleetNode { id: Some(format!("{prefix}-{i}")), resources: NODE, labels: Default::default() })
            .collect()
    }

    fn settings(nodes: Vec<FleetNode>) -> ReplaySettings {
        ReplaySettings {
            nodes,
            vclusters: vec![("default".into(), VClusterSpec::default_for("default"))],
            admission: Default::default(),
            preemption: Some(PreemptionConfig::default()),
            retention: None,
        }
    }

    /// A "real" run to record: a busy synthetic workload with failures and
    /// preemption, and every allocation's record at its end.
    fn recorded(nodes: usize, allocations: u32) -> (Vec<JobRecord>, State) {
        let workload = WorkloadConfig { allocations, target_load: 1.3, ..WorkloadConfig::default() };
        let jobs = workload.generate(5, &NODE, nodes as u64 * 8);
        let cfg = SimConfig {
            seed: 5,
            failure_prob: 0.05,
            preemption: Some(PreemptionConfig::default()),
            fleet: fleet(nodes, "n"),
            ..SimConfig::default()
        };
        let (_, state) = Simulation::new(cfg, jobs).run().unwrap();
        let records = state.allocs().values().map(|a| JobRecord::of(&state, a)).collect();
        (records, state)
    }

    #[test]
    fn t80_a_recorded_run_replays_closely_and_deterministically() {
        let (records, state) = recorded(16, 300);
        assert!(records.iter().any(|r| r.preemptions > 0), "the recorded run preempted");
        assert!(records.iter().any(|r| r.attempts.iter().any(|a| a.end == muster_core::sm::AttemptEnd::Failed)));
        let (jobs, order) = workload_of(&records, state.now_ms());
        let a = replay(jobs.clone(), &settings(fleet(16, "n"))).unwrap();
        let b = replay(jobs.clone(), &settings(fleet(16, "n"))).unwrap();
        assert_eq!(a, b, "the same input and settings replay the same");
        let report = compare(&records, &order, 128, &a, None);
        let f = &report.fidelity;
        assert_eq!(f.compared, 300);
        // The same simulator, but other claim delays: close for most jobs,
        // not exact (a queue this long amplifies small differences).
        assert!(f.within_10pct > 0.5 && f.abs_error_s.p50 < 2.0, "{f:?}");
        let text = report.to_string();
        let classes: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("class ")).collect();
        assert!(classes[0].starts_with("0 ") && classes.last().unwrap().starts_with("10 "), "{text}");
        assert!(report.overall.as_recorded.preemptions > 0);
        let done = |s: &muster_sim::replay::Summary| s.started;
        assert_eq!(done(&report.overall.actual), done(&report.overall.as_recorded));

        // Four more nodes: every group waits less, and the digest differs.
        let more = replay(jobs.clone(), &settings([fleet(16, "n"), fleet(4, "extra")].concat())).unwrap();
        let report = compare(&records, &order, 128, &a, Some(&more));
        let w = report.overall.what_if.as_ref().unwrap();
        assert!(w.wait_s.p95 < report.overall.as_recorded.wait_s.p95 / 2.0, "{report}");
        assert!(w.wait_s.mean < report.overall.as_recorded.wait_s.mean, "{report}");
        assert!(!report.gainers.is_empty());
        assert_ne!(report.digest_what_if.as_deref(), Some(report.digest_as_recorded.as_str()));
        let csv = report.to_csv();
        assert_eq!(csv.lines().count(), 301);
        assert!(csv.starts_with("id,owner,vcluster,class,gpus,submit_s,actual_wait_s"));
        let text = report.to_string();
        for needle in ["fidelity", "by owner", "by vCluster", "by class", "gain most", "lose most"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    fn one(id: u64, submit_ms: u64, attempts: Vec<(u64, u64, muster_core::sm::AttemptEnd)>) -> JobRecord {
        use muster_core::history::{AttemptRecord, RecordedShape};
        let spec = muster_core::sm::AllocSpec::new("ann", 1, NODE, vec!["x".into()]);
        JobRecord {
            seq: id,
            id,
            owner: "ann".into(),
            vcluster: "default".into(),
            class: 0,
            priority: 0,
            gang_size: 1,
            resources: NODE,
            command: vec!["x".into()],
            idempotency_key: None,
            submit_ms,
            start_ms: attempts.first().map(|a| a.0),
            end_ms: attempts.last().map_or(submit_ms, |a| a.1),
            status: AllocStatus::Done,
            reason: String::new(),
            preemptions: 0,
            watchdog_trips: 0,
            gpu_seconds: 0,
            attempts: attempts
                .iter()
                .enumerate()
                .map(|(i, &(start_ms, end_ms, end))| AttemptRecord {
                    task: 0,
                    run: i as u32 + 1,
                    node: "n-0".into(),
                    start_ms,
                    end_ms,
                    end,
                    exit_code: None,
                    gpu_seconds: 0,
                    preempted: false,
                    watchdog: None,
                    usage: None,
                })
                .collect(),
            array: None,
            shape: Some(RecordedShape::of(&spec)),
            waits: Default::default(),
        }
    }

    #[test]
    fn t81_own_failures_cancels_and_dependencies_replay_as_they_happened() {
        use muster_core::sm::AttemptEnd::{Done, Failed, Lost};
        let base = 1_700_000_000_000;
        // 1: fails after 10 s, then runs 20 s; its lost attempt was the
        // fleet's doing and is decided again.
        let first = one(
            1,
            base,
            vec![
                (base, base + 5_000, Lost),
                (base + 6_000, base + 16_000, Failed),
                (base + 17_000, base + 37_000, Done),
            ],
        );
        // 2: waits for 1 to succeed, then runs 5 s.
        let mut second = one(2, base + 1_000, vec![(base + 38_000, base + 43_000, Done)]);
        second.shape.as_mut().unwrap().after.deps = vec![Dependency { on: 1, when: AfterWhen::Ok }];
        // 3: cancelled while queued behind both, 100 s in.
        let mut third = one(3, base + 2_000, vec![]);
        third.status = AllocStatus::Cancelled;
        third.end_ms = base + 100_000;
        let records = vec![third, second, first];
        let (jobs, order) = workload_of(&records, base + 200_000);
        assert_eq!(order, [2, 1, 0], "submit order");
        let run = replay(jobs, &settings(fleet(2, "n"))).unwrap();
        let o = &run.outcomes;
        // 1 starts at once and ends after its failed run, the 1 s back-off
        // and its good run.
        assert_eq!(o[0].status, Some(AllocStatus::Done));
        let (start, end) = (o[0].start_ms.unwrap(), o[0].end_ms.unwrap());
        assert!(start < 1_000 && (31_000..34_000).contains(&(end - start)), "{:?}", o[0]);
        // 2 starts only once 1 has succeeded.
        assert!(o[1].start_ms.unwrap() >= end, "{o:?}");
        assert_eq!(o[1].status, Some(AllocStatus::Done));
        // 3 never ran, so nothing says how long it would have: it takes
        // the other node until its owner cancels it, 100 s in.
        assert!(o[2].start_ms.unwrap() < 3_000, "{o:?}");
        assert_eq!(o[2].status, Some(AllocStatus::Cancelled));
        // (it ends once its agent has stopped it)
        assert!((100_000..106_000).contains(&o[2].end_ms.unwrap()), "{o:?}");
        let report = compare(&records, &order, 8, &run, None);
        assert_eq!(report.rows[2].actual_wait_s, None, "3 never really ran");
        assert_eq!(report.rows[0].actual_wait_s, Some(0.0));
    }
}
