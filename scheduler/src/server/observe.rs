//! Metrics and structured log lines derived from committed outcomes, on the
//! replica that proposed them (the leader).
//!
//! Teardown lines all carry `alloc_id` and `epoch`, so one grep for an
//! allocation tells its story:
//!
//! ```text
//!   gang teardown started   alloc_id=7 epoch=1 trigger=0 preempting=3 released=0
//!   task preempted          alloc_id=7 epoch=1 task=1 forced=false      (one per task)
//!   checkpoint saved        alloc_id=7 epoch=1 task=1 bytes=812
//!   gang teardown completed alloc_id=7 epoch=1 outcome=blocked drain_s=1.4
//!   gang reserved           alloc_id=7 epoch=2 gang_size=4               (re-reservation)
//! ```

use crate::sm::{Event, Outcome};

/// Records what one committed command did.
pub fn observe(outcome: &Outcome) {
    for event in outcome.events() {
        match event {
            Event::TeardownStarted { alloc, trigger, epoch, preempting, released } => {
                metrics::counter!("muster_gang_teardowns_total").increment(1);
                tracing::info!(
                    alloc_id = alloc,
                    epoch,
                    trigger,
                    preempting = preempting.len(),
                    released,
                    "gang teardown started"
                );
            }
            Event::TaskPreempted { alloc, task, epoch, forced } => {
                if *forced {
                    metrics::counter!("muster_gang_teardown_force_drained_total").increment(1);
                    tracing::warn!(alloc_id = alloc, epoch, task, forced, "task preempted");
                } else {
                    tracing::info!(alloc_id = alloc, epoch, task, forced, "task preempted");
                }
            }
            Event::CheckpointSaved { alloc, task, epoch, bytes } => {
                tracing::info!(alloc_id = alloc, epoch, task, bytes, "checkpoint saved");
            }
            Event::TeardownCompleted { alloc, epoch, outcome, drain_ms } => {
                let drain_s = *drain_ms as f64 / 1000.0;
                metrics::counter!("muster_gang_teardown_completed_total", "outcome" => outcome.as_str()).increment(1);
                metrics::histogram!("muster_gang_teardown_seconds").record(drain_s);
                tracing::info!(alloc_id = alloc, epoch, outcome = outcome.as_str(), drain_s, "gang teardown completed");
            }
            Event::GangReserved { alloc, epoch, nodes } => {
                tracing::info!(alloc_id = alloc, epoch, gang_size = nodes.len(), "gang reserved");
            }
            _ => {}
        }
    }
}
