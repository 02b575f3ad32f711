//! Storage tests: openraft's own conformance suite, restarts, and crash
//! consistency under a simulated power loss.

mod kv;
mod t10_suite;
mod t20_restart;
mod t30_crash;
