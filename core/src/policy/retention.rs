//! When the leader forgets finished allocations: once the oldest one has
//! been finished for the retention window and a minute more (or an
//! idempotency key's window has passed as long), one
//! [`Command::ForgetFinished`] in that deadline pass. Apply picks what to
//! forget from the entry's own time. Compaction works the same way over
//! the shorter detail window, with [`Command::CompactFinished`].

use crate::sm::{Command, MAX_FORGET_PER_ENTRY, State};

/// How long a finished allocation stays in the live state by default: 3 hours.
pub const DEFAULT_RETENTION_MS: u64 = 3 * 3_600_000;

/// How long a finished allocation is held whole by default, before it is
/// compacted to its outcome (the job history holds the rest): 1 minute. A
/// whole one costs about 2.9 KiB and a compacted one 44 bytes
/// (docs/performance.md, "How a replica's cost grows with work").
pub const DEFAULT_DETAIL_MS: u64 = 60_000;

/// The most finished allocations held whole by default, however recent:
/// about 150 MB of each replica's memory. Kubernetes keeps 12,500
/// terminated pods by default (`terminated-pod-gc-threshold`); a finished
/// allocation compacted past it still answers, from the job history.
pub const DEFAULT_KEEP_WHOLE: u64 = 50_000;

/// Most allocations one compaction entry takes by default. Compactions are
/// proposed at most once a liveness pass (a second), so this is also the
/// most compacted a second: well above the 2,000–3,000 finishes a second
/// the fleet bench makes (docs/performance.md, "Fleet scale").
pub const DEFAULT_COMPACT_PER_ENTRY: u32 = MAX_FORGET_PER_ENTRY;

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
    /// How long a finished allocation is held whole before it is
    /// compacted, ms (at most `retention_ms`; equal: never compacted).
    pub detail_ms: u64,
    /// The most finished allocations held whole (the oldest beyond are
    /// compacted before their detail window ends).
    pub keep_whole: u64,
    /// Most allocations (and keys) one entry forgets.
    pub max_per_entry: u32,
    /// Most allocations one entry compacts.
    pub compact_per_entry: u32,
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
            detail_ms: DEFAULT_DETAIL_MS,
            keep_whole: DEFAULT_KEEP_WHOLE,
            max_per_entry: MAX_FORGET_PER_ENTRY,
            compact_per_entry: DEFAULT_COMPACT_PER_ENTRY,
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

/// The compaction to propose at `now_ms`: once a finished allocation has
/// been past the detail window for `batch_ms` (at most a tenth of the
/// window), or more than a tenth over `keep_whole` are held whole. None
/// when the detail window is the retention (nothing is compacted before
/// it is forgotten).
pub fn plan_compact(state: &State, now_ms: u64, cfg: &RetentionConfig) -> Option<Command> {
    if cfg.detail_ms >= cfg.retention_ms {
        return None;
    }
    let batch = cfg.batch_ms.min(cfg.detail_ms / 10);
    let keep_over = cfg.keep_whole.saturating_add(cfg.keep_whole / 10);
    state.compact_due(now_ms.saturating_sub(batch), cfg.detail_ms, keep_over).then_some(Command::CompactFinished {
        detail_ms: cfg.detail_ms,
        keep_whole: cfg.keep_whole,
        max: cfg.compact_per_entry,
    })
}
