//! Muster's replica server: the imperative shell ([`server`]: tonic
//! services, leader loops, agent hub) around the pure core of
//! `muster-core`, whose state machine ([`sm`]) and policies ([`policy`]) it
//! re-exports. Only this shell has a clock or I/O.

#![deny(missing_docs)]

pub mod server;

pub use muster_core::{policy, sm, words};
