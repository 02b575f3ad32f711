//! The simulated agents: nodes that claim what is reserved on them, run it
//! for the job's duration (or fail it), answer preemption, crash and come
//! back. Each takes its orders from what the pure `plan_sync` plans for its
//! node, as a real agent's stream does, and reports through the same
//! commands a real agent sends.

use std::collections::BTreeMap;

use muster_core::sm::{AllocId, AllocStatus, Command, Event, LabelOp, NodeId, Outcome, TaskIndex, TeardownCause};
use muster_core::sync::{SentMemory, SyncConfig, plan_sync};
use muster_core::tick::Silence;

use super::{Ev, SimError, Simulation};

/// The simulated nodes and what their agents run.
pub(super) struct Agents {
    pub(super) node_ids: Vec<NodeId>,
    /// Each node's `gpu.model` (`-`: none), by slot.
    pub(super) models: Vec<String>,
    /// Running attempts: when they started, and on which node slot.
    pub(super) running: BTreeMap<(AllocId, TaskIndex), (u64, u32)>,
    /// Each node's incarnation: a crash ends one, and whatever its agent
    /// would have done later never happens.
    pub(super) life: Vec<u32>,
    pub(super) down: Down,
    /// What each node's stream has told its agent, by slot (a crash ends
    /// the stream; the agent registers on a fresh one).
    sent: Vec<SentMemory>,
}

/// The graces the simulated leader hands out (a simulated agent stops a
/// task after its own ack delay, whatever the grace).
const SYNC: SyncConfig = SyncConfig { stop_grace_ms: 10_000, preemption_grace_ms: 10_000 };

impl Agents {
    /// Agents on `node_ids`, none running anything, each in its first life.
    pub(super) fn new(node_ids: Vec<NodeId>, models: Vec<String>, life: Vec<u32>) -> Agents {
        let sent = vec![SentMemory::default(); node_ids.len()];
        Agents { node_ids, models, running: BTreeMap::new(), life, down: Down::default(), sent }
    }
}

/// Which simulated nodes are down, and since when (the tick's [`Silence`]:
/// a live simulated agent is never silent).
#[derive(Default)]
pub(super) struct Down {
    pub(super) since: BTreeMap<NodeId, u64>,
}

impl Silence for Down {
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64 {
        self.since.get(node).map_or(0, |&t| mono_ms.saturating_sub(t))
    }
}

impl Simulation {
    /// An agent claims its reserved task and starts it; true when
    /// admission should run afterwards.
    pub(super) fn claimed(
        &mut self,
        alloc: AllocId,
        task: TaskIndex,
        node: u32,
        epoch: u64,
        life: u32,
    ) -> Result<bool, SimError> {
        let Some(id) = self.still_alive(node, life) else {
            return Ok(false); // the agent died before claiming
        };
        let out = self.apply(&Command::StartTask { alloc, task, node: id, epoch })?;
        if !out.is_accepted() {
            self.stats.rejected_reports += 1;
            return Ok(false);
        }
        self.stats.tasks_started += 1;
        self.agents.sent[node as usize].agent_started((alloc, task, epoch));
        self.agents.running.insert((alloc, task), (self.now, node));
        // A gang preempted after checkpointing resumes where it stopped.
        let done = self.progress_ms.get(&alloc).copied().unwrap_or(0);
        let duration = self.duration_of(alloc).saturating_sub(done).max(1);
        let exit = match self.scripted_run(alloc, task) {
            // It runs until it is stopped.
            Some(run) if run.ms == u64::MAX => None,
            // A recorded success is shortened by the progress its
            // checkpoints saved; a recorded failure happens when it did.
            Some(run) => {
                let ms = if run.ok { run.ms.saturating_sub(done) } else { run.ms };
                Some((self.now + ms.max(1), run.ok))
            }
            None if self.rng.chance(self.cfg.failure_prob) => {
                Some((self.now + self.rng.range(1, duration.max(1)), false))
            }
            None => Some((self.now + duration, true)),
        };
        if let Some((end, ok)) = exit {
            self.at(end, Ev::Exit { alloc, task, node, epoch, ok, life });
        }
        let a = self.state.alloc(alloc).expect("accepted claim of a known allocation");
        if a.status == AllocStatus::Running && self.stats.started_whole.insert(alloc) {
            let delay_s = (self.now - a.submit_time_ms) as f64 / 1000.0;
            self.stats.delays_s.push(delay_s);
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
            self.stats.delays_by_model.entry(wanted).or_default().push(delay_s);
            if a.spec.gang_size * a.spec.resources.gpus >= 8 {
                self.stats.delays_large_s.push(delay_s);
            }
        }
        Ok(false)
    }

