//! Scenario tests of the admission cycle, taken from the gang-scheduling seed.

use std::collections::BTreeMap;

use super::*;
use crate::sm::{
    AllocId, AllocSpec, AllocStatus, ApplyCtx, Command, Event, NodeId, Outcome, Resources, State, TaskStatus,
};

fn node_res(gpus: u32) -> Resources {
    Resources { gpus, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 }
}

fn task_res(gpus: u32) -> Resources {
    Resources { gpus, vram_mb: if gpus > 0 { 40_000 } else { 0 }, mem_mb: 8_000, cpus: 4 }
}

struct Cluster {
    s: State,
    now: u64,
}

impl Cluster {
    /// Nodes n0, n1, … with the given GPU counts.
    fn new(gpus: &[u32]) -> Cluster {
        let mut c = Cluster { s: State::default(), now: 1_000 };
        for (i, &g) in gpus.iter().enumerate() {
            c.apply(Command::RegisterNode {
                node: NodeId::new(format!("n{i}")),
                resources: node_res(g),
                labels: BTreeMap::new(),
            });
            c.apply(Command::MarkNodeReady { node: NodeId::new(format!("n{i}")) });
        }
        c
    }

    fn apply(&mut self, cmd: Command) -> Vec<Event> {
        match self.s.apply(&cmd, &ApplyCtx { time_ms: self.now }) {
            Outcome::Accepted(ev) => ev,
            Outcome::Rejected(r) => panic!("{cmd:?} rejected: {r}"),
        }
    }

    fn submit_with(&mut self, gang: u32, gpus: u32, f: impl FnOnce(&mut AllocSpec)) -> AllocId {
        let mut spec = AllocSpec::new("u", gang, task_res(gpus), vec!["run".into()]);
        f(&mut spec);
        match self.apply(Command::Submit { spec })[..] {
            [Event::Submitted { alloc, .. }] => alloc,
            _ => unreachable!(),
        }
    }

    fn submit(&mut self, gang: u32, gpus: u32) -> AllocId {
        self.submit_with(gang, gpus, |_| {})
    }

    /// Plans one pass and applies it; every planned command must be accepted.
    fn pass(&mut self, cfg: &AdmissionConfig) -> AdmissionPlan {
        let plan = plan_admission(&self.s, self.now, cfg);
        for cmd in &plan.commands {
            self.apply(cmd.clone());
        }
        self.s.check_invariants().unwrap();
        plan
    }

    fn nodes_of(&self, id: AllocId) -> Vec<String> {
        self.s.alloc(id).unwrap().tasks.iter().map(|t| self.s.node(t.node.unwrap()).id.to_string()).collect()
    }

    fn status(&self, id: AllocId) -> AllocStatus {
        self.s.alloc(id).unwrap().status
    }

    fn start_all(&mut self, id: AllocId) {
        let a = self.s.alloc(id).unwrap().clone();
        for t in &a.tasks {
            let node = self.s.node(t.node.unwrap()).id.clone();
            self.apply(Command::StartTask { alloc: id, task: t.index, node, epoch: t.reservation_epoch });
        }
    }
}

/// The defaults without wait notes: these tests check the placements a
/// pass makes (`wait_notes_*` check its notes).
fn default_cfg() -> AdmissionConfig {
    AdmissionConfig { note_waits: false, ..AdmissionConfig::default() }
}

/// The seed's example: four free nodes, gang A of 3 and gang B of 4. Placing
/// A first would starve B; largest-first places B.
#[test]
fn largest_gang_first_avoids_starving_the_big_gang() {
    let mut c = Cluster::new(&[8, 8, 8, 8]);
    let a = c.submit(3, 8);
    let b = c.submit(4, 8);
    let plan = c.pass(&default_cfg());
    assert_eq!(plan.stats.gangs_placed, 1);
    assert_eq!(c.status(b), AllocStatus::Reserved);
    assert_eq!(c.status(a), AllocStatus::Queued);
    // FIFO would have placed A and left B waiting.
    let mut f = Cluster::new(&[8, 8, 8, 8]);
    let a = f.submit(3, 8);
    let b = f.submit(4, 8);
    f.pass(&AdmissionConfig { order: Order::Fifo, ..default_cfg() });
    assert_eq!((f.status(a), f.status(b)), (AllocStatus::Reserved, AllocStatus::Queued));
}

