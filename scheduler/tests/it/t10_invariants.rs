//! Properties that hold after every command of any sequence: no node is ever
//! over-committed, no gang is ever partly reserved or partly running outside
//! a teardown, the derived indexes match a rebuild, planned commands
//! (admission, preemption, hold expiry) are accepted, and snapshot → restore gives back the same state and digest.

use muster_scheduler::sm::{ApplyCtx, Command, NodeStatus, Outcome, Rejection, State};
use proptest::prelude::*;

use crate::model::{Op, Run, ops};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_command(ops in ops(80)) {
        let mut run = Run::default();
        for op in &ops {
            let mut expired = false;
            for (cmd, out) in run.step(op) {
                if let Err(e) = run.state.check_invariants() {
                    panic!("after {cmd:?} ({out:?}): {e}");
                }
                // One drain expiry can finish another node's drain in the
                // same pass: requeueing a gang that spans both empties the
                // other node, which stops at once; its own ExpireDrain is
                // then refused (and changes nothing).
                let finished_by_earlier = expired
                    && matches!(
                        (&cmd, &out),
                        (
                            Command::ExpireDrain { .. },
                            Outcome::Rejected(Rejection::IllegalNodeTransition { from: NodeStatus::Stopped, .. })
                        )
                    );
                expired |= matches!(cmd, Command::ExpireDrain { .. }) && out.is_accepted();
                if finished_by_earlier {
                    continue;
                }
                // A fresh admission plan is made from the current view, so it
                // must be accepted whole.
                if matches!(op, Op::Admit { .. }) && matches!(cmd, Command::ReserveGang { .. } | Command::RollbackGang { .. }) {
                    prop_assert!(out.is_accepted(), "planned {:?} was rejected: {:?}", cmd, out);
                }
                // So must a preemption pass's decisions, and expiries.
                if matches!(op, Op::Preempt { .. } | Op::Expire { .. } | Op::ExpireDrains { .. }) {
                    prop_assert!(out.is_accepted(), "planned {:?} was rejected: {:?}", cmd, out);
                }
            }
        }
    }

    #[test]
    fn snapshot_restore_keeps_state_and_digest(ops in ops(60)) {
        let mut run = Run::default();
        for op in &ops {
            run.step(op);
        }
        let restored = State::from_snapshot(&run.state.to_snapshot()).expect("own snapshot decodes");
        prop_assert_eq!(restored.state_digest(), run.state.state_digest());
        prop_assert_eq!(&restored, &run.state);
    }

    /// A rejected command changes nothing (applied at time 0, the clock
    /// cannot move either).
    #[test]
    fn rejections_change_nothing(ops in ops(60)) {
        let mut run = Run::default();
        for op in &ops {
            let mut probe = run.state.clone();
            for cmd in run.commands(op) {
                let before = probe.clone();
                if !probe.apply(&cmd, &ApplyCtx { time_ms: 0 }).is_accepted() {
                    prop_assert_eq!(&probe, &before, "rejected {:?} changed the state", cmd);
                }
            }
            run.step(op);
        }
    }
}

/// Any command at all, with ids, epochs and sizes drawn from the whole range
/// (extremes included), is answered with an outcome: apply never panics and
/// never breaks an invariant.
mod arbitrary {
    use std::collections::BTreeMap;

    use muster_scheduler::sm::{
        AllocSpec, ApplyCtx, CheckpointMode, CheckpointSettings, CheckpointStore, Command, LabelExpr, ManifestUpload,
        NodeId, PORTS_LABEL, Packing, Placement, Resources, State, key_prefix,
    };
    use proptest::prelude::*;

