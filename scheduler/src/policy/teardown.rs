//! The leader's force-drain pass over gang teardowns.
//!
//! A task told to stop for a teardown normally acks within the grace. One
//! whose node died mid-teardown, or whose agent never answers, would hold its
//! gang (and its node's capacity) forever; after `force_after_ms` counted
//! from the teardown's replicated start time, the leader proposes
//! [`Command::ForceDrain`] for it. `apply` moves the stuck tasks to preempted
//! and completes the gang in the same command, so force drain and completion
//! land on one tick. A new leader computes the same deadlines from the same
//! replicated state.

use crate::sm::{Command, State};

/// The seed's default: a 15 s SIGTERM grace plus 30 s of slack.
pub const DEFAULT_FORCE_AFTER_MS: u64 = 45_000;

/// The force drains due at `now_ms`, in allocation order.
pub fn plan_force_drains(state: &State, now_ms: u64, force_after_ms: u64) -> Vec<Command> {
    state
        .tearing_down()
        .filter_map(|id| {
            let td = state.alloc(id).expect("index names a known allocation").teardown?;
            (now_ms >= td.started_at_ms.saturating_add(force_after_ms))
                .then_some(Command::ForceDrain { alloc: id, epoch: td.epoch })
        })
        .collect()
}
