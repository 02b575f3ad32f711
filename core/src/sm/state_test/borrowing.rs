//! Elastic borrowing, reclamation and fair ordering: vClusters place work on
//! their home nodes and shared ones, borrow other vClusters' idle nodes
//! within their limit, and give them back through checkpoint-hint
//! preemption after the return grace.

use super::*;
use crate::policy::{AdmissionConfig, PreemptionConfig, ReclaimConfig, plan_admission, plan_reclaims};
use crate::sm::{Quota, VClusterSpec};

/// Nodes n0.. labelled with these vClusters ("" for none: default's home;
/// "shared" names no vCluster: a node everyone may use).
fn cluster(labels: &[&str]) -> Fixture {
    let mut f = Fixture::new(0);
    for (i, vc) in labels.iter().enumerate() {
        if !vc.is_empty() {
            let set = BTreeMap::from([(VCLUSTER_LABEL.to_string(), vc.to_string())]);
            f.ok(Command::LabelNode { node: n(i as u32), set, remove: vec![], by: "admin".into() });
        }
        f.ok(Command::RegisterNode { node: n(i as u32), resources: GPU_NODE, labels: BTreeMap::new() });
        f.ok(Command::MarkNodeReady { node: n(i as u32) });
    }
    f
}

fn vcluster(f: &mut Fixture, name: &str, borrow_pct: u8, quota: Quota) {
    let spec = VClusterSpec { borrow_limit_pct: borrow_pct, quota, ..VClusterSpec::default_for(name) };
    f.ok(Command::CreateVCluster { name: name.into(), spec, by: "admin".into() });
}

fn in_vc(vc: &str, gang: u32, gpus: u32) -> AllocSpec {
    let mut s = spec(gang, gpus);
    s.vcluster = vc.into();
    s
}

/// [`in_vc`] of one preemption class.
fn in_vc_class(vc: &str, gang: u32, gpus: u32, class: u8) -> AllocSpec {
    AllocSpec { preemption_class: class, ..in_vc(vc, gang, gpus) }
}

/// One admission pass, applied; the gangs it reserved.
fn admit(f: &mut Fixture) -> Vec<AllocId> {
    let plan = plan_admission(&f.s, f.t, &AdmissionConfig::default());
    let mut placed = Vec::new();
    for cmd in plan.commands {
        if let Command::ReserveGang { alloc, .. } = &cmd {
            placed.push(*alloc);
        }
        f.ok(cmd);
    }
    placed
}

fn start_all(f: &mut Fixture, id: AllocId) {
    let a = f.s.alloc(id).unwrap().clone();
    for t in &a.tasks {
        let node = f.s.node(t.node.unwrap()).id.clone();
        f.ok(Command::StartTask { alloc: id, task: t.index, node, epoch: t.reservation_epoch });
    }
}

fn nodes_of(f: &Fixture, id: AllocId) -> Vec<String> {
    f.s.alloc(id).unwrap().tasks.iter().filter_map(|t| t.node).map(|s| f.s.node(s).id.to_string()).collect()
}

