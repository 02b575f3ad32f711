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
//!      (a gang that failed waits out its back-off, `retry_after_ms`:
//!       skipped, not blocking the line)
//!   3. place each gang on distinct ready nodes with room for one task each,
//!      counting reserved and running tasks as used, best fit on GPUs, and
//!      subtract it before the next gang (a gang retried after a watchdog
//!      trip goes first in its class and avoids the nodes it tripped on when
//!      it can)
//!   4. backfill (on by default): the first gang of each vCluster that finds
//!      no room gets a planned start (`backfill::project`: when its nodes
//!      have room if running work ends at its walltime); a later gang may
//!      use one of the planned nodes only if its own walltime ends by then.
//!      A waiting dependent takes its rank in the walk too: if it comes
//!      first, its home's planned start is its own, no earlier than its
//!      dependencies' release (when what it waits for reaches its walltime)
//!   5. borrowing: gangs that found no room at home top their home nodes up
//!      with other vClusters' idle ones, cheapest to preempt first
//! ```
//!
//! Capacity comes from the state's free-GPU index (ready nodes ordered by
//! free GPUs). Nodes this pass has already used live in a small overlay with
//! its own index (`capacity.rs`, which also places gangs with constraints or
//! packing), so a pass never rescans the whole node table: a gang costs
//! O(log nodes + nodes looked at). A shape (gang size, resources, placement)
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

use super::backfill::{PendingEnds, PlannedStart, dependencies_release_ms, project};
use super::capacity::Overlay;
use crate::sm::{
    AllocId, Allocation, CheckpointMode, Command, NodeSlot, QueueKey, Shape, State, TaskStatus, Usage, VcLoad, Wait,
    WaitHolder, WaitNote,
};

mod waits;

pub use waits::MAX_FOLLOWER_NOTES;

/// In which order queued gangs are tried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Largest gang first, then class, priority and submit time; a gang that
    /// does not fit is skipped and smaller ones are still tried.
    #[default]
    LargestFirst,
    /// Strictly by submit time; without backfill the pass stops at the
    /// first gang that does not fit (head-of-line blocking, a baseline to
    /// compare against); with it, that gang gets a planned start and later
    /// ones run only if they end by then (EASY backfill).
    Fifo,
}

/// Which value of a packing label a packed gang takes, of those with room
/// for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackChoice {
    /// The one with the fewest nodes with enough free GPUs for a task, so the
    /// values with the most room stay whole for larger gangs.
    #[default]
    Tightest,
    /// The first to have room in best-fit order (a baseline to compare
    /// against: it breaks up whichever rack comes first).
    FirstFit,
}

/// The knobs of the admission cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// How long a reservation may stay unclaimed before it is rolled back.
    pub stale_reservation_ms: u64,
    /// The order gangs are tried in.
    pub order: Order,
    /// EASY backfill: the first gang of each vCluster that does not fit gets
    /// a planned start, and later gangs may use its planned nodes only if
    /// their walltime ends by then. Off: a gang that does not fit is simply
    /// skipped (largest-first) or stops the pass (FIFO).
    pub backfill: bool,
    /// Which rack (value of its packing label) a packed gang takes.
    pub pack_choice: PackChoice,
    /// Record why gangs wait: a gang the pass looks at and cannot place
    /// whose reason changed is named in one `NoteWaits` entry at the end of
    /// the plan (`explain`'s wait timeline).
    pub note_waits: bool,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            stale_reservation_ms: 30_000,
            order: Order::LargestFirst,
            backfill: true,
            pack_choice: PackChoice::Tightest,
            note_waits: true,
        }
    }
}

