//! Muster's node agent.
//!
//! - [`probe_resources`]: what this machine can offer, the numbers a node
//!   registers with.
//! - [`agent`]: the stream to the leader, reconnection, task bookkeeping.
//! - [`executor`]: task attempts as process groups with per-attempt logs,
//!   stopped with SIGTERM → grace → SIGKILL.
//! - [`checkpoint`]: packing a preempted task's checkpoint directory for the
//!   leader, and restoring it for the next attempt.
//! - [`hint`]: the checkpoint-hint protocol of a priority preemption.
//! - [`watchdog`]: the budget, stall and GPU-health watchdogs of an attempt.

#![deny(missing_docs)]

pub mod agent;
pub mod checkpoint;
pub mod executor;
pub mod hint;
mod probe;
pub mod watchdog;

pub use probe::{NodeResources, ProbeError, parse_meminfo_mb, probe_resources};
