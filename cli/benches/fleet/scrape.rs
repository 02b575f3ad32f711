//! Reading the replicas: their `/metrics`, who leads, the nodes ready,
//! and the leader's memory at the run's marks.

use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::node_service_client::NodeServiceClient;
use tonic::transport::Channel;

use crate::common;

/// One scrape of a replica's `/metrics`.
pub struct Scrape(pub String);

impl Scrape {
    pub fn of(http: &str) -> Scrape {
        Scrape(common::metrics(http))
    }

    /// The value of one series, named with its labels as the exposition
    /// writes them (0 when absent).
    pub fn series(&self, series: &str) -> f64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// The first series of metric `name` (whatever its labels; 0 when
    /// absent).
    pub fn value(&self, name: &str) -> f64 {
        self.0
            .lines()
            .find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    }
}

/// A replica's gauge `name` (0 when it cannot be read).
pub fn gauge(http: &str, name: &str) -> u64 {
    Scrape::of(http).value(name) as u64
}

/// A replica's `muster_raft_applied_index`.
pub fn applied(http: &str) -> u64 {
    gauge(http, "muster_raft_applied_index")
}

/// Which replica leads, besides `skip` (polled every 20 ms until one
/// does). Read from the replicas' `/metrics` (`muster_raft_is_leader`,
/// set the moment Raft's state changes): their plain-HTTP listeners, not
/// the gRPC one that 10,000 agents dial after a failover, whose TLS
/// handshakes and accept queue would delay the answer by seconds.
pub async fn find_leader(https: &[String], skip: Option<usize>) -> usize {
    loop {
        for (i, h) in https.iter().enumerate().filter(|(i, _)| Some(*i) != skip) {
            if Scrape::of(h).value("muster_raft_is_leader") >= 1.0 {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn ready_nodes(ch: &Channel) -> Result<usize, tonic::Status> {
    let mut client = NodeServiceClient::new(ch.clone());
    let (mut token, mut ready) = (String::new(), 0);
    loop {
        let page =
            client.list_nodes(v1::ListNodesRequest { page_size: 1000, page_token: token.clone() }).await?.into_inner();
        ready += page.nodes.iter().filter(|n| n.status == v1::NodeStatus::Ready as i32).count();
        if page.next_page_token.is_empty() {
            return Ok(ready);
        }
        token = page.next_page_token;
    }
}

/// The leader's memory when the run passed one of its marks.
pub struct Mark {
    /// Distinct tasks started by then.
    pub started: u64,
    /// The leader's resident memory, KiB.
    pub rss_kib: u64,
    /// Its latest snapshot, bytes.
    pub snapshot: u64,
    /// Allocations it holds whole, and compacted.
    pub whole: u64,
    pub compacted: u64,
    /// Its allocator's live allocations, and what it keeps resident, bytes.
    pub allocated: u64,
    pub kept: u64,
}

impl Mark {
    pub fn read(started: u64, rss_kib: u64, l: &Scrape) -> Mark {
        let (whole, compacted) = held(l);
        Mark {
            started,
            rss_kib,
            snapshot: l.value("muster_raft_snapshot_bytes") as u64,
            whole,
            compacted,
            allocated: l.value("muster_allocator_allocated_bytes") as u64,
            kept: l.value("muster_allocator_resident_bytes") as u64,
        }
    }
}

/// Allocations the leader holds whole, and compacted (its gauges).
pub fn held(l: &Scrape) -> (u64, u64) {
    (l.value("muster_sm_allocations") as u64, l.value("muster_sm_compacted_allocations") as u64)
}
