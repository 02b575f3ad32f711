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

use std::collections::BTreeMap;

use crate::sm::{AllocId, AllocSpec, Allocation, Holder, NodeSlot, Resources, State, Usage, fits};

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
/// it now) can each take one task of `need`. Tasks of allocations in `skip`
/// are not counted (their capacity is already in `free`). `None` if fewer
/// than `n` ever can.
pub(crate) fn project(
    state: &State,
    need: &Resources,
    n: usize,
    now_ms: u64,
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
    ready.select_nth_unstable(n - 1);
    ready.truncate(n);
    let start = ready.iter().map(|&(t, _)| t).max().expect("n ≥ 1");
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
pub fn planned_start(state: &State, a: &Allocation, now_ms: u64) -> Option<PlannedStart> {
    if !a.is_queued() || a.nomination.is_some() {
        return None;
    }
    planned_start_of(state, &a.spec, a.id, now_ms)
}

/// [`planned_start`] of a spec, submitted as `alloc` or not yet (a dry run):
/// on its home and shared ready nodes that meet its placement.
pub fn planned_start_of(state: &State, spec: &AllocSpec, alloc: AllocId, now_ms: u64) -> Option<PlannedStart> {
    let homes = [state.home_key(&spec.vcluster), 0];
    let index = state.free_gpu_index();
    let placement = &spec.placement;
    let nodes = homes
        .iter()
        .flat_map(|&h| index.range((h, 0, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX))))
        .map(|&(_, _, slot)| slot)
        .filter(|&slot| placement.is_any() || placement.admits(&state.node(slot).labels))
        .map(|slot| (slot, state.node(slot).free()));
    let (start_ms, nodes) =
        project(state, &spec.resources, spec.gang_size as usize, now_ms, nodes, &PendingEnds::new(), |_| false)?;
    Some(PlannedStart { alloc, start_ms, nodes })
}
