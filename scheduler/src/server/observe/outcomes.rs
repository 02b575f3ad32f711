//! Metrics and structured log lines derived from committed outcomes, on the
//! replica that proposed them (the leader).
//!
//! Teardown and preemption lines all carry `alloc_id` and `epoch`, so one
//! grep for an allocation tells its story:
//!
//! ```text
//!   gang teardown started   alloc_id=7 epoch=1 cause=task_failed trigger=0 preempting=3 released=0
//!   task preempted          alloc_id=7 epoch=1 task=1 forced=false      (one per task)
//!   checkpoint saved        alloc_id=7 epoch=1 task=1 bytes=812
//!   gang teardown completed alloc_id=7 epoch=1 outcome=blocked drain_s=1.4
//!   gang reserved           alloc_id=7 epoch=2 gang_size=4               (re-reservation)
//!
//!   preemption decided      alloc_id=9 victims=[3, 4] reason=priority nodes=4
//!   gang teardown started   alloc_id=3 epoch=1 cause=preempted by=9 preempting=2
//!   gang teardown completed alloc_id=3 epoch=1 outcome=suspended drain_s=3.0
//!   gang reserved           alloc_id=9 epoch=1 gang_size=4               (the held nodes)
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use crate::sm::{Event, Outcome, TeardownCause, TeardownOutcome};

/// An allocation preempted more than this many times counts once in
/// `muster_preemption_cycles_total` (set from the preemption config).
static CYCLE_THRESHOLD: AtomicU32 = AtomicU32::new(3);

/// Sets the preemption-cycle threshold.
pub fn set_cycle_threshold(n: u32) {
    CYCLE_THRESHOLD.store(n, Ordering::Relaxed);
}

