//! The admission cycle: a pure function from a state view and `now` to the
//! commands the leader should propose.
//!
//! ```text
//!   1. roll back reservations unclaimed for `stale_reservation_ms`
//!      (their capacity and their gangs are reused in this same pass)
//!   2. walk queued gangs (every task blocked) in admission order:
//!        largest gang first, then class, then priority, then submit time
//!      (or strictly by submit time, stopping at the first misfit, with
//!       `Order::Fifo`: the first-come-first-served baseline)
//!   3. place each gang on distinct ready nodes with room for one task each,
//!      counting reserved and running tasks as used, best fit on GPUs, and
//!      subtract it before the next gang (a gang retried after a watchdog
//!      trip goes first in its class and avoids the nodes it tripped on when
//!      it can)
//! ```
//!
//! Capacity comes from the state's free-GPU index (ready nodes ordered by
//! free GPUs). Nodes this pass has already used live in a small overlay with
//! its own index, so a pass never copies or rescans the whole node table: a
//! gang costs O(log nodes + nodes looked at). A shape (gang size, resources)
//! that failed once in a pass is not tried again in that pass, since capacity
//! only shrinks while the pass places gangs; the queue is walked as a merge of
//! one stream per shape, so a failed shape's whole group is skipped at once
//! and a pass costs O(shapes + gangs placed), however long the queue.
//!
//! Every command is checked again by `State::apply`; a plan made from a stale
//! view is rejected there, never half-applied.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::iter::Peekable;
use std::ops::Bound::{Excluded, Unbounded};

use crate::sm::{
    AllocId, Allocation, Command, NodeSlot, NodeStatus, QueueKey, Resources, Shape, State, TaskStatus, Usage, VcLoad,
    fits,
};

/// In which order queued gangs are tried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Largest gang first, then class, priority and submit time; a gang that
    /// does not fit is skipped and smaller ones are still tried.
    #[default]
    LargestFirst,
    /// Strictly by submit time; the pass stops at the first gang that does
    /// not fit (head-of-line blocking). A baseline to compare against.
    Fifo,
}

/// The knobs of the admission cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// How long a reservation may stay unclaimed before it is rolled back.
    pub stale_reservation_ms: u64,
    /// The order gangs are tried in.
    pub order: Order,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { stale_reservation_ms: 30_000, order: Order::LargestFirst }
    }
}

/// Counters of one pass, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Gangs looked at.
    pub gangs_considered: usize,
    /// Gangs held back by their vCluster's hard quota.
    pub quota_waits: usize,
    /// Gangs placed.
    pub gangs_placed: usize,
    /// Tasks placed (the sum of placed gangs' sizes).
    pub tasks_placed: usize,
    /// Reservations rolled back.
    pub rollbacks: usize,
}

/// What one admission pass decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// Commands to propose, in order (rollbacks first).
    pub commands: Vec<Command>,
    /// What the pass did.
    pub stats: PassStats,
}

/// Runs one admission pass over `state` at `now_ms`.
pub fn plan_admission(state: &State, now_ms: u64, cfg: &AdmissionConfig) -> AdmissionPlan {
    let mut plan = AdmissionPlan::default();
    let mut capacity = Overlay::new(state);

    // 1. Stale reservations. In a gang with a started task the rollback
    //    starts a teardown of the running tasks instead (the gang is not
    //    queued again in this pass: it waits for them to stop).
    let mut requeued = BTreeSet::new();
    for id in state.reserved_allocs() {
        let a = state.alloc(id).expect("index names a known allocation");
        let reserved_at = a.tasks.iter().filter_map(|t| t.reserved_at_ms).min().unwrap_or(now_ms);
        if now_ms < reserved_at.saturating_add(cfg.stale_reservation_ms) {
            continue;
        }
        let usage = Usage::of(&a.spec.resources);
        for t in a.tasks.iter().filter(|t| t.status == TaskStatus::Reserved) {
            capacity.give(t.node.expect("a reserved task has a node"), &usage);
        }
        plan.commands.push(Command::RollbackGang { alloc: id, epoch: a.reservation_epoch });
        plan.stats.rollbacks += 1;
        // A gang with a finished task fails on rollback instead of requeueing.
        if !a.has_running() && !a.tasks.iter().any(|t| t.status == TaskStatus::Done) {
            requeued.insert(QueueKey::of(a));
        }
    }

    // 2 and 3. Walk the queue and place.
    let mut nodes = Vec::new();
    let mut failed_shapes: BTreeSet<Shape> = BTreeSet::new();
    // This pass's own reservations, by vCluster: hard quotas count them.
    let mut pending: BTreeMap<String, VcLoad> = BTreeMap::new();
    // Whether to go on down this gang's stream: false once its shape cannot
    // be placed; a gang held back by its vCluster's quota does not stop the
    // others (of other vClusters) behind it.
    let mut try_gang = |a: &Allocation, plan: &mut AdmissionPlan, capacity: &mut Overlay| -> bool {
        plan.stats.gangs_considered += 1;
        let shape = Shape::of(a);
        if failed_shapes.contains(&shape) {
            return false;
        }
        let quota = state.has_quota(&a.spec.vcluster);
        let over_quota = |slots: &[NodeSlot]| {
            quota.then(|| state.quota_excess(a, slots, pending.get(&a.spec.vcluster), &[])).flatten()
        };
        if over_quota(&[]).is_some() {
            plan.stats.quota_waits += 1;
            return true;
        }
        let need = a.spec.resources;
        let n = a.spec.gang_size as usize;
        nodes.clear();
        // After a watchdog trip, elsewhere if it can be; the same node if not.
        let placed = need.gpus <= capacity.max_free_gpus()
            && ((!a.avoid_nodes.is_empty() && capacity.find(&need, n, &a.avoid_nodes, &mut nodes)) || {
                nodes.clear();
                capacity.find(&need, n, &[], &mut nodes)
            });
        if !placed {
            failed_shapes.insert(shape);
            return false;
        }
        if over_quota(&nodes).is_some() {
            plan.stats.quota_waits += 1;
            return true;
        }
        if quota {
            pending.entry(a.spec.vcluster.clone()).or_default().add_gang(a, &nodes);
        }
        let usage = Usage::of(&need);
        for &slot in &nodes {
            capacity.take(slot, &usage);
        }
        plan.commands.push(Command::ReserveGang {
            alloc: a.id,
            epoch: a.reservation_epoch + 1,
            nodes: nodes.iter().map(|&s| state.node(s).id.clone()).collect(),
        });
        plan.stats.gangs_placed += 1;
        plan.stats.tasks_placed += nodes.len();
        true
    };
    match cfg.order {
        Order::LargestFirst => {
            // One stream per queued shape, plus one for the gangs this pass's
            // rollbacks requeued, merged in admission order. A shape that
            // fails once is dropped whole, so a pass costs O(shapes + gangs
            // placed), not O(queue).
            let groups: Vec<&BTreeSet<QueueKey>> = state.queue_by_shape().values().collect();
            let extra: Vec<QueueKey> = requeued.into_iter().collect();
            let extra_stream = groups.len();
            let mut extra_pos = 0;
            let mut heads: BinaryHeap<Reverse<(QueueKey, usize)>> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| g.first().map(|&k| Reverse((k, i))))
                .chain(extra.first().map(|&k| Reverse((k, extra_stream))))
                .collect();
            while let Some(Reverse((key, stream))) = heads.pop() {
                let a = state.alloc(key.alloc).expect("queue names a known allocation");
                let placed = try_gang(a, &mut plan, &mut capacity);
                let next = if stream == extra_stream {
                    extra_pos += 1;
                    extra.get(extra_pos).copied()
                } else if placed {
                    groups[stream].range((Excluded(key), Unbounded)).next().copied()
                } else {
                    None
                };
                if let Some(k) = next {
                    heads.push(Reverse((k, stream)));
                }
            }
        }
        Order::Fifo => {
            let extra: BTreeSet<AllocId> = requeued.iter().map(|k| k.alloc).collect();
            for id in merge_sorted(state.queue_fifo(), extra.iter().copied()) {
                let a = state.alloc(id).expect("queue names a known allocation");
                if !try_gang(a, &mut plan, &mut capacity) {
                    break;
                }
            }
        }
    }
    plan
}

