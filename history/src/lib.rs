//! The job history: the record of every finished allocation
//! ([`muster_core::history::JobRecord`]), kept in one SQLite database per
//! replica (`<data-dir>/history.sqlite`) after the live state forgets it.
//!
//! Every replica builds the same records from the same log, numbered by the
//! order allocations finished (`seq`), and stores each at most once: a
//! replayed entry or a re-offered snapshot inserts nothing new. A replica
//! that skipped records (it installed a snapshot after they were
//! forgotten) finds the gaps with [`HistoryStore::missing`] and fetches
//! them from a peer.
//!
//! The schema ([`SCHEMA`]) is plain SQL so that operators can read the file
//! with the `sqlite3` shell or any SQLite library; times are milliseconds
//! since the Unix epoch.

mod query;
mod store;

pub use query::{Filter, Group, UsageRow};
pub use store::{HistoryError, HistoryStore, SCHEMA, SCHEMA_VERSION};

#[cfg(test)]
mod tests;
