//! Random operation sequences, turned into commands against the current
//! state so that most of them are meaningful (a purely random command would
//! almost always be rejected), with a share of deliberately bad ones.

use std::collections::BTreeMap;

use muster_scheduler::policy::{
    AdmissionConfig, Order, PreemptionConfig, ReclaimConfig, plan_admission, plan_drain_expiries,
    plan_expired_nominations, plan_preemptions, plan_reclaims,
};
use muster_scheduler::sm::{
    AllocId, AllocSpec, ApplyCtx, Command, NodeId, Outcome, Resources, State, TaskIndex, TaskStatus, WatchdogKind,
};
use proptest::prelude::*;

/// One abstract step.
#[derive(Clone, Debug)]
pub enum Op {
    Register {
        node: u8,
        gpus: u8,
    },
    Submit {
        gang: u8,
        gpus: u8,
        class: u8,
        key: Option<u8>,
    },
    Admit {
        advance_ms: u32,
        fifo: bool,
    },
    Claim {
        pick: usize,
        stale: bool,
        wrong_node: bool,
    },
    ClaimAll {
        pick: usize,
    },
    Finish {
        pick: usize,
    },
    Fail {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    RawReserve {
        pick: usize,
        nodes: Vec<u8>,
    },
    Rollback {
        pick: usize,
        epoch_delta: u8,
    },
    Lose {
        node: u8,
    },
    Ack {
        pick: usize,
        stale: bool,
        failed: bool,
    },
    Preempt {
        advance_ms: u32,
        max_victims: u8,
    },
    RawPreempt {
        pick: usize,
        victims: Vec<usize>,
        nodes: Vec<u8>,
    },
    Expire {
        advance_ms: u32,
    },
    Trip {
        pick: usize,
        kind: u8,
    },
    Checkpoint {
        pick: usize,
        stale: bool,
        bytes: u16,
    },
    ExitCheckpoint {
        pick: usize,
        stale: bool,
        bytes: u16,
    },
    ForceDrain {
        pick: usize,
        stale: bool,
    },
    /// A node lifecycle command (0 ready, 1-3 drain, 4 cancel, 5 stop,
    /// 6 restart, 7 terminate), right or wrong for the node's status.
    Lifecycle {
        node: u8,
        action: u8,
        timeout_ms: u32,
    },
    /// The leader's drain-deadline pass after the clock moved.
    ExpireDrains {
        advance_ms: u32,
    },
    /// Sets (creates, or updates) the quotas of vCluster `default` or `ml`:
    /// quotas come and go under running work.
    Quota {
        ml: bool,
        create: bool,
        gpus: Option<u8>,
        nodes: Option<u8>,
        allocs: Option<u8>,
        reject: bool,
        /// Borrow limit, percent.
        borrow: u8,
    },
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..6, 0u8..10).prop_map(|(node, gpus)| Op::Register { node, gpus }),
        4 => (1u8..5, 0u8..9, 0u8..12, proptest::option::of(0u8..4))
            .prop_map(|(gang, gpus, class, key)| Op::Submit { gang, gpus, class, key }),
        3 => (0u32..40_000, any::<bool>()).prop_map(|(advance_ms, fifo)| Op::Admit { advance_ms, fifo }),
        4 => (any::<usize>(), proptest::bool::weighted(0.1), proptest::bool::weighted(0.1))
            .prop_map(|(pick, stale, wrong_node)| Op::Claim { pick, stale, wrong_node }),
        3 => any::<usize>().prop_map(|pick| Op::ClaimAll { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Finish { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Fail { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (any::<usize>(), proptest::collection::vec(0u8..7, 0..5))
            .prop_map(|(pick, nodes)| Op::RawReserve { pick, nodes }),
        1 => (any::<usize>(), 0u8..3).prop_map(|(pick, epoch_delta)| Op::Rollback { pick, epoch_delta }),
        1 => (0u8..6).prop_map(|node| Op::Lose { node }),
        3 => (any::<usize>(), proptest::bool::weighted(0.1), proptest::bool::weighted(0.2))
            .prop_map(|(pick, stale, failed)| Op::Ack { pick, stale, failed }),
        2 => (0u32..200_000, 1u8..4).prop_map(|(advance_ms, max_victims)| Op::Preempt { advance_ms, max_victims }),
        1 => (any::<usize>(), proptest::collection::vec(any::<usize>(), 0..3), proptest::collection::vec(0u8..7, 0..5))
            .prop_map(|(pick, victims, nodes)| Op::RawPreempt { pick, victims, nodes }),
        1 => (0u32..2_000_000).prop_map(|advance_ms| Op::Expire { advance_ms }),
        2 => (any::<usize>(), 0u8..3).prop_map(|(pick, kind)| Op::Trip { pick, kind }),
        1 => (any::<usize>(), proptest::bool::weighted(0.1), any::<u16>())
            .prop_map(|(pick, stale, bytes)| Op::Checkpoint { pick, stale, bytes }),
        1 => (any::<usize>(), proptest::bool::weighted(0.1), any::<u16>())
            .prop_map(|(pick, stale, bytes)| Op::ExitCheckpoint { pick, stale, bytes }),
        1 => (any::<usize>(), proptest::bool::weighted(0.2)).prop_map(|(pick, stale)| Op::ForceDrain { pick, stale }),
        2 => (0u8..6, 0u8..8, 0u32..30_000)
            .prop_map(|(node, action, timeout_ms)| Op::Lifecycle { node, action, timeout_ms }),
        2 => (0u32..30_000).prop_map(|advance_ms| Op::ExpireDrains { advance_ms }),
        1 => (
            any::<bool>(),
            any::<bool>(),
            // Mostly roomy (coverage of preemption and resumption stays
            // high); a 0 now and then is refused by validation.
            proptest::option::of(prop_oneof![1 => Just(0u8), 9 => 8u8..48]),
            proptest::option::of(2u8..7),
            proptest::option::of(2u8..8),
            any::<bool>(),
            prop_oneof![1 => Just(0u8), 2 => 1u8..=100],
        )
            .prop_map(|(ml, create, gpus, nodes, allocs, reject, borrow)| Op::Quota {
                ml,
                create,
                gpus,
                nodes,
                allocs,
                reject,
                borrow
            }),
    ]
}

pub fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..max)
}

fn node(i: u8) -> NodeId {
    NodeId::new(format!("n{i}"))
}

/// Node `i`'s labels: home to `default` (no label), to `ml`, or shared
/// (labelled for a vCluster that does not exist), in turn.
fn labels(i: u8) -> BTreeMap<String, String> {
    let vc = match i % 3 {
        0 => return BTreeMap::new(),
        1 => "ml",
        _ => "shared",
    };
    BTreeMap::from([(muster_scheduler::sm::VCLUSTER_LABEL.to_string(), vc.to_string())])
}

/// Node `i`'s registration: its vCluster label set by an admin (reserved
/// labels are never the agent's), then the node registering.
fn register(i: u8, resources: Resources) -> Vec<Command> {
    let set = labels(i);
    let label =
        (!set.is_empty()).then(|| Command::LabelNode { node: node(i), set, remove: vec![], by: "admin".into() });
    label.into_iter().chain([Command::RegisterNode { node: node(i), resources, labels: BTreeMap::new() }]).collect()
}

/// A cluster under test: the state and its clock.
#[derive(Clone)]
pub struct Run {
    pub state: State,
    pub now_ms: u64,
}

impl Default for Run {
    /// Four 8-GPU nodes to start with, so that gangs fill the cluster and
    /// preemption has something to choose from.
    fn default() -> Self {
        let mut state = State::default();
        for i in 0..4 {
            let resources = Resources { gpus: 8, vram_mb: 40_000, mem_mb: 256_000, cpus: 32 };
            for cmd in register(i, resources) {
                assert!(state.apply(&cmd, &ApplyCtx { time_ms: 1_000 }).is_accepted());
            }
            let ready = Command::MarkNodeReady { node: node(i) };
            assert!(state.apply(&ready, &ApplyCtx { time_ms: 1_000 }).is_accepted());
        }
        // Classes not divisible by 4 submit to `ml`, which exists (without quotas, and
        // borrowing up to half its demand) from the start; the Quota op
        // changes it.
        let mut spec = muster_scheduler::sm::VClusterSpec::default_for("ml");
        spec.borrow_limit_pct = 50;
        let ml = Command::CreateVCluster { name: "ml".into(), spec, by: "prop".into() };
        assert!(state.apply(&ml, &ApplyCtx { time_ms: 1_000 }).is_accepted());
        Run { state, now_ms: 1_000 }
    }
}

impl Run {
    fn tasks_in(&self, status: TaskStatus) -> Vec<(AllocId, TaskIndex, NodeId, u64)> {
        let mut out = Vec::new();
        for (id, a) in self.state.allocs().iter() {
            for t in a.tasks.iter().filter(|t| t.status == status) {
                let n = t.node.map_or_else(|| NodeId::new("none"), |s| self.state.node(s).id.clone());
                out.push((*id, t.index, n, t.reservation_epoch));
            }
        }
        out
    }

