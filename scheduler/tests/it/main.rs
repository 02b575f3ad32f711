//! Integration tests of the state machine and policies together.
//!
//! `t10_…` properties over random command sequences, `t20_…` determinism,
//! `t50_…` the simulator's tick against the leader loop's.

mod model;
mod t10_invariants;
mod t20_determinism;
mod t30_admission_reference;
mod t40_cluster;
mod t50_sim_vs_leader;
