//! The leader's tick: every decision the leader proposes on its own, in one
//! order, with its timers as data.
//!
//! ```text
//!   shell: read the clock ──▶ Tick::begin(time, wake, &mut timers)
//!          loop { pass = tick.next(&State, &silence) ──▶ propose pass.commands() ──▶ wait for apply }
//! ```
//!
//! A tick runs up to four passes, in this order:
//!
//! 1. **Node lost** (every `liveness_every_ms`): a node that may hold work,
//!    holds some, and has been silent for `node_lost_after_ms` is marked
//!    lost. Silence is the shell's memory of heartbeats ([`Heard`]), not
//!    replicated state: a new leader gives every node a full window.
//! 2. **Deadlines** (with the node-lost pass): forced teardowns past their
//!    force deadline, preemptors' holds that expired, drains past their
//!    deadline, and a forget of finished allocations past the retention
//!    window. Every deadline is an entry time in the replicated state.
//! 3. **Admission** (when woken: a submit, a release, the admission interval,
//!    or an earlier pass of this tick proposing something).
//! 4. **Reclaim or preemption** (after admission, when lenders wait or
//!    preemptors are still blocked): at most once per `min_pass_interval_ms`
//!    for the preemptors an earlier pass looked at, and after a 50 ms floor
//!    for a newly blocked one. Lenders take borrowed nodes back first; a pass
//!    that reclaims does not also preempt, since both read the same view.
//!    A pass that had to wait says until when
//!    ([`Tick::preemption_waits_until`]), and the shell wakes then.
//!
//! When a tick is over, [`Tick::next_wake`] says when the shell should run
//! the next one besides a submit or a release waking it: a preemption pass
//! that had to wait, a gang whose back-off ends, the liveness passes. The
//! leader loop sleeps until the earliest; the simulator schedules them.
//!
//! Each pass reads the state the previous pass's commands left, so the shell
//! proposes a pass's commands and waits for them to apply before it asks for
//! the next. The leader (`muster-scheduler`'s leader loop) and the simulator
//! (`muster-sim`) drive the same [`Tick`]; neither decides anything itself.

use std::collections::BTreeMap;

use crate::policy::{
    AdmissionConfig, AdmissionPlan, PreemptionConfig, ReclaimConfig, RetentionConfig, plan_admission, plan_compact,
    plan_drain_expiries, plan_expired_nominations, plan_forced_teardowns, plan_forget, plan_preemptions, plan_reclaims,
};
use crate::sm::{Command, NodeId, State};

/// How often the node-lost and deadline passes run.
pub const DEFAULT_LIVENESS_EVERY_MS: u64 = 1_000;

/// The leader's settings: what its passes decide with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaderConfig {
    /// Admission policy knobs.
    pub admission: AdmissionConfig,
    /// Priority-preemption knobs.
    pub preemption: PreemptionConfig,
    /// Elastic-reclamation knobs.
    pub reclaim: ReclaimConfig,
    /// Whether the reclaim-or-preemption pass runs at all. The leader always
    /// runs it; a simulation studying admission alone turns it off.
    pub preempt: bool,
    /// A node silent this long while holding work is marked lost, ms.
    pub node_lost_after_ms: u64,
    /// A teardown's stopping tasks are forced to stopped this long after it
    /// started (longer for a preemption's victims: their checkpoint
    /// deadline comes first), ms.
    pub teardown_force_after_ms: u64,
    /// How often the node-lost and deadline passes run, ms.
    pub liveness_every_ms: u64,
    /// When finished allocations leave the live state (`None`: never).
    pub retention: Option<RetentionConfig>,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            admission: AdmissionConfig::default(),
            preemption: PreemptionConfig::default(),
            reclaim: ReclaimConfig::default(),
            preempt: true,
            node_lost_after_ms: 30_000,
            teardown_force_after_ms: crate::policy::DEFAULT_FORCE_AFTER_MS,
            liveness_every_ms: DEFAULT_LIVENESS_EVERY_MS,
            retention: Some(RetentionConfig::default()),
        }
    }
}

/// Times on the shell's clock that a tick reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickTime {
    /// Wall time, ms since the Unix epoch, never behind the state's own
    /// `now_ms`: replicated deadlines are compared with it.
    pub wall_ms: u64,
    /// Monotonic time, ms on any fixed origin: pass intervals and silence
    /// are measured with it, so a wall-clock jump cannot mark a node lost.
    pub mono_ms: u64,
}