#[test]
fn ties_go_to_class_then_priority_then_submit_time() {
    let mut c = Cluster::new(&[8]);
    let early = c.submit(1, 8);
    c.now += 1;
    let late_high_priority = c.submit_with(1, 8, |s| s.priority = 5);
    c.now += 1;
    let high_class = c.submit_with(1, 8, |s| s.preemption_class = 3);
    let order: Vec<AllocId> = c.s.queue().map(|k| k.alloc).collect();
    assert_eq!(order, vec![high_class, late_high_priority, early]);
    c.pass(&default_cfg());
    assert_eq!(c.status(high_class), AllocStatus::Reserved);
}

#[test]
fn each_placed_gang_is_subtracted_before_the_next() {
    let mut c = Cluster::new(&[8, 8]);
    let ids: Vec<AllocId> = (0..5).map(|_| c.submit(2, 4)).collect();
    let plan = c.pass(&default_cfg());
    assert_eq!(plan.stats.gangs_placed, 2, "two 2x4-GPU gangs fill two 8-GPU nodes");
    assert_eq!(plan.stats.tasks_placed, 4);
    let placed = ids.iter().filter(|&&id| c.status(id) == AllocStatus::Reserved).count();
    assert_eq!(placed, 2);
}

#[test]
fn reserved_capacity_is_not_double_promised_across_passes() {
    let mut c = Cluster::new(&[8]);
    let first = c.submit(1, 8);
    c.pass(&default_cfg());
    assert_eq!(c.status(first), AllocStatus::Reserved); // not yet claimed
    let second = c.submit(1, 1);
    c.now += 10_000;
    let plan = c.pass(&default_cfg());
    assert!(plan.commands.is_empty(), "the reserved node is full: {plan:?}");
    assert_eq!(c.status(second), AllocStatus::Queued);
}

#[test]
fn a_gang_is_placed_on_distinct_nodes() {
    let mut c = Cluster::new(&[8, 8, 8]);
    let id = c.submit(3, 1);
    c.pass(&default_cfg());
    let mut nodes = c.nodes_of(id);
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3);
}

#[test]
fn a_gang_larger_than_the_cluster_waits_without_blocking_others() {
    let mut c = Cluster::new(&[8, 8]);
    let huge = c.submit(3, 1);
    let small = c.submit(1, 1);
    c.pass(&default_cfg());
    assert_eq!((c.status(huge), c.status(small)), (AllocStatus::Queued, AllocStatus::Reserved));
}

#[test]
fn best_fit_prefers_the_node_with_the_fewest_free_gpus() {
    let mut c = Cluster::new(&[8, 8, 8]);
    let filler = c.submit(1, 6);
    c.pass(&default_cfg());
    let filler_node = c.nodes_of(filler)[0].clone();
    let small = c.submit(1, 2);
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(small), vec![filler_node], "the 2-GPU task fills the partly used node");
}

#[test]
fn node_memory_cpu_and_vram_limits_are_respected() {
    let mut c = Cluster::new(&[8, 8]);
    let big_vram = c.submit_with(1, 1, |s| s.resources.vram_mb = 100_000);
    let big_mem = c.submit_with(1, 1, |s| s.resources.mem_mb = 600_000);
    let many_cpus = c.submit_with(1, 1, |s| s.resources.cpus = 40);
    c.pass(&default_cfg());
    assert_eq!(c.status(big_vram), AllocStatus::Queued);
    assert_eq!(c.status(big_mem), AllocStatus::Queued);
    assert_eq!(c.status(many_cpus), AllocStatus::Reserved);
    let again = c.submit_with(1, 1, |s| s.resources.cpus = 40);
    c.pass(&default_cfg());
    assert_ne!(c.nodes_of(again), c.nodes_of(many_cpus), "40 + 40 CPUs do not fit on one 64-CPU node");
}

