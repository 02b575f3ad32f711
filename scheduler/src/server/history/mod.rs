//! The job history on a replica: the store (`<data-dir>/history.sqlite`),
//! the writer that stores the records applied entries leave, and the
//! catch-up that fetches records this replica skipped from its peers. The
//! `HistoryService` that `muster history` and `muster usage` call is
//! [`crate::server::api::history`].
//!
//! ```text
//!   apply ──records──▶ Records queue ──writer──▶ SQLite (INSERT OR IGNORE by seq)
//!   every 2 s: stored < finished_total and nothing queued?
//!       ──▶ gaps = missing(finished_total) ──FetchRecords──▶ a peer ──▶ SQLite
//! ```
//!
//! `writer.rs` and `catch_up.rs` hold one each.

mod catch_up;
mod writer;

use std::time::Duration;

pub use self::catch_up::run_catch_up;
pub use self::writer::{lag, run_writer};

/// How often a replica checks for records it lacks.
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(2);

/// Most records one `FetchRecords` answer carries.
pub const FETCH_LIMIT: usize = 2_000;

/// Most records one `ListHistory` answer carries.
pub const MAX_HISTORY_PAGE: u32 = 10_000;