/// Merges two ascending iterators into one ascending iterator.
fn merge_sorted<T: Ord, A: Iterator<Item = T>, B: Iterator<Item = T>>(a: A, b: B) -> MergeSorted<A, B> {
    MergeSorted { a: a.peekable(), b: b.peekable() }
}

struct MergeSorted<A: Iterator, B: Iterator> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<T: Ord, A: Iterator<Item = T>, B: Iterator<Item = T>> Iterator for MergeSorted<A, B> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if y < x => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

/// Free capacity as this pass sees it: a copy of the state's free-GPU index
/// (one O(nodes) copy per pass, never per gang), kept in step as the pass
/// takes and gives capacity, and the free consumables of the nodes changed.
struct Overlay<'a> {
    state: &'a State,
    /// Ready nodes by (free GPUs, slot), as of this point of the pass.
    index: BTreeSet<(u32, NodeSlot)>,
    /// Free consumables of the nodes this pass changed.
    touched: BTreeMap<NodeSlot, Usage>,
}

impl<'a> Overlay<'a> {
    fn new(state: &'a State) -> Self {
        Overlay { state, index: state.free_gpu_index().clone(), touched: BTreeMap::new() }
    }

    fn free(&self, slot: NodeSlot) -> Usage {
        self.touched.get(&slot).copied().unwrap_or_else(|| self.state.node(slot).free())
    }

    fn set_free(&mut self, slot: NodeSlot, free: Usage) {
        let before = self.free(slot);
        self.index.remove(&(before.gpus, slot));
        self.touched.insert(slot, free);
        if self.state.node(slot).status == NodeStatus::Ready && self.state.held_for(slot).is_none() {
            self.index.insert((free.gpus, slot));
        }
    }

    fn take(&mut self, slot: NodeSlot, usage: &Usage) {
        let free = self.free(slot);
        debug_assert!(free.covers(usage), "admission took more than a node had free");
        self.set_free(slot, free.minus(usage));
    }

    fn give(&mut self, slot: NodeSlot, usage: &Usage) {
        let free = self.free(slot);
        self.set_free(slot, free.plus(usage));
    }

    /// The most free GPUs on any ready node.
    fn max_free_gpus(&self) -> u32 {
        self.index.last().map_or(0, |&(g, _)| g)
    }

    /// Collects `n` distinct ready nodes, none in `avoid` (sorted), that
    /// can each take one task of `need`, preferring the fewest free GPUs
    /// (best fit). False if there are fewer than `n`.
    fn find(&self, need: &Resources, n: usize, avoid: &[NodeSlot], out: &mut Vec<NodeSlot>) -> bool {
        for &(_, slot) in self.index.range((need.gpus, NodeSlot(0))..) {
            if avoid.binary_search(&slot).is_ok() {
                continue;
            }
            let node = self.state.node(slot);
            if fits(need, &node.resources, &self.free(slot)) {
                out.push(slot);
                if out.len() == n {
                    return true;
                }
            }
        }
        false
    }
}