/// A reservation unclaimed for 30 s is rolled back, and the gang is placed
/// again in the same pass.
#[test]
fn a_stale_reservation_rolls_back_and_is_replaced_in_the_same_pass() {
    let mut c = Cluster::new(&[8, 8]);
    let id = c.submit(2, 8);
    c.pass(&default_cfg());
    assert_eq!(c.s.alloc(id).unwrap().reservation_epoch, 1);
    c.now += 29_999;
    assert!(c.pass(&default_cfg()).commands.is_empty(), "not stale yet");
    c.now += 1;
    let plan = c.pass(&default_cfg());
    assert_eq!(plan.stats.rollbacks, 1);
    assert_eq!(plan.stats.gangs_placed, 1);
    assert!(matches!(plan.commands[0], Command::RollbackGang { alloc, epoch: 1 } if alloc == id));
    assert!(matches!(plan.commands[1], Command::ReserveGang { alloc, epoch: 2, .. } if alloc == id));
    assert_eq!(c.status(id), AllocStatus::Reserved);
    assert_eq!(c.s.alloc(id).unwrap().reservation_epoch, 2);
}

/// The capacity a stale reservation held is offered to the queue in the
/// same pass, in admission order.
#[test]
fn capacity_freed_by_a_rollback_goes_to_the_best_queued_gang() {
    let mut c = Cluster::new(&[8, 8]);
    let small = c.submit(1, 8);
    c.pass(&default_cfg()); // small holds n0
    let big = c.submit(2, 8); // needs both nodes
    c.pass(&default_cfg());
    assert_eq!(c.status(big), AllocStatus::Queued);
    c.now += 30_000;
    c.pass(&default_cfg());
    assert_eq!(c.status(big), AllocStatus::Reserved, "largest first takes the freed node");
    assert_eq!(c.status(small), AllocStatus::Queued);
}

#[test]
fn a_claimed_gang_is_never_rolled_back() {
    let mut c = Cluster::new(&[8, 8]);
    let id = c.submit(2, 8);
    c.pass(&default_cfg());
    c.start_all(id);
    c.now += 3_600_000;
    assert!(c.pass(&default_cfg()).commands.is_empty());
    assert_eq!(c.status(id), AllocStatus::Running);
}

#[test]
fn a_partly_claimed_stale_gang_is_torn_down_not_left_stuck() {
    let mut c = Cluster::new(&[8, 8]);
    let id = c.submit(2, 8);
    c.pass(&default_cfg());
    let t0 = c.s.alloc(id).unwrap().tasks[0].clone();
    let node = c.s.node(t0.node.unwrap()).id.clone();
    c.apply(Command::StartTask { alloc: id, task: 0, node, epoch: t0.reservation_epoch });
    c.now += 60_000;
    let plan = c.pass(&default_cfg());
    assert_eq!(plan.stats.rollbacks, 1, "{plan:?}");
    assert_eq!(plan.stats.gangs_placed, 0, "the gang waits for its running task to stop: {plan:?}");
    assert_eq!(c.status(id), AllocStatus::TearingDown);
    assert_eq!(c.s.alloc(id).unwrap().tasks[0].status, TaskStatus::Preempting);
    assert_eq!(c.s.alloc(id).unwrap().tasks[1].status, TaskStatus::Blocked);
}

#[test]
fn fifo_stops_at_the_first_gang_that_does_not_fit() {
    let mut c = Cluster::new(&[8, 8]);
    let big = c.submit(3, 8);
    let small = c.submit(1, 1);
    let plan = c.pass(&AdmissionConfig { order: Order::Fifo, backfill: false, ..default_cfg() });
    assert!(plan.commands.is_empty());
    assert_eq!((c.status(big), c.status(small)), (AllocStatus::Queued, AllocStatus::Queued));
    // With backfill a gang that can never fit on the ready nodes gets no
    // planned start, and blocks nothing.
    let plan = c.pass(&AdmissionConfig { order: Order::Fifo, backfill: true, ..default_cfg() });
    assert!(plan.planned.is_empty());
    assert_eq!((c.status(big), c.status(small)), (AllocStatus::Queued, AllocStatus::Reserved));
}

#[test]
fn cpu_only_tasks_prefer_nodes_without_free_gpus() {
    let mut c = Cluster::new(&[0, 8]);
    let cpu = c.submit(1, 0);
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(cpu), vec!["n0".to_string()]);
}

