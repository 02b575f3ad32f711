//! Unit tests of the agent-sync planner, one per message kind.

use std::collections::BTreeMap;

use super::{ADDRESS_LABEL, SentMemory, StopHow, SyncConfig, plan_sync};
use crate::policy::{PreemptionConfig, plan_preemptions};
use crate::sm::{AllocId, CheckpointMode, Command, NodeStatus};
use crate::testkit::{Fixture, GPU_NODE, n, spec};

const CFG: SyncConfig = SyncConfig { stop_grace_ms: 15_000, preemption_grace_ms: 30_000 };

/// `nodes` ready nodes, each advertising a gang-peer address.
fn cluster(nodes: u32) -> Fixture {
    let mut c = Fixture::new(nodes);
    for i in 0..nodes {
        let labels = BTreeMap::from([(ADDRESS_LABEL.to_string(), format!("10.0.0.{i}:7000"))]);
        c.ok(Command::RegisterNode { node: n(i), resources: GPU_NODE, labels });
    }
    c
}

/// Submits a gang of 8-GPU tasks with an environment variable set.
fn submit(c: &mut Fixture, gang: u32, class: u8, checkpoint: CheckpointMode) -> AllocId {
    let mut s = spec(gang, 8);
    s.preemption_class = class;
    s.checkpoint = checkpoint;
    s.env.insert("A".into(), "1".into());
    c.submit(s)
}

/// Reserves `id` on `nodes` and starts every task.
fn run(c: &mut Fixture, id: AllocId, nodes: &[u32]) {
    let epoch = c.reserve(id, nodes);
    for (task, &i) in nodes.iter().enumerate() {
        c.start(id, task as u32, i, epoch);
    }
}

#[test]
fn a_notice_goes_once_per_status_and_again_when_it_changes() {
    let mut c = cluster(1);
    let id = submit(&mut c, 1, 0, CheckpointMode::None);
    run(&mut c, id, &[0]);
    let mut sent = SentMemory::default();
    let plan = plan_sync(&c.s, &n(0), &sent, false, &CFG);
    assert_eq!(plan.notice, Some((NodeStatus::Ready, 0)), "every stream is told once");
    sent.sent(&plan);
    assert!(plan_sync(&c.s, &n(0), &sent, false, &CFG).is_empty());
    assert!(plan_sync(&c.s, &n(0), &sent, true, &CFG).is_empty(), "a heartbeat repeats no notice");
    // A node with work drains until its deadline.
    c.ok(Command::DrainNode { node: n(0), timeout_ms: 60_000, reason: "r".into(), by: "op".into() });
    let plan = plan_sync(&c.s, &n(0), &sent, false, &CFG);
    assert_eq!(plan.notice, Some((NodeStatus::Draining, c.t + 60_000)), "{plan:?}");
    sent.sent(&plan);
    assert!(plan_sync(&c.s, &n(0), &sent, false, &CFG).notice.is_none());
}

#[test]
fn a_reserved_task_is_assigned_once_with_its_peers_addresses() {
    let mut c = cluster(2);
    let id = submit(&mut c, 2, 0, CheckpointMode::None);
    c.reserve(id, &[0, 1]);
    let mut sent = SentMemory::default();
    let plan = plan_sync(&c.s, &n(1), &sent, false, &CFG);
    let [a] = &plan.assign[..] else { panic!("{plan:?}") };
    assert_eq!(a.key, (id, 1, 1));
    assert_eq!(a.peers, ["10.0.0.0:7000", "10.0.0.1:7000"]);
    assert_eq!((a.gang_size, a.gpus, a.env.clone()), (2, 8, vec![("A".to_string(), "1".to_string())]));
    assert!(!a.checkpointing);
    sent.sent(&plan);
    assert!(plan_sync(&c.s, &n(1), &sent, false, &CFG).assign.is_empty(), "assigned once per stream");
    assert!(plan_sync(&c.s, &n(1), &sent, true, &CFG).assign.is_empty(), "a heartbeat does not repeat it");
    // A fresh stream (a reconnect) is told again.
    assert_eq!(plan_sync(&c.s, &n(1), &SentMemory::default(), false, &CFG).assign.len(), 1);
    // Once it runs it is no longer an assignment.
    c.ok(Command::StartTask { alloc: id, task: 1, node: n(1), epoch: 1 });
    assert!(plan_sync(&c.s, &n(1), &SentMemory::default(), false, &CFG).assign.is_empty());
}

