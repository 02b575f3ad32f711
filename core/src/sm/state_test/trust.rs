//! Node trust (reserved labels, admin labels, admissions) and secrets.

use std::collections::BTreeMap;

use super::*;

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn register(node: &str, gpus: u32, kv: &[(&str, &str)]) -> Command {
    Command::RegisterNode { node: NodeId::new(node), resources: res(gpus), labels: labels(kv) }
}

fn admission(gpus: u32, kv: &[(&str, &str)]) -> Admission {
    Admission { resources: res(gpus), labels: labels(kv), cert_sha256: None, by: "admin".into(), at_ms: 0 }
}

#[test]
fn a_node_may_not_report_a_reserved_label_but_an_admin_may_set_one() {
    let mut f = Fixture::new(0);
    for key in ["muster.vcluster", "muster.drain-timeout", "muster.anything"] {
        match f.rejected(register("evil", 8, &[(key, "ml")])) {
            Rejection::InvalidNode { field, reason } => {
                assert_eq!(field, "labels");
                assert!(reason.contains(key) && reason.contains("reserved"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    // The reachability labels come from the registration's own fields.
    f.ok(register("n", 8, &[("muster.ports", "29500-29509"), ("gpu.model", "A100")]));
    let set = labels(&[("muster.vcluster", "ml"), ("gpu.model", "A100-80G")]);
    f.ok(Command::LabelNode { node: NodeId::new("n"), set, remove: vec![], by: "admin".into() });
    let slot = f.s.node_slot(&NodeId::new("n")).unwrap();
    assert_eq!(f.s.node(slot).vcluster(), "ml", "at once on a registered node");
    assert_eq!(f.s.node(slot).labels["gpu.model"], "A100-80G", "the admin's value wins");
    // Registering again keeps the admin's labels over what it reports.
    f.ok(register("n", 8, &[("gpu.model", "H100")]));
    assert_eq!(f.s.node(slot).labels["gpu.model"], "A100-80G");
    assert_eq!(f.s.node(slot).reported_labels["gpu.model"], "H100");
    let remove = vec!["gpu.model".to_string()];
    f.ok(Command::LabelNode { node: NodeId::new("n"), set: BTreeMap::new(), remove, by: "admin".into() });
    assert_eq!(f.s.node(slot).labels["gpu.model"], "H100", "removed: the reported value shows again");
    assert_eq!(f.s.node(slot).vcluster(), "ml");
    // Labels the agent's fields set are not an admin's to change.
    let set = labels(&[("muster.ports", "1-2")]);
    assert!(matches!(
        f.rejected(Command::LabelNode { node: NodeId::new("n"), set, remove: vec![], by: "admin".into() }),
        Rejection::InvalidNode { .. }
    ));
}

#[test]
fn an_admitted_node_registers_only_within_its_admission() {
    let mut f = Fixture::new(0);
    let node = NodeId::new("evil");
    f.ok(Command::AdmitNode { node: node.clone(), admission: Some(admission(8, &[("gpu.model", "A100")])) });
    // The probe's claims: 1,024 GPUs; an attractive GPU model.
    let why = |r: Rejection| match r {
        Rejection::NotAdmitted { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert!(why(f.rejected(register("evil", 1024, &[]))).contains("claims 1024 GPUs; it was admitted for 8"));
    let r = why(f.rejected(register("evil", 8, &[("gpu.model", "H100")])));
    assert!(r.contains("gpu.model=H100; it was admitted with gpu.model=A100"), "{r}");
    let r = why(f.rejected(register("evil", 8, &[("rack", "r1")])));
    assert!(r.contains("rack=r1, which it was not admitted for"), "{r}");
    assert!(f.s.node_slot(&node).is_none(), "nothing registered");
    // Within it (less is fine: a GPU may have failed).
    f.ok(register("evil", 4, &[("gpu.model", "A100"), ("muster.address", "10.0.0.9:1")]));
    // Withdrawn: the next registration is judged without one (the edge
    // refuses it under --node-admission required).
    f.ok(Command::AdmitNode { node: node.clone(), admission: None });
    assert!(f.s.node_policy(&node).is_none());
    // An admission cannot grant a reserved label.
    let bad = admission(8, &[("muster.vcluster", "ml")]);
    assert!(matches!(
        f.rejected(Command::AdmitNode { node, admission: Some(bad) }),
        Rejection::InvalidNode { field, .. } if field == "admission.labels"
    ));
}

#[test]
fn an_admitted_wildcard_takes_any_value_of_its_key_and_nothing_else() {
    let mut f = Fixture::new(0);
    let admitted = admission(0, &[("hostname", ANY_LABEL_VALUE), ("gpu.model", "A100")]);
    f.ok(Command::AdmitNode { node: NodeId::new("n1"), admission: Some(admitted) });
    let r = f.rejected(register("n1", 0, &[("hostname", "vm"), ("gpu.model", "H100")]));
    assert!(matches!(&r, Rejection::NotAdmitted { reason, .. } if reason.contains("gpu.model=H100")), "{r:?}");
    let r = f.rejected(register("n1", 0, &[("hostname", "vm"), ("rack", "r1")]));
    assert!(matches!(&r, Rejection::NotAdmitted { reason, .. } if reason.contains("rack=r1")), "{r:?}");
    f.ok(register("n1", 0, &[("hostname", "vm-7"), ("gpu.model", "A100")]));
}

#[test]
fn secrets_are_kept_apart_from_the_spec_and_dropped_when_the_allocation_ends() {
    let mut f = Fixture::new(1);
    let secrets = Secrets(labels(&[("TOKEN", "hunter2")]));
    let s = spec(1, 1);
    let ev = f.ok(Command::SubmitWithSecrets { spec: s.clone(), secrets: secrets.clone() });
    let Event::Submitted { alloc, .. } = ev[0] else { panic!("{ev:?}") };
    assert_eq!(f.s.secrets(alloc), Some(&secrets));
    assert!(f.s.alloc(alloc).unwrap().spec.env.is_empty(), "not in the spec");
    assert!(!format!("{:?}", Command::SubmitWithSecrets { spec: s.clone(), secrets }).contains("hunter2"));
    let epoch = f.reserve(alloc, &[0]);
    f.start(alloc, 0, 0, epoch);
    f.ok(Command::FinishTask { alloc, task: 0, node: n(0), epoch });
    assert_eq!(f.status(alloc), AllocStatus::Done);
    assert_eq!(f.s.secrets(alloc), None, "dropped when it finished");
    assert_eq!(f.s.alloc(alloc).unwrap().secret_names, ["TOKEN"], "the names stay");
    // Bad secrets are refused by name, never echoing a value.
    let mut with_env = spec(1, 1);
    with_env.env.insert("TOKEN".into(), "plain".into());
    for (spec, secrets, needle) in [
        (with_env, labels(&[("TOKEN", "x")]), "TOKEN is also in env"),
        (spec(1, 1), labels(&[("1BAD", "x")]), "is not a variable name"),
        (spec(1, 1), labels(&[("BIG", &"v".repeat(MAX_SECRET_VALUE_BYTES + 1))]), "the value of BIG is"),
        (spec(1, 1), labels(&[("NUL", "a\0b")]), "contains NUL"),
    ] {
        match f.rejected(Command::SubmitWithSecrets { spec, secrets: Secrets(secrets) }) {
            Rejection::InvalidSpec { field, reason } => {
                assert_eq!(field, "secrets");
                assert!(reason.contains(needle) && !reason.contains("vvvv"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