#[test]
fn a_plan_made_from_a_stale_view_is_rejected_whole_by_apply() {
    let mut c = Cluster::new(&[8]);
    let a = c.submit(1, 8);
    let b = c.submit(1, 8);
    let plan = plan_admission(&c.s, c.now, &default_cfg());
    assert_eq!(plan.stats.gangs_placed, 1);
    // Meanwhile another plan (e.g. from an older leader) placed the other gang.
    let other = if matches!(plan.commands[0], Command::ReserveGang { alloc, .. } if alloc == a) { b } else { a };
    c.apply(Command::ReserveGang { alloc: other, epoch: 1, nodes: vec![NodeId::new("n0")] });
    let out = c.s.apply(&plan.commands[0], &ApplyCtx { time_ms: c.now });
    assert!(matches!(out, Outcome::Rejected(crate::sm::Rejection::InsufficientCapacity { .. })), "{out:?}");
    c.s.check_invariants().unwrap();
}

/// Four 8-GPU nodes; a 2-node gang runs on n0 and n1 for up to an hour, and
/// a 4-node gang waits for them: its planned start is when their walltime
/// ends.
fn blocked_big_gang(backfill: bool) -> (Cluster, AllocId, AdmissionConfig) {
    let cfg = AdmissionConfig { backfill, ..default_cfg() };
    let mut c = Cluster::new(&[8, 8, 8, 8]);
    let running = c.submit_with(2, 8, |s| s.walltime_s = 3_600);
    c.pass(&cfg);
    c.start_all(running);
    let big = c.submit(4, 8);
    (c, big, cfg)
}

#[test]
fn backfill_plans_a_start_for_the_first_gang_that_does_not_fit() {
    let (mut c, big, cfg) = blocked_big_gang(true);
    let plan = c.pass(&cfg);
    assert_eq!(plan.stats.planned_starts, 1);
    let p = &plan.planned[0];
    assert_eq!((p.alloc, p.start_ms), (big, 1_000 + 3_600_000));
    let names: Vec<String> = p.nodes.iter().map(|&s| c.s.node(s).id.to_string()).collect();
    assert_eq!(names, ["n0", "n1", "n2", "n3"]);
    // The explanation shows it, from the state alone.
    let e = crate::policy::explain(&c.s, big, c.now, &Default::default()).unwrap();
    assert_eq!(e.planned_start.as_ref().map(|p| p.start_ms), Some(1_000 + 3_600_000));
    assert!(e.summary.contains("planned start in 1 h on n0, n1, n2, n3"), "{}", e.summary);
}

#[test]
fn backfill_runs_work_ahead_only_if_it_ends_by_the_planned_start() {
    let (mut c, big, cfg) = blocked_big_gang(true);
    let long = c.submit_with(1, 8, |s| s.walltime_s = 7_200);
    let short = c.submit_with(1, 8, |s| s.walltime_s = 3_599);
    let plan = c.pass(&cfg);
    assert_eq!(c.status(short), AllocStatus::Reserved, "it ends before the planned start");
    assert_eq!(c.status(long), AllocStatus::Queued, "it would delay the big gang by an hour");
    assert_eq!(c.status(big), AllocStatus::Queued);
    assert_eq!((plan.stats.backfilled, plan.stats.held_for_planned), (1, 1));
    // The next pass keeps the same promise.
    let again = c.pass(&cfg);
    assert_eq!(again.planned[0].start_ms, 1_000 + 3_600_000);
    assert_eq!(c.status(long), AllocStatus::Queued);
    // Its explanation names the gang it waits behind.
    let pcfg = crate::policy::PreemptionConfig::default();
    let e = crate::policy::explain_with_admission(&c.s, long, c.now, &pcfg, &cfg).unwrap();
    let expect = format!("held for allocation {big}'s planned start in 1 h");
    assert!(e.summary.contains(&expect), "{}", e.summary);
}

#[test]
fn without_backfill_long_work_runs_ahead_of_the_blocked_gang() {
    let (mut c, big, cfg) = blocked_big_gang(false);
    let long = c.submit_with(1, 8, |s| s.walltime_s = 7_200);
    let plan = c.pass(&cfg);
    assert_eq!((c.status(long), c.status(big)), (AllocStatus::Reserved, AllocStatus::Queued));
    assert!(plan.planned.is_empty());
    // FIFO without backfill stops at the blocked gang instead.
    let (mut f, big, _) = blocked_big_gang(false);
    let small = f.submit_with(1, 8, |s| s.walltime_s = 60);
    f.pass(&AdmissionConfig { order: Order::Fifo, backfill: false, ..default_cfg() });
    assert_eq!((f.status(small), f.status(big)), (AllocStatus::Queued, AllocStatus::Queued));
}

