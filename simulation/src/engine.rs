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
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use muster_core::policy::{AdmissionConfig, PreemptionConfig};
use muster_core::sm::{
    AllocId, AllocStatus, ApplyCtx, Command, Event, LabelOp, NodeId, Outcome, Resources, State, TaskIndex,
    TeardownCause,
};
use muster_core::tick::{LeaderConfig, Pass, PassTimers, Silence, Tick, TickTime, Wake};

use crate::job::Job;
use crate::report::{Distribution, Report};
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
}

/// Which simulated nodes are down, and since when (the tick's [`Silence`]:
/// a live simulated agent is never silent).
#[derive(Default)]
struct Down {
    since: BTreeMap<NodeId, u64>,
}

impl Silence for Down {
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64 {
        self.since.get(node).map_or(0, |&t| mono_ms.saturating_sub(t))
    }
}

/// A simulation run.
pub struct Simulation {
    cfg: SimConfig,
    jobs: Vec<Job>,
    state: State,
    rng: SimRng,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    now: u64,
    node_ids: Vec<NodeId>,
    /// The job each live allocation came from.
    job_of: BTreeMap<AllocId, usize>,
    /// Submits the state accepted.
    accepted_submits: u64,
    /// Running attempts: when they started.
    running: BTreeMap<(AllocId, TaskIndex), (u64, u32)>,
    /// Live gangs that have run whole at least once.
    started_whole: BTreeSet<AllocId>,
    /// Each gang's queue delay (submit to first running whole), s, and
    /// those of gangs of 8 GPUs or more.
    delays_s: Vec<f64>,
    delays_large_s: Vec<f64>,
    /// Finished allocations, from their records: done, failed, preempted at
    /// least once, the most preemptions of one.
    finished_done: u64,
    finished_failed: u64,
    finished_preempted: u64,
    finished_max_preempted: u32,
    busy_gpu_ms: u128,
    /// Each node's `gpu.model` (`-`: none), by slot.
    models: Vec<String>,
    /// GPU-ms used, by node model.
    busy_by_model: BTreeMap<String, u128>,
    /// Queueing delays, by the GPU model a job asked for (`any`: none).
    delays_by_model: BTreeMap<String, Vec<f64>>,
    commands: u64,
    rejected_reports: u64,
    admission_passes: u64,
    rollbacks: u64,
    teardowns: u64,
    preemptions: u64,
    /// Work saved by checkpoints at preemptions, per gang (ms of its duration).
    progress_ms: BTreeMap<AllocId, u64>,
    preemption_tick_at: Option<u64>,
    tasks_started: u64,
    task_failures: u64,
    last_finish_ms: u64,
    /// The first start backfill planned for each gang not reserved since.
    first_planned: BTreeMap<AllocId, u64>,
    planned_starts: u64,
    /// Gangs reserved after their first planned start, and the most late
    /// one was (ms).
    late: u64,
    max_late_ms: u64,
    backfilled: u64,
    leader: LeaderConfig,
    timers: PassTimers,
    down: Down,
    /// Each node's incarnation: a crash ends one, and whatever its agent
    /// would have done later never happens.
    life: Vec<u32>,
    nodes_lost: u64,
    forced_teardowns: u64,
    expired_holds: u64,
    drain_expiries: u64,
    reclaims: u64,
    liveness_tick_at: Option<u64>,
    /// The tick's commands, when a caller asked for them.
    record: Option<Vec<Command>>,
}

