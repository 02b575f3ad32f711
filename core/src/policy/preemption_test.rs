//! Golden-file tests of the preemption decision table: each scenario builds a
//! cluster, asks [`decide`] for a preemptor, and renders the answer (every
//! candidate's cost breakdown, the victims chosen, the nodes, or why not).
//! The rendering of all scenarios is compared with
//! `policy/testdata/preemption.golden`; `MUSTER_BLESS=1 cargo test` rewrites
//! it after a deliberate change (review the diff).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::preemption::{NoPreemption, PreemptionConfig, Preemptor, decide, plan_preemptions, score};
use crate::sm::{
    AllocId, AllocSpec, ApplyCtx, CheckpointMode, Command, Event, NodeId, Resources, State, VCLUSTER_LABEL,
    VClusterType,
};

const MIN: u64 = 60_000;

fn node_res(gpus: u32) -> Resources {
    Resources { gpus, vram_mb: 80_000, mem_mb: 1_000_000, cpus: 64 }
}

struct Cluster {
    s: State,
    t: u64,
}

impl Cluster {
    fn new(nodes: &[(u32, &str)]) -> Cluster {
        let mut c = Cluster { s: State::default(), t: 1_000 };
        for (i, &(gpus, vc)) in nodes.iter().enumerate() {
            if !vc.is_empty() {
                // The vCluster label is an admin's, laid over what the node reports.
                let set = BTreeMap::from([(VCLUSTER_LABEL.to_string(), vc.to_string())]);
                c.ok(Command::LabelNode {
                    node: NodeId::new(format!("n{i}")),
                    set,
                    remove: vec![],
                    by: "admin".into(),
                });
            }
            let labels = BTreeMap::new();
            c.ok(Command::RegisterNode { node: NodeId::new(format!("n{i}")), resources: node_res(gpus), labels });
            c.ok(Command::MarkNodeReady { node: NodeId::new(format!("n{i}")) });
        }
        // The vClusters the nodes name exist (allocations may only name one
        // that does).
        let names: std::collections::BTreeSet<&str> =
            nodes.iter().map(|&(_, vc)| vc).filter(|vc| !vc.is_empty() && *vc != "default").collect();
        for name in names {
            // They may borrow each other's nodes (the service scenario runs
            // one on another vCluster's node).
            let mut spec = crate::sm::VClusterSpec::default_for(name);
            spec.borrow_limit_pct = 100;
            c.ok(Command::CreateVCluster { name: name.into(), spec, by: "test".into() });
        }
        c
    }

    fn ok(&mut self, cmd: Command) -> Vec<Event> {
        let out = self.s.apply(&cmd, &ApplyCtx { time_ms: self.t });
        assert!(out.is_accepted(), "{cmd:?}: {out:?}");
        out.events().to_vec()
    }