/// A higher class is not held back by a lower class's planned start (it
/// could preempt that class anyway); the same class is.
#[test]
fn a_higher_class_may_take_a_lower_class_plans_nodes() {
    let (mut c, big, cfg) = blocked_big_gang(true);
    let same = c.submit_with(1, 8, |s| s.walltime_s = 7_200);
    let higher = c.submit_with(1, 8, |s| {
        s.walltime_s = 7_200;
        s.preemption_class = 3;
    });
    let plan = c.pass(&cfg);
    assert_eq!(plan.planned[0].alloc, big);
    assert_eq!((c.status(same), c.status(higher)), (AllocStatus::Queued, AllocStatus::Reserved));
}

/// EASY with FIFO: the head gang gets the planned start; a later gang that
/// ends in time runs ahead, one that does not waits.
#[test]
fn fifo_with_backfill_runs_later_gangs_that_end_in_time() {
    let (mut c, big, _) = blocked_big_gang(true);
    let cfg = AdmissionConfig { order: Order::Fifo, backfill: true, ..default_cfg() };
    let long = c.submit_with(1, 8, |s| s.walltime_s = 7_200);
    let short = c.submit_with(1, 8, |s| s.walltime_s = 600);
    let plan = c.pass(&cfg);
    assert_eq!(plan.planned.iter().map(|p| p.alloc).collect::<Vec<_>>(), [big]);
    assert_eq!((c.status(long), c.status(short)), (AllocStatus::Queued, AllocStatus::Reserved));
}

/// A node the planned gang does not need takes work however long it runs.
#[test]
fn nodes_the_planned_gang_does_not_need_take_long_work() {
    let cfg = default_cfg();
    let mut c = Cluster::new(&[8, 8, 8, 8, 8]);
    let running = c.submit_with(3, 4, |s| s.walltime_s = 3_600);
    c.pass(&cfg);
    c.start_all(running);
    assert_eq!(c.nodes_of(running), ["n0", "n1", "n2"]);
    let big = c.submit(4, 8);
    let long = c.submit_with(1, 4, |s| s.walltime_s = 7_200);
    let plan = c.pass(&cfg);
    let planned: Vec<String> = plan.planned[0].nodes.iter().map(|&s| c.s.node(s).id.to_string()).collect();
    assert_eq!(planned, ["n0", "n1", "n3", "n4"]);
    assert_eq!(c.status(big), AllocStatus::Queued);
    assert_eq!(c.nodes_of(long), ["n2"]);
}

/// Preemption waits when waiting starts the gang soon enough.
#[test]
fn a_gang_that_starts_within_the_preemption_wait_preempts_nothing() {
    let cfg = default_cfg();
    let pcfg = crate::policy::PreemptionConfig { min_runtime_ms: 0, near_completion_ms: 0, ..Default::default() };
    for (victim_walltime_s, preempts) in [(200, false), (3_600, true)] {
        let mut c = Cluster::new(&[8, 8]);
        let low = c.submit_with(2, 8, |s| s.walltime_s = victim_walltime_s);
        c.pass(&cfg);
        c.start_all(low);
        c.now += 10_000;
        let high = c.submit_with(2, 8, |s| s.preemption_class = 5);
        let decisions = crate::policy::plan_preemptions(&c.s, c.now, &pcfg);
        assert_eq!(!decisions.is_empty(), preempts, "victim walltime {victim_walltime_s} s: {decisions:?}");
        let e = crate::policy::explain(&c.s, high, c.now, &pcfg).unwrap();
        let why = e.preemption.unwrap().err().map(|w| w.to_string()).unwrap_or_default();
        assert_eq!(why.contains("waiting starts it in 190 s"), !preempts, "{why}");
        // With no wait, it preempts at once.
        let now = crate::policy::PreemptionConfig { wait_ms: 0, ..pcfg };
        assert!(!crate::policy::plan_preemptions(&c.s, c.now, &now).is_empty());
    }
}

