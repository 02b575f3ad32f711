//! The discrete-event simulator: simulated nodes and agents, simulated time,
//! and the real state machine and admission policy in the middle.
//!
//! ```text
//!   event heap (time, seq) ──▶ simulated agents ──▶ commands ──▶ State::apply
//!        ▲                                                          │ events
//!        └──────── claims, exits, preempt acks, ticks ◀──────────────┘
//!   after every instant at which something arrived, was released or fell due:
//!        tick::Tick (the leader's own passes) ──▶ commands ──▶ State::apply
//! ```
//!
//! The leader's decisions come from the same [`Tick`] the replica's leader
//! loop drives: node-lost marking (for nodes the simulation crashes), forced
//! teardowns, expired holds and drain deadlines, admission, and reclaim or
//! preemption, in the leader's order and under its timers.
//!
//! Everything comes from one seed: the workload, claim delays, lost claims
//! and failures. The same seed and inputs give the same event order, the same
//! commands and so the same final state digest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use muster_core::policy::{AdmissionConfig, PreemptionConfig};
use muster_core::sm::{AllocId, AllocStatus, ApplyCtx, Command, Event, NodeId, Outcome, Resources, State, TaskIndex};
use muster_core::tick::{LeaderConfig, NextWake, Pass, PassTimers, Tick, TickTime, Wake};

mod agents;
mod stats;

use self::agents::Agents;
use self::stats::Stats;
use crate::job::{Job, JobOutcome, Run};
use crate::report::Report;
use crate::rng::SimRng;

/// How the simulated cluster and its agents behave.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// How many nodes.
    pub nodes: u32,
    /// What each node has.
    pub node: Resources,
    /// The seed of every random choice the simulated agents make.
    pub seed: u64,
    /// The admission policy's knobs.
    pub admission: AdmissionConfig,
    /// An agent claims its reserved task after a delay in this range, ms.
    pub claim_delay_ms: (u64, u64),
    /// The chance that an agent never claims a reserved task (it died), so
    /// the reservation goes stale and is rolled back.
    pub lost_claim_prob: f64,
    /// The chance that a task attempt fails (at a uniformly random point).
    pub failure_prob: f64,
    /// When a gang task fails, its running siblings are told to stop: each
    /// stops (SIGTERM, checkpoint, exit) and acks after a delay in this
    /// range, ms.
    pub preempt_ack_ms: (u64, u64),
    /// Teardowns not acked this long after they started are forced to end, ms.
    pub force_teardown_ms: u64,
    /// Check every invariant after every this many commands (0: only at the end).
    pub check_every: u64,
    /// Priority preemption after each admission pass (`None`: off). A
    /// preempted task's agent acks after `preempt_ack_ms`, like a teardown's.
    pub preemption: Option<PreemptionConfig>,
    /// Nodes that crash during the run, at uniformly random times between
    /// the first and the last submit: the agent goes silent and its tasks
    /// die with it. The leader's tick marks the node lost once it has been
    /// silent for `node_lost_after_ms`.
    pub node_failures: u32,
    /// A crashed node's agent registers again this long after the crash, ms.
    pub node_repair_ms: u64,
    /// A node silent this long while holding work is marked lost, ms.
    pub node_lost_after_ms: u64,
    /// When finished allocations leave the simulated state (`None`: kept to
    /// the end). The report counts outcomes from each allocation's record
    /// as it finishes, so it is the same either way.
    pub retention: Option<muster_core::policy::RetentionConfig>,
    /// A heterogeneous fleet (`muster simulate --node-list`): when not
    /// empty, these are the nodes, and `nodes` and `node` are ignored.
    pub fleet: Vec<crate::fleet::FleetNode>,
    /// Commands applied once the nodes are ready, before the first submit
    /// (a replay's vClusters); each must be accepted.
    pub setup: Vec<Command>,
}

impl SimConfig {
    /// Node `i`: its resources and labels.
    pub fn node_at(&self, i: usize) -> (Resources, BTreeMap<String, String>) {
        match self.fleet.get(i) {
            Some(f) => (f.resources, f.labels.clone()),
            None => (self.node, BTreeMap::new()),
        }
    }

