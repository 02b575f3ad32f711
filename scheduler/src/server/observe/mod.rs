//! What a replica shows of itself: metrics, readiness, the HTTP listener
//! and its dashboard.
//!
//! - [`outcomes`]: metrics and log lines derived from committed outcomes.
//! - [`gauges`]: Raft and state gauges, kept current.
//! - [`telemetry`]: the catalogue of exported metrics and the Prometheus
//!   recorder.
//! - [`health`]: readiness, published as gRPC health, `/readyz` and a gauge.
//! - [`http`]: the plain-HTTP listener: metrics, probes, the [`dashboard`].

pub mod dashboard;
pub mod gauges;
pub mod health;
pub mod http;
pub mod outcomes;
pub mod telemetry;

pub use outcomes::{observe, set_cycle_threshold};
