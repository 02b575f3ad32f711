//! Is this replica fit to serve? One answer, published three ways: the
//! standard gRPC health service (`grpc.health.v1.Health`, for grpcurl and
//! gRPC-aware load balancers), `GET /readyz` on the HTTP listener (for
//! Kubernetes readiness probes, which speak neither TLS client certificates
//! nor our roles), and the `muster_replica_ready` gauge (with
//! `muster_raft_committed_index` beside it).
//!
//! A replica is *ready* when it knows a leader and has applied everything it
//! knows to be committed: reads it serves are then no staler than Raft's own
//! lag, and writes reach the leader. It is *alive* (`GET /healthz`) while
//! Raft runs; a storage fault stops Raft and fails liveness, so a supervisor
//! restarts the process.
//!
//! ```text
//!   every 500 ms: raft metrics + committed index + applied index
//!        │
//!        ▼
//!   Readiness ──▶ watch channel ──▶ /readyz, /healthz, /ui
//!        └──────▶ HealthReporter ─▶ grpc.health.v1.Health/Check, Watch
//! ```
//!
//! The raft service reports SERVING whenever the process runs: a replica
//! that is catching up must still take AppendEntries to become ready.

use std::time::Duration;

use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::server::raft::Consensus;

/// How often readiness is recomputed.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The services whose health follows readiness.
pub const CLIENT_SERVICES: [&str; 5] = [
    "muster.v1.AllocationService",
    "muster.v1.NodeService",
    "muster.v1.VClusterService",
    "muster.v1.AdminService",
    "muster.v1.AgentService",
];

/// The Raft service: serving while the process runs.
pub const RAFT_SERVICE: &str = "muster.v1.RaftService";

/// One readiness reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Raft is running (no fatal storage error, not shut down).
    pub alive: bool,
    /// Ready to serve clients.
    pub ready: bool,
    /// Why not, or `"ok"`.
    pub reason: String,
    /// The leader this replica knows.
    pub leader_id: Option<u64>,
    /// Last index applied here.
    pub applied_index: u64,
    /// Last index this replica knows to be committed.
    pub committed_index: u64,
}

impl Readiness {
    /// The reading before the first check.
    pub fn starting() -> Readiness {
        Readiness {
            alive: true,
            ready: false,
            reason: "starting".into(),
            leader_id: None,
            applied_index: 0,
            committed_index: 0,
        }
    }
}

/// Decides readiness from what Raft says. Pure, so the rule is tested on
/// its own.
pub fn decide(running: Result<(), String>, leader_id: Option<u64>, applied: u64, committed: u64) -> Readiness {
    let mut r = Readiness {
        alive: running.is_ok(),
        ready: false,
        reason: String::new(),
        leader_id,
        applied_index: applied,
        committed_index: committed,
    };
    r.reason = match (running, leader_id) {
        (Err(e), _) => format!("raft stopped: {e}"),
        (Ok(()), None) => "no leader known".into(),
        (Ok(()), Some(_)) if applied < committed => format!("catching up: applied {applied} of {committed} committed"),
        (Ok(()), Some(_)) => {
            r.ready = true;
            "ok".into()
        }
    };
    r
}

/// Reads Raft once and decides.
pub async fn check(shared: &Consensus) -> Readiness {
    let m = shared.raft().metrics().borrow().clone();
    let running = m.running_state.clone().map_err(|e| e.to_string());
    if running.is_err() {
        return decide(running, m.current_leader, 0, 0);
    }
    let committed = match shared.raft().with_raft_state(|st| st.committed.map_or(0, |l| l.index)).await {
        Ok(c) => c,
        Err(e) => return decide(Err(e.to_string()), m.current_leader, 0, 0),
    };
    let applied = shared.reader().applied().map_or(0, |l| l.index);
    decide(Ok(()), m.current_leader, applied, committed)
}

/// Keeps `reporter`, `tx` and `muster_replica_ready` current until `tx` has
/// no receivers or Raft shuts down.
pub async fn run(shared: Consensus, reporter: HealthReporter, tx: watch::Sender<Readiness>) {
    reporter.set_service_status("", ServingStatus::NotServing).await;
    for s in CLIENT_SERVICES {
        reporter.set_service_status(s, ServingStatus::NotServing).await;
    }
    reporter.set_service_status(RAFT_SERVICE, ServingStatus::Serving).await;
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<bool> = None;
    loop {
        tick.tick().await;
        let r = check(&shared).await;
        let replica = shared.id().to_string();
        metrics::gauge!("muster_replica_ready", "replica" => replica.clone()).set(if r.ready { 1.0 } else { 0.0 });
        metrics::gauge!("muster_raft_committed_index", "replica" => replica).set(r.committed_index as f64);
        if last != Some(r.ready) {
            let status = if r.ready { ServingStatus::Serving } else { ServingStatus::NotServing };
            reporter.set_service_status("", status).await;
            for s in CLIENT_SERVICES {
                reporter.set_service_status(s, status).await;
            }
            tracing::info!(ready = r.ready, reason = %r.reason, "readiness changed");
            last = Some(r.ready);
        }
        let stopped = !r.alive;
        if stopped {
            // openraft's own account of it is filtered out by default
            // (its core module logs every routine vote too): say it here.
            tracing::error!(reason = %r.reason, "Raft stopped; this replica can no longer serve");
        }
        if tx.send(r).is_err() || stopped {
            if stopped {
                reporter.set_service_status(RAFT_SERVICE, ServingStatus::NotServing).await;
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_a_leader_and_everything_committed_applied() {
        let r = decide(Ok(()), Some(2), 10, 10);
        assert!(r.ready && r.alive, "{r:?}");
        assert_eq!(r.reason, "ok");
        let r = decide(Ok(()), None, 10, 10);
        assert!(!r.ready && r.alive);
        assert_eq!(r.reason, "no leader known");
        let r = decide(Ok(()), Some(1), 7, 10);
        assert!(!r.ready);
        assert_eq!(r.reason, "catching up: applied 7 of 10 committed");
        let r = decide(Err("storage: disk full".into()), Some(1), 10, 10);
        assert!(!r.ready && !r.alive);
        assert_eq!(r.reason, "raft stopped: storage: disk full");
    }
}
