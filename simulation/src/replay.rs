//! Replaying a recorded workload (`muster replay`): the jobs a cluster
//! really ran, rebuilt from their job-history records, submitted again to
//! the simulator under the cluster's own settings (to measure fidelity) and
//! under changed ones (a what-if), and the three compared side by side.
//!
//! ```text
//!   records ──▶ workload_of ──▶ jobs (submit times, shapes, own runs, cancels, deps)
//!   fleet + vClusters + settings ──▶ Simulation::run_jobs ──▶ each job's start, end, preemptions
//!   actual (the records) │ replayed as recorded │ what-if ──▶ compare ──▶ ReplayReport
//! ```
//!
//! What a job did of its own accord is replayed as it happened: how long
//! each run lasted, whether it failed, when its owner cancelled it. What
//! the scheduler or the fleet did to it (where and when it started, its
//! preemptions, teardowns for a sibling's failure, lost nodes) is decided
//! again by the same core that decided it the first time.

use std::collections::BTreeMap;

use muster_core::history::JobRecord;
use muster_core::policy::{AdmissionConfig, PreemptionConfig, RetentionConfig};
use muster_core::sm::{AllocId, AllocStatus, AttemptEnd, CheckpointMode, Command, VClusterSpec};
use serde::Serialize;

use crate::engine::{SimConfig, SimError, Simulation};
use crate::fleet::FleetNode;
use crate::job::{Job, JobOutcome, Run, Script};
use crate::report::Distribution;

/// The most jobs one replay takes.
pub const MAX_REPLAY_JOBS: usize = 2_000_000;

/// The jobs the gain and loss lists show.
pub const TOP_JOBS: usize = 10;

/// The cluster a replay runs on and the settings it runs under.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplaySettings {
    /// The nodes, by id.
    pub nodes: Vec<FleetNode>,
    /// Every vCluster and its spec (`default` among them).
    pub vclusters: Vec<(String, VClusterSpec)>,
    /// Admission.
    pub admission: AdmissionConfig,
    /// Priority preemption (`None`: off).
    pub preemption: Option<PreemptionConfig>,
    /// Retention of finished allocations (`None`: kept).
    pub retention: Option<RetentionConfig>,
}

/// How long a replayed agent takes to claim what is reserved on it, ms (a
/// real agent on a healthy node claims in tens of milliseconds).
pub const REPLAY_CLAIM_MS: (u64, u64) = (20, 100);

/// How long a replayed task takes to stop when told to (teardown,
/// preemption, cancel), ms. The records do not say how long each really
/// took; a job that checkpoints for minutes makes the replay optimistic.
pub const REPLAY_STOP_MS: (u64, u64) = (20, 500);