#[test]
fn a_cancelled_task_is_told_to_stop_with_the_stop_grace_and_again_on_heartbeats() {
    let mut c = cluster(1);
    let id = submit(&mut c, 1, 0, CheckpointMode::None);
    run(&mut c, id, &[0]);
    let mut sent = SentMemory::default();
    sent.sent(&plan_sync(&c.s, &n(0), &sent, false, &CFG));
    c.ok(Command::CancelAllocation { alloc: id });
    let plan = plan_sync(&c.s, &n(0), &sent, false, &CFG);
    let [(key, epoch, how)] = plan.preempt[..] else { panic!("{plan:?}") };
    assert_eq!((key, how), ((id, 0, 1), StopHow::Preempt { grace_ms: CFG.stop_grace_ms }));
    sent.sent(&plan);
    assert!(plan_sync(&c.s, &n(0), &sent, false, &CFG).preempt.is_empty(), "signalled once per entry");
    let again = plan_sync(&c.s, &n(0), &sent, true, &CFG);
    assert_eq!(again.preempt, [(key, epoch, how)], "a heartbeat repeats it until the ack commits");
}

#[test]
fn a_priority_victim_gets_a_hint_if_it_checkpoints_and_the_preemption_grace_if_not() {
    let mut c = cluster(2);
    let saver = submit(&mut c, 1, 0, CheckpointMode::Auto);
    run(&mut c, saver, &[0]);
    let plain = submit(&mut c, 1, 0, CheckpointMode::None);
    run(&mut c, plain, &[1]);
    submit(&mut c, 2, 9, CheckpointMode::None);
    c.t = 1_000_000;
    let cfg = PreemptionConfig::default();
    let decisions = plan_preemptions(&c.s, c.t, &cfg);
    let [(alloc, d)] = &decisions[..] else { panic!("{decisions:?}") };
    c.ok(d.command(&c.s, *alloc, &cfg));
    let hint = plan_sync(&c.s, &n(0), &SentMemory::default(), false, &CFG);
    assert_eq!(hint.preempt[..].iter().map(|p| p.2).collect::<Vec<_>>(), [StopHow::Hint]);
    let kill = plan_sync(&c.s, &n(1), &SentMemory::default(), false, &CFG);
    assert_eq!(
        kill.preempt[..].iter().map(|p| p.2).collect::<Vec<_>>(),
        [StopHow::Preempt { grace_ms: CFG.preemption_grace_ms }]
    );
}

#[test]
fn a_task_the_agent_runs_but_the_node_no_longer_holds_is_stopped_once() {
    let mut c = cluster(1);
    let id = submit(&mut c, 1, 0, CheckpointMode::None);
    run(&mut c, id, &[0]);
    let stale = (id, 0, 7);
    let mut sent = SentMemory::new([(id, 0, 1), stale]);
    let plan = plan_sync(&c.s, &n(0), &sent, false, &CFG);
    assert_eq!(plan.stop, [stale], "only the attempt the node does not hold");
    sent.sent(&plan);
    assert_eq!(sent.agent_running().iter().copied().collect::<Vec<_>>(), [(id, 0, 1)]);
    assert!(plan_sync(&c.s, &n(0), &sent, false, &CFG).stop.is_empty());
}

#[test]
fn an_unknown_node_gets_an_empty_plan() {
    let c = cluster(1);
    assert!(plan_sync(&c.s, &n(9), &SentMemory::default(), true, &CFG).is_empty());
}

