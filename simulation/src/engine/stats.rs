//! What a run counts: starts, failures, teardowns and preemptions, the
//! queueing delay of each gang, GPU time by model, and the finished
//! allocations' outcomes; and the report made of them.

use std::collections::{BTreeMap, BTreeSet};

use muster_core::sm::{AllocId, Command};
use muster_core::tick::Pass;

use super::Simulation;
use crate::report::{Distribution, Report};

/// The run's counters.
#[derive(Default)]
pub(super) struct Stats {
    /// Submits the state accepted.
    pub(super) accepted_submits: u64,
    /// Live gangs that have run whole at least once.
    pub(super) started_whole: BTreeSet<AllocId>,
    /// Each gang's queue delay (submit to first running whole), s, and
    /// those of gangs of 8 GPUs or more.
    pub(super) delays_s: Vec<f64>,
    pub(super) delays_large_s: Vec<f64>,
    /// Each finished workflow's makespan (submit to its last step's end), s.
    pub(super) workflow_makespans_s: Vec<f64>,
    /// Finished allocations, from their records: done, failed, preempted at
    /// least once, the most preemptions of one.
    pub(super) finished_done: u64,
    pub(super) finished_failed: u64,
    pub(super) finished_preempted: u64,
    pub(super) finished_max_preempted: u32,
    pub(super) busy_gpu_ms: u128,
    /// GPU-ms used, by node model.
    pub(super) busy_by_model: BTreeMap<String, u128>,
    /// Queueing delays, by the GPU model a job asked for (`any`: none).
    pub(super) delays_by_model: BTreeMap<String, Vec<f64>>,
    pub(super) commands: u64,
    pub(super) rejected_reports: u64,
    pub(super) admission_passes: u64,
    pub(super) rollbacks: u64,
    pub(super) teardowns: u64,
    pub(super) preemptions: u64,
    pub(super) tasks_started: u64,
    pub(super) task_failures: u64,
    pub(super) last_finish_ms: u64,
    /// The first start backfill planned for each gang not reserved since.
    pub(super) first_planned: BTreeMap<AllocId, u64>,
    pub(super) planned_starts: u64,
    /// Gangs reserved after their first planned start, and the most late
    /// one was (ms).
    pub(super) late: u64,
    pub(super) max_late_ms: u64,
    pub(super) backfilled: u64,
    pub(super) nodes_lost: u64,
    pub(super) forced_teardowns: u64,
    pub(super) expired_holds: u64,
    pub(super) drain_expiries: u64,
    pub(super) reclaims: u64,
}

impl Stats {
    /// Counts what a pass decided.
    pub(super) fn passed(&mut self, pass: &Pass) {
        match pass {
            Pass::Admission(plan) => {
                self.admission_passes += 1;
                for p in &plan.planned {
                    if let std::collections::btree_map::Entry::Vacant(e) = self.first_planned.entry(p.alloc) {
                        e.insert(p.start_ms);
                        self.planned_starts += 1;
                    }
                }
                self.backfilled += plan.stats.backfilled as u64;
            }
            Pass::Preemption { reclaims, .. } => self.reclaims += *reclaims as u64,
            Pass::NodeLost(cmds) => self.nodes_lost += cmds.len() as u64,
            Pass::Deadlines(cmds) => {
                for cmd in cmds {
                    match cmd {
                        Command::ForceTeardown { .. } => self.forced_teardowns += 1,
                        Command::ExpireNomination { .. } => self.expired_holds += 1,
                        Command::ExpireDrain { .. } => self.drain_expiries += 1,
                        _ => {}
                    }
                }
            }
        }
    }
}