    /// Runs a gang of `nodes.len()` tasks × `gpus`, started at `at_ms`.
    fn run(&mut self, gpus: u32, class: u8, nodes: &[u32], at_ms: u64, edit: impl Fn(&mut AllocSpec)) -> AllocId {
        assert!(at_ms >= self.t, "runs are started in time order");
        self.t = at_ms;
        let mut spec = AllocSpec::new(
            "u",
            nodes.len() as u32,
            Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 },
            vec!["x".into()],
        );
        spec.preemption_class = class;
        edit(&mut spec);
        let id = match self.ok(Command::Submit { spec })[..] {
            [Event::Submitted { alloc, .. }] => alloc,
            ref e => panic!("{e:?}"),
        };
        let nodes: Vec<NodeId> = nodes.iter().map(|i| NodeId::new(format!("n{i}"))).collect();
        self.ok(Command::ReserveGang { alloc: id, epoch: 1, nodes: nodes.clone() });
        for (task, node) in nodes.into_iter().enumerate() {
            self.ok(Command::StartTask { alloc: id, task: task as u32, node, epoch: 1 });
        }
        id
    }

    fn preemptor(gang: u32, gpus: u32, class: u8) -> Preemptor {
        Preemptor {
            alloc: None,
            class,
            gang_size: gang,
            resources: Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 },
            walltime_s: 3600,
            home: None,
            placement: Default::default(),
        }
    }

    /// Renders every running allocation's score and the decision at `now`.
    fn render(&self, title: &str, p: &Preemptor, now: u64, cfg: &PreemptionConfig) -> String {
        let mut out = format!(
            "== {title}\npreemptor: gang {} x {} GPU, class {}, value {} GPU-s\n",
            p.gang_size,
            p.resources.gpus,
            p.class,
            p.value()
        );
        for a in self.s.allocs().values().filter(|a| a.running_since_ms().is_some()) {
            let c = score(a, now, cfg);
            let _ = writeln!(
                out,
                "  candidate {:>2}: class {} {:>11} {:<8} G={:<2} e={:>5}s  checkpoint {:>6} + recompute {:>6} + value {:>6} = {:>6}",
                a.id,
                a.spec.preemption_class,
                a.spec.vcluster_type.as_str(),
                format!("{:?}", a.spec.checkpoint).to_lowercase(),
                c.gpus,
                c.elapsed_s,
                c.checkpoint_gpu_s,
                c.recompute_gpu_s,
                c.value_gpu_s,
                c.total()
            );
        }
        match decide(&self.s, p, now, cfg, &BTreeSet::new(), &BTreeSet::new()) {
            Ok(d) => {
                let victims: Vec<String> = d.victims.iter().map(|v| v.alloc.to_string()).collect();
                let nodes: Vec<String> = d.nodes.iter().map(|&s| self.s.node(s).id.to_string()).collect();
                let _ = writeln!(
                    out,
                    "  => preempt [{}] (cost {} < value {}), place on [{}]",
                    victims.join(", "),
                    d.cost_gpu_s,
                    d.value_gpu_s,
                    nodes.join(", ")
                );
            }
            Err(why) => {
                let _ = writeln!(out, "  => {why}");
            }
        }
        out
    }
}

fn cfg() -> PreemptionConfig {
    PreemptionConfig { min_runtime_ms: 2 * MIN, near_completion_ms: 5 * MIN, ..PreemptionConfig::default() }
}

