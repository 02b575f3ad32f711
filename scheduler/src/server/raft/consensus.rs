//! [`Consensus`]: the handle on a replica's Raft group that every service
//! holds. Its fields are private: a service reads the applied state,
//! proposes, asks for a linearizable read or for the time through its
//! methods, and never reaches another service's state.

use muster_clock::SharedClock;
use muster_proto::v1;
use muster_raft_store::AppReader;
use openraft::ServerState;
use tokio::sync::watch;
use tonic::Status;
use tonic::metadata::MetadataValue;

use super::leader_time::LeaderTime;
use super::proposer::{ProposeError, Proposer};
use super::read_index::ReadBatcher;
use crate::server::{MusterRaft, hex};
use crate::sm::State;

/// Metadata key naming the leader's replica id on a redirect.
pub const LEADER_ID_HEADER: &str = "x-muster-leader-id";
/// Metadata key naming the leader's address on a redirect.
pub const LEADER_ADDR_HEADER: &str = "x-muster-leader-addr";

/// UNAVAILABLE with the leader in metadata, for a client to retry there.
pub fn not_leader_status(leader: Option<(u64, String)>) -> Status {
    let mut status = Status::unavailable(ProposeError::NotLeader { leader: leader.clone() }.to_string());
    if let Some((id, addr)) = leader {
        let md = status.metadata_mut();
        md.insert(LEADER_ID_HEADER, MetadataValue::from(id));
        if let Ok(v) = addr.parse() {
            md.insert(LEADER_ADDR_HEADER, v);
        }
    }
    status
}

/// One replica's consensus: its identity, the Raft handle, the applied
/// state, the group-commit proposer, the clock and the replicated time, and
/// the batcher of linearizable reads. Cheap to clone.
#[derive(Clone)]
pub struct Consensus {
    id: u64,
    advertise: String,
    raft: MusterRaft,
    reader: AppReader<State>,
    proposer: Proposer,
    clock: SharedClock,
    time: LeaderTime,
    leading: watch::Receiver<bool>,
    reads: ReadBatcher,
}

/// What [`Consensus::new`] is made of (the replica assembles it).
pub struct ConsensusParts {
    /// This replica's id.
    pub id: u64,
    /// Its advertised address.
    pub advertise: String,
    /// The Raft handle.
    pub raft: MusterRaft,
    /// The applied state.
    pub reader: AppReader<State>,
    /// Group-commit proposals.
    pub proposer: Proposer,
    /// The one clock every path of this replica reads.
    pub clock: SharedClock,
    /// Replicated time as this replica stamps it while it leads.
    pub time: LeaderTime,
    /// Whether this replica leads now (one watcher of Raft's metrics feeds
    /// it, so that agent streams need not each wake on every entry).
    pub leading: watch::Receiver<bool>,
}

impl Consensus {
    /// The handle over a replica's parts.
    pub fn new(p: ConsensusParts) -> Consensus {
        Consensus {
            id: p.id,
            advertise: p.advertise,
            raft: p.raft,
            reader: p.reader,
            proposer: p.proposer,
            clock: p.clock,
            time: p.time,
            leading: p.leading,
            reads: ReadBatcher::default(),
        }
    }

    /// This replica's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The Raft handle.
    pub fn raft(&self) -> &MusterRaft {
        &self.raft
    }

    /// The applied state.
    pub fn reader(&self) -> &AppReader<State> {
        &self.reader
    }

    /// The group-commit proposer.
    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// The clock every path of this replica reads.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// A watch of whether this replica leads (changes on leadership
    /// changes only).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Now, for any decision this replica makes: while it leads, the
    /// replicated time it stamps on entries ([`LeaderTime`]); otherwise the
    /// clock's wall time. Never behind the time of the last applied entry
    /// (so a replica whose clock lags the leader's never sees a replicated
    /// deadline as still ahead).
    pub fn now(&self, st: &State) -> u64 {
        if *self.leading.borrow() { self.time.at_least(st.now_ms()) } else { self.clock.wall_ms().max(st.now_ms()) }
    }

    /// Whether this replica leads now (a cheap local read: a check made on
    /// its state before proposing is only sound on the leader, whose
    /// applied state holds every acknowledged write).
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Waits until this replica may answer a read that must be current
    /// (with other waiting reads: [`super::read_index`]).
    pub async fn linearizable(&self) -> Result<(), Status> {
        self.reads.confirm(&self.raft).await
    }

    /// This replica's view of itself and the cluster.
    pub fn status(&self) -> v1::ReplicaStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let members: Vec<v1::Member> = membership
            .nodes()
            .map(|(id, node)| v1::Member { id: *id, address: node.addr.clone(), voter: voters.contains(id) })
            .collect();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Candidate => "candidate",
            ServerState::Follower => "follower",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        let leader_address = m
            .current_leader
            .and_then(|l| membership.nodes().find(|(id, _)| **id == l).map(|(_, n)| n.addr.clone()))
            .unwrap_or_default();
        let (applied, digest) = self.reader.applied_and_digest();
        v1::ReplicaStatus {
            id: self.id,
            address: self.advertise.clone(),
            role: role.to_string(),
            term: m.current_term,
            leader_id: m.current_leader.unwrap_or(0),
            leader_address,
            applied_index: applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            state_digest: hex(&digest),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            members,
        }
    }
}