/// Task 0 goes where its gang's rendezvous ports are free: a pass never
/// gives two gangs the last port of a node, and a gang that finds room but
/// no port waits without blocking others.
#[test]
fn task_0_lands_on_a_node_with_free_rendezvous_ports() {
    let mut c = with_ports(&["none", "29500-29500", "none"]);
    let a = c.submit_with(2, 1, |s| s.ports = 1);
    let b = c.submit_with(2, 1, |s| s.ports = 1);
    let free = c.submit(2, 1);
    let plan = c.pass(&default_cfg());
    assert_eq!(c.nodes_of(a)[0], "n1");
    assert_eq!(c.s.alloc(a).unwrap().ports, vec![29500]);
    // b fits on GPUs but n1's one port is a's: it waits; the portless gang goes.
    assert_eq!(c.status(b), AllocStatus::Queued);
    assert_eq!(c.status(free), AllocStatus::Reserved);
    assert_eq!(plan.stats.port_waits, 1);
    // Explain says why b waits: room on the GPUs, no free port (it said
    // "can take a task now", as if the next pass would place it).
    let e = crate::policy::explain(&c.s, b, c.now, &Default::default()).unwrap();
    assert!(e.summary.starts_with("waiting for rendezvous ports"), "{}", e.summary);
}

/// 8-GPU nodes offering these rendezvous port ranges, one each.
fn with_ports(ranges: &[&str]) -> Cluster {
    let mut c = Cluster::new(&[]);
    for (i, ports) in ranges.iter().enumerate() {
        let node = NodeId::new(format!("n{i}"));
        let labels = BTreeMap::from([(crate::sm::PORTS_LABEL.to_string(), ports.to_string())]);
        c.apply(Command::RegisterNode { node: node.clone(), resources: node_res(8), labels });
        c.apply(Command::MarkNodeReady { node });
    }
    c
}

/// A cluster whose nodes carry labels: (GPUs, labels) per node.
fn labelled(nodes: &[(u32, &[(&str, &str)])]) -> Cluster {
    let mut c = Cluster::new(&[]);
    for (i, (g, labels)) in nodes.iter().enumerate() {
        let node = NodeId::new(format!("n{i}"));
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        c.apply(Command::RegisterNode { node: node.clone(), resources: node_res(*g), labels });
        c.apply(Command::MarkNodeReady { node });
    }
    c
}

fn placement(constraints: &str, pack_by: Option<&str>) -> crate::sm::Placement {
    crate::sm::Placement {
        constraints: if constraints.is_empty() {
            vec![]
        } else {
            crate::sm::LabelExpr::parse_list(constraints).unwrap()
        },
        pack_by: pack_by.map(|p| crate::sm::Packing::parse(p).unwrap()),
    }
}

#[test]
fn constrained_gangs_go_only_to_matching_nodes_and_do_not_block_others() {
    let h100: &[(&str, &str)] = &[("gpu.model", "H100")];
    let a100: &[(&str, &str)] = &[("gpu.model", "A100")];
    let mut c = labelled(&[(8, a100), (8, h100), (8, a100), (8, h100)]);
    let h = c.submit_with(2, 8, |s| s.placement = placement("gpu.model=H100", None));
    // Same shape, but the H100s are taken: it waits, and the unconstrained
    // gang of the same shape behind it still goes (the failed-shape memo
    // tells placements apart).
    let h2 = c.submit_with(2, 8, |s| s.placement = placement("gpu.model=H100", None));
    let any = c.submit(2, 8);
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(h), ["n1", "n3"]);
    assert_eq!(c.status(h2), AllocStatus::Queued);
    assert_eq!(c.nodes_of(any), ["n0", "n2"]);
    // notin and exists work the same way.
    let mut c = labelled(&[(8, a100), (8, h100), (8, &[])]);
    let not_a = c.submit_with(1, 8, |s| s.placement = placement("gpu.model notin (A100),gpu.model", None));
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(not_a), ["n1"]);
}