    /// How many nodes the cluster has.
    pub fn node_count(&self) -> u32 {
        if self.fleet.is_empty() { self.nodes } else { self.fleet.len() as u32 }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 100,
            node: Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 },
            seed: 1,
            admission: AdmissionConfig::default(),
            claim_delay_ms: (50, 500),
            lost_claim_prob: 0.0,
            failure_prob: 0.0,
            preempt_ack_ms: (200, 5_000),
            force_teardown_ms: muster_core::policy::DEFAULT_FORCE_AFTER_MS,
            check_every: 0,
            preemption: None,
            node_failures: 0,
            node_repair_ms: 10 * 60_000,
            node_lost_after_ms: 30_000,
            retention: None,
            fleet: Vec::new(),
            setup: Vec::new(),
        }
    }
}

/// Why a simulation stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The state machine broke one of its own invariants: a bug.
    #[error("invariant broken at t={time_ms} ms after {commands} commands: {message}")]
    Invariant {
        /// Simulated time.
        time_ms: u64,
        /// Commands applied so far.
        commands: u64,
        /// Which invariant.
        message: String,
    },
    /// The admission policy proposed a command `apply` refused, from a view
    /// it had just read: a bug.
    #[error("admission planned {command} which apply rejected: {rejection}")]
    PlanRejected {
        /// The command, printed.
        command: String,
        /// The rejection, printed.
        rejection: String,
    },
    /// A setup command was refused.
    #[error("setup command {command} was refused: {rejection}")]
    Setup {
        /// The command, printed.
        command: String,
        /// The rejection, printed.
        rejection: String,
    },
}

/// What happens at one instant of simulated time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Job `i` is submitted.
    Arrive(usize),
    /// The agent on `node` claims its reserved task.
    Claim { alloc: AllocId, task: TaskIndex, node: u32, epoch: u64, life: u32 },
    /// A task's process exits.
    Exit { alloc: AllocId, task: TaskIndex, node: u32, epoch: u64, ok: bool, life: u32 },
    /// A preempting task's agent acks: the process stopped.
    Preempted { alloc: AllocId, task: TaskIndex, node: u32, epoch: u64, life: u32 },
    /// Run the leader's tick: a reservation may have gone stale, or a
    /// deadline (a forced teardown, a hold, a lost node) may be due.
    Tick,
    /// Node `node` crashes: its agent goes silent, its processes die.
    Crash(u32),
    /// Node `node`'s agent registers again after a crash.
    Repair(u32),
    /// Job `i`'s owner cancels it (a replayed cancel).
    Cancel(usize),
}

/// A simulation run: the event loop, the simulated agents ([`agents`]) and
/// the statistics it keeps ([`stats`]).
pub struct Simulation {
    cfg: SimConfig,
    jobs: Vec<Job>,
    state: State,
    rng: SimRng,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    now: u64,
    /// The job each live allocation (or array, or workflow step) came
    /// from, and its step in the job's workflow.
    job_of: BTreeMap<AllocId, (usize, Option<usize>)>,
    /// Each unfinished workflow's submit time.
    workflow_submits: BTreeMap<AllocId, u64>,
    /// The allocation each job became (a replay's dependencies and cancels
    /// name jobs).
    job_ids: Vec<Option<AllocId>>,
    /// How each job fared, from its record as it finished.
    outcomes: Vec<JobOutcome>,
    /// Runs of each scripted task its job ended itself so far.
    own_runs: BTreeMap<(AllocId, TaskIndex), usize>,
    /// Work saved by checkpoints at preemptions, per gang (ms of its duration).
    progress_ms: BTreeMap<AllocId, u64>,
    leader: LeaderConfig,
    timers: PassTimers,
    /// When the last tick asked to be woken (the core's answer).
    next_wake: NextWake,
    /// The admission wake-up scheduled for it (one, not one per tick).
    admission_tick_at: Option<u64>,
    /// The liveness wake-up scheduled for a deadline that fell due early.
    liveness_tick_at: Option<u64>,
    /// The tick's commands, when a caller asked for them.
    record: Option<Vec<Command>>,
    agents: Agents,
    stats: Stats,
    /// Events in the heap other than ticks.
    pending: u64,
    /// Every finished allocation's record, when asked for.
    kept: Option<Vec<muster_core::history::JobRecord>>,
    /// When a command last changed the state.
    last_change_ms: u64,
}

