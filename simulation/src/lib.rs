//! Muster's deterministic discrete-event simulator.
//!
//! It drives the real state machine (`muster_core::sm`) and admission
//! policy (`muster_core::policy`) with simulated nodes, simulated agents
//! and simulated time, from a seeded synthetic workload ([`WorkloadConfig`])
//! or a real trace ([`load_trace`]), and reports utilisation, queueing delay
//! and the final state digest ([`Report`]). Same seed, same digest.
//!
//! It is pure, like the core: no async runtime, RPC, storage, clock or
//! randomness crate (`.ci/run` checks its dependency tree). The in-process
//! cluster of `muster dev` is `muster-local`, and the chaos harness
//! `muster-chaos`.

#![deny(missing_docs)]

mod engine;
mod fleet;
mod job;
pub mod replay;
mod report;
mod rng;
mod trace;
mod workload;

pub use engine::{SimConfig, SimError, Simulation};
pub use fleet::{FleetNode, MAX_FLEET_NODES, parse_fleet};
pub use job::{Job, JobOutcome, Run, Script};
pub use report::{Distribution, ModelReport, Report};
pub use rng::SimRng;
pub use trace::{TraceError, load_trace, parse_timestamp, parse_trace};
pub use workload::WorkloadConfig;