/// A checkpoint on one node's disk is restored on another: the assignment
/// lists it with its writer's checkpoint address, the writer is granted to
/// serve it to exactly that node while the task is placed there, and once
/// the allocation is over its writer is told, until it confirms, to delete
/// it.
#[test]
fn a_checkpoint_on_a_nodes_disk_is_granted_to_the_node_that_restores_it_then_deleted() {
    use crate::sm::{CheckpointStore, Event, TaskStatus};
    use crate::testkit::manifest;
    let mut c = cluster(3);
    for i in 0..3 {
        let labels = BTreeMap::from([(super::CHECKPOINT_ADDRESS_LABEL.to_string(), format!("10.0.0.{i}:7100"))]);
        c.ok(Command::RegisterNode { node: n(i), resources: GPU_NODE, labels });
    }
    let id = submit(&mut c, 1, 0, CheckpointMode::Auto);
    run(&mut c, id, &[0]);
    let epoch = c.s.alloc(id).unwrap().reservation_epoch;
    c.ok(Command::SaveExitCheckpoint { alloc: id, task: 0, node: n(0), epoch, manifest: manifest(id, 0, "c1", 10) });
    c.fail(id, 0, 0, epoch);
    let mut writer = SentMemory::default();
    let plan = plan_sync(&c.s, &n(0), &writer, false, &CFG);
    assert_eq!(plan.grants, Some(vec![]), "nothing to serve while the task is not placed elsewhere");
    writer.sent(&plan);
    // Placed on n1: n1's assignment names the checkpoint and where to fetch
    // it; n0 may serve it to n1, and to no one else.
    let epoch = c.reserve(id, &[1]);
    let plan = plan_sync(&c.s, &n(1), &SentMemory::default(), false, &CFG);
    let [a] = &plan.assign[..] else { panic!("{plan:?}") };
    assert_eq!(a.restore.len(), 1);
    assert_eq!((a.restore[0].manifest.seq, a.restore[0].source.as_str()), (1, "10.0.0.0:7100"));
    assert_eq!(
        (a.store.clone(), a.max_checkpoint_bytes),
        (CheckpointStore::Node, crate::sm::DEFAULT_MAX_CHECKPOINT_BYTES)
    );
    let plan = plan_sync(&c.s, &n(0), &writer, false, &CFG);
    let grants = plan.grants.clone().expect("the grants changed");
    assert_eq!(grants.len(), 1);
    assert_eq!((grants[0].seq, grants[0].key.as_str(), grants[0].node.clone()), (1, "alloc-1/task-0/c1", n(1)));
    writer.sent(&plan);
    assert!(plan_sync(&c.s, &n(0), &writer, false, &CFG).grants.is_none(), "unchanged: not sent again");
    // It runs, then finishes: nothing left to serve, and the bytes are for
    // n0 to delete, asked again on every heartbeat until confirmed.
    c.start(id, 0, 1, epoch);
    let ev = c.ok(Command::FinishTask { alloc: id, task: 0, node: n(1), epoch });
    assert!(ev.contains(&Event::AllocationDone { alloc: id }));
    assert_eq!(c.task(id, 0).status, TaskStatus::Done);
    let plan = plan_sync(&c.s, &n(0), &writer, false, &CFG);
    assert_eq!(plan.grants, Some(vec![]));
    assert_eq!(plan.delete.iter().map(|m| m.seq).collect::<Vec<_>>(), [1]);
    writer.sent(&plan);
    assert!(plan_sync(&c.s, &n(0), &writer, false, &CFG).delete.is_empty(), "once per stream");
    assert_eq!(plan_sync(&c.s, &n(0), &writer, true, &CFG).delete.len(), 1, "and on each heartbeat");
    c.ok(Command::ForgetCheckpoints { node: n(0), seqs: vec![1] });
    assert!(plan_sync(&c.s, &n(0), &writer, true, &CFG).is_empty());
}