/// A run whose heap holds nothing but the leader's ticks, and whose state
/// no command has changed for this long, has ended: what is left can never
/// run (a gang larger than the fleet keeps the preemption pass waking).
pub const IDLE_END_MS: u64 = 24 * 3_600_000;

impl Simulation {
    /// A simulation of `jobs` on the cluster `cfg` describes.
    pub fn new(cfg: SimConfig, jobs: Vec<Job>) -> Simulation {
        let rng = SimRng::new(cfg.seed ^ 0x5EED_A6E7_0000_0000);
        // A fleet's own node ids (a replay's), or `node-NNNNN`.
        let node_ids = (0..cfg.node_count() as usize)
            .map(|i| NodeId::new(cfg.fleet.get(i).and_then(|f| f.id.clone()).unwrap_or_else(|| format!("node-{i:05}"))))
            .collect();
        let models: Vec<String> = (0..cfg.node_count() as usize)
            .map(|i| cfg.node_at(i).1.get("gpu.model").cloned().unwrap_or_else(|| "-".to_string()))
            .collect();
        let leader = LeaderConfig {
            admission: cfg.admission,
            preemption: cfg.preemption.unwrap_or_default(),
            reclaim: Default::default(),
            preempt: cfg.preemption.is_some(),
            node_lost_after_ms: cfg.node_lost_after_ms,
            teardown_force_after_ms: cfg.force_teardown_ms,
            liveness_every_ms: muster_core::tick::DEFAULT_LIVENESS_EVERY_MS,
            retention: cfg.retention,
        };
        let life = vec![0; cfg.node_count() as usize];
        let outcomes = vec![JobOutcome::default(); jobs.len()];
        let job_ids = vec![None; jobs.len()];
        Simulation {
            job_ids,
            outcomes,
            own_runs: BTreeMap::new(),
            cfg,
            jobs,
            state: State::default(),
            rng,
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            job_of: BTreeMap::new(),
            workflow_submits: BTreeMap::new(),
            progress_ms: BTreeMap::new(),
            next_wake: NextWake::default(),
            admission_tick_at: None,
            leader,
            timers: PassTimers::default(),
            liveness_tick_at: None,
            record: None,
            agents: Agents::new(node_ids, models, life),
            stats: Stats::default(),
            pending: 0,
            last_change_ms: 0,
            kept: None,
        }
    }

    fn at(&mut self, time_ms: u64, ev: Ev) {
        if ev != Ev::Tick {
            self.pending += 1;
        }
        self.seq += 1;
        self.heap.push(Reverse((time_ms, self.seq, ev)));
    }

    fn apply(&mut self, cmd: &Command) -> Result<Outcome, SimError> {
        let out = self.state.apply(cmd, &ApplyCtx { time_ms: self.now });
        self.stats.commands += 1;
        if out.is_accepted() {
            self.last_change_ms = self.now;
        }
        for r in self.state.take_finished_records() {
            if let Some(kept) = &mut self.kept {
                kept.push(r.clone());
            }
            match r.status {
                AllocStatus::Done => self.stats.finished_done += 1,
                AllocStatus::Failed => self.stats.finished_failed += 1,
                _ => {}
            }
            if r.preemptions > 0 {
                self.stats.finished_preempted += 1;
            }
            self.stats.finished_max_preempted = self.stats.finished_max_preempted.max(r.preemptions);
            if let Some(&(j, None)) = self.job_of.get(&r.id) {
                self.outcomes[j] = JobOutcome {
                    submitted: true,
                    start_ms: r.start_ms,
                    end_ms: Some(r.end_ms),
                    status: Some(r.status),
                    preemptions: r.preemptions,
                    gpu_seconds: r.gpu_seconds,
                };
            }
            // What the simulated agents kept about it is no longer needed.
            self.own_runs.retain(|(alloc, _), _| *alloc != r.id);
            self.stats.started_whole.remove(&r.id);
            self.job_of.remove(&r.id);
            self.progress_ms.remove(&r.id);
            self.stats.first_planned.remove(&r.id);
            // The last step of a workflow to end: its makespan.
            if !self.workflow_submits.is_empty()
                && let Some((w, _)) = self.state.workflow_of(r.id)
                && self.state.workflow_finished(w)
                && let Some(at) = self.workflow_submits.remove(&w.id)
            {
                self.stats.workflow_makespans_s.push((self.now - at) as f64 / 1000.0);
            }
        }
        if self.cfg.check_every > 0 && self.stats.commands.is_multiple_of(self.cfg.check_every) {
            self.check()?;
        }
        Ok(out)
    }

