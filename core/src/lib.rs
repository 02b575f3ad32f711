//! Muster's pure core: the deterministic state machine ([`sm`]) and the pure
//! policies that decide what to propose to it ([`policy`]).
//!
//! Nothing here reads a clock, does I/O, awaits, draws a random number, or
//! lets `HashMap` iteration reach an outcome: every input is an argument
//! (the state, the entry's time, the configuration), every output a value.
//! The crate depends only on serde, postcard, sha2 and thiserror, so a
//! breach of that contract is a compile error; `.ci/run` checks its
//! dependency tree. The replica server (`muster-scheduler`) is the shell
//! around it.

#![deny(missing_docs)]

pub mod audit;
pub mod history;
pub mod policy;
pub mod replicated;
pub mod sm;
pub mod sync;
pub mod tick;
pub mod words;

#[cfg(test)]
mod testkit;