fn scenarios() -> String {
    let mut all = String::new();
    // Half an hour in: every default (1 h) candidate is half done.
    let now = 1_000 + 30 * MIN;

    // Filtering: candidates 1-5 are excluded; 6, 7 and 8 are not.
    let mut c = Cluster::new(&[(8, ""); 8]);
    c.run(8, 5, &[0], 1_000, |_| {}); // 1: class not below 5
    c.run(8, 10, &[1], 1_000, |s| s.sensitive = true); // 2: sensitive, class 10
    c.run(8, 3, &[2], 1_000, |s| s.walltime_s = 1_900); // 3: 100 s from its walltime
    c.run(8, 4, &[4], 1_000, |s| s.vcluster_type = VClusterType::Service); // 4: service at home
    c.run(8, 4, &[5], 1_000, |s| s.checkpoint = CheckpointMode::None); // 5: none below class 7: preemptible
    c.run(8, 2, &[6], 1_000, |s| s.checkpoint_estimate_s = 30); // 6: the cheapest
    c.run(8, 2, &[7], 1_000, |_| {}); // 7: preemptible
    c.run(8, 3, &[3], now - MIN, |_| {}); // 8: started a minute ago
    all += &c.render(
        "filtering: class, sensitive, near completion, min runtime, service at home",
        &Cluster::preemptor(1, 8, 5),
        now,
        &cfg(),
    );

    // Scoring: one candidate per checkpoint mode and vCluster type.
    let mut c = Cluster::new(&[(8, ""); 5]);
    c.run(2, 1, &[0], 1_000, |_| {}); // auto, 60 s estimate
    c.run(2, 1, &[1], 1_000, |s| s.checkpoint = CheckpointMode::Manual); // manual: 600 s timeout
    c.run(2, 1, &[2], 1_000, |s| s.checkpoint = CheckpointMode::None); // none: recompute 3600 s
    c.run(2, 1, &[3], 1_000, |s| s.vcluster_type = VClusterType::MlTraining); // checkpoint doubled
    c.run(2, 1, &[4], 1_000, |s| {
        s.vcluster_type = VClusterType::Interactive;
        s.walltime_s = 2 * 3600;
    }); // value halved; a quarter of its walltime done
    all +=
        &c.render("scoring: auto, manual, none, ml-training, interactive", &Cluster::preemptor(1, 8, 6), now, &cfg());

    // Greedy: the cheapest single victim that frees a whole node.
    let mut c = Cluster::new(&[(8, ""); 3]);
    c.run(8, 1, &[0], 1_000, |s| s.checkpoint_estimate_s = 300);
    c.run(8, 1, &[1], 1_000, |s| s.checkpoint_estimate_s = 30);
    c.run(8, 1, &[2], 1_000, |s| s.checkpoint_estimate_s = 120);
    all += &c.render("greedy: the cheapest single victim", &Cluster::preemptor(1, 8, 4), now, &cfg());

    // Fewer, larger: one gang of 2 frees both nodes; two singles would be cheaper in sum.
    let mut c = Cluster::new(&[(8, ""); 4]);
    c.run(8, 1, &[0, 1], 1_000, |s| s.checkpoint_estimate_s = 40); // G=16: 640 + value
    c.run(8, 1, &[2], 1_000, |s| s.checkpoint_estimate_s = 10);
    c.run(8, 1, &[3], 1_000, |s| s.checkpoint_estimate_s = 10);
    all += &c.render("fewer, larger victims: one gang over two singles", &Cluster::preemptor(2, 8, 4), now, &cfg());

    // A gang needs N distinct nodes: two victims on one node do not make two nodes.
    let mut c = Cluster::new(&[(8, ""); 3]);
    c.run(4, 1, &[0], 1_000, |_| {});
    c.run(4, 1, &[0], 1_000, |_| {});
    c.run(8, 1, &[1], 1_000, |s| s.checkpoint_estimate_s = 200);
    c.run(8, 1, &[2], 1_000, |s| s.checkpoint_estimate_s = 400);
    all += &c.render(
        "whole gang: two victims share one node; the gang needs two nodes",
        &Cluster::preemptor(2, 8, 4),
        now,
        &cfg(),
    );

    // Several victims on one node, none enough alone.
    let mut c = Cluster::new(&[(8, "")]);
    c.run(4, 1, &[0], 1_000, |s| s.checkpoint_estimate_s = 90);
    c.run(4, 1, &[0], 1_000, |s| s.checkpoint_estimate_s = 30);
    all += &c.render("multi-victim: two halves of one node", &Cluster::preemptor(1, 8, 4), now, &cfg());

    // Max victims: four nodes, one victim each.
    let mut c = Cluster::new(&[(8, ""); 4]);
    for i in 0..4 {
        c.run(8, 1, &[i], 1_000, |_| {});
    }
    all += &c.render("max victims: 4 needed, 3 allowed", &Cluster::preemptor(4, 8, 9), now, &cfg());
    let four = PreemptionConfig { max_victims: 4, ..cfg() };
    all += &c.render("max victims: 4 needed, 4 allowed", &Cluster::preemptor(4, 8, 9), now, &four);

    // Value bound: a short, low-class preemptor is not worth a long-running victim.
    let mut c = Cluster::new(&[(8, "")]);
    c.run(8, 0, &[0], 1_000, |s| s.checkpoint = CheckpointMode::None);
    let mut cheap = Cluster::preemptor(1, 8, 1);
    cheap.walltime_s = 600;
    all += &c.render("value bound: cost above the preemptor's value", &cheap, now, &cfg());

    // Ties: equal totals → lower checkpoint cost; then lower id.
    let mut c = Cluster::new(&[(8, ""); 3]);
    c.run(8, 1, &[0], 1_000, |s| {
        s.checkpoint = CheckpointMode::Manual; // 8 × 600 = 4800
        s.walltime_s = 8_100; // value 8 × 1800 × 1800 / 8100 = 3200
    });
    c.run(8, 1, &[1], 1_000, |s| s.checkpoint_estimate_s = 100); // 800 + 7200
    c.run(8, 1, &[2], 1_000, |s| s.checkpoint_estimate_s = 100); // the same as 2
    all +=
        &c.render("ties: same total, lower checkpoint cost, then lower id", &Cluster::preemptor(1, 8, 4), now, &cfg());

    // Not needed, and never possible.
    let mut c = Cluster::new(&[(8, ""), (2, "")]);
    c.run(4, 1, &[0], 1_000, |_| {});
    all += &c.render("not needed: a node fits now", &Cluster::preemptor(1, 4, 4), now, &cfg());
    all += &c.render("too few nodes: only one node has 8 GPUs", &Cluster::preemptor(2, 8, 4), now, &cfg());
    all += &c.render("class 0 preempts nothing", &Cluster::preemptor(1, 8, 0), now, &cfg());

    // Services: preempted only on borrowed nodes (another vCluster's).
    let mut c = Cluster::new(&[(8, "web"), (8, "batch")]);
    c.run(8, 1, &[0], 1_000, |s| {
        s.vcluster = "web".into();
        s.vcluster_type = VClusterType::Service;
    });
    c.run(8, 1, &[1], 1_000, |s| {
        s.vcluster = "web".into();
        s.vcluster_type = VClusterType::Service;
    });
    all +=
        &c.render("service: home node protected, borrowed node preemptible", &Cluster::preemptor(1, 8, 4), now, &cfg());
    all
}