    /// How long allocation `alloc`'s tasks run when nothing fails, ms: its
    /// job's duration (an array element's is its array's; a workflow
    /// step's its own).
    fn duration_of(&self, alloc: AllocId) -> u64 {
        let found = self.job_of.get(&alloc).or_else(|| self.job_of.get(&self.state.array_of(alloc)?.0.id));
        match found {
            Some(&(j, Some(step))) => self.jobs[j].workflow.as_ref().map_or(1, |(_, d)| d[step]),
            Some(&(j, None)) => self.jobs[j].duration_ms,
            None => 1,
        }
    }

    fn check(&self) -> Result<(), SimError> {
        self.state.check_invariants().map_err(|message| SimError::Invariant {
            time_ms: self.now,
            commands: self.stats.commands,
            message,
        })
    }

    /// Runs one leader tick on `state` at `now_ms`, woken for admission, with
    /// the nodes in `down` silent since the time given, exactly as the run
    /// loop does; returns the commands it applied, in order, and the state
    /// after them. For comparing the simulator with the leader loop.
    pub fn tick_once(
        cfg: SimConfig,
        state: State,
        now_ms: u64,
        down: BTreeMap<NodeId, u64>,
    ) -> Result<(Vec<Command>, State), SimError> {
        let mut sim = Simulation::new(cfg, Vec::new());
        sim.state = state;
        sim.now = now_ms;
        sim.agents.down.since = down;
        sim.record = Some(Vec::new());
        sim.tick(Wake { admission: true }, true)?;
        Ok((sim.record.take().unwrap_or_default(), sim.state))
    }

    /// Runs to the end: every job submitted and nothing left to happen.
    pub fn run(self) -> Result<(Report, State), SimError> {
        self.run_jobs().map(|(report, state, _)| (report, state))
    }

    /// Runs to the end, as [`Simulation::run`], and hands back the job
    /// history a replica would have stored: every finished allocation's
    /// record, in finishing order (for a synthetic backup to replay).
    pub fn run_recording(mut self) -> Result<(Report, State, Vec<muster_core::history::JobRecord>), SimError> {
        self.kept = Some(Vec::new());
        self.run_until_done().map(|(report, state, _, kept)| (report, state, kept.unwrap_or_default()))
    }

    /// Runs to the end, as [`Simulation::run`], and says how each job
    /// fared, in the order of the job list.
    pub fn run_jobs(self) -> Result<(Report, State, Vec<JobOutcome>), SimError> {
        self.run_until_done().map(|(report, state, outcomes, _)| (report, state, outcomes))
    }