/// Counters of one pass, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Gangs looked at.
    pub gangs_considered: usize,
    /// Gangs held back by their vCluster's hard quota.
    pub quota_waits: usize,
    /// Gangs that failed and wait out their back-off.
    pub backoff_waits: usize,
    /// Gangs that found room but no node among their places with the
    /// rendezvous ports they ask for free.
    pub port_waits: usize,
    /// Gangs placed.
    pub gangs_placed: usize,
    /// Of those, gangs placed partly or wholly on borrowed nodes.
    pub gangs_borrowing: usize,
    /// Tasks placed (the sum of placed gangs' sizes).
    pub tasks_placed: usize,
    /// Planned starts made for gangs that found no room (backfill).
    pub planned_starts: usize,
    /// Gangs placed after a planned start was made: they ran ahead of a
    /// blocked gang without delaying it.
    pub backfilled: usize,
    /// Gangs that would fit now, but only on nodes a planned start needs
    /// before their walltime ends.
    pub held_for_planned: usize,
    /// Reservations rolled back.
    pub rollbacks: usize,
    /// Gangs whose reason to wait changed (noted in the plan).
    pub wait_notes: usize,
}

/// What one admission pass decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// Commands to propose, in order (rollbacks first).
    pub commands: Vec<Command>,
    /// What the pass did.
    pub stats: PassStats,
    /// The planned starts backfill protected in this pass, at most one per
    /// vCluster home, in the order they were made.
    pub planned: Vec<PlannedStart>,
}

