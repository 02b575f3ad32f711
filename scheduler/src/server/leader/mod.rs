//! The leader loop: I/O only. While this replica leads it reads the clock,
//! runs the pure [`Tick`] of `muster_core::tick` and proposes each pass's
//! commands, waiting for them to apply before the next pass reads the state.
//! It stops the moment this replica does not lead.
//!
//! A tick runs when the admission interval elapses, when a submit or a
//! release wakes admission, when the last tick asked to be woken
//! ([`Tick::next_wake`]: a preemption pass that had to wait for its
//! interval, a failed gang's back-off ending), and every
//! `liveness_every_ms` for the node-lost and deadline passes. What each
//! pass decides, in which order, and when to come back is
//! `muster_core::tick`'s; the simulator drives the same [`Tick`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_core::tick::{LeaderConfig, NextWake, Pass, PassTimers, Silence, Tick, TickTime, Wake};

use crate::server::raft::{Consensus, ProposeError};
use crate::sm::{Command, Outcome, State};

mod liveness;
mod registry;
mod work;

pub use liveness::Liveness;
pub(crate) use registry::Outbound;
pub use registry::{AgentRegistry, OutboundStream};
pub use work::LeaderWork;

/// What the leader loop drives its tick with: the replica's consensus and
/// its leader work.
struct Replicated {
    c: Consensus,
    work: LeaderWork,
}

/// The leader loop of one replica: watches for leadership and, while it
/// leads, runs the passes; admission runs at least every `interval`. It
/// runs until dropped (the replica's shutdown drops it where it waits).
/// `admission_passes` counts the admission passes whose commands have been
/// applied (a test waits on it to know the leader has looked at the queue
/// since something happened).
pub async fn run(
    c: Consensus,
    work: LeaderWork,
    cfg: LeaderConfig,
    interval: Duration,
    admission_passes: Arc<AtomicU64>,
) {
    let s = Replicated { c, work };
    // Leadership changes only: not every applied entry.
    let mut leading = s.c.leading();
    let mut admission_tick = tokio::time::interval(interval);
    admission_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut liveness_tick = tokio::time::interval(Duration::from_millis(cfg.liveness_every_ms.max(1)));
    liveness_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leading = false;
    let mut timers = PassTimers::default();
    // When the last tick asked to be woken (a preemption pass that had to
    // wait, a back-off's end): the core's answer, not this loop's.
    let mut next = NextWake::default();
    loop {
        if !*leading.borrow_and_update() {
            if was_leading {
                tracing::info!(id = s.c.id(), "this replica stopped leading");
            }
            was_leading = false;
            if leading.changed().await.is_err() {
                return;
            }
            continue;
        }
        if !was_leading {
            let term = s.c.raft().metrics().borrow().current_term;
            tracing::info!(id = s.c.id(), term, "this replica leads");
            was_leading = true;
            s.work.liveness().lead_from_now();
            timers = PassTimers::default();
            next = NextWake::default();
        }
        let asked = next
            .admission_ms()
            .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(s.c.clock().mono_ms())));
        let asked = async {
            match asked {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            _ = admission_tick.tick() => Wake { admission: true },
            _ = s.work.admission_woken() => Wake { admission: true },
            _ = asked => Wake { admission: true },
            _ = liveness_tick.tick() => Wake { admission: false },
            changed = leading.changed() => if changed.is_err() { return } else { continue },
        };
        let time = s.c.reader().read(|st| TickTime { wall_ms: s.c.now(st), mono_ms: s.c.clock().mono_ms() });
        let mut tick = Tick::begin(time, wake, &mut timers, &cfg);
        let mut admitted = 0;
        drive(&mut tick, &mut timers, &s, &mut |pass, seconds| {
            record(pass, seconds);
            admitted += u64::from(matches!(pass, Pass::Admission(_)));
        })
        .await;
        admission_passes.fetch_add(admitted, Ordering::Relaxed);
        next = s.c.reader().read(|st| tick.next_wake(st, &timers, &next));
    }
}

/// What [`drive`] needs of a replica: its state, its memory of heartbeats,
/// and a way to propose. The replica's consensus and leader work are one; a test's recorder
/// is another.
pub trait TickShell: Sync {
    /// Reads the applied state.
    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R;
    /// How long each node has been silent.
    fn silence(&self) -> &(dyn Silence + Sync);
    /// Proposes `commands` (in order) and waits for every outcome.
    fn propose_all(&self, commands: Vec<Command>) -> impl Future<Output = Vec<Result<Outcome, ProposeError>>> + Send;
}

impl TickShell for Replicated {
    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        self.c.reader().read(f)
    }

    fn silence(&self) -> &(dyn Silence + Sync) {
        self.work.liveness()
    }

    fn propose_all(&self, commands: Vec<Command>) -> impl Future<Output = Vec<Result<Outcome, ProposeError>>> + Send {
        self.c.proposer().propose_all(commands)
    }
}

/// Runs one tick to its end: each pass's commands are proposed and applied
/// before the next pass reads the state. Stops early when a proposal fails
/// (this replica stopped leading, or is shutting down). `seen` is shown
/// every pass, with the seconds it took to decide, before its commands are
/// proposed.
pub async fn drive<S: TickShell>(
    tick: &mut Tick,
    timers: &mut PassTimers,
    shell: &S,
    seen: &mut (dyn FnMut(&Pass, f64) + Send),
) {
    loop {
        let next = shell.read(|st| {
            let started = std::time::Instant::now();
            tick.next(st, shell.silence(), timers).map(|p| (p, started.elapsed().as_secs_f64()))
        });
        let Some((pass, seconds)) = next else { return };
        seen(&pass, seconds);
        if pass.commands().is_empty() {
            continue;
        }
        let kind = pass.kind();
        for result in shell.propose_all(pass.into_commands()).await {
            match result {
                Ok(Outcome::Accepted(_)) => {}
                // A plan made from a view that moved on: apply refused it.
                Ok(Outcome::Rejected(r)) => tracing::debug!(pass = ?kind, rejection = %r, "leader command refused"),
                Err(e) => {
                    tracing::debug!(pass = ?kind, error = %e, "leader proposal failed");
                    return;
                }
            }
        }
    }
}

/// Metrics and logs of one pass.
fn record(pass: &Pass, seconds: f64) {
    match pass {
        Pass::NodeLost(cmds) => {
            for cmd in cmds {
                if let Command::MarkNodeLost { node } = cmd {
                    tracing::warn!(node = %node, "node silent while holding work; marking it lost");
                }
            }
        }
        Pass::Deadlines(_) => {}
        Pass::Admission(plan) => {
            metrics::histogram!("muster_admission_pass_seconds").record(seconds);
            metrics::gauge!("muster_admission_planned_starts").set(plan.planned.len() as f64);
            metrics::counter!("muster_admission_backfilled_total").increment(plan.stats.backfilled as u64);
            metrics::counter!("muster_admission_wait_notes_total").increment(plan.stats.wait_notes as u64);
            if !plan.commands.is_empty() {
                tracing::debug!(gangs = plan.stats.gangs_placed, rollbacks = plan.stats.rollbacks, "admission pass");
            }
        }
        Pass::Preemption { .. } => metrics::histogram!("muster_preemption_decision_seconds").record(seconds),
    }
}
