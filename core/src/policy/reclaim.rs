//! Elastic reclamation (the preemption-policy seed's trigger 2): a vCluster
//! whose idle home nodes were lent to others takes them back when its own
//! work needs them.
//!
//! ```text
//!   for each vCluster with borrowed work on its home nodes (home key order):
//!     its queued gangs, one per shape, in admission order, that
//!       - have waited the return grace (from when they were last queued),
//!       - are within their vCluster's hard quotas,
//!       - do not fit on its home and shared nodes as they are now
//!         (otherwise admission places them without anyone stopping):
//!     borrowers on those nodes, cheapest to preempt first (lower class,
//!     then able to checkpoint, then the preemption cost, then id), are
//!     added until the gang fits; any that turn out unneeded are dropped;
//!     one `Reclaim` per vCluster per pass.
//! ```
//!
//! The victims go through the same checkpoint-hint teardown as a priority
//! preemption (whatever their class: they ran on capacity that was never
//! theirs), counted as `reason="reclaim"`, and the nodes are held for the
//! home gang until they are free.

use std::collections::BTreeMap;

use crate::policy::preemption::{PreemptionConfig, score};
use crate::sm::{
    AllocId, Allocation, CheckpointMode, Command, NodeSlot, NodeStatus, QueueKey, Shape, State, TaskStatus, Usage, fits,
};

/// The seed's return grace: borrowed work keeps running this long after its
/// lender's gang starts waiting for the nodes.
pub const DEFAULT_RETURN_GRACE_MS: u64 = 60_000;

/// The reclamation knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimConfig {
    /// How long a home gang waits before borrowed work is preempted for it.
    pub return_grace_ms: u64,
    /// Most borrowing gangs one reclamation stops.
    pub max_victims: usize,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig { return_grace_ms: DEFAULT_RETURN_GRACE_MS, max_victims: 8 }
    }
}

/// One reclamation to propose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaim {
    /// The home vCluster's queued gang.
    pub alloc: AllocId,
    /// The borrowing gangs to stop, with the reservation epoch seen.
    pub victims: Vec<(AllocId, u64)>,
    /// The home gang's nodes, by task index.
    pub nodes: Vec<NodeSlot>,
}

impl Reclaim {
    /// The command for this reclamation.
    pub fn command(&self, state: &State, preemption: &PreemptionConfig) -> Command {
        Command::Reclaim {
            alloc: self.alloc,
            victims: self.victims.clone(),
            nodes: self.nodes.iter().map(|&s| state.node(s).id.clone()).collect(),
            hold_ms: preemption.hold_ms(),
        }
    }
}

/// When gang `a` may reclaim its vCluster's lent nodes: the return grace
/// after it was last queued.
pub fn reclaim_due_ms(a: &Allocation, cfg: &ReclaimConfig) -> u64 {
    a.queued_since_ms.saturating_add(cfg.return_grace_ms)
}

/// The reclamations due at `now_ms`.
pub fn plan_reclaims(state: &State, now_ms: u64, cfg: &ReclaimConfig, preemption: &PreemptionConfig) -> Vec<Reclaim> {
    let mut out = Vec::new();
    for lender in state.lenders().collect::<Vec<_>>() {
        let Some(lent) = state.lent(lender) else { continue };
        // Borrowers that can be stopped now, cheapest first.
        let mut borrowers: Vec<&Allocation> = lent
            .keys()
            .filter_map(|id| state.alloc(*id))
            .filter(|a| a.tasks.iter().all(|t| t.status == TaskStatus::Running))
            .filter(|a| a.spec.never_preempted().is_none())
            .collect();
        if borrowers.is_empty() {
            continue;
        }
        borrowers.sort_by_cached_key(|a| {
            (
                a.spec.preemption_class,
                a.spec.checkpoint == CheckpointMode::None,
                score(a, now_ms, preemption).total(),
                a.id,
            )
        });
        // The lender's queued gangs, the first of each shape, in admission order.
        let mut heads: Vec<QueueKey> = state
            .queue_by_shape()
            .range((lender, Shape::MIN)..)
            .take_while(|((k, _), _)| *k == lender)
            .filter_map(|(_, g)| g.first().copied())
            .collect();
        heads.sort_unstable();
        for key in heads {
            let a = state.alloc(key.alloc).expect("queue names a known allocation");
            if now_ms < reclaim_due_ms(a, cfg) || state.quota_excess(a, &[], None, &[]).is_some() {
                continue;
            }
            if let Some(r) = reclaim_for(state, a, lender, &borrowers, cfg.max_victims) {
                out.push(r);
                break;
            }
        }
    }
    out
}

/// The cheapest borrowers whose stopping lets `a` fit on its home and shared
/// nodes, and where it goes; `None` if it fits already or never would.
fn reclaim_for(
    state: &State,
    a: &Allocation,
    home: u32,
    borrowers: &[&Allocation],
    max_victims: usize,
) -> Option<Reclaim> {
    let need = a.spec.resources;
    let n = a.spec.gang_size as usize;
    let nodes: Vec<NodeSlot> = state
        .nodes()
        .iter()
        .filter(|node| node.status == NodeStatus::Ready && state.held_for(node.slot).is_none())
        .filter(|node| [home, 0].contains(&state.node_home(node.slot)))
        .map(|node| node.slot)
        .collect();
    let fitting = |freed: &BTreeMap<NodeSlot, Usage>| -> Vec<NodeSlot> {
        nodes
            .iter()
            .copied()
            .filter(|&slot| {
                let node = state.node(slot);
                let free = node.free().plus(&freed.get(&slot).copied().unwrap_or_default());
                fits(&need, &node.resources, &free)
            })
            .collect()
    };
    if fitting(&BTreeMap::new()).len() >= n {
        return None;
    }
    let frees = |chosen: &[&Allocation]| {
        let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
        for v in chosen {
            let usage = Usage::of(&v.spec.resources);
            for slot in v.tasks.iter().filter_map(|t| t.node) {
                let f = freed.entry(slot).or_default();
                *f = f.plus(&usage);
            }
        }
        freed
    };
    let enough = |chosen: &[&Allocation]| fitting(&frees(chosen)).len() >= n;
    let mut chosen: Vec<&Allocation> = Vec::new();
    for &v in borrowers.iter().take(max_victims) {
        chosen.push(v);
        if enough(&chosen) {
            break;
        }
    }
    if !enough(&chosen) {
        return None;
    }
    // Drop any victim the gang fits without, most expensive first.
    for i in (0..chosen.len()).rev() {
        let mut without = chosen.clone();
        without.remove(i);
        if !without.is_empty() && enough(&without) {
            chosen = without;
        }
    }
    let freed = frees(&chosen);
    let fit = fitting(&freed);
    // Freed nodes first (they are why the victims stop), then ones that fit now.
    let mut placed: Vec<NodeSlot> = fit.iter().copied().filter(|s| freed.contains_key(s)).take(n).collect();
    placed.extend(fit.iter().copied().filter(|s| !freed.contains_key(s)).take(n - placed.len()));
    Some(Reclaim { alloc: a.id, victims: chosen.iter().map(|v| (v.id, v.reservation_epoch)).collect(), nodes: placed })
}
