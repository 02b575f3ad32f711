//! vClusters in the state: created once, updated with a revision, the
//! built-in default always there, validated, in the snapshot and the digest.

use super::*;
use crate::sm::{HomeNodes, OverQuota, Quota, VClusterSpec};

fn apply(s: &mut State, cmd: &Command, t: u64) -> Outcome {
    s.apply(cmd, &ApplyCtx { time_ms: t })
}

fn ml_spec() -> VClusterSpec {
    VClusterSpec {
        vtype: VClusterType::MlTraining,
        home: HomeNodes::default_for("ml"),
        quota: Quota { max_gpus: Some(64), max_nodes: None, max_allocations: Some(10) },
        borrow_limit_pct: 20,
        over_quota: OverQuota::Reject,
        checkpoints: VcCheckpoints::default(),
    }
}

fn create(name: &str, spec: VClusterSpec) -> Command {
    Command::CreateVCluster { name: name.into(), spec, by: "admin alice".into() }
}

#[test]
fn vclusters_are_created_once_updated_with_a_revision_and_kept_in_the_snapshot() {
    let mut s = State::default();
    assert_eq!(s.vclusters().iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["default"]);
    let out = apply(&mut s, &create("ml", ml_spec()), 1_000);
    assert_eq!(out.events(), &[Event::VClusterCreated { name: "ml".into(), by: "admin alice".into() }]);
    let v = s.vcluster("ml").unwrap();
    assert_eq!((v.revision, v.created_ms, v.updated_ms, v.spec.clone()), (1, 1_000, 1_000, ml_spec()));

    let digest = s.state_digest();
    let again = apply(&mut s, &create("ml", VClusterSpec::default_for("ml")), 1_000);
    assert!(matches!(again, Outcome::Rejected(Rejection::VClusterExists(ref n)) if n == "ml"), "{again:?}");
    assert_eq!(s.state_digest(), digest, "a refused create changes nothing: the first in the log wins");

    let mut wider = ml_spec();
    wider.quota.max_gpus = Some(128);
    let update = Command::UpdateVCluster { name: "ml".into(), spec: wider.clone(), by: "admin bob".into() };
    assert_eq!(
        apply(&mut s, &update, 2_000).events(),
        &[Event::VClusterUpdated { name: "ml".into(), revision: 2, by: "admin bob".into() }]
    );
    let v = s.vcluster("ml").unwrap();
    assert_eq!((v.revision, v.created_ms, v.updated_ms, v.updated_by.as_str()), (2, 1_000, 2_000, "admin bob"));
    assert_eq!(v.spec.quota.max_gpus, Some(128));

    let unknown = Command::UpdateVCluster { name: "nope".into(), spec: wider, by: "admin bob".into() };
    assert!(matches!(apply(&mut s, &unknown, 2_001), Outcome::Rejected(Rejection::UnknownVCluster(_))));
    // The built-in default exists without being created, may be updated,
    // and may not be created again.
    assert!(matches!(
        apply(&mut s, &create("default", VClusterSpec::default_for("default")), 2_002),
        Outcome::Rejected(Rejection::VClusterExists(_))
    ));
    let mut capped = VClusterSpec::default_for("default");
    capped.quota.max_allocations = Some(100);
    let upd = Command::UpdateVCluster { name: "default".into(), spec: capped, by: "admin bob".into() };
    assert!(matches!(apply(&mut s, &upd, 2_003), Outcome::Accepted(_)));
    assert_eq!(s.vcluster("default").unwrap().revision, 1);

    let restored = State::from_snapshot(&s.to_snapshot()).unwrap();
    assert_eq!(restored.state_digest(), s.state_digest());
    assert_eq!(restored.vclusters(), s.vclusters());
    assert_eq!(restored.vclusters().len(), 2);
}

#[test]
fn an_allocation_names_a_vcluster_that_exists() {
    let mut f = Fixture::new(1);
    assert!(matches!(f.rejected(Command::Submit { spec: ml(1, 1) }), Rejection::UnknownVCluster(ref n) if n == "ml"));
    f.submit(spec(1, 1)); // default always exists
    f.ok(create("ml", ml_spec()));
    f.submit(ml(1, 1));
}

