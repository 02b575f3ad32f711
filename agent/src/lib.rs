//! Muster's node agent.
//!
//! - [`probe_resources`]: what this machine can offer, the numbers a node
//!   registers with.
//! - [`agent`]: the stream to the leader, reconnection, task bookkeeping.
//! - [`executor`]: task attempts as process groups with per-attempt logs,
//!   stopped with SIGTERM → grace → SIGKILL.
//! - [`cgroup`]: a cgroup per attempt (v1 or v2): nothing escapes a stop,
//!   memory, CPU, process and GPU-device limits, per-attempt usage.
//! - [`checkpoint`]: packing a task's checkpoint directory into a blob,
//!   streaming, and unpacking one checked against its manifest.
//! - [`store`]: the checkpoint stores (this node's disk, a shared path, an
//!   object store by URL, another node's agent); [`serve`]: this node's
//!   checkpoints served to other agents under the leader's grants.
//! - [`hint`]: the checkpoint-hint protocol of a priority preemption.
//! - [`launcher`]: the standard launcher environment (ranks, rendezvous,
//!   hostfile) every task starts with.
//! - [`watchdog`]: the budget, stall and GPU-health watchdogs of an attempt.
//! - [`users`]: who a task runs as (never root unless the agent is told).

#![deny(missing_docs)]

pub mod agent;
pub mod cgroup;
pub mod checkpoint;
pub mod container;
pub mod executor;
pub mod hint;
pub mod janitor;
pub mod launcher;
pub mod nvidia;
mod object;
pub mod oci;
mod probe;
pub mod serve;
pub mod store;
pub mod users;
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
    (
        "muster_agent_checkpoint_save_seconds",
        "histogram",
        "an attempt's checkpoint directory packed and written to its store, at its process's end",
    ),
    (
        "muster_agent_checkpoint_restore_seconds",
        "histogram",
        "a checkpoint fetched from its store, checked against its manifest and unpacked, before an attempt starts",
    ),
    (
        "muster_agent_oom_kills_total",
        "counter",
        "attempts in which the kernel killed a process for going over the task's memory limit",
    ),
    (
        "muster_task_memory_bytes",
        "gauge",
        "memory a running task holds now, from its cgroup, by alloc_id and task (series of ended tasks expire)",
    ),
    (
        "muster_task_memory_peak_bytes",
        "gauge",
        "the most memory a running task has held, from its cgroup, by alloc_id and task",
    ),
    ("muster_task_cpu_seconds", "gauge", "CPU time a running task has used, from its cgroup, by alloc_id and task"),
    (
        "muster_task_gpu_utilisation_pct",
        "gauge",
        "mean utilisation of a running task's GPUs at the last reading (NVML), by alloc_id and task",
    ),
    (
        "muster_task_gpu_memory_bytes",
        "gauge",
        "memory a running task's GPUs hold at the last reading (NVML), by alloc_id and task",
    ),
    (
        "muster_agent_checkpoint_bytes_served_total",
        "counter",
        "bytes of checkpoints on this node's disk served to other nodes' agents, under grants",
    ),
    (
        "muster_agent_checkpoint_fetches_refused_total",
        "counter",
        "fetches of this node's checkpoints refused: the asking node held no grant for them",
    ),
    ("muster_image_pull_bytes_total", "counter", "image layer bytes downloaded from registries"),
    (
        "muster_image_pull_seconds",
        "histogram",
        "an image pull that missed the cache: manifest, missing layers downloaded, verified and unpacked",
    ),
    ("muster_image_cache_hits_total", "counter", "image pulls the node's cache answered"),
    ("muster_image_cache_misses_total", "counter", "image pulls that fetched layers from a registry"),
    ("muster_image_cache_bytes", "gauge", "unpacked layers the image cache holds, after its last eviction"),
    ("muster_image_layers_evicted_total", "counter", "layers removed from the image cache"),
];

/// Gives the agent's metrics their help text and registers them at zero.
pub fn describe_metrics() {
    for (name, kind, help) in METRICS {
        match *kind {
            "gauge" => metrics::describe_gauge!(*name, *help),
            "histogram" => {
                metrics::describe_histogram!(*name, *help);
                // Registering the handle is enough: the exporter renders it
                // with zero counts until the first sample.
                let _ = metrics::histogram!(*name);
            }
            _ => metrics::describe_counter!(*name, *help),
        }
    }
    for kind in ["checkpoint", "log", "container"] {
        metrics::counter!("muster_agent_janitor_removed_total", "kind" => kind).increment(0);
    }
    metrics::counter!("muster_watchdog_suspected_stalls_total").increment(0);
    metrics::counter!("muster_agent_stream_failures_total").increment(0);
    metrics::counter!("muster_agent_fenced_total").increment(0);
    metrics::counter!("muster_agent_oom_kills_total").increment(0);
    metrics::counter!("muster_agent_checkpoint_bytes_served_total").increment(0);
    metrics::counter!("muster_agent_checkpoint_fetches_refused_total").increment(0);
    for name in [
        "muster_image_pull_bytes_total",
        "muster_image_cache_hits_total",
        "muster_image_cache_misses_total",
        "muster_image_layers_evicted_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    metrics::gauge!("muster_image_cache_bytes").set(0.0);
    for kind in ["budget", "stall", "gpu_health"] {
        metrics::counter!("muster_agent_watchdog_trips_total", "kind" => kind).increment(0);
    }
}
