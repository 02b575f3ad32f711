//! The consensus layer of a replica: the [`Consensus`] handle its services
//! hold, and the parts under it.
//!
//! - [`consensus`]: the handle (state, proposals, time, linearizable reads).
//! - [`network`]: Raft RPCs between replicas over tonic.
//! - [`proposer`]: group commit of commands into log entries.
//! - [`read_index`]: linearizable reads, sharing leadership confirmations.
//! - [`leader_time`]: the replicated time a leader stamps on entries.
//! - [`elector`]: elections after a pre-vote.
//! - [`leader_watch`]: noticing a leader's process is gone, for a quick
//!   election.
//!
//! Nothing here imports another folder of `server/`.

pub mod consensus;
pub mod elector;
pub mod leader_time;
pub mod leader_watch;
pub mod network;
pub mod proposer;
pub mod read_index;

pub use consensus::{Consensus, ConsensusParts, LEADER_ADDR_HEADER, LEADER_ID_HEADER, not_leader_status};
pub use proposer::{ProposeError, Proposed, Proposer};
