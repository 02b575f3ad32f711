//! Every metric a replica exports, in one table, and the process-wide
//! Prometheus recorder behind `GET /metrics`.
//!
//! [`describe`] gives each metric its help text and registers every counter
//! (with each known label value) at zero, so a fresh replica already exports
//! the whole catalogue: dashboards and alert rules see a 0, not a gap, and
//! the docs test (`docs/metrics.md` against a live scrape) can hold the two
//! lists equal.
//!
//! Histograms are exported as Prometheus histograms (buckets), not
//! summaries, so they aggregate across replicas in PromQL.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution, in buckets.
    Histogram,
}

impl Kind {
    /// As Prometheus and `docs/metrics.md` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One exported metric.
#[derive(Clone, Copy, Debug)]
pub struct MetricDoc {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// A label and the values a fresh replica registers at zero (counters
    /// only; gauges get theirs from the exporting loop).
    pub label: Option<(&'static str, &'static [&'static str])>,
    /// What it means (the `# HELP` line).
    pub help: &'static str,
}

const fn m(name: &'static str, kind: Kind, help: &'static str) -> MetricDoc {
    MetricDoc { name, kind, label: None, help }
}

const fn l(
    name: &'static str,
    kind: Kind,
    label: &'static str,
    values: &'static [&'static str],
    help: &'static str,
) -> MetricDoc {
    MetricDoc { name, kind, label: Some((label, values)), help }
}

use Kind::{Counter, Gauge, Histogram};

/// The classes `muster_queue_depth` reports (every one, 0 when empty).
pub const CLASSES: [&str; 11] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];

/// Every metric a replica exports. `docs/metrics.md` lists the same.
pub const REPLICA_METRICS: &[MetricDoc] = &[
    l("muster_raft_term", Gauge, "replica", &[], "current Raft term of this replica"),
    l("muster_raft_leader_id", Gauge, "replica", &[], "id of the leader this replica knows (0: none)"),
    l("muster_raft_is_leader", Gauge, "replica", &[], "1 on the leader, 0 elsewhere"),
    l("muster_raft_applied_index", Gauge, "replica", &[], "last log index applied to the state machine"),
    l("muster_raft_committed_index", Gauge, "replica", &[], "last log index this replica knows to be committed"),
    l("muster_raft_last_log_index", Gauge, "replica", &[], "last log index stored"),
    l("muster_raft_snapshot_index", Gauge, "replica", &[], "index of the latest snapshot"),
    l(
        "muster_replica_ready",
        Gauge,
        "replica",
        &[],
        "1 when the replica knows a leader and has applied every committed entry",
    ),
    m(
        "muster_allocator_allocated_bytes",
        Gauge,
        "bytes the process's live allocations hold (jemalloc's stats.allocated), read once a second",
    ),
    m(
        "muster_allocator_resident_bytes",
        Gauge,
        "bytes of memory the process's allocator keeps resident: live allocations, its own metadata, and freed pages it has not yet returned (jemalloc's stats.resident), read once a second",
    ),
    m("muster_raft_batch_commands", Histogram, "commands per proposed log entry (group commit)"),
    m("muster_raft_commit_seconds", Histogram, "proposal to applied, per entry"),
    m("muster_raft_apply_seconds", Histogram, "applying one batch of committed entries to the state machine"),
    m(
        "muster_raft_log_sync_seconds",
        Histogram,
        "making appended log entries durable (one fdatasync per group of appends)",
    ),
    m(
        "muster_raft_snapshot_encode_seconds",
        Histogram,
        "encoding a snapshot from a copy of the state taken under its lock, after letting the lock go",
    ),
    m(
        "muster_raft_snapshot_copy_seconds",
        Histogram,
        "taking the copy of the state a snapshot encodes, under the state's lock (applies wait meanwhile)",
    ),
    m(
        "muster_raft_snapshot_bytes",
        Gauge,
        "size of the latest snapshot this replica holds (built, installed, or loaded at start; 0: none), encoded",
    ),
    m("muster_raft_appended_bytes_total", Counter, "encoded log entries appended to this replica's log, in bytes"),
    m(
        "muster_raft_append_rpc_seconds",
        Histogram,
        "an append carrying entries, sent to a follower until its answer: transport both ways plus the follower's handling",
    ),
    m(
        "muster_raft_append_serve_seconds",
        Histogram,
        "a follower's handling of an append carrying entries, from decoded request to answer (its log write and sync included)",
    ),
    l(
        "muster_raft_proposals_total",
        Counter,
        "result",
        &["committed", "failed", "too_large"],
        "commands proposed by this replica (too_large: refused before the log, over the entry limit)",
    ),
    m(
        "muster_ui_overview_builds_total",
        Counter,
        "dashboard views built (at most one per --ui-refresh-ms; requests in between get the cached view)",
    ),
    m(
        "muster_http_rate_limited_total",
        Counter,
        "HTTP requests answered 429: their client address was over --http-rate",
    ),
    m(
        "muster_raft_outcomes_missing_total",
        Counter,
        "entries whose outcome never came within its bound (3 s following, 10 s leading): answered as not completed",
    ),
    m(
        "muster_raft_leader_gone_total",
        Counter,
        "leaders this follower saw go: their stream ended and nothing listens at their address",
    ),
    m("muster_raft_fast_elections_total", Counter, "elections this follower started for a gone leader's place"),
    m("muster_sm_queue_depth", Gauge, "allocations waiting for admission"),
    l("muster_queue_depth", Gauge, "class", &[], "allocations waiting for admission, by preemption class"),
    m("muster_sm_allocations", Gauge, "allocations held whole (all statuses; compacted ones not counted)"),
    m("muster_sm_nodes", Gauge, "nodes registered"),
    m(
        "muster_sm_forgotten_allocations",
        Gauge,
        "finished allocations dropped from the live state after the retention window",
    ),
    m(
        "muster_sm_compacted_allocations",
        Gauge,
        "finished allocations held compacted (past the detail window, not yet forgotten)",
    ),
    m("muster_history_records", Gauge, "job-history records this replica stores"),
    m("muster_history_missing", Gauge, "job-history records this replica lacks (finished allocations not yet stored)"),
    m("muster_history_records_written_total", Counter, "job-history records stored from applied entries"),
    m(
        "muster_history_records_fetched_total",
        Counter,
        "job-history records fetched from a peer (skipped by a snapshot)",
    ),
    m("muster_history_write_errors_total", Counter, "failed writes to the job-history database"),
    l("muster_gpus", Gauge, "state", &[], "GPUs on working nodes: free, reserved (placed, not yet started) or running"),
    l("muster_nodes", Gauge, "state", &[], "nodes in each lifecycle status"),
    m("muster_nodes_flagged_dead", Gauge, "nodes marked lost (silent while holding work)"),
    m("muster_admission_pass_seconds", Histogram, "one leader admission pass (planning and proposing)"),
    m("muster_read_batch_size", Histogram, "linearizable reads answered by one leadership confirmation"),
    m("muster_agent_streams", Gauge, "agent streams this replica holds open (the leader holds them all)"),
    m(
        "muster_agent_sync_seconds",
        Histogram,
        "one sync of an agent stream on the leader: planning what to send its node and sending it",
    ),
    m(
        "muster_agent_uploads_refused_total",
        Counter,
        "checkpoint uploads the leader refused before proposing (malformed, not the agent's task, stale, too large)",
    ),
    l(
        "muster_agent_reports_refused_total",
        Counter,
        "what",
        &["usage"],
        "parts of agent reports the leader left out before proposing, by what (usage: a value no agent could read)",
    ),
    m(
        "muster_agent_throttled_total",
        Counter,
        "agent messages that waited for their node's budget of log commands (count, heavy commands, bytes)",
    ),
    m(
        "muster_raft_elections_started_total",
        Counter,
        "elections this replica started after a quorum granted its pre-vote",
    ),
    m(
        "muster_raft_pre_votes_refused_total",
        Counter,
        "times this replica heard no leader but a quorum still did (a pre-vote refused): it did not campaign",
    ),
    m("muster_node_drain_seconds", Histogram, "node drain start to the node stopped"),
    m("muster_node_drain_timeouts_total", Counter, "node drains that reached their deadline with work left"),
    m("muster_connections_open", Gauge, "connections this replica holds open"),
    l(
        "muster_connections_refused_total",
        Counter,
        "reason",
        &["total", "per_peer"],
        "connections closed at accept for being over a connection cap",
    ),
    l(
        "muster_connections_evicted_total",
        Counter,
        "reason",
        &["total", "per_peer"],
        "pending connections (no authorised call yet) closed to make room for a newcomer over a cap",
    ),
    m("muster_gang_teardowns_total", Counter, "gang teardowns started"),
    m("muster_task_failures_total", Counter, "task failures charged to a gang's retry budget"),
    m("muster_allocations_failed_total", Counter, "allocations that ended failed"),
    m("muster_image_tags_pinned_total", Counter, "submitted image tags resolved to the digest every task then runs"),
    m("muster_image_pull_failures_total", Counter, "attempts that never ran because their image could not be pulled"),
    m(
        "muster_image_prefetch_nodes_total",
        Counter,
        "nodes asked to pull an image ahead of a gang (muster image prefetch)",
    ),
    m("muster_gang_teardown_force_drained_total", Counter, "preempting tasks moved to preempted without an ack"),
    l(
        "muster_gang_teardown_completed_total",
        Counter,
        "outcome",
        &["blocked", "suspended", "failed"],
        "teardowns and preemptions completed, by outcome",
    ),
    m("muster_gang_teardown_seconds", Histogram, "teardown (or preemption) start to completion"),
    l(
        "muster_preemptions_total",
        Counter,
        "reason",
        &["priority", "sensitive", "reclaim"],
        "allocations chosen as victims of committed preemption decisions",
    ),
    m("muster_preemption_checkpoint_duration_seconds", Histogram, "a preempted task's hint to its checkpoint stored"),
    m(
        "muster_checkpoints_saved_total",
        Counter,
        "checkpoint manifests recorded (their bytes are in a store, not the log)",
    ),
    m("muster_checkpoint_saved_bytes_total", Counter, "bytes of the checkpoints those manifests name"),
    m("muster_preemption_victim_requeue_total", Counter, "preempted allocations that re-entered the queue"),
    m("muster_preemption_failed_checkpoint_total", Counter, "preempted tasks that did not checkpoint in time"),
    m("muster_preemption_decision_seconds", Histogram, "one leader preemption pass (the pure decisions)"),
    m("muster_preemption_cycles_total", Counter, "allocations preempted more than the cycle threshold"),
    l(
        "muster_watchdog_trips_total",
        Counter,
        "kind",
        &["budget", "stall", "gpu_health"],
        "attempts an agent's watchdog stopped",
    ),
    m("muster_watchdog_requeues_total", Counter, "watchdog trips retried rather than failing the allocation"),
];

/// Gives every replica metric its help text and registers the counters at
/// zero. Idempotent; a no-op without a recorder.
pub fn describe() {
    for d in REPLICA_METRICS {
        describe_one(d);
    }
}

/// Describes one metric and registers it at zero where that is meaningful.
pub fn describe_one(d: &MetricDoc) {
    match d.kind {
        Kind::Counter => {
            metrics::describe_counter!(d.name, d.help);
            match d.label {
                Some((label, values)) => {
                    for v in values {
                        // Labels in the order the counting site gives
                        // them: another order would be another series.
                        let mut labels = Vec::new();
                        if d.name == "muster_preemptions_total" {
                            // Its other label: the victim's vCluster.
                            labels.push(metrics::Label::new("vcluster", crate::sm::DEFAULT_VCLUSTER));
                        }
                        labels.push(metrics::Label::new(label, *v));
                        metrics::counter!(d.name, labels).increment(0);
                    }
                }
                None => metrics::counter!(d.name).increment(0),
            }
        }
        Kind::Gauge => metrics::describe_gauge!(d.name, d.help),
        Kind::Histogram => {
            metrics::describe_histogram!(d.name, d.help);
            // Registering the handle is enough: the exporter renders it
            // with zero counts until the first sample.
            let _ = metrics::histogram!(d.name);
        }
    }
}

/// Bucket bounds for durations in seconds: 1 ms to 30 min.
const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0];

/// Bucket bounds for commands per log entry.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use (every
/// replica and agent of one process shares it: `muster dev` runs several).
/// `None` when another recorder was installed first.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("muster_raft_batch_commands".into()), BATCH_BUCKETS)
                })
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("muster_read_batch_size".into()), BATCH_BUCKETS));
            let handle = match builder.map(PrometheusBuilder::install_recorder) {
                Ok(Ok(h)) => h,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "no Prometheus recorder: /metrics will answer 503");
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bad Prometheus buckets: /metrics will answer 503");
                    return None;
                }
            };
            // Histograms keep samples until upkeep folds them in.
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                })
                .ok();
            Some(handle)
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_convention_and_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for d in REPLICA_METRICS {
            assert!(d.name.starts_with("muster_"), "{}", d.name);
            assert!(seen.insert(d.name), "{} listed twice", d.name);
            if d.kind == Kind::Counter {
                assert!(d.name.ends_with("_total"), "a counter ends in _total: {}", d.name);
            }
            assert!(!d.help.is_empty());
        }
    }
}