/// The shortest gap between two preemption passes, ms, even for a newly
/// blocked preemptor (a burst of submits runs one pass per tick at most,
/// and ticks this close together share one).
pub const FRESH_PREEMPTION_FLOOR_MS: u64 = 50;

/// When each pass last ran, in monotonic ms. A new leader starts with fresh
/// timers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassTimers {
    last_liveness_ms: Option<u64>,
    last_preemption_ms: Option<u64>,
    /// The newest allocation (ids grow with submits) among the preemptors
    /// the last preemption pass looked at: a newer one is a reason to run
    /// again before the interval ends.
    newest_preemptor: u64,
}

impl PassTimers {
    /// When the node-lost and deadline passes are next due.
    pub fn liveness_due_ms(&self, cfg: &LeaderConfig) -> u64 {
        self.last_liveness_ms.map_or(0, |t| t.saturating_add(cfg.liveness_every_ms))
    }

    /// When a reclaim-or-preemption pass may next run for the preemptors
    /// it has already looked at.
    pub fn preemption_due_ms(&self, cfg: &LeaderConfig) -> u64 {
        self.last_preemption_ms.map_or(0, |t| t.saturating_add(cfg.preemption.min_pass_interval_ms))
    }

    /// When one may next run for a newly blocked preemptor.
    pub fn fresh_preemption_due_ms(&self, cfg: &LeaderConfig) -> u64 {
        self.last_preemption_ms
            .map_or(0, |t| t.saturating_add(FRESH_PREEMPTION_FLOOR_MS.min(cfg.preemption.min_pass_interval_ms)))
    }
}

/// Why the shell runs a tick now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wake {
    /// Something admission should look at: a submit, a release, a
    /// reservation that may have gone stale, or the admission interval.
    pub admission: bool,
}

/// When the shell should run its next tick, on the monotonic clock its
/// [`TickTime`]s read, as [`Tick::next_wake`] says once a tick is over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextWake {
    /// A reclaim-or-preemption pass had to wait (or ran, and its interval
    /// ends then): wake admission then.
    pub preemption_ms: Option<u64>,
    /// The first gang backing off after a failure may be placed then: wake
    /// admission then.
    pub retry_ms: Option<u64>,
    /// The node-lost and deadline passes are next due then.
    pub liveness_ms: u64,
}

impl NextWake {
    /// The earliest time admission should be woken for, if any.
    pub fn admission_ms(&self) -> Option<u64> {
        match (self.preemption_ms, self.retry_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// How long each node has been silent: the shell's memory of heartbeats.
pub trait Silence {
    /// How long `node` has been silent at monotonic time `mono_ms`.
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64;
}

/// When the leader last heard from each node, in monotonic ms. Kept by the
/// leader's shell, never replicated: a new leader starts it afresh with
/// [`Heard::lead_from`], which gives every node a full window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    last: BTreeMap<NodeId, u64>,
    leading_since_ms: Option<u64>,
}

impl Heard {
    /// A message from `node` arrived at `mono_ms`.
    pub fn touch(&mut self, node: &NodeId, mono_ms: u64) {
        let last = self.last.entry(node.clone()).or_insert(mono_ms);
        *last = (*last).max(mono_ms);
    }

    /// This replica started leading at `mono_ms`: forget what an earlier
    /// term heard, and count every node's silence from now at the earliest.
    pub fn lead_from(&mut self, mono_ms: u64) {
        self.last.clear();
        self.leading_since_ms = Some(mono_ms);
    }
}

impl Silence for Heard {
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64 {
        let since = match (self.last.get(node), self.leading_since_ms) {
            (Some(&seen), Some(lead)) => seen.max(lead),
            (Some(&seen), None) => seen,
            (None, Some(lead)) => lead,
            (None, None) => return 0,
        };
        mono_ms.saturating_sub(since)
    }
}

/// Which of the tick's passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassKind {
    /// Silent nodes holding work are marked lost.
    NodeLost,
    /// Forced teardowns, expired holds, drains past their deadline, and
    /// finished allocations past the retention window.
    Deadlines,
    /// Admission.
    Admission,
    /// Reclaim, or else priority preemption.
    Preemption,
}

/// One pass's decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Pass {
    /// `MarkNodeLost` for each silent node holding work, in slot order.
    NodeLost(Vec<Command>),
    /// Forced teardowns, then expired holds, then drain expiries, then a
    /// forget of what is past its retention.
    Deadlines(Vec<Command>),
    /// The admission pass's plan (its commands, planned starts, counters).
    Admission(AdmissionPlan),
    /// Reclaims, or (when nothing is reclaimed) preemptions.
    Preemption {
        /// How many of `commands` are reclaims (they come first).
        reclaims: usize,
        /// The commands.
        commands: Vec<Command>,
    },
}