/// Runs one admission pass over `state` at `now_ms`.
pub fn plan_admission(state: &State, now_ms: u64, cfg: &AdmissionConfig) -> AdmissionPlan {
    let mut plan = AdmissionPlan::default();
    let mut capacity = Overlay::new(state, cfg.pack_choice);

    // 1. Stale reservations. In a gang with a started task the rollback
    //    starts a teardown of the running tasks instead (the gang is not
    //    queued again in this pass: it waits for them to stop).
    let mut requeued = BTreeSet::new();
    let mut rolled_back = BTreeSet::new();
    // GPUs of demand that leave each vCluster when a rollback fails its gang:
    // a borrow limit is checked as it will be when the pass applies.
    let mut demand_gone: BTreeMap<String, u64> = BTreeMap::new();
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
        if a.tasks[0].status == TaskStatus::Reserved {
            capacity.give_ports(a.tasks[0].node.expect("a reserved task has a node"), a.ports.len() as u32);
        }
        plan.commands.push(Command::RollbackGang { alloc: id, epoch: a.reservation_epoch });
        plan.stats.rollbacks += 1;
        rolled_back.insert(id);
        // A gang with a finished task fails on rollback instead of requeueing.
        let finished = a.tasks.iter().any(|t| t.status == TaskStatus::Done);
        if !a.has_running() && !finished {
            requeued.insert(QueueKey::of(a));
        } else if !a.has_running() {
            *demand_gone.entry(a.spec.vcluster.clone()).or_default() +=
                u64::from(a.spec.gang_size) * u64::from(a.spec.resources.gpus);
        }
    }

    // 2 and 3. Walk the queue and place, each gang on its vCluster's home
    //    nodes and shared ones.
    let mut pass = Pass::new(state, now_ms, cfg.backfill, rolled_back);
    pass.note_waits = cfg.note_waits;
    pass.demand_gone = demand_gone;
    // Waiting dependents whose release is known, in the walk's order: each
    // is offered its home's planned start when the walk reaches its rank.
    let mut dependents = pass.dependents(cfg.order).into_iter().peekable();
    match cfg.order {
        Order::LargestFirst => {
            // One stream per (vCluster, queued shape), plus one for the gangs
            // this pass's rollbacks requeued, merged in admission order with
            // the fair-share rank between priority and submit time. A stream
            // whose gang does not fit is dropped whole, so a pass costs
            // O(streams + gangs placed), not O(queue).
            let groups: Vec<(&(u32, Shape), &BTreeSet<QueueKey>)> = state.queue_by_shape().iter().collect();
            let extra: Vec<QueueKey> = requeued.into_iter().collect();
            let extra_stream = groups.len();
            let mut extra_pos = 0;
            let home_of = |stream: usize, key: &QueueKey| {
                if stream == extra_stream {
                    state.home_key(&state.alloc(key.alloc).expect("queued").spec.vcluster)
                } else {
                    groups[stream].0.0
                }
            };
            let mut heads: BinaryHeap<Reverse<(PassKey, usize)>> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, (_, g))| g.first().map(|&k| (k, i)))
                .chain(extra.first().map(|&k| (k, extra_stream)))
                .map(|(k, i)| Reverse((pass.key(k, home_of(i, &k)), i)))
                .collect();
            // Streams whose gang found no room at home, from that gang on:
            // candidates for borrowing once the walk is done.
            let mut short: Vec<(usize, QueueKey)> = Vec::new();
            // Gangs that would fit at home but for a planned start.
            let mut held: Vec<QueueKey> = Vec::new();
            while let Some(Reverse((key, stream))) = heads.pop() {
                // Usage only grows during the walk: a head ranked before this
                // pass placed more of its vCluster's work is ranked again.
                let home = home_of(stream, &key.queue);
                let fresh = pass.key(key.queue, home);
                if fresh != key {
                    heads.push(Reverse((fresh, stream)));
                    continue;
                }
                while let Some((_, d, release)) = dependents.next_if(|(k, _, _)| *k < fresh) {
                    pass.plan_dependent(d, release, &mut plan, &capacity);
                }
                let a = state.alloc(key.queue.alloc).expect("queue names a known allocation");
                let mut tried = pass.try_home(a, &mut plan, &mut capacity);
                if tried == Tried::Held && !pass.look_past_held() {
                    tried = Tried::NoRoom;
                }
                if stream != extra_stream {
                    if tried == Tried::NoRoom {
                        // The rest of the stream waits for the same reason.
                        let rest = groups[stream].1.range((Excluded(key.queue), Unbounded));
                        pass.note_followers(a, rest.take(MAX_FOLLOWER_NOTES).map(|k| k.alloc));
                    }
                    match tried {
                        Tried::NoRoom => short.push((stream, key.queue)),
                        Tried::Held => held.push(key.queue),
                        _ => {}
                    }
                }
                let next = if stream == extra_stream {
                    extra_pos += 1;
                    extra.get(extra_pos).copied()
                } else if tried != Tried::NoRoom {
                    groups[stream].1.range((Excluded(key.queue), Unbounded)).next().copied()
                } else {
                    None
                };
                if let Some(k) = next {
                    heads.push(Reverse((pass.key(k, home_of(stream, &k)), stream)));
                }
            }
            for (_, d, release) in dependents {
                pass.plan_dependent(d, release, &mut plan, &capacity);
            }
            // 4. Borrowing: gangs that found no room at home, of vClusters
            //    that may borrow, on other vClusters' idle nodes; cheapest to
            //    preempt first (lower class, then able to checkpoint), since
            //    the lender takes its nodes back by preempting them.
            let mut borrowers: Vec<&Allocation> = Vec::new();
            for k in held {
                if borrowers.len() == MAX_BORROW_CANDIDATES {
                    break;
                }
                let a = state.alloc(k.alloc).expect("queue names a known allocation");
                if state.borrow_limit_gpus(&a.spec.vcluster).is_some() && a.spec.never_preempted().is_none() {
                    borrowers.push(a);
                }
            }
            for &(stream, from) in &short {
                let ((home, _), group) = groups[stream];
                let Some(name) = state.home_name(*home) else { continue };
                if state.borrow_limit_gpus(name).is_none() {
                    continue;
                }
                for k in group.range(from..) {
                    if borrowers.len() == MAX_BORROW_CANDIDATES {
                        break;
                    }
                    let a = state.alloc(k.alloc).expect("queue names a known allocation");
                    if a.spec.never_preempted().is_none() {
                        borrowers.push(a);
                    }
                }
            }
            borrowers
                .sort_by_key(|a| (a.spec.preemption_class, a.spec.checkpoint == CheckpointMode::None, QueueKey::of(a)));
            for a in borrowers {
                pass.try_borrow(a, &mut plan, &mut capacity);
            }
        }
        Order::Fifo => {
            let extra: BTreeSet<AllocId> = requeued.iter().map(|k| k.alloc).collect();
            for id in merge_sorted(state.queue_fifo(), extra.iter().copied()) {
                let a = state.alloc(id).expect("queue names a known allocation");
                while let Some((_, d, release)) = dependents.next_if(|(k, _, _)| k.queue.alloc < id) {
                    pass.plan_dependent(d, release, &mut plan, &capacity);
                }
                let tried = pass.try_home(a, &mut plan, &mut capacity);
                // Without backfill the first misfit stops the pass; with it,
                // later gangs run if they do not delay the planned start.
                if matches!(tried, Tried::NoRoom | Tried::Held) && !(cfg.backfill && pass.look_past_held()) {
                    break;
                }
            }
        }
    }
    plan.planned = pass.planned;
    if !pass.notes.is_empty() {
        plan.stats.wait_notes = pass.notes.len();
        plan.commands.push(Command::NoteWaits { notes: pass.notes });
    }
    plan
}

