//! Admission-planning benchmark: one full pass over 10,000 queued gangs of
//! mixed sizes on 1,000 and 10,000 8-GPU nodes.
//!
//! Run with `cargo bench -p muster-scheduler --bench admission`. Reports, per
//! scenario, the latency of one pass (median and best of several) and task
//! placements per second, for planning alone and for planning plus applying
//! the plan to the state machine.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use muster_scheduler::policy::{AdmissionConfig, plan_admission};
use muster_scheduler::sm::{
    AllocSpec, ApplyCtx, Command, LabelExpr, NodeId, Packing, Quota, Resources, State, Usage, VClusterSpec, fits,
};

const NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };

/// The GPU models of a mixed fleet.
const MODELS: [&str; 4] = ["A100", "H100", "H200", "L40S"];

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick(&mut self, weighted: &[(u64, u32)]) -> u32 {
        let total: u64 = weighted.iter().map(|w| w.0).sum();
        let mut x = self.next() % total;
        for &(w, v) in weighted {
            if x < w {
                return v;
            }
            x -= w;
        }
        unreachable!()
    }
}

/// `nodes` nodes, of which `busy_share` (0..1) have every GPU taken by a
/// running single-node job, and `gangs` queued gangs of mixed shapes; with
/// `quota`, every gang belongs to one vCluster capped at that many GPUs;
/// `mixed`, nodes carry one of four GPU models and a rack of 32, a quarter
/// of the gangs ask for a model and a tenth must be packed in one rack.
fn build(nodes: u32, gangs: u32, busy_share: f64, quota: Option<u32>, mixed: bool) -> State {
    let mut s = State::default();
    let ctx = ApplyCtx { time_ms: 1_000 };
    if let Some(max_gpus) = quota {
        let spec = VClusterSpec {
            quota: Quota { max_gpus: Some(max_gpus), ..Quota::default() },
            ..VClusterSpec::default_for("capped")
        };
        let cmd = Command::CreateVCluster { name: "capped".into(), spec, by: "bench".into() };
        assert!(s.apply(&cmd, &ctx).is_accepted());
    }
    for i in 0..nodes {
        if quota.is_some() {
            // The capped vCluster's gangs run on its home nodes (an admin's label).
            let set = BTreeMap::from([(muster_scheduler::sm::VCLUSTER_LABEL.to_string(), "capped".to_string())]);
            let node = NodeId::new(format!("node-{i:05}"));
            let cmd = Command::LabelNode { node, set, remove: vec![], by: "bench".into() };
            assert!(s.apply(&cmd, &ctx).is_accepted());
        }
        let cmd = Command::RegisterNode {
            node: NodeId::new(format!("node-{i:05}")),
            resources: NODE,
            labels: {
                let mut labels = BTreeMap::new();
                if mixed {
                    labels.insert("gpu.model".to_string(), MODELS[i as usize % MODELS.len()].to_string());
                    labels.insert("rack".to_string(), format!("r{:03}", i / 32));
                }
                labels
            },
        };
        assert!(s.apply(&cmd, &ctx).is_accepted());
        let ready = Command::MarkNodeReady { node: NodeId::new(format!("node-{i:05}")) };
        assert!(s.apply(&ready, &ctx).is_accepted());
    }
    let busy = (f64::from(nodes) * busy_share) as u32;
    let filler = Resources { gpus: 8, vram_mb: 10_000, mem_mb: 1_000, cpus: 1 };
    for i in 0..busy {
        let spec = AllocSpec::new("filler", 1, filler, vec!["x".into()]);
        s.apply(&Command::Submit { spec }, &ctx);
        let alloc = u64::from(i) + 1;
        let node = NodeId::new(format!("node-{i:05}"));
        assert!(s.apply(&Command::ReserveGang { alloc, epoch: 1, nodes: vec![node.clone()] }, &ctx).is_accepted());
        assert!(s.apply(&Command::StartTask { alloc, task: 0, node, epoch: 1 }, &ctx).is_accepted());
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..gangs {
        let gang = rng.pick(&[(60, 1), (15, 2), (12, 4), (9, 8), (4, 16)]);
        let gpus = rng.pick(&[(40, 1), (15, 2), (20, 4), (25, 8)]);
        let res = Resources { gpus, vram_mb: 40_000, mem_mb: 64_000 * u64::from(gpus), cpus: 6 * gpus };
        let mut spec = AllocSpec::new(format!("u{}", i % 50), gang, res, vec!["train".into()]);
        spec.preemption_class = (rng.next() % 11) as u8;
        spec.priority = (rng.next() % 4) as i32;
        if quota.is_some() {
            spec.vcluster = "capped".into();
        }
        if mixed {
            let roll = rng.next() % 20;
            if roll < 5 {
                let model = MODELS[(rng.next() % MODELS.len() as u64) as usize];
                spec.placement.constraints = LabelExpr::parse_list(&format!("gpu.model={model}")).unwrap();
            } else if roll < 7 {
                spec.placement.pack_by = Some(Packing::parse("rack").unwrap());
            }
        }
        assert!(s.apply(&Command::Submit { spec }, &ApplyCtx { time_ms: 1_000 + u64::from(i) }).is_accepted());
    }
    s
}

/// The peer: what admission costs without a capacity index. For every gang
/// in admission order, rescan every node (first fit) on a copy of the free
/// capacity: O(nodes × gangs) per pass.
fn naive_pass(s: &State) -> usize {
    let mut free: Vec<Usage> = s.nodes().iter().map(|n| n.free()).collect();
    let mut placed = 0;
    let mut chosen = Vec::new();
    for key in s.queue() {
        let a = s.alloc(key.alloc).unwrap();
        chosen.clear();
        for (i, node) in s.nodes().iter().enumerate() {
            if fits(&a.spec.resources, &node.resources, &free[i]) {
                chosen.push(i);
                if chosen.len() == a.spec.gang_size as usize {
                    break;
                }
            }
        }
        if chosen.len() == a.spec.gang_size as usize {
            for &i in &chosen {
                free[i] = free[i].minus(&Usage::of(&a.spec.resources));
            }
            placed += chosen.len();
        }
    }
    placed
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn scenario(name: &str, nodes: u32, gangs: u32, busy_share: f64, quota: Option<u32>, mixed: bool, rounds: usize) {
    let state = build(nodes, gangs, busy_share, quota, mixed);
    let cfg = AdmissionConfig::default();
    let now = 10_000;
    let mut plan_times = Vec::new();
    let mut plan = plan_admission(&state, now, &cfg);
    for _ in 0..rounds {
        let t = Instant::now();
        plan = black_box(plan_admission(black_box(&state), now, &cfg));
        plan_times.push(t.elapsed());
    }
    // The same pass without backfill, interleaved in this run: what planned
    // starts cost.
    let off = AdmissionConfig { backfill: false, ..cfg };
    let mut off_times = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        black_box(plan_admission(black_box(&state), now, &off));
        off_times.push(t.elapsed());
    }
    let without_backfill = median(off_times);
    let mut apply_times = Vec::new();
    for _ in 0..rounds.min(5) {
        let mut s = state.clone();
        let t = Instant::now();
        let p = plan_admission(&s, now, &cfg);
        for cmd in &p.commands {
            assert!(s.apply(cmd, &ApplyCtx { time_ms: now }).is_accepted());
        }
        apply_times.push(t.elapsed());
    }
    let mut naive_times = Vec::new();
    let mut naive_tasks = 0;
    for _ in 0..rounds.min(3) {
        let t = Instant::now();
        naive_tasks = black_box(naive_pass(black_box(&state)));
        naive_times.push(t.elapsed());
    }
    let naive = median(naive_times);
    let (med, best) = (median(plan_times.clone()), *plan_times.iter().min().unwrap());
    let with_apply = median(apply_times);
    let tasks = plan.stats.tasks_placed as f64;
    println!(
        "{name:<34} {nodes:>6} nodes {gangs:>6} gangs | placed {:>5} gangs {:>6} tasks | pass median {:>8.2} ms best {:>8.2} ms | {:>10.0} placements/s | plan+apply {:>8.2} ms {:>10.0} placements/s | naive rescan {:>9.2} ms ({} tasks), indexed is {:.0}x faster | {} planned start(s), {} backfilled; without backfill {:>8.2} ms ({:.2}x)",
        plan.stats.gangs_placed,
        plan.stats.tasks_placed,
        med.as_secs_f64() * 1e3,
        best.as_secs_f64() * 1e3,
        tasks / med.as_secs_f64(),
        with_apply.as_secs_f64() * 1e3,
        tasks / with_apply.as_secs_f64(),
        naive.as_secs_f64() * 1e3,
        naive_tasks,
        naive.as_secs_f64() / med.as_secs_f64(),
        plan.stats.planned_starts,
        plan.stats.backfilled,
        without_backfill.as_secs_f64() * 1e3,
        med.as_secs_f64() / without_backfill.as_secs_f64(),
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing we need.
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 21 };
    println!("admission pass benchmark ({rounds} rounds per scenario, one thread)");
    scenario("empty cluster, 10k queued", 1_000, 10_000, 0.0, None, false, rounds);
    scenario("empty cluster, 10k queued", 10_000, 10_000, 0.0, None, false, rounds);
    scenario("90% busy cluster, 10k queued", 10_000, 10_000, 0.9, None, false, rounds);
    scenario("full cluster, 10k queued (no fit)", 10_000, 10_000, 1.0, None, false, rounds);
    // Every gang in one vCluster capped at 256 GPUs: the pass walks the
    // gangs its quota holds back (the naive peer ignores quotas).
    scenario("empty, 10k queued in a 256-GPU quota", 10_000, 10_000, 0.0, Some(256), false, rounds);
    // Four GPU models and racks of 32: a quarter of the gangs name a model,
    // a tenth must be packed in one rack (the naive peer ignores both).
    scenario("mixed fleet, constraints, empty", 10_000, 10_000, 0.0, None, true, rounds);
    scenario("mixed fleet, constraints, 90% busy", 10_000, 10_000, 0.9, None, true, rounds);
}
