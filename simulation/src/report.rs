//! What a simulation reports, as a readable summary or JSON.

use std::fmt;

use serde::Serialize;

/// Summary statistics of a sample (seconds, for queueing delays).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Sample size.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Distribution {
    /// Summarises `values` (any order).
    pub fn of(mut values: Vec<f64>) -> Distribution {
        if values.is_empty() {
            return Distribution::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Distribution {
            count: n as u64,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: values[n - 1],
        }
    }
}

/// The result of one simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The admission order used.
    pub policy: String,
    /// Nodes simulated.
    pub nodes: u32,
    /// GPUs in the cluster.
    pub gpus_total: u64,
    /// Allocations submitted.
    pub allocations: u64,
    /// Allocations that finished.
    pub completed: u64,
    /// Allocations that failed for good.
    pub failed: u64,
    /// Allocations left unfinished (e.g. larger than the cluster).
    pub unfinished: u64,
    /// Submissions the state machine refused (invalid for this cluster's limits).
    pub rejected_submits: u64,
    /// Task attempts started.
    pub tasks_started: u64,
    /// Task attempts that failed and were charged to the retry budget.
    pub task_failures: u64,
    /// Stale reservations rolled back.
    pub rollbacks: u64,
    /// Gang teardowns started (a task failed while siblings ran).
    pub teardowns: u64,
    /// Gangs preempted for a higher class (victims of committed decisions).
    pub preemptions: u64,
    /// Allocations preempted at least once.
    pub preempted_allocations: u64,
    /// The most times one allocation was preempted.
    pub max_preempted_count: u32,
    /// Agent claims and reports refused as stale (the attempt was torn down or re-placed).
    pub rejected_reports: u64,
    /// Nodes the leader's tick marked lost (crashed nodes holding work).
    pub nodes_lost: u64,
    /// Teardowns forced at their deadline (an agent never acked).
    pub forced_teardowns: u64,
    /// Preemptors' holds on nodes that expired.
    pub expired_holds: u64,
    /// Node drains that reached their deadline.
    pub drain_expiries: u64,
    /// Gangs reclaimed by the vCluster that lent their nodes.
    pub reclaims: u64,
    /// Admission passes run.
    pub admission_passes: u64,
    /// Commands applied.
    pub commands: u64,
    /// Submit → every task of the gang running, seconds.
    pub queue_delay_s: Distribution,
    /// The same, for allocations of 8 GPUs or more.
    pub queue_delay_large_s: Distribution,
    /// Of the submissions, job arrays (each counted once).
    pub arrays: u64,
    /// Of the submissions, workflows (each counted once).
    pub workflows: u64,
    /// Each finished workflow: submit → its last step's end, seconds.
    pub workflow_makespan_s: Distribution,
    /// Gangs backfill gave a planned start (the first gang of its vCluster
    /// that admission could not place).
    pub planned_starts: u64,
    /// Of those, gangs reserved later than the first start planned for them
    /// (a gang ranked ahead arrived and took the plan over; backfilled work
    /// alone never delays one while walltimes hold).
    pub planned_start_late: u64,
    /// The latest such reservation, seconds after its first planned start.
    pub planned_start_max_late_s: f64,
    /// Gangs placed ahead of a gang with a planned start.
    pub backfilled: u64,
    /// Busy GPU time / (GPUs × makespan).
    pub utilisation: f64,
    /// First submit → last allocation finished, seconds.
    pub makespan_s: f64,
    /// SHA-256 of the final state.
    pub state_digest: String,
    /// Per GPU model of the fleet (nodes without a `gpu.model` label as
    /// `-`), when the fleet has more than one: its utilisation, and the
    /// queueing delay of the jobs that asked for it.
    pub per_model: Vec<ModelReport>,
    /// Queueing delay of the jobs that asked for no GPU model, when some did.
    pub queue_delay_any_model_s: Option<Distribution>,
}

/// One GPU model's share of a heterogeneous run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelReport {
    /// The model (`gpu.model` label).
    pub model: String,
    /// Nodes of this model.
    pub nodes: u32,
    /// Their GPUs.
    pub gpus: u64,
    /// Busy GPU time on them / (their GPUs × makespan).
    pub utilisation: f64,
    /// Queueing delay of the jobs that asked for this model.
    pub queue_delay_s: Distribution,
}

fn duration(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={:<6} mean {:>9}  p50 {:>9}  p95 {:>9}  p99 {:>9}  max {:>9}",
            self.count,
            duration(self.mean),
            duration(self.p50),
            duration(self.p95),
            duration(self.p99),
            duration(self.max)
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cluster        {} nodes, {} GPUs; policy {}; seed {}",
            self.nodes, self.gpus_total, self.policy, self.seed
        )?;
        writeln!(
            f,
            "allocations    {} submitted: {} completed, {} failed, {} unfinished, {} refused at submit",
            self.allocations, self.completed, self.failed, self.unfinished, self.rejected_submits
        )?;
        writeln!(
            f,
            "tasks          {} attempts started, {} failed, {} stale reservations rolled back, {} stale reports refused",
            self.tasks_started, self.task_failures, self.rollbacks, self.rejected_reports
        )?;
        writeln!(f, "teardowns      {} gangs torn down after a partial failure", self.teardowns)?;
        writeln!(
            f,
            "preemptions    {} gangs preempted for a higher class ({} allocations, at most {} times each)",
            self.preemptions, self.preempted_allocations, self.max_preempted_count
        )?;
        writeln!(
            f,
            "leader tick    {} nodes marked lost, {} teardowns forced, {} holds expired, {} drains timed out, {} \
             reclaims",
            self.nodes_lost, self.forced_teardowns, self.expired_holds, self.drain_expiries, self.reclaims
        )?;
        if self.arrays + self.workflows > 0 {
            writeln!(f, "arrays         {} of the submissions were job arrays", self.arrays)?;
            writeln!(f, "workflows      {} submitted; makespan {}", self.workflows, self.workflow_makespan_s)?;
        }
        writeln!(f, "queueing delay {}", self.queue_delay_s)?;
        writeln!(f, "  >= 8 GPUs    {}", self.queue_delay_large_s)?;
        writeln!(
            f,
            "backfill       {} gangs ran ahead of a planned start; {} planned starts, {} reserved later than first \
             planned (at most {})",
            self.backfilled,
            self.planned_starts,
            self.planned_start_late,
            duration(self.planned_start_max_late_s)
        )?;
        writeln!(
            f,
            "utilisation    {:.1} % of GPU time over a makespan of {}",
            self.utilisation * 100.0,
            duration(self.makespan_s)
        )?;
        for m in &self.per_model {
            let asked = if m.queue_delay_s.count == 0 {
                "no job asked for it".to_string()
            } else {
                format!("jobs asking for it: queueing delay {}", m.queue_delay_s)
            };
            writeln!(
                f,
                "  {:<12} {} nodes, {} GPUs: utilisation {:.1} %; {asked}",
                m.model,
                m.nodes,
                m.gpus,
                m.utilisation * 100.0
            )?;
        }
        if let Some(any) = &self.queue_delay_any_model_s {
            writeln!(f, "  any model    jobs asking for none: queueing delay {any}")?;
        }
        writeln!(f, "log            {} commands, {} admission passes", self.commands, self.admission_passes)?;
        write!(f, "state digest   {}", self.state_digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let d = Distribution::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((d.count, d.p50, d.p95, d.p99, d.max), (100, 50.0, 95.0, 99.0, 100.0));
        assert_eq!(d.mean, 50.5);
        let one = Distribution::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert_eq!(Distribution::of(vec![]), Distribution::default());
    }
}
