//! Allocation events as a kind and a readable line, and entry times as
//! RFC 3339.

use crate::sm::{Event, TeardownCause};

/// An event's kind (snake case) and a readable detail.
pub fn describe_event(e: &Event) -> (&'static str, String) {
    match e {
        Event::Submitted { alloc, .. } => ("submitted", format!("allocation {alloc} submitted")),
        Event::GangReserved { epoch, nodes, .. } => (
            "gang_reserved",
            format!("reserved (epoch {epoch}) on {}", nodes.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")),
        ),
        Event::GangRolledBack { epoch, .. } => ("gang_rolled_back", format!("reservation {epoch} not claimed in time")),
        Event::TaskStarted { task, node, attempt, .. } => {
            ("task_started", format!("task {task} started on {node} (attempt {attempt})"))
        }
        Event::TaskFinished { task, .. } => ("task_finished", format!("task {task} finished")),
        Event::TaskFailed { task, exit_code, charged, .. } => (
            "task_failed",
            format!(
                "task {task} failed{}{}",
                exit_code.map(|c| format!(" with exit code {c}")).unwrap_or_default(),
                if *charged { "" } else { " (not charged: stopped after a sibling, or never started)" }
            ),
        ),
        Event::TeardownStarted { cause, epoch, preempting, released, .. } => {
            let tasks = preempting.iter().map(|(t, n)| format!("task {t} on {n}")).collect::<Vec<_>>().join(", ");
            match cause {
                TeardownCause::TaskFailed { trigger } => (
                    "teardown_started",
                    format!(
                        "task {trigger} failed while siblings ran: teardown epoch {epoch}, {} preempting ({tasks}), \
                         {released} released",
                        preempting.len(),
                    ),
                ),
                TeardownCause::Preempted { by, reason } => (
                    "preemption_started",
                    format!(
                        "preempted ({}) for allocation {by}: epoch {epoch}, {} stopping ({tasks})",
                        reason.as_str(),
                        preempting.len()
                    ),
                ),
                TeardownCause::Cancelled { .. } => (
                    "cancel_started",
                    format!(
                        "cancelled: epoch {epoch}, {} stopping ({tasks}), {released} released; their GPUs stay held \
                         until each task has stopped",
                        preempting.len()
                    ),
                ),
                TeardownCause::NodeDrain => (
                    "preemption_started",
                    format!(
                        "preempted (drain): a node it runs on reached its drain deadline: epoch {epoch}, {} \
                         stopping ({tasks}), {released} released",
                        preempting.len()
                    ),
                ),
            }
        }
        Event::TaskPreempted { task, epoch, forced, checkpoint_failed, .. } => (
            "task_preempted",
            format!(
                "task {task} stopped for preemption epoch {epoch}{}{}",
                if *forced { " (forced: no ack in time, or its node was lost)" } else { "" },
                if *checkpoint_failed { " without a checkpoint in time (charged)" } else { "" }
            ),
        ),
        Event::PreemptionDecided { victims, nodes, reason, .. } => (
            "preemption_decided",
            format!(
                "preempting allocation(s) {} ({}); nodes {} held for it",
                victims.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
                reason.as_str(),
                nodes.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
            ),
        ),
        Event::NominationDropped { reason, .. } => ("nomination_dropped", format!("held nodes released: {reason}")),
        Event::WatchdogTripped { task, node, kind, trips, retried, .. } => (
            "watchdog_tripped",
            format!(
                "task {task} stopped by the {} watchdog on {node} (trip {trips}){}",
                kind.as_str(),
                if *retried { "; retried elsewhere, first in its class" } else { "; out of watchdog retries" }
            ),
        ),
        Event::OutOfMemory { task, node, run, limit_bytes, peak_bytes, .. } => (
            "oom_killed",
            format!(
                "task {task} attempt {run} on {node}: {}",
                muster_core::sm::OomKill { limit_bytes: *limit_bytes, peak_bytes: *peak_bytes }.describe()
            ),
        ),
        Event::CheckpointSaved { task, epoch, bytes, seq, .. } => (
            "checkpoint_saved",
            format!("task {task} saved checkpoint {seq}: {} (epoch {epoch})", crate::words::bytes(*bytes)),
        ),
        Event::CheckpointUnreachable { task, seq, writer, from, .. } => (
            "checkpoint_unreachable",
            match from {
                Some(older) => format!(
                    "task {task}'s newest checkpoint {seq} is on {writer}, which is gone: it resumes from checkpoint {older}"
                ),
                None => format!(
                    "task {task}'s checkpoint {seq} is on {writer}, which is gone, and no older one is reachable: it starts afresh"
                ),
            },
        ),
        Event::CheckpointSettingsChanged { settings, by } => (
            "checkpoint_settings_changed",
            format!(
                "checkpoint settings set by {by}: store {}, keep {}, cap {}",
                settings.store,
                settings.keep,
                crate::words::bytes(settings.max_bytes)
            ),
        ),
        Event::CheckpointsDeleted { node, count } => {
            ("checkpoints_deleted", format!("{node} deleted {count} retired checkpoint(s)"))
        }
        Event::TeardownCompleted { epoch, outcome, drain_ms, cause, .. } => (
            if matches!(cause, TeardownCause::TaskFailed { .. }) {
                "teardown_completed"
            } else {
                "preemption_completed"
            },
            format!(
                "{} epoch {epoch} completed after {:.1} s: gang {}{}",
                if matches!(cause, TeardownCause::TaskFailed { .. }) { "teardown" } else { "preemption" },
                *drain_ms as f64 / 1000.0,
                outcome.as_str(),
                if *outcome == crate::sm::TeardownOutcome::Suspended {
                    " (queued again with its original submit time; resumes from its checkpoints)"
                } else {
                    ""
                }
            ),
        ),
        Event::GangRequeued { .. } => ("gang_requeued", "the whole gang is queued again".to_string()),
        Event::WaitChanged { wait, holders, .. } => {
            ("wait_changed", format!("waits for {}", crate::sm::wait_words(*wait, holders)))
        }
        Event::DependenciesMet { .. } => ("dependencies_met", "its dependencies are met: it is queued".to_string()),
        Event::ArraySubmitted { array, count, .. } => {
            ("array_submitted", format!("array {array} of {count} elements submitted"))
        }
        Event::ArrayCancelled { array, skipped } => (
            "array_cancelled",
            format!("elements of array {array} cancelled ({skipped} before they were materialised)"),
        ),
        Event::ArrayThrottled { array, throttle, by } => (
            "array_throttled",
            match throttle {
                0 => format!("{by} lifted array {array}'s throttle"),
                t => format!("{by} set array {array}'s throttle to {t} running at once"),
            },
        ),
        Event::WorkflowSubmitted { workflow, steps, .. } => {
            ("workflow_submitted", format!("workflow {workflow} of {steps} steps submitted"))
        }
        Event::ArrayFinished { array, done, failed, cancelled } => {
            ("array_finished", format!("array {array} finished: {done} done, {failed} failed, {cancelled} cancelled"))
        }
        Event::AllocationDone { .. } => ("allocation_done", "every task finished".to_string()),
        Event::AllocationFailed { reason, .. } => ("allocation_failed", reason.clone()),
        Event::CheckpointDropped { task, node, reason, seq, .. } => {
            ("checkpoint_dropped", format!("task {task}'s checkpoint {seq} was dropped on {node}: {reason}"))
        }
        Event::Compacted { allocs, through_ms } => (
            "compacted",
            format!(
                "{allocs} finished allocations (ended through {}) were compacted: the job history holds their details",
                format_time_ms(*through_ms)
            ),
        ),
        Event::Forgotten { allocs, keys, through_ms } => (
            "forgotten",
            format!(
                "{allocs} finished allocations (ended through {}) and {keys} idempotency keys left the live state",
                format_time_ms(*through_ms)
            ),
        ),
        Event::TaskStartFailed { task, node, reason, .. } => {
            ("task_start_failed", format!("task {task} did not start on {node}: {reason}"))
        }
        Event::ImagePullFailed { task, node, reason, failures, retried, .. } => (
            "image_pull_failed",
            format!(
                "task {task} could not pull its image on {node} (pull failure {failures}, not charged){}: {reason}",
                if *retried { "; placed again, elsewhere if it can be" } else { "; the allocation fails" }
            ),
        ),
        Event::NodeImagesChanged { node, count } => {
            ("node_images_changed", format!("node {node} holds {count} image(s) in its cache"))
        }
        Event::AllocationCancelled { stopped, .. } => {
            ("allocation_cancelled", format!("cancelled; {} tasks stopped", stopped.len()))
        }
        Event::RetriedOnDrainingNode { task, node, epoch, retry, .. } => (
            "retried_on_draining_node",
            format!("task {task} retried on its draining node {node} (retry {retry}, epoch {epoch})"),
        ),
        Event::NodeRegistered { node, updated } => {
            ("node_registered", format!("node {node} {}", if *updated { "registered again" } else { "registered" }))
        }
        Event::NodeLost { node, tasks } => {
            ("node_lost", format!("node {node} went silent while holding work; {} task(s) failed over", tasks.len()))
        }
        Event::NodeReady { node } => ("node_ready", format!("node {node} is ready")),
        Event::NodeAdmitted { node, admitted } => (
            "node_admitted",
            if *admitted { format!("node {node} admitted") } else { format!("node {node}'s admission withdrawn") },
        ),
        Event::NodeLabelled { node, by } => ("node_labelled", format!("node {node}'s labels set by {by}")),
        Event::DrainStarted { node, by, reason, deadline_ms, tasks } => (
            "drain_started",
            format!(
                "node {node} draining (by {by}{}); {tasks} task(s) left; deadline {}",
                if reason.is_empty() { String::new() } else { format!(": {reason}") },
                format_time_ms(*deadline_ms)
            ),
        ),
        Event::DrainCancelled { node, by } => ("drain_cancelled", format!("drain of node {node} cancelled by {by}")),
        Event::DrainCompleted { node, drain_ms } => {
            ("drain_completed", format!("node {node} drained after {:.1} s: no work left", *drain_ms as f64 / 1000.0))
        }
        Event::DrainTimedOut { node, allocs } => (
            "drain_timed_out",
            format!(
                "node {node} reached its drain deadline; preempting allocation(s) [{}] to resume elsewhere",
                allocs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ),
        Event::NodeStopped { node, by, reason, .. } => (
            "node_stopped",
            format!("node {node} stopped{}: {reason}", by.as_ref().map(|b| format!(" by {b}")).unwrap_or_default()),
        ),
        Event::NodeRestarted { node, by } => ("node_restarted", format!("node {node} restarted by {by}")),
        Event::NodeTerminated { node, by } => ("node_terminated", format!("node {node} terminated by {by}")),
        Event::TokenCreated { id, name, role, by } => {
            ("token_created", format!("token {id} ({} for {name}) created by {by}", role.as_str()))
        }
        Event::TokenRevoked { id, by } => ("token_revoked", format!("token {id} revoked by {by}")),
        Event::VClusterCreated { name, by } => ("vcluster_created", format!("vcluster {name} created by {by}")),
        Event::VClusterUpdated { name, revision, by } => {
            ("vcluster_updated", format!("vcluster {name} updated to revision {revision} by {by}"))
        }
    }
}

/// An entry time as RFC 3339 UTC (second precision).
pub fn format_time_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
