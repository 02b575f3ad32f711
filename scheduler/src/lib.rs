//! Muster's scheduler: the deterministic state machine ([`sm`]) and the pure
//! policies that decide what to propose to it ([`policy`]). The server shell
//! (tonic services, leader loops, agent hub) arrives with the Raft and agent
//! issues and is the only part allowed a clock or I/O.

#![deny(missing_docs)]

pub mod app;
pub mod policy;
pub mod server;
pub mod sm;
