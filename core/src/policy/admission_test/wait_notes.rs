//! Wait notes: why a gang waits, named when it changes.

use super::*;
use crate::sm::{
    HomeNodes, MAX_WAIT_NOTES, OverQuota, Quota, Rejection, VCLUSTER_LABEL, VClusterSpec, VClusterType, Wait,
    WaitHolder, WaitNote,
};

fn notes_on() -> AdmissionConfig {
    AdmissionConfig::default()
}

/// Two 4-GPU nodes home to no vCluster, and vCluster `ml` (no node is
/// labelled its home, so it runs on the shared ones) with a hard quota of 4 GPUs.
fn shared_pair_with_ml_quota() -> Cluster {
    let mut c = Cluster { s: State::default(), now: 1_000 };
    for i in 0..2 {
        let node = NodeId::new(format!("n{i}"));
        c.apply(Command::RegisterNode { node: node.clone(), resources: node_res(4), labels: BTreeMap::new() });
        c.apply(Command::MarkNodeReady { node: node.clone() });
        let set = BTreeMap::from([(VCLUSTER_LABEL.to_string(), "pool".to_string())]);
        c.apply(Command::LabelNode { node, set, remove: Vec::new(), by: "admin".into() });
    }
    let spec = VClusterSpec {
        vtype: VClusterType::HpcBatch,
        home: HomeNodes::default_for("ml"),
        quota: Quota { max_gpus: Some(4), ..Quota::default() },
        over_quota: OverQuota::Queue,
        ..VClusterSpec::default_for("ml")
    };
    c.apply(Command::CreateVCluster { name: "ml".into(), spec, by: "admin".into() });
    c
}

fn waits(c: &Cluster, id: AllocId) -> Vec<(u64, Wait, Vec<AllocId>)> {
    let a = c.s.alloc(id).unwrap();
    a.waits.spans.iter().map(|s| (s.since_ms, s.wait, s.holders.iter().map(|h| h.alloc).collect())).collect()
}

fn finish(c: &mut Cluster, id: AllocId) {
    let a = c.s.alloc(id).unwrap().clone();
    for t in &a.tasks {
        let node = c.s.node(t.node.unwrap()).id.clone();
        c.apply(Command::FinishTask { alloc: id, task: t.index, node, epoch: t.reservation_epoch });
    }
}

/// The case: a job waits for its vCluster's quota, then for the
/// capacity a higher-class gang took; both are named, with holders and
/// durations, and survive into its history record.
#[test]
fn quota_then_a_higher_class_gang() {
    let mut c = shared_pair_with_ml_quota();
    let first = c.submit_with(1, 4, |s| {
        s.vcluster = "ml".into();
        s.owner = "alice".into();
    });
    c.pass(&notes_on());
    c.start_all(first);
    c.now = 2_000;
    let job = c.submit_with(1, 4, |s| s.vcluster = "ml".into());
    let plan = c.pass(&notes_on());
    assert_eq!(plan.stats.wait_notes, 1, "{plan:?}");
    assert_eq!(waits(&c, job), [(2_000, Wait::Quota, vec![first])]);
    assert_eq!(c.s.alloc(job).unwrap().waits.spans[0].holders[0].owner, "alice");
    // A class-2 gang of the whole pair arrives; it waits for capacity.
    c.now = 3_000;
    let big = c.submit_with(2, 4, |s| {
        s.preemption_class = 2;
        s.owner = "bob".into();
    });
    let plan = c.pass(&notes_on());
    assert_eq!(waits(&c, big), [(3_000, Wait::Capacity, vec![first])], "{plan:?}");
    // The job's reason did not change: nothing new is noted for it.
    assert_eq!(waits(&c, job).len(), 1);
    // The quota frees; the larger, higher-class gang takes both nodes.
    c.now = 10_000;
    finish(&mut c, first);
    c.pass(&notes_on());
    assert_eq!(c.status(big), AllocStatus::Reserved);
    assert_eq!(
        waits(&c, job),
        [(2_000, Wait::Quota, vec![first]), (10_000, Wait::Capacity, vec![big])],
        "held by the gang on the nodes it needs"
    );
    c.start_all(big);
    c.now = 20_000;
    finish(&mut c, big);
    c.pass(&notes_on());
    c.start_all(job);
    c.now = 30_000;
    finish(&mut c, job);
    let a = c.s.alloc(job).unwrap();
    assert_eq!(
        a.waits.spans.iter().map(|s| (s.since_ms, s.wait)).collect::<Vec<_>>(),
        [(2_000, Wait::Quota), (10_000, Wait::Capacity), (20_000, Wait::Placed), (30_000, Wait::Ended)]
    );
    let e = crate::policy::explain(&c.s, job, 40_000, &Default::default()).unwrap();
    assert_eq!(
        e.summary,
        format!(
            "done; it waited 18 s in all: 8 s for its vCluster's quota, held by {first} (alice, class 0); then \
             10 s for capacity, held by {big} (bob, class 2)"
        )
    );
    // The history record keeps the timeline.
    let record = crate::history::JobRecord::of(&c.s, a);
    assert_eq!(record.waits, a.waits);
}

