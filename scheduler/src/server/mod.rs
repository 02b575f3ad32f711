//! The replica server: the imperative shell around `sm` and `policy`. It owns
//! the clock, the network and the disk; everything it changes goes through
//! the Raft log as a [`crate::sm::Command`].
//!
//! Its folders are its layers; each imports only the ones above it:
//!
//! ```text
//!   raft/     Consensus: Raft, RPCs between replicas, group commit,
//!             linearizable reads, replicated time, elections
//!   leader/   LeaderWork and the leader loop that drives the pure tick
//!   history/  the job history's writer and catch-up
//!   api/      the gRPC services, the agent hub, auth, limits, conversions
//!   observe/  metrics, readiness, the HTTP listener and dashboard
//! ```
//!
//! - [`replica`]: assembles one replica from them; [`config`]: how it is
//!   started; [`policies`]: its immutable settings and injected bug;
//!   `background`: the tasks it spawns, each awaited on shutdown.
//!
//! A test (`layers.rs`) reads the sources and fails on an import against
//! this layering.

pub mod api;
mod background;
pub mod config;
pub mod history;
#[cfg(test)]
mod layers;
pub mod leader;
pub mod observe;
pub mod policies;
pub mod raft;
pub mod replica;

use muster_raft_store::RaftConfig;

use crate::sm::State;

/// openraft's type configuration for the scheduler.
pub type TypeConfig = RaftConfig<State>;

/// The scheduler's Raft handle.
pub type MusterRaft = openraft::Raft<TypeConfig>;

pub use config::{RaftTuning, ReplicaConfig, StartError};
pub use policies::InjectedBug;
pub use raft::{ProposeError, Proposer};
pub use replica::Replica;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
