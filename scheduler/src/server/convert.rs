//! Protobuf ↔ state-machine types, and errors → gRPC statuses, in one place
//! at the edge. Every field is checked here (naming the field the user sent)
//! and again in `apply`.

use muster_proto::v1;
use tonic::Status;
use tonic::metadata::MetadataValue;

use super::proposer::ProposeError;
use crate::sm::{
    AllocSpec, AllocStatus, Allocation, CheckpointMode, DEFAULT_CHECKPOINT_ESTIMATE_S, DEFAULT_VCLUSTER, Event, Limits,
    MAX_PREEMPTION_CLASS, Rejection, Resources, State, TaskStatus, TeardownCause, VClusterType, validate_spec,
};

/// Metadata key naming the leader's replica id on a redirect.
pub const LEADER_ID_HEADER: &str = "x-muster-leader-id";
/// Metadata key naming the leader's address on a redirect.
pub const LEADER_ADDR_HEADER: &str = "x-muster-leader-addr";

pub use crate::sm::{DEFAULT_MAX_RETRIES, DEFAULT_WALLTIME_S};

fn invalid(field: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("invalid {field}: {reason}"))
}

/// Converts and validates a submitted spec. Unset walltime and retries take
/// their defaults; everything else must be given.
pub fn spec_from_proto(spec: Option<v1::AllocationSpec>, limits: &Limits) -> Result<AllocSpec, Status> {
    let p = spec.ok_or_else(|| invalid("spec", "is required"))?;
    let r = p.resources.ok_or_else(|| invalid("spec.resources", "is required"))?;
    let class = u8::try_from(p.preemption_class).ok().filter(|c| *c <= MAX_PREEMPTION_CLASS).ok_or_else(|| {
        invalid("spec.preemption_class", format!("{} is outside 0..={MAX_PREEMPTION_CLASS}", p.preemption_class))
    })?;
    let checkpoint = match v1::CheckpointMode::try_from(p.checkpoint) {
        Ok(v1::CheckpointMode::Unspecified | v1::CheckpointMode::Auto) => CheckpointMode::Auto,
        Ok(v1::CheckpointMode::Manual) => CheckpointMode::Manual,
        Ok(v1::CheckpointMode::None) => CheckpointMode::None,
        Err(_) => return Err(invalid("spec.checkpoint", format!("unknown mode {}", p.checkpoint))),
    };
    let vcluster_type = if p.vcluster_type.is_empty() {
        VClusterType::HpcBatch
    } else {
        VClusterType::parse(&p.vcluster_type).ok_or_else(|| {
            invalid(
                "spec.vcluster_type",
                format!("{:?} is not one of hpc-batch, ml-training, service, sensitive, interactive", p.vcluster_type),
            )
        })?
    };
    let spec = AllocSpec {
        owner: p.owner,
        gang_size: p.gang_size,
        resources: Resources { gpus: r.gpus, vram_mb: r.vram_mb, mem_mb: r.mem_mb, cpus: r.cpus },
        preemption_class: class,
        priority: p.priority,
        checkpoint,
        walltime_s: if p.walltime_s == 0 { DEFAULT_WALLTIME_S } else { p.walltime_s },
        max_retries: if p.max_retries == 0 { DEFAULT_MAX_RETRIES } else { p.max_retries },
        command: p.command,
        env: p.env.into_iter().collect(),
        idempotency_key: Some(p.idempotency_key).filter(|k| !k.is_empty()),
        vcluster: if p.vcluster.is_empty() { DEFAULT_VCLUSTER.to_string() } else { p.vcluster },
        vcluster_type,
        sensitive: p.sensitive,
        checkpoint_estimate_s: if p.checkpoint_estimate_s == 0 {
            DEFAULT_CHECKPOINT_ESTIMATE_S
        } else {
            p.checkpoint_estimate_s
        },
        stall_timeout_s: p.stall_timeout_s,
    };
    validate_spec(&spec, limits).map_err(|r| rejection_to_status(&r))?;
    Ok(spec)
}