/// The workload a set of records describes, as simulator jobs in submit
/// order with times relative to the first submit, and the record each job
/// came from. `horizon_ms` is when the records were taken (entry time):
/// an unfinished job that never started is cancelled there, and one that is
/// running ends there.
pub fn workload_of(records: &[JobRecord], horizon_ms: u64) -> (Vec<Job>, Vec<usize>) {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| (records[i].submit_ms, records[i].id));
    let t0 = order.first().map_or(0, |&i| records[i].submit_ms);
    let index_of: BTreeMap<AllocId, usize> = order.iter().enumerate().map(|(k, &i)| (records[i].id, k)).collect();
    let jobs = order
        .iter()
        .map(|&i| {
            let r = &records[i];
            let spec = r.spec();
            let after_jobs = spec.after.deps.iter().map(|d| index_of.get(&d.on).copied()).collect();
            let checkpoints = spec.checkpoint != CheckpointMode::None;
            let mut runs = vec![Vec::new(); r.gang_size as usize];
            // The work a checkpointing task saved in runs the scheduler
            // stopped: its next good run resumed after it, so the replay
            // runs it whole (and stops it wherever the replay preempts).
            let mut saved = vec![0u64; r.gang_size as usize];
            for a in &r.attempts {
                if a.preempted
                    && checkpoints
                    && let Some(s) = saved.get_mut(a.task as usize)
                {
                    *s += a.end_ms.saturating_sub(a.start_ms);
                }
                let own = match a.end {
                    AttemptEnd::Done | AttemptEnd::Running => Some(true),
                    AttemptEnd::Failed | AttemptEnd::OomKilled => Some(false),
                    AttemptEnd::Stopped | AttemptEnd::Lost | AttemptEnd::Cancelled | AttemptEnd::ImagePullFailed => {
                        None
                    }
                };
                if let (Some(ok), Some(task)) = (own, runs.get_mut(a.task as usize))
                    && !a.preempted
                {
                    let end = if a.end == AttemptEnd::Running { horizon_ms.max(a.start_ms) } else { a.end_ms };
                    let resumed = if ok { std::mem::take(&mut saved[a.task as usize]) } else { 0 };
                    task.push(Run { ms: end.saturating_sub(a.start_ms).max(1) + resumed, ok });
                }
            }
            let cancel_ms = match r.status {
                AllocStatus::Cancelled => Some(r.end_ms),
                s if !s.is_terminal() && r.start_ms.is_none() => Some(horizon_ms.max(r.submit_ms)),
                _ => None,
            };
            let submit_ms = r.submit_ms - t0;
            let duration_ms = runs.iter().flatten().map(|run| run.ms).max().unwrap_or(1);
            let mut job = Job::plain(submit_ms, spec, duration_ms);
            job.script = Some(Script { runs, cancel_ms: cancel_ms.map(|c| c.saturating_sub(t0)), after_jobs });
            job
        })
        .collect();
    (jobs, order)
}

/// One replay's result.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayRun {
    /// How each job fared, in the job list's order.
    pub outcomes: Vec<JobOutcome>,
    /// GPUs in the replayed cluster.
    pub gpus_total: u64,
    /// The final state's digest: the same input and settings give the same.
    pub digest: String,
    /// Simulated time from the first submit to the last finish, ms.
    pub span_ms: u64,
}

/// Replays `jobs` (from [`workload_of`]) under `settings`.
pub fn replay(jobs: Vec<Job>, settings: &ReplaySettings) -> Result<ReplayRun, SimError> {
    let setup = settings
        .vclusters
        .iter()
        .map(|(name, spec)| match name.as_str() {
            muster_core::sm::DEFAULT_VCLUSTER => {
                Command::UpdateVCluster { name: name.clone(), spec: spec.clone(), by: "replay".into() }
            }
            _ => Command::CreateVCluster { name: name.clone(), spec: spec.clone(), by: "replay".into() },
        })
        .collect();
    let gpus_total = settings.nodes.iter().map(|n| u64::from(n.resources.gpus)).sum();
    let cfg = SimConfig {
        seed: 1,
        admission: settings.admission,
        preemption: settings.preemption,
        retention: settings.retention,
        fleet: settings.nodes.clone(),
        setup,
        claim_delay_ms: REPLAY_CLAIM_MS,
        preempt_ack_ms: REPLAY_STOP_MS,
        ..SimConfig::default()
    };
    let (_, state, outcomes) = Simulation::new(cfg, jobs).run_jobs()?;
    let span_ms = outcomes.iter().filter_map(|o| o.end_ms.or(o.start_ms)).max().unwrap_or(0);
    Ok(ReplayRun { outcomes, gpus_total, digest: state.state_digest().to_string(), span_ms })
}

/// Waits, GPU use and preemptions of a set of jobs, in one column.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Jobs in the set.
    pub jobs: u64,
    /// Those that ever started.
    pub started: u64,
    /// Their waits, submit to first start, seconds.
    pub wait_s: Distribution,
    /// Their GPU-seconds over the cluster's GPU-seconds in the column's
    /// span: utilisation, for all jobs; a share of it, for a group.
    pub utilisation: f64,
    /// Preemptions they went through.
    pub preemptions: u64,
}

/// One group's three columns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupRow {
    /// The owner, vCluster or class.
    pub group: String,
    /// What really happened.
    pub actual: Summary,
    /// Replayed under the recorded settings.
    pub as_recorded: Summary,
    /// Replayed under the what-if's (absent without one).
    pub what_if: Option<Summary>,
}

