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
        let mut labels = BTreeMap::new();
        if let Some(vc) = vc {
            labels.insert("muster.vcluster".to_string(), vc.to_string());
        }
        let reg = Command::RegisterNode {
            node: NodeId::new(id),
            resources: Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 },
            labels,
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