    fn any_u64() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..4, Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()]
    }

    fn any_u32() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..4, Just(u32::MAX), any::<u32>()]
    }

    fn node() -> impl Strategy<Value = NodeId> {
        prop_oneof![(0u8..3).prop_map(|i| NodeId::new(format!("n{i}"))), ".{0,300}".prop_map(NodeId::new)]
    }

    /// A manifest an agent might send: a key for its own task or a stray one,
    /// on its own disk or in a shared store, of a size around the cap.
    #[derive(Clone, Debug)]
    struct AnyManifest {
        own_key: bool,
        name: String,
        shared: bool,
        bytes: u64,
    }

    impl AnyManifest {
        fn named(self, alloc: u64, task: u32) -> ManifestUpload {
            let key = if self.own_key { format!("{}{}", key_prefix(alloc, task), self.name) } else { self.name };
            ManifestUpload {
                step: None,
                bytes: self.bytes,
                sha256: [7; 32],
                store: if self.shared {
                    CheckpointStore::Shared { root: "/mnt/c".into() }
                } else {
                    CheckpointStore::Node
                },
                key,
            }
        }
    }

    fn manifest() -> impl Strategy<Value = AnyManifest> {
        (any::<bool>(), "[a-z.]{0,6}", any::<bool>(), prop_oneof![Just(1u64), Just(1 << 20), Just((1 << 20) + 1)])
            .prop_map(|(own_key, name, shared, bytes)| AnyManifest { own_key, name, shared, bytes })
    }

    fn resources() -> impl Strategy<Value = Resources> {
        (prop_oneof![0u32..9, any::<u32>()], any_u64(), any_u64(), prop_oneof![0u32..9, any::<u32>()])
            .prop_map(|(gpus, vram_mb, mem_mb, cpus)| Resources { gpus, vram_mb, mem_mb, cpus })
    }

    fn spec() -> impl Strategy<Value = AllocSpec> {
        (
            ".{0,8}",
            prop_oneof![0u32..4, any::<u32>()],
            resources(),
            any::<u8>(),
            any::<i32>(),
            any_u64(),
            any_u32(),
            proptest::collection::vec(".{0,6}", 0..3),
            proptest::option::of(".{0,4}"),
        )
            .prop_map(
                |(owner, gang_size, resources, class, priority, walltime_s, max_retries, command, key)| AllocSpec {
                    owner,
                    gang_size,
                    resources,
                    preemption_class: class,
                    priority,
                    checkpoint: CheckpointMode::None,
                    walltime_s,
                    max_retries,
                    command,
                    env: BTreeMap::new(),
                    idempotency_key: key,
                    vcluster: "default".into(),
                    vcluster_type: Default::default(),
                    sensitive: class % 7 == 0,
                    checkpoint_estimate_s: 60,
                    stall_timeout_s: 0,
                    pids_max: class as u32 * 100,
                    // Some wait for one of the first allocations (refused
                    // while it does not exist yet), in each kind.
                    after: muster_scheduler::sm::After {
                        deps: (priority.rem_euclid(4) == 1)
                            .then(|| muster_scheduler::sm::Dependency {
                                on: 1 + u64::from(priority.unsigned_abs()) % 5,
                                when: [
                                    muster_scheduler::sm::AfterWhen::Ok,
                                    muster_scheduler::sm::AfterWhen::Any,
                                    muster_scheduler::sm::AfterWhen::NotOk,
                                    muster_scheduler::sm::AfterWhen::Started,
                                ][usize::from(class) % 4],
                            })
                            .into_iter()
                            .collect(),
                        any_of: false,
                        keep_if_unsatisfiable: class % 5 == 0,
                    },
                    // Some name an image (its spec is carried and checked
                    // like the rest; where it may run is the API's
                    // constraint, not the state machine's).
                    container: (priority.rem_euclid(5) == 2).then(|| muster_scheduler::sm::ContainerSpec {
                        image: muster_scheduler::sm::ImageRef::parse("127.0.0.1:5000/t/bb:1").unwrap(),
                        mounts: vec![muster_scheduler::sm::Mount::parse("/data:/data:ro").unwrap()],
                        workdir: Some("/work".into()),
                    }),
                    // Nodes offer two ports: some gangs want none, some
                    // run them out.
                    ports: priority.rem_euclid(3) as u32,
                    // Nodes sit in two racks: some gangs pack by rack, some
                    // want rack r0.
                    placement: match class % 4 {
                        1 => Placement { constraints: vec![], pack_by: Some(Packing::parse("rack").unwrap()) },
                        2 => Placement { constraints: LabelExpr::parse_list("rack=r0").unwrap(), pack_by: None },
                        _ => Placement::default(),
                    },
                    checkpoint_store: None,
                    name: String::new(),
                },
            )
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (node(), resources()).prop_map(|(node, resources)| Command::RegisterNode {
                node,
                resources,
                labels: BTreeMap::from([
                    (PORTS_LABEL.to_string(), "100-101".to_string()),
                    ("rack".to_string(), format!("r{}", resources.gpus % 2)),
                ])
            }),
            spec().prop_map(|spec| Command::Submit { spec }),
            (any_u64(), any_u64(), proptest::collection::vec(node(), 0..4))
                .prop_map(|(alloc, epoch, nodes)| Command::ReserveGang { alloc, epoch, nodes }),
            (any_u64(), any_u64()).prop_map(|(alloc, epoch)| Command::RollbackGang { alloc, epoch }),
            (any_u64(), any_u32(), node(), any_u64()).prop_map(|(alloc, task, node, epoch)| Command::StartTask {
                alloc,
                task,
                node,
                epoch
            }),
            (any_u64(), any_u32(), node(), any_u64()).prop_map(|(alloc, task, node, epoch)| Command::FinishTask {
                alloc,
                task,
                node,
                epoch
            }),
            (any_u64(), any_u32(), node(), any_u64(), proptest::option::of(any::<i32>())).prop_map(
                |(alloc, task, node, epoch, exit_code)| Command::FailTask { alloc, task, node, epoch, exit_code }
            ),
            any_u64().prop_map(|alloc| Command::CancelAllocation { alloc }),
            node().prop_map(|node| Command::MarkNodeLost { node }),
            (any_u64(), any_u32(), node(), any_u64(), any::<bool>()).prop_map(
                |(alloc, task, node, epoch, checkpoint_failed)| Command::ConfirmPreempted {
                    alloc,
                    task,
                    node,
                    epoch,
                    checkpoint_failed
                }
            ),
            (
                any_u64(),
                proptest::collection::vec((any_u64(), any_u64()), 0..3),
                proptest::collection::vec(node(), 0..3),
                any_u64()
            )
                .prop_map(|(alloc, victims, nodes, hold_ms)| Command::Preempt {
                    alloc,
                    victims,
                    nodes,
                    hold_ms
                }),
            any_u64().prop_map(|alloc| Command::ExpireNomination { alloc }),
            (any_u64(), any_u32(), node(), any_u64(), manifest()).prop_map(|(alloc, task, node, epoch, m)| {
                Command::SaveCheckpoint { alloc, task, node, epoch, manifest: m.named(alloc, task) }
            }),
            (any_u64(), any_u32(), node(), any_u64(), manifest()).prop_map(|(alloc, task, node, epoch, m)| {
                Command::SaveExitCheckpoint { alloc, task, node, epoch, manifest: m.named(alloc, task) }
            }),
            (any_u64(), any_u32(), node(), any_u64(), any_u64(), ".{0,6}").prop_map(
                |(alloc, task, node, epoch, seq, reason)| Command::DropCheckpoint {
                    alloc,
                    task,
                    node,
                    epoch,
                    seq,
                    reason
                }
            ),
            (node(), proptest::collection::vec(any_u64(), 0..4))
                .prop_map(|(node, seqs)| Command::ForgetCheckpoints { node, seqs }),
            (1u32..4, any::<bool>()).prop_map(|(keep, shared)| Command::SetCheckpointSettings {
                settings: CheckpointSettings {
                    store: if shared {
                        CheckpointStore::Shared { root: "/mnt/c".into() }
                    } else {
                        CheckpointStore::Node
                    },
                    keep,
                    max_bytes: 1 << 20,
                },
                by: "admin".into(),
            }),
            (any_u64(), any_u64()).prop_map(|(alloc, epoch)| Command::ForceTeardown { alloc, epoch }),
            node().prop_map(|node| Command::MarkNodeReady { node }),
            (node(), any_u64(), ".{0,8}", ".{0,4}").prop_map(|(node, timeout_ms, reason, by)| Command::DrainNode {
                node,
                timeout_ms,
                reason,
                by
            }),
            (node(), ".{0,4}").prop_map(|(node, by)| Command::CancelDrain { node, by }),
            node().prop_map(|node| Command::ExpireDrain { node }),
            (node(), ".{0,4}").prop_map(|(node, by)| Command::StopNode { node, reason: String::new(), by }),
            (node(), ".{0,4}").prop_map(|(node, by)| Command::RestartNode { node, by }),
            (node(), ".{0,4}").prop_map(|(node, by)| Command::TerminateNode { node, by }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn apply_answers_any_command_without_panicking(
            cmds in proptest::collection::vec((command(), any_u64()), 1..60)
        ) {
            let mut s = State::default();
            for (cmd, t) in &cmds {
                let _ = s.apply(cmd, &ApplyCtx { time_ms: *t });
                if let Err(e) = s.check_invariants() {
                    panic!("after {cmd:?}: {e}");
                }
            }
        }
    }
}

