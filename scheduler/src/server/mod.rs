//! The replica server: the imperative shell around `sm` and `policy`. It owns
//! the clock, the network and the disk; everything it changes goes through
//! the Raft log as a [`crate::sm::Command`].
//!
//! - [`replica`]: storage, Raft, the gRPC server and the loops of one replica.
//! - [`raft_net`]: Raft RPCs between replicas over tonic.
//! - [`leader_watch`]: noticing a leader's process is gone, for a quick
//!   election.
//! - [`proposer`]: group commit of commands into log entries.
//! - [`client_api`], [`node_api`], [`vcluster_api`] and [`admin_api`]: the
//!   gRPC services users and operators call.
//! - [`agent_hub`]: the leader's end of the agent streams.
//! - [`leader`]: the leader loop that drives the pure tick (node lost,
//!   deadlines, admission, preemption) while this replica leads.
//! - [`observe`]: metrics and log lines derived from committed outcomes.
//! - [`convert`]: protobuf ↔ state-machine types and statuses, at the edge.
//! - [`read_index`]: linearizable reads, sharing leadership confirmations.
//! - [`health`]: readiness, published as gRPC health, `/readyz` and a gauge.
//! - [`http`]: the plain-HTTP listener: metrics, probes, the [`dashboard`].
//! - [`telemetry`]: the catalogue of exported metrics and the Prometheus
//!   recorder.

pub mod admin_api;
pub mod agent_hub;
pub mod auth;
mod background;
pub mod client_api;
pub mod convert;
pub mod dashboard;
pub mod elector;
pub mod health;
pub mod history;
pub mod http;
pub mod leader;
pub mod leader_time;
pub mod leader_watch;
pub mod limits;
pub mod node_api;
pub mod observe;
pub mod policies;
pub mod proposer;
pub mod raft_net;
pub mod read_index;
pub mod replica;
pub mod telemetry;
pub mod vcluster_api;

use muster_raft_store::RaftConfig;

use crate::sm::State;

/// openraft's type configuration for the scheduler.
pub type TypeConfig = RaftConfig<State>;

/// The scheduler's Raft handle.
pub type MusterRaft = openraft::Raft<TypeConfig>;

pub use proposer::{ProposeError, Proposer};
pub use replica::{InjectedBug, RaftTuning, Replica, ReplicaConfig, StartError};

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
