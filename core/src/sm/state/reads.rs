//! Read-only views of the state: lookups, indexes and queues the policies and the API read.

use super::*;
use std::sync::Arc;

impl State {
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
        self.allocs.get(&id).map(Arc::as_ref)
    }

    /// Every allocation, by id.
    pub fn allocs(&self) -> &AllocMap {
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

    /// How many allocations are queued in each preemption class (classes
    /// with none are absent).
    pub fn queued_by_class(&self) -> &BTreeMap<u8, u32> {
        &self.index.queued_by_class
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
    pub(super) fn lender(&self, slot: NodeSlot, vc: &str) -> Option<u32> {
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
    pub(super) fn borrow_limit_after(&self, name: &str, gone: u64) -> Option<u64> {
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

    /// When the first queued gang backing off after a failure (and not yet
    /// past it at `now_ms`) may be placed again.
    pub fn next_retry_after(&self, now_ms: u64) -> Option<u64> {
        self.index.backoffs.range((now_ms.saturating_add(1), 0)..).next().map(|&(at, _)| at)
    }

    /// Whether `id` is being torn down.
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

    /// GPUs held by placed tasks: (reserved, running), where running
    /// counts running and preempting tasks. Every placed task's GPUs are in
    /// its node's `used` (an invariant), so the total is a sum over the
    /// nodes; the reserved part walks only the allocations with a task
    /// reserved (`index.reserved`), the few between a placement and its
    /// start. Its cost follows the nodes and the reservations in flight,
    /// not the placed tasks (walking those, it was 6 % of a leader's time
    /// and 14 % of a follower's late in a million-task run: every replica
    /// refreshes its `muster_gpus` gauge once a second).
    pub fn held_gpus(&self) -> (u64, u64) {
        let held: u64 = self.nodes.iter().map(|n| u64::from(n.used.gpus)).sum();
        let reserved: u64 = self
            .index
            .reserved
            .iter()
            .filter_map(|id| self.allocs.get(id))
            .map(|a| {
                let placed = a.tasks.iter().filter(|t| t.status == TaskStatus::Reserved && t.node.is_some()).count();
                placed as u64 * u64::from(a.spec.resources.gpus)
            })
            .sum();
        (reserved, held.saturating_sub(reserved))
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
}