/// Most waiting dependents one pass looks at for a planned start (the
/// oldest): a dependent's release is known only once what it waits for is
/// placed, and a long tail of waiting work must not make every pass slow.
pub const MAX_DEPENDENT_LOOKS: usize = 256;

/// Most queued gangs one pass looks at for borrowing.
pub const MAX_BORROW_CANDIDATES: usize = 1024;

/// Most gangs one pass looks at without placing them once backfill has made
/// a planned start (the walk goes on past a misfit to find gangs that end in
/// time; this bounds what a long queue of misfits costs).
pub const MAX_BACKFILL_LOOKS: usize = 1024;

/// A gang's rank in one pass: its queue key with the fair-share rank of its
/// vCluster between priority and submit time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PassKey {
    gang_size: Reverse<u32>,
    class: Reverse<u8>,
    retry_first: Reverse<bool>,
    priority: Reverse<i32>,
    /// The vCluster's usage against its share, ×10⁶: lower goes first.
    share_used: u64,
    submit_time_ms: u64,
    queue: QueueKey,
}

/// A node a planned start needs: when, for whom.
#[derive(Clone, Copy, Debug)]
struct Planned {
    start_ms: u64,
    alloc: AllocId,
    class: u8,
}

impl Planned {
    /// Whether gang `a`, ending at `end_ms` if placed now, may take the node:
    /// it is the planned gang's own, or it ends by the planned start, or it
    /// is of a higher class (which may preempt the planned gang's class
    /// anyway, so a lower-class plan does not hold it back).
    fn lets(&self, a: &Allocation, end_ms: u64) -> bool {
        end_ms <= self.start_ms || self.alloc == a.id || a.spec.preemption_class > self.class
    }
}

/// What trying a gang came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tried {
    /// Reserved.
    Placed,
    /// Held back by its vCluster's quota: others of its stream may still go.
    Skipped,
    /// No room on its nodes: the rest of its stream cannot fit either.
    NoRoom,
    /// Room only on nodes a planned start needs before its walltime ends:
    /// a gang of the same shape that ends sooner may still go.
    Held,
}