/// The random runs above do reach preemptions, suspensions and resumptions,
/// gangs on borrowed nodes and reclamations, and drains that complete, time out and retry in place (a model that never
/// produced them would test nothing about them).
#[test]
fn random_runs_reach_preemption_suspension_resumption_and_drains() {
    use muster_scheduler::sm::{Event, Outcome};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let (mut decided, mut suspended, mut resumed) = (0, 0, 0u32);
    let (mut borrowed, mut reclaimed) = (0u32, 0);
    let (mut drained, mut timed_out, mut drain_teardowns) = (0, 0, 0);
    for _ in 0..200 {
        let ops = crate::model::ops(120).new_tree(&mut runner).unwrap().current();
        let mut run = Run::default();
        for op in &ops {
            for (_, out) in run.step(op) {
                if let Outcome::Accepted(events) = out {
                    for e in &events {
                        match e {
                            Event::PreemptionDecided {
                                reason: muster_scheduler::sm::PreemptReason::Reclaim, ..
                            } => reclaimed += 1,
                            Event::PreemptionDecided { .. } => decided += 1,
                            Event::DrainCompleted { .. } => drained += 1,
                            Event::DrainTimedOut { .. } => timed_out += 1,
                            Event::TeardownStarted {
                                cause: muster_scheduler::sm::TeardownCause::NodeDrain, ..
                            } => drain_teardowns += 1,
                            Event::TeardownCompleted { outcome, .. } if outcome.as_str() == "suspended" => {
                                suspended += 1
                            }
                            Event::GangReserved { alloc, .. } => {
                                let a = run.state.alloc(*alloc).unwrap();
                                resumed += u32::from(a.preempted_count > 0);
                                let on = a.tasks.iter().filter_map(|t| t.node);
                                borrowed += u32::from(on.into_iter().any(|s| run.state.borrowed_from(s, a).is_some()));
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    assert!(decided > 0 && suspended > 0 && resumed > 0, "decided {decided}, suspended {suspended}, resumed {resumed}");
    // Reclamations need a borrower claimed whole while its lender queues
    // work, which these runs seldom reach: the reclamation tests in
    // `sm::state_test::borrowing` and t133 cover it; here it is only counted.
    assert!(borrowed > 0, "gangs placed on borrowed nodes {borrowed}, reclamations {reclaimed}");
    assert!(
        drained > 0 && timed_out > 0 && drain_teardowns > 0,
        "drains completed {drained}, timed out {timed_out}, teardowns for a drain {drain_teardowns}"
    );
}