#[test]
fn work_stays_on_its_home_and_shared_nodes_unless_its_vcluster_borrows() {
    let mut f = cluster(&["ml", "", "shared"]);
    vcluster(&mut f, "ml", 0, Quota::default());
    let a = f.submit(in_vc("ml", 1, 8));
    let b = f.submit(in_vc("ml", 1, 8));
    let c = f.submit(in_vc("ml", 1, 8));
    assert_eq!(admit(&mut f), vec![a, b], "ml's home n0 and the shared n2");
    assert_eq!((nodes_of(&f, a), nodes_of(&f, b)), (vec!["n0".to_string()], vec!["n2".to_string()]));
    assert_eq!(f.status(c), AllocStatus::Queued, "default's n1 is idle, but ml does not borrow");
    let epoch = f.s.alloc(c).unwrap().reservation_epoch + 1;
    match f.rejected(Command::ReserveGang { alloc: c, epoch, nodes: vec![n(1)] }) {
        Rejection::BorrowRefused { alloc, reason } => {
            assert_eq!(alloc, c);
            assert!(reason.contains("does not borrow (its borrow limit is 0 %)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // default's work goes to its own n1, not to ml's.
    let d = f.submit(spec(1, 8));
    assert_eq!(admit(&mut f), vec![d]);
    assert_eq!(nodes_of(&f, d), vec!["n1".to_string()]);
}

#[test]
fn a_vcluster_borrows_idle_nodes_within_its_limit_and_never_beyond() {
    let mut f = cluster(&["ml", "", "", ""]);
    vcluster(&mut f, "ml", 50, Quota::default());
    // Demand 4 × 8 = 32 GPUs: at most 16 of them on borrowed nodes.
    let ids: Vec<AllocId> = (0..4).map(|_| f.submit(in_vc("ml", 1, 8))).collect();
    let placed = admit(&mut f);
    assert_eq!(placed, ids[..3].to_vec(), "one at home, two borrowed; the fourth would pass the limit");
    assert_eq!(nodes_of(&f, ids[0]), vec!["n0".to_string()]);
    for &id in &ids[1..3] {
        let a = f.s.alloc(id).unwrap();
        let slot = a.tasks[0].node.unwrap();
        assert_eq!(f.s.borrowed_from(slot, a), Some("default"), "marked as borrowed");
    }
    assert_eq!(f.s.vcluster_load("ml").unwrap().borrowed_gpus, 16);
    assert_eq!(f.s.lent(f.s.home_key("default")).unwrap().len(), 2);
    let epoch = f.s.alloc(ids[3]).unwrap().reservation_epoch + 1;
    match f.rejected(Command::ReserveGang { alloc: ids[3], epoch, nodes: vec![n(3)] }) {
        Rejection::BorrowRefused { reason, .. } => {
            assert!(reason.contains("borrow limit: 16 borrowed GPUs + 8 > 16 (50% of its demand)"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Non-preemptible work never borrows (reclaiming it would be impossible).
    f.ok(Command::CancelAllocation { alloc: ids[3] });
    let never = f.submit(in_vc_class("ml", 1, 8, 10));
    assert!(admit(&mut f).is_empty());
    let epoch = f.s.alloc(never).unwrap().reservation_epoch + 1;
    match f.rejected(Command::ReserveGang { alloc: never, epoch, nodes: vec![n(3)] }) {
        Rejection::BorrowRefused { reason, .. } => assert!(reason.contains("never preempted"), "{reason}"),
        other => panic!("{other:?}"),
    }
    f.ok(Command::CancelAllocation { alloc: never });
    // A lender with work of its own waiting lends nothing.
    let mut big = spec(2, 8);
    big.preemption_class = 0;
    let waiting = f.submit(big); // default needs 2 nodes; only n3 is free
    let more = f.submit(in_vc("ml", 1, 8));
    let placed = admit(&mut f);
    assert!(!placed.contains(&more), "default has a gang queued: n3 is not lent");
    assert_eq!(f.status(waiting), AllocStatus::Queued);
}

#[test]
fn borrowing_prefers_work_that_is_cheap_to_preempt() {
    let mut f = cluster(&["ml", ""]);
    vcluster(&mut f, "ml", 100, Quota::default());
    let mid = f.submit(in_vc_class("ml", 1, 8, 3));
    let dear = f.submit(in_vc_class("ml", 1, 8, 5));
    let cheap = f.submit(in_vc_class("ml", 1, 8, 1));
    // Class 5 goes first, at home; of the two left, class 1 borrows n1.
    assert_eq!(admit(&mut f), vec![dear, cheap]);
    assert_eq!(nodes_of(&f, cheap), vec!["n1".to_string()]);
    assert_eq!(f.status(mid), AllocStatus::Queued);
}

#[test]
fn reclamation_preempts_borrowed_work_after_the_grace_and_gives_the_nodes_back() {
    let mut f = cluster(&["ml", ""]);
    vcluster(&mut f, "ml", 100, Quota::default());
    let at_home = f.submit(in_vc_class("ml", 1, 8, 9));
    let borrower = f.submit(in_vc_class("ml", 1, 8, 8)); // the class does not protect borrowed work
    assert_eq!(admit(&mut f), vec![at_home, borrower]);
    start_all(&mut f, at_home);
    start_all(&mut f, borrower);

    // default wants its node back.
    f.t += 1_000;
    let home_gang = f.submit(spec(1, 8));
    let queued_at = f.t;
    assert!(admit(&mut f).is_empty(), "n1 is taken by the borrower");
    let cfg = ReclaimConfig::default();
    let pc = PreemptionConfig::default();
    f.t = queued_at + cfg.return_grace_ms - 1;
    assert!(plan_reclaims(&f.s, f.t, &cfg, &pc).is_empty(), "within the return grace");
    f.t = queued_at + cfg.return_grace_ms;
    let plan = plan_reclaims(&f.s, f.t, &cfg, &pc);
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].alloc, home_gang);
    assert_eq!(plan[0].victims, vec![(borrower, 1)], "never the gang running at home");

    // Apply refuses a reclamation of work running at home.
    let wrong = Command::Reclaim { alloc: home_gang, victims: vec![(at_home, 1)], nodes: vec![n(1)], hold_ms: 60_000 };
    assert!(matches!(f.rejected(wrong), Rejection::NotPreemptible { .. }));
    // …and one that takes the nodes of another vCluster.
    let elsewhere =
        Command::Reclaim { alloc: home_gang, victims: vec![(borrower, 1)], nodes: vec![n(0)], hold_ms: 60_000 };
    assert!(matches!(f.rejected(elsewhere), Rejection::InsufficientCapacity { .. } | Rejection::BorrowRefused { .. }));

    let events = f.ok(plan[0].command(&f.s, &pc));
    assert!(matches!(
        &events[0],
        Event::PreemptionDecided { reason: PreemptReason::Reclaim, victims, .. } if victims == &vec![borrower]
    ));
    let task = f.s.alloc(borrower).unwrap().tasks[0].clone();
    assert_eq!(task.status, TaskStatus::Preempting, "asked to checkpoint and stop");
    f.s.check_invariants().unwrap();
    // It checkpoints and stops: the node goes to the home gang at once.
    f.ok(Command::ConfirmPreempted {
        alloc: borrower,
        task: 0,
        node: n(1),
        epoch: task.preemption_epoch,
        checkpoint_failed: false,
    });
    assert_eq!(f.status(home_gang), AllocStatus::Reserved);
    assert_eq!(nodes_of(&f, home_gang), vec!["n1".to_string()]);
    assert_eq!(f.status(borrower), AllocStatus::Suspended, "it resumes from its checkpoint later");
    assert_eq!(f.status(at_home), AllocStatus::Running);
    assert!(f.s.lent(f.s.home_key("default")).is_none(), "nothing lent any more");
}

#[test]
fn within_a_class_the_vcluster_furthest_below_its_share_goes_first() {
    let mut f = cluster(&["shared", "shared", "shared"]);
    let share = Quota { max_gpus: Some(16), ..Quota::default() };
    vcluster(&mut f, "a", 0, share);
    vcluster(&mut f, "b", 0, share);
    let running = f.submit(in_vc("a", 1, 8));
    assert_eq!(admit(&mut f), vec![running]);
    // a uses 8 of its 16, b nothing: b's later gang goes first.
    f.t += 1_000;
    let a_next = f.submit(in_vc("a", 1, 8));
    f.t += 1_000;
    let b_next = f.submit(in_vc("b", 1, 8));
    let b_second = f.submit(in_vc("b", 1, 8));
    // b (0/16) goes first; then b and a both use 8/16 and the earlier
    // submit, a's, takes the last node.
    assert_eq!(admit(&mut f), vec![b_next, a_next]);
    assert_eq!(f.status(b_second), AllocStatus::Queued);
}
