//! Leader-only loops: they run while this replica leads and stop the moment
//! it does not.
//!
//! - Admission, every interval and whenever a submit or a release wakes it.
//! - Liveness, every second: a node that holds work and has been silent
//!   for `node_lost_after` is marked lost through Raft. A new leader first
//!   gives every node a full window.
//! - Force drain, right after each liveness pass: a teardown older than
//!   `teardown_force_after` (counted from its replicated start time; longer
//!   for a preemption's victims, which get their checkpoint deadline first)
//!   has its stuck preempting tasks moved to preempted, and completes. Holds
//!   of preemptors whose deadline passed are let go in the same pass, and
//!   draining nodes past their (replicated) deadline are timed out.
//! - Preemption, right after an admission pass but at most once a second
//!   (`min_pass_interval_ms`; the admission tick brings it back): for queued
//!   gangs of class ≥ 1 that still do not fit, highest class first, the pure
//!   victim choice of `policy::preemption`, proposed as one `Preempt`
//!   command each.

use std::time::Duration;

use openraft::ServerState;
use tokio::task::JoinHandle;

use super::proposer::now_ms;
use super::replica::Shared;
use crate::policy::{
    AdmissionConfig, PreemptionConfig, ReclaimConfig, plan_admission, plan_drain_expiries, plan_expired_nominations,
    plan_force_drains, plan_preemptions, plan_reclaims,
};
use crate::sm::{Command, NodeId, Outcome};

/// The leader loops' settings.
#[derive(Clone, Copy, Debug)]
pub struct LeaderConfig {
    /// Admission policy knobs.
    pub admission: AdmissionConfig,
    /// How often admission runs when nothing wakes it sooner.
    pub interval: Duration,
    /// A node silent this long while holding work is marked lost.
    pub node_lost_after: Duration,
    /// A teardown's preempting tasks are forced to preempted this long after
    /// it started.
    pub teardown_force_after: Duration,
    /// Priority-preemption knobs.
    pub preemption: PreemptionConfig,
    /// Elastic-reclamation knobs.
    pub reclaim: ReclaimConfig,
}

/// The leader loops of one replica.
pub struct LeaderLoops {
    task: JoinHandle<()>,
}

impl LeaderLoops {
    /// Starts watching for leadership.
    pub fn start(s: Shared, cfg: LeaderConfig) -> LeaderLoops {
        LeaderLoops { task: tokio::spawn(run(s, cfg)) }
    }

