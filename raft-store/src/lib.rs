//! Raft storage for Muster, generic over the application's state machine.
//!
//! Today this crate owns the contract between the replicated log and the
//! application ([`StateMachineApp`]), the shape of a log entry's payload
//! ([`EntryPayload`]: the leader's `time_ms` and a batch of commands), and the
//! versioned postcard codec every persisted value goes through ([`codec`]).
//! The openraft storage-v2 implementation on sled (log, vote, snapshots,
//! compaction) builds on these in the Raft issue.

#![deny(missing_docs)]

pub mod codec;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The payload of one application log entry: the leader's wall clock when it
/// proposed the entry and the commands it batched into it (group commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryPayload<C> {
    /// Leader wall-clock time, ms since the Unix epoch.
    pub time_ms: u64,
    /// The commands, applied in order.
    pub commands: Vec<C>,
}

/// Why a snapshot could not be restored.
#[derive(Debug, Error)]
#[error("cannot restore the state machine from a snapshot: {0}")]
pub struct RestoreError(pub String);

/// What the storage layer needs from the application's state machine.
///
/// `apply` must be deterministic: the same payloads in the same order give
/// the same outcomes and the same [`StateMachineApp::digest`] on every replica.
pub trait StateMachineApp: Sized + Send + Sync + 'static {
    /// One command.
    type Command: Serialize + for<'de> Deserialize<'de> + Clone + std::fmt::Debug + Send + Sync + 'static;
    /// The result of one command.
    type Outcome: Serialize + for<'de> Deserialize<'de> + Clone + std::fmt::Debug + Send + Sync + 'static;

    /// Applies every command of one entry, in order, at the entry's time.
    fn apply_entry(&mut self, payload: &EntryPayload<Self::Command>) -> Vec<Self::Outcome>;

    /// The whole state as snapshot bytes.
    fn snapshot(&self) -> Vec<u8>;

    /// The state a snapshot holds.
    fn restore(bytes: &[u8]) -> Result<Self, RestoreError>;

    /// A stable digest of the state (equal on replicas at the same index).
    fn digest(&self) -> [u8; 32];
}