/// The wire form of a spec.
pub fn spec_to_proto(s: &AllocSpec) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: s.owner.clone(),
        gang_size: s.gang_size,
        resources: Some(resources_to_proto(&s.resources)),
        preemption_class: u32::from(s.preemption_class),
        priority: s.priority,
        checkpoint: match s.checkpoint {
            CheckpointMode::Auto => v1::CheckpointMode::Auto,
            CheckpointMode::Manual => v1::CheckpointMode::Manual,
            CheckpointMode::None => v1::CheckpointMode::None,
        } as i32,
        walltime_s: s.walltime_s,
        max_retries: s.max_retries,
        command: s.command.clone(),
        env: s.env.clone().into_iter().collect(),
        idempotency_key: s.idempotency_key.clone().unwrap_or_default(),
        vcluster: s.vcluster.clone(),
        vcluster_type: s.vcluster_type.as_str().to_string(),
        sensitive: s.sensitive,
        checkpoint_estimate_s: s.checkpoint_estimate_s,
        stall_timeout_s: s.stall_timeout_s,
    }
}

fn resources_to_proto(r: &Resources) -> v1::Resources {
    v1::Resources { gpus: r.gpus, vram_mb: r.vram_mb, mem_mb: r.mem_mb, cpus: r.cpus }
}

/// The wire form of an allocation status.
pub fn alloc_status_to_proto(s: AllocStatus) -> v1::AllocationStatus {
    match s {
        AllocStatus::Queued => v1::AllocationStatus::Queued,
        AllocStatus::Suspended => v1::AllocationStatus::Suspended,
        AllocStatus::Reserved => v1::AllocationStatus::Reserved,
        AllocStatus::Running => v1::AllocationStatus::Running,
        AllocStatus::TearingDown => v1::AllocationStatus::TearingDown,
        AllocStatus::Done => v1::AllocationStatus::Done,
        AllocStatus::Failed => v1::AllocationStatus::Failed,
        AllocStatus::Cancelled => v1::AllocationStatus::Cancelled,
    }
}

/// An allocation-status filter: `None` for unspecified (any).
pub fn alloc_status_filter(raw: i32) -> Result<Option<AllocStatus>, Status> {
    Ok(Some(match v1::AllocationStatus::try_from(raw) {
        Ok(v1::AllocationStatus::Unspecified) => return Ok(None),
        Ok(v1::AllocationStatus::Queued) => AllocStatus::Queued,
        Ok(v1::AllocationStatus::Suspended) => AllocStatus::Suspended,
        Ok(v1::AllocationStatus::Reserved) => AllocStatus::Reserved,
        Ok(v1::AllocationStatus::Running) => AllocStatus::Running,
        Ok(v1::AllocationStatus::TearingDown) => AllocStatus::TearingDown,
        Ok(v1::AllocationStatus::Done) => AllocStatus::Done,
        Ok(v1::AllocationStatus::Failed) => AllocStatus::Failed,
        Ok(v1::AllocationStatus::Cancelled) => AllocStatus::Cancelled,
        Err(_) => return Err(invalid("status", format!("unknown status {raw}"))),
    }))
}

fn task_status_to_proto(s: TaskStatus) -> v1::TaskStatus {
    match s {
        TaskStatus::Blocked => v1::TaskStatus::Blocked,
        TaskStatus::Reserved => v1::TaskStatus::Reserved,
        TaskStatus::Running => v1::TaskStatus::Running,
        TaskStatus::Preempting => v1::TaskStatus::Preempting,
        TaskStatus::Preempted => v1::TaskStatus::Preempted,
        TaskStatus::Done => v1::TaskStatus::Done,
        TaskStatus::Failed => v1::TaskStatus::Failed,
        TaskStatus::Cancelled => v1::TaskStatus::Cancelled,
    }
}

