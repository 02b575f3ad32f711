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
//! - [`launcher`]: the standard launcher environment (ranks, rendezvous,
//!   hostfile) every task starts with.
//! - [`watchdog`]: the budget, stall and GPU-health watchdogs of an attempt.

#![deny(missing_docs)]

pub mod agent;
pub mod checkpoint;
pub mod executor;
pub mod hint;
pub mod janitor;
pub mod launcher;
mod probe;
pub mod watchdog;

pub use probe::{
    NodeResources, ProbeError, cpu_model, gpu_model, label_value, parse_meminfo_mb, probe_labels, probe_resources,
};

/// Every metric an agent exports: name, type, help (`docs/metrics.md`
/// lists the same).
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        "muster_watchdog_suspected_stalls_total",
        "counter",
        "stall confirmations that found the task busy: logged, re-armed, not stopped",
    ),
    ("muster_agent_watchdog_trips_total", "counter", "attempts this agent's watchdogs stopped, by kind"),
    (
        "muster_agent_stream_failures_total",
        "counter",
        "agent streams to the leader that failed (then retried with backoff)",
    ),
    (
        "muster_agent_fenced_total",
        "counter",
        "times no leader answered this node for half its node-lost window and the agent stopped its tasks (self-fencing)",
    ),
    (
        "muster_agent_work_dir_bytes",
        "gauge",
        "bytes of checkpoints, attempt logs and progress files in the agent's work dir, after the last sweep",
    ),
    (
        "muster_agent_janitor_removed_total",
        "counter",
        "checkpoint directories and attempts' logs the work-dir janitor removed, by kind",
    ),
];

/// Gives the agent's metrics their help text and registers them at zero.
pub fn describe_metrics() {
    for (name, kind, help) in METRICS {
        match *kind {
            "gauge" => metrics::describe_gauge!(*name, *help),
            _ => metrics::describe_counter!(*name, *help),
        }
    }
    for kind in ["checkpoint", "log"] {
        metrics::counter!("muster_agent_janitor_removed_total", "kind" => kind).increment(0);
    }
    metrics::counter!("muster_watchdog_suspected_stalls_total").increment(0);
    metrics::counter!("muster_agent_stream_failures_total").increment(0);
    metrics::counter!("muster_agent_fenced_total").increment(0);
    for kind in ["budget", "stall", "gpu_health"] {
        metrics::counter!("muster_agent_watchdog_trips_total", "kind" => kind).increment(0);
    }
}
