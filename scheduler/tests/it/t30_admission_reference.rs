//! The indexed admission pass decides exactly what a naive reference does:
//! walk the whole queue in admission order, skip a gang its vCluster's
//! quota holds back (counting this pass's own reservations), scan every
//! node sorted by (free GPUs, slot), place on the first fits, subtract, go
//! on.

use muster_scheduler::policy::{AdmissionConfig, plan_admission};
use std::collections::BTreeMap;

use muster_scheduler::sm::{Command, NodeSlot, NodeStatus, Usage, VcLoad, fits};
use proptest::prelude::*;

use crate::model::{Op, Run, ops};

fn naive_plan(run: &Run) -> Vec<Command> {
    let s = &run.state;
    let mut free: Vec<Usage> = s.nodes().iter().map(|n| n.free()).collect();
    let mut out = Vec::new();
    let mut pending: BTreeMap<String, VcLoad> = BTreeMap::new();
    for key in s.queue() {
        let a = s.alloc(key.alloc).unwrap();
        if s.quota_excess(a, &[], pending.get(&a.spec.vcluster), &[]).is_some() {
            continue;
        }
        let mut order: Vec<usize> = (0..free.len())
            .filter(|&i| s.nodes()[i].status == NodeStatus::Ready && s.held_for(s.nodes()[i].slot).is_none())
            .collect();
        order.sort_by_key(|&i| (free[i].gpus, i));
        let pick = |avoid: &[muster_scheduler::sm::NodeSlot]| -> Vec<usize> {
            order
                .iter()
                .copied()
                .filter(|&i| !avoid.contains(&s.nodes()[i].slot))
                .filter(|&i| fits(&a.spec.resources, &s.nodes()[i].resources, &free[i]))
                .take(a.spec.gang_size as usize)
                .collect()
        };
        // A watchdog retry goes elsewhere when it can.
        let mut chosen = pick(&a.avoid_nodes);
        if chosen.len() < a.spec.gang_size as usize {
            chosen = pick(&[]);
        }
        let slots: Vec<NodeSlot> = chosen.iter().map(|&i| s.nodes()[i].slot).collect();
        if chosen.len() == a.spec.gang_size as usize
            && s.quota_excess(a, &slots, pending.get(&a.spec.vcluster), &[]).is_none()
        {
            pending.entry(a.spec.vcluster.clone()).or_default().add_gang(a, &slots);
            for &i in &chosen {
                free[i] = free[i].minus(&Usage::of(&a.spec.resources));
            }
            out.push(Command::ReserveGang {
                alloc: a.id,
                epoch: a.reservation_epoch + 1,
                nodes: chosen.iter().map(|&i| s.nodes()[i].id.clone()).collect(),
            });
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn indexed_pass_matches_the_naive_reference(ops in ops(80)) {
        let mut run = Run::default();
        for op in &ops {
            // Compare right before each admission (no stale reservations in
            // play: the reference does not roll back).
            if let Op::Admit { .. } = op {
                let plan = plan_admission(&run.state, run.now_ms, &AdmissionConfig {
                    stale_reservation_ms: u64::MAX,
                    ..AdmissionConfig::default()
                });
                prop_assert_eq!(plan.commands, naive_plan(&run));
            }
            run.step(op);
        }
    }
}
