//! What the core's tests share: a state with n ready 8-GPU nodes and a
//! clock, and helpers that apply commands and check every invariant after
//! each one.

use std::collections::BTreeMap;

use crate::sm::*;

pub(crate) const GPU_NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_000_000, cpus: 96 };

pub(crate) fn res(gpus: u32) -> Resources {
    Resources { gpus, vram_mb: if gpus > 0 { 40_000 } else { 0 }, mem_mb: 16_000, cpus: 4 }
}

pub(crate) fn spec(gang: u32, gpus: u32) -> AllocSpec {
    AllocSpec::new("alice", gang, res(gpus), vec!["train".into()])
}

pub(crate) fn n(i: u32) -> NodeId {
    NodeId::new(format!("n{i}"))
}

/// A manifest for task `task` of `alloc` on the writer's own disk, named
/// `name`, of `bytes` bytes (its digest is the name's bytes, padded).
pub(crate) fn manifest(alloc: AllocId, task: TaskIndex, name: &str, bytes: u64) -> ManifestUpload {
    let mut sha256 = [0u8; 32];
    for (d, b) in sha256.iter_mut().zip(name.bytes()) {
        *d = b;
    }
    ManifestUpload {
        step: None,
        bytes,
        sha256,
        store: CheckpointStore::Node,
        key: format!("{}{name}", key_prefix(alloc, task)),
    }
}

/// A state with `nodes` 8-GPU nodes named n0, n1, … and a clock at 1000 ms.
pub(crate) struct Fixture {
    /// The state.
    pub(crate) s: State,
    /// The time the next command applies at, ms.
    pub(crate) t: u64,
}

impl Fixture {
    pub(crate) fn new(nodes: u32) -> Fixture {
        let mut f = Fixture { s: State::default(), t: 1_000 };
        for i in 0..nodes {
            f.ok(Command::RegisterNode { node: n(i), resources: GPU_NODE, labels: BTreeMap::new() });
            f.ok(Command::MarkNodeReady { node: n(i) });
        }
        f
    }

    pub(crate) fn apply(&mut self, cmd: Command) -> Outcome {
        let out = self.s.apply(&cmd, &ApplyCtx { time_ms: self.t });
        self.s.check_invariants().unwrap_or_else(|e| panic!("invariant broken after {cmd:?}: {e}"));
        out
    }

    pub(crate) fn ok(&mut self, cmd: Command) -> Vec<Event> {
        match self.apply(cmd.clone()) {
            Outcome::Accepted(events) => events,
            Outcome::Rejected(r) => panic!("{cmd:?} rejected: {r}"),
        }
    }

    /// Applies a command that must be refused, and checks nothing changed.
    pub(crate) fn rejected(&mut self, cmd: Command) -> Rejection {
        let mut before = self.s.clone();
        before.advance_clock(self.t); // only the clock may move on a rejection
        match self.apply(cmd.clone()) {
            Outcome::Accepted(events) => panic!("{cmd:?} accepted: {events:?}"),
            Outcome::Rejected(r) => {
                assert_eq!(self.s, before, "a rejected {cmd:?} changed the state");
                r
            }
        }
    }

    pub(crate) fn submit(&mut self, spec: AllocSpec) -> AllocId {
        match self.ok(Command::Submit { spec })[..] {
            [Event::Submitted { alloc, duplicate: false }] => alloc,
            ref other => panic!("unexpected events {other:?}"),
        }
    }

    pub(crate) fn reserve(&mut self, alloc: AllocId, nodes: &[u32]) -> u64 {
        let epoch = self.s.alloc(alloc).unwrap().reservation_epoch + 1;
        self.ok(Command::ReserveGang { alloc, epoch, nodes: nodes.iter().map(|&i| n(i)).collect() });
        epoch
    }

    pub(crate) fn start(&mut self, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64) {
        self.ok(Command::StartTask { alloc, task, node: n(node), epoch });
    }

