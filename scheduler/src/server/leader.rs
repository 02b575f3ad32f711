//! Leader-only loops: they run while this replica leads and stop the moment
//! it does not.
//!
//! - Admission, every interval and whenever a submit or a release wakes it.
//! - Liveness, every second: a ready node that holds work and has been silent
//!   for `node_lost_after` is marked lost through Raft. A new leader first
//!   gives every node a full window.

use std::time::Duration;

use openraft::ServerState;
use tokio::task::JoinHandle;

use super::proposer::now_ms;
use super::replica::Shared;
use crate::policy::{AdmissionConfig, plan_admission};
use crate::sm::{Command, NodeId, NodeStatus, Outcome};

/// The leader loops of one replica.
pub struct LeaderLoops {
    task: JoinHandle<()>,
}

impl LeaderLoops {
    /// Starts watching for leadership.
    pub fn start(s: Shared, admission: AdmissionConfig, interval: Duration, node_lost_after: Duration) -> LeaderLoops {
        LeaderLoops { task: tokio::spawn(run(s, admission, interval, node_lost_after)) }
    }

    /// Stops them.
    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn run(s: Shared, admission: AdmissionConfig, interval: Duration, node_lost_after: Duration) {
    let mut metrics = s.raft.metrics();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut liveness_tick = tokio::time::interval(Duration::from_secs(1));
    liveness_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leading = false;
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
            _ = tick.tick() => admission_pass(&s, &admission).await,
            _ = s.admission_wake.notified() => admission_pass(&s, &admission).await,
            _ = liveness_tick.tick() => liveness_pass(&s, node_lost_after).await,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

async fn liveness_pass(s: &Shared, node_lost_after: Duration) {
    let silent: Vec<NodeId> = s.reader.read(|st| {
        st.nodes()
            .iter()
            .filter(|n| n.status == NodeStatus::Ready && st.tasks_on_node(n.slot).next().is_some())
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

async fn admission_pass(s: &Shared, cfg: &AdmissionConfig) {
    let plan = s.reader.read(|st| plan_admission(st, now_ms(), cfg));
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