    #[allow(clippy::type_complexity)]
    fn run_until_done(
        mut self,
    ) -> Result<(Report, State, Vec<JobOutcome>, Option<Vec<muster_core::history::JobRecord>>), SimError> {
        for (i, id) in self.agents.node_ids.clone().into_iter().enumerate() {
            let (resources, labels) = self.cfg.node_at(i);
            // The reserved labels an admin set (a replayed node's
            // `muster.vcluster`) are laid over what its agent reports.
            let (agent, admin): (BTreeMap<_, _>, BTreeMap<_, _>) =
                labels.into_iter().partition(|(k, _)| muster_core::sm::agent_may_set(k));
            let mut setup = Vec::new();
            if !admin.is_empty() {
                setup.push(Command::LabelNode { node: id.clone(), set: admin, remove: Vec::new(), by: "sim".into() });
            }
            setup.push(Command::RegisterNode { node: id.clone(), resources, labels: agent });
            setup.push(Command::MarkNodeReady { node: id });
            for cmd in setup {
                if let Outcome::Rejected(r) = self.apply(&cmd)? {
                    return Err(SimError::Setup { command: format!("{cmd:?}"), rejection: r.to_string() });
                }
            }
        }
        for cmd in std::mem::take(&mut self.cfg.setup) {
            if let Outcome::Rejected(r) = self.apply(&cmd)? {
                return Err(SimError::Setup { command: format!("{cmd:?}"), rejection: r.to_string() });
            }
        }
        let cancels: Vec<(u64, usize)> = (self.jobs.iter().enumerate())
            .filter_map(|(j, job)| Some((job.script.as_ref()?.cancel_ms?.max(job.submit_ms + 1), j)))
            .collect();
        for (at, j) in cancels {
            self.at(at, Ev::Cancel(j));
        }
        if let Some(first) = self.jobs.first() {
            self.at(first.submit_ms, Ev::Arrive(0));
        }
        if let (Some(first), Some(last)) = (self.jobs.first(), self.jobs.last())
            && self.cfg.node_count() > 0
        {
            let (from, to) = (first.submit_ms, last.submit_ms.max(first.submit_ms + 1));
            for _ in 0..self.cfg.node_failures {
                let at = self.rng.range(from, to);
                let node = self.rng.range(0, u64::from(self.cfg.node_count()) - 1) as u32;
                self.at(at, Ev::Crash(node));
            }
        }
        while let Some(&Reverse((time, _, _))) = self.heap.peek() {
            if self.pending == 0 && time.saturating_sub(self.last_change_ms) > IDLE_END_MS {
                break;
            }
            self.now = time;
            let mut wake = Wake::default();
            let mut due = false;
            while let Some(&Reverse((t, _, ev))) = self.heap.peek() {
                if t != time {
                    break;
                }
                self.heap.pop();
                if ev != Ev::Tick {
                    self.pending -= 1;
                }
                due |= matches!(ev, Ev::Tick);
                wake.admission |= self.handle(ev)?;
            }
            if wake.admission || due {
                self.tick(wake, due)?;
            }
        }
        self.check()?;
        // Jobs still unfinished: what the state says of them.
        for (j, id) in self.job_ids.iter().enumerate() {
            if let Some(a) = id.and_then(|id| self.state.alloc(id))
                && self.outcomes[j].status.is_none()
            {
                let r = muster_core::history::JobRecord::of(&self.state, a);
                self.outcomes[j] = JobOutcome {
                    submitted: true,
                    start_ms: r.start_ms,
                    preemptions: r.preemptions,
                    gpu_seconds: r.gpu_seconds,
                    ..JobOutcome::default()
                };
            }
        }
        let report = self.report();
        Ok((report, self.state, self.outcomes, self.kept))
    }

    /// Handles one event; true when admission should run afterwards.
    fn handle(&mut self, ev: Ev) -> Result<bool, SimError> {
        match ev {
            Ev::Arrive(i) => {
                if let Some(next) = self.jobs.get(i + 1) {
                    self.at(next.submit_ms, Ev::Arrive(i + 1));
                }
                let job = &self.jobs[i];
                let mut spec = job.spec.clone();
                if let Some(script) = &job.script {
                    // Its dependencies name jobs: the allocations they became.
                    let deps = std::mem::take(&mut spec.after.deps);
                    spec.after.deps = deps
                        .into_iter()
                        .zip(&script.after_jobs)
                        .filter_map(|(mut d, j)| {
                            d.on = (*j).and_then(|j| self.job_ids.get(j).copied().flatten())?;
                            Some(d)
                        })
                        .collect();
                }
                let cmd = match (&job.array, &job.workflow) {
                    (_, Some((workflow, _))) => Command::SubmitWorkflow { workflow: workflow.clone() },
                    (Some(indices), None) => Command::SubmitArray {
                        spec: job.spec.clone(),
                        indices: indices.clone(),
                        corr: None,
                        secrets: Default::default(),
                    },
                    (None, None) => Command::Submit { spec },
                };
                let out = self.apply(&cmd)?;
                match out.events() {
                    [Event::Submitted { alloc, duplicate: false }, ..]
                    | [Event::ArraySubmitted { array: alloc, duplicate: false, .. }, ..] => {
                        self.job_of.insert(*alloc, (i, None));
                        self.job_ids[i] = Some(*alloc);
                        self.outcomes[i].submitted = true;
                        self.stats.accepted_submits += 1;
                    }
                    [Event::WorkflowSubmitted { workflow, duplicate: false, .. }, ..] => {
                        let steps = self.state.workflow(*workflow).map(|w| w.steps.clone()).unwrap_or_default();
                        for (k, (_, id)) in steps.into_iter().enumerate() {
                            self.job_of.insert(id, (i, Some(k)));
                        }
                        self.workflow_submits.insert(*workflow, self.now);
                        self.stats.accepted_submits += 1;
                    }
                    _ => {}
                }
                Ok(true)
            }
            Ev::Claim { alloc, task, node, epoch, life } => self.claimed(alloc, task, node, epoch, life),
            Ev::Exit { alloc, task, node, epoch, ok, life } => self.exited(alloc, task, node, epoch, ok, life),
            Ev::Preempted { alloc, task, node, epoch, life } => self.stopped(alloc, task, node, epoch, life),
            Ev::Tick => Ok(true),
            Ev::Crash(node) => Ok(self.crash(node)),
            Ev::Repair(node) => self.repair(node),
            Ev::Cancel(j) => {
                let Some(alloc) = self.job_ids[j] else { return Ok(false) };
                match self.apply(&Command::CancelAllocation { alloc })? {
                    Outcome::Accepted(events) => {
                        self.on_events(&events);
                        Ok(true)
                    }
                    Outcome::Rejected(_) => Ok(false), // it had already ended
                }
            }
        }
    }

