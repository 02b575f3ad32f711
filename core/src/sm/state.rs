//! The replicated state and its one entry point, [`State::apply`].
//!
//! ```text
//!            Submit                 ReserveGang              StartTask
//!   (none) ─────────▶ Blocked ──────────────────▶ Reserved ───────────▶ Running
//!                       ▲  ▲   RollbackGang (no task    │                 │ │
//!                       │  └──────── started yet) ◀─────┘      FinishTask │ │ FailTask
//!                       │                                                 ▼ │
//!                       │            retries left, whole gang settled   Done│
//!                       └───────────────────────────────────────────────────┘
//!                                   out of retries / a sibling Done ─▶ Failed
//!
//!   Gang teardown (a task fails, its node is lost, or its reservation goes
//!   stale while siblings run), in the same command:
//!     trigger ─▶ Blocked (keeps its attempt)   Running siblings ─▶ Preempting (refunded)
//!     Reserved siblings ─▶ Blocked             Blocked / Done stay
//!   Preempting ── TaskPreempted{epoch} | ForceDrain | node lost | exit ──▶ Preempted
//!   last one stopped ─▶ Preempted ─▶ Blocked; gang Queued, or Failed when a task
//!   is out of retries or already Done
//!
//!   CancelAllocation, nothing running: reserved tasks released, every
//!   unfinished task ─▶ Cancelled. Tasks running or stopping: a teardown with
//!   cause Cancelled (a new epoch; capacity held until each stop is acked or
//!   forced), and when the last one stops, every unfinished task ─▶ Cancelled
//! ```
//!
//! Every handler checks everything before it changes anything, so a rejected
//! command leaves the state exactly as it was. Derived indexes (node lookup,
//! free-capacity index, queue, reservations) are kept in step with every
//! change and rebuilt after a snapshot is decoded; they are not part of the
//! snapshot or the digest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::command::Command;
use super::event::{Event, Outcome};
use super::rejection::Rejection;
use super::types::DEFAULT_VCLUSTER;
use super::types::{
    AllocEvent, AllocId, AllocSpec, AllocStatus, Allocation, Checkpoint, CheckpointMode, Drain, HISTORY_LIMIT,
    NODE_HISTORY_LIMIT, Node, NodeId, NodeSlot, NodeStatus, Nomination, PreemptReason, Resources, Task, TaskIndex,
    TaskStatus, Teardown, TeardownCause, TeardownOutcome, Token, TokenRole, Usage, VClusterType, fits,
};
use super::validate::{Limits, validate_node, validate_node_request, validate_spec};
use super::vcluster::{HomeNodes, OverQuota, VCluster, VClusterSpec};

/// What `apply` may know besides the command: the entry's leader-stamped time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyCtx {
    /// The leader's wall clock when it proposed the entry, in ms since the epoch.
    pub time_ms: u64,
}

/// The admission order of a queued gang: largest first, then higher class,
/// then a retry after a watchdog trip, then higher priority, then earlier
/// submit, then lower id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    /// Gang size, descending.
    pub gang_size: Reverse<u32>,
    /// Preemption class, descending.
    pub class: Reverse<u8>,
    /// A watchdog retry goes first in its class.
    pub retry_first: Reverse<bool>,
    /// Priority, descending.
    pub priority: Reverse<i32>,
    /// Submit time, ascending.
    pub submit_time_ms: u64,
    /// Id, ascending (the final tie-break).
    pub alloc: AllocId,
}

impl QueueKey {
    /// The key of an allocation.
    pub fn of(a: &Allocation) -> QueueKey {
        QueueKey {
            gang_size: Reverse(a.spec.gang_size),
            class: Reverse(a.spec.preemption_class),
            retry_first: Reverse(a.retry_first),
            priority: Reverse(a.spec.priority),
            submit_time_ms: a.submit_time_ms,
            alloc: a.id,
        }
    }
}

/// What admission needs to know to tell whether two gangs compete for the
/// same capacity in the same way: gang size and per-task resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    /// Gang size.
    pub gang_size: u32,
    /// Per-task resources.
    pub resources: Resources,
}

impl Shape {
    /// The least shape (a range start).
    pub const MIN: Shape = Shape { gang_size: 0, resources: Resources { gpus: 0, vram_mb: 0, mem_mb: 0, cpus: 0 } };

    /// The shape of an allocation.
    pub fn of(a: &Allocation) -> Shape {
        Shape { gang_size: a.spec.gang_size, resources: a.spec.resources }
    }
}

/// Lookups derived from the replicated fields; never serialized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Indexes {
    node_by_id: BTreeMap<NodeId, NodeSlot>,
    /// Ready nodes not held for a preemptor by (home key, free GPUs,
    /// slot): the capacity index admission walks.
    free_gpus: BTreeSet<(u32, u32, NodeSlot)>,
    /// Queued allocations in admission order.
    queue: BTreeSet<QueueKey>,
    /// Queued allocations grouped by their vCluster's home key and shape,
    /// each group in admission order.
    queue_by_shape: BTreeMap<(u32, Shape), BTreeSet<QueueKey>>,
    /// Queued allocations in submit order.
    queue_fifo: BTreeSet<AllocId>,
    /// Allocations holding at least one unclaimed reservation.
    reserved: BTreeSet<AllocId>,
    /// Tasks holding capacity (reserved, running or preempting), by node.
    tasks_by_node: BTreeMap<NodeSlot, BTreeSet<(AllocId, TaskIndex)>>,
    /// Allocations with a teardown in progress.
    tearing_down: BTreeSet<AllocId>,
    /// Nodes held for a preemptor, and for which.
    held: BTreeMap<NodeSlot, AllocId>,
    /// Queued allocations (not waiting on held nodes) that may preempt
    /// (class ≥ 1): highest class first, then admission order.
    preemptors: BTreeSet<(Reverse<u8>, QueueKey)>,
    /// Per node (by slot), what each task holding capacity there holds and
    /// its class, sorted by allocation: preemption bounds a node's freeable
    /// capacity from this without looking up allocations.
    holders: Vec<Vec<Holder>>,
    /// Nodes by lifecycle status.
    by_status: BTreeMap<NodeStatus, BTreeSet<NodeSlot>>,
    /// Draining or stopping nodes whose last task left during the command
    /// being applied (always empty between commands): they stop at its end.
    emptied: Vec<NodeSlot>,
    /// What each vCluster's reserved, running and preempting tasks hold
    /// (hard quotas are checked against it).
    vc_load: BTreeMap<String, VcLoad>,
    /// Each vCluster's live (not finished) allocations and the GPUs their
    /// gangs ask for: the demand a `reject`-mode quota counts at submission.
    vc_live: BTreeMap<String, VcDemand>,
    /// The vClusters in name order: vCluster `home_names[k - 1]` has home
    /// key `k`; key 0 is "no home" (a shared node every vCluster may use).
    home_names: Vec<String>,
    /// Each vCluster's home key.
    home_key: BTreeMap<String, u32>,
    /// Each node's home key, by slot.
    node_home: Vec<u32>,
    /// Per lending vCluster (home key): the other vClusters' allocations
    /// holding capacity on its nodes, and how many tasks each.
    lent: BTreeMap<u32, BTreeMap<AllocId, u32>>,
    /// Queued gangs not holding nodes, per vCluster home key.
    vc_queued: BTreeMap<u32, u32>,
}

/// A vCluster's live allocations and the GPUs their gangs need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcDemand {
    /// GPUs the live gangs need in all.
    pub gpus: u64,
    /// The live allocations.
    pub allocs: BTreeSet<AllocId>,
}

/// Counts one fewer under `key`, dropping it at zero (so a derived index
/// equals its rebuild, which never holds zeros).
fn decrement<K: Ord>(map: &mut BTreeMap<K, u32>, key: K) {
    let n = map.get_mut(&key).expect("counted");
    *n -= 1;
    if *n == 0 {
        map.remove(&key);
    }
}

/// What one vCluster's tasks holding capacity hold: the quantities its
/// hard quotas limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcLoad {
    /// GPUs held.
    pub gpus: u64,
    /// GPUs held on other vClusters' home nodes (borrowed capacity).
    pub borrowed_gpus: u64,
    /// Tasks holding capacity, by allocation.
    pub allocs: BTreeMap<AllocId, u32>,
    /// Tasks holding capacity, by node.
    pub nodes: BTreeMap<NodeSlot, u32>,
}

impl VcLoad {
    /// Adds a gang of `a` placed on `slots` (an admission pass's own
    /// reservations, before they are applied).
    pub fn add_gang(&mut self, a: &Allocation, slots: &[NodeSlot]) {
        self.gpus += u64::from(a.spec.resources.gpus) * slots.len() as u64;
        *self.allocs.entry(a.id).or_default() += slots.len() as u32;
        for s in slots {
            *self.nodes.entry(*s).or_default() += 1;
        }
    }
}

/// A task holding capacity on a node, as the preemption policy sees it
/// before looking its allocation up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The allocation.
    pub alloc: AllocId,
    /// Its preemption class.
    pub class: u8,
    /// What the task holds.
    pub usage: Usage,
    /// When its walltime ends: its start (or, not yet started, its
    /// reservation) plus the walltime. Backfill's projection reads it.
    pub walltime_ends_ms: u64,
}

/// The whole replicated state of the scheduler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    limits: Limits,
    now_ms: u64,
    next_alloc_id: AllocId,
    nodes: Vec<Node>,
    allocs: BTreeMap<AllocId, Allocation>,
    idempotency: BTreeMap<(String, String), AllocId>,
    /// Bearer tokens by id (hashes only).
    tokens: BTreeMap<String, Token>,
    /// vClusters by name (the built-in `default` only once changed).
    vclusters: BTreeMap<String, VCluster>,
    #[serde(skip)]
    index: Indexes,
    /// Nodes whose agents may have something new to hear since the last
    /// [`State::take_touched_nodes`]; never serialized, never compared.
    #[serde(skip)]
    touched: Touched,
}

/// The nodes touched by applied commands: not part of the replicated state
/// (two states are equal whatever they hold).
#[derive(Clone, Debug, Default)]
struct Touched(BTreeSet<NodeSlot>);

impl PartialEq for Touched {
    fn eq(&self, _: &Touched) -> bool {
        true
    }
}

impl Eq for Touched {}

impl Default for State {
    fn default() -> Self {
        State::new(Limits::default())
    }
}

type Applied = Result<Vec<Event>, Rejection>;

impl State {
    /// An empty state with these limits.
    pub fn new(limits: Limits) -> State {
        let mut s = State {
            limits,
            now_ms: 0,
            next_alloc_id: 1,
            nodes: Vec::new(),
            allocs: BTreeMap::new(),
            idempotency: BTreeMap::new(),
            tokens: BTreeMap::new(),
            vclusters: BTreeMap::new(),
            index: Indexes::default(),
            touched: Touched::default(),
        };
        s.rebuild_indexes();
        s
    }

    // ----- reads ---------------------------------------------------------

    /// The validation limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The state's clock: the latest entry time applied (never goes back).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The id the next new allocation will get.
    pub fn next_alloc_id(&self) -> AllocId {
        self.next_alloc_id
    }

    /// Every node, in slot order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node in `slot`.
    pub fn node(&self, slot: NodeSlot) -> &Node {
        &self.nodes[slot.0 as usize]
    }

    /// The slot of the node named `id`.
    pub fn node_slot(&self, id: &NodeId) -> Option<NodeSlot> {
        self.index.node_by_id.get(id).copied()
    }

    /// One allocation.
    pub fn alloc(&self, id: AllocId) -> Option<&Allocation> {
        self.allocs.get(&id)
    }

    /// Every allocation, by id.
    pub fn allocs(&self) -> &BTreeMap<AllocId, Allocation> {
        &self.allocs
    }

