//! The gauges a replica keeps current from Raft's metrics and from its
//! applied state.

use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;

use crate::server::raft::Consensus;

/// Keeps the replica's Raft gauges current (labelled `replica`, so the
/// replicas of one process stay apart): `muster_raft_term`,
/// `muster_raft_leader_id`, `muster_raft_is_leader`,
/// `muster_raft_applied_index`, `muster_raft_last_log_index`,
/// `muster_raft_snapshot_index`. Ends when Raft shuts down.
pub async fn export_raft(shared: Consensus) {
    let mut metrics = shared.raft().metrics();
    let replica = shared.id().to_string();
    loop {
        {
            let m = metrics.borrow_and_update();
            let r = replica.clone();
            metrics::gauge!("muster_raft_term", "replica" => r.clone()).set(m.current_term as f64);
            metrics::gauge!("muster_raft_leader_id", "replica" => r.clone()).set(m.current_leader.unwrap_or(0) as f64);
            metrics::gauge!("muster_raft_is_leader", "replica" => r.clone()).set(if m.state == ServerState::Leader {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("muster_raft_applied_index", "replica" => r.clone())
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            metrics::gauge!("muster_raft_last_log_index", "replica" => r.clone())
                .set(m.last_log_index.unwrap_or(0) as f64);
            metrics::gauge!("muster_raft_snapshot_index", "replica" => r).set(m.snapshot.map_or(0, |l| l.index) as f64);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// How often the gauges read from the applied state are refreshed. A
/// refresh reads the state's indexes (counts per class and per node), so
/// its cost does not grow with the queue.
const STATE_METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the gauges read from the applied state current, once a second:
/// `muster_sm_queue_depth`, `muster_queue_depth{class}`,
/// `muster_sm_allocations`, `muster_sm_forgotten_allocations`, `muster_sm_nodes`, `muster_nodes{state}`,
/// `muster_nodes_flagged_dead` (nodes marked lost), `muster_gpus{state}`.
/// Ends when the replica stops.
pub async fn export_state(shared: Consensus, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(STATE_METRICS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (queued, by_class, allocs, nodes, by_status, gpus, (forgotten, compacted)) = shared.reader().read(|st| {
            let by_status = crate::sm::NodeStatus::ALL.map(|s| (s, st.node_count(s)));
            let by_class = st.queued_by_class().clone();
            let gpus = super::dashboard::gpu_totals(st);
            let retained = (st.forgotten_allocs(), st.compacted_len());
            (st.queue_len(), by_class, st.allocs().len(), st.nodes().len(), by_status, gpus, retained)
        });
        metrics::gauge!("muster_sm_forgotten_allocations").set(forgotten as f64);
        metrics::gauge!("muster_sm_compacted_allocations").set(compacted as f64);
        for (status, count) in by_status {
            if status == crate::sm::NodeStatus::Lost {
                metrics::gauge!("muster_nodes_flagged_dead").set(count as f64);
            }
            metrics::gauge!("muster_nodes", "state" => status.as_str()).set(count as f64);
        }
        for class in super::telemetry::CLASSES {
            let n = class.parse::<u8>().ok().and_then(|c| by_class.get(&c)).copied().unwrap_or(0);
            metrics::gauge!("muster_queue_depth", "class" => class).set(f64::from(n));
        }
        let (free, reserved, running) = gpus;
        metrics::gauge!("muster_gpus", "state" => "free").set(free as f64);
        metrics::gauge!("muster_gpus", "state" => "reserved").set(reserved as f64);
        metrics::gauge!("muster_gpus", "state" => "running").set(running as f64);
        metrics::gauge!("muster_sm_queue_depth").set(queued as f64);
        metrics::gauge!("muster_sm_allocations").set(allocs as f64);
        metrics::gauge!("muster_sm_nodes").set(nodes as f64);
    }
}
