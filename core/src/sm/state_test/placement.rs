//! Placement: label constraints and topology packing, checked again when a
//! reservation applies; the expression language parses and prints back.

use super::*;

/// Nodes n0.. with the given labels.
fn labelled(nodes: &[&[(&str, &str)]]) -> Fixture {
    let mut f = Fixture { s: State::default(), t: 1_000 };
    for (i, labels) in nodes.iter().enumerate() {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        f.ok(Command::RegisterNode { node: n(i as u32), resources: GPU_NODE, labels });
        f.ok(Command::MarkNodeReady { node: n(i as u32) });
    }
    f
}

fn placed(gang: u32, constraints: &str, pack_by: Option<&str>) -> AllocSpec {
    AllocSpec {
        placement: Placement {
            constraints: if constraints.is_empty() { vec![] } else { LabelExpr::parse_list(constraints).unwrap() },
            pack_by: pack_by.map(|p| Packing::parse(p).unwrap()),
        },
        ..spec(gang, 1)
    }
}

#[test]
fn expressions_parse_print_back_and_match() {
    let labels: BTreeMap<String, String> =
        [("gpu.model", "H100"), ("rack", "r1")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    for (text, holds) in [
        ("gpu.model=H100", true),
        ("gpu.model!=H100", false),
        ("gpu.model!=A100", true),
        ("gpu.model in (A100, H100)", true),
        ("gpu.model notin (A100,H100)", false),
        ("zone notin (a)", true),
        ("rack", true),
        ("!rack", false),
        ("!zone", true),
    ] {
        let e = LabelExpr::parse(text).unwrap();
        assert_eq!(e.matches(&labels), holds, "{text}");
        assert_eq!(LabelExpr::parse(&e.to_string()), Ok(e), "{text} prints back");
    }
    let list = LabelExpr::parse_list("gpu.model in (H100,A100),rack,!zone").unwrap();
    assert_eq!(list.len(), 3);
    // `==` is not an operator (it parsed as `=`), and values refuse the
    // bidirectional controls that display text in another order.
    for bad in [
        "",
        "gpu model=H100",
        "a in H100",
        "a in (x",
        "a=(",
        "a=",
        "k=v,",
        "a b c",
        "gpu.model==H100",
        "a=H100\u{202E}",
        "a in (x,\u{2066}y)",
    ] {
        assert!(LabelExpr::parse_list(bad).is_err(), "{bad:?} parsed");
    }
    assert_eq!(Packing::parse("rack"), Ok(Packing { key: "rack".into(), required: true }));
    assert_eq!(Packing::parse("block:preferred"), Ok(Packing { key: "block".into(), required: false }));
    assert!(Packing::parse("rack:sometimes").is_err());
    assert!(Packing::parse("rack=r1").is_err());
}

#[test]
fn a_reservation_is_refused_on_a_node_that_misses_a_constraint_or_breaks_the_packing() {
    let mut f = labelled(&[
        &[("gpu.model", "H100"), ("rack", "r1")],
        &[("gpu.model", "A100"), ("rack", "r1")],
        &[("gpu.model", "H100"), ("rack", "r2")],
    ]);
    let a = f.submit(placed(2, "gpu.model=H100", None));
    let r = f.rejected(Command::ReserveGang { alloc: a, epoch: 1, nodes: vec![n(0), n(1)] });
    assert_eq!(r, Rejection::ConstraintUnmet { node: n(1), alloc: a, constraint: "gpu.model=H100".into() });
    f.reserve(a, &[0, 2]);
    let b = f.submit(placed(2, "", Some("rack")));
    let r = f.rejected(Command::ReserveGang { alloc: b, epoch: 1, nodes: vec![n(1), n(2)] });
    assert_eq!(r, Rejection::PackingBroken { alloc: b, key: "rack".into() });
    f.reserve(b, &[0, 1]);
    // Snapshots keep placements.
    let back = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(back.alloc(b).unwrap().spec.placement, f.s.alloc(b).unwrap().spec.placement);
}

#[test]
fn bad_placements_are_invalid_specs() {
    let mut f = Fixture::new(1);
    let mut spec = spec(1, 1);
    spec.placement.constraints = vec![LabelExpr { key: "a b".into(), op: LabelOp::Exists }];
    let r = f.rejected(Command::Submit { spec: spec.clone() });
    assert!(matches!(&r, Rejection::InvalidSpec { field, .. } if field == "constraints"), "{r}");
    spec.placement.constraints = vec![LabelExpr::parse("rack").unwrap(); MAX_CONSTRAINTS + 1];
    let r = f.rejected(Command::Submit { spec: spec.clone() });
    assert!(matches!(&r, Rejection::InvalidSpec { field, .. } if field == "constraints"), "{r}");
    spec.placement.constraints.clear();
    spec.placement.pack_by = Some(Packing { key: "".into(), required: true });
    let r = f.rejected(Command::Submit { spec });
    assert!(matches!(&r, Rejection::InvalidSpec { field, .. } if field == "pack_by"), "{r}");
}