#[test]
fn the_decision_table_matches_the_golden_file() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/policy/testdata/preemption.golden");
    let got = scenarios();
    if std::env::var_os("MUSTER_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
            if g != w {
                panic!(
                    "golden file differs at line {}:\n  got:  {g}\n  want: {w}\n(MUSTER_BLESS=1 rewrites it)",
                    i + 1
                );
            }
        }
        panic!(
            "golden file differs in length ({} vs {} lines); MUSTER_BLESS=1 rewrites it",
            got.lines().count(),
            want.lines().count()
        );
    }
}

#[test]
fn a_pass_does_not_reuse_victims_or_nodes_and_goes_by_class() {
    let mut c = Cluster::new(&[(8, ""); 2]);
    let a = c.run(8, 1, &[0], 1_000, |_| {});
    let b = c.run(8, 1, &[1], 1_000, |_| {});
    let mut submit = |class: u8| {
        let mut spec =
            AllocSpec::new("u", 1, Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }, vec!["x".into()]);
        spec.preemption_class = class;
        match c.ok(Command::Submit { spec })[..] {
            [Event::Submitted { alloc, .. }] => alloc,
            ref e => panic!("{e:?}"),
        }
    };
    let low = submit(3);
    let high = submit(7);
    let third = submit(5);
    let now = 1_000 + 30 * MIN;
    let plan = plan_preemptions(&c.s, now, &cfg());
    let got: Vec<(AllocId, Vec<AllocId>)> =
        plan.iter().map(|(p, d)| (*p, d.victims.iter().map(|v| v.alloc).collect())).collect();
    assert_eq!(got, vec![(high, vec![a]), (third, vec![b])], "class 7 first, then 5; class 3 finds nothing left");
    let _ = low;
    // Applied in order, every decision is accepted.
    for (p, d) in &plan {
        let cmd = d.command(&c.s, *p, &cfg());
        c.ok(cmd);
    }
    c.s.check_invariants().unwrap();
    assert!(plan_preemptions(&c.s, now, &cfg()).is_empty(), "nothing left to preempt: victims are stopping");
}

#[test]
fn two_allocations_cannot_preempt_each_other_back_and_forth() {
    let mut c = Cluster::new(&[(8, "")]);
    let low = c.run(8, 2, &[0], 1_000, |_| {});
    let mut spec =
        AllocSpec::new("u", 1, Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }, vec!["x".into()]);
    spec.preemption_class = 6;
    let high = match c.ok(Command::Submit { spec })[..] {
        [Event::Submitted { alloc, .. }] => alloc,
        ref e => panic!("{e:?}"),
    };
    c.t = 1_000 + 30 * MIN;
    let plan = plan_preemptions(&c.s, c.t, &cfg());
    assert_eq!(plan.len(), 1);
    let cmd = plan[0].1.command(&c.s, high, &cfg());
    c.ok(cmd);
    c.ok(Command::ConfirmPreempted {
        alloc: low,
        task: 0,
        node: NodeId::new("n0"),
        epoch: 1,
        checkpoint_failed: false,
    });
    c.ok(Command::StartTask { alloc: high, task: 0, node: NodeId::new("n0"), epoch: 1 });
    // The suspended low-class gang waits; it can never preempt the higher class back.
    for minutes in [1, 10, 100] {
        let now = c.t + minutes * MIN;
        assert!(plan_preemptions(&c.s, now, &cfg()).is_empty(), "at +{minutes} min");
        let p = Preemptor::of(&c.s, c.s.alloc(low).unwrap());
        assert!(matches!(
            decide(&c.s, &p, now, &cfg(), &BTreeSet::new(), &BTreeSet::new()),
            Err(NoPreemption::NotEnough { .. })
        ));
    }
    // And a new higher class cannot take the node from the gang that just started.
    let p = Cluster::preemptor(1, 8, 9);
    let why = decide(&c.s, &p, c.t + MIN, &cfg(), &BTreeSet::new(), &BTreeSet::new()).unwrap_err();
    assert!(why.to_string().contains("1 within their minimum runtime"), "{why}");
}

