//! When the leader forgets finished allocations: once the oldest one has
//! been finished for the retention window and a minute more (or an
//! idempotency key's window has passed as long), one
//! [`Command::ForgetFinished`] in that deadline pass. Apply picks what to
//! forget from the entry's own time.

use crate::sm::{Command, MAX_FORGET_PER_ENTRY, State};

/// How long a finished allocation stays in the live state by default: 3 hours.
pub const DEFAULT_RETENTION_MS: u64 = 3 * 3_600_000;

/// How long an idempotency key is honoured after its submit by default (and
/// for as long as its allocation is held): 24 hours.
pub const DEFAULT_KEY_WINDOW_MS: u64 = 24 * 3_600_000;

/// Retention knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    /// How long a finished allocation stays, ms.
    pub retention_ms: u64,
    /// How long after its submit an idempotency key is honoured at least, ms.
    pub key_window_ms: u64,
    /// Most allocations (and keys) one entry forgets.
    pub max_per_entry: u32,
    /// The leader waits until the oldest finished allocation is this far
    /// past the window (or a tenth of the window, if that is shorter)
    /// before it proposes, so that forgets come in batches (one entry a
    /// minute at most in steady state), not one per pass.
    pub batch_ms: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            retention_ms: DEFAULT_RETENTION_MS,
            key_window_ms: DEFAULT_KEY_WINDOW_MS,
            max_per_entry: 1_000.min(MAX_FORGET_PER_ENTRY),
            batch_ms: 60_000,
        }
    }
}

/// The forget to propose at `now_ms`, if anything has been past its window
/// for `batch_ms` (at most a tenth of the window). The entry then forgets everything past the window (up to
/// `max_per_entry`).
pub fn plan_forget(state: &State, now_ms: u64, cfg: &RetentionConfig) -> Option<Command> {
    let batch = cfg.batch_ms.min(cfg.retention_ms / 10);
    state.forget_due(now_ms.saturating_sub(batch), cfg.retention_ms).then_some(Command::ForgetFinished {
        retention_ms: cfg.retention_ms,
        key_window_ms: cfg.key_window_ms,
        max: cfg.max_per_entry,
    })
}
