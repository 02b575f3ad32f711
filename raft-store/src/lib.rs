//! Raft storage for Muster: openraft 0.9's storage-v2 traits on plain
//! append-only files, generic over the application's state machine.
//!
//! ```text
//!   openraft ──▶ LogStore<A>           (RaftLogStorage, RaftLogReader)
//!            │     log/seg-*.log: checksummed records; vote/purged/committed .meta
//!            │     append returns once written; the flusher thread fdatasyncs
//!            │     every waiting append at once, then openraft hears of them
//!            └─▶ StateMachineStore<A>  (RaftStateMachine, RaftSnapshotBuilder)
//!                  A in memory; snapshots in `snapshot.bin` (write, fsync, rename)
//!                  restart: restore the snapshot, openraft re-applies the
//!                  committed log after it
//!
//!   backup:  a consistent copy of the applied state; restore_data_dir()
//!            prepares an empty data dir to start a new cluster from it
//!   options: applied.log   every applied entry, kept past compaction (replay)
//!            crash-image/  what each fsync made durable (simulated power loss)
//! ```
//!
//! The application plugs in through [`StateMachineApp`]; its log payload is a
//! [`CommandBatch`]: the leader's `time_ms` and a batch of commands (group
//! commit). Every persisted value goes through the versioned postcard
//! [`codec`]. [`RaftConfig`] is the openraft type configuration for an app.

#![deny(missing_docs)]
// openraft's storage traits return its `StorageError` (224 bytes); our helpers
// return the same type rather than box it only to re-box it at the trait.
#![allow(clippy::result_large_err)]

mod applied_log;
mod backup;
pub mod codec;
mod config;
mod crash_image;
mod disk;
mod faults;
mod log_file;
mod log_store;
mod offline;
mod records;
mod state_machine;
mod touches;

// The application's side of the storage contract lives in the pure core.
pub use muster_core::replicated::{CommandBatch, RestoreError, StateMachineApp};

pub use applied_log::{AppliedLogError, AppliedRecord, read_applied_log};
pub use backup::{BACKUP_MAGIC, Backup, BackupError, restore_data_dir};
pub use config::RaftConfig;
pub use crash_image::{acked_beyond_durable, acked_beyond_readable, restore_crash_image};
pub use disk::{OpenError, StoreFault, StoreOptions, open, open_with};
pub use faults::{DiskFault, set_disk_fault};
pub use log_store::{LogStore, MAX_APPEND_BYTES};
pub use offline::{DirLog, DirSnapshot, OfflineError, read_log, read_snapshot};
pub use records::Records;
pub use state_machine::{AppReader, StateMachineStore};
pub use touches::{TouchWatch, Touches};