impl Simulation {
    /// A simulation of `jobs` on the cluster `cfg` describes.
    pub fn new(cfg: SimConfig, jobs: Vec<Job>) -> Simulation {
        let rng = SimRng::new(cfg.seed ^ 0x5EED_A6E7_0000_0000);
        let node_ids = (0..cfg.node_count()).map(|i| NodeId::new(format!("node-{i:05}"))).collect();
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
        Simulation {
            cfg,
            jobs,
            state: State::default(),
            rng,
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            node_ids,
            job_of: BTreeMap::new(),
            accepted_submits: 0,
            running: BTreeMap::new(),
            started_whole: BTreeSet::new(),
            delays_s: Vec::new(),
            delays_large_s: Vec::new(),
            finished_done: 0,
            finished_failed: 0,
            finished_preempted: 0,
            finished_max_preempted: 0,
            busy_gpu_ms: 0,
            models,
            busy_by_model: BTreeMap::new(),
            delays_by_model: BTreeMap::new(),
            commands: 0,
            rejected_reports: 0,
            admission_passes: 0,
            rollbacks: 0,
            teardowns: 0,
            preemptions: 0,
            progress_ms: BTreeMap::new(),
            preemption_tick_at: None,
            tasks_started: 0,
            task_failures: 0,
            last_finish_ms: 0,
            first_planned: BTreeMap::new(),
            planned_starts: 0,
            late: 0,
            max_late_ms: 0,
            backfilled: 0,
            leader,
            timers: PassTimers::default(),
            down: Down::default(),
            life,
            nodes_lost: 0,
            forced_teardowns: 0,
            expired_holds: 0,
            drain_expiries: 0,
            reclaims: 0,
            liveness_tick_at: None,
            record: None,
        }
    }

