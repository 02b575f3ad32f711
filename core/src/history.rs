//! The job history's record of a finished allocation: what stays once the
//! live state forgets it. Built from the state at the moment the allocation
//! finishes, the same on every replica; each replica's shell stores it
//! (`muster-history`, SQLite) at most once, by sequence number.

use serde::{Deserialize, Serialize};

use crate::sm::{
    After, AllocId, AllocSpec, AllocStatus, Allocation, AttemptEnd, AttemptUsage, CheckpointMode, Event, Placement,
    Resources, State, VClusterType, WatchdogKind,
};

/// One finished allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Its place in the order allocations finished (1 for the first).
    pub seq: u64,
    /// The allocation id.
    pub id: AllocId,
    /// Its owner.
    pub owner: String,
    /// Its vCluster.
    pub vcluster: String,
    /// Its preemption class.
    pub class: u8,
    /// Its priority.
    pub priority: i32,
    /// Gang size.
    pub gang_size: u32,
    /// Per-task resources.
    pub resources: Resources,
    /// The command each task ran.
    pub command: Vec<String>,
    /// The submit's idempotency key, if it had one.
    pub idempotency_key: Option<String>,
    /// Entry time of the submit.
    pub submit_ms: u64,
    /// Entry time of its first task start (`None`: never ran).
    pub start_ms: Option<u64>,
    /// Entry time it finished.
    pub end_ms: u64,
    /// Done, failed or cancelled.
    pub status: AllocStatus,
    /// Why it failed or was cancelled, in words (empty when done).
    pub reason: String,
    /// Priority preemptions it went through.
    pub preemptions: u32,
    /// Watchdog trips over all its tasks.
    pub watchdog_trips: u32,
    /// GPU-seconds over all its attempts.
    pub gpu_seconds: u64,
    /// Its tasks' attempts, by task then attempt.
    pub attempts: Vec<AttemptRecord>,
    /// For an element of a job array: the array's id and the element's
    /// index.
    pub array: Option<(AllocId, u32)>,
    /// What `muster replay` needs of the spec beyond the fields above
    /// (`None`: a record stored before records carried it).
    pub shape: Option<RecordedShape>,
    /// Why it waited: its wait timeline (empty in a record stored before
    /// records carried it).
    pub waits: crate::sm::WaitLog,
}

impl JobRecord {
    /// The spec this record keeps: its owner, vCluster, class, priority,
    /// gang, resources, command and shape. What it does not keep (the
    /// environment, image, secrets, idempotency key) is left at its default.
    pub fn spec(&self) -> AllocSpec {
        let mut spec = AllocSpec::new(self.owner.clone(), self.gang_size, self.resources, self.command.clone());
        spec.vcluster = self.vcluster.clone();
        spec.preemption_class = self.class;
        spec.priority = self.priority;
        if let Some(shape) = &self.shape {
            shape.apply_to(&mut spec);
        }
        spec
    }
}

/// The parts of a spec that decide where and how long a job may run, kept
/// so that a replay (`muster replay`) submits the same job again. The
/// command, environment, secrets and image stay out: a replay runs nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedShape {
    /// Its placement constraints and packing.
    pub placement: Placement,
    /// Its retry budget.
    pub max_retries: u32,
    /// Its checkpoint mode.
    pub checkpoint: CheckpointMode,
    /// Its checkpoint estimate, seconds.
    pub checkpoint_estimate_s: u32,
    /// Its walltime, seconds.
    pub walltime_s: u64,
    /// Rendezvous ports per task.
    pub ports: u32,
    /// Its vCluster's type at submit.
    pub vcluster_type: VClusterType,
    /// Marked sensitive (never preempted).
    pub sensitive: bool,
    /// What it waited for (allocation ids of this cluster).
    pub after: After,
}

impl RecordedShape {
    /// The shape of `spec`.
    pub fn of(spec: &AllocSpec) -> RecordedShape {
        RecordedShape {
            placement: spec.placement.clone(),
            max_retries: spec.max_retries,
            checkpoint: spec.checkpoint,
            checkpoint_estimate_s: spec.checkpoint_estimate_s,
            walltime_s: spec.walltime_s,
            ports: spec.ports,
            vcluster_type: spec.vcluster_type,
            sensitive: spec.sensitive,
            after: spec.after.clone(),
        }
    }