#[test]
fn top_sum_adds_the_k_largest() {
    use super::preemption::top_sum;
    assert_eq!(top_sum([5, 1, 9, 3, 7].into_iter(), 3), 21);
    assert_eq!(top_sum([5, 1].into_iter(), 3), 6);
    assert_eq!(top_sum([4, 4, 4, 4].into_iter(), 2), 8);
    assert_eq!(top_sum(std::iter::empty(), 3), 0);
    assert_eq!(top_sum(1..=20u64, 10), (11..=20).sum::<u64>(), "beyond the fixed array");
    assert_eq!(top_sum([u64::MAX, 1].into_iter(), 2), u64::MAX, "saturates");
}

#[test]
fn windows_read_candidates_until_one_gives_a_valid_set() {
    // 300 full nodes; only the last one's job is preemptible (the rest are
    // class 9). With windows of 100 nodes the decision still finds it.
    let mut c = Cluster::new(&[(8, ""); 300]);
    for i in 0..299 {
        c.run(8, 9, &[i], 1_000, |_| {});
    }
    let v = c.run(8, 1, &[299], 1_000, |_| {});
    let cfg = PreemptionConfig { min_candidate_nodes: 100, candidate_nodes_percent: 1, ..cfg() };
    let d =
        decide(&c.s, &Cluster::preemptor(1, 8, 5), 1_000 + 30 * MIN, &cfg, &BTreeSet::new(), &BTreeSet::new()).unwrap();
    assert_eq!(d.victims.iter().map(|v| v.alloc).collect::<Vec<_>>(), vec![v]);
    // Class 9 holders make their nodes infeasible for class 9 and below, without any lookup.
    let why = decide(&c.s, &Cluster::preemptor(1, 8, 1), 1_000 + 30 * MIN, &cfg, &BTreeSet::new(), &BTreeSet::new())
        .unwrap_err();
    assert!(why.to_string().contains("300 not of a lower class"), "{why}");
}

#[test]
fn each_earlier_preemption_lengthens_the_protection_after_a_restart() {
    let mut c = Cluster::new(&[(8, "")]);
    let low = c.run(8, 1, &[0], 1_000, |_| {});
    let mut spec =
        AllocSpec::new("u", 1, Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }, vec!["x".into()]);
    spec.preemption_class = 5;
    let hi = match c.ok(Command::Submit { spec })[..] {
        [Event::Submitted { alloc, .. }] => alloc,
        ref e => panic!("{e:?}"),
    };
    c.t = 1_000 + 30 * MIN;
    let plan = plan_preemptions(&c.s, c.t, &cfg());
    let cmd = plan[0].1.command(&c.s, hi, &cfg());
    c.ok(cmd);
    c.ok(Command::ConfirmPreempted {
        alloc: low,
        task: 0,
        node: NodeId::new("n0"),
        epoch: 1,
        checkpoint_failed: false,
    });
    c.ok(Command::CancelAllocation { alloc: hi });
    // The suspended gang runs again (preempted once: protected 2 × 2 min).
    c.ok(Command::ReserveGang { alloc: low, epoch: 2, nodes: vec![NodeId::new("n0")] });
    c.ok(Command::StartTask { alloc: low, task: 0, node: NodeId::new("n0"), epoch: 2 });
    let restarted = c.t;
    let p = Cluster::preemptor(1, 8, 5);
    let at = |ms: u64| decide(&c.s, &p, restarted + ms, &cfg(), &BTreeSet::new(), &BTreeSet::new());
    assert!(at(3 * MIN).unwrap_err().to_string().contains("1 within their minimum runtime"));
    assert_eq!(at(4 * MIN).unwrap().victims[0].alloc, low);
}