/// The state one pass keeps while it walks the queue.
struct Pass<'a> {
    state: &'a State,
    /// (home key, shape) pairs that found no room at home in this pass…
    failed: BTreeSet<(u32, Shape)>,
    /// …and none with borrowed nodes either.
    failed_borrow: BTreeSet<(u32, Shape)>,
    /// This pass's own reservations, by vCluster: hard quotas count them.
    pending: BTreeMap<String, VcLoad>,
    /// GPUs this pass reserved on borrowed nodes, by vCluster home key.
    pending_borrowed: BTreeMap<u32, u64>,
    /// GPUs of demand this pass's rollbacks remove, by vCluster.
    demand_gone: BTreeMap<String, u64>,
    /// The pass's time: gangs placed now are expected to end at this plus
    /// their walltime.
    now_ms: u64,
    /// Whether to make planned starts (EASY backfill).
    backfill: bool,
    /// Planned starts made, at most one per home key…
    planned: Vec<PlannedStart>,
    planned_homes: BTreeSet<u32>,
    /// …and the nodes they need, each with the planned start it waits for,
    /// whose it is and that gang's class.
    needed: BTreeMap<NodeSlot, Planned>,
    /// Expected ends of this pass's own placements, per node.
    ends: PendingEnds,
    /// (home key, shape, class) → the earliest expected end that found room
    /// only on needed nodes (a later end of the same class finds no more),
    /// and the planned gang that needs them.
    held_from: BTreeMap<(u32, Shape, u8), (u64, AllocId)>,
    /// (home key, shape) pairs whose planned start cannot be made (too few
    /// nodes could ever take them).
    unplannable: BTreeSet<(u32, Shape)>,
    /// Gangs this pass rolled back: their capacity is already free in the
    /// overlay.
    rolled_back: BTreeSet<AllocId>,
    /// Gangs the walk may still look at without placing (backfill).
    looks_left: usize,
    /// GPUs each vCluster holds (by home key), this pass's included.
    used: Vec<u64>,
    /// Each vCluster's share in GPUs (by home key): its GPU quota if it has
    /// one, else the GPUs of its home nodes (at least 1).
    share: Vec<u64>,
    nodes: Vec<NodeSlot>,
    /// Whether to note why gangs wait.
    note_waits: bool,
    /// The notes made.
    notes: Vec<WaitNote>,
    /// Why each (home key, shape) that found no room waits, once named.
    shape_wait: BTreeMap<(u32, Shape), (Wait, Vec<WaitHolder>)>,
    /// Each over-quota vCluster's largest holders, once looked up.
    quota_holders: BTreeMap<String, Vec<WaitHolder>>,
    /// The gangs this pass placed, by node (kept only when noting waits):
    /// they hold capacity a later gang's planned start waits for.
    placed_on: BTreeMap<NodeSlot, Vec<AllocId>>,
}

