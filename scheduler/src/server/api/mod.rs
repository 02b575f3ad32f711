//! The gRPC services of a replica, and what they share at the edge.
//!
//! - [`client`], [`node`], [`vcluster`], [`admin`] and [`history`]: the
//!   services users and operators call.
//! - [`agent_hub`]: the leader's end of the agent streams.
//! - [`auth`]: who may call what; [`limits`]: what any peer may hold open.
//! - [`convert`]: protobuf ↔ state-machine types and statuses.
//!
//! Each service holds the [`crate::server::raft::Consensus`] handle and, where
//! it feeds the leader, the [`crate::server::leader::LeaderWork`]; nothing
//! here is imported by `raft/` or `leader/`.

pub mod admin;
pub mod agent_hub;
pub mod auth;
pub mod client;
pub mod convert;
pub mod history;
pub mod limits;
pub mod node;
pub mod vcluster;
pub mod workflow;
