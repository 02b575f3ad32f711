//! Integration tests of the state machine and policies together.
//!
//! `t10_…` properties over random command sequences, `t20_…` determinism.

mod model;
mod t10_invariants;
mod t20_determinism;
mod t30_admission_reference;
mod t40_cluster;