/// How closely the replay as recorded matched what happened, over the jobs
/// that started in both.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Fidelity {
    /// Jobs compared.
    pub compared: u64,
    /// The absolute error of each job's replayed wait, seconds.
    pub abs_error_s: Distribution,
    /// The share of jobs whose replayed wait is within 10 % of the actual
    /// one (or within 1 s, about one admission pass and a claim).
    pub within_10pct: f64,
}

/// One job's waits in the three columns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobRow {
    /// The allocation id it had.
    pub id: AllocId,
    /// Its owner.
    pub owner: String,
    /// Its vCluster.
    pub vcluster: String,
    /// Its preemption class.
    pub class: u8,
    /// Tasks × GPUs per task.
    pub gpus: u64,
    /// Its submit, seconds after the first submit.
    pub submit_s: f64,
    /// Its actual wait, seconds (`None`: it never ran).
    pub actual_wait_s: Option<f64>,
    /// Replayed as recorded.
    pub as_recorded_wait_s: Option<f64>,
    /// Under the what-if.
    pub what_if_wait_s: Option<f64>,
    /// How it ended, really, and in the two replays ("" for unfinished).
    pub actual_status: String,
    /// As recorded.
    pub as_recorded_status: String,
    /// Under the what-if.
    pub what_if_status: String,
}

/// The side-by-side report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Jobs replayed.
    pub jobs: u64,
    /// Replayed as recorded against what happened.
    pub fidelity: Fidelity,
    /// All jobs.
    pub overall: GroupRow,
    /// By owner.
    pub by_owner: Vec<GroupRow>,
    /// By vCluster.
    pub by_vcluster: Vec<GroupRow>,
    /// By preemption class.
    pub by_class: Vec<GroupRow>,
    /// The jobs the what-if helped most (its wait minus the replayed one,
    /// most negative first).
    pub gainers: Vec<JobRow>,
    /// The jobs it hurt most.
    pub losers: Vec<JobRow>,
    /// The final state digests of the replays as recorded and under the
    /// what-if.
    pub digest_as_recorded: String,
    /// Under the what-if.
    pub digest_what_if: Option<String>,
    /// Every job.
    #[serde(skip)]
    pub rows: Vec<JobRow>,
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn status_name(s: Option<AllocStatus>) -> String {
    s.filter(|s| s.is_terminal()).map_or(String::new(), |s| s.as_str().to_string())
}