impl<'a> Pass<'a> {
    fn new(state: &'a State, now_ms: u64, backfill: bool, rolled_back: BTreeSet<AllocId>) -> Pass<'a> {
        let keys = state.home_keys() as usize;
        let mut used = vec![0; keys];
        let mut share = vec![0; keys];
        for node in state.nodes().iter().filter(|n| n.status.may_hold_work()) {
            share[state.node_home(node.slot) as usize] += u64::from(node.resources.gpus);
        }
        for k in 1..keys as u32 {
            let name = state.home_name(k).expect("every key names a vCluster");
            used[k as usize] = state.vcluster_load(name).map_or(0, |l| l.gpus);
            if let Some(max) = state.gpu_quota(name) {
                share[k as usize] = u64::from(max);
            }
        }
        for s in &mut share {
            *s = (*s).max(1);
        }
        Pass {
            state,
            failed: BTreeSet::new(),
            failed_borrow: BTreeSet::new(),
            pending: BTreeMap::new(),
            pending_borrowed: BTreeMap::new(),
            demand_gone: BTreeMap::new(),
            now_ms,
            backfill,
            planned: Vec::new(),
            planned_homes: BTreeSet::new(),
            needed: BTreeMap::new(),
            ends: PendingEnds::new(),
            held_from: BTreeMap::new(),
            unplannable: BTreeSet::new(),
            rolled_back,
            looks_left: MAX_BACKFILL_LOOKS,
            used,
            share,
            nodes: Vec::new(),
            note_waits: false,
            notes: Vec::new(),
            shape_wait: BTreeMap::new(),
            quota_holders: BTreeMap::new(),
            placed_on: BTreeMap::new(),
        }
    }

    /// The rank of queued gang `k` of the vCluster with home key `home`.
    fn key(&self, k: QueueKey, home: u32) -> PassKey {
        let h = home as usize;
        PassKey {
            gang_size: k.gang_size,
            class: k.class,
            retry_first: k.retry_first,
            priority: k.priority,
            share_used: self.used.get(h).map_or(0, |u| u.saturating_mul(1_000_000) / self.share[h]),
            submit_time_ms: k.submit_time_ms,
            queue: k,
        }
    }

    /// Whether `a` waits for its vCluster's hard quota with the pass's own
    /// reservations counted (`slots`: where it would go).
    fn over_quota(&self, a: &Allocation, slots: &[NodeSlot]) -> bool {
        self.state.has_quota(&a.spec.vcluster)
            && self.state.quota_excess(a, slots, self.pending.get(&a.spec.vcluster), &[]).is_some()
    }

    /// When `a` is expected to end if placed now.
    fn end_of(&self, a: &Allocation) -> u64 {
        self.now_ms.saturating_add(a.spec.walltime_s.saturating_mul(1000))
    }

    /// Whether the walk may look at one more gang it cannot place (backfill
    /// goes past misfits, at most `MAX_BACKFILL_LOOKS` per pass).
    fn look_past_held(&mut self) -> bool {
        if self.looks_left == 0 {
            return false;
        }
        self.looks_left -= 1;
        true
    }

    /// Tries `a` on its vCluster's home nodes and shared ones.
    fn try_home(&mut self, a: &Allocation, plan: &mut AdmissionPlan, capacity: &mut Overlay) -> Tried {
        plan.stats.gangs_considered += 1;
        if a.retry_after_ms > self.now_ms {
            plan.stats.backoff_waits += 1;
            self.note(a, Wait::Backoff, |_| Vec::new());
            return Tried::Skipped;
        }
        let home = self.state.home_key(&a.spec.vcluster);
        let shape = (home, Shape::of(a));
        if self.failed.contains(&shape) {
            if let Some((wait, holders)) = self.shape_wait.get(&shape).cloned() {
                self.note(a, wait, |_| holders);
            }
            return Tried::NoRoom;
        }
        let end = self.end_of(a);
        let held_key = (home, shape.1, a.spec.preemption_class);
        if let Some(&(_, by)) = self.held_from.get(&held_key).filter(|&&(e, _)| end >= e) {
            plan.stats.held_for_planned += 1;
            self.note(a, Wait::PlannedStart, |p| vec![p.state.wait_holder(by)]);
            return Tried::Held;
        }
        if self.over_quota(a, &[]) {
            plan.stats.quota_waits += 1;
            self.note(a, Wait::Quota, |p| p.quota_holders(a));
            return Tried::Skipped;
        }
        let need = a.spec.resources;
        let homes = [home, 0];
        self.nodes.clear();
        // A node a planned start needs only if this gang ends by then.
        let needed = &self.needed;
        let in_time = |slot: NodeSlot| needed.get(&slot).is_none_or(|p| p.lets(a, end));
        let avoid = &a.avoid_nodes;
        // After a watchdog trip, elsewhere if it can be; the same node if not.
        let placed = need.gpus <= capacity.max_free_gpus(&homes)
            && ((!avoid.is_empty()
                && capacity.place(a, &homes, &mut self.nodes, |s| in_time(s) && avoid.binary_search(&s).is_err()))
                || {
                    self.nodes.clear();
                    capacity.place(a, &homes, &mut self.nodes, in_time)
                });
        if !placed {
            // Room, but only on nodes a planned start needs?
            let held = !self.needed.is_empty() && {
                self.nodes.clear();
                need.gpus <= capacity.max_free_gpus(&homes) && capacity.place(a, &homes, &mut self.nodes, |_| true)
            };
            if held {
                // The planned gang that needs a node it would take.
                let needed = &self.needed;
                let by = self.nodes.iter().find_map(|s| needed.get(s).filter(|p| !p.lets(a, end)).map(|p| p.alloc));
                let by = by.unwrap_or(a.id);
                let e = self.held_from.entry(held_key).or_insert((end, by));
                *e = (*e).min((end, by));
                plan.stats.held_for_planned += 1;
                self.note(a, Wait::PlannedStart, |p| vec![p.state.wait_holder(by)]);
            } else {
                self.failed.insert(shape);
            }
            self.plan_start(a, self.now_ms, plan, capacity);
            if !held && self.may_note(a) {
                let (wait, holders) = self.why_no_room(a, shape, capacity);
                self.shape_wait.insert(shape, (wait, holders.clone()));
                self.note(a, wait, |_| holders);
            }
            return if held { Tried::Held } else { Tried::NoRoom };
        }
        if self.over_quota(a, &self.nodes) {
            plan.stats.quota_waits += 1;
            self.note(a, Wait::Quota, |p| p.quota_holders(a));
            return Tried::Skipped;
        }
        if !self.port_first(a, capacity) {
            plan.stats.port_waits += 1;
            self.note(a, Wait::Ports, |_| Vec::new());
            return Tried::Skipped;
        }
        self.reserve(a, plan, capacity, 0);
        if !self.planned.is_empty() {
            plan.stats.backfilled += 1;
        }
        Tried::Placed
    }

    /// The waiting dependents this pass may plan (at most
    /// `MAX_DEPENDENT_LOOKS`, oldest first, with backfill on): those whose
    /// release is known, with it, in the walk's order (largest-first: by
    /// their rank at the start of the pass; FIFO: by id).
    fn dependents(&self, order: Order) -> Vec<(PassKey, &'a Allocation, u64)> {
        if !self.backfill {
            return Vec::new();
        }
        let state = self.state;
        let mut out: Vec<(PassKey, &'a Allocation, u64)> = state
            .waiting()
            .take(MAX_DEPENDENT_LOOKS)
            .filter_map(|id| {
                let a = state.alloc(id).expect("index names a known allocation");
                let release = dependencies_release_ms(state, &a.spec.after, self.now_ms)?;
                Some((self.key(QueueKey::of(a), state.home_key(&a.spec.vcluster)), a, release))
            })
            .collect();
        match order {
            Order::LargestFirst => out.sort_unstable_by_key(|&(k, _, _)| k),
            Order::Fifo => out.sort_unstable_by_key(|&(k, _, _)| k.queue.alloc),
        }
        out
    }

    /// Offers waiting dependent `a` its home's planned start, no earlier
    /// than its dependencies' release (unless its quota holds it back now).
    fn plan_dependent(&mut self, a: &Allocation, release_ms: u64, plan: &mut AdmissionPlan, capacity: &Overlay) {
        if !self.over_quota(a, &[]) {
            self.plan_start(a, release_ms, plan, capacity);
        }
    }

    /// Makes the planned start of `a`, the first gang of its home the pass
    /// cannot place (backfill), no earlier than `not_before_ms`: from the
    /// overlay's free capacity and what each holder of the home's other
    /// nodes frees at the end of its walltime. Nodes an earlier planned start
    /// needs are left out.
    fn plan_start(&mut self, a: &Allocation, not_before_ms: u64, plan: &mut AdmissionPlan, capacity: &Overlay) {
        let home = self.state.home_key(&a.spec.vcluster);
        let shape = (home, Shape::of(a));
        if !self.backfill || self.planned_homes.contains(&home) || self.unplannable.contains(&shape) {
            return;
        }
        let needed = &self.needed;
        let placement = &a.spec.placement;
        let state = self.state;
        let nodes = capacity
            .nodes_of(&[home, 0], 0)
            .filter(|s| !needed.contains_key(s))
            .filter(|&s| placement.is_any() || placement.admits(&state.node(s).labels))
            .map(|s| (s, capacity.free(s)));
        let rolled_back = &self.rolled_back;
        let projected = project(
            self.state,
            &a.spec.resources,
            a.spec.gang_size as usize,
            self.now_ms,
            not_before_ms,
            nodes,
            &self.ends,
            |id| rolled_back.contains(&id),
        );
        let Some((start_ms, nodes)) = projected else {
            self.unplannable.insert(shape);
            return;
        };
        for &slot in &nodes {
            self.needed.insert(slot, Planned { start_ms, alloc: a.id, class: a.spec.preemption_class });
        }
        self.planned_homes.insert(home);
        self.planned.push(PlannedStart { alloc: a.id, start_ms, nodes });
        plan.stats.planned_starts += 1;
    }

    /// Tries `a` on its home and shared nodes topped up with other
    /// vClusters' idle ones (`State::lendable`), within its borrow limit.
    fn try_borrow(&mut self, a: &Allocation, plan: &mut AdmissionPlan, capacity: &mut Overlay) {
        let state = self.state;
        let home = state.home_key(&a.spec.vcluster);
        let shape = (home, Shape::of(a));
        if self.failed_borrow.contains(&shape) || self.over_quota(a, &[]) || a.retry_after_ms > self.now_ms {
            return;
        }
        let need = a.spec.resources;
        let n = a.spec.gang_size as usize;
        let end = self.end_of(a);
        let needed = &self.needed;
        let in_time = |slot: NodeSlot| needed.get(&slot).is_none_or(|p| p.lets(a, end));
        self.nodes.clear();
        // Home first (it fails alone: the walk tried), then lenders.
        let placement = &a.spec.placement;
        let admits = |slot: NodeSlot| placement.is_any() || placement.admits(&state.node(slot).labels);
        capacity.find_where(&need, n, &[home, 0], &mut self.nodes, |s| in_time(s) && admits(s));
        let lenders: Vec<u32> = (1..state.home_keys()).filter(|&k| k != home && state.queued_in(k) == 0).collect();
        let at_home = self.nodes.len();
        if !capacity.find_where(&need, n, &lenders, &mut self.nodes, |slot| {
            state.lendable(slot) && in_time(slot) && admits(slot)
        }) {
            // Fewer free nodes now than this shape needs: so for the rest.
            self.failed_borrow.insert(shape);
            return;
        }
        // Borrowed capacity is a top-up wherever it is: a gang that must be
        // packed borrows only when the top-up happens to share its value.
        if let Some(p) = placement.pack_by.as_ref().filter(|p| p.required) {
            let first = state.node(self.nodes[0]).labels.get(&p.key);
            if self.nodes.iter().any(|&s| state.node(s).labels.get(&p.key) != first) {
                return;
            }
        }
        let borrowed = (self.nodes.len() - at_home) as u64 * u64::from(need.gpus);
        let pending = self.pending_borrowed.get(&home).copied().unwrap_or(0);
        let gone = self.demand_gone.get(&a.spec.vcluster).copied().unwrap_or(0);
        if self.over_quota(a, &self.nodes) || state.borrow_excess(a, &self.nodes, pending, gone).is_some() {
            return;
        }
        if !self.port_first(a, capacity) {
            plan.stats.port_waits += 1;
            return;
        }
        self.reserve(a, plan, capacity, borrowed);
        plan.stats.gangs_borrowing += 1;
    }

    /// Puts first (task 0's place) a node of `self.nodes` with the
    /// rendezvous ports `a` asks for free; false if none has them.
    fn port_first(&mut self, a: &Allocation, capacity: &Overlay) -> bool {
        if a.spec.ports == 0 {
            return true;
        }
        match self.nodes.iter().position(|&s| capacity.free_ports(s) >= a.spec.ports) {
            Some(i) => {
                self.nodes.swap(0, i);
                true
            }
            None => false,
        }
    }

    /// Reserves `a` on `self.nodes` in the plan (task 0 on the first).
    fn reserve(&mut self, a: &Allocation, plan: &mut AdmissionPlan, capacity: &mut Overlay, borrowed_gpus: u64) {
        let state = self.state;
        let home = state.home_key(&a.spec.vcluster);
        if state.has_quota(&a.spec.vcluster) {
            self.pending.entry(a.spec.vcluster.clone()).or_default().add_gang(a, &self.nodes);
        }
        if borrowed_gpus > 0 {
            *self.pending_borrowed.entry(home).or_default() += borrowed_gpus;
        }
        if let Some(u) = self.used.get_mut(home as usize) {
            *u += u64::from(a.spec.resources.gpus) * self.nodes.len() as u64;
        }
        let usage = Usage::of(&a.spec.resources);
        let end = self.end_of(a);
        capacity.take_ports(self.nodes[0], a.spec.ports);
        if self.note_waits {
            for &slot in &self.nodes {
                self.placed_on.entry(slot).or_default().push(a.id);
            }
        }
        for &slot in &self.nodes {
            capacity.take(slot, &usage);
            if self.backfill {
                self.ends.entry(slot).or_default().push((end, usage));
            }
        }
        plan.commands.push(Command::ReserveGang {
            alloc: a.id,
            epoch: a.reservation_epoch + 1,
            nodes: self.nodes.iter().map(|&s| state.node(s).id.clone()).collect(),
        });
        plan.stats.gangs_placed += 1;
        plan.stats.tasks_placed += self.nodes.len();
    }
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