    /// Running and preempting tasks: their processes may exit.
    fn live_tasks(&self) -> Vec<(AllocId, TaskIndex, NodeId, u64)> {
        let mut out = self.tasks_in(TaskStatus::Running);
        out.extend(self.tasks_in(TaskStatus::Preempting));
        out
    }

    /// Preempting tasks with their node and preemption epoch.
    fn preempting(&self) -> Vec<(AllocId, TaskIndex, NodeId, u64)> {
        let mut out = Vec::new();
        for (id, a) in self.state.allocs().iter() {
            for t in a.tasks.iter().filter(|t| t.status == TaskStatus::Preempting) {
                let n = self.state.node(t.node.expect("preempting task is placed")).id.clone();
                out.push((*id, t.index, n, t.preemption_epoch));
            }
        }
        out
    }

    fn pick<T: Clone>(items: &[T], pick: usize) -> Option<T> {
        (!items.is_empty()).then(|| items[pick % items.len()].clone())
    }

    /// The commands one op turns into, given the current state.
    pub fn commands(&self, op: &Op) -> Vec<Command> {
        match op {
            Op::Register { node: i, gpus } => {
                let resources = Resources { gpus: u32::from(*gpus), vram_mb: 40_000, mem_mb: 256_000, cpus: 32 };
                let mut cmds = register(*i, resources);
                cmds.push(Command::MarkNodeReady { node: node(*i) });
                cmds
            }
            Op::Lifecycle { node: i, action, timeout_ms } => {
                let (node, by) = (node(*i), "prop".to_string());
                vec![match action {
                    0 => Command::MarkNodeReady { node },
                    1..=3 => Command::DrainNode { node, timeout_ms: u64::from(*timeout_ms), reason: "test".into(), by },
                    4 => Command::CancelDrain { node, by },
                    5 => Command::StopNode { node, reason: String::new(), by },
                    6 => Command::RestartNode { node, by },
                    _ => Command::TerminateNode { node, by },
                }]
            }
            Op::ExpireDrains { .. } => plan_drain_expiries(&self.state, self.now_ms),
            Op::Submit { gang, gpus, class, key } => {
                let res = Resources {
                    gpus: u32::from(*gpus),
                    vram_mb: if *gpus > 0 { 20_000 } else { 0 },
                    mem_mb: 10_000,
                    cpus: 2,
                };
                let mut spec = AllocSpec::new("prop", u32::from(*gang), res, vec!["x".into()]);
                spec.preemption_class = *class;
                spec.walltime_s = 600 + u64::from(*class) * 300;
                if class % 3 == 0 {
                    spec.checkpoint = muster_scheduler::sm::CheckpointMode::None;
                }
                spec.idempotency_key = key.map(|k| format!("k{k}"));
                // Most work goes to ml, so default's queue is often empty and
                // it lends its idle nodes (and later takes them back).
                if class % 4 != 0 {
                    spec.vcluster = "ml".into();
                }
                // Some wait for the allocation made just before, in each
                // kind of dependency.
                let last = self.state.next_alloc_id() - 1;
                if class % 5 == 1 && last > 0 {
                    use muster_scheduler::sm::{AfterWhen, Dependency};
                    let when =
                        [AfterWhen::Ok, AfterWhen::Any, AfterWhen::NotOk, AfterWhen::Started][usize::from(*gpus) % 4];
                    spec.after.deps = vec![Dependency { on: last, when }];
                }
                vec![Command::Submit { spec }]
            }
            Op::Admit { fifo, .. } => {
                let order = if *fifo { Order::Fifo } else { Order::LargestFirst };
                plan_admission(&self.state, self.now_ms, &AdmissionConfig { order, ..AdmissionConfig::default() })
                    .commands
            }
            Op::Claim { pick, stale, wrong_node } => Self::pick(&self.tasks_in(TaskStatus::Reserved), *pick)
                .map(|(alloc, task, n, epoch)| Command::StartTask {
                    alloc,
                    task,
                    node: if *wrong_node { node(6) } else { n },
                    epoch: if *stale { epoch.saturating_sub(1) } else { epoch },
                })
                .into_iter()
                .collect(),
            Op::ClaimAll { pick } => {
                let ids: Vec<AllocId> = self.state.reserved_allocs().collect();
                Self::pick(&ids, *pick)
                    .map(|alloc| {
                        let a = self.state.alloc(alloc).unwrap();
                        a.tasks
                            .iter()
                            .filter(|t| t.status == TaskStatus::Reserved)
                            .map(|t| Command::StartTask {
                                alloc,
                                task: t.index,
                                node: self.state.node(t.node.unwrap()).id.clone(),
                                epoch: t.reservation_epoch,
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            }
            Op::Finish { pick } => Self::pick(&self.live_tasks(), *pick)
                .map(|(alloc, task, node, epoch)| Command::FinishTask { alloc, task, node, epoch })
                .into_iter()
                .collect(),
            Op::Ack { pick, stale, failed } => Self::pick(&self.preempting(), *pick)
                .map(|(alloc, task, node, epoch)| Command::ConfirmPreempted {
                    alloc,
                    task,
                    node,
                    epoch: if *stale { epoch.saturating_sub(1) } else { epoch },
                    checkpoint_failed: *failed,
                })
                .into_iter()
                .collect(),
            Op::Preempt { max_victims, .. } => {
                let cfg = PreemptionConfig {
                    max_victims: usize::from(*max_victims),
                    min_runtime_ms: 10_000,
                    near_completion_ms: 60_000,
                    ..PreemptionConfig::default()
                };
                // Reclamations first, as the leader does.
                let reclaim = ReclaimConfig { return_grace_ms: 30_000, ..ReclaimConfig::default() };
                let mut cmds: Vec<Command> = plan_reclaims(&self.state, self.now_ms, &reclaim, &cfg)
                    .into_iter()
                    .map(|r| r.command(&self.state, &cfg))
                    .collect();
                // A pass that reclaims does not also preempt (both read the
                // same view: they could pick the same gang or nodes).
                if cmds.is_empty() {
                    cmds.extend(
                        plan_preemptions(&self.state, self.now_ms, &cfg)
                            .into_iter()
                            .map(|(alloc, d)| d.command(&self.state, alloc, &cfg)),
                    );
                }
                cmds
            }
            Op::RawPreempt { pick, victims, nodes } => {
                let ids: Vec<AllocId> = self.state.allocs().keys().copied().collect();
                Self::pick(&ids, *pick)
                    .map(|alloc| Command::Preempt {
                        alloc,
                        victims: victims
                            .iter()
                            .filter_map(|&v| Self::pick(&ids, v))
                            .map(|v| (v, self.state.alloc(v).unwrap().reservation_epoch))
                            .collect(),
                        nodes: nodes.iter().map(|&i| node(i)).collect(),
                        hold_ms: 100_000,
                    })
                    .into_iter()
                    .collect()
            }
            Op::Expire { .. } => plan_expired_nominations(&self.state, self.now_ms),
            Op::Trip { pick, kind } => Self::pick(&self.live_tasks(), *pick)
                .map(|(alloc, task, node, epoch)| Command::TripWatchdog {
                    alloc,
                    task,
                    node,
                    epoch,
                    kind: [WatchdogKind::Budget, WatchdogKind::Stall, WatchdogKind::GpuHealth][usize::from(*kind)],
                })
                .into_iter()
                .collect(),
            Op::Checkpoint { pick, stale, bytes } => Self::pick(&self.preempting(), *pick)
                .map(|(alloc, task, node, epoch)| Command::SaveCheckpoint {
                    alloc,
                    task,
                    node,
                    epoch: if *stale { epoch + 1 } else { epoch },
                    manifest: manifest_of(alloc, task, "p", *bytes),
                })
                .into_iter()
                .collect(),
            Op::ExitCheckpoint { pick, stale, bytes } => Self::pick(&self.live_tasks(), *pick)
                .map(|(alloc, task, node, epoch)| Command::SaveExitCheckpoint {
                    alloc,
                    task,
                    node,
                    epoch: if *stale { epoch + 1 } else { epoch },
                    manifest: manifest_of(alloc, task, "x", *bytes),
                })
                .into_iter()
                .collect(),
            Op::ForceDrain { pick, stale } => {
                let ids: Vec<AllocId> = self.state.tearing_down().collect();
                Self::pick(&ids, *pick)
                    .map(|alloc| Command::ForceTeardown {
                        alloc,
                        epoch: self.state.alloc(alloc).unwrap().preemption_epoch + u64::from(*stale),
                    })
                    .into_iter()
                    .collect()
            }
            Op::Fail { pick } => Self::pick(&self.live_tasks(), *pick)
                .map(|(alloc, task, node, epoch)| Command::FailTask { alloc, task, node, epoch, exit_code: Some(3) })
                .into_iter()
                .collect(),
            Op::Cancel { pick } => {
                let ids: Vec<AllocId> = self.state.allocs().keys().copied().collect();
                Self::pick(&ids, *pick).map(|alloc| Command::CancelAllocation { alloc }).into_iter().collect()
            }
            Op::RawReserve { pick, nodes } => {
                let ids: Vec<AllocId> = self.state.allocs().keys().copied().collect();
                Self::pick(&ids, *pick)
                    .map(|alloc| Command::ReserveGang {
                        alloc,
                        epoch: self.state.alloc(alloc).unwrap().reservation_epoch + 1,
                        nodes: nodes.iter().map(|&i| node(i)).collect(),
                    })
                    .into_iter()
                    .collect()
            }
            Op::Lose { node: i } => vec![Command::MarkNodeLost { node: node(*i) }],
            Op::Quota { ml, create, gpus, nodes, allocs, reject, borrow } => {
                use muster_scheduler::sm::{OverQuota, Quota, VClusterSpec};
                let name = if *ml { "ml" } else { "default" };
                // A 0 is refused by validation: that path is exercised too.
                let quota = Quota {
                    max_gpus: gpus.map(u32::from),
                    max_nodes: nodes.map(u32::from),
                    max_allocations: allocs.map(u32::from),
                };
                let over_quota = if *reject { OverQuota::Reject } else { OverQuota::Queue };
                let spec =
                    VClusterSpec { quota, over_quota, borrow_limit_pct: *borrow, ..VClusterSpec::default_for(name) };
                let by = "prop".to_string();
                vec![if *create {
                    Command::CreateVCluster { name: name.into(), spec, by }
                } else {
                    Command::UpdateVCluster { name: name.into(), spec, by }
                }]
            }
            Op::Rollback { pick, epoch_delta } => {
                let ids: Vec<AllocId> = self.state.reserved_allocs().collect();
                Self::pick(&ids, *pick)
                    .map(|alloc| Command::RollbackGang {
                        alloc,
                        epoch: self.state.alloc(alloc).unwrap().reservation_epoch + u64::from(*epoch_delta) % 2,
                    })
                    .into_iter()
                    .collect()
            }
        }
    }

    /// Runs one op: advances the clock, builds its commands and applies them.
    pub fn step(&mut self, op: &Op) -> Vec<(Command, Outcome)> {
        if let Op::Admit { advance_ms, .. }
        | Op::Preempt { advance_ms, .. }
        | Op::Expire { advance_ms }
        | Op::ExpireDrains { advance_ms } = op
        {
            self.now_ms += u64::from(*advance_ms);
        }
        self.now_ms += 1;
        let ctx = ApplyCtx { time_ms: self.now_ms };
        self.commands(op)
            .into_iter()
            .map(|cmd| {
                let out = self.state.apply(&cmd, &ctx);
                (cmd, out)
            })
            .collect()
    }
}

/// A checkpoint manifest on the writer's own disk, its key made unique by
/// `kind` and its size.
fn manifest_of(alloc: AllocId, task: u32, kind: &str, bytes: u16) -> muster_scheduler::sm::ManifestUpload {
    muster_scheduler::sm::ManifestUpload {
        step: None,
        bytes: u64::from(bytes),
        sha256: [1; 32],
        store: muster_scheduler::sm::CheckpointStore::Node,
        key: format!("{}{kind}{bytes}", muster_scheduler::sm::key_prefix(alloc, task)),
    }
}