#[test]
fn malformed_vclusters_are_refused_with_the_field_named() {
    let mut s = State::default();
    let field = |s: &mut State, name: &str, spec: VClusterSpec| match apply(s, &create(name, spec), 1) {
        Outcome::Rejected(Rejection::InvalidVCluster { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(&mut s, "ML", ml_spec()), "name");
    assert_eq!(field(&mut s, "ml", VClusterSpec { borrow_limit_pct: 150, ..ml_spec() }), "borrow_limit_pct");
    let none = Quota { max_nodes: Some(0), ..Quota::default() };
    assert_eq!(field(&mut s, "ml", VClusterSpec { quota: none, ..ml_spec() }), "quota");
    assert_eq!(s.vclusters().len(), 1, "nothing was created");
}

#[test]
fn home_nodes_follow_the_selector() {
    let mut s = State::default();
    for (id, vc) in [("a", Some("ml")), ("b", None), ("c", Some("ml"))] {
        if let Some(vc) = vc {
            let set = BTreeMap::from([("muster.vcluster".to_string(), vc.to_string())]);
            let label = Command::LabelNode { node: NodeId::new(id), set, remove: vec![], by: "admin".into() };
            assert!(matches!(apply(&mut s, &label, 1), Outcome::Accepted(_)), "{id}");
        }
        let reg = Command::RegisterNode {
            node: NodeId::new(id),
            resources: Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 },
            labels: BTreeMap::new(),
        };
        assert!(matches!(apply(&mut s, &reg, 1), Outcome::Accepted(_)), "{id}");
    }
    assert!(matches!(apply(&mut s, &create("ml", ml_spec()), 2), Outcome::Accepted(_)));
    let ids = |s: &State, name: &str| -> Vec<String> {
        let v = s.vcluster(name).unwrap();
        s.home_nodes(&v).into_iter().map(|n| s.node(n).id.as_str().to_string()).collect()
    };
    assert_eq!(ids(&s, "ml"), ["a", "c"]);
    assert_eq!(ids(&s, "default"), ["b"]);
    let list = VClusterSpec { home: HomeNodes::Nodes(vec![NodeId::new("b")]), ..ml_spec() };
    let upd = Command::UpdateVCluster { name: "ml".into(), spec: list, by: "admin".into() };
    assert!(matches!(apply(&mut s, &upd, 3), Outcome::Accepted(_)));
    assert_eq!(ids(&s, "ml"), ["b"]);
}

// ----- hard quotas ----------------------------------------------------------

/// A fixture whose vCluster `ml` has these quotas, its nodes shared by
/// `default` and `ml` (labelled for a vCluster that does not exist: home to
/// none).
fn with_quota(nodes: u32, quota: Quota) -> Fixture {
    let mut f = Fixture::new(nodes);
    f.ok(create("ml", VClusterSpec { quota, over_quota: OverQuota::Queue, ..ml_spec() }));
    for i in 0..nodes {
        let set = BTreeMap::from([(VCLUSTER_LABEL.to_string(), "shared".to_string())]);
        f.ok(Command::LabelNode { node: n(i), set, remove: vec![], by: "admin".into() });
    }
    f
}

fn ml(gang: u32, gpus: u32) -> AllocSpec {
    let mut s = spec(gang, gpus);
    s.vcluster = "ml".into();
    s
}

fn reserve_cmd(f: &Fixture, alloc: AllocId, nodes: &[u32]) -> Command {
    let epoch = f.s.alloc(alloc).unwrap().reservation_epoch + 1;
    Command::ReserveGang { alloc, epoch, nodes: nodes.iter().map(|&i| n(i)).collect() }
}

#[test]
fn a_reservation_past_the_gpu_quota_is_refused_and_reducing_a_quota_preempts_nothing() {
    let mut f = with_quota(4, Quota { max_gpus: Some(8), ..Quota::default() });
    let a = f.submit(ml(1, 8));
    let b = f.submit(ml(1, 8));
    let other = f.submit(spec(1, 8));
    let epoch = f.reserve(a, &[0]);
    f.start(a, 0, 0, epoch);
    assert_eq!(f.s.vcluster_load("ml").unwrap().gpus, 8);
    // Two gangs raced to the last of ml's quota: the second is refused in
    // apply, and nothing running is touched.
    let cmd = reserve_cmd(&f, b, &[1]);
    match f.rejected(cmd) {
        Rejection::QuotaExceeded { alloc, reason } => {
            assert_eq!(alloc, b);
            assert!(reason.contains("vCluster ml's GPU quota: 8 held + 8 needed > 8"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Another vCluster's gang is not held back by ml's quota.
    f.reserve(other, &[1]);
    // Reducing the quota below what runs preempts nothing.
    let smaller = VClusterSpec { quota: Quota { max_gpus: Some(4), ..Quota::default() }, ..ml_spec() };
    f.ok(Command::UpdateVCluster { name: "ml".into(), spec: smaller, by: "admin".into() });
    assert_eq!(f.s.alloc(a).unwrap().status, AllocStatus::Running);
    let why = crate::policy::explain(&f.s, b, f.t, &Default::default()).unwrap().summary;
    assert!(why.starts_with("waiting for vCluster ml's GPU quota: 8 held + 8 needed > 4"), "{why}");
    // Once ml's work ends, its quota frees: b fits under a restored quota.
    f.cancel_and_stop(a);
    assert!(f.s.vcluster_load("ml").is_none(), "no load left");
    let back = VClusterSpec { quota: Quota { max_gpus: Some(8), ..Quota::default() }, ..ml_spec() };
    f.ok(Command::UpdateVCluster { name: "ml".into(), spec: back, by: "admin".into() });
    f.reserve(b, &[2]);
}

#[test]
fn allocation_and_node_quotas_are_counted_per_vcluster() {
    let mut f = with_quota(3, Quota { max_allocations: Some(1), ..Quota::default() });
    let a = f.submit(ml(1, 1));
    let b = f.submit(ml(1, 1));
    f.reserve(a, &[0]);
    assert!(matches!(f.rejected(reserve_cmd(&f, b, &[1])), Rejection::QuotaExceeded { .. }));

    let mut f = with_quota(3, Quota { max_nodes: Some(1), ..Quota::default() });
    // A gang wider than the node quota could never run: refused at once.
    assert!(matches!(f.rejected(Command::Submit { spec: ml(2, 1) }), Rejection::OverQuota { .. }));
    let a = f.submit(ml(1, 1));
    let b = f.submit(ml(1, 1));
    let c = f.submit(ml(1, 1));
    f.reserve(a, &[0]);
    f.reserve(b, &[0]); // the same node: still one node
    match f.rejected(reserve_cmd(&f, c, &[1])) {
        Rejection::QuotaExceeded { reason, .. } => assert!(reason.contains("node quota"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.s.vcluster_load("ml").unwrap().nodes.len(), 1);
}

#[test]
fn admission_places_up_to_the_quota_and_keeps_placing_other_vclusters() {
    let mut f = with_quota(6, Quota { max_gpus: Some(16), ..Quota::default() });
    let mls: Vec<AllocId> = (0..3).map(|_| f.submit(ml(1, 8))).collect();
    let others: Vec<AllocId> = (0..2).map(|_| f.submit(spec(1, 8))).collect();
    let plan = crate::policy::plan_admission(&f.s, f.t, &crate::policy::AdmissionConfig::default());
    let reserved: Vec<AllocId> = plan
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::ReserveGang { alloc, .. } => Some(*alloc),
            _ => None,
        })
        .collect();
    assert_eq!(reserved.iter().filter(|a| mls.contains(a)).count(), 2, "two of ml's three fit its 16 GPUs");
    assert!(others.iter().all(|o| reserved.contains(o)), "default's gangs behind them are placed: {reserved:?}");
    assert_eq!(plan.stats.quota_waits, 1);
    for cmd in plan.commands {
        f.ok(cmd);
    }
    assert_eq!(f.s.vcluster_load("ml").unwrap().gpus, 16);
}

#[test]
fn reject_mode_refuses_the_later_of_two_racing_submissions_and_a_gang_larger_than_its_quota() {
    let mut f = Fixture::new(4);
    let spec = VClusterSpec {
        quota: Quota { max_gpus: Some(16), max_nodes: Some(2), max_allocations: None },
        over_quota: OverQuota::Reject,
        ..ml_spec()
    };
    f.ok(create("ml", spec));
    // Two submissions for the last 8 GPUs: log order decides.
    f.submit(ml(1, 8));
    let first = f.submit(ml(1, 8));
    match f.rejected(Command::Submit { spec: ml(1, 8) }) {
        Rejection::OverQuota { vcluster, reason } => {
            assert_eq!(vcluster, "ml");
            assert!(reason.contains("its live allocations need 16 GPUs, this one 8, at most 16"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // A finished (here: cancelled) allocation no longer counts.
    f.ok(Command::CancelAllocation { alloc: first });
    f.submit(ml(1, 8));
    // In any mode, a gang larger than a quota could never run: refused.
    let queue_mode = VClusterSpec { quota: Quota { max_gpus: Some(16), ..Quota::default() }, ..ml_spec() };
    f.ok(Command::UpdateVCluster {
        name: "ml".into(),
        spec: VClusterSpec { over_quota: OverQuota::Queue, ..queue_mode },
        by: "a".into(),
    });
    assert!(matches!(f.rejected(Command::Submit { spec: ml(3, 8) }), Rejection::OverQuota { .. }));
    f.submit(ml(1, 8)); // queue mode: accepted past the live demand, it waits
}