    /// Queued allocations in admission order (largest gang first).
    pub fn queue(&self) -> impl DoubleEndedIterator<Item = &QueueKey> + '_ {
        self.index.queue.iter()
    }

    /// How many allocations are queued.
    pub fn queue_len(&self) -> usize {
        self.index.queue.len()
    }

    /// Queued allocations grouped by their vCluster's home key and shape;
    /// each group in admission order.
    pub fn queue_by_shape(&self) -> &BTreeMap<(u32, Shape), BTreeSet<QueueKey>> {
        &self.index.queue_by_shape
    }

    /// The home key of each node's home vCluster, by slot (0: a shared node,
    /// home to no vCluster).
    pub fn node_home(&self, slot: NodeSlot) -> u32 {
        self.index.node_home[slot.0 as usize]
    }

    /// The home key of vCluster `name` (0 if there is none by that name).
    pub fn home_key(&self, name: &str) -> u32 {
        self.index.home_key.get(name).copied().unwrap_or(0)
    }

    /// The vCluster whose home key is `key`.
    pub fn home_name(&self, key: u32) -> Option<&str> {
        key.checked_sub(1).and_then(|i| self.index.home_names.get(i as usize)).map(String::as_str)
    }

    /// How many home keys there are (vClusters, plus 1 for key 0).
    pub fn home_keys(&self) -> u32 {
        self.index.home_names.len() as u32 + 1
    }

    /// The vCluster `a`'s task would borrow `slot` from: the node's home
    /// when that is another vCluster than `a`'s.
    pub fn borrowed_from(&self, slot: NodeSlot, a: &Allocation) -> Option<&str> {
        self.lender(slot, &a.spec.vcluster).and_then(|home| self.home_name(home))
    }

    /// The home key of `slot`'s vCluster when a task of vCluster `vc` there
    /// runs on borrowed capacity (the node is another vCluster's home).
    fn lender(&self, slot: NodeSlot, vc: &str) -> Option<u32> {
        let home = self.node_home(slot);
        (home != 0 && home != self.home_key(vc)).then_some(home)
    }

    /// The other vClusters' allocations holding capacity on the home nodes
    /// of home key `key`, with how many tasks each.
    pub fn lent(&self, key: u32) -> Option<&BTreeMap<AllocId, u32>> {
        self.index.lent.get(&key)
    }

    /// Home keys that have lent capacity out right now.
    pub fn lenders(&self) -> impl Iterator<Item = u32> + '_ {
        self.index.lent.keys().copied()
    }

    /// How many gangs of the vCluster with home key `key` are queued (not
    /// counting ones holding nodes for a preemption).
    pub fn queued_in(&self, key: u32) -> u32 {
        self.index.vc_queued.get(&key).copied().unwrap_or(0)
    }

    /// Whether a ready node may be lent to another vCluster now: it has a
    /// home vCluster, that vCluster has no gang waiting in the queue, and
    /// none of its own tasks hold capacity there.
    pub fn lendable(&self, slot: NodeSlot) -> bool {
        let home = self.node_home(slot);
        home != 0
            && self.queued_in(home) == 0
            && self
                .holders(slot)
                .iter()
                .all(|h| self.allocs.get(&h.alloc).is_some_and(|a| self.home_key(&a.spec.vcluster) != home))
    }

    /// Most GPUs vCluster `name` may hold on borrowed nodes: its borrow
    /// limit (percent) of its live demand, the GPUs of its queued, reserved
    /// and running gangs. `None` when it may not borrow at all.
    pub fn borrow_limit_gpus(&self, name: &str) -> Option<u64> {
        self.borrow_limit_after(name, 0)
    }

    /// [`State::borrow_limit_gpus`] once `gone` GPUs of its demand have left
    /// (an admission pass's rollbacks that fail their gangs).
    fn borrow_limit_after(&self, name: &str, gone: u64) -> Option<u64> {
        // The built-in default, never changed, does not borrow.
        let pct = u64::from(self.vclusters.get(name)?.spec.borrow_limit_pct);
        if pct == 0 {
            return None;
        }
        let demand = self.index.vc_live.get(name).map_or(0, |d| d.gpus).saturating_sub(gone);
        Some(demand * pct / 100)
    }

    /// Why gang `a` may not be reserved on `slots` for borrowing reasons, or
    /// `None`: a task on another vCluster's home node is borrowed capacity;
    /// non-preemptible work never borrows (reclaiming would have to preempt
    /// it), a vCluster with a borrow limit of 0 never borrows, and what its
    /// gangs hold on borrowed nodes (`pending`: an admission pass's earlier
    /// reservations) stays within its limit. `demand_gone`: GPUs of the
    /// vCluster's demand that the same pass's rollbacks will fail (the
    /// limit is taken as it will be when this reservation applies).
    pub fn borrow_excess(&self, a: &Allocation, slots: &[NodeSlot], pending: u64, demand_gone: u64) -> Option<String> {
        let borrowed = slots.iter().filter(|&&s| self.borrowed_from(s, a).is_some()).count() as u64;
        if borrowed == 0 {
            return None;
        }
        let name = &a.spec.vcluster;
        if let Some(why) = a.spec.never_preempted() {
            return Some(format!("it is never preempted ({why}), so it never runs on borrowed nodes"));
        }
        let Some(limit) = self.borrow_limit_after(name, demand_gone) else {
            return Some(format!("vCluster {name} does not borrow (its borrow limit is 0 %)"));
        };
        let held = self.index.vc_load.get(name).map_or(0, |l| l.borrowed_gpus) + pending;
        let need = borrowed * u64::from(a.spec.resources.gpus);
        if held + need > limit {
            return Some(format!(
                "vCluster {name}'s borrow limit: {held} borrowed GPUs + {need} > {limit} ({}% of its demand)",
                self.vclusters.get(name).map_or(0, |v| v.spec.borrow_limit_pct)
            ));
        }
        None
    }

    /// Queued allocations in submit order.
    pub fn queue_fifo(&self) -> impl Iterator<Item = AllocId> + '_ {
        self.index.queue_fifo.iter().copied()
    }

    /// Allocations holding an unclaimed reservation.
    pub fn reserved_allocs(&self) -> impl Iterator<Item = AllocId> + '_ {
        self.index.reserved.iter().copied()
    }

    /// Whether `id` has a teardown in progress.
    pub fn is_tearing_down(&self, id: AllocId) -> bool {
        self.index.tearing_down.contains(&id)
    }

    /// Allocations with a teardown in progress.
    pub fn tearing_down(&self) -> impl Iterator<Item = AllocId> + '_ {
        self.index.tearing_down.iter().copied()
    }

    /// The tasks reserved on, running on or being preempted on a node.
    pub fn tasks_on_node(&self, slot: NodeSlot) -> impl Iterator<Item = (AllocId, TaskIndex)> + '_ {
        self.index.tasks_by_node.get(&slot).into_iter().flatten().copied()
    }

    /// Ready nodes not held for a preemptor, ordered by (home key, free
    /// GPUs, slot).
    pub fn free_gpu_index(&self) -> &BTreeSet<(u32, u32, NodeSlot)> {
        &self.index.free_gpus
    }

    /// Queued allocations of class ≥ 1 not waiting on held nodes, highest
    /// class first, then in admission order: who may preempt, in turn.
    pub fn preemptor_queue(&self) -> impl Iterator<Item = &(Reverse<u8>, QueueKey)> + '_ {
        self.index.preemptors.iter()
    }

    /// The tasks holding capacity on a node (reserved, running or
    /// preempting), with their class and usage, in allocation order.
    pub fn holders(&self, slot: NodeSlot) -> &[Holder] {
        self.index.holders.get(slot.0 as usize).map_or(&[], Vec::as_slice)
    }

    /// The nodes in one lifecycle status, in slot order.
    pub fn nodes_in(&self, status: NodeStatus) -> impl Iterator<Item = NodeSlot> + '_ {
        self.index.by_status.get(&status).into_iter().flatten().copied()
    }

    /// How many nodes are in one lifecycle status.
    pub fn node_count(&self, status: NodeStatus) -> usize {
        self.index.by_status.get(&status).map_or(0, BTreeSet::len)
    }

    /// The preemptor a node is held for, if any.
    pub fn held_for(&self, slot: NodeSlot) -> Option<AllocId> {
        self.index.held.get(&slot).copied()
    }

    /// Nodes held for preemptors, with the preemptor.
    pub fn held_nodes(&self) -> impl Iterator<Item = (NodeSlot, AllocId)> + '_ {
        self.index.held.iter().map(|(&s, &a)| (s, a))
    }

    // ----- the entry point -----------------------------------------------

    /// The nodes whose agents may have something new to hear (a task placed,
    /// started, stopping or gone; a status or drain change) since the last
    /// call, in slot order; clears the set. The agent hub wakes only those
    /// nodes' streams after an entry applies.
    pub fn take_touched_nodes(&mut self) -> BTreeSet<NodeSlot> {
        std::mem::take(&mut self.touched.0)
    }

    /// Applies one command. Never panics on bad input: a command that does not
    /// fit the state is rejected and changes nothing (the clock excepted).
    pub fn apply(&mut self, cmd: &Command, ctx: &ApplyCtx) -> Outcome {
        self.now_ms = self.now_ms.max(ctx.time_ms);
        let result = match cmd {
            Command::RegisterNode { node, resources, labels } => self.register_node(node, resources, labels),
            Command::Submit { spec } => self.submit(spec),
            Command::ReserveGang { alloc, epoch, nodes } => self.reserve_gang(*alloc, *epoch, nodes),
            Command::RollbackGang { alloc, epoch } => self.rollback_gang(*alloc, *epoch),
            Command::StartTask { alloc, task, node, epoch } => self.start_task(*alloc, *task, node, *epoch),
            Command::FinishTask { alloc, task, node, epoch } => self.finish_task(*alloc, *task, node, *epoch),
            Command::FailTask { alloc, task, node, epoch, exit_code } => {
                self.fail_task(*alloc, *task, node, *epoch, *exit_code)
            }
            Command::CancelAllocation { alloc } => self.cancel(*alloc),
            Command::TaskPreempted { alloc, task, node, epoch, checkpoint_failed } => {
                self.task_preempted(*alloc, *task, node, *epoch, *checkpoint_failed)
            }
            Command::SaveCheckpoint { alloc, task, node, epoch, data } => {
                self.save_checkpoint(*alloc, *task, node, *epoch, data)
            }
            Command::FailTaskToStart { alloc, task, node, epoch, reason } => {
                self.fail_task_to_start(*alloc, *task, node, *epoch, reason)
            }
            Command::SaveExitCheckpoint { alloc, task, node, epoch, data } => {
                self.save_exit_checkpoint(*alloc, *task, node, *epoch, data)
            }
            Command::DropCheckpoint { alloc, task, node, epoch, reason } => {
                self.drop_checkpoint(*alloc, *task, node, *epoch, reason)
            }
            Command::ForceDrain { alloc, epoch } => self.force_drain(*alloc, *epoch),
            Command::Preempt { alloc, victims, nodes, hold_ms } => {
                self.preempt(*alloc, victims, nodes, *hold_ms, false)
            }
            Command::Reclaim { alloc, victims, nodes, hold_ms } => self.preempt(*alloc, victims, nodes, *hold_ms, true),
            Command::ExpireNomination { alloc } => self.expire_nomination(*alloc),
            Command::TripWatchdog { alloc, task, node, epoch, kind } => {
                self.trip_watchdog(*alloc, *task, node, *epoch, *kind)
            }
            Command::MarkNodeLost { node } => self.mark_node_lost(node),
            Command::NodeReady { node } => self.node_ready(node),
            Command::DrainNode { node, timeout_ms, reason, by } => self.drain_node(node, *timeout_ms, reason, by),
            Command::CancelDrain { node, by } => self.cancel_drain(node, by),
            Command::ExpireDrain { node } => self.expire_drain(node),
            Command::StopNode { node, reason, by } => self.stop_node(node, reason, by),
            Command::RestartNode { node, by } => self.restart_node(node, by),
            Command::TerminateNode { node, by } => self.terminate_node(node, by),
            Command::CreateToken { id, name, role, sha256, expires_ms, by } => {
                self.create_token(id, name, *role, *sha256, *expires_ms, by)
            }
            Command::RevokeToken { id, by } => self.revoke_token(id, by),
            Command::CreateVCluster { name, spec, by } => self.put_vcluster(name, spec, by, true),
            Command::UpdateVCluster { name, spec, by } => self.put_vcluster(name, spec, by, false),
        };
        match result {
            Ok(mut events) => {
                events.extend(self.stop_emptied_nodes());
                self.record_history(&events);
                Outcome::Accepted(events)
            }
            Err(rejection) => Outcome::Rejected(rejection),
        }
    }

    /// Appends each event to its allocation's or node's history (a
    /// duplicate submit changed nothing and is not recorded).
    fn record_history(&mut self, events: &[Event]) {
        for e in events {
            if matches!(e, Event::Submitted { duplicate: true, .. }) {
                continue;
            }
            if let Some(a) = e.alloc().and_then(|id| self.allocs.get_mut(&id)) {
                self.touched.0.extend(a.tasks.iter().filter_map(|t| t.node));
                a.revision += 1;
                a.history.push_back(AllocEvent { revision: a.revision, time_ms: self.now_ms, event: e.clone() });
                if a.history.len() > HISTORY_LIMIT {
                    a.history.pop_front();
                }
            }
            if let Some(slot) = e.node().and_then(|id| self.index.node_by_id.get(id).copied()) {
                self.touched.0.insert(slot);
                let n = &mut self.nodes[slot.0 as usize];
                n.revision += 1;
                n.history.push_back(AllocEvent { revision: n.revision, time_ms: self.now_ms, event: e.clone() });
                if n.history.len() > NODE_HISTORY_LIMIT {
                    n.history.pop_front();
                }
            }
        }
    }

    // ----- handlers --------------------------------------------------------

    /// A new node joins as pending (its agent proposes `NodeReady` once it
    /// has reconciled). A known node's resources and labels are updated; a
    /// lost one is ready again; every other status is kept (a draining or
    /// stopped node whose agent restarts stays out of service), and a
    /// terminated one is refused.
    fn register_node(&mut self, id: &NodeId, resources: &Resources, labels: &BTreeMap<String, String>) -> Applied {
        validate_node(id, resources, labels, &self.limits)?;
        if let Some(slot) = self.node_slot(id) {
            let node = self.node(slot);
            if node.status == NodeStatus::Terminated {
                return Err(Rejection::NodeTerminated(id.clone()));
            }
            if !Usage::of(resources).covers(&node.used) {
                return Err(Rejection::ShrinkBelowUsage(id.clone()));
            }
            let was_lost = node.status == NodeStatus::Lost;
            self.unindex_node(slot);
            let node = &mut self.nodes[slot.0 as usize];
            node.resources = *resources;
            node.labels = labels.clone();
            self.index_node(slot);
            if self.homes_of(std::iter::once(self.node(slot))) != [self.node_home(slot)] {
                // Its home changed: which tasks are borrowed changes too.
                self.rebuild_indexes();
            }
            if was_lost {
                self.set_node_status(slot, NodeStatus::Ready);
            }
            return Ok(vec![Event::NodeRegistered { node: id.clone(), updated: true }]);
        }
        let slot = NodeSlot(u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes"));
        self.nodes.push(Node {
            id: id.clone(),
            slot,
            resources: *resources,
            labels: labels.clone(),
            status: NodeStatus::Pending,
            status_since_ms: self.now_ms,
            drain: None,
            used: Usage::default(),
            registered_at_ms: self.now_ms,
            revision: 0,
            history: VecDeque::new(),
        });
        self.index.node_by_id.insert(id.clone(), slot);
        self.index.holders.push(Vec::new());
        let home = self.homes_of(std::iter::once(self.node(slot)));
        self.index.node_home.extend(home);
        self.index.by_status.entry(NodeStatus::Pending).or_default().insert(slot);
        Ok(vec![Event::NodeRegistered { node: id.clone(), updated: false }])
    }

    // ----- node lifecycle (docs/nodes.md) ------------------------------------

    /// The slot of node `id`, if its status is one of `allowed` for `action`.
    fn node_for(&self, id: &NodeId, action: &str, allowed: &[NodeStatus]) -> Result<NodeSlot, Rejection> {
        let slot = self.node_slot(id).ok_or_else(|| Rejection::UnknownNode(id.clone()))?;
        let from = self.node(slot).status;
        if !allowed.contains(&from) {
            return Err(Rejection::IllegalNodeTransition {
                node: id.clone(),
                from,
                action: action.to_string(),
                allowed: allowed.to_vec(),
            });
        }
        Ok(slot)
    }

    /// Moves a node to `status`, keeping every index in step.
    fn set_node_status(&mut self, slot: NodeSlot, status: NodeStatus) {
        self.touched.0.insert(slot);
        let old = self.node(slot).status;
        self.unindex_node(slot);
        if let Some(set) = self.index.by_status.get_mut(&old) {
            set.remove(&slot);
            if set.is_empty() {
                self.index.by_status.remove(&old);
            }
        }
        let now = self.now_ms;
        let node = &mut self.nodes[slot.0 as usize];
        node.status = status;
        node.status_since_ms = now;
        if !matches!(status, NodeStatus::Draining | NodeStatus::Stopping) {
            node.drain = None;
        }
        self.index.by_status.entry(status).or_default().insert(slot);
        self.index_node(slot);
    }

    /// Lets go of a preemptor's hold on `slot`, if there is one: a node
    /// leaving service cannot take the preemptor (it queues again; its
    /// victims still stop).
    fn release_hold(&mut self, slot: NodeSlot, why: &str) -> Vec<Event> {
        let Some(holder) = self.held_for(slot) else { return Vec::new() };
        self.drop_nomination(holder);
        vec![Event::NominationDropped { alloc: holder, reason: format!("held node {} {why}", self.node(slot).id) }]
    }

    fn node_ready(&mut self, id: &NodeId) -> Applied {
        let slot = self.node_for(id, "become ready", &[NodeStatus::Pending])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::NodeReady { node: id.clone() }])
    }

    /// The seed's `start_draining`: only a ready node drains (the seed's 409
    /// otherwise). Its holds are let go; an empty node stops at once.
    fn drain_node(&mut self, id: &NodeId, timeout_ms: u64, reason: &str, by: &str) -> Applied {
        validate_node_request(by, reason, Some(timeout_ms), &self.limits)?;
        let slot = self.node_for(id, "drain", &[NodeStatus::Ready])?;
        let now = self.now_ms;
        let deadline_ms = now.saturating_add(timeout_ms);
        let mut events = self.release_hold(slot, "is draining");
        self.set_node_status(slot, NodeStatus::Draining);
        self.nodes[slot.0 as usize].drain =
            Some(Drain { started_at_ms: now, deadline_ms, reason: reason.to_string(), by: by.to_string() });
        let tasks = self.tasks_on_node(slot).count() as u32;
        if tasks == 0 {
            self.index.emptied.push(slot);
        }
        events.insert(
            0,
            Event::DrainStarted {
                node: id.clone(),
                by: by.to_string(),
                reason: reason.to_string(),
                deadline_ms,
                tasks,
            },
        );
        Ok(events)
    }

    fn cancel_drain(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "cancel a drain", &[NodeStatus::Draining])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::DrainCancelled { node: id.clone(), by: by.to_string() }])
    }

    /// The seed's drain timeout: the node is stopping, and every gang on it
    /// is preempted the proper way (a teardown that asks for a checkpoint,
    /// or SIGTERM where the gang cannot checkpoint; its tasks elsewhere go
    /// too, since a gang runs whole) to resume elsewhere, uncharged. A gang
    /// with only unclaimed reservations here is simply requeued. The node
    /// stops when its last task has left.
    fn expire_drain(&mut self, id: &NodeId) -> Applied {
        let slot = self.node_for(id, "time out a drain", &[NodeStatus::Draining])?;
        let deadline_ms = self.node(slot).drain.as_ref().expect("a draining node has a drain").deadline_ms;
        if self.now_ms < deadline_ms {
            return Err(Rejection::DrainNotExpired { node: id.clone(), deadline_ms });
        }
        let mut allocs: Vec<AllocId> = self.tasks_on_node(slot).map(|(a, _)| a).collect();
        allocs.dedup();
        self.set_node_status(slot, NodeStatus::Stopping);
        let mut events = vec![Event::DrainTimedOut { node: id.clone(), allocs: allocs.clone() }];
        for alloc in allocs {
            let a = &self.allocs[&alloc];
            if a.teardown.is_some() {
                continue; // already stopping; its tasks here leave when they ack
            }
            if a.has_running() {
                events.push(self.begin_teardown(alloc, TeardownCause::NodeDrain));
            } else {
                self.release_reserved(alloc);
                events.extend(self.settle(alloc));
            }
        }
        if self.tasks_on_node(slot).next().is_none() {
            self.index.emptied.push(slot);
        }
        Ok(events)
    }

    /// The seed's direct transition to stopped, for a node holding nothing.
    fn stop_node(&mut self, id: &NodeId, reason: &str, by: &str) -> Applied {
        validate_node_request(by, reason, None, &self.limits)?;
        let allowed = [NodeStatus::Ready, NodeStatus::Draining, NodeStatus::Stopping, NodeStatus::Lost];
        let slot = self.node_for(id, "stop", &allowed)?;
        let tasks = self.tasks_on_node(slot).count() as u32;
        if tasks > 0 {
            return Err(Rejection::NodeBusy { node: id.clone(), tasks });
        }
        let now = self.now_ms;
        let drain_ms = self.node(slot).drain.as_ref().map(|d| now.saturating_sub(d.started_at_ms));
        let mut events = self.release_hold(slot, "was stopped");
        self.set_node_status(slot, NodeStatus::Stopped);
        let reason = if reason.is_empty() { "stopped by an operator".to_string() } else { reason.to_string() };
        events.insert(0, Event::NodeStopped { node: id.clone(), by: Some(by.to_string()), reason, drain_ms });
        Ok(events)
    }

    fn restart_node(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "restart", &[NodeStatus::Stopped])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::NodeRestarted { node: id.clone(), by: by.to_string() }])
    }

    // ----- bearer tokens ---------------------------------------------------

    /// A token by id.
    pub fn token(&self, id: &str) -> Option<&Token> {
        self.tokens.get(id)
    }

    /// Every token, by id.
    pub fn tokens(&self) -> impl Iterator<Item = &Token> {
        self.tokens.values()
    }

    fn create_token(
        &mut self,
        id: &str,
        name: &str,
        role: TokenRole,
        sha256: [u8; 32],
        expires_ms: u64,
        by: &str,
    ) -> Applied {
        let bad = |field: &str, reason: &str| Rejection::InvalidToken { field: field.into(), reason: reason.into() };
        let word = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return Err(bad("id", "must be 1-32 characters of a-z 0-9"));
        }
        if name.is_empty() || name.len() > 128 || !word(name) {
            return Err(bad("name", "must be 1-128 characters of A-Z a-z 0-9 . _ -"));
        }
        if expires_ms <= self.now_ms {
            return Err(bad("ttl", "the token would expire before it is created"));
        }
        validate_node_request(by, "", None, &self.limits)?;
        if self.tokens.contains_key(id) {
            return Err(Rejection::TokenExists(id.to_string()));
        }
        let token = Token {
            id: id.to_string(),
            name: name.to_string(),
            role,
            sha256,
            created_ms: self.now_ms,
            expires_ms,
            created_by: by.to_string(),
            revoked: None,
        };
        self.tokens.insert(id.to_string(), token);
        Ok(vec![Event::TokenCreated { id: id.to_string(), name: name.to_string(), role, by: by.to_string() }])
    }

    fn check_revoke(&self, id: &str, by: &str) -> Result<(), Rejection> {
        validate_node_request(by, "", None, &self.limits)?;
        let token = self.tokens.get(id).ok_or_else(|| Rejection::UnknownToken(id.to_string()))?;
        if token.revoked.is_some() {
            return Err(Rejection::TokenRevoked(id.to_string()));
        }
        Ok(())
    }

    fn revoke_token(&mut self, id: &str, by: &str) -> Applied {
        self.check_revoke(id, by)?;
        let now = self.now_ms;
        let token = self.tokens.get_mut(id).expect("checked");
        token.revoked = Some((now, by.to_string()));
        Ok(vec![Event::TokenRevoked { id: id.to_string(), by: by.to_string() }])
    }

    // ----- vClusters --------------------------------------------------------

    /// A vCluster by name (the built-in `default` even if never changed).
    pub fn vcluster(&self, name: &str) -> Option<VCluster> {
        match self.vclusters.get(name) {
            Some(v) => Some(v.clone()),
            None => (name == DEFAULT_VCLUSTER).then(VCluster::builtin_default),
        }
    }

    /// Every vCluster by name, the built-in `default` included.
    pub fn vclusters(&self) -> Vec<VCluster> {
        let mut all: Vec<VCluster> = self.vclusters.values().cloned().collect();
        if !self.vclusters.contains_key(DEFAULT_VCLUSTER) {
            all.push(VCluster::builtin_default());
            all.sort_by(|a, b| a.name.cmp(&b.name));
        }
        all
    }

    /// The nodes a vCluster's home selector picks, in slot order.
    pub fn home_nodes(&self, v: &VCluster) -> Vec<NodeSlot> {
        self.nodes.iter().filter(|n| v.spec.home.matches(n)).map(|n| n.slot).collect()
    }

    /// The revision a create (`create`) or update of vCluster `name` would
    /// get, or why it is refused.
    fn check_put_vcluster(&self, name: &str, spec: &VClusterSpec, by: &str, create: bool) -> Result<u64, Rejection> {
        crate::sm::vcluster::validate_name(name)?;
        crate::sm::vcluster::validate_spec(spec)?;
        validate_node_request(by, "", None, &self.limits)?;
        match (create, self.vcluster(name)) {
            (true, Some(_)) => Err(Rejection::VClusterExists(name.to_string())),
            (false, None) => Err(Rejection::UnknownVCluster(name.to_string())),
            (true, None) => Ok(1),
            (false, Some(v)) => Ok(v.revision + 1),
        }
    }

    fn put_vcluster(&mut self, name: &str, spec: &VClusterSpec, by: &str, create: bool) -> Applied {
        let revision = self.check_put_vcluster(name, spec, by, create)?;
        let created_ms = self.vclusters.get(name).map_or(self.now_ms, |v| v.created_ms);
        let v = VCluster {
            name: name.to_string(),
            spec: spec.clone(),
            created_ms,
            updated_ms: self.now_ms,
            updated_by: by.to_string(),
            revision,
        };
        self.vclusters.insert(name.to_string(), v);
        // Home keys and nodes may have moved: which tasks are borrowed too.
        self.rebuild_indexes();
        Ok(vec![if create {
            Event::VClusterCreated { name: name.to_string(), by: by.to_string() }
        } else {
            Event::VClusterUpdated { name: name.to_string(), revision, by: by.to_string() }
        }])
    }

    fn terminate_node(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "terminate", &[NodeStatus::Stopped])?;
        self.set_node_status(slot, NodeStatus::Terminated);
        Ok(vec![Event::NodeTerminated { node: id.clone(), by: by.to_string() }])
    }

    /// Draining or stopping nodes whose last task left during this command
    /// stop now (the seed's `check_drain_completion`): draining → stopping
    /// → stopped, or stopping → stopped after a timed-out drain.
    fn stop_emptied_nodes(&mut self) -> Vec<Event> {
        let mut slots = std::mem::take(&mut self.index.emptied);
        slots.sort_unstable();
        slots.dedup();
        let now = self.now_ms;
        let mut events = Vec::new();
        for slot in slots {
            let node = self.node(slot);
            let status = node.status;
            if !matches!(status, NodeStatus::Draining | NodeStatus::Stopping)
                || self.tasks_on_node(slot).next().is_some()
            {
                continue;
            }
            let id = node.id.clone();
            let drain_ms = now.saturating_sub(node.drain.as_ref().expect("a draining node has a drain").started_at_ms);
            let reason = if status == NodeStatus::Draining {
                events.push(Event::DrainCompleted { node: id.clone(), drain_ms });
                self.set_node_status(slot, NodeStatus::Stopping);
                "drain completed: no work left".to_string()
            } else {
                "drain deadline passed: its remaining work was moved".to_string()
            };
            self.set_node_status(slot, NodeStatus::Stopped);
            events.push(Event::NodeStopped { node: id, by: None, reason, drain_ms: Some(drain_ms) });
        }
        events
    }

    /// What an earlier submit with the same owner and idempotency key made
    /// of this spec: the allocation when the spec is the same (a retry),
    /// `IdempotencyConflict` when it differs, `None` when the key is new (or
    /// absent). Keys are scoped by owner.
    pub fn submitted_before(&self, spec: &AllocSpec) -> Option<Result<AllocId, Rejection>> {
        let key = spec.idempotency_key.as_ref()?;
        let &existing = self.idempotency.get(&(spec.owner.clone(), key.clone()))?;
        Some(if self.allocs[&existing].spec == *spec {
            Ok(existing)
        } else {
            Err(Rejection::IdempotencyConflict { key: key.clone(), alloc: existing })
        })
    }

    fn submit(&mut self, spec: &AllocSpec) -> Applied {
        validate_spec(spec, &self.limits)?;
        if let Some(earlier) = self.submitted_before(spec) {
            return earlier.map(|alloc| vec![Event::Submitted { alloc, duplicate: true }]);
        }
        // Every allocation belongs to a vCluster that exists (`default`
        // always does).
        if self.vcluster(&spec.vcluster).is_none() {
            return Err(Rejection::UnknownVCluster(spec.vcluster.clone()));
        }
        if let Some(reason) = self.submit_quota_excess(spec) {
            return Err(Rejection::OverQuota { vcluster: spec.vcluster.clone(), reason });
        }
        let id = self.next_alloc_id;
        self.next_alloc_id += 1;
        let tasks = (0..spec.gang_size)
            .map(|index| Task {
                index,
                status: TaskStatus::Blocked,
                node: None,
                attempts: 0,
                runs: 0,
                reservation_epoch: 0,
                reserved_at_ms: None,
                started_at_ms: None,
                finished_at_ms: None,
                exit_code: None,
                run_nodes: Vec::new(),
                preemption_epoch: 0,
                checkpoint: None,
                watchdog_trips: 0,
                last_watchdog: None,
                drain_retries: 0,
            })
            .collect();
        self.allocs.insert(
            id,
            Allocation {
                id,
                spec: spec.clone(),
                submit_time_ms: self.now_ms,
                queued_since_ms: self.now_ms,
                status: AllocStatus::Queued,
                reservation_epoch: 0,
                first_reserved_at_ms: None,
                revision: 0,
                history: VecDeque::new(),
                finished_at_ms: None,
                tasks,
                preemption_epoch: 0,
                teardown: None,
                preempted_count: 0,
                suspended: false,
                nomination: None,
                retry_first: false,
                avoid_nodes: Vec::new(),
            },
        );
        if let Some(key) = &spec.idempotency_key {
            self.idempotency.insert((spec.owner.clone(), key.clone()), id);
        }
        self.reindex_alloc(id);
        Ok(vec![Event::Submitted { alloc: id, duplicate: false }])
    }

    fn reserve_gang(&mut self, id: AllocId, epoch: u64, nodes: &[NodeId]) -> Applied {
        let a = self.live_alloc(id)?;
        if !a.is_queued() {
            return Err(Rejection::NotQueued { alloc: id, status: a.status });
        }
        if a.nomination.is_some() {
            return Err(Rejection::AlreadyNominated { alloc: id });
        }
        if epoch != a.reservation_epoch + 1 {
            return Err(Rejection::StaleReservationEpoch { alloc: id, expected: a.reservation_epoch + 1, got: epoch });
        }
        let slots = self.check_nodes(a, nodes, &BTreeMap::new())?;
        if let Some(reason) = self.quota_excess(a, &slots, None, &[]) {
            return Err(Rejection::QuotaExceeded { alloc: id, reason });
        }
        if let Some(reason) = self.borrow_excess(a, &slots, 0, 0) {
            return Err(Rejection::BorrowRefused { alloc: id, reason });
        }
        Ok(vec![self.place_gang(id, &slots)])
    }

    /// Checks a placement of gang `a`, task `i` on `nodes[i]`: one node per
    /// task, each known, distinct, ready, held for nobody, and with room for
    /// a task once `freed` (capacity about to be released there) is counted.
    fn check_nodes(
        &self,
        a: &Allocation,
        nodes: &[NodeId],
        freed: &BTreeMap<NodeSlot, Usage>,
    ) -> Result<Vec<NodeSlot>, Rejection> {
        if nodes.len() != a.spec.gang_size as usize {
            return Err(Rejection::WrongNodeCount {
                alloc: a.id,
                expected: a.spec.gang_size,
                got: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            });
        }
        let mut slots = Vec::with_capacity(nodes.len());
        let mut seen = BTreeSet::new();
        for (task, node_id) in nodes.iter().enumerate() {
            let slot = self.node_slot(node_id).ok_or_else(|| Rejection::UnknownNode(node_id.clone()))?;
            if !seen.insert(slot) {
                return Err(Rejection::NodeRepeated(node_id.clone()));
            }
            let node = self.node(slot);
            if node.status != NodeStatus::Ready {
                return Err(Rejection::NodeNotReady(node_id.clone()));
            }
            if let Some(holder) = self.held_for(slot) {
                return Err(Rejection::NodeHeld { node: node_id.clone(), holder });
            }
            let free = node.free().plus(&freed.get(&slot).copied().unwrap_or_default());
            if !fits(&a.spec.resources, &node.resources, &free) {
                return Err(Rejection::InsufficientCapacity {
                    node: node_id.clone(),
                    alloc: a.id,
                    task: task as TaskIndex,
                });
            }
            slots.push(slot);
        }
        Ok(slots)
    }

    /// Whether `a` is a service running on a node of its own vCluster (the
    /// seed: services are preempted only on borrowed nodes).
    pub fn service_at_home(&self, a: &Allocation) -> bool {
        let own = self.home_key(&a.spec.vcluster);
        a.spec.vcluster_type == VClusterType::Service
            && a.tasks.iter().any(|t| t.node.is_some_and(|s| self.node_home(s) == own))
    }

    /// The home key each of `nodes` gets (home keys already assigned): the
    /// first vCluster (by name) that lists it explicitly, else the first
    /// whose home labels it carries, else 0.
    fn homes_of<'n>(&self, nodes: impl Iterator<Item = &'n Node>) -> Vec<u32> {
        let builtin = HomeNodes::default_for(DEFAULT_VCLUSTER);
        let selectors: Vec<(u32, &HomeNodes)> = (1..self.home_keys())
            .map(|k| {
                let name = self.home_name(k).expect("every key names a vCluster");
                (k, self.vclusters.get(name).map_or(&builtin, |v| &v.spec.home))
            })
            .collect();
        // Explicit lists, the first name winning (later ones inserted first).
        let mut listed: BTreeMap<&NodeId, u32> = BTreeMap::new();
        for &(k, home) in selectors.iter().rev() {
            if let HomeNodes::Nodes(ids) = home {
                listed.extend(ids.iter().map(|id| (id, k)));
            }
        }
        nodes
            .map(|node| {
                listed.get(&node.id).copied().unwrap_or_else(|| {
                    let labelled = |(_, h): &&(u32, &HomeNodes)| matches!(h, HomeNodes::Labels(_)) && h.matches(node);
                    selectors.iter().find(labelled).map_or(0, |&(k, _)| k)
                })
            })
            .collect()
    }

    /// Reserves a queued gang (already checked) on `slots`, task `i` on
    /// `slots[i]`, under the next reservation epoch.
    fn place_gang(&mut self, id: AllocId, slots: &[NodeSlot]) -> Event {
        let now = self.now_ms;
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        for (task, &slot) in slots.iter().enumerate() {
            self.occupy(slot, &usage, (id, task as TaskIndex));
        }
        let nodes = slots.iter().map(|&s| self.node(s).id.clone()).collect();
        let a = self.allocs.get_mut(&id).expect("checked above");
        a.reservation_epoch += 1;
        let epoch = a.reservation_epoch;
        a.first_reserved_at_ms.get_or_insert(now);
        a.suspended = false;
        for (task, slot) in a.tasks.iter_mut().zip(slots) {
            task.status = TaskStatus::Reserved;
            task.node = Some(*slot);
            task.reservation_epoch = epoch;
            task.reserved_at_ms = Some(now);
            task.started_at_ms = None;
            task.drain_retries = 0;
        }
        self.refresh(id);
        // Out of the queue now (its key was removed with the flag as it was).
        let a = self.allocs.get_mut(&id).expect("checked above");
        a.retry_first = false;
        a.avoid_nodes.clear();
        Event::GangReserved { alloc: id, epoch, nodes }
    }

    /// Returns an unclaimed reservation to the queue. When some tasks of the
    /// gang already run, rolling the rest back alone would leave them waiting
    /// for peers that never come (the gang-scheduling seed's stuck state):
    /// the first unclaimed task triggers a teardown instead (uncharged: it
    /// never started), and the gang avoids its node next time.
    fn rollback_gang(&mut self, id: AllocId, epoch: u64) -> Applied {
        let a = self.live_alloc(id)?;
        if epoch != a.reservation_epoch {
            return Err(Rejection::StaleReservationEpoch { alloc: id, expected: a.reservation_epoch, got: epoch });
        }
        let Some(first) = a.tasks.iter().find(|t| t.status == TaskStatus::Reserved).map(|t| t.index) else {
            return Err(Rejection::NothingReserved { alloc: id });
        };
        let mut events = vec![Event::GangRolledBack { alloc: id, epoch }];
        if a.has_running() {
            events.extend(self.abandon_reserved(id, first, true));
        } else {
            self.release_reserved(id);
            events.extend(self.settle(id));
        }
        Ok(events)
    }

    /// An unclaimed task whose siblings run will never be claimed (its node
    /// died, or its reservation went stale): it returns to blocked uncharged
    /// (it never started: the seeds map an unclaimed reservation back to
    /// blocked), and triggers a teardown of the running siblings. A node that
    /// let a reservation go stale while it stays up is avoided by the gang's
    /// next placement, as after a watchdog trip.
    fn abandon_reserved(&mut self, id: AllocId, task: TaskIndex, avoid_node: bool) -> Vec<Event> {
        let t = &self.allocs[&id].tasks[task as usize];
        let slot = t.node.expect("a reserved task has a node");
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        self.release(slot, &usage, (id, task));
        let a = self.allocs.get_mut(&id).expect("checked");
        let t = &mut a.tasks[task as usize];
        t.status = TaskStatus::Blocked;
        t.node = None;
        t.reserved_at_ms = None;
        if avoid_node && let Err(at) = a.avoid_nodes.binary_search(&slot) {
            a.avoid_nodes.insert(at, slot);
        }
        let mut events = vec![Event::TaskFailed { alloc: id, task, exit_code: None, charged: false }];
        events.extend(self.start_teardown_or_settle(id, task));
        events
    }

    fn start_task(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64) -> Applied {
        self.check_report(id, task, node, epoch, &[TaskStatus::Reserved])?;
        let now = self.now_ms;
        let t = &mut self.allocs.get_mut(&id).expect("checked").tasks[task as usize];
        t.status = TaskStatus::Running;
        t.attempts += 1;
        t.runs += 1;
        t.run_nodes.extend(t.node);
        t.started_at_ms = Some(now);
        t.exit_code = None;
        let attempt = t.runs;
        let slot = t.node.expect("a reserved task has a node");
        self.restart_walltime(id, slot);
        self.refresh(id);
        Ok(vec![Event::TaskStarted { alloc: id, task, node: node.clone(), attempt }])
    }

    /// A task's process exited successfully. During a teardown (the process
    /// finished before the preempt reached it) the task is done all the
    /// same: finished work is never overwritten, and the gang will fail at
    /// completion because it cannot be restarted whole.
    fn finish_task(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64) -> Applied {
        let (slot, _) = self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        self.leave_node(id, task, slot, TaskStatus::Done, Some(0));
        let mut events = vec![Event::TaskFinished { alloc: id, task }];
        events.extend(self.settle(id));
        Ok(events)
    }

    /// A task's process failed. A running task triggers the seed's
    /// PreemptGang (or, with no sibling running, FailGang): it keeps its
    /// charged attempt and returns to blocked. A preempting task that fails
    /// on its way down has simply stopped: it is preempted (its attempt was
    /// refunded when the teardown started).
    fn fail_task(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        exit_code: Option<i32>,
    ) -> Applied {
        let (slot, status) =
            self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        if status == TaskStatus::Preempting {
            let mut events = vec![
                Event::TaskFailed { alloc: id, task, exit_code, charged: false },
                self.stopped(id, task, slot, exit_code, false, false),
            ];
            events.extend(self.settle(id));
            return Ok(events);
        }
        if let Some(events) = self.retry_on_draining_node(id, task, slot, exit_code) {
            return Ok(events);
        }
        Ok(self.fail_running(id, task, slot, exit_code))
    }

    /// The checkpoint an attempt was given could not be restored on its
    /// node: dropped, so no later attempt trips on it. The task runs on.
    fn drop_checkpoint(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64, reason: &str) -> Applied {
        check_agent_reason(reason)?;
        self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        self.allocs.get_mut(&id).expect("checked").tasks[task as usize].checkpoint = None;
        Ok(vec![Event::CheckpointDropped { alloc: id, task, node: node.clone(), reason: reason.to_string() }])
    }

    /// A claimed task that could not start: failed like any other failure
    /// (with no exit code), with the agent's reason in its events first.
    fn fail_task_to_start(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64, reason: &str) -> Applied {
        check_agent_reason(reason)?;
        let mut events = self.fail_task(id, task, node, epoch, None)?;
        events.insert(0, Event::TaskStartFailed { alloc: id, task, node: node.clone(), reason: reason.to_string() });
        Ok(events)
    }

    /// The seed's failure during drain: a single task that fails on its
    /// draining node (not yet stopping) is reserved there again, under a new
    /// reservation epoch, while it has retries left and has been retried
    /// there fewer than `drain_max_retries` times; its capacity never leaves
    /// the node. A gang task goes through teardown instead (its peers run
    /// elsewhere), and so does a task past either limit.
    fn retry_on_draining_node(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        exit_code: Option<i32>,
    ) -> Option<Vec<Event>> {
        let a = &self.allocs[&id];
        let t = &a.tasks[task as usize];
        if self.node(slot).status != NodeStatus::Draining
            || a.spec.gang_size != 1
            || t.attempts >= a.spec.max_retries
            || t.drain_retries >= self.limits.drain_max_retries
        {
            return None;
        }
        let now = self.now_ms;
        let node = self.node(slot).id.clone();
        let a = self.allocs.get_mut(&id).expect("checked");
        a.reservation_epoch += 1;
        let epoch = a.reservation_epoch;
        let t = &mut a.tasks[task as usize];
        t.status = TaskStatus::Reserved;
        t.reservation_epoch = epoch;
        t.reserved_at_ms = Some(now);
        t.started_at_ms = None;
        t.finished_at_ms = Some(now);
        t.exit_code = exit_code;
        t.drain_retries += 1;
        let retry = t.drain_retries;
        self.restart_walltime(id, slot);
        self.refresh(id);
        Some(vec![
            Event::TaskFailed { alloc: id, task, exit_code, charged: true },
            Event::RetriedOnDrainingNode { alloc: id, task, node, epoch, retry },
        ])
    }

    /// A watchdog stopped a running task: it leaves its node (the capacity
    /// is free in this same command), is refunded its attempt (a wedge is
    /// not a failure of the retry budget), counts a trip, and, like a
    /// failure, tears down its running siblings or settles the gang. The
    /// gang goes first in its class and avoids this node on its next
    /// placement; past the cap, `settle` fails it with the reason. A task
    /// already being preempted has simply stopped.
    fn trip_watchdog(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        kind: super::types::WatchdogKind,
    ) -> Applied {
        let (slot, status) =
            self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let cap = self.limits.watchdog_max_retries;
        if status == TaskStatus::Preempting {
            let mut events = vec![self.stopped(id, task, slot, None, false, false)];
            events.extend(self.settle(id));
            return Ok(events);
        }
        self.leave_node(id, task, slot, TaskStatus::Blocked, None);
        let a = self.allocs.get_mut(&id).expect("checked");
        let t = &mut a.tasks[task as usize];
        t.node = None;
        t.attempts = t.attempts.saturating_sub(1);
        t.watchdog_trips += 1;
        t.last_watchdog = Some(kind);
        let trips = t.watchdog_trips;
        a.retry_first = true;
        if let Err(at) = a.avoid_nodes.binary_search(&slot) {
            a.avoid_nodes.insert(at, slot);
        }
        let mut events =
            vec![Event::WatchdogTripped { alloc: id, task, node: node.clone(), kind, trips, retried: trips <= cap }];
        events.extend(self.start_teardown_or_settle(id, task));
        Ok(events)
    }

    /// Fails a running task (already checked): the body of `FailTask`, also
    /// used when its node is lost. The task keeps its claim-time attempt.
    fn fail_running(&mut self, id: AllocId, task: TaskIndex, slot: NodeSlot, exit_code: Option<i32>) -> Vec<Event> {
        self.leave_node(id, task, slot, TaskStatus::Blocked, exit_code);
        self.allocs.get_mut(&id).expect("checked").tasks[task as usize].node = None;
        let mut events = vec![Event::TaskFailed { alloc: id, task, exit_code, charged: true }];
        events.extend(self.start_teardown_or_settle(id, task));
        events
    }

    /// After `trigger` failed: if siblings still run, they are torn down
    /// together; otherwise unclaimed siblings are released and the gang
    /// settles (requeued, or failed).
    fn start_teardown_or_settle(&mut self, id: AllocId, trigger: TaskIndex) -> Vec<Event> {
        if self.allocs[&id].has_running() {
            return vec![self.begin_teardown(id, TeardownCause::TaskFailed { trigger })];
        }
        self.release_reserved(id);
        self.settle(id)
    }

    /// The seed's PreemptGang, in one command, for any cause (a failed
    /// task, a priority preemption's victim, a node drain's deadline):
    /// running tasks → preempting under a new shared preemption epoch, each
    /// refunded its claim-time attempt (a failed trigger is not: its count is
    /// the signal that ends a gang that keeps failing); unclaimed tasks →
    /// blocked; blocked, done and failed tasks untouched.
    fn begin_teardown(&mut self, id: AllocId, cause: TeardownCause) -> Event {
        let now = self.now_ms;
        let released = self.release_reserved(id);
        let a = self.allocs.get_mut(&id).expect("checked");
        a.preemption_epoch += 1;
        let epoch = a.preemption_epoch;
        a.teardown = Some(Teardown { epoch, cause, started_at_ms: now, failed_checkpoints: 0 });
        let mut preempting = Vec::new();
        for t in a.tasks.iter_mut().filter(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            // A task already stopping for an earlier round (a cancel during
            // a teardown) moves to this round's epoch; it was refunded then.
            if t.status == TaskStatus::Running {
                t.attempts = t.attempts.saturating_sub(1);
            }
            t.status = TaskStatus::Preempting;
            t.preemption_epoch = epoch;
            preempting.push((t.index, t.node.expect("a running task has a node")));
        }
        let preempting = preempting.into_iter().map(|(task, slot)| (task, self.node(slot).id.clone())).collect();
        self.refresh(id);
        Event::TeardownStarted { alloc: id, cause, epoch, preempting, released }
    }

    /// A preempting task's agent acknowledges that the process stopped. A
    /// preempted task that was asked to checkpoint and did not answer in
    /// time (`checkpoint_failed`) is charged an attempt, and its gang is
    /// requeued rather than suspended (the seed: "mark as failed, requeue if
    /// policy allows").
    fn task_preempted(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        checkpoint_failed: bool,
    ) -> Applied {
        let slot = self.check_preempting(id, task, node, epoch)?;
        let asked = self.allocs[&id].teardown.is_some_and(|td| td.asks_checkpoint());
        let mut events = vec![self.stopped(id, task, slot, None, false, checkpoint_failed && asked)];
        events.extend(self.settle(id));
        Ok(events)
    }

    /// A stopping (preempting) task's process is gone: it leaves its node as
    /// preempted under its teardown's epoch, charged an attempt when the
    /// checkpoint it owed never came. `forced`: the leader forced it at the
    /// deadline (or its node was lost) rather than its agent confirming.
    fn stopped(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        exit_code: Option<i32>,
        forced: bool,
        checkpoint_failed: bool,
    ) -> Event {
        let epoch = self.allocs[&id].tasks[task as usize].preemption_epoch;
        self.leave_node(id, task, slot, TaskStatus::Preempted, exit_code);
        if checkpoint_failed {
            self.charge_failed_checkpoint(id, task);
        }
        Event::TaskPreempted { alloc: id, task, epoch, forced, checkpoint_failed }
    }

    /// A preempted task that did not checkpoint in time: charged an attempt
    /// (it was refunded when the preemption started) and counted.
    fn charge_failed_checkpoint(&mut self, id: AllocId, task: TaskIndex) {
        let a = self.allocs.get_mut(&id).expect("checked");
        a.tasks[task as usize].attempts += 1;
        if let Some(td) = a.teardown.as_mut() {
            td.failed_checkpoints += 1;
        }
    }

    /// Checks a command the edge judges before proposing as apply would,
    /// changing nothing, so that what apply would refuse costs no log entry:
    /// an agent's checkpoint upload (`SaveCheckpoint`, `SaveExitCheckpoint`),
    /// `CancelAllocation`, `RevokeToken`, `CreateVCluster` and
    /// `UpdateVCluster`. Apply runs the same checks again (the state may
    /// move before the entry commits). Every other command passes.
    pub fn precheck(&self, cmd: &Command) -> Result<(), Rejection> {
        match cmd {
            Command::SaveCheckpoint { alloc, task, node, epoch, data } => {
                self.check_checkpoint(*alloc, *task, data)?;
                self.check_preempting(*alloc, *task, node, *epoch).map(drop)
            }
            Command::SaveExitCheckpoint { alloc, task, node, epoch, data } => {
                self.check_checkpoint(*alloc, *task, data)?;
                self.check_report(*alloc, *task, node, *epoch, &[TaskStatus::Running, TaskStatus::Preempting]).map(drop)
            }
            Command::CancelAllocation { alloc } => self.check_cancel(*alloc),
            Command::RevokeToken { id, by } => self.check_revoke(id, by),
            Command::CreateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, true).map(drop),
            Command::UpdateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, false).map(drop),
            _ => Ok(()),
        }
    }

    /// The checkpoint rules every upload meets: the allocation is live and
    /// checkpoints, and the data is within the cap.
    fn check_checkpoint(&self, id: AllocId, task: TaskIndex, data: &[u8]) -> Result<(), Rejection> {
        let a = self.live_alloc(id)?;
        if a.spec.checkpoint == CheckpointMode::None {
            return Err(Rejection::CheckpointDisabled { alloc: id });
        }
        if data.len() > self.limits.max_checkpoint_bytes {
            return Err(Rejection::CheckpointTooLarge {
                alloc: id,
                task,
                bytes: data.len() as u64,
                limit: self.limits.max_checkpoint_bytes as u64,
            });
        }
        Ok(())
    }

    /// Stores the checkpoint a task left when its process exited (replacing
    /// any older one), while the exit is not yet recorded: the task runs, or
    /// is stopping, on that node under reservation `epoch`.
    fn save_exit_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        data: &[u8],
    ) -> Applied {
        self.check_checkpoint(id, task, data)?;
        self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let now = self.now_ms;
        let t = &mut self.allocs.get_mut(&id).expect("checked").tasks[task as usize];
        let epoch = t.preemption_epoch;
        t.checkpoint = Some(Checkpoint { epoch, saved_at_ms: now, data: data.to_vec() });
        Ok(vec![Event::CheckpointSaved {
            alloc: id,
            task,
            epoch,
            bytes: data.len() as u64,
            after_ms: 0,
            preempted: false,
        }])
    }

    /// Stores a preempting task's checkpoint (replacing any older one).
    fn save_checkpoint(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64, data: &[u8]) -> Applied {
        self.check_checkpoint(id, task, data)?;
        self.check_preempting(id, task, node, epoch)?;
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).expect("checked");
        let after_ms = a.teardown.map_or(0, |td| now.saturating_sub(td.started_at_ms));
        let preempted = a.teardown.is_some_and(|td| td.asks_checkpoint());
        let t = &mut a.tasks[task as usize];
        t.checkpoint = Some(Checkpoint { epoch, saved_at_ms: now, data: data.to_vec() });
        Ok(vec![Event::CheckpointSaved { alloc: id, task, epoch, bytes: data.len() as u64, after_ms, preempted }])
    }

    /// Checks an ack or upload for a preempting task: the epoch first (a late
    /// message from an earlier round is stale whatever the task does now),
    /// then the status, then the node.
    fn check_preempting(&self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64) -> Result<NodeSlot, Rejection> {
        let a = self.live_alloc(id)?;
        let t = a.tasks.get(task as usize).ok_or(Rejection::UnknownTask { alloc: id, task })?;
        let slot = self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        if t.preemption_epoch != epoch {
            return Err(Rejection::StalePreemptionEpoch { alloc: id, current: t.preemption_epoch, got: epoch });
        }
        if t.status != TaskStatus::Preempting {
            return Err(Rejection::WrongTaskStatus {
                alloc: id,
                task,
                status: t.status,
                expected: TaskStatus::Preempting,
            });
        }
        if t.node != Some(slot) {
            return Err(Rejection::WrongNode { alloc: id, task, node: node.clone() });
        }
        Ok(slot)
    }

    /// Moves every task of teardown `epoch` still preempting to preempted,
    /// without an ack; the gang then completes.
    fn force_drain(&mut self, id: AllocId, epoch: u64) -> Applied {
        let a = self.live_alloc(id)?;
        let teardown = a.teardown.ok_or(Rejection::NotTearingDown { alloc: id })?;
        if teardown.epoch != epoch {
            return Err(Rejection::StalePreemptionEpoch { alloc: id, current: teardown.epoch, got: epoch });
        }
        let stuck: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempting)
            .map(|t| (t.index, t.node.expect("a preempting task has a node")))
            .collect();
        let mut events = Vec::new();
        let checkpoint_failed = teardown.asks_checkpoint();
        for (task, slot) in stuck {
            events.push(self.stopped(id, task, slot, None, true, checkpoint_failed));
        }
        events.extend(self.settle(id));
        Ok(events)
    }

    /// The seed's CompletePreemption, run by `settle` the moment the last
    /// task of a teardown stops: preempted tasks return to blocked, and the gang is
    /// either blocked as a unit (requeued) or failed: failed if any task used
    /// up its retries or any task already finished (finished work is never
    /// overwritten; done rows stay done). `settle` applies the verdict.
    ///
    /// A priority preemption ends the same way, except that a gang whose
    /// every task stopped in time is **suspended** (queued again with its
    /// original submit time, to resume from its checkpoints) and counts one
    /// more preemption; and its preemptor learns that these nodes are free.
    fn complete_teardown(&mut self, id: AllocId) -> Vec<Event> {
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).expect("checked");
        let Some(teardown) = a.teardown else { return Vec::new() };
        if a.tasks.iter().any(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            return Vec::new();
        }
        a.teardown = None;
        if teardown.is_cancel() {
            return self.complete_cancel(id, teardown);
        }
        for t in a.tasks.iter_mut().filter(|t| t.status == TaskStatus::Preempted) {
            t.status = TaskStatus::Blocked;
            t.node = None;
        }
        let max = a.spec.max_retries;
        let cap = self.limits.watchdog_max_retries;
        let fails = a.tasks.iter().any(|t| {
            matches!(t.status, TaskStatus::Done | TaskStatus::Failed)
                || (t.status == TaskStatus::Blocked && (t.attempts >= max || t.watchdog_trips > cap))
        });
        let preemptor = teardown.preempted_by();
        let outcome = if fails {
            TeardownOutcome::Failed
        } else if teardown.asks_checkpoint() && teardown.failed_checkpoints == 0 {
            TeardownOutcome::Suspended
        } else {
            TeardownOutcome::Blocked
        };
        if teardown.asks_checkpoint() {
            // The seed counts a preemption when the gang is suspended; a
            // victim charged for a missed checkpoint is requeued, not
            // suspended, and its count stays.
            a.suspended = outcome == TeardownOutcome::Suspended;
            if a.suspended {
                a.preempted_count += 1;
            }
        }
        let mut events = vec![Event::TeardownCompleted {
            alloc: id,
            epoch: teardown.epoch,
            cause: teardown.cause,
            outcome,
            drain_ms: now.saturating_sub(teardown.started_at_ms),
            preempted_count: a.preempted_count,
        }];
        if let Some(by) = preemptor {
            events.extend(self.victim_released(id, by));
        }
        events
    }

    /// The end of a cancel's teardown: every task that stopped, and every
    /// task still waiting, is cancelled (finished tasks stay done), and so is
    /// the allocation. A preemptor waiting for these nodes gets them.
    fn complete_cancel(&mut self, id: AllocId, teardown: Teardown) -> Vec<Event> {
        let stopped = self.allocs[&id]
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempted)
            .filter_map(|t| Some((t.index, t.node?)))
            .collect();
        let mut events = vec![self.end_cancelled(id, stopped)];
        if let Some(by) = teardown.preempted_by() {
            events.extend(self.victim_released(id, by));
        }
        events
    }

    /// Victim `victim` of preemptor `by` no longer holds capacity. When it
    /// was the last one the preemptor waited for, the preemptor is reserved
    /// on its held nodes now (or, if one of them can no longer take it, its
    /// hold is dropped and it waits in the queue like any gang).
    fn victim_released(&mut self, victim: AllocId, by: AllocId) -> Vec<Event> {
        let Some(p) = self.allocs.get_mut(&by) else { return Vec::new() };
        let Some(nomination) = p.nomination.as_mut() else { return Vec::new() };
        nomination.waiting_for.retain(|&v| v != victim);
        if !nomination.waiting_for.is_empty() {
            return Vec::new();
        }
        let slots = nomination.nodes.clone();
        let need = p.spec.resources;
        let unusable = slots.iter().find(|&&slot| {
            let node = self.node(slot);
            node.status != NodeStatus::Ready || !fits(&need, &node.resources, &node.free())
        });
        let reason = unusable
            .map(|&slot| format!("held node {} can no longer take a task", self.node(slot).id))
            .or_else(|| self.quota_excess(&self.allocs[&by], &slots, None, &[]));
        self.drop_nomination(by);
        match reason {
            None => vec![self.place_gang(by, &slots)],
            Some(reason) => vec![Event::NominationDropped { alloc: by, reason }],
        }
    }

    /// Lets a preemptor's held nodes go (it returns to the queue).
    fn drop_nomination(&mut self, id: AllocId) {
        let a = self.allocs.get_mut(&id).expect("checked");
        let Some(nomination) = a.nomination.take() else { return };
        for slot in nomination.nodes {
            self.unindex_node(slot);
            self.index.held.remove(&slot);
            self.index_node(slot);
        }
        self.reindex_alloc(id);
    }

    /// The seed's preemption decision, committed: every victim's running
    /// tasks move to preempting under a new preemption epoch (refunded: a
    /// victim is not at fault), and the preemptor's nodes are held for it.
    /// Everything is checked first: the preemptor is queued and holds no
    /// nodes; each victim is running whole, in the reservation the decision
    /// saw, of a lower class, and preemptible; each node is ready, held for
    /// nobody, a home (or shared) node of the preemptor's vCluster, and
    /// takes one of the preemptor's tasks once the victims' tasks on it are
    /// gone.
    ///
    /// A reclamation (`reclaim`) is the same but for its victims: gangs of
    /// other vClusters running on borrowed nodes of the preemptor's
    /// vCluster, whatever their class.
    fn preempt(
        &mut self,
        id: AllocId,
        victims: &[(AllocId, u64)],
        nodes: &[NodeId],
        hold_ms: u64,
        reclaim: bool,
    ) -> Applied {
        let p = self.live_alloc(id)?;
        if !p.is_queued() {
            return Err(Rejection::NotQueued { alloc: id, status: p.status });
        }
        if p.nomination.is_some() {
            return Err(Rejection::AlreadyNominated { alloc: id });
        }
        if nodes.len() != p.spec.gang_size as usize {
            return Err(Rejection::WrongNodeCount {
                alloc: id,
                expected: p.spec.gang_size,
                got: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            });
        }
        let class = p.spec.preemption_class;
        let home = self.home_key(&p.spec.vcluster);
        let reason = if reclaim {
            PreemptReason::Reclaim
        } else if p.spec.is_sensitive() {
            PreemptReason::Sensitive
        } else {
            PreemptReason::Priority
        };
        let not = |victim: AllocId, reason: String| Rejection::NotPreemptible { alloc: id, victim, reason };
        if victims.is_empty() {
            return Err(not(0, "a preemption needs at least one victim".into()));
        }
        let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut victim_vclusters = Vec::with_capacity(victims.len());
        for &(v, epoch) in victims {
            if v == id || !seen.insert(v) {
                return Err(not(v, "named twice, or the preemptor itself".into()));
            }
            let a = self.live_alloc(v)?;
            if a.status != AllocStatus::Running || a.tasks.iter().any(|t| t.status != TaskStatus::Running) {
                return Err(not(v, format!("it is {:?}, not running whole", a.status).to_lowercase()));
            }
            if a.reservation_epoch != epoch {
                return Err(Rejection::StaleReservationEpoch { alloc: v, expected: a.reservation_epoch, got: epoch });
            }
            if let Some(why) = a.spec.never_preempted() {
                return Err(not(v, why.into()));
            }
            if reclaim {
                let borrows_here = a.tasks.iter().any(|t| t.node.is_some_and(|s| self.node_home(s) == home));
                if self.home_key(&a.spec.vcluster) == home || !borrows_here {
                    return Err(not(v, "it runs on no node it borrowed from the reclaiming vCluster".into()));
                }
            } else if a.spec.preemption_class >= class {
                return Err(not(v, format!("its class {} is not below {class}", a.spec.preemption_class)));
            }
            if !reclaim && self.service_at_home(a) {
                return Err(not(v, "service allocations are preempted only on borrowed nodes".into()));
            }
            victim_vclusters.push(a.spec.vcluster.clone());
            let usage = Usage::of(&a.spec.resources);
            for t in &a.tasks {
                let slot = t.node.expect("a running task has a node");
                let f = freed.entry(slot).or_default();
                *f = f.plus(&usage);
            }
        }
        let slots = self.check_nodes(&self.allocs[&id], nodes, &freed)?;
        let p = &self.allocs[&id];
        if let Some((slot, from)) = slots.iter().find_map(|&s| self.borrowed_from(s, p).map(|from| (s, from))) {
            let node = &self.node(slot).id;
            let reason = format!("node {node} is vCluster {from}'s: a preemption takes nodes only at home");
            return Err(Rejection::BorrowRefused { alloc: id, reason });
        }
        let now = self.now_ms;
        let victim_ids: Vec<AllocId> = victims.iter().map(|&(v, _)| v).collect();
        if let Some(reason) = self.quota_excess(&self.allocs[&id], &slots, None, &victim_ids) {
            return Err(Rejection::QuotaExceeded { alloc: id, reason });
        }
        let mut events = vec![Event::PreemptionDecided {
            alloc: id,
            victims: victim_ids.clone(),
            nodes: nodes.to_vec(),
            reason,
            victim_vclusters,
        }];
        for &slot in &slots {
            self.unindex_node(slot);
            self.index.held.insert(slot, id);
        }
        let p = self.allocs.get_mut(&id).expect("checked");
        p.nomination = Some(Nomination {
            nodes: slots,
            waiting_for: victim_ids.clone(),
            decided_at_ms: now,
            expires_at_ms: now.saturating_add(hold_ms),
        });
        self.reindex_alloc(id);
        for v in victim_ids {
            events.push(self.begin_teardown(v, TeardownCause::Preempted { by: id, reason }));
        }
        Ok(events)
    }

    /// A preemptor's hold outlived its deadline: the nodes are let go.
    fn expire_nomination(&mut self, id: AllocId) -> Applied {
        let a = self.live_alloc(id)?;
        let n = a.nomination.as_ref().ok_or(Rejection::NotNominated { alloc: id })?;
        if self.now_ms < n.expires_at_ms {
            return Err(Rejection::NominationNotExpired { alloc: id, expires_at_ms: n.expires_at_ms });
        }
        let waiting = n.waiting_for.len();
        self.drop_nomination(id);
        Ok(vec![Event::NominationDropped {
            alloc: id,
            reason: format!("the hold expired with {waiting} victim(s) still stopping"),
        }])
    }

    /// Returns every unclaimed reservation of a gang to blocked; how many.
    fn release_reserved(&mut self, id: AllocId) -> u32 {
        let a = &self.allocs[&id];
        let usage = Usage::of(&a.spec.resources);
        let reserved: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Reserved)
            .map(|t| (t.index, t.node.expect("a reserved task has a node")))
            .collect();
        let count = reserved.len() as u32;
        for (task, slot) in reserved {
            self.release(slot, &usage, (id, task));
            let t = &mut self.allocs.get_mut(&id).expect("checked").tasks[task as usize];
            t.status = TaskStatus::Blocked;
            t.node = None;
            t.reserved_at_ms = None;
        }
        count
    }

    /// A node stopped answering while holding work: it takes no more, and
    /// every task on it ends: a running task fails (charged; its running
    /// siblings are torn down), an unclaimed one fails to start (charged, and
    /// a teardown if siblings run; otherwise its gang's reservation is simply
    /// released), and a preempting one is preempted (its process is presumed
    /// gone with the node). Re-registering makes it ready again.
    ///
    /// A draining or stopping node that goes silent is stopped instead of
    /// lost: its drain wanted it empty and out of service, and losing it
    /// did both (its agent coming back finds it stopped, not ready).
    fn mark_node_lost(&mut self, node: &NodeId) -> Applied {
        let allowed = [NodeStatus::Ready, NodeStatus::Draining, NodeStatus::Stopping];
        let slot = self.node_for(node, "be marked lost", &allowed)?;
        let tasks: Vec<(AllocId, TaskIndex)> = self.tasks_on_node(slot).collect();
        let now = self.now_ms;
        let drain_ms = self.node(slot).drain.as_ref().map(|d| now.saturating_sub(d.started_at_ms));
        let mut events = vec![Event::NodeLost { node: node.clone(), tasks: tasks.clone() }];
        match drain_ms {
            None => self.set_node_status(slot, NodeStatus::Lost),
            Some(_) => {
                self.set_node_status(slot, NodeStatus::Stopped);
                events.push(Event::NodeStopped {
                    node: node.clone(),
                    by: None,
                    reason: "lost while draining: its tasks were failed over".to_string(),
                    drain_ms,
                });
            }
        }
        for (id, task) in tasks {
            let t = &self.allocs[&id].tasks[task as usize];
            if t.node != Some(slot) {
                continue; // already moved off by an earlier task of the same gang
            }
            match t.status {
                TaskStatus::Running => events.extend(self.fail_running(id, task, slot, None)),
                TaskStatus::Reserved if self.allocs[&id].has_running() => {
                    events.extend(self.abandon_reserved(id, task, false))
                }
                TaskStatus::Reserved => {
                    self.release_reserved(id);
                    events.extend(self.settle(id));
                }
                TaskStatus::Preempting => {
                    events.push(self.stopped(id, task, slot, None, true, false));
                    events.extend(self.settle(id));
                }
                other => unreachable!("task {id}/{task} on a node while {other:?}"),
            }
        }
        Ok(events)
    }

    /// Cancels an allocation. With nothing running, it ends now: reserved
    /// tasks release their capacity and every unfinished task is cancelled.
    /// Otherwise the cancel is a gang teardown with its own cause: running
    /// (and already stopping) tasks are stopped under a new preemption epoch
    /// and keep their capacity until their agents confirm they stopped, or
    /// until the force deadline; the allocation is cancelled when the last
    /// one stops (`complete_teardown`).
    fn check_cancel(&self, id: AllocId) -> Result<(), Rejection> {
        if self.live_alloc(id)?.teardown.is_some_and(|td| td.is_cancel()) {
            return Err(Rejection::AlreadyCancelling { alloc: id });
        }
        Ok(())
    }

    fn cancel(&mut self, id: AllocId) -> Applied {
        self.check_cancel(id)?;
        self.drop_nomination(id);
        let a = &self.allocs[&id];
        if a.tasks.iter().any(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            let preempted_by = a.teardown.and_then(|td| td.preempted_by());
            return Ok(vec![self.begin_teardown(id, TeardownCause::Cancelled { preempted_by })]);
        }
        let usage = Usage::of(&a.spec.resources);
        let held: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status.holds_capacity())
            .map(|t| (t.index, t.node.expect("a placed task has a node")))
            .collect();
        for &(task, slot) in &held {
            self.release(slot, &usage, (id, task));
        }
        Ok(vec![self.end_cancelled(id, held)])
    }

    /// Cancels every unfinished task and the allocation itself (finished
    /// tasks stay done); `stopped` are the tasks that held capacity on
    /// these nodes until now.
    fn end_cancelled(&mut self, id: AllocId, stopped: Vec<(TaskIndex, NodeSlot)>) -> Event {
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).expect("checked");
        for t in a.tasks.iter_mut().filter(|t| !t.status.is_terminal()) {
            if t.status == TaskStatus::Preempted {
                t.node = None; // it has left its node
            }
            t.status = TaskStatus::Cancelled;
        }
        a.status = AllocStatus::Cancelled;
        a.suspended = false;
        a.finished_at_ms = Some(now);
        drop_checkpoints(a);
        let stopped = stopped.into_iter().map(|(task, slot)| (task, self.node(slot).id.clone())).collect();
        self.reindex_alloc(id);
        Event::AllocationCancelled { alloc: id, stopped }
    }

    // ----- shared checks and moves --------------------------------------

    fn live_alloc(&self, id: AllocId) -> Result<&Allocation, Rejection> {
        let a = self.allocs.get(&id).ok_or(Rejection::UnknownAllocation(id))?;
        if a.status.is_terminal() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status: a.status });
        }
        Ok(a)
    }

    /// Checks a node's claim or report about one task: the task exists, is
    /// placed on that node, under the current reservation epoch, in one of
    /// the `accepted` statuses (the first is named when it is not).
    fn check_report(
        &self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        accepted: &[TaskStatus],
    ) -> Result<(NodeSlot, TaskStatus), Rejection> {
        let a = self.live_alloc(id)?;
        let t = a.tasks.get(task as usize).ok_or(Rejection::UnknownTask { alloc: id, task })?;
        let slot = self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        let wrong_status = Rejection::WrongTaskStatus { alloc: id, task, status: t.status, expected: accepted[0] };
        match t.node {
            None => return Err(wrong_status),
            Some(placed) if placed != slot => return Err(Rejection::WrongNode { alloc: id, task, node: node.clone() }),
            Some(_) => {}
        }
        if t.reservation_epoch != epoch {
            return Err(Rejection::StaleTaskEpoch { alloc: id, task, current: t.reservation_epoch, got: epoch });
        }
        if !accepted.contains(&t.status) {
            return Err(wrong_status);
        }
        Ok((slot, t.status))
    }

    /// Moves a running or preempting task off its node into `status`.
    fn leave_node(&mut self, id: AllocId, task: TaskIndex, slot: NodeSlot, status: TaskStatus, exit_code: Option<i32>) {
        let now = self.now_ms;
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        self.release(slot, &usage, (id, task));
        let t = &mut self.allocs.get_mut(&id).expect("checked").tasks[task as usize];
        t.status = status;
        t.finished_at_ms = Some(now);
        t.exit_code = exit_code;
        t.reserved_at_ms = None;
    }

    /// Completes a teardown whose last task has stopped, then decides a
    /// gang's fate once nothing of it runs, waits to be claimed or is being
    /// torn down:
    /// all done ⇒ done; otherwise, if any task finished or any blocked task
    /// used up its retries ⇒ failed (the seed's completion rule); else the
    /// whole gang is queued again.
    fn settle(&mut self, id: AllocId) -> Vec<Event> {
        let now = self.now_ms;
        let before = self.allocs[&id].status;
        let mut events = self.complete_teardown(id);
        self.refresh(id);
        let a = self.allocs.get_mut(&id).expect("settle of a known allocation");
        if a.status.is_terminal() {
            // A cancel's teardown just completed.
        } else if a.tasks.iter().all(|t| t.status == TaskStatus::Done) {
            a.status = AllocStatus::Done;
            a.finished_at_ms = Some(now);
            drop_checkpoints(a);
            events.push(Event::AllocationDone { alloc: id });
        } else if a.is_queued() {
            // Nothing runs or waits: blocked (and maybe done) tasks only.
            let done = a.tasks.iter().find(|t| t.status == TaskStatus::Done).map(|t| t.index);
            let exhausted = a
                .tasks
                .iter()
                .find(|t| t.status == TaskStatus::Blocked && t.attempts >= a.spec.max_retries)
                .map(|t| t.index);
            let cap = self.limits.watchdog_max_retries;
            let wedged = a.tasks.iter().find(|t| t.status == TaskStatus::Blocked && t.watchdog_trips > cap);
            let reason = match (done, exhausted, wedged) {
                (Some(task), _, _) => Some(format!("task {task} finished before its gang could be restarted whole")),
                (None, Some(task), _) => Some(format!("task {task} failed {} times", a.spec.max_retries)),
                (None, None, Some(t)) => Some(format!(
                    "task {} tripped the {} watchdog after {} retries",
                    t.index,
                    t.last_watchdog.map_or("?", |k| k.as_str()),
                    cap
                )),
                (None, None, None) => None,
            };
            if let Some(reason) = reason {
                for t in a.tasks.iter_mut().filter(|t| t.status == TaskStatus::Blocked) {
                    t.status = TaskStatus::Failed;
                }
                a.status = AllocStatus::Failed;
                a.suspended = false;
                a.finished_at_ms = Some(now);
                drop_checkpoints(a);
                events.push(Event::AllocationFailed { alloc: id, reason });
            } else if !matches!(before, AllocStatus::Queued | AllocStatus::Suspended) {
                events.push(Event::GangRequeued { alloc: id });
            }
        }
        self.reindex_alloc(id);
        events
    }

    /// Re-derives a live allocation's status from its tasks.
    fn refresh(&mut self, id: AllocId) {
        let a = self.allocs.get_mut(&id).expect("refresh of a known allocation");
        if a.status.is_terminal() {
            return;
        }
        let count = |s: TaskStatus| a.tasks.iter().filter(|t| t.status == s).count();
        let (blocked, reserved) = (count(TaskStatus::Blocked), count(TaskStatus::Reserved));
        let was_queued = a.is_queued();
        a.status = if a.teardown.is_some() {
            AllocStatus::TearingDown
        } else if blocked > 0 && reserved == 0 {
            if a.suspended { AllocStatus::Suspended } else { AllocStatus::Queued }
        } else if reserved > 0 {
            AllocStatus::Reserved
        } else {
            AllocStatus::Running
        };
        if a.is_queued() && !was_queued {
            a.queued_since_ms = self.now_ms;
        }
        self.reindex_alloc(id);
    }

    fn reindex_alloc(&mut self, id: AllocId) {
        let a = &self.allocs[&id];
        let key = QueueKey::of(a);
        let home = self.home_key(&a.spec.vcluster);
        let shape = (home, Shape::of(a));
        let class = (Reverse(a.spec.preemption_class), key);
        if a.is_queued() && a.nomination.is_none() && a.spec.preemption_class > 0 {
            self.index.preemptors.insert(class);
        } else {
            self.index.preemptors.remove(&class);
        }
        if a.is_queued() && a.nomination.is_none() {
            self.index.queue.insert(key);
            self.index.queue_fifo.insert(id);
            if self.index.queue_by_shape.entry(shape).or_default().insert(key) {
                *self.index.vc_queued.entry(home).or_default() += 1;
            }
        } else if self.index.queue.remove(&key) {
            self.index.queue_fifo.remove(&id);
            decrement(&mut self.index.vc_queued, home);
            let group = self.index.queue_by_shape.get_mut(&shape).expect("a queued shape has a group");
            group.remove(&key);
            if group.is_empty() {
                self.index.queue_by_shape.remove(&shape);
            }
        }
        let gpus = u64::from(a.spec.gang_size) * u64::from(a.spec.resources.gpus);
        if !a.status.is_terminal() {
            let d = self.index.vc_live.entry(a.spec.vcluster.clone()).or_default();
            if d.allocs.insert(id) {
                d.gpus += gpus;
            }
        } else if let Some(d) = self.index.vc_live.get_mut(&a.spec.vcluster)
            && d.allocs.remove(&id)
        {
            d.gpus -= gpus;
            if d.allocs.is_empty() {
                self.index.vc_live.remove(&a.spec.vcluster);
            }
        }
        if !a.status.is_terminal() && a.has_reserved() {
            self.index.reserved.insert(id);
        } else {
            self.index.reserved.remove(&id);
        }
        if a.teardown.is_some() {
            self.index.tearing_down.insert(id);
        } else {
            self.index.tearing_down.remove(&id);
        }
    }

    fn index_node(&mut self, slot: NodeSlot) {
        let node = &self.nodes[slot.0 as usize];
        if node.status == NodeStatus::Ready && !self.index.held.contains_key(&slot) {
            self.index.free_gpus.insert((self.index.node_home[slot.0 as usize], node.free().gpus, slot));
        }
    }

    fn unindex_node(&mut self, slot: NodeSlot) {
        let node = &self.nodes[slot.0 as usize];
        self.index.free_gpus.remove(&(self.index.node_home[slot.0 as usize], node.free().gpus, slot));
    }

    fn occupy(&mut self, slot: NodeSlot, usage: &Usage, task: (AllocId, TaskIndex)) {
        self.touched.0.insert(slot);
        self.index.tasks_by_node.entry(slot).or_default().insert(task);
        self.add_holder(slot, task.0, *usage);
        self.unindex_node(slot);
        let node = &mut self.nodes[slot.0 as usize];
        node.used = node.used.plus(usage);
        assert!(Usage::of(&node.resources).covers(&node.used), "node {} over-committed", node.id);
        self.index_node(slot);
    }

    fn release(&mut self, slot: NodeSlot, usage: &Usage, task: (AllocId, TaskIndex)) {
        self.touched.0.insert(slot);
        if let Some(holders) = self.index.holders.get_mut(slot.0 as usize)
            && let Ok(i) = holders.binary_search_by_key(&task.0, |h| h.alloc)
        {
            let h = holders.remove(i);
            let vc = &self.allocs[&h.alloc].spec.vcluster;
            let lender = self.lender(slot, vc);
            if let Some(home) = lender {
                let lent = self.index.lent.get_mut(&home).expect("a borrower is in its lender's index");
                decrement(lent, h.alloc);
                if lent.is_empty() {
                    self.index.lent.remove(&home);
                }
            }
            let load = self.index.vc_load.get_mut(vc).expect("a holder is in its vCluster's load");
            load.gpus -= u64::from(h.usage.gpus);
            if lender.is_some() {
                load.borrowed_gpus -= u64::from(h.usage.gpus);
            }
            decrement(&mut load.allocs, h.alloc);
            decrement(&mut load.nodes, slot);
            if load.allocs.is_empty() {
                self.index.vc_load.remove(vc);
            }
        }
        if let Some(tasks) = self.index.tasks_by_node.get_mut(&slot) {
            tasks.remove(&task);
            if tasks.is_empty() {
                self.index.tasks_by_node.remove(&slot);
                if matches!(self.node(slot).status, NodeStatus::Draining | NodeStatus::Stopping) {
                    self.index.emptied.push(slot);
                }
            }
        }
        self.unindex_node(slot);
        let node = &mut self.nodes[slot.0 as usize];
        assert!(node.used.covers(usage), "node {} releases more than it holds", node.id);
        node.used = node.used.minus(usage);
        self.index_node(slot);
    }

    /// The task of `id` holding `slot` (re)started or was reserved again
    /// there, now: its walltime runs from now.
    fn restart_walltime(&mut self, id: AllocId, slot: NodeSlot) {
        let ends = self.now_ms.saturating_add(self.allocs[&id].spec.walltime_s.saturating_mul(1000));
        let holders = &mut self.index.holders[slot.0 as usize];
        let i = holders.binary_search_by_key(&id, |h| h.alloc).expect("the task holds its node");
        holders[i].walltime_ends_ms = ends;
    }

    /// Records that a task of `alloc` holds `usage` on `slot` (a gang has at
    /// most one task per node).
    fn add_holder(&mut self, slot: NodeSlot, alloc: AllocId, usage: Usage) {
        let a = &self.allocs[&alloc];
        let class = a.spec.preemption_class;
        // Being placed now (its task not updated yet), or indexed again from
        // a task that holds the node.
        let since = match a.tasks.iter().find(|t| t.node == Some(slot) && t.status.holds_capacity()) {
            Some(t) if t.status == TaskStatus::Reserved => t.reserved_at_ms,
            Some(t) => t.started_at_ms.or(t.reserved_at_ms),
            None => None,
        };
        let walltime_ends_ms = since.unwrap_or(self.now_ms).saturating_add(a.spec.walltime_s.saturating_mul(1000));
        let holders = &mut self.index.holders[slot.0 as usize];
        let at = holders.binary_search_by_key(&alloc, |h| h.alloc).expect_err("one task per node per gang");
        holders.insert(at, Holder { alloc, class, usage, walltime_ends_ms });
        let vc = &self.allocs[&alloc].spec.vcluster;
        let lender = self.lender(slot, vc);
        if let Some(home) = lender {
            *self.index.lent.entry(home).or_default().entry(alloc).or_default() += 1;
        }
        let load = self.index.vc_load.entry(vc.clone()).or_default();
        load.gpus += u64::from(usage.gpus);
        if lender.is_some() {
            load.borrowed_gpus += u64::from(usage.gpus);
        }
        *load.allocs.entry(alloc).or_default() += 1;
        *load.nodes.entry(slot).or_default() += 1;
    }

    /// Why a submission is refused by its vCluster's hard quotas: in any
    /// mode when the gang alone is larger than a quota (it could never
    /// run); in `reject` mode also when the vCluster's live allocations
    /// (queued, reserved, running) and this one together would be. Log
    /// order decides racing submissions: the later one is refused.
    fn submit_quota_excess(&self, spec: &AllocSpec) -> Option<String> {
        let vc = self.vclusters.get(&spec.vcluster)?;
        let q = vc.spec.quota;
        let need = u64::from(spec.gang_size) * u64::from(spec.resources.gpus);
        let name = &vc.name;
        if let Some(max) = q.max_gpus
            && need > u64::from(max)
        {
            return Some(format!("the gang needs {need} GPUs; vCluster {name}'s quota is {max}"));
        }
        if let Some(max) = q.max_nodes
            && spec.gang_size > max
        {
            return Some(format!("the gang needs {} nodes; vCluster {name}'s quota is {max}", spec.gang_size));
        }
        if vc.spec.over_quota != OverQuota::Reject {
            return None;
        }
        let empty = VcDemand::default();
        let live = self.index.vc_live.get(name).unwrap_or(&empty);
        if let Some(max) = q.max_gpus
            && live.gpus + need > u64::from(max)
        {
            return Some(format!(
                "vCluster {name}'s GPU quota: its live allocations need {} GPUs, this one {need}, at most {max}",
                live.gpus
            ));
        }
        if let Some(max) = q.max_allocations
            && live.allocs.len() + 1 > max as usize
        {
            return Some(format!("vCluster {name}'s allocation quota: {} live, at most {max}", live.allocs.len()));
        }
        None
    }

    /// Whether vCluster `name` has any hard quota (the built-in default,
    /// never changed, has none).
    pub fn has_quota(&self, name: &str) -> bool {
        self.vclusters.get(name).is_some_and(|v| {
            let q = v.spec.quota;
            q.max_gpus.is_some() || q.max_nodes.is_some() || q.max_allocations.is_some()
        })
    }

    /// vCluster `name`'s GPU quota, if it has one.
    pub fn gpu_quota(&self, name: &str) -> Option<u32> {
        self.vclusters.get(name)?.spec.quota.max_gpus
    }

    /// What a vCluster's tasks hold now.
    pub fn vcluster_load(&self, name: &str) -> Option<&VcLoad> {
        self.index.vc_load.get(name)
    }

    /// Why reserving gang `a` on `slots` would take its vCluster past a hard
    /// quota, or `None`. `pending` is load not yet applied (an admission
    /// pass's earlier reservations); the load of `minus` (a preemption's
    /// victims) is not counted. With no `slots`, the node quota is not
    /// checked (the nodes are not chosen yet).
    pub fn quota_excess(
        &self,
        a: &Allocation,
        slots: &[NodeSlot],
        pending: Option<&VcLoad>,
        minus: &[AllocId],
    ) -> Option<String> {
        // Borrowed, not cloned: this runs for every gang a pass considers.
        // The built-in default, never changed, has no quotas.
        let vc = self.vclusters.get(&a.spec.vcluster)?;
        let q = vc.spec.quota;
        if q.max_gpus.is_none() && q.max_nodes.is_none() && q.max_allocations.is_none() {
            return None;
        }
        let empty = VcLoad::default();
        let load = self.index.vc_load.get(&vc.name).unwrap_or(&empty);
        let pending = pending.unwrap_or(&empty);
        let gone: Vec<&Allocation> =
            minus.iter().filter(|m| load.allocs.contains_key(m)).filter_map(|m| self.allocs.get(m)).collect();
        let name = &vc.name;
        if let Some(max) = q.max_gpus {
            let freed: u64 =
                gone.iter().map(|m| u64::from(m.spec.resources.gpus) * u64::from(load.allocs[&m.id])).sum();
            let held = (load.gpus + pending.gpus).saturating_sub(freed);
            let need = u64::from(a.spec.resources.gpus) * u64::from(a.spec.gang_size);
            if held + need > u64::from(max) {
                return Some(format!(
                    "vCluster {name}'s GPU quota: {held} held + {need} needed > {max} (it waits; no running work is preempted for a quota)"
                ));
            }
        }
        if let Some(max) = q.max_allocations {
            let counted = load.allocs.len() + pending.allocs.len() - gone.len();
            let this = usize::from(!load.allocs.contains_key(&a.id) && !pending.allocs.contains_key(&a.id));
            if counted + this > max as usize {
                return Some(format!(
                    "vCluster {name}'s allocation quota: {counted} running or reserved, at most {max}"
                ));
            }
        }
        if let (Some(max), false) = (q.max_nodes, slots.is_empty()) {
            let mut on: BTreeMap<NodeSlot, u32> = load.nodes.clone();
            for m in &gone {
                for t in m.tasks.iter().filter(|t| t.status.holds_capacity()) {
                    if let Some(s) = t.node
                        && let Some(n) = on.get_mut(&s)
                    {
                        *n -= 1;
                        if *n == 0 {
                            on.remove(&s);
                        }
                    }
                }
            }
            let nodes: BTreeSet<NodeSlot> = on.keys().chain(pending.nodes.keys()).chain(slots).copied().collect();
            if nodes.len() > max as usize {
                return Some(format!(
                    "vCluster {name}'s node quota: the gang would put it on {} nodes, at most {max}",
                    nodes.len()
                ));
            }
        }
        None
    }

    /// Moves the clock as applying an entry stamped `time_ms` would.
    #[cfg(test)]
    pub(crate) fn advance_clock(&mut self, time_ms: u64) {
        self.now_ms = self.now_ms.max(time_ms);
    }

    /// Rebuilds every derived index from the replicated fields (after decode).
    pub(crate) fn rebuild_indexes(&mut self) {
        self.index = Indexes::default();
        self.index.holders = vec![Vec::new(); self.nodes.len()];
        self.index.home_names = self.vclusters().into_iter().map(|v| v.name).collect();
        self.index.home_key =
            self.index.home_names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32 + 1)).collect();
        self.index.node_home = self.homes_of(self.nodes.iter());
        for a in self.allocs.values() {
            for &slot in a.nomination.iter().flat_map(|n| &n.nodes) {
                self.index.held.insert(slot, a.id);
            }
        }
        for slot in 0..self.nodes.len() {
            let slot = NodeSlot(slot as u32);
            self.index.node_by_id.insert(self.node(slot).id.clone(), slot);
            self.index.by_status.entry(self.node(slot).status).or_default().insert(slot);
            self.index_node(slot);
        }
        let ids: Vec<AllocId> = self.allocs.keys().copied().collect();
        for id in ids {
            self.reindex_alloc(id);
            let usage = Usage::of(&self.allocs[&id].spec.resources);
            let placed: Vec<(NodeSlot, TaskIndex)> = self.allocs[&id]
                .tasks
                .iter()
                .filter(|t| t.status.holds_capacity())
                .map(|t| (t.node.expect("a placed task has a node"), t.index))
                .collect();
            for (slot, task) in placed {
                self.index.tasks_by_node.entry(slot).or_default().insert((id, task));
                self.add_holder(slot, id, usage);
            }
        }
    }

    /// Checks every invariant of the state; `Err` names the first one broken.
    /// Tests and the simulator call this; a broken invariant is a bug.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut used = vec![Usage::default(); self.nodes.len()];
        for a in self.allocs.values() {
            let has = |s: TaskStatus| a.tasks.iter().any(|t| t.status == s);
            if has(TaskStatus::Blocked) && has(TaskStatus::Reserved) {
                return Err(format!("allocation {} is partly reserved", a.id));
            }
            if has(TaskStatus::Blocked) && has(TaskStatus::Running) {
                return Err(format!("allocation {} is partly running", a.id));
            }
            match a.teardown {
                Some(td) => {
                    if a.status != AllocStatus::TearingDown {
                        return Err(format!("allocation {} has a teardown but is {:?}", a.id, a.status));
                    }
                    if has(TaskStatus::Running) || has(TaskStatus::Reserved) || !has(TaskStatus::Preempting) {
                        return Err(format!("allocation {}'s teardown has no task preempting, or one placed", a.id));
                    }
                    if a.tasks.iter().any(|t| t.status == TaskStatus::Preempting && t.preemption_epoch != td.epoch) {
                        return Err(format!("allocation {} has a task preempting under an old epoch", a.id));
                    }
                    if td.epoch != a.preemption_epoch {
                        return Err(format!("allocation {}'s teardown epoch is not its latest", a.id));
                    }
                }
                None => {
                    if a.status == AllocStatus::TearingDown || has(TaskStatus::Preempting) || has(TaskStatus::Preempted)
                    {
                        return Err(format!("allocation {} is preempting outside a teardown", a.id));
                    }
                }
            }
            if a.status.is_terminal() && a.tasks.iter().any(|t| t.checkpoint.is_some()) {
                return Err(format!("terminal allocation {} still keeps checkpoints", a.id));
            }
            if a.tasks.len() != a.spec.gang_size as usize {
                return Err(format!(
                    "allocation {} has {} tasks for a gang of {}",
                    a.id,
                    a.tasks.len(),
                    a.spec.gang_size
                ));
            }
            let mut nodes = BTreeSet::new();
            for t in &a.tasks {
                match (t.status.holds_capacity(), t.node) {
                    (true, Some(slot)) => {
                        if !nodes.insert(slot) {
                            return Err(format!("allocation {} has two tasks on one node", a.id));
                        }
                        let u = &mut used[slot.0 as usize];
                        *u = u.plus(&Usage::of(&a.spec.resources));
                    }
                    (true, None) => return Err(format!("allocation {} task {} is placed nowhere", a.id, t.index)),
                    (false, _) => {}
                }
                if a.status.is_terminal() && t.status.holds_capacity() {
                    return Err(format!("terminal allocation {} still holds capacity", a.id));
                }
            }
            if let Some(n) = &a.nomination {
                if !a.is_queued() {
                    return Err(format!("allocation {} holds nodes but is {:?}", a.id, a.status));
                }
                if n.nodes.len() != a.spec.gang_size as usize {
                    return Err(format!(
                        "allocation {} holds {} nodes for a gang of {}",
                        a.id,
                        n.nodes.len(),
                        a.tasks.len()
                    ));
                }
                for v in &n.waiting_for {
                    let by = self.allocs.get(v).and_then(|v| v.teardown).and_then(|td| td.preempted_by());
                    if by != Some(a.id) {
                        return Err(format!("allocation {} waits for {v}, which is not being preempted for it", a.id));
                    }
                }
                if n.waiting_for.is_empty() {
                    return Err(format!("allocation {} holds nodes but waits for no victim", a.id));
                }
            }
            if a.suspended != (a.status == AllocStatus::Suspended) {
                return Err(format!("allocation {} is {:?} with suspended = {}", a.id, a.status, a.suspended));
            }
            // A reclamation preempts whatever the class, and a cancel during
            // a preemption keeps its preemptor.
            let reclaim = matches!(
                a.teardown.map(|td| td.cause),
                Some(TeardownCause::Preempted { reason: PreemptReason::Reclaim, .. } | TeardownCause::Cancelled { .. })
            );
            if let Some(by) = a.teardown.and_then(|td| td.preempted_by())
                && !reclaim
                && self.allocs.get(&by).is_none_or(|p| p.spec.preemption_class <= a.spec.preemption_class)
            {
                return Err(format!("allocation {} is preempted for {by}, which is not of a higher class", a.id));
            }
            if (a.is_queued() && a.nomination.is_none()) != self.index.queue.contains(&QueueKey::of(a)) {
                return Err(format!("queue index out of step for allocation {}", a.id));
            }
        }
        for (node, used) in self.nodes.iter().zip(&used) {
            if node.used != *used {
                return Err(format!("node {} records {:?} used but its tasks hold {:?}", node.id, node.used, used));
            }
            if !Usage::of(&node.resources).covers(used) {
                return Err(format!("node {} is over-committed", node.id));
            }
            if !node.status.may_hold_work() && *used != Usage::default() {
                return Err(format!("{} node {} still holds tasks", node.status.as_str(), node.id));
            }
            let draining = matches!(node.status, NodeStatus::Draining | NodeStatus::Stopping);
            if draining != node.drain.is_some() {
                return Err(format!("node {} is {} with drain {:?}", node.id, node.status.as_str(), node.drain));
            }
            if draining && self.tasks_on_node(node.slot).next().is_none() {
                return Err(format!("{} node {} holds nothing but did not stop", node.status.as_str(), node.id));
            }
        }
        let mut fresh = self.clone();
        fresh.rebuild_indexes();
        if fresh.index != self.index {
            return Err("derived indexes differ from a rebuild".to_string());
        }
        Ok(())
    }
}

/// A finished allocation's checkpoints will never be restored: drop them so
/// they stop weighing on every snapshot.
/// A reason an agent gives (a start failure, an unusable checkpoint) is at
/// most [`super::command::MAX_AGENT_REASON_BYTES`].
fn check_agent_reason(reason: &str) -> Result<(), Rejection> {
    if reason.len() > super::command::MAX_AGENT_REASON_BYTES {
        return Err(Rejection::InvalidNode {
            field: "reason".into(),
            reason: format!("{} bytes, over {}", reason.len(), super::command::MAX_AGENT_REASON_BYTES),
        });
    }
    Ok(())
}

fn drop_checkpoints(a: &mut Allocation) {
    for t in &mut a.tasks {
        t.checkpoint = None;
    }
}