/// The wire form of an allocation.
pub fn alloc_to_proto(a: &Allocation, state: &State) -> v1::Allocation {
    v1::Allocation {
        id: a.id,
        spec: Some(spec_to_proto(&a.spec)),
        submit_time_ms: a.submit_time_ms,
        status: alloc_status_to_proto(a.status) as i32,
        reservation_epoch: a.reservation_epoch,
        tasks: a
            .tasks
            .iter()
            .map(|t| v1::Task {
                index: t.index,
                status: task_status_to_proto(t.status) as i32,
                node_id: t.node.map(|s| state.node(s).id.to_string()).unwrap_or_default(),
                attempts: t.attempts,
                reservation_epoch: t.reservation_epoch,
                reserved_at_ms: t.reserved_at_ms,
                started_at_ms: t.started_at_ms,
                finished_at_ms: t.finished_at_ms,
                exit_code: t.exit_code,
                preemption_epoch: t.preemption_epoch,
                checkpoint_bytes: t.checkpoint.as_ref().map_or(0, |c| c.data.len() as u64),
                checkpoint_epoch: t.checkpoint.as_ref().map(|c| c.epoch),
                runs: t.runs,
                last_node_id: t.last_node().map(|s| state.node(s).id.to_string()).unwrap_or_default(),
                watchdog_trips: t.watchdog_trips,
                last_watchdog: t.last_watchdog.map(|k| k.as_str().to_string()).unwrap_or_default(),
                borrowed_from: t
                    .node
                    .filter(|_| t.status.holds_capacity())
                    .and_then(|s| state.borrowed_from(s, a))
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect(),
        finished_at_ms: a.finished_at_ms,
        preemption_epoch: a.preemption_epoch,
        teardown: a.teardown.map(|td| {
            let (trigger, preempted_by, reason) = match td.cause {
                TeardownCause::TaskFailed { trigger } => (Some(trigger), 0, String::new()),
                TeardownCause::Preempted { by, reason } => (None, by, reason.as_str().to_string()),
                TeardownCause::NodeDrain => (None, 0, "drain".to_string()),
                TeardownCause::Cancelled { preempted_by } => (None, preempted_by.unwrap_or(0), "cancel".to_string()),
            };
            v1::Teardown {
                epoch: td.epoch,
                trigger,
                started_at_ms: td.started_at_ms,
                preempted_by,
                reason,
                failed_checkpoints: td.failed_checkpoints,
            }
        }),
        preempted_count: a.preempted_count,
        nomination: a.nomination.as_ref().map(|n| v1::Nomination {
            node_ids: n.nodes.iter().map(|&s| state.node(s).id.to_string()).collect(),
            waiting_for: n.waiting_for.clone(),
            decided_at_ms: n.decided_at_ms,
            expires_at_ms: n.expires_at_ms,
        }),
    }
}

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
        Event::CheckpointSaved { task, epoch, bytes, .. } => {
            ("checkpoint_saved", format!("task {task} saved a {bytes}-byte checkpoint (epoch {epoch})"))
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
        Event::AllocationDone { .. } => ("allocation_done", "every task finished".to_string()),
        Event::AllocationFailed { reason, .. } => ("allocation_failed", reason.clone()),
        Event::CheckpointDropped { task, node, reason, .. } => {
            ("checkpoint_dropped", format!("task {task}'s checkpoint was dropped on {node}: {reason}"))
        }
        Event::TaskStartFailed { task, node, reason, .. } => {
            ("task_start_failed", format!("task {task} did not start on {node}: {reason}"))
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

/// The wire form of a node status.
pub fn node_status_to_proto(s: crate::sm::NodeStatus) -> v1::NodeStatus {
    use crate::sm::NodeStatus as S;
    match s {
        S::Pending => v1::NodeStatus::Pending,
        S::Ready => v1::NodeStatus::Ready,
        S::Draining => v1::NodeStatus::Draining,
        S::Stopping => v1::NodeStatus::Stopping,
        S::Stopped => v1::NodeStatus::Stopped,
        S::Terminated => v1::NodeStatus::Terminated,
        S::Lost => v1::NodeStatus::Lost,
    }
}

/// The wire form of one entry of a node's history.
pub fn node_event_to_proto(n: &crate::sm::Node, h: &crate::sm::AllocEvent) -> v1::NodeEvent {
    let (kind, detail) = describe_event(&h.event);
    v1::NodeEvent {
        node_id: n.id.to_string(),
        revision: h.revision,
        time_ms: h.time_ms,
        kind: kind.to_string(),
        detail,
        status: node_status_to_proto(n.status) as i32,
    }
}

/// The wire form of a node.
pub fn node_to_proto(st: &crate::sm::State, n: &crate::sm::Node) -> v1::Node {
    let r = |g, v, m, c| v1::Resources { gpus: g, vram_mb: v, mem_mb: m, cpus: c };
    v1::Node {
        id: n.id.to_string(),
        resources: Some(r(n.resources.gpus, n.resources.vram_mb, n.resources.mem_mb, n.resources.cpus)),
        labels: n.labels.clone().into_iter().collect(),
        status: node_status_to_proto(n.status) as i32,
        used: Some(r(n.used.gpus, 0, n.used.mem_mb, n.used.cpus)),
        tasks: st.tasks_on_node(n.slot).count() as u32,
        registered_at_ms: n.registered_at_ms,
        status_since_ms: n.status_since_ms,
        drain: n.drain.as_ref().map(|d| v1::NodeDrain {
            started_at_ms: d.started_at_ms,
            deadline_ms: d.deadline_ms,
            reason: d.reason.clone(),
            by: d.by.clone(),
        }),
        events: n.history.iter().map(|h| node_event_to_proto(n, h)).collect(),
        revision: n.revision,
    }
}

/// The wire form of an explanation.
pub fn explanation_to_proto(e: crate::policy::Explanation, st: &State, now_ms: u64) -> v1::Explanation {
    let preemption = e.preemption.map(|p| match p {
        Ok(d) => v1::PreemptionPlan {
            victims: d
                .victims
                .iter()
                .map(|v| v1::Victim {
                    id: v.alloc,
                    preemption_class: u32::from(v.class),
                    gpus: v.gpus,
                    elapsed_s: v.elapsed_s,
                    checkpoint_cost: v.checkpoint_gpu_s,
                    recompute_cost: v.recompute_gpu_s,
                    value_cost: v.value_gpu_s,
                    total_cost: v.total(),
                })
                .collect(),
            node_ids: d.nodes.iter().map(|&s| st.node(s).id.to_string()).collect(),
            total_cost: d.cost_gpu_s,
            value: d.value_gpu_s,
            reason: String::new(),
        },
        Err(why) => v1::PreemptionPlan { reason: why.to_string(), ..Default::default() },
    });
    v1::Explanation {
        planned_start: e.planned_start.map(|p| v1::PlannedStart {
            start_ms: p.start_ms,
            in_ms: p.start_ms.saturating_sub(now_ms),
            node_ids: p.nodes.iter().map(|&s| st.node(s).id.to_string()).collect(),
        }),
        preemption,
        id: e.alloc,
        status: alloc_status_to_proto(e.status) as i32,
        summary: e.summary,
        classes: e
            .classes
            .into_iter()
            .map(|c| v1::NodeClassReason {
                class: c.class,
                nodes: c.nodes,
                can_take_now: c.can_take_now,
                reason: c.reason,
            })
            .collect(),
    }
}

/// The gRPC status of a deterministic rejection.
pub fn rejection_to_status(r: &Rejection) -> Status {
    let msg = r.to_string();
    match r {
        Rejection::InvalidSpec { field, reason } => invalid(&format!("spec.{field}"), reason),
        Rejection::InvalidNode { field, reason } => invalid(field, reason),
        Rejection::InvalidToken { field, reason } => invalid(field, reason),
        Rejection::TokenExists(_) | Rejection::VClusterExists(_) => Status::already_exists(msg),
        Rejection::InvalidVCluster { field, reason } => invalid(field, reason),
        Rejection::UnknownVCluster(_) => Status::not_found(msg),
        Rejection::QuotaExceeded { .. } | Rejection::OverQuota { .. } => Status::resource_exhausted(msg),
        Rejection::UnknownToken(_) => Status::not_found(msg),
        Rejection::TokenRevoked(_) => Status::failed_precondition(msg),
        Rejection::UnknownNode(_) | Rejection::UnknownAllocation(_) | Rejection::UnknownTask { .. } => {
            Status::not_found(msg)
        }
        Rejection::IdempotencyConflict { .. } => Status::already_exists(msg),
        Rejection::WrongNode { .. } => Status::permission_denied(msg),
        Rejection::StaleReservationEpoch { .. }
        | Rejection::StaleTaskEpoch { .. }
        | Rejection::StalePreemptionEpoch { .. } => Status::aborted(msg),
        Rejection::NotPreemptible { .. }
        | Rejection::BorrowRefused { .. }
        | Rejection::NodeHeld { .. }
        | Rejection::AlreadyNominated { .. }
        | Rejection::NotNominated { .. }
        | Rejection::NominationNotExpired { .. }
        | Rejection::IllegalNodeTransition { .. }
        | Rejection::NodeBusy { .. }
        | Rejection::DrainNotExpired { .. }
        | Rejection::NodeTerminated(_) => Status::failed_precondition(msg),
        Rejection::CheckpointTooLarge { .. } => Status::resource_exhausted(msg),
        Rejection::NotQueued { .. }
        | Rejection::WrongNodeCount { .. }
        | Rejection::NodeRepeated(_)
        | Rejection::NodeNotReady(_)
        | Rejection::InsufficientCapacity { .. }
        | Rejection::ShrinkBelowUsage(_)
        | Rejection::WrongTaskStatus { .. }
        | Rejection::NotTearingDown { .. }
        | Rejection::CheckpointDisabled { .. }
        | Rejection::NothingReserved { .. }
        | Rejection::AlreadyTerminal { .. }
        | Rejection::AlreadyCancelling { .. } => Status::failed_precondition(msg),
    }
}

/// UNAVAILABLE with the leader in metadata, for a client to retry there.
pub fn not_leader_status(leader: Option<(u64, String)>) -> Status {
    let mut status = Status::unavailable(ProposeError::NotLeader { leader: leader.clone() }.to_string());
    if let Some((id, addr)) = leader {
        let md = status.metadata_mut();
        md.insert(LEADER_ID_HEADER, MetadataValue::from(id));
        if let Ok(v) = addr.parse() {
            md.insert(LEADER_ADDR_HEADER, v);
        }
    }
    status
}

/// The gRPC status of a failed proposal.
pub fn propose_error_to_status(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader { leader } => not_leader_status(leader),
        ProposeError::Raft(msg) => Status::unavailable(format!("the write did not complete: {msg}")),
        // Not UNAVAILABLE: retrying this replica cannot help; another can.
        e @ ProposeError::Storage(_) => Status::internal(format!("{e}; ask another replica")),
        ProposeError::Membership(msg) => Status::failed_precondition(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed storage is fatal on this replica, so it is not the
    /// retryable UNAVAILABLE a lost leadership or a shutdown gets.
    #[test]
    fn a_storage_failure_is_internal_and_names_itself_not_unavailable() {
        use openraft::error::{ClientWriteError, Fatal, RaftError};
        use openraft::{ErrorSubject, ErrorVerb, StorageError, StorageIOError};
        let io = StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Write, openraft::AnyError::error("EIO on fsync"));
        let fatal: RaftError<u64, ClientWriteError<u64, openraft::BasicNode>> =
            RaftError::Fatal(Fatal::StorageError(StorageError::from(io)));
        let st = propose_error_to_status(ProposeError::from(fatal));
        assert_eq!(st.code(), tonic::Code::Internal, "{st:?}");
        assert!(st.message().contains("storage failed") && st.message().contains("EIO on fsync"), "{st:?}");
        let stopped: RaftError<u64, ClientWriteError<u64, openraft::BasicNode>> = RaftError::Fatal(Fatal::Stopped);
        assert_eq!(propose_error_to_status(ProposeError::from(stopped)).code(), tonic::Code::Unavailable);
        let not_leader = propose_error_to_status(ProposeError::NotLeader { leader: None });
        assert_eq!(not_leader.code(), tonic::Code::Unavailable);
    }

    fn good() -> v1::AllocationSpec {
        v1::AllocationSpec {
            owner: "alice".into(),
            gang_size: 2,
            resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
            command: vec!["sleep".into(), "1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply_and_the_spec_round_trips() {
        let spec = spec_from_proto(Some(good()), &Limits::default()).unwrap();
        assert_eq!((spec.walltime_s, spec.max_retries, spec.checkpoint), (3600, 3, CheckpointMode::Auto));
        assert_eq!(spec.idempotency_key, None);
        let back = spec_from_proto(Some(spec_to_proto(&spec)), &Limits::default()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn each_bad_field_is_named() {
        let limits = Limits::default();
        let cases: Vec<(Option<v1::AllocationSpec>, &str)> = vec![
            (None, "invalid spec:"),
            (Some(v1::AllocationSpec { resources: None, ..good() }), "invalid spec.resources:"),
            (Some(v1::AllocationSpec { preemption_class: 11, ..good() }), "invalid spec.preemption_class:"),
            (Some(v1::AllocationSpec { preemption_class: 300, ..good() }), "invalid spec.preemption_class:"),
            (Some(v1::AllocationSpec { checkpoint: 9, ..good() }), "invalid spec.checkpoint:"),
            (Some(v1::AllocationSpec { gang_size: 0, ..good() }), "invalid spec.gang_size:"),
            (Some(v1::AllocationSpec { command: vec![], ..good() }), "invalid spec.command:"),
            (Some(v1::AllocationSpec { owner: String::new(), ..good() }), "invalid spec.owner:"),
        ];
        // Every resource amount is bounded (issue 22, item 12).
        let with = |r: v1::Resources| Some(v1::AllocationSpec { resources: Some(r), ..good() });
        let r = good().resources.unwrap();
        let cases = cases.into_iter().chain([
            (with(v1::Resources { mem_mb: u64::MAX, ..r }), "invalid spec.resources.mem_mb:"),
            (with(v1::Resources { vram_mb: u64::MAX, ..r }), "invalid spec.resources.vram_mb:"),
            (with(v1::Resources { cpus: u32::MAX, ..r }), "invalid spec.resources.cpus:"),
            (with(v1::Resources { gpus: u32::MAX, ..r }), "invalid spec.resources.gpus:"),
        ]);
        for (spec, prefix) in cases {
            let status = spec_from_proto(spec, &limits).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(prefix), "{prefix:?} vs {:?}", status.message());
        }
    }

    #[test]
    fn a_redirect_carries_the_leader_in_metadata() {
        let s = not_leader_status(Some((2, "127.0.0.1:7002".into())));
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(s.metadata().get(LEADER_ID_HEADER).unwrap(), "2");
        assert_eq!(s.metadata().get(LEADER_ADDR_HEADER).unwrap(), "127.0.0.1:7002");
        assert!(s.message().contains("replica 2 at 127.0.0.1:7002"));
    }
}