    /// A task's process exits, well or not.
    pub(super) fn exited(
        &mut self,
        alloc: AllocId,
        task: TaskIndex,
        node: u32,
        epoch: u64,
        ok: bool,
        life: u32,
    ) -> Result<bool, SimError> {
        let Some(node) = self.still_alive(node, life) else {
            return Ok(false); // the process died with its node
        };
        let cmd = if ok {
            Command::FinishTask { alloc, task, node, epoch }
        } else {
            Command::FailTask { alloc, task, node, epoch, exit_code: Some(1) }
        };
        let accepted = self.report_exit(alloc, task, &cmd)?;
        if accepted && self.scripted_run(alloc, task).is_some() {
            *self.own_runs.entry((alloc, task)).or_default() += 1;
        }
        Ok(accepted)
    }

    /// A preempting task's agent reports its process stopped.
    pub(super) fn stopped(
        &mut self,
        alloc: AllocId,
        task: TaskIndex,
        node: u32,
        epoch: u64,
        life: u32,
    ) -> Result<bool, SimError> {
        let Some(node) = self.still_alive(node, life) else {
            return Ok(false); // the process died with its node
        };
        self.report_exit(alloc, task, &Command::ConfirmPreempted { alloc, task, node, epoch, checkpoint_failed: false })
    }

    /// Node `node` crashes: its agent goes silent, its processes die.
    pub(super) fn crash(&mut self, node: u32) -> bool {
        if self.is_down(node) {
            return false;
        }
        self.agents.life[node as usize] += 1;
        self.agents.sent[node as usize] = SentMemory::default();
        self.agents.down.since.insert(self.agents.node_ids[node as usize].clone(), self.now);
        self.at(self.now + self.cfg.node_lost_after_ms, Ev::Tick);
        // The agent stays away past the lost window (and the liveness
        // pass after it), so the tick has marked the node lost first.
        let repair = self.cfg.node_repair_ms.max(self.cfg.node_lost_after_ms + 2 * self.leader.liveness_every_ms);
        self.at(self.now + repair, Ev::Repair(node));
        false
    }

    /// Node `node`'s agent registers again after a crash.
    pub(super) fn repair(&mut self, node: u32) -> Result<bool, SimError> {
        let id = self.agents.node_ids[node as usize].clone();
        self.agents.down.since.remove(&id);
        let (resources, mut labels) = self.cfg.node_at(node as usize);
        labels.retain(|k, _| muster_core::sm::agent_may_set(k)); // an admin's stay
        let register = Command::RegisterNode { node: id, resources, labels };
        // Marked lost by now (a crash outlasts the lost window): it
        // comes back ready, empty.
        let out = self.apply(&register)?;
        self.sync(node);
        Ok(out.is_accepted())
    }

    /// Node `node`'s id, when the agent that scheduled something in its
    /// life `life` still lives (no crash since, and not down now).
    fn still_alive(&self, node: u32, life: u32) -> Option<NodeId> {
        (life == self.agents.life[node as usize] && !self.is_down(node))
            .then(|| self.agents.node_ids[node as usize].clone())
    }

    pub(super) fn is_down(&self, node: u32) -> bool {
        self.agents.down.since.contains_key(&self.agents.node_ids[node as usize])
    }

    fn report_exit(&mut self, alloc: AllocId, task: TaskIndex, cmd: &Command) -> Result<bool, SimError> {
        let out = self.apply(cmd)?;
        let Outcome::Accepted(events) = out else {
            // A report about an attempt already torn down: the real agent's
            // report would be refused the same way.
            self.stats.rejected_reports += 1;
            return Ok(false);
        };
        let run = self.agents.running.remove(&(alloc, task)).expect("an accepted exit of a running task");
        // Its stream hears the process ended (whichever reservation it was).
        let sent = &mut self.agents.sent[run.1 as usize];
        let ended: Vec<_> = sent.agent_running().iter().filter(|k| (k.0, k.1) == (alloc, task)).copied().collect();
        for key in &ended {
            sent.agent_stopped(key);
        }
        self.charge(alloc, run);
        self.on_events(&events);
        Ok(true)
    }