impl Simulation {
    /// Utilisation and queueing per GPU model, for a fleet of several.
    fn per_model(&self, makespan_ms: u64) -> Vec<crate::report::ModelReport> {
        let mut fleet: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
        for (i, model) in self.agents.models.iter().enumerate() {
            let e = fleet.entry(model.as_str()).or_default();
            e.0 += 1;
            e.1 += u64::from(self.cfg.node_at(i).0.gpus);
        }
        if fleet.len() < 2 {
            return Vec::new();
        }
        fleet
            .into_iter()
            .map(|(model, (nodes, gpus))| {
                let busy = self.stats.busy_by_model.get(model).copied().unwrap_or(0) as f64;
                let capacity = makespan_ms as f64 * gpus as f64;
                crate::report::ModelReport {
                    model: model.to_string(),
                    nodes,
                    gpus,
                    utilisation: if capacity > 0.0 { busy / capacity } else { 0.0 },
                    queue_delay_s: Distribution::of(self.stats.delays_by_model.get(model).cloned().unwrap_or_default()),
                }
            })
            .collect()
    }

    pub(super) fn report(&self) -> Report {
        let first_submit = self.jobs.first().map_or(0, |j| j.submit_ms);
        let live = || self.state.allocs().values().filter(|a| !a.status.is_terminal());
        let gpus_total: u64 = (0..self.cfg.node_count() as usize).map(|i| u64::from(self.cfg.node_at(i).0.gpus)).sum();
        let makespan_ms = self.stats.last_finish_ms.saturating_sub(first_submit);
        let utilisation = if makespan_ms == 0 || gpus_total == 0 {
            0.0
        } else {
            self.stats.busy_gpu_ms as f64 / (makespan_ms as f64 * gpus_total as f64)
        };
        Report {
            seed: self.cfg.seed,
            policy: format!(
                "{:?}{}",
                self.cfg.admission.order,
                if self.cfg.admission.backfill { "+backfill" } else { "" }
            ),
            nodes: self.cfg.node_count(),
            gpus_total,
            allocations: self.jobs.len() as u64,
            completed: self.stats.finished_done,
            failed: self.stats.finished_failed,
            unfinished: live().count() as u64,
            rejected_submits: self.jobs.len() as u64 - self.stats.accepted_submits,
            tasks_started: self.stats.tasks_started,
            task_failures: self.stats.task_failures,
            rollbacks: self.stats.rollbacks,
            teardowns: self.stats.teardowns,
            preemptions: self.stats.preemptions,
            preempted_allocations: self.stats.finished_preempted
                + live().filter(|a| a.preempted_count > 0).count() as u64,
            max_preempted_count: live().map(|a| a.preempted_count).fold(self.stats.finished_max_preempted, u32::max),
            rejected_reports: self.stats.rejected_reports,
            nodes_lost: self.stats.nodes_lost,
            forced_teardowns: self.stats.forced_teardowns,
            expired_holds: self.stats.expired_holds,
            drain_expiries: self.stats.drain_expiries,
            reclaims: self.stats.reclaims,
            admission_passes: self.stats.admission_passes,
            commands: self.stats.commands,
            queue_delay_s: Distribution::of(self.stats.delays_s.clone()),
            queue_delay_large_s: Distribution::of(self.stats.delays_large_s.clone()),
            arrays: self.jobs.iter().filter(|j| j.array.is_some()).count() as u64,
            workflows: self.jobs.iter().filter(|j| j.workflow.is_some()).count() as u64,
            workflow_makespan_s: Distribution::of(self.stats.workflow_makespans_s.clone()),
            planned_starts: self.stats.planned_starts,
            planned_start_late: self.stats.late,
            planned_start_max_late_s: self.stats.max_late_ms as f64 / 1000.0,
            backfilled: self.stats.backfilled,
            utilisation,
            makespan_s: makespan_ms as f64 / 1000.0,
            state_digest: self.state.state_digest().to_string(),
            per_model: self.per_model(makespan_ms),
            queue_delay_any_model_s: (self.stats.delays_by_model.len() > 1
                || !self.stats.delays_by_model.contains_key("any"))
            .then(|| Distribution::of(self.stats.delays_by_model.get("any").cloned().unwrap_or_default())),
        }
    }
}
