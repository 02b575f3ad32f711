//! Storage tests: openraft's own conformance suite, and restarts.

mod kv;
mod t10_suite;
mod t20_restart;
