//! EASY backfill's projection: when would a blocked gang start if every
//! task now holding capacity ran to the end of its walltime?
//!
//! ```text
//!   for each ready node of the gang's homes that could ever take a task:
//!     free now fits a task                → the node is ready now
//!     else add back what each holder frees, earliest expected end first,
//!          until a task fits              → the node is ready then
//!   planned start = the n-th earliest ready time (n = gang size)
//!   planned nodes = those n nodes (earliest ready, then slot)
//! ```
//!
//! A running task is expected to end at its start plus its walltime (the
//! budget watchdog stops it there), a reserved one at its reservation plus
//! its walltime, one being stopped now. The admission pass makes one planned
//! start per vCluster home for the first gang it cannot place, and lets a
//! later gang take one of the planned nodes only if that gang's own walltime
//! ends by the planned start: smaller jobs run ahead, but never late enough
//! to delay the reserved gang (as long as walltimes hold).
//!
//! A waiting dependent is planned the same way, no earlier than its
//! dependencies' release: when what it waits for reaches the end of its
//! walltime (`dependencies_release_ms`). Of the nodes ready by then, those
//! that free up last are planned, so nodes free now stay open to work that
//! ends in time.

use std::collections::BTreeMap;

use crate::sm::{
    After, AfterWhen, AllocId, AllocSpec, AllocStatus, Allocation, Dependency, Holder, NodeSlot, Resources, Standing,
    State, TaskStatus, Usage, fits,
};

/// When a blocked gang is planned to start, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedStart {
    /// The gang.
    pub alloc: AllocId,
    /// When its nodes have room, if running work ends at its walltime (ms).
    pub start_ms: u64,
    /// The nodes it is planned on, in slot order.
    pub nodes: Vec<NodeSlot>,
}

/// When a task holding capacity on a node is expected to give it back: at
/// the end of its walltime, or now if it is being stopped.
pub fn expected_end_ms(state: &State, h: &Holder, now_ms: u64) -> u64 {
    if state.is_tearing_down(h.alloc) { now_ms } else { h.walltime_ends_ms.max(now_ms) }
}

/// Expected releases on one node beyond what the state records: (end, usage)
/// of placements a pass made but has not committed.
pub type PendingEnds = BTreeMap<NodeSlot, Vec<(u64, Usage)>>;

/// Projects when `n` distinct nodes among `nodes` (each with what is free on
/// it now) can each take one task of `need`, no earlier than `not_before_ms`.
/// Tasks of allocations in `skip` are not counted (their capacity is already
/// in `free`). `None` if fewer than `n` ever can.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project(
    state: &State,
    need: &Resources,
    n: usize,
    now_ms: u64,
    not_before_ms: u64,
    nodes: impl Iterator<Item = (NodeSlot, Usage)>,
    pending: &PendingEnds,
    skip: impl Fn(AllocId) -> bool,
) -> Option<(u64, Vec<NodeSlot>)> {
    if n == 0 {
        return None;
    }
    let mut ready: Vec<(u64, NodeSlot)> = Vec::new();
    let mut releases: Vec<(u64, Usage)> = Vec::new();
    for (slot, free) in nodes {
        let node = state.node(slot);
        if !fits(need, &node.resources, &Usage::of(&node.resources)) {
            continue;
        }
        if fits(need, &node.resources, &free) {
            ready.push((now_ms, slot));
            continue;
        }
        releases.clear();
        for h in state.holders(slot) {
            if !skip(h.alloc) {
                releases.push((expected_end_ms(state, h, now_ms), h.usage));
            }
        }
        releases.extend(pending.get(&slot).into_iter().flatten().copied());
        releases.sort_unstable_by_key(|&(end, _)| end);
        let mut free = free;
        for &(end, usage) in &releases {
            free = free.plus(&usage);
            if fits(need, &node.resources, &free) {
                ready.push((end, slot));
                break;
            }
        }
    }
    if ready.len() < n {
        return None;
    }
    let by_then = ready.iter().filter(|&&(t, _)| t <= not_before_ms).count();
    if not_before_ms > now_ms && by_then >= n {
        // Every node ready by the start is as good: plan those that free up
        // last, and leave the ones free sooner to work that ends in time.
        ready.sort_unstable_by_key(|&(t, slot)| (t > not_before_ms, std::cmp::Reverse(t), slot));
    } else {
        ready.select_nth_unstable(n - 1);
    }
    ready.truncate(n);
    let start = ready.iter().map(|&(t, _)| t).max().expect("n ≥ 1").max(not_before_ms);
    let mut slots: Vec<NodeSlot> = ready.into_iter().map(|(_, s)| s).collect();
    slots.sort_unstable();
    Some((start, slots))
}