#[test]
fn class_ten_and_sensitive_work_is_never_chosen_and_a_sensitive_claim_is_labelled() {
    let mut c = Cluster::new(&[(8, ""); 3]);
    c.run(8, 10, &[0], 1_000, |_| {});
    c.run(8, 10, &[1], 1_000, |s| s.sensitive = true);
    c.run(8, 10, &[2], 1_000, |s| s.vcluster_type = VClusterType::Sensitive);
    let now = 1_000 + 30 * MIN;
    for class in [9, 10] {
        let why = decide(&c.s, &Cluster::preemptor(1, 8, class), now, &cfg(), &BTreeSet::new(), &BTreeSet::new())
            .unwrap_err();
        assert!(why.to_string().contains("3 not of a lower class"), "class {class}: {why}");
    }
}

#[test]
fn a_sensitive_claim_preempts_lower_classes_with_reason_sensitive() {
    let mut c = Cluster::new(&[(8, "")]);
    let low = c.run(8, 9, &[0], 1_000, |_| {});
    let mut spec =
        AllocSpec::new("u", 1, Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }, vec!["x".into()]);
    spec.preemption_class = 10;
    spec.sensitive = true;
    let claim = match c.ok(Command::Submit { spec })[..] {
        [Event::Submitted { alloc, .. }] => alloc,
        ref e => panic!("{e:?}"),
    };
    c.t = 1_000 + 30 * MIN;
    let plan = plan_preemptions(&c.s, c.t, &cfg());
    assert_eq!(plan.len(), 1);
    let cmd = plan[0].1.command(&c.s, claim, &cfg());
    let events = c.ok(cmd);
    assert!(
        matches!(&events[0], Event::PreemptionDecided { victims, reason: crate::sm::PreemptReason::Sensitive, .. } if victims == &vec![low]),
        "{events:?}"
    );
}

#[test]
fn a_victim_is_forced_only_after_the_agent_s_longest_checkpoint_path_with_a_full_deferral() {
    // The agent's longest path: the timeout, its +50 % extension, a full
    // deferral on top (a deferral extends the deadline in force), the grace.
    let cfg =
        PreemptionConfig { checkpoint_timeout_ms: 20_000, max_deferral_ms: 10_000, ..PreemptionConfig::default() };
    assert_eq!(cfg.force_after_ms(true), 30_000 + 10_000 + cfg.grace_ms + cfg.force_slack_ms);
    let defaults = PreemptionConfig::default();
    assert_eq!(defaults.force_after_ms(true), 900_000 + 300_000 + defaults.grace_ms + defaults.force_slack_ms);
    assert_eq!(defaults.force_after_ms(false), defaults.grace_ms + defaults.force_slack_ms);
}

/// A preemptor that must run on H100s frees only H100 nodes, and a packed
/// one takes victims' nodes only under one rack.
#[test]
fn preemption_honours_constraints_and_packing() {
    let mut c = Cluster::new(&[(8, ""), (8, ""), (8, "")]);
    let on = |c: &mut Cluster, i: u32, labels: &[(&str, &str)]| {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        c.ok(Command::RegisterNode { node: NodeId::new(format!("n{i}")), resources: node_res(8), labels });
    };
    on(&mut c, 0, &[("gpu.model", "A100"), ("rack", "r1")]);
    on(&mut c, 1, &[("gpu.model", "H100"), ("rack", "r1")]);
    on(&mut c, 2, &[("gpu.model", "H100"), ("rack", "r2")]);
    let victims: Vec<AllocId> = (0..3).map(|i| c.run(8, 2, &[i], 2_000, |_| {})).collect();
    let now = 20 * MIN;
    let mut p = Cluster::preemptor(1, 8, 8);
    p.placement.constraints = crate::sm::LabelExpr::parse_list("gpu.model=H100").unwrap();
    let d = decide(&c.s, &p, now, &PreemptionConfig::default(), &BTreeSet::new(), &BTreeSet::new()).unwrap();
    let node = c.s.node(d.nodes[0]).id.to_string();
    assert!(node == "n1" || node == "n2", "{node}");
    assert!(d.victims.iter().all(|v| v.alloc != victims[0]), "the A100 node's work is spared: {d:?}");
    // Two tasks under one rack: only r1 has two nodes.
    let mut p = Cluster::preemptor(2, 8, 8);
    p.placement.pack_by = Some(crate::sm::Packing::parse("rack").unwrap());
    let d = decide(&c.s, &p, now, &PreemptionConfig::default(), &BTreeSet::new(), &BTreeSet::new()).unwrap();
    let mut nodes: Vec<String> = d.nodes.iter().map(|&s| c.s.node(s).id.to_string()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n0", "n1"]);
}