impl Pass {
    /// Which pass.
    pub fn kind(&self) -> PassKind {
        match self {
            Pass::NodeLost(_) => PassKind::NodeLost,
            Pass::Deadlines(_) => PassKind::Deadlines,
            Pass::Admission(_) => PassKind::Admission,
            Pass::Preemption { .. } => PassKind::Preemption,
        }
    }

    /// The commands to propose, in order.
    pub fn commands(&self) -> &[Command] {
        match self {
            Pass::NodeLost(c) | Pass::Deadlines(c) | Pass::Preemption { commands: c, .. } => c,
            Pass::Admission(plan) => &plan.commands,
        }
    }

    /// The commands to propose, in order, by value.
    pub fn into_commands(self) -> Vec<Command> {
        match self {
            Pass::NodeLost(c) | Pass::Deadlines(c) | Pass::Preemption { commands: c, .. } => c,
            Pass::Admission(plan) => plan.commands,
        }
    }
}

/// One tick in progress: which passes are still to run.
#[derive(Clone, Debug)]
pub struct Tick {
    time: TickTime,
    cfg: LeaderConfig,
    liveness: bool,
    admission: bool,
    next: Option<PassKind>,
    proposed: bool,
    /// A preemption pass had work but had to wait: when it may run (mono ms).
    preemption_waits_until: Option<u64>,
    /// Whether this tick got as far as the reclaim-or-preemption pass.
    preemption_considered: bool,
}

impl Tick {
    /// Starts a tick at `time`, woken for `wake`. Decides which timed
    /// passes are due and moves `timers` on for them.
    pub fn begin(time: TickTime, wake: Wake, timers: &mut PassTimers, cfg: &LeaderConfig) -> Tick {
        let liveness = time.mono_ms >= timers.liveness_due_ms(cfg);
        if liveness {
            timers.last_liveness_ms = Some(time.mono_ms);
        }
        Tick {
            time,
            cfg: *cfg,
            liveness,
            admission: wake.admission,
            next: Some(PassKind::NodeLost),
            proposed: false,
            preemption_waits_until: None,
            preemption_considered: false,
        }
    }

    /// When the reclaim-or-preemption pass should run again (monotonic ms):
    /// it had something to decide but had to wait for its interval, or it
    /// ran and its interval ends then. The shell wakes admission at that
    /// time, so a preemptor still blocked is retried then rather than at
    /// the next submit or admission interval; a tick that finds nothing to
    /// decide asks for nothing more.
    pub fn preemption_waits_until(&self) -> Option<u64> {
        self.preemption_waits_until
    }

    /// Whether this tick looked at the reclaim-or-preemption pass at all. A
    /// tick that did not (the liveness passes alone, or one that ended
    /// early) says nothing about preemption: a wait an earlier tick asked
    /// for still stands.
    pub fn preemption_considered(&self) -> bool {
        self.preemption_considered
    }

    /// When the shell should run the next tick, read once this tick is over
    /// (`state` as its passes left it; `before` what the previous tick
    /// said). A tick that never looked at preemption keeps the wait
    /// `before` asked for (a liveness tick inside that wait must not drop
    /// it, or a blocked preemptor waits for an unrelated wake-up); one that
    /// looked and found nothing to wait for asks for none. A back-off's end
    /// is a replicated wall time, mapped onto the monotonic clock from this
    /// tick's reading of both.
    pub fn next_wake(&self, state: &State, timers: &PassTimers, before: &NextWake) -> NextWake {
        let preemption_ms = match self.preemption_waits_until {
            Some(due) => Some(due),
            None if self.preemption_considered => None,
            None => before.preemption_ms,
        };
        let retry_ms = state
            .next_retry_after(self.time.wall_ms)
            .map(|at| self.time.mono_ms.saturating_add(at.saturating_sub(self.time.wall_ms)));
        NextWake { preemption_ms, retry_ms, liveness_ms: timers.liveness_due_ms(&self.cfg) }
    }

    /// Whether this tick runs the node-lost and deadline passes.
    pub fn liveness_due(&self) -> bool {
        self.liveness
    }