    /// The run a scripted job's task makes next, when its job is scripted:
    /// the next of its own runs (its last again once they are used up).
    fn scripted_run(&self, alloc: AllocId, task: TaskIndex) -> Option<Run> {
        let &(j, None) = self.job_of.get(&alloc)? else { return None };
        let script = self.jobs[j].script.as_ref()?;
        let runs = script.runs.get(task as usize).map_or(&[][..], Vec::as_slice);
        let done = self.own_runs.get(&(alloc, task)).copied().unwrap_or(0);
        match runs.get(done).or(runs.last()) {
            Some(&run) => Some(run),
            // Never ran of its own accord: it runs until its cancel stops it
            // (`u64::MAX`: no exit of its own), or a moment without one.
            None => Some(Run { ms: if script.cancel_ms.is_some() { u64::MAX } else { 1 }, ok: true }),
        }
    }

    /// Runs the leader's tick at this instant, as the leader loop does:
    /// each pass's commands apply before the next pass reads.
    fn tick(&mut self, wake: Wake, due: bool) -> Result<(), SimError> {
        let time = TickTime { wall_ms: self.now, mono_ms: self.now };
        let mut tick = Tick::begin(time, wake, &mut self.timers, &self.leader);
        if due && !tick.liveness_due() {
            // A deadline fell due between two liveness passes: come back
            // when the next one may run.
            let next = self.timers.liveness_due_ms(&self.leader);
            if self.liveness_tick_at != Some(next) {
                self.liveness_tick_at = Some(next);
                self.at(next, Ev::Tick);
            }
        }
        while let Some(pass) = tick.next(&self.state, &self.agents.down, &mut self.timers) {
            self.stats.passed(&pass);
            let preempted = matches!(pass, Pass::Preemption { .. }) && !pass.commands().is_empty();
            self.apply_plan(pass.commands())?;
            if preempted {
                // A hold may expire with nothing else waking the tick.
                self.at(self.now + self.leader.preemption.hold_ms(), Ev::Tick);
            }
        }
        // Come back when the tick asks to (a preemption pass that had to
        // wait, a back-off's end), as the leader does.
        let next = tick.next_wake(&self.state, &self.timers, &self.next_wake);
        self.next_wake = next;
        if let Some(at) = next.admission_ms().filter(|&at| at > self.now)
            && self.admission_tick_at != Some(at)
        {
            self.admission_tick_at = Some(at);
            self.at(at, Ev::Tick);
        }
        Ok(())
    }

    fn apply_plan(&mut self, commands: &[Command]) -> Result<(), SimError> {
        if let Some(record) = &mut self.record {
            record.extend_from_slice(commands);
        }
        for cmd in commands {
            match self.apply(cmd)? {
                Outcome::Rejected(r) => {
                    return Err(SimError::PlanRejected { command: format!("{cmd:?}"), rejection: r.to_string() });
                }
                Outcome::Accepted(events) => self.on_events(&events),
            }
        }
        Ok(())
    }
}
