//! Muster's node agent.
//!
//! Today: discovering what this machine can offer ([`probe_resources`]), the
//! numbers a node registers with. The stream client, the executor (process
//! groups, SIGTERM → grace → SIGKILL) and the watchdogs arrive with the agent
//! issue.

#![deny(missing_docs)]

mod probe;

pub use probe::{NodeResources, ProbeError, parse_meminfo_mb, probe_resources};