/// The planned start of queued allocation `a` on its vCluster's home and
/// shared nodes, from the state alone: the earliest its gang can start if
/// running and reserved work ends at its walltime and nothing queued ahead
/// of it is placed first. For the first gang of its vCluster that admission
/// cannot place, this is the start backfill protects. `None` if the ready
/// nodes can never hold it (or it is not queued).
///
/// A waiting dependent's planned start is no earlier than its dependencies'
/// release ([`dependencies_release_ms`]); `None` while that is not known.
pub fn planned_start(state: &State, a: &Allocation, now_ms: u64) -> Option<PlannedStart> {
    if a.status == AllocStatus::Waiting {
        let release = dependencies_release_ms(state, &a.spec.after, now_ms)?;
        return planned_start_after(state, &a.spec, a.id, now_ms, release);
    }
    if !a.is_queued() || a.nomination.is_some() {
        return None;
    }
    planned_start_of(state, &a.spec, a.id, now_ms)
}

/// When dependency `d` is expected to stand if what it waits for runs to the
/// end of its walltime: now if it stands; for `started`, now once its gang
/// is reserved; otherwise the end of its placed gang's walltime (now while
/// it is being stopped). `None` while it is not placed (or is an array, or
/// can never stand): its end is not known yet.
fn dependency_release_ms(state: &State, d: &Dependency, now_ms: u64) -> Option<u64> {
    match state.dependency_standing(d) {
        Standing::Met => return Some(now_ms),
        Standing::Never(_) => return None,
        Standing::Pending => {}
    }
    let dep = state.alloc(d.on)?;
    let placed = dep.tasks.iter().filter(|t| matches!(t.status, TaskStatus::Reserved | TaskStatus::Running));
    let begun = placed.filter_map(|t| t.started_at_ms.or(t.reserved_at_ms)).max()?;
    if d.when == AfterWhen::Started || state.is_tearing_down(dep.id) {
        return Some(now_ms);
    }
    Some(begun.saturating_add(dep.spec.walltime_s.saturating_mul(1000)).max(now_ms))
}

/// When a waiting allocation's dependencies stand if everything they wait
/// for runs to the end of its walltime, as backfill projects running work:
/// the last of them (with `any_of`, the first). `None` while one it needs
/// is not placed (its end is not known yet), or when none can be met.
pub fn dependencies_release_ms(state: &State, after: &After, now_ms: u64) -> Option<u64> {
    let ends = after.deps.iter().map(|d| dependency_release_ms(state, d, now_ms));
    if after.any_of { ends.flatten().min() } else { ends.collect::<Option<Vec<u64>>>()?.into_iter().max() }
}

/// [`planned_start`] of a spec, submitted as `alloc` or not yet (a dry run):
/// on its home and shared ready nodes that meet its placement.
pub fn planned_start_of(state: &State, spec: &AllocSpec, alloc: AllocId, now_ms: u64) -> Option<PlannedStart> {
    planned_start_after(state, spec, alloc, now_ms, now_ms)
}

/// [`planned_start_of`], no earlier than `not_before_ms`.
fn planned_start_after(
    state: &State,
    spec: &AllocSpec,
    alloc: AllocId,
    now_ms: u64,
    not_before_ms: u64,
) -> Option<PlannedStart> {
    let homes = [state.home_key(&spec.vcluster), 0];
    let index = state.free_gpu_index();
    let placement = &spec.placement;
    let nodes = homes
        .iter()
        .flat_map(|&h| index.range((h, 0, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX))))
        .map(|&(_, _, slot)| slot)
        .filter(|&slot| placement.is_any() || placement.admits(&state.node(slot).labels))
        .map(|slot| (slot, state.node(slot).free()));
    let (start_ms, nodes) = project(
        state,
        &spec.resources,
        spec.gang_size as usize,
        now_ms,
        not_before_ms,
        nodes,
        &PendingEnds::new(),
        |_| false,
    )?;
    Some(PlannedStart { alloc, start_ms, nodes })
}
