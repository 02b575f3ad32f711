//! Rendezvous ports: reserved on task 0's node with the gang, never shared
//! by two live gangs on a node, returned with task 0's capacity, and
//! re-derived from the snapshot.

use super::*;

/// Nodes n0.. with `range` as their `muster.ports` label.
fn with_ports(nodes: u32, range: &str) -> Fixture {
    let mut f = Fixture { s: State::default(), t: 1_000 };
    for i in 0..nodes {
        let labels = BTreeMap::from([(PORTS_LABEL.to_string(), range.to_string())]);
        f.ok(Command::RegisterNode { node: n(i), resources: GPU_NODE, labels });
        f.ok(Command::MarkNodeReady { node: n(i) });
    }
    f
}

fn gang(size: u32, ports: u32) -> AllocSpec {
    AllocSpec { ports, ..spec(size, 1) }
}

#[test]
fn a_gang_holds_the_lowest_free_ports_of_task_0s_node_until_task_0_leaves() {
    let mut f = with_ports(3, "29500-29502");
    let a = f.submit(gang(2, 2));
    let ea = f.reserve(a, &[0, 1]);
    assert_eq!(f.s.alloc(a).unwrap().ports, vec![29500, 29501]);
    // Another gang whose task 0 shares n0 gets the port left, never the same.
    let b = f.submit(gang(2, 1));
    f.reserve(b, &[0, 2]);
    assert_eq!(f.s.alloc(b).unwrap().ports, vec![29502]);
    // n0 is out of ports: a third gang may not put task 0 there, but may use
    // n0 for another task.
    let c = f.submit(gang(2, 1));
    let r = f.rejected(Command::ReserveGang { alloc: c, epoch: 1, nodes: vec![n(0), n(1)] });
    assert_eq!(r, Rejection::NoFreePorts { node: n(0), alloc: c, wanted: 1, free: 0 });
    f.reserve(c, &[1, 0]);
    assert_eq!(f.s.alloc(c).unwrap().ports, vec![29500]);
    // Task 0 of a finishes: its ports come back while task 1 still runs.
    f.start(a, 0, 0, ea);
    f.start(a, 1, 1, ea);
    f.ok(Command::FinishTask { alloc: a, task: 0, node: n(0), epoch: ea });
    assert!(f.s.alloc(a).unwrap().ports.is_empty());
    assert_eq!(f.s.free_ports(f.s.node_slot(&n(0)).unwrap()).collect::<Vec<_>>(), vec![29500, 29501]);
    let d = f.submit(gang(1, 2));
    f.reserve(d, &[0]);
    assert_eq!(f.s.alloc(d).unwrap().ports, vec![29500, 29501]);
}

#[test]
fn ports_return_on_cancel_and_rollback_and_survive_a_snapshot() {
    let mut f = with_ports(2, "40000-40000");
    let a = f.submit(gang(2, 1));
    f.reserve(a, &[0, 1]);
    let e = f.s.alloc(a).unwrap().reservation_epoch;
    let restored = State::from_snapshot(&f.s.to_snapshot()).unwrap();
    assert_eq!(restored.free_port_count(restored.node_slot(&n(0)).unwrap()), 0);
    assert_eq!(restored.state_digest(), f.s.state_digest());
    f.ok(Command::RollbackGang { alloc: a, epoch: e });
    assert!(f.s.alloc(a).unwrap().ports.is_empty());
    assert_eq!(f.s.free_port_count(f.s.node_slot(&n(0)).unwrap()), 1);
    let e = f.reserve(a, &[0, 1]);
    assert_eq!(f.s.alloc(a).unwrap().ports, vec![40000]);
    f.start(a, 0, 0, e);
    f.cancel_and_stop(a);
    assert_eq!(f.s.free_port_count(f.s.node_slot(&n(0)).unwrap()), 1);
}

#[test]
fn a_node_without_a_range_takes_no_task_0_that_wants_a_port() {
    let mut f = Fixture::new(2);
    let a = f.submit(gang(1, 1));
    let r = f.rejected(Command::ReserveGang { alloc: a, epoch: 1, nodes: vec![n(0)] });
    assert_eq!(r, Rejection::NoFreePorts { node: n(0), alloc: a, wanted: 1, free: 0 });
    // Asking for none needs none.
    let b = f.submit(gang(1, 0));
    f.reserve(b, &[0]);
    assert!(f.s.alloc(b).unwrap().ports.is_empty());
}

#[test]
fn port_ranges_and_counts_are_validated() {
    assert_eq!(PortRange::parse("29500-29599"), Ok(PortRange { first: 29500, count: 100 }));
    assert_eq!(PortRange::parse("none"), Ok(PortRange::default()));
    assert_eq!(PortRange::parse("7-7").unwrap().to_string(), "7-7");
    for bad in ["29500", "0-10", "10-9", "a-b", "1-70000"] {
        assert!(PortRange::parse(bad).is_err(), "{bad} parsed");
    }
    let mut f = Fixture::new(0);
    let labels = BTreeMap::from([(PORTS_LABEL.to_string(), "9-1".to_string())]);
    let r = f.rejected(Command::RegisterNode { node: n(0), resources: GPU_NODE, labels });
    assert!(matches!(&r, Rejection::InvalidNode { field, .. } if field == "labels.muster.ports"), "{r}");
    let r = f.rejected(Command::Submit { spec: gang(1, MAX_RENDEZVOUS_PORTS + 1) });
    assert!(matches!(&r, Rejection::InvalidSpec { field, .. } if field == "ports"), "{r}");
}