    fn at(&mut self, time_ms: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((time_ms, self.seq, ev)));
    }

    fn apply(&mut self, cmd: &Command) -> Result<Outcome, SimError> {
        let out = self.state.apply(cmd, &ApplyCtx { time_ms: self.now });
        self.commands += 1;
        for r in self.state.take_finished_records() {
            match r.status {
                AllocStatus::Done => self.finished_done += 1,
                AllocStatus::Failed => self.finished_failed += 1,
                _ => {}
            }
            if r.preemptions > 0 {
                self.finished_preempted += 1;
            }
            self.finished_max_preempted = self.finished_max_preempted.max(r.preemptions);
            // What the simulated agents kept about it is no longer needed.
            self.started_whole.remove(&r.id);
            self.job_of.remove(&r.id);
            self.progress_ms.remove(&r.id);
            self.first_planned.remove(&r.id);
        }
        if self.cfg.check_every > 0 && self.commands.is_multiple_of(self.cfg.check_every) {
            self.check()?;
        }
        Ok(out)
    }

    fn check(&self) -> Result<(), SimError> {
        self.state.check_invariants().map_err(|message| SimError::Invariant {
            time_ms: self.now,
            commands: self.commands,
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
        sim.down.since = down;
        sim.record = Some(Vec::new());
        sim.tick(Wake { admission: true }, true)?;
        Ok((sim.record.take().unwrap_or_default(), sim.state))
    }

    /// Runs to the end: every job submitted and nothing left to happen.
    pub fn run(mut self) -> Result<(Report, State), SimError> {
        for (i, id) in self.node_ids.clone().into_iter().enumerate() {
            let (resources, labels) = self.cfg.node_at(i);
            let register = Command::RegisterNode { node: id.clone(), resources, labels };
            let out = self.apply(&register)?;
            assert!(out.is_accepted(), "simulated node refused: {out:?}");
            let out = self.apply(&Command::MarkNodeReady { node: id })?;
            assert!(out.is_accepted(), "simulated node not made ready: {out:?}");
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
            self.now = time;
            let mut wake = Wake::default();
            let mut due = false;
            while let Some(&Reverse((t, _, ev))) = self.heap.peek() {
                if t != time {
                    break;
                }
                self.heap.pop();
                due |= matches!(ev, Ev::Tick);
                wake.admission |= self.handle(ev)?;
            }
            if wake.admission || due {
                self.tick(wake, due)?;
            }
        }
        self.check()?;
        Ok((self.report(), self.state))
    }

    /// Handles one event; true when admission should run afterwards.
    fn handle(&mut self, ev: Ev) -> Result<bool, SimError> {
        match ev {
            Ev::Arrive(i) => {
                if let Some(next) = self.jobs.get(i + 1) {
                    self.at(next.submit_ms, Ev::Arrive(i + 1));
                }
                let out = self.apply(&Command::Submit { spec: self.jobs[i].spec.clone() })?;
                if let [Event::Submitted { alloc, duplicate: false }] = out.events() {
                    self.job_of.insert(*alloc, i);
                    self.accepted_submits += 1;
                }
                Ok(true)
            }
            Ev::Claim { alloc, task, node, epoch, life } => {
                if life != self.life[node as usize] || self.is_down(node) {
                    return Ok(false); // the agent died before claiming
                }
                let out =
                    self.apply(&Command::StartTask { alloc, task, node: self.node_ids[node as usize].clone(), epoch })?;
                if !out.is_accepted() {
                    self.rejected_reports += 1;
                    return Ok(false);
                }
                self.tasks_started += 1;
                self.running.insert((alloc, task), (self.now, node));
                // A gang preempted after checkpointing resumes where it stopped.
                let done = self.progress_ms.get(&alloc).copied().unwrap_or(0);
                let duration = self.jobs[self.job_of[&alloc]].duration_ms.saturating_sub(done).max(1);
                let (end, ok) = if self.rng.chance(self.cfg.failure_prob) {
                    (self.now + self.rng.range(1, duration.max(1)), false)
                } else {
                    (self.now + duration, true)
                };
                self.at(end, Ev::Exit { alloc, task, node, epoch, ok, life });
                let a = self.state.alloc(alloc).expect("accepted claim of a known allocation");
                if a.status == AllocStatus::Running && self.started_whole.insert(alloc) {
                    let delay_s = (self.now - a.submit_time_ms) as f64 / 1000.0;
                    self.delays_s.push(delay_s);
                    let wanted = a
                        .spec
                        .placement
                        .constraints
                        .iter()
                        .find_map(|c| match &c.op {
                            LabelOp::Eq(m) if c.key == "gpu.model" => Some(m.clone()),
                            _ => None,
                        })
                        .unwrap_or_else(|| "any".to_string());
                    self.delays_by_model.entry(wanted).or_default().push(delay_s);
                    if a.spec.gang_size * a.spec.resources.gpus >= 8 {
                        self.delays_large_s.push(delay_s);
                    }
                }
                Ok(false)
            }
            Ev::Exit { alloc, task, node, epoch, ok, life } => {
                if life != self.life[node as usize] {
                    return Ok(false); // the process died with its node
                }
                let node = self.node_ids[node as usize].clone();
                let cmd = if ok {
                    Command::FinishTask { alloc, task, node, epoch }
                } else {
                    Command::FailTask { alloc, task, node, epoch, exit_code: Some(1) }
                };
                self.report_exit(alloc, task, &cmd)
            }
            Ev::Preempted { alloc, task, node, epoch, life } => {
                if life != self.life[node as usize] {
                    return Ok(false);
                }
                let node = self.node_ids[node as usize].clone();
                self.report_exit(
                    alloc,
                    task,
                    &Command::ConfirmPreempted { alloc, task, node, epoch, checkpoint_failed: false },
                )
            }
            Ev::Tick => Ok(true),
            Ev::Crash(node) => {
                if self.is_down(node) {
                    return Ok(false);
                }
                self.life[node as usize] += 1;
                self.down.since.insert(self.node_ids[node as usize].clone(), self.now);
                self.at(self.now + self.cfg.node_lost_after_ms, Ev::Tick);
                // The agent stays away past the lost window (and the liveness
                // pass after it), so the tick has marked the node lost first.
                let repair =
                    self.cfg.node_repair_ms.max(self.cfg.node_lost_after_ms + 2 * self.leader.liveness_every_ms);
                self.at(self.now + repair, Ev::Repair(node));
                Ok(false)
            }
            Ev::Repair(node) => {
                let id = self.node_ids[node as usize].clone();
                self.down.since.remove(&id);
                let (resources, labels) = self.cfg.node_at(node as usize);
                let register = Command::RegisterNode { node: id, resources, labels };
                // Marked lost by now (a crash outlasts the lost window): it
                // comes back ready, empty.
                let out = self.apply(&register)?;
                Ok(out.is_accepted())
            }
        }
    }

    fn is_down(&self, node: u32) -> bool {
        self.down.since.contains_key(&self.node_ids[node as usize])
    }

    fn report_exit(&mut self, alloc: AllocId, task: TaskIndex, cmd: &Command) -> Result<bool, SimError> {
        let out = self.apply(cmd)?;
        let Outcome::Accepted(events) = out else {
            // A report about an attempt already torn down: the real agent's
            // report would be refused the same way.
            self.rejected_reports += 1;
            return Ok(false);
        };
        let run = self.running.remove(&(alloc, task)).expect("an accepted exit of a running task");
        self.charge(alloc, run);
        self.on_events(&events);
        Ok(true)
    }

    /// Counts the GPU time of a task of `alloc` that ran from `started` on
    /// node `slot` until now.
    fn charge(&mut self, alloc: AllocId, (started, slot): (u64, u32)) {
        let gpus = u128::from(self.state.alloc(alloc).expect("known").spec.resources.gpus);
        let used = u128::from(self.now - started) * gpus;
        self.busy_gpu_ms += used;
        *self.busy_by_model.entry(self.models[slot as usize].clone()).or_default() += used;
    }

    /// What the simulated agents do about committed events.
    fn on_events(&mut self, events: &[Event]) {
        for ev in events {
            match ev {
                Event::TaskFailed { charged: true, .. } => self.task_failures += 1,
                Event::GangReserved { alloc, epoch, nodes } => {
                    if let Some(planned) = self.first_planned.remove(alloc)
                        && self.now > planned
                    {
                        self.late += 1;
                        self.max_late_ms = self.max_late_ms.max(self.now - planned);
                    }
                    self.agents_claim(*alloc, *epoch, nodes)
                }
                Event::GangRolledBack { .. } => self.rollbacks += 1,
                Event::PreemptionDecided { victims, .. } => self.preemptions += victims.len() as u64,
                Event::TeardownStarted { alloc, epoch, preempting, cause, .. } => {
                    if matches!(cause, TeardownCause::TaskFailed { .. }) {
                        self.teardowns += 1;
                    } else if let Some(a) = self.state.alloc(*alloc)
                        && a.spec.checkpoint != muster_core::sm::CheckpointMode::None
                        && let Some(since) = a.tasks.iter().filter_map(|t| t.started_at_ms).max()
                    {
                        // The hint saves the progress of this run.
                        *self.progress_ms.entry(*alloc).or_default() += self.now.saturating_sub(since);
                    }
                    for (task, node) in preempting {
                        let node = self.state.node_slot(node).expect("preempting on a known node").0;
                        let (lo, hi) = self.cfg.preempt_ack_ms;
                        let delay = self.rng.range(lo, hi.max(lo));
                        let life = self.life[node as usize];
                        self.at(
                            self.now + delay,
                            Ev::Preempted { alloc: *alloc, task: *task, node, epoch: *epoch, life },
                        );
                    }
                    let force_after = match (self.cfg.preemption, self.state.alloc(*alloc).and_then(|a| a.teardown)) {
                        (Some(p), Some(td)) if td.preempted_by().is_some() => p.force_after_ms(true),
                        _ => self.cfg.force_teardown_ms,
                    };
                    self.at(self.now + force_after, Ev::Tick);
                }
                Event::TaskPreempted { alloc, task, forced: true, .. } => {
                    if let Some(run) = self.running.remove(&(*alloc, *task)) {
                        self.charge(*alloc, run);
                    }
                }
                Event::NodeLost { tasks, .. } => {
                    for key in tasks {
                        if let Some(run) = self.running.remove(key) {
                            self.charge(key.0, run);
                        }
                    }
                }
                Event::AllocationDone { .. } | Event::AllocationFailed { .. } => self.last_finish_ms = self.now,
                _ => {}
            }
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
        while let Some(pass) = tick.next(&self.state, &self.down, &mut self.timers) {
            self.passed(&pass);
            let preempted = matches!(pass, Pass::Preemption { .. }) && !pass.commands().is_empty();
            self.apply_plan(pass.commands())?;
            if preempted {
                // A hold may expire with nothing else waking the tick.
                self.at(self.now + self.leader.preemption.hold_ms(), Ev::Tick);
            }
        }
        if let Some(next) = tick.preemption_waits_until() {
            // A preemption pass had to wait for its interval: come back then,
            // as the leader does.
            if self.preemption_tick_at != Some(next) {
                self.preemption_tick_at = Some(next);
                self.at(next, Ev::Tick);
            }
        }
        Ok(())
    }

    /// Counts what a pass decided.
    fn passed(&mut self, pass: &Pass) {
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

    fn agents_claim(&mut self, alloc: AllocId, epoch: u64, nodes: &[NodeId]) {
        for (task, node) in nodes.iter().enumerate() {
            if self.rng.chance(self.cfg.lost_claim_prob) {
                continue; // this agent died before claiming
            }
            let slot = self.state.node_slot(node).expect("reserved on a known node").0;
            let (lo, hi) = self.cfg.claim_delay_ms;
            let delay = self.rng.range(lo, hi.max(lo));
            let life = self.life[slot as usize];
            self.at(self.now + delay, Ev::Claim { alloc, task: task as TaskIndex, node: slot, epoch, life });
        }
        self.at(self.now + self.cfg.admission.stale_reservation_ms, Ev::Tick);
    }

    /// Utilisation and queueing per GPU model, for a fleet of several.
    fn per_model(&self, makespan_ms: u64) -> Vec<crate::report::ModelReport> {
        let mut fleet: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
        for (i, model) in self.models.iter().enumerate() {
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
                let busy = self.busy_by_model.get(model).copied().unwrap_or(0) as f64;
                let capacity = makespan_ms as f64 * gpus as f64;
                crate::report::ModelReport {
                    model: model.to_string(),
                    nodes,
                    gpus,
                    utilisation: if capacity > 0.0 { busy / capacity } else { 0.0 },
                    queue_delay_s: Distribution::of(self.delays_by_model.get(model).cloned().unwrap_or_default()),
                }
            })
            .collect()
    }

    fn report(&self) -> Report {
        let first_submit = self.jobs.first().map_or(0, |j| j.submit_ms);
        let live = || self.state.allocs().values().filter(|a| !a.status.is_terminal());
        let gpus_total: u64 = (0..self.cfg.node_count() as usize).map(|i| u64::from(self.cfg.node_at(i).0.gpus)).sum();
        let makespan_ms = self.last_finish_ms.saturating_sub(first_submit);
        let utilisation = if makespan_ms == 0 || gpus_total == 0 {
            0.0
        } else {
            self.busy_gpu_ms as f64 / (makespan_ms as f64 * gpus_total as f64)
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
            completed: self.finished_done,
            failed: self.finished_failed,
            unfinished: live().count() as u64,
            rejected_submits: self.jobs.len() as u64 - self.accepted_submits,
            tasks_started: self.tasks_started,
            task_failures: self.task_failures,
            rollbacks: self.rollbacks,
            teardowns: self.teardowns,
            preemptions: self.preemptions,
            preempted_allocations: self.finished_preempted + live().filter(|a| a.preempted_count > 0).count() as u64,
            max_preempted_count: live().map(|a| a.preempted_count).fold(self.finished_max_preempted, u32::max),
            rejected_reports: self.rejected_reports,
            nodes_lost: self.nodes_lost,
            forced_teardowns: self.forced_teardowns,
            expired_holds: self.expired_holds,
            drain_expiries: self.drain_expiries,
            reclaims: self.reclaims,
            admission_passes: self.admission_passes,
            commands: self.commands,
            queue_delay_s: Distribution::of(self.delays_s.clone()),
            queue_delay_large_s: Distribution::of(self.delays_large_s.clone()),
            planned_starts: self.planned_starts,
            planned_start_late: self.late,
            planned_start_max_late_s: self.max_late_ms as f64 / 1000.0,
            backfilled: self.backfilled,
            utilisation,
            makespan_s: makespan_ms as f64 / 1000.0,
            state_digest: self.state.state_digest().to_string(),
            per_model: self.per_model(makespan_ms),
            queue_delay_any_model_s: (self.delays_by_model.len() > 1 || !self.delays_by_model.contains_key("any"))
                .then(|| Distribution::of(self.delays_by_model.get("any").cloned().unwrap_or_default())),
        }
    }
}
