//! Leader-only loops: they run while this replica leads and stop the moment
//! it does not. Today: admission, every interval and whenever a submit or a
//! release wakes it.

use std::time::Duration;

use openraft::ServerState;
use tokio::task::JoinHandle;

use super::proposer::now_ms;
use super::replica::Shared;
use crate::policy::{AdmissionConfig, plan_admission};
use crate::sm::Outcome;

/// The leader loops of one replica.
pub struct LeaderLoops {
    task: JoinHandle<()>,
}

impl LeaderLoops {
    /// Starts watching for leadership.
    pub fn start(s: Shared, admission: AdmissionConfig, interval: Duration) -> LeaderLoops {
        LeaderLoops { task: tokio::spawn(run(s, admission, interval)) }
    }

    /// Stops them.
    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn run(s: Shared, admission: AdmissionConfig, interval: Duration) {
    let mut metrics = s.raft.metrics();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let leading = metrics.borrow().state == ServerState::Leader;
        if !leading {
            if metrics.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = tick.tick() => admission_pass(&s, &admission).await,
            _ = s.admission_wake.notified() => admission_pass(&s, &admission).await,
            changed = metrics.changed() => if changed.is_err() { return },
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