    /// Counts the GPU time of a task of `alloc` that ran from `started` on
    /// node `slot` until now.
    fn charge(&mut self, alloc: AllocId, (started, slot): (u64, u32)) {
        let gpus = u128::from(self.state.alloc(alloc).expect("known").spec.resources.gpus);
        let used = u128::from(self.now - started) * gpus;
        self.stats.busy_gpu_ms += used;
        *self.stats.busy_by_model.entry(self.agents.models[slot as usize].clone()).or_default() += used;
    }

    /// What the simulated agents do about committed events.
    pub(super) fn on_events(&mut self, events: &[Event]) {
        for ev in events {
            match ev {
                Event::TaskFailed { charged: true, .. } => self.stats.task_failures += 1,
                Event::GangReserved { alloc, nodes, .. } => {
                    if let Some(planned) = self.stats.first_planned.remove(alloc)
                        && self.now > planned
                    {
                        self.stats.late += 1;
                        self.stats.max_late_ms = self.stats.max_late_ms.max(self.now - planned);
                    }
                    self.sync_nodes(nodes);
                    self.at(self.now + self.cfg.admission.stale_reservation_ms, Ev::Tick);
                }
                Event::GangRolledBack { .. } => self.stats.rollbacks += 1,
                Event::PreemptionDecided { victims, .. } => self.stats.preemptions += victims.len() as u64,
                Event::TeardownStarted { alloc, preempting, cause, .. } => {
                    if matches!(cause, TeardownCause::TaskFailed { .. }) {
                        self.stats.teardowns += 1;
                    } else if let Some(a) = self.state.alloc(*alloc)
                        && a.spec.checkpoint != muster_core::sm::CheckpointMode::None
                        && let Some(since) = a.tasks.iter().filter_map(|t| t.started_at_ms).max()
                    {
                        // The hint saves the progress of this run.
                        *self.progress_ms.entry(*alloc).or_default() += self.now.saturating_sub(since);
                    }
                    let nodes: Vec<NodeId> = preempting.iter().map(|(_, node)| node.clone()).collect();
                    self.sync_nodes(&nodes);
                    let force_after = match (self.cfg.preemption, self.state.alloc(*alloc).and_then(|a| a.teardown)) {
                        (Some(p), Some(td)) if td.preempted_by().is_some() => p.force_after_ms(true),
                        _ => self.cfg.force_teardown_ms,
                    };
                    self.at(self.now + force_after, Ev::Tick);
                }
                Event::TaskPreempted { alloc, task, forced: true, .. } => {
                    if let Some(run) = self.agents.running.remove(&(*alloc, *task)) {
                        self.charge(*alloc, run);
                    }
                }
                Event::NodeLost { tasks, .. } => {
                    for key in tasks {
                        if let Some(run) = self.agents.running.remove(key) {
                            self.charge(key.0, run);
                        }
                    }
                }
                Event::AllocationDone { .. } | Event::AllocationFailed { .. } => self.stats.last_finish_ms = self.now,
                _ => {}
            }
        }
    }

    /// Each of `nodes` (in order, once each) hears what its stream would
    /// send now.
    fn sync_nodes(&mut self, nodes: &[NodeId]) {
        let mut seen = std::collections::BTreeSet::new();
        for node in nodes {
            let slot = self.state.node_slot(node).expect("an event names a known node").0;
            if seen.insert(slot) {
                self.sync(slot);
            }
        }
    }

    /// Node `slot`'s agent takes what `plan_sync` plans for it: it claims
    /// each assignment after its claim delay (or never, when it dies before
    /// claiming), and acks each preemption after its ack delay. A node that
    /// is down has no stream and hears nothing.
    fn sync(&mut self, slot: u32) {
        if self.is_down(slot) {
            return;
        }
        let i = slot as usize;
        let plan = plan_sync(&self.state, &self.agents.node_ids[i], &self.agents.sent[i], false, &SYNC);
        self.agents.sent[i].sent(&plan);
        let life = self.agents.life[i];
        for a in &plan.assign {
            let (alloc, task, epoch) = a.key;
            if self.rng.chance(self.cfg.lost_claim_prob) {
                continue; // this agent died before claiming
            }
            let (lo, hi) = self.cfg.claim_delay_ms;
            let delay = self.rng.range(lo, hi.max(lo));
            self.at(self.now + delay, Ev::Claim { alloc, task, node: slot, epoch, life });
        }
        for &((alloc, task, _), epoch, _) in &plan.preempt {
            let (lo, hi) = self.cfg.preempt_ack_ms;
            let delay = self.rng.range(lo, hi.max(lo));
            self.at(self.now + delay, Ev::Preempted { alloc, task, node: slot, epoch, life });
        }
    }
}