/// A gang that fits only on nodes a higher-ranked gang's planned start
/// needs names that gang; its followers of the same shape behind a gang
/// that found no room get the same reason.
#[test]
fn planned_start_and_followers() {
    let mut c = Cluster::new(&[4, 4, 4]);
    let running = c.submit_with(1, 4, |s| s.walltime_s = 100);
    c.pass(&notes_on());
    c.start_all(running);
    // A gang of 3 cannot start until `running` ends: it plans a start
    // on every node; a long single-node job is held for it.
    c.now = 2_000;
    let big = c.submit(3, 4);
    let long = c.submit_with(1, 4, |s| s.walltime_s = 10_000);
    let plan = c.pass(&notes_on());
    assert_eq!(waits(&c, big)[0].1, Wait::Capacity, "{plan:?}");
    assert_eq!(waits(&c, long), [(2_000, Wait::PlannedStart, vec![big])]);
    // Gangs of big's shape behind it find no room for the same reason.
    c.now = 4_000;
    let behind: Vec<AllocId> = (0..3).map(|_| c.submit(3, 4)).collect();
    let plan = c.pass(&notes_on());
    for id in &behind {
        assert_eq!(waits(&c, *id)[0].1, Wait::Capacity, "{id}: {plan:?}");
    }
}

/// Ports, constraint, drain and back-off are named; a reason noted
/// less than a second ago is not replaced.
#[test]
fn constraint_drain_and_the_gap() {
    let mut c = Cluster::new(&[4, 4]);
    // Wants three nodes of two: a constraint it never meets.
    let wide = c.submit(3, 4);
    c.pass(&notes_on());
    assert_eq!(waits(&c, wide), [(1_000, Wait::Constraint, vec![])]);
    // A drain leaves one ready node for a gang of two.
    let pair = c.submit(2, 1);
    c.apply(Command::DrainNode { node: NodeId::new("n1"), timeout_ms: 60_000, reason: "x".into(), by: "a".into() });
    c.now = 1_500;
    c.pass(&notes_on());
    assert_eq!(waits(&c, pair), [(1_000, Wait::Queued, vec![]), (1_500, Wait::Drain, vec![])]);
    // Back in service: within the gap the drain stands, after it the
    // gang is placed (placement is never held back by the gap).
    c.apply(Command::RestartNode { node: NodeId::new("n1"), by: "a".into() });
    c.now = 1_600;
    c.pass(&notes_on());
    assert_eq!(c.status(pair), AllocStatus::Reserved);
    assert_eq!(waits(&c, pair).last().unwrap().1, Wait::Placed);
}

/// Ports and rack packing are named; a dependent's wait is its
/// dependencies (with them as holders) until they are met.
#[test]
fn ports_packing_and_dependencies() {
    let mut c = with_ports(&["none", "29500-29500", "none"]);
    let a = c.submit_with(2, 1, |s| s.ports = 1);
    let b = c.submit_with(2, 1, |s| s.ports = 1);
    let after = crate::sm::After {
        deps: vec![crate::sm::Dependency { on: a, when: crate::sm::AfterWhen::Ok }],
        ..Default::default()
    };
    let dependent = c.submit_with(1, 1, |s| s.after = after);
    c.pass(&notes_on());
    assert_eq!(waits(&c, b), [(1_000, Wait::Ports, vec![])]);
    assert_eq!(waits(&c, dependent), [(1_000, Wait::Dependency, vec![a])]);
    c.start_all(a);
    c.now = 5_000;
    finish(&mut c, a);
    c.pass(&notes_on());
    assert_eq!(
        waits(&c, dependent),
        [(1_000, Wait::Dependency, vec![a]), (5_000, Wait::Placed, vec![])],
        "queued and placed at one entry time: the placement stands"
    );

    // Racks r1 and r2 of two nodes each, one node of each taken: a gang
    // of two that must share a rack waits for packing.
    let r1: &[(&str, &str)] = &[("rack", "r1")];
    let r2: &[(&str, &str)] = &[("rack", "r2")];
    let mut c = labelled(&[(8, r1), (8, r1), (8, r2), (8, r2)]);
    for rack in ["rack=r1", "rack=r2"] {
        let id = c.submit_with(1, 8, |s| s.placement = placement(rack, None));
        c.pass(&notes_on());
        assert_eq!(c.status(id), AllocStatus::Reserved);
    }
    let must = c.submit_with(2, 8, |s| s.placement = placement("", Some("rack:required")));
    c.pass(&notes_on());
    assert_eq!(waits(&c, must), [(1_000, Wait::Packing, vec![])]);
}