#[test]
fn a_packed_gang_lands_in_one_rack_and_leaves_the_emptiest_rack_whole() {
    // Rack r1: three free nodes; rack r2: two free nodes; n5 has no rack.
    let r1: &[(&str, &str)] = &[("rack", "r1")];
    let r2: &[(&str, &str)] = &[("rack", "r2")];
    let mut c = labelled(&[(8, r1), (8, r2), (8, r1), (8, r2), (8, r1), (8, &[])]);
    // A gang of 2 fits in either rack: it takes the tighter one (r2) and
    // leaves r1 whole for the gang of 3 that comes next.
    let small = c.submit_with(2, 8, |s| s.placement = placement("", Some("rack")));
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(small), ["n1", "n3"]);
    let big = c.submit_with(3, 8, |s| s.placement = placement("", Some("rack")));
    c.pass(&default_cfg());
    assert_eq!(c.nodes_of(big), ["n0", "n2", "n4"]);
    // No rack has room for two more: required waits, preferred spreads.
    let must = c.submit_with(2, 4, |s| s.placement = placement("", Some("rack:required")));
    let may = c.submit_with(1, 8, |s| s.placement = placement("", Some("rack:preferred")));
    c.pass(&default_cfg());
    assert_eq!(c.status(must), AllocStatus::Queued);
    assert_eq!(c.nodes_of(may), ["n5"]);
}

#[test]
fn explain_names_the_constraint_no_node_meets() {
    let a100: &[(&str, &str)] = &[("gpu.model", "A100")];
    let mut c = labelled(&[(8, a100), (8, a100)]);
    let h = c.submit_with(1, 1, |s| s.placement = placement("gpu.model=H100", None));
    let e = crate::policy::explain(&c.s, h, c.now, &Default::default()).unwrap();
    assert_eq!(
        e.summary,
        "it can never run on the registered nodes: no node has gpu.model=H100; known gpu.model values: A100"
    );
    // The dry run of the same request says the same, preemption included.
    let spec = c.s.alloc(h).unwrap().spec.clone();
    let dry = crate::policy::explain_spec(&c.s, &spec, c.now, &Default::default());
    assert_eq!((dry.summary, dry.preemption), (e.summary.clone(), e.preemption.clone()));
    assert_eq!(e.planned_start, None, "no planned start on nodes it may not use");
    assert!(e.classes.iter().any(|k| k.reason == "not a place for this gang: has no gpu.model=H100"), "{e:?}");
    let r = c.submit_with(3, 1, |s| s.placement = placement("", Some("rack")));
    let e = crate::policy::explain(&c.s, r, c.now, &Default::default()).unwrap();
    assert_eq!(e.summary, "it can never run on the registered nodes: no node has the rack label the gang packs by");
}

fn after_ok(on: AllocId) -> crate::sm::After {
    crate::sm::After {
        deps: vec![crate::sm::Dependency { on, when: crate::sm::AfterWhen::Ok }],
        ..crate::sm::After::default()
    }
}

/// Three 8-GPU nodes: preprocess runs for up to 10 min, another job for up
/// to 5 min, and one node is free. Train, a 2-node gang, waits for
/// preprocess to succeed.
fn pipeline(backfill: bool) -> (Cluster, AllocId, AllocId, AllocId, AdmissionConfig) {
    let cfg = AdmissionConfig { backfill, ..default_cfg() };
    let mut c = Cluster::new(&[8, 8, 8]);
    let pre = c.submit_with(1, 8, |s| s.walltime_s = 600);
    let other = c.submit_with(1, 8, |s| s.walltime_s = 300);
    c.pass(&cfg);
    c.start_all(pre);
    c.start_all(other);
    let train = c.submit_with(2, 8, |s| s.after = after_ok(pre));
    assert_eq!(c.status(train), AllocStatus::Waiting);
    (c, pre, other, train, cfg)
}