    /// Stops them.
    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn run(s: Shared, cfg: LeaderConfig) {
    let admission = cfg.admission;
    let mut metrics = s.raft.metrics();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut liveness_tick = tokio::time::interval(Duration::from_secs(1));
    liveness_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leading = false;
    let mut last_preemption: Option<std::time::Instant> = None;
    let preemption_every = Duration::from_millis(cfg.preemption.min_pass_interval_ms);
    let mut preemption_due = |now: std::time::Instant| {
        let due = last_preemption.is_none_or(|t| now.duration_since(t) >= preemption_every);
        if due {
            last_preemption = Some(now);
        }
        due
    };
    loop {
        let leading = metrics.borrow().state == ServerState::Leader;
        if !leading {
            was_leading = false;
            if metrics.changed().await.is_err() {
                return;
            }
            continue;
        }
        if !was_leading {
            was_leading = true;
            s.liveness.lead_from_now();
        }
        tokio::select! {
            _ = tick.tick() => {
                admission_pass(&s, &admission).await;
                if preemption_due(std::time::Instant::now()) {
                    preemption_pass(&s, &cfg.preemption, &cfg.reclaim).await;
                }
            }
            _ = s.admission_wake.notified() => {
                admission_pass(&s, &admission).await;
                if preemption_due(std::time::Instant::now()) {
                    preemption_pass(&s, &cfg.preemption, &cfg.reclaim).await;
                }
            }
            _ = liveness_tick.tick() => {
                liveness_pass(&s, cfg.node_lost_after).await;
                force_drain_pass(&s, cfg.teardown_force_after, &cfg.preemption).await;
            }
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

async fn liveness_pass(s: &Shared, node_lost_after: Duration) {
    let silent: Vec<NodeId> = s.reader.read(|st| {
        st.nodes()
            .iter()
            .filter(|n| n.status.may_hold_work() && st.tasks_on_node(n.slot).next().is_some())
            .filter(|n| s.liveness.silent_for(&n.id) >= node_lost_after)
            .map(|n| n.id.clone())
            .collect()
    });
    if silent.is_empty() {
        return;
    }
    for node in &silent {
        tracing::warn!(node = %node, "node silent while holding work; marking it lost");
    }
    let cmds = silent.into_iter().map(|node| Command::MarkNodeLost { node }).collect();
    for result in s.proposer.propose_all(cmds).await {
        if let Ok(Outcome::Accepted(_)) = result {
            s.admission_wake.notify_one();
        }
    }
}

async fn force_drain_pass(s: &Shared, force_after: Duration, preemption: &PreemptionConfig) {
    let now = now_ms();
    let cmds = s.reader.read(|st| {
        let mut cmds = plan_force_drains(st, now, force_after.as_millis() as u64, preemption);
        cmds.extend(plan_expired_nominations(st, now));
        cmds.extend(plan_drain_expiries(st, now));
        cmds
    });
    if cmds.is_empty() {
        return;
    }
    for result in s.proposer.propose_all(cmds).await {
        match result {
            Ok(Outcome::Accepted(_)) => s.admission_wake.notify_one(),
            Ok(Outcome::Rejected(r)) => tracing::debug!(rejection = %r, "force drain refused"),
            Err(e) => {
                tracing::debug!(error = %e, "force drain proposal failed");
                return;
            }
        }
    }
}

async fn admission_pass(s: &Shared, cfg: &AdmissionConfig) {
    let started = std::time::Instant::now();
    let plan = s.reader.read(|st| plan_admission(st, now_ms(), cfg));
    metrics::histogram!("muster_admission_pass_seconds").record(started.elapsed().as_secs_f64());
    metrics::gauge!("muster_admission_planned_starts").set(plan.planned.len() as f64);
    metrics::counter!("muster_admission_backfilled_total").increment(plan.stats.backfilled as u64);
    if plan.commands.is_empty() {
        return;
    }
    tracing::debug!(gangs = plan.stats.gangs_placed, rollbacks = plan.stats.rollbacks, "admission pass");
    for result in s.proposer.propose_all(plan.commands).await {
        match result {
            Ok(Outcome::Accepted(_)) => {}
            // A plan made from a view that moved on: apply refused it whole.
            Ok(Outcome::Rejected(r)) => tracing::debug!(rejection = %r, "admission command refused"),
            Err(e) => {
                tracing::debug!(error = %e, "admission proposal failed");
                return;
            }
        }
    }
}

async fn preemption_pass(s: &Shared, cfg: &PreemptionConfig, reclaim: &ReclaimConfig) {
    let started = std::time::Instant::now();
    let cmds: Option<Vec<Command>> = s.reader.read(|st| {
        let now = now_ms();
        // Lenders take their nodes back first: borrowed work was never theirs
        // to keep.
        let mut cmds: Vec<Command> =
            plan_reclaims(st, now, reclaim, cfg).into_iter().map(|r| r.command(st, cfg)).collect();
        // A pass that reclaims does not also preempt: both read this view
        // and could pick the same gang or nodes (the next pass goes on).
        if cmds.is_empty() && st.preemptor_queue().next().is_some() {
            cmds.extend(plan_preemptions(st, now, cfg).into_iter().map(|(alloc, d)| d.command(st, alloc, cfg)));
        }
        (!cmds.is_empty() || st.preemptor_queue().next().is_some()).then_some(cmds)
    });
    let Some(cmds) = cmds else { return };
    metrics::histogram!("muster_preemption_decision_seconds").record(started.elapsed().as_secs_f64());
    if cmds.is_empty() {
        return;
    }
    for result in s.proposer.propose_all(cmds).await {
        match result {
            Ok(Outcome::Accepted(_)) => {}
            Ok(Outcome::Rejected(r)) => tracing::debug!(rejection = %r, "preemption refused"),
            Err(e) => {
                tracing::debug!(error = %e, "preemption proposal failed");
                return;
            }
        }
    }
}
