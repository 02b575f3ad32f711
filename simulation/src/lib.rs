//! Muster's deterministic discrete-event simulator.
//!
//! It drives the real state machine (`muster_core::sm`) and admission
//! policy (`muster_core::policy`) with simulated nodes, simulated agents
//! and simulated time, from a seeded synthetic workload ([`WorkloadConfig`])
//! or a real trace ([`load_trace`]), and reports utilisation, queueing delay
//! and the final state digest ([`Report`]). Same seed, same digest.
//!
//! [`chaos`] runs real server and agent processes under a seeded nemesis
//! and checks that nothing acknowledged is lost.
//!
//! [`local`] runs a whole cluster (replicas and agents) in one process on
//! loopback, for `muster dev` and end-to-end tests.

#![deny(missing_docs)]

pub mod chaos;
mod engine;
mod fleet;
mod job;
pub mod local;
mod report;
mod rng;
mod trace;
mod workload;

pub use engine::{SimConfig, SimError, Simulation};
pub use fleet::{FleetNode, MAX_FLEET_NODES, parse_fleet};
pub use job::Job;
pub use report::{Distribution, ModelReport, Report};
pub use rng::SimRng;
pub use trace::{TraceError, load_trace, parse_timestamp, parse_trace};
pub use workload::WorkloadConfig;
