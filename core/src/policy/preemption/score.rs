//! What a preemption costs: the preemptor's value and each victim's cost,
//! in GPU-seconds (the formulas are in the parent module's docs).

use super::PreemptionConfig;
use crate::sm::{AllocId, Allocation, CheckpointMode, Placement, Resources, State, VClusterType};

/// What a decision needs to know of the preemptor (an allocation, or a spec
/// not yet submitted, for a dry run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemptor {
    /// Its id (`None` for a dry run).
    pub alloc: Option<AllocId>,
    /// Its class.
    pub class: u8,
    /// Its gang size.
    pub gang_size: u32,
    /// Per-task resources.
    pub resources: Resources,
    /// Its walltime, seconds.
    pub walltime_s: u64,
    /// The home key of its vCluster: it may take only that vCluster's home
    /// nodes and shared ones (`None`: any node).
    pub home: Option<u32>,
    /// Where its tasks may run (constraints, packing).
    pub placement: Placement,
}

impl Preemptor {
    /// The preemptor view of an allocation.
    pub fn of(state: &State, a: &Allocation) -> Preemptor {
        Preemptor {
            alloc: Some(a.id),
            class: a.spec.preemption_class,
            gang_size: a.spec.gang_size,
            resources: a.spec.resources,
            walltime_s: a.spec.walltime_s,
            home: Some(state.home_key(&a.spec.vcluster)),
            placement: a.spec.placement.clone(),
        }
    }

    /// Its value in GPU-seconds: G × W × class / 10.
    pub fn value(&self) -> u64 {
        gpu_equivalents(self.gang_size, &self.resources)
            .saturating_mul(self.walltime_s)
            .saturating_mul(u64::from(self.class))
            / 10
    }
}

/// GPUs a gang holds; a CPU-only task counts as one.
fn gpu_equivalents(gang_size: u32, r: &Resources) -> u64 {
    u64::from(gang_size) * u64::from(r.gpus.max(1))
}

/// One candidate's preemption cost, in GPU-seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimCost {
    /// The candidate.
    pub alloc: AllocId,
    /// Its class.
    pub class: u8,
    /// Its reservation epoch (the run the decision saw).
    pub epoch: u64,
    /// GPUs it holds (CPU-only tasks count one each).
    pub gpus: u64,
    /// Seconds it has run since it (re)started.
    pub elapsed_s: u64,
    /// G × checkpoint time, GPU-seconds.
    pub checkpoint_gpu_s: u64,
    /// G × elapsed, for checkpoint none, GPU-seconds.
    pub recompute_gpu_s: u64,
    /// G × elapsed × fraction of walltime done, GPU-seconds.
    pub value_gpu_s: u64,
}

impl VictimCost {
    /// The total cost.
    pub fn total(&self) -> u64 {
        self.checkpoint_gpu_s.saturating_add(self.recompute_gpu_s).saturating_add(self.value_gpu_s)
    }
}

/// Scores a running allocation (see the module docs for the formulas).
pub fn score(a: &Allocation, now_ms: u64, cfg: &PreemptionConfig) -> VictimCost {
    let g = gpu_equivalents(a.spec.gang_size, &a.spec.resources);
    let elapsed_s = now_ms.saturating_sub(a.running_since_ms().unwrap_or(now_ms)) / 1000;
    let mut checkpoint_s = match a.spec.checkpoint {
        CheckpointMode::Auto => u64::from(a.spec.checkpoint_estimate_s),
        CheckpointMode::Manual => cfg.checkpoint_timeout_ms / 1000,
        CheckpointMode::None => 0,
    };
    if a.spec.vcluster_type == VClusterType::MlTraining {
        checkpoint_s *= 2;
    }
    let recompute = if a.spec.checkpoint == CheckpointMode::None { g.saturating_mul(elapsed_s) } else { 0 };
    let walltime_s = a.spec.walltime_s.max(1);
    let mut value =
        (u128::from(g) * u128::from(elapsed_s) * u128::from(elapsed_s.min(walltime_s)) / u128::from(walltime_s)) as u64;
    if a.spec.vcluster_type == VClusterType::Interactive {
        value /= 2;
    }
    VictimCost {
        alloc: a.id,
        class: a.spec.preemption_class,
        epoch: a.reservation_epoch,
        gpus: g,
        elapsed_s,
        checkpoint_gpu_s: g.saturating_mul(checkpoint_s),
        recompute_gpu_s: recompute,
        value_gpu_s: value,
    }
}