/// A preemptor's wait names its victims; a failed gang backs off.
#[test]
fn preempting_and_backoff_are_recorded_by_apply() {
    let mut c = Cluster::new(&[4]);
    let low = c.submit(1, 4);
    c.pass(&notes_on());
    c.start_all(low);
    // Half-way through the victim's (default, 1 h) walltime: past its
    // minimum runtime, not near its end.
    c.now = 1_000 + 30 * 60_000;
    let high = c.submit_with(1, 4, |s| s.preemption_class = 3);
    let decided = crate::policy::plan_preemptions(&c.s, c.now, &Default::default());
    assert_eq!(decided.len(), 1, "{decided:?}");
    let cfg = crate::policy::PreemptionConfig::default();
    let cmd = decided[0].1.command(&c.s, high, &cfg);
    c.apply(cmd);
    assert_eq!(waits(&c, high).last().unwrap().1, Wait::Preempting);
    assert_eq!(waits(&c, high).last().unwrap().2, vec![low]);

    let mut c = Cluster::new(&[4]);
    let flaky = c.submit_with(1, 4, |s| s.max_retries = 3);
    c.pass(&notes_on());
    c.start_all(flaky);
    c.now = 3_000;
    let node = NodeId::new("n0");
    c.apply(Command::FailTask { alloc: flaky, task: 0, node, epoch: 1, exit_code: Some(1) });
    let a = c.s.alloc(flaky).unwrap();
    assert!(a.retry_after_ms > c.now, "{a:?}");
    assert_eq!(waits(&c, flaky).last().unwrap().1, Wait::Backoff);
}

#[test]
fn a_pass_without_notes_proposes_none() {
    let mut c = Cluster::new(&[4]);
    c.submit(2, 4);
    let plan = c.pass(&AdmissionConfig { note_waits: false, ..notes_on() });
    assert!(plan.commands.is_empty(), "{plan:?}");
    assert_eq!(plan.stats.wait_notes, 0);
}

/// `apply` bounds the entry, skips a stale note, and keeps reasons it
/// records itself out of admission's hands.
#[test]
fn apply_bounds_and_skips_stale_notes() {
    let mut c = Cluster::new(&[4]);
    let id = c.submit(1, 4);
    let note = |wait, epoch| WaitNote { alloc: id, epoch, wait, holders: Vec::new() };
    let rejected = |c: &mut Cluster, notes: Vec<WaitNote>| match c
        .s
        .apply(&Command::NoteWaits { notes }, &ApplyCtx { time_ms: c.now })
    {
        Outcome::Rejected(Rejection::InvalidWaitNotes(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(rejected(&mut c, Vec::new()).contains("0 notes"));
    assert!(rejected(&mut c, vec![note(Wait::Ports, 0); MAX_WAIT_NOTES + 1]).contains("257 notes"));
    assert!(rejected(&mut c, vec![note(Wait::Placed, 0)]).contains("not a reason admission names"));
    let mut many = note(Wait::Quota, 0);
    many.holders = vec![WaitHolder::new(1, "x", 0); 5];
    assert!(rejected(&mut c, vec![many]).contains("5 holders"));
    let mut long = note(Wait::Quota, 0);
    long.holders = vec![WaitHolder { alloc: 1, owner: "x".repeat(65), class: 0 }];
    assert!(rejected(&mut c, vec![long]).contains("over 64 bytes"));
    // A note from before a placement is skipped, not an error.
    c.pass(&notes_on());
    let ev = c.apply(Command::NoteWaits { notes: vec![note(Wait::Capacity, 0)] });
    assert!(ev.is_empty());
    assert_eq!(c.s.alloc(id).unwrap().waits.current(), Wait::Placed);
}
