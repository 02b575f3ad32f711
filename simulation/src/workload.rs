//! The seeded synthetic workload: Poisson arrivals, a mix of gang sizes and
//! GPU counts, log-uniform durations, and random preemption classes.

use muster_core::sm::{AllocSpec, CheckpointMode, Resources};

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
        mean(&self.gang_mix) * mean(&self.gpu_mix) * mean_duration
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
                Job { submit_ms: t_ms as u64, spec, duration_ms: duration_s * 1000 }
            })
            .collect()
    }
}
