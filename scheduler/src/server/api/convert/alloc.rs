//! Allocations and their specs: the submitted spec checked field by field,
//! and the wire form of what the state holds.

use muster_core::history::JobRecord;
use muster_proto::v1;
use tonic::Status;

use super::invalid;
use super::{DEFAULT_MAX_RETRIES, DEFAULT_WALLTIME_S, rejection_to_status};
use crate::sm::{
    AllocSpec, AllocStatus, Allocation, CheckpointMode, DEFAULT_CHECKPOINT_ESTIMATE_S, DEFAULT_RENDEZVOUS_PORTS,
    DEFAULT_VCLUSTER, LabelExpr, Limits, MAX_PREEMPTION_CLASS, Packing, Placement, Resources, State, TaskStatus,
    TeardownCause, VClusterType, validate_spec,
};

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
    let mut constraints = Vec::new();
    for c in &p.constraints {
        constraints.extend(LabelExpr::parse_list(c).map_err(|e| invalid("spec.constraints", e))?);
    }
    // An image runs only where an agent can run images.
    if !p.image.is_empty() {
        let runs_images = LabelExpr::parse_list(crate::sm::IMAGES_LABEL).expect("a label name is an expression");
        for e in runs_images {
            if !constraints.contains(&e) {
                constraints.push(e);
            }
        }
    }
    let pack_by = Some(p.pack_by.trim())
        .filter(|s| !s.is_empty())
        .map(Packing::parse)
        .transpose()
        .map_err(|e| invalid("spec.pack_by", e))?;
    let checkpoint_store = Some(p.checkpoint_store.trim())
        .filter(|s| !s.is_empty())
        .map(crate::sm::CheckpointStore::parse)
        .transpose()
        .map_err(|e| invalid("spec.checkpoint_store", e))?;
    if p.after.len() > crate::sm::MAX_DEPENDENCIES {
        return Err(invalid(
            "spec.after",
            format!("{} dependencies; the most is {}", p.after.len(), crate::sm::MAX_DEPENDENCIES),
        ));
    }
    let mut deps = Vec::with_capacity(p.after.len());
    for d in &p.after {
        let when =
            if d.when.is_empty() { Some(crate::sm::AfterWhen::Ok) } else { crate::sm::AfterWhen::parse(&d.when) };
        let when = when.ok_or_else(|| {
            invalid(
                "spec.after",
                format!("{:?} is not one of ok, any, notok, started", d.when.chars().take(32).collect::<String>()),
            )
        })?;
        deps.push(crate::sm::Dependency { on: d.id, when });
    }
    let after = crate::sm::After { deps, any_of: p.after_any_of, keep_if_unsatisfiable: p.keep_if_unsatisfiable };
    let container = container_from_proto(&p.image, &p.mounts, &p.workdir)?;
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
        ports: p.ports.unwrap_or(DEFAULT_RENDEZVOUS_PORTS),
        placement: Placement { constraints, pack_by },
        checkpoint_store,
        name: p.name,
        pids_max: p.pids_max,
        after,
        container,
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
        ports: Some(s.ports),
        constraints: s.placement.constraints.iter().map(ToString::to_string).collect(),
        pack_by: s.placement.pack_by.as_ref().map(ToString::to_string).unwrap_or_default(),
        checkpoint_store: s.checkpoint_store.as_ref().map(|c| c.spec()).unwrap_or_default(),
        name: s.name.clone(),
        pids_max: s.pids_max,
        after: s.after.deps.iter().map(|d| v1::Dependency { id: d.on, when: d.when.as_str().to_string() }).collect(),
        after_any_of: s.after.any_of,
        keep_if_unsatisfiable: s.after.keep_if_unsatisfiable,
        image: s.container.as_ref().map(|c| c.image.to_string()).unwrap_or_default(),
        mounts: s.container.as_ref().map(|c| c.mounts.iter().map(ToString::to_string).collect()).unwrap_or_default(),
        workdir: s.container.as_ref().and_then(|c| c.workdir.clone()).unwrap_or_default(),
    }
}

