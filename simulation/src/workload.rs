//! The seeded synthetic workload: Poisson arrivals, a mix of gang sizes and
//! GPU counts, log-uniform durations, and random preemption classes.

use muster_core::sm::{
    AfterWhen, AllocSpec, ArrayIndices, ArrayRange, CheckpointMode, Resources, WorkflowSpec, WorkflowStep,
};

use crate::job::Job;
use crate::rng::SimRng;

/// The knobs of the synthetic workload.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadConfig {
    /// How many allocations to submit.
    pub allocations: u32,
    /// Mean arrivals per second; `None` sizes it to `target_load` of the cluster.
    pub arrival_rate_per_s: Option<f64>,
    /// With no explicit rate: the share of the cluster's GPUs the offered load
    /// should keep busy (above 1.0 the queue grows without bound).
    pub target_load: f64,
    /// Gang sizes and their weights.
    pub gang_mix: Vec<(u32, u32)>,
    /// GPUs per task and their weights (a gang task of size > 1 takes whole nodes' worth more often).
    pub gpu_mix: Vec<(u32, u32)>,
    /// Shortest and longest task duration, seconds (log-uniform between).
    pub duration_s: (u64, u64),
    /// The share of submissions that are job arrays of 2 to 50 one-task
    /// elements, each running the drawn duration.
    pub array_share: f64,
    /// The share of submissions that are three-step workflows: `prep` (one
    /// task, a quarter of the duration) → `train` (the drawn gang) →
    /// `eval` (one task, a quarter).
    pub workflow_share: f64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            allocations: 1_000,
            arrival_rate_per_s: None,
            target_load: 0.9,
            gang_mix: vec![(60, 1), (15, 2), (12, 4), (9, 8), (4, 16)],
            gpu_mix: vec![(40, 1), (15, 2), (20, 4), (25, 8)],
            duration_s: (60, 4 * 3600),
            array_share: 0.0,
            workflow_share: 0.0,
        }
    }
}

impl WorkloadConfig {
    fn mean_gpu_seconds(&self) -> f64 {
        let mean = |mix: &[(u32, u32)]| {
            let total: f64 = mix.iter().map(|&(w, _)| f64::from(w)).sum();
            mix.iter().map(|&(w, v)| f64::from(w) * f64::from(v)).sum::<f64>() / total
        };
        let (lo, hi) = (self.duration_s.0.max(1) as f64, self.duration_s.1.max(1) as f64);
        let mean_duration = if hi > lo { (hi - lo) / (hi / lo).ln() } else { lo };
        let one_task = mean(&self.gpu_mix) * mean_duration;
        let plain = mean(&self.gang_mix) * one_task;
        // An array: 26 one-task elements on average; a workflow: the gang
        // and two one-task steps of a quarter of its duration.
        let array = 26.0 * one_task;
        let workflow = plain + one_task / 2.0;
        let (a, w) = (self.array_share, self.workflow_share);
        (1.0 - a - w) * plain + a * array + w * workflow
    }

    /// Generates the jobs for a cluster of `total_gpus` GPUs of `node` each.
    pub fn generate(&self, seed: u64, node: &Resources, total_gpus: u64) -> Vec<Job> {
        let mut rng = SimRng::new(seed);
        let rate = self
            .arrival_rate_per_s
            .unwrap_or_else(|| (self.target_load * total_gpus as f64 / self.mean_gpu_seconds()).max(1e-6));
        let (lo, hi) = (self.duration_s.0.max(1) as f64, self.duration_s.1.max(1) as f64);
        let mut t_ms = 0.0f64;
        (0..self.allocations)
            .map(|i| {
                t_ms += rng.exp(1000.0 / rate);
                let gang = rng.weighted(&self.gang_mix);
                let gpus = rng.weighted(&self.gpu_mix).min(node.gpus);
                let duration_s = (lo * (hi / lo).powf(rng.unit())).round() as u64;
                let resources = Resources {
                    gpus,
                    vram_mb: if gpus > 0 { node.vram_mb / 2 } else { 0 },
                    mem_mb: node.mem_mb * u64::from(gpus.max(1)) / u64::from(node.gpus.max(1)) / 2,
                    cpus: (node.cpus * gpus.max(1) / node.gpus.max(1) / 2).max(1),
                };
                let mut spec = AllocSpec::new(
                    format!("user{}", rng.range(0, 19)),
                    gang,
                    resources,
                    vec!["train.py".into(), format!("--job={i}")],
                );
                spec.preemption_class = rng.range(0, 10) as u8;
                spec.priority = rng.range(0, 3) as i32;
                spec.checkpoint =
                    rng.weighted(&[(6, CheckpointMode::Auto), (2, CheckpointMode::Manual), (2, CheckpointMode::None)]);
                spec.walltime_s = duration_s * 2 + 600;
                spec.idempotency_key = Some(format!("sim-{i}"));
                let mut job = Job::plain(t_ms as u64, spec, duration_s * 1000);
                // Drawn only when asked for, so the plain workload's draws
                // (and its seeds' results) stay as they were.
                if self.array_share > 0.0 || self.workflow_share > 0.0 {
                    let u = rng.unit();
                    if u < self.array_share {
                        let n = rng.range(2, 50) as u32;
                        job.spec.gang_size = 1;
                        job.array = Some(ArrayIndices {
                            ranges: vec![ArrayRange { first: 0, last: n - 1, step: 1 }],
                            throttle: 0,
                        });
                    } else if u < self.array_share + self.workflow_share {
                        job.workflow = Some(workflow(i, &job.spec, job.duration_ms));
                    }
                }
                job
            })
            .collect()
    }
}

/// Workflow `i`: `prep` → `train` (`spec`'s gang) → `eval`, and how long
/// each step's tasks run.
fn workflow(i: u32, spec: &AllocSpec, duration_ms: u64) -> (WorkflowSpec, Vec<u64>) {
    let mut train = spec.clone();
    train.idempotency_key = None;
    let one = AllocSpec { gang_size: 1, ..train.clone() };
    let step = |name: &str, spec: &AllocSpec, after: &[u32]| WorkflowStep {
        name: name.to_string(),
        spec: spec.clone(),
        array: None,
        after_steps: after.iter().map(|&s| (s, AfterWhen::Ok)).collect(),
        corr_step: None,
    };
    let wf = WorkflowSpec {
        name: format!("wf-{i}"),
        owner: spec.owner.clone(),
        idempotency_key: spec.idempotency_key.clone(),
        steps: vec![step("prep", &one, &[]), step("train", &train, &[0]), step("eval", &one, &[1])],
    };
    let quarter = (duration_ms / 4).max(1_000);
    (wf, vec![quarter, duration_ms, quarter])
}