    /// Puts this shape onto `spec`.
    pub fn apply_to(&self, spec: &mut AllocSpec) {
        spec.placement = self.placement.clone();
        spec.max_retries = self.max_retries;
        spec.checkpoint = self.checkpoint;
        spec.checkpoint_estimate_s = self.checkpoint_estimate_s;
        spec.walltime_s = self.walltime_s;
        spec.ports = self.ports;
        spec.vcluster_type = self.vcluster_type;
        spec.sensitive = self.sensitive;
        spec.after = self.after.clone();
    }
}

/// One attempt of one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The task.
    pub task: u32,
    /// The attempt number (1 for the first).
    pub run: u32,
    /// The node it ran on.
    pub node: String,
    /// Entry time of its start.
    pub start_ms: u64,
    /// Entry time of its end.
    pub end_ms: u64,
    /// How it ended.
    pub end: AttemptEnd,
    /// Its exit code (`None`: it had none, e.g. killed by a signal).
    pub exit_code: Option<i32>,
    /// GPUs × seconds it held them.
    pub gpu_seconds: u64,
    /// Stopped by a priority preemption or reclamation.
    pub preempted: bool,
    /// The watchdog that stopped it.
    pub watchdog: Option<WatchdogKind>,
    /// What it used, from its cgroup (`None`: not reported).
    pub usage: Option<AttemptUsage>,
}

impl JobRecord {
    /// The record of a finished allocation as `state` holds it.
    pub fn of(state: &State, a: &Allocation) -> JobRecord {
        let end_ms = a.finished_at_ms.unwrap_or(state.now_ms());
        let gpus = u64::from(a.spec.resources.gpus);
        let attempts: Vec<AttemptRecord> = a
            .tasks
            .iter()
            .flat_map(|t| {
                t.attempt_log.iter().map(move |at| {
                    let end = at.ended_ms.unwrap_or(end_ms).max(at.started_ms);
                    AttemptRecord {
                        task: t.index,
                        run: at.run,
                        node: state.node(at.node).id.to_string(),
                        start_ms: at.started_ms,
                        end_ms: end,
                        end: at.end,
                        exit_code: at.exit_code,
                        gpu_seconds: gpus * (end - at.started_ms) / 1000,
                        preempted: at.preempted,
                        watchdog: at.watchdog,
                        usage: at.usage,
                    }
                })
            })
            .collect();
        let reason = match a.status {
            AllocStatus::Done => String::new(),
            _ => a
                .history
                .iter()
                .rev()
                .find_map(|h| match &h.event {
                    Event::AllocationFailed { reason, .. } => Some(reason.clone()),
                    Event::AllocationCancelled { .. } => Some("cancelled".to_string()),
                    _ => None,
                })
                .unwrap_or_else(|| a.status.as_str().to_string()),
        };
        JobRecord {
            seq: a.finish_seq,
            id: a.id,
            owner: a.spec.owner.clone(),
            vcluster: a.spec.vcluster.clone(),
            class: a.spec.preemption_class,
            priority: a.spec.priority,
            gang_size: a.spec.gang_size,
            resources: a.spec.resources,
            command: a.spec.command.clone(),
            idempotency_key: a.spec.idempotency_key.clone(),
            submit_ms: a.submit_time_ms,
            start_ms: attempts.iter().map(|at| at.start_ms).min(),
            end_ms,
            status: a.status,
            reason,
            preemptions: a.preempted_count,
            watchdog_trips: a.tasks.iter().map(|t| t.watchdog_trips).sum(),
            gpu_seconds: attempts.iter().map(|at| at.gpu_seconds).sum(),
            attempts,
            array: state
                .array_of(a.id)
                .and_then(|(array, position)| Some((array.id, array.indices.index_at(position)?))),
            shape: Some(RecordedShape::of(&a.spec)),
            waits: a.waits.clone(),
        }
    }
}