    /// The next pass with something to propose, read from `state` as the
    /// previous passes' commands left it; `None` when the tick is over.
    /// `timers` records a preemption pass when one runs.
    pub fn next(&mut self, state: &State, silence: &dyn Silence, timers: &mut PassTimers) -> Option<Pass> {
        while let Some(kind) = self.next {
            self.next = match kind {
                PassKind::NodeLost => Some(PassKind::Deadlines),
                PassKind::Deadlines => Some(PassKind::Admission),
                PassKind::Admission => Some(PassKind::Preemption),
                PassKind::Preemption => None,
            };
            let pass = match kind {
                PassKind::NodeLost if self.liveness => Pass::NodeLost(self.lost_nodes(state, silence)),
                PassKind::Deadlines if self.liveness => Pass::Deadlines(self.deadlines(state)),
                PassKind::Admission if self.admission || self.proposed => {
                    self.admission = true;
                    Pass::Admission(plan_admission(state, self.time.wall_ms, &self.cfg.admission))
                }
                PassKind::Preemption if self.admission && self.cfg.preempt => {
                    self.preemption_considered = true;
                    // Reason to run: lenders waiting, or preemptors still
                    // blocked after admission. The interval bounds how
                    // often the same preemptors are retried; a preemptor
                    // newer than any the last pass saw may go after a short
                    // floor (checkpoint-less victims then stop at once, not
                    // up to an interval later).
                    let newest = state.preemptor_queue().map(|(_, k)| k.alloc).max();
                    if state.lenders().next().is_none() && newest.is_none() {
                        continue; // nothing to decide: the timer stays put
                    }
                    let fresh = newest.is_some_and(|id| id > timers.newest_preemptor);
                    let due = if fresh {
                        timers.fresh_preemption_due_ms(&self.cfg)
                    } else {
                        timers.preemption_due_ms(&self.cfg)
                    };
                    if self.time.mono_ms < due {
                        self.preemption_waits_until = Some(due);
                        continue;
                    }
                    timers.last_preemption_ms = Some(self.time.mono_ms);
                    timers.newest_preemptor = timers.newest_preemptor.max(newest.unwrap_or(0));
                    // Whoever this pass cannot serve is retried after the
                    // interval (a victim's minimum runtime may end by then).
                    self.preemption_waits_until = Some(timers.preemption_due_ms(&self.cfg));
                    self.preemption(state)
                }
                _ => continue,
            };
            if pass.commands().is_empty() && !matches!(pass, Pass::Admission(_)) {
                continue;
            }
            self.proposed |= !pass.commands().is_empty();
            return Some(pass);
        }
        None
    }

    fn lost_nodes(&self, state: &State, silence: &dyn Silence) -> Vec<Command> {
        state
            .nodes()
            .iter()
            .filter(|n| n.status.may_hold_work() && state.tasks_on_node(n.slot).next().is_some())
            .filter(|n| silence.silent_ms(&n.id, self.time.mono_ms) >= self.cfg.node_lost_after_ms)
            .map(|n| Command::MarkNodeLost { node: n.id.clone() })
            .collect()
    }

    fn deadlines(&self, state: &State) -> Vec<Command> {
        let now = self.time.wall_ms;
        let mut cmds = plan_forced_teardowns(state, now, self.cfg.teardown_force_after_ms, &self.cfg.preemption);
        cmds.extend(plan_expired_nominations(state, now));
        cmds.extend(plan_drain_expiries(state, now));
        // Compaction first: a forget in the same pass may take allocations
        // the compaction would (both past their windows), and then the
        // compaction would find nothing and be refused.
        cmds.extend(self.cfg.retention.and_then(|r| plan_compact(state, now, &r)));
        cmds.extend(self.cfg.retention.and_then(|r| plan_forget(state, now, &r)));
        cmds
    }

    fn preemption(&self, state: &State) -> Pass {
        let now = self.time.wall_ms;
        let (cfg, reclaim) = (&self.cfg.preemption, &self.cfg.reclaim);
        // Lenders take their nodes back first: borrowed work was never
        // theirs to keep.
        let commands: Vec<Command> =
            plan_reclaims(state, now, reclaim, cfg).into_iter().map(|r| r.command(state, cfg)).collect();
        if !commands.is_empty() {
            return Pass::Preemption { reclaims: commands.len(), commands };
        }
        let commands =
            plan_preemptions(state, now, cfg).into_iter().map(|(alloc, d)| d.command(state, alloc, cfg)).collect();
        Pass::Preemption { reclaims: 0, commands }
    }
}

#[cfg(test)]
#[path = "tick_test.rs"]
mod tick_test;