/// Compares what happened (`records`, in any order) with the replays of
/// the workload [`workload_of`] built from them (`order` maps the replay's
/// jobs to records).
pub fn compare(
    records: &[JobRecord],
    order: &[usize],
    actual_gpus: u64,
    as_recorded: &ReplayRun,
    what_if: Option<&ReplayRun>,
) -> ReplayReport {
    let t0 = order.first().map_or(0, |&i| records[i].submit_ms);
    let rows: Vec<JobRow> = order
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let r = &records[i];
            let submit = r.submit_ms - t0;
            let wait = |o: &JobOutcome| o.start_ms.map(|s| seconds(s.saturating_sub(submit)));
            JobRow {
                id: r.id,
                owner: r.owner.clone(),
                vcluster: r.vcluster.clone(),
                class: r.class,
                gpus: u64::from(r.gang_size) * u64::from(r.resources.gpus),
                submit_s: seconds(submit),
                actual_wait_s: r.start_ms.map(|s| seconds(s.saturating_sub(r.submit_ms))),
                as_recorded_wait_s: wait(&as_recorded.outcomes[k]),
                what_if_wait_s: what_if.and_then(|w| wait(&w.outcomes[k])),
                actual_status: status_name(Some(r.status)),
                as_recorded_status: status_name(as_recorded.outcomes[k].status),
                what_if_status: what_if.map_or(String::new(), |w| status_name(w.outcomes[k].status)),
            }
        })
        .collect();
    // The actual column's GPU time and span, from the records.
    let actual_span_ms = order.iter().map(|&i| records[i].end_ms.saturating_sub(t0)).max().unwrap_or(0);
    let summary = |members: &[usize], column: Column| -> Summary {
        let mut waits = Vec::new();
        let (mut gpu_s, mut preemptions) = (0u64, 0u64);
        for &k in members {
            let row = &rows[k];
            let (wait, gs, pre) = match column {
                Column::Actual => {
                    let r = &records[order[k]];
                    (row.actual_wait_s, r.gpu_seconds, u64::from(r.preemptions))
                }
                Column::AsRecorded => {
                    let o = &as_recorded.outcomes[k];
                    (row.as_recorded_wait_s, o.gpu_seconds, u64::from(o.preemptions))
                }
                Column::WhatIf(w) => {
                    let o = &w.outcomes[k];
                    (row.what_if_wait_s, o.gpu_seconds, u64::from(o.preemptions))
                }
            };
            waits.extend(wait);
            gpu_s += gs;
            preemptions += pre;
        }
        let (gpus, span_ms) = match column {
            Column::Actual => (actual_gpus, actual_span_ms),
            Column::AsRecorded => (as_recorded.gpus_total, as_recorded.span_ms),
            Column::WhatIf(w) => (w.gpus_total, w.span_ms),
        };
        let capacity = gpus as f64 * seconds(span_ms);
        Summary {
            jobs: members.len() as u64,
            started: waits.len() as u64,
            wait_s: Distribution::of(waits),
            utilisation: if capacity > 0.0 { gpu_s as f64 / capacity } else { 0.0 },
            preemptions,
        }
    };
    let row = |group: String, members: &[usize]| GroupRow {
        group,
        actual: summary(members, Column::Actual),
        as_recorded: summary(members, Column::AsRecorded),
        what_if: what_if.map(|w| summary(members, Column::WhatIf(w))),
    };
    let grouped = |key: &dyn Fn(&JobRow) -> (u8, String)| -> Vec<GroupRow> {
        let mut groups: BTreeMap<(u8, String), Vec<usize>> = BTreeMap::new();
        for (k, r) in rows.iter().enumerate() {
            groups.entry(key(r)).or_default().push(k);
        }
        groups.into_iter().map(|((_, g), members)| row(g, &members)).collect()
    };
    let all: Vec<usize> = (0..rows.len()).collect();
    let errors: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| Some(((r.as_recorded_wait_s? - r.actual_wait_s?).abs(), r.actual_wait_s?)))
        .collect();
    let within = errors.iter().filter(|(err, actual)| *err <= (0.1 * actual).max(1.0)).count();
    let fidelity = Fidelity {
        compared: errors.len() as u64,
        within_10pct: if errors.is_empty() { 0.0 } else { within as f64 / errors.len() as f64 },
        abs_error_s: Distribution::of(errors.iter().map(|(e, _)| *e).collect()),
    };
    let mut deltas: Vec<(f64, usize)> = rows
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some((r.what_if_wait_s? - r.as_recorded_wait_s?, k)))
        .filter(|(d, _)| *d != 0.0)
        .collect();
    deltas.sort_by(|a, b| a.0.total_cmp(&b.0).then(rows[a.1].id.cmp(&rows[b.1].id)));
    let gainers = deltas.iter().take_while(|(d, _)| *d < 0.0).take(TOP_JOBS).map(|&(_, k)| rows[k].clone()).collect();
    let losers =
        deltas.iter().rev().take_while(|(d, _)| *d > 0.0).take(TOP_JOBS).map(|&(_, k)| rows[k].clone()).collect();
    ReplayReport {
        jobs: rows.len() as u64,
        fidelity,
        overall: row("all".to_string(), &all),
        by_owner: grouped(&|r| (0, r.owner.clone())),
        by_vcluster: grouped(&|r| (0, r.vcluster.clone())),
        by_class: grouped(&|r| (r.class, format!("class {}", r.class))),
        gainers,
        losers,
        digest_as_recorded: as_recorded.digest.clone(),
        digest_what_if: what_if.map(|w| w.digest.clone()),
        rows,
    }
}