/// Records what one committed command did.
pub fn observe(outcome: &Outcome) {
    for event in outcome.events() {
        match event {
            Event::TeardownStarted { alloc, cause, epoch, preempting, released } => match cause {
                TeardownCause::TaskFailed { trigger } => {
                    metrics::counter!("muster_gang_teardowns_total").increment(1);
                    tracing::info!(
                        alloc_id = alloc,
                        epoch,
                        cause = "task_failed",
                        trigger,
                        preempting = preempting.len(),
                        released,
                        "gang teardown started"
                    );
                }
                TeardownCause::Preempted { by, reason } => {
                    tracing::info!(
                        alloc_id = alloc,
                        epoch,
                        cause = "preempted",
                        by,
                        reason = reason.as_str(),
                        preempting = preempting.len(),
                        "gang teardown started"
                    );
                }
                TeardownCause::NodeDrain | TeardownCause::Cancelled { .. } => {
                    let cause = if *cause == TeardownCause::NodeDrain { "node_drain" } else { "cancelled" };
                    tracing::info!(
                        alloc_id = alloc,
                        epoch,
                        cause,
                        preempting = preempting.len(),
                        released,
                        "gang teardown started"
                    );
                }
            },
            Event::TaskFailed { charged: true, .. } => {
                metrics::counter!("muster_task_failures_total").increment(1);
            }
            Event::AllocationFailed { alloc, reason } => {
                metrics::counter!("muster_allocations_failed_total").increment(1);
                tracing::warn!(alloc_id = alloc, reason = %reason, "allocation failed");
            }
            Event::DrainStarted { node, by, reason, deadline_ms, tasks } => {
                tracing::info!(node = %node, by = %by, reason = %reason, deadline_ms, tasks, "node drain started");
            }
            Event::DrainCancelled { node, by } => tracing::info!(node = %node, by = %by, "node drain cancelled"),
            Event::DrainCompleted { node, drain_ms } => {
                tracing::info!(node = %node, drain_s = *drain_ms as f64 / 1000.0, "node drain completed");
            }
            Event::DrainTimedOut { node, allocs } => {
                metrics::counter!("muster_node_drain_timeouts_total").increment(1);
                tracing::warn!(node = %node, allocs = ?allocs, "node drain timed out; preempting its remaining work");
            }
            Event::NodeStopped { node, by, reason, drain_ms } => {
                if let Some(ms) = drain_ms {
                    metrics::histogram!("muster_node_drain_seconds").record(*ms as f64 / 1000.0);
                }
                tracing::info!(node = %node, by = ?by, reason = %reason, "node stopped");
            }
            Event::NodeReady { node } => tracing::info!(node = %node, "node ready"),
            Event::NodeRestarted { node, by } => tracing::info!(node = %node, by = %by, "node restarted"),
            Event::NodeTerminated { node, by } => tracing::info!(node = %node, by = %by, "node terminated"),
            Event::RetriedOnDrainingNode { alloc, task, node, epoch, retry } => {
                tracing::warn!(alloc_id = alloc, task, node = %node, epoch, retry, "task retried on its draining node");
            }
            Event::TaskPreempted { alloc, task, epoch, forced, checkpoint_failed } => {
                if *checkpoint_failed {
                    metrics::counter!("muster_preemption_failed_checkpoint_total").increment(1);
                }
                if *forced {
                    metrics::counter!("muster_gang_teardown_force_drained_total").increment(1);
                    tracing::warn!(alloc_id = alloc, epoch, task, forced, checkpoint_failed, "task preempted");
                } else {
                    tracing::info!(alloc_id = alloc, epoch, task, forced, checkpoint_failed, "task preempted");
                }
            }
            Event::CheckpointSaved { alloc, task, epoch, bytes, after_ms, preempted, seq } => {
                if *preempted {
                    metrics::histogram!("muster_preemption_checkpoint_duration_seconds")
                        .record(*after_ms as f64 / 1000.0);
                }
                metrics::counter!("muster_checkpoints_saved_total").increment(1);
                metrics::counter!("muster_checkpoint_saved_bytes_total").increment(*bytes);
                tracing::info!(alloc_id = alloc, epoch, task, bytes, after_ms, seq, "checkpoint saved");
            }
            Event::CheckpointUnreachable { alloc, task, seq, writer, from } => {
                tracing::warn!(alloc_id = alloc, task, seq, writer = %writer, from = ?from, "newest checkpoint unreachable");
            }
            Event::TeardownCompleted { alloc, epoch, cause, outcome, drain_ms, preempted_count } => {
                let drain_s = *drain_ms as f64 / 1000.0;
                metrics::counter!("muster_gang_teardown_completed_total", "outcome" => outcome.as_str()).increment(1);
                metrics::histogram!("muster_gang_teardown_seconds").record(drain_s);
                if !matches!(cause, TeardownCause::TaskFailed { .. }) {
                    if *outcome != TeardownOutcome::Failed {
                        metrics::counter!("muster_preemption_victim_requeue_total").increment(1);
                    }
                    if *preempted_count == CYCLE_THRESHOLD.load(Ordering::Relaxed).saturating_add(1) {
                        metrics::counter!("muster_preemption_cycles_total").increment(1);
                        tracing::warn!(alloc_id = alloc, preempted_count, "allocation keeps being preempted");
                    }
                }
                tracing::info!(
                    alloc_id = alloc,
                    epoch,
                    outcome = outcome.as_str(),
                    drain_s,
                    preempted_count,
                    "gang teardown completed"
                );
            }
            Event::PreemptionDecided { alloc, victims, nodes, reason, victim_vclusters } => {
                for vcluster in victim_vclusters {
                    metrics::counter!(
                        "muster_preemptions_total",
                        "vcluster" => vcluster.clone(),
                        "reason" => reason.as_str()
                    )
                    .increment(1);
                }
                tracing::info!(
                    alloc_id = alloc,
                    victims = ?victims,
                    reason = reason.as_str(),
                    nodes = nodes.len(),
                    "preemption decided"
                );
            }
            Event::WatchdogTripped { alloc, task, node, kind, trips, retried } => {
                metrics::counter!("muster_watchdog_trips_total", "kind" => kind.as_str()).increment(1);
                if *retried {
                    metrics::counter!("muster_watchdog_requeues_total").increment(1);
                }
                tracing::warn!(
                    alloc_id = alloc, task, node = %node, kind = kind.as_str(), trips, retried, "watchdog tripped"
                );
            }
            Event::ImagePullFailed { alloc, task, node, reason, failures, retried } => {
                metrics::counter!("muster_image_pull_failures_total").increment(1);
                tracing::warn!(
                    alloc_id = alloc, task, node = %node, failures, retried, reason = %reason, "image pull failed"
                );
            }
            Event::NominationDropped { alloc, reason } => {
                tracing::warn!(alloc_id = alloc, reason = %reason, "held nodes released");
            }
            Event::GangReserved { alloc, epoch, nodes } => {
                tracing::info!(alloc_id = alloc, epoch, gang_size = nodes.len(), "gang reserved");
            }
            _ => {}
        }
    }
}
