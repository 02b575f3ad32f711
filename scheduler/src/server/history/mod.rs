//! The job history on a replica: the store (`<data-dir>/history.sqlite`),
//! the writer that stores the records applied entries leave, the catch-up
//! that fetches records this replica skipped from its peers, and the
//! `HistoryService` that `muster history` and `muster usage` call.
//!
//! ```text
//!   apply ──records──▶ Records queue ──writer──▶ SQLite (INSERT OR IGNORE by seq)
//!   every 2 s: stored < finished_total and nothing queued?
//!       ──▶ gaps = missing(finished_total) ──FetchRecords──▶ a peer ──▶ SQLite
//! ```
//!
//! `writer.rs`, `catch_up.rs` and `service.rs` hold one each.

mod catch_up;
mod service;
mod writer;

use std::time::Duration;

pub use self::catch_up::run_catch_up;
pub use self::service::{HistoryApi, export, record_to_proto};
pub use self::writer::{lag, run_writer};

/// How often a replica checks for records it lacks.
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(2);

/// Most records one `FetchRecords` answer carries.
pub const FETCH_LIMIT: usize = 2_000;

/// Most records one `ListHistory` answer carries.
pub const MAX_HISTORY_PAGE: u32 = 10_000;