#[derive(Clone, Copy)]
enum Column<'a> {
    Actual,
    AsRecorded,
    WhatIf(&'a ReplayRun),
}

impl ReplayReport {
    /// Every job as CSV: a header, then one row per job in submit order.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "id,owner,vcluster,class,gpus,submit_s,actual_wait_s,as_recorded_wait_s,what_if_wait_s,actual_status,\
             as_recorded_status,what_if_status\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        for r in &self.rows {
            out += &format!(
                "{},{},{},{},{},{:.3},{},{},{},{},{},{}\n",
                r.id,
                csv_field(&r.owner),
                csv_field(&r.vcluster),
                r.class,
                r.gpus,
                r.submit_s,
                opt(r.actual_wait_s),
                opt(r.as_recorded_wait_s),
                opt(r.what_if_wait_s),
                r.actual_status,
                r.as_recorded_status,
                r.what_if_status
            );
        }
        out
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what_if = self.digest_what_if.is_some();
        writeln!(f, "jobs replayed       {}", self.jobs)?;
        let fi = &self.fidelity;
        writeln!(
            f,
            "fidelity            {} jobs compared: wait error mean {:.1} s, p50 {:.1} s, p95 {:.1} s; {:.0} % \
             within 10 % (or 1 s)",
            fi.compared,
            fi.abs_error_s.mean,
            fi.abs_error_s.p50,
            fi.abs_error_s.p95,
            100.0 * fi.within_10pct
        )?;
        writeln!(f, "digest as recorded  {}", self.digest_as_recorded)?;
        if let Some(d) = &self.digest_what_if {
            writeln!(f, "digest what-if      {d}")?;
        }
        let columns = if what_if { "actual | as recorded | what-if" } else { "actual | as recorded" };
        let cells = |g: &GroupRow, pick: &dyn Fn(&Summary) -> String| -> String {
            let mut c = vec![pick(&g.actual), pick(&g.as_recorded)];
            if let Some(w) = &g.what_if {
                c.push(pick(w));
            }
            c.join(" | ")
        };
        writeln!(f, "\noverall             {columns}")?;
        let o = &self.overall;
        writeln!(f, "  jobs started      {}", cells(o, &|s| s.started.to_string()))?;
        writeln!(f, "  wait mean         {}", cells(o, &|s| format!("{:.1} s", s.wait_s.mean)))?;
        writeln!(f, "  wait p50          {}", cells(o, &|s| format!("{:.1} s", s.wait_s.p50)))?;
        writeln!(f, "  wait p95          {}", cells(o, &|s| format!("{:.1} s", s.wait_s.p95)))?;
        writeln!(f, "  utilisation       {}", cells(o, &|s| format!("{:.1} %", 100.0 * s.utilisation)))?;
        writeln!(f, "  preemptions       {}", cells(o, &|s| s.preemptions.to_string()))?;
        for (title, groups) in
            [("by owner", &self.by_owner), ("by vCluster", &self.by_vcluster), ("by class", &self.by_class)]
        {
            writeln!(f, "\n{title}: jobs, wait mean / p95 ({columns})")?;
            for g in groups {
                writeln!(
                    f,
                    "  {:<18}{:>6}  {}",
                    g.group,
                    g.actual.jobs,
                    cells(g, &|s| format!("{:.1} / {:.1} s", s.wait_s.mean, s.wait_s.p95))
                )?;
            }
        }
        if what_if {
            for (title, list) in [("gain most", &self.gainers), ("lose most", &self.losers)] {
                writeln!(f, "\njobs that {title} under the what-if (id owner vcluster gpus: as recorded → what-if)")?;
                if list.is_empty() {
                    writeln!(f, "  none")?;
                }
                for r in list.iter() {
                    writeln!(
                        f,
                        "  {:<8}{:<16}{:<16}{:>4}  {:.1} s → {:.1} s",
                        r.id,
                        r.owner,
                        r.vcluster,
                        r.gpus,
                        r.as_recorded_wait_s.unwrap_or(0.0),
                        r.what_if_wait_s.unwrap_or(0.0)
                    )?;
                }
            }
        }
        Ok(())
    }
}
