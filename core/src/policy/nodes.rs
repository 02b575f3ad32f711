//! Node lifecycle decisions: drain deadlines, the drain timeout a request
//! resolves to, and which nodes a scale-down retires.
//!
//! A drain's deadline is an entry time in the replicated state, so the
//! leader that proposes [`Command::ExpireDrain`] for it may be a different
//! one from the leader that committed the drain: the deadline stays put.

use std::collections::{BTreeMap, BTreeSet};

use crate::sm::{Command, DRAIN_TIMEOUT_LABEL, Node, NodeSlot, NodeStatus, State, parse_duration_s};

/// The seed's default drain timeout: 4 hours.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 4 * 3600 * 1000;

/// The timeout a drain of `node` gets: the one asked for, else the node's
/// `muster.drain-timeout` label (its pool's default; checked when the node
/// registered), else `default_ms`.
pub fn drain_timeout_ms(node: &Node, requested_ms: Option<u64>, default_ms: u64) -> u64 {
    requested_ms
        .or_else(|| {
            let label = node.labels.get(DRAIN_TIMEOUT_LABEL)?;
            parse_duration_s(label).ok().map(|s| s.saturating_mul(1000))
        })
        .unwrap_or(default_ms)
}

/// Draining nodes whose deadline passed at `now_ms`, in slot order.
pub fn plan_drain_expiries(state: &State, now_ms: u64) -> Vec<Command> {
    state
        .nodes_in(NodeStatus::Draining)
        .map(|slot| state.node(slot))
        .filter(|n| n.drain.as_ref().is_some_and(|d| now_ms >= d.deadline_ms))
        .map(|n| Command::ExpireDrain { node: n.id.clone() })
        .collect()
}

/// One node a scale-down would drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDownChoice {
    /// The node.
    pub slot: NodeSlot,
    /// Nothing reserved, running or about to be reserved there.
    pub idle: bool,
    /// Tasks holding capacity there.
    pub tasks: u32,
    /// GPUs those tasks hold.
    pub gpus_used: u32,
}

/// Picks up to `count` ready nodes carrying every `selector` label to drain:
/// idle ones first (no task holds capacity, no preemptor holds them, and the
/// admission pass about to run would not reserve them: `soon`), in slot
/// order; then the least busy (fewest tasks, then fewest GPUs used, then
/// slot). Returns the choice and how many fewer candidates there were than
/// `count`.
pub fn plan_scale_down(
    state: &State,
    count: u32,
    selector: &BTreeMap<String, String>,
    soon: &BTreeSet<NodeSlot>,
) -> (Vec<ScaleDownChoice>, u32) {
    let mut candidates: Vec<ScaleDownChoice> = state
        .nodes_in(NodeStatus::Ready)
        .map(|slot| state.node(slot))
        .filter(|n| selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
        .filter(|n| state.held_for(n.slot).is_none())
        .map(|n| {
            let tasks = state.tasks_on_node(n.slot).count() as u32;
            ScaleDownChoice { slot: n.slot, idle: tasks == 0 && !soon.contains(&n.slot), tasks, gpus_used: n.used.gpus }
        })
        .collect();
    candidates.sort_by_key(|c| (!c.idle, c.tasks, c.gpus_used, c.slot));
    let short_by = count.saturating_sub(candidates.len() as u32);
    candidates.truncate(count as usize);
    (candidates, short_by)
}

/// The nodes an admission plan would reserve.
pub fn planned_nodes(state: &State, commands: &[Command]) -> BTreeSet<NodeSlot> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::ReserveGang { nodes, .. } => Some(nodes),
            _ => None,
        })
        .flatten()
        .filter_map(|id| state.node_slot(id))
        .collect()
}