    /// Submits a gang, reserves it on nodes 0..gang and starts every task.
    pub(crate) fn running(&mut self, gang: u32, gpus: u32) -> (AllocId, u64) {
        let id = self.submit(spec(gang, gpus));
        let nodes: Vec<u32> = (0..gang).collect();
        let epoch = self.reserve(id, &nodes);
        for i in 0..gang {
            self.start(id, i, i, epoch);
        }
        (id, epoch)
    }

    pub(crate) fn fail(&mut self, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64) -> Vec<Event> {
        self.ok(Command::FailTask { alloc, task, node: n(node), epoch, exit_code: Some(1) })
    }

    pub(crate) fn status(&self, alloc: AllocId) -> AllocStatus {
        self.s.alloc(alloc).unwrap().status
    }

    pub(crate) fn task(&self, alloc: AllocId, task: TaskIndex) -> &Task {
        &self.s.alloc(alloc).unwrap().tasks[task as usize]
    }

    pub(crate) fn used_gpus(&self, node: u32) -> u32 {
        self.s.node(self.s.node_slot(&n(node)).unwrap()).used.gpus
    }
}

/// Teardown, preemption and watchdog helpers.
impl Fixture {
    pub(crate) fn ack(&mut self, alloc: AllocId, task: TaskIndex, node: u32, epoch: u64) -> Vec<Event> {
        self.ok(Command::ConfirmPreempted { alloc, task, node: n(node), epoch, checkpoint_failed: false })
    }

    pub(crate) fn attempts(&self, alloc: AllocId) -> Vec<u32> {
        self.s.alloc(alloc).unwrap().tasks.iter().map(|t| t.attempts).collect()
    }

    /// Cancels `alloc` and acks the stop of each of its tasks that ran, as
    /// their agents would: it ends cancelled, holding nothing.
    pub(crate) fn cancel_and_stop(&mut self, alloc: AllocId) {
        self.ok(Command::CancelAllocation { alloc });
        let a = self.s.alloc(alloc).unwrap();
        let stopping: Vec<(TaskIndex, NodeId, u64)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempting)
            .map(|t| (t.index, self.s.node(t.node.unwrap()).id.clone(), t.preemption_epoch))
            .collect();
        for (task, node, epoch) in stopping {
            self.ok(Command::ConfirmPreempted { alloc, task, node, epoch, checkpoint_failed: false });
        }
        assert_eq!(self.status(alloc), AllocStatus::Cancelled);
    }

    pub(crate) fn statuses(&self, alloc: AllocId) -> Vec<TaskStatus> {
        self.s.alloc(alloc).unwrap().tasks.iter().map(|t| t.status).collect()
    }

    /// Submits a gang of `gang` × `gpus` at `class` and runs it on `nodes`.
    pub(crate) fn running_on(&mut self, gang: u32, gpus: u32, class: u8, nodes: &[u32]) -> (AllocId, u64) {
        let mut sp = spec(gang, gpus);
        sp.preemption_class = class;
        let id = self.submit(sp);
        let epoch = self.reserve(id, nodes);
        for (i, &node) in nodes.iter().enumerate() {
            self.start(id, i as TaskIndex, node, epoch);
        }
        (id, epoch)
    }

    pub(crate) fn queued(&mut self, gang: u32, gpus: u32, class: u8) -> AllocId {
        let mut sp = spec(gang, gpus);
        sp.preemption_class = class;
        self.submit(sp)
    }

    pub(crate) fn preempt(&mut self, alloc: AllocId, victims: &[(AllocId, u64)], nodes: &[u32]) -> Outcome {
        self.apply(Command::Preempt {
            alloc,
            victims: victims.to_vec(),
            nodes: nodes.iter().map(|&i| n(i)).collect(),
            hold_ms: 60_000,
        })
    }

    pub(crate) fn trip(
        &mut self,
        alloc: AllocId,
        task: TaskIndex,
        node: u32,
        epoch: u64,
        kind: WatchdogKind,
    ) -> Vec<Event> {
        self.ok(Command::TripWatchdog { alloc, task, node: n(node), epoch, kind })
    }
}