/// The container part of a spec: `None` without an image; mounts and a
/// working directory only with one.
fn container_from_proto(
    image: &str,
    mounts: &[String],
    workdir: &str,
) -> Result<Option<crate::sm::ContainerSpec>, Status> {
    if image.is_empty() {
        if !mounts.is_empty() {
            return Err(invalid("spec.mounts", "mounts need an image (--image)"));
        }
        if !workdir.is_empty() {
            return Err(invalid("spec.workdir", "a working directory needs an image (--image)"));
        }
        return Ok(None);
    }
    let image = crate::sm::ImageRef::parse(image).map_err(|e| invalid("spec.image", e))?;
    let mounts = mounts
        .iter()
        .map(|m| crate::sm::Mount::parse(m).map_err(|e| invalid("spec.mounts", e)))
        .collect::<Result<Vec<_>, _>>()?;
    let workdir = Some(workdir.to_string()).filter(|w| !w.is_empty());
    Ok(Some(crate::sm::ContainerSpec { image, mounts, workdir }))
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
        AllocStatus::Waiting => v1::AllocationStatus::Waiting,
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
        Ok(v1::AllocationStatus::Waiting) => AllocStatus::Waiting,
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
                checkpoint_bytes: t.checkpoints.first().map_or(0, |c| c.bytes),
                checkpoint_epoch: t.checkpoints.first().map(|c| c.epoch),
                checkpoints: t.checkpoints.iter().map(super::manifest_to_proto).collect(),
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
        ports: a.ports.iter().map(|&p| u32::from(p)).collect(),
        secret_names: a.secret_names.clone(),
        failures: a.failures,
        image_pull_failures: a.image_pull_failures,
        last_failure: a.last_failure.as_ref().map(|f| v1::Failure {
            task: f.task,
            attempt: f.run,
            exit_code: f.exit_code,
            not_started: f.not_started,
            stderr_tail: f.tail.clone().unwrap_or_default(),
            early: f.early,
            at_ms: f.at_ms,
            oom_killed: f.oom.is_some(),
            memory_limit_bytes: f.oom.map_or(0, |o| o.limit_bytes),
            peak_memory_bytes: f.oom.map_or(0, |o| o.peak_bytes),
        }),
        retry_after_ms: a.retry_after_ms,
        failed_reason: failed_reason(a),
        array_id: state.array_of(a.id).map_or(0, |(array, _)| array.id),
        array_index: state
            .array_of(a.id)
            .and_then(|(array, position)| array.indices.index_at(position))
            .unwrap_or_default(),
        compacted: false,
    }
}

/// The wire form of a compacted allocation, from its job-history record
/// (`compacted` set). An element of an array still held takes the array's
/// spec, which is its own but for the index; any other gets the spec's
/// parts the record keeps. Each task shows its last attempt.
pub fn record_to_alloc_proto(r: &JobRecord, array_spec: Option<&AllocSpec>) -> v1::Allocation {
    let spec = match array_spec {
        Some(spec) => v1::AllocationSpec { idempotency_key: String::new(), ..spec_to_proto(spec) },
        None => spec_to_proto(&AllocSpec { idempotency_key: r.idempotency_key.clone(), ..r.spec() }),
    };
    let task_status = match r.status {
        AllocStatus::Done => TaskStatus::Done,
        AllocStatus::Failed => TaskStatus::Failed,
        _ => TaskStatus::Cancelled,
    };
    let tasks = (0..r.gang_size)
        .map(|index| {
            let attempts: Vec<_> = r.attempts.iter().filter(|a| a.task == index).collect();
            let last = attempts.iter().max_by_key(|a| a.run);
            v1::Task {
                index,
                status: task_status_to_proto(task_status) as i32,
                runs: last.map_or(0, |a| a.run),
                attempts: attempts.len() as u32,
                started_at_ms: last.map(|a| a.start_ms),
                finished_at_ms: Some(last.map_or(r.end_ms, |a| a.end_ms)),
                exit_code: last.and_then(|a| a.exit_code),
                last_node_id: last.map(|a| a.node.clone()).unwrap_or_default(),
                watchdog_trips: attempts.iter().filter(|a| a.watchdog.is_some()).count() as u32,
                last_watchdog: last.and_then(|a| a.watchdog).map(|k| k.as_str().to_string()).unwrap_or_default(),
                ..Default::default()
            }
        })
        .collect();
    v1::Allocation {
        id: r.id,
        spec: Some(spec),
        submit_time_ms: r.submit_ms,
        status: alloc_status_to_proto(r.status) as i32,
        tasks,
        finished_at_ms: Some(r.end_ms),
        preempted_count: r.preemptions,
        failed_reason: if r.status == AllocStatus::Failed { r.reason.clone() } else { String::new() },
        array_id: r.array.map_or(0, |(a, _)| a),
        array_index: r.array.map_or(0, |(_, i)| i),
        compacted: true,
        ..Default::default()
    }
}

/// The wire form of a job array, its elements counted by status.
pub fn array_to_proto(array: &crate::sm::JobArray, state: &State) -> v1::JobArray {
    let counts = state.array_counts(array);
    let mut indices = array.indices.clone();
    indices.throttle = 0;
    v1::JobArray {
        id: array.id,
        owner: array.spec.owner.clone(),
        name: array.spec.name.clone(),
        indices: indices.to_string(),
        throttle: array.indices.throttle,
        count: array.count(),
        pending: counts.pending,
        by_status: counts.by_status.iter().map(|(s, n)| (s.as_str().to_string(), *n)).collect(),
        submit_time_ms: array.submit_time_ms,
        finished: array.finished_at_ms.is_some(),
        status: array.final_status().map_or("running", |s| s.as_str()).to_string(),
        after_corr: array.corr.unwrap_or_default(),
        spec: Some(spec_to_proto(&array.spec)),
    }
}

/// Why a failed allocation failed: its `AllocationFailed` event's reason
/// (the last event it recorded, so never dropped from its history).
fn failed_reason(a: &Allocation) -> String {
    if a.status != AllocStatus::Failed {
        return String::new();
    }
    a.history
        .iter()
        .rev()
        .find_map(|e| match &e.event {
            muster_core::sm::Event::AllocationFailed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .or_else(|| a.give_up.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
