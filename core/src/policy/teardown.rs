//! The leader's forced-teardown deadlines over gang teardowns.
//!
//! A task told to stop for a teardown normally acks within the grace. One
//! whose node died mid-teardown, or whose agent never answers, would hold its
//! gang (and its node's capacity) forever; after `force_after_ms` counted
//! from the teardown's replicated start time, the leader proposes
//! [`Command::ForceTeardown`] for it. `apply` moves the stuck tasks to preempted
//! and completes the gang in the same command, so the forced end and completion
//! land on one tick. A new leader computes the same deadlines from the same
//! replicated state.
//!
//! A priority preemption's victims (and gangs moved off a node whose drain
//! timed out) get longer: the agent's own checkpoint
//! deadline (with its one extension, or a full deferral) and the grace come
//! first ([`PreemptionConfig::force_after_ms`]); a victim forced this way did
//! not checkpoint and is charged. Held nodes whose hold expired are let go
//! in the same pass ([`plan_expired_nominations`]).

use super::preemption::PreemptionConfig;
use crate::sm::{CheckpointMode, Command, State};

/// The seed's default: a 15 s SIGTERM grace plus 30 s of slack.
pub const DEFAULT_FORCE_AFTER_MS: u64 = 45_000;

/// The forced teardowns due at `now_ms`, in allocation order.
pub fn plan_forced_teardowns(state: &State, now_ms: u64, force_after_ms: u64, cfg: &PreemptionConfig) -> Vec<Command> {
    state
        .tearing_down()
        .filter_map(|id| {
            let a = state.alloc(id).expect("index names a known allocation");
            let td = a.teardown?;
            let after = if td.asks_checkpoint() {
                cfg.force_after_ms(a.spec.checkpoint != CheckpointMode::None)
            } else {
                force_after_ms
            };
            (now_ms >= td.started_at_ms.saturating_add(after))
                .then_some(Command::ForceTeardown { alloc: id, epoch: td.epoch })
        })
        .collect()
}

/// Preemptors whose hold expired at `now_ms`, in allocation order.
pub fn plan_expired_nominations(state: &State, now_ms: u64) -> Vec<Command> {
    let mut ids: Vec<_> = state.held_nodes().map(|(_, a)| a).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .filter(|&id| state.alloc(id).and_then(|a| a.nomination.as_ref()).is_some_and(|n| now_ms >= n.expires_at_ms))
        .map(|alloc| Command::ExpireNomination { alloc })
        .collect()
}