/// Backfill plans a dependent's start at its dependency's walltime end, on
/// the nodes that free up last by then: the node free now still takes long
/// work, but a node the dependent needs takes only work that ends in time.
#[test]
fn backfill_plans_a_dependents_start_at_its_dependencys_walltime() {
    let (mut c, pre, other, train, cfg) = pipeline(true);
    let long = c.submit_with(1, 8, |s| s.walltime_s = 3_600);
    let plan = c.pass(&cfg);
    let p = &plan.planned[..];
    assert_eq!(p.iter().map(|p| (p.alloc, p.start_ms)).collect::<Vec<_>>(), [(train, 1_000 + 600_000)]);
    let mut planned: Vec<String> = p[0].nodes.iter().map(|&s| c.s.node(s).id.to_string()).collect();
    let mut expect = [c.nodes_of(pre), c.nodes_of(other)].concat();
    planned.sort();
    expect.sort();
    assert_eq!(planned, expect, "the nodes that free up by then, not the free one");
    assert_eq!(c.status(long), AllocStatus::Reserved, "the free node is not needed");
    // The explanation says when and where, from the state alone.
    let e = crate::policy::explain(&c.s, train, c.now, &Default::default()).unwrap();
    assert_eq!(e.planned_start.as_ref().map(|p| p.start_ms), Some(1_000 + 600_000));
    assert!(e.summary.contains("planned to be queued in 10 min"), "{}", e.summary);
    assert!(e.summary.contains("planned start in 10 min on "), "{}", e.summary);

    // The 5-minute job ends: its node is kept for train, except for work
    // that ends by train's planned start.
    c.now += 300_000;
    let a = c.s.alloc(other).unwrap().clone();
    let node = c.s.node(a.tasks[0].node.unwrap()).id.clone();
    c.apply(Command::FinishTask { alloc: other, task: 0, node, epoch: a.tasks[0].reservation_epoch });
    let hour = c.submit_with(1, 8, |s| s.walltime_s = 3_600);
    let four_min = c.submit_with(1, 8, |s| s.walltime_s = 240);
    let plan = c.pass(&cfg);
    assert_eq!(plan.planned[0].alloc, train);
    assert_eq!(c.status(hour), AllocStatus::Queued, "it would delay train by most of an hour");
    assert_eq!(c.nodes_of(four_min), c.nodes_of(other), "it ends before train's planned start");
    assert_eq!(plan.stats.held_for_planned, 1);
}

/// Without backfill nothing is kept for the dependent.
#[test]
fn without_backfill_a_dependent_gets_no_planned_start() {
    let (mut c, _, _, _, cfg) = pipeline(false);
    let long = c.submit_with(1, 8, |s| s.walltime_s = 3_600);
    let plan = c.pass(&cfg);
    assert!(plan.planned.is_empty());
    assert_eq!(c.status(long), AllocStatus::Reserved);
}

/// A dependent's release is known only once what it waits for is placed;
/// and a queued gang ranked ahead of it takes its home's planned start.
#[test]
fn a_dependent_is_planned_only_when_its_release_is_known_and_in_rank_order() {
    // The dependency is queued behind a running hour-long job: its end is
    // not known, so only the dependency itself is planned.
    let cfg = default_cfg();
    let mut c = Cluster::new(&[8]);
    let running = c.submit_with(1, 8, |s| s.walltime_s = 3_600);
    c.pass(&cfg);
    c.start_all(running);
    let pre = c.submit(1, 8);
    let train = c.submit_with(1, 8, |s| s.after = after_ok(pre));
    let plan = c.pass(&cfg);
    assert_eq!(plan.planned.iter().map(|p| p.alloc).collect::<Vec<_>>(), [pre]);
    let e = crate::policy::explain(&c.s, train, c.now, &Default::default()).unwrap();
    assert!(e.planned_start.is_none() && !e.summary.contains("planned"), "{}", e.summary);

    // A blocked gang of higher priority and the same size ranks first.
    let (mut c, _, _, train, cfg) = pipeline(true);
    let first = c.submit_with(2, 8, |s| s.priority = 10);
    let plan = c.pass(&cfg);
    assert_eq!(plan.planned.iter().map(|p| p.alloc).collect::<Vec<_>>(), [first]);
    assert_ne!(first, train);
    // Under FIFO the older dependent comes first.
    let (mut c, _, _, train, _) = pipeline(true);
    c.submit_with(2, 8, |s| s.priority = 10);
    let plan = c.pass(&AdmissionConfig { order: Order::Fifo, ..cfg });
    assert_eq!(plan.planned.iter().map(|p| p.alloc).collect::<Vec<_>>(), [train]);
}

// Wait notes: why a gang waits, named when it changes.
mod wait_notes;
