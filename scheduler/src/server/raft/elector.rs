//! Elections with a pre-vote: a replica campaigns only when a quorum of
//! voters says it has not heard from a leader either.
//!
//! openraft 0.9 has no pre-vote. A follower that was cut off or paused
//! (SIGSTOP, a frozen VM, a long GC-like stall) campaigns the moment it
//! runs again: its timer expired while it was away. Its vote request is
//! refused (the others still hear their leader), but it now holds a higher
//! term, answers the leader's next append with it, and the leader steps
//! down: an election the cluster did not need, and a pause in every write.
//! (Measured before this module: a follower paused for 15 s and resumed
//! moved the term from 1 to 2 and changed the leader, every time.)
//!
//! So openraft's own timer is off (`enable_elect: false`) and this task
//! decides:
//!
//! ```text
//!   every tick:  leader, or not a voter ──▶ nothing (and, if it knows a
//!                    membership, it counts as having heard a leader: no
//!                    pre-vote from it within a lease; one that knows none
//!                    has heard from nobody, and grants)
//!                silent < lease + a randomised election timeout ──▶ nothing
//!                    (silent: since this replica last took an append from a leader)
//!                PreVote to every other voter ──▶ granted by a quorum (self included)?
//!                    yes ──▶ raft.trigger().elect()
//!                    no  ──▶ wait another timeout (a leader is alive: its appends
//!                            will reach this replica, which catches up)
//!   PreVote at a voter: granted iff it does not lead, has taken no append
//!   from a leader for the lease (openraft's own voter rule, asked
//!   beforehand), and its log is not further along than the candidate's
//!   (Raft's up-to-date rule: a follower resumed far behind cannot win, so
//!   it does not campaign while it catches up)
//! ```
//!
//! A pre-vote changes no state anywhere, so it can never split a vote or
//! raise a term. The real vote that follows is openraft's, with its checks
//! (terms, logs, the voters' lease). The leader watch (`leader_watch.rs`)
//! still campaigns at once when the leader's process is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_clock::SharedClock;
use muster_proto::v1;
use muster_proto::v1::raft_service_client::RaftServiceClient;
use openraft::ServerState;
use tokio::sync::watch;

use super::network::Network;
use crate::server::MusterRaft;

/// When this replica last took an append (or a snapshot chunk) from a
/// leader, on the replica's monotonic clock (ms). The Raft server updates
/// it; the elector and the pre-vote answer read it.
#[derive(Clone, Debug)]
pub struct LastHeard {
    ms: Arc<AtomicU64>,
    clock: SharedClock,
}

impl LastHeard {
    /// Starts as "just heard": nobody campaigns within a timeout of start.
    pub fn new(clock: SharedClock) -> LastHeard {
        LastHeard { ms: Arc::new(AtomicU64::new(clock.mono_ms())), clock }
    }

    /// A leader was heard from now.
    pub fn heard(&self) {
        self.ms.fetch_max(self.clock.mono_ms(), Ordering::Relaxed);
    }

    /// How long since a leader was heard from.
    pub fn silent(&self) -> Duration {
        Duration::from_millis(self.clock.mono_ms().saturating_sub(self.ms.load(Ordering::Relaxed)))
    }
}

/// The elector's timing, from the Raft configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    /// The voters' lease (openraft's: the election timeout's maximum): a
    /// voter grants nothing within it of hearing a leader.
    pub lease: Duration,
    /// The randomised election timeout's bounds, after the lease.
    pub timeout: (Duration, Duration),
    /// How often the elector looks.
    pub tick: Duration,
}

impl ElectionTiming {
    /// The timing of a heartbeat of `heartbeat_ms` and an election timeout
    /// of `(min, max)` ms.
    pub fn new(heartbeat_ms: u64, election_timeout_ms: (u64, u64)) -> ElectionTiming {
        ElectionTiming {
            lease: Duration::from_millis(election_timeout_ms.1),
            timeout: (Duration::from_millis(election_timeout_ms.0), Duration::from_millis(election_timeout_ms.1)),
            tick: Duration::from_millis((heartbeat_ms / 2).clamp(10, 100)),
        }
    }
}

/// A log's last entry: (term, index); (0, 0) for an empty log.
pub type LastLog = (u64, u64);

/// Reads this replica's last log entry.
pub type LastLogReader = Arc<dyn Fn() -> LastLog + Send + Sync>;

/// A voter's answer to a pre-vote: grant unless it leads, heard a leader
/// within the lease, or its own log (`mine`) is further along than the
/// candidate's (`theirs`), compared by term, then index.
pub fn pre_vote_answer(
    leads: bool,
    silent: Duration,
    lease: Duration,
    mine: LastLog,
    theirs: LastLog,
) -> (bool, String) {
    if leads {
        return (false, "it leads".into());
    }
    if silent < lease {
        return (false, format!("it heard a leader {} ms ago", silent.as_millis()));
    }
    if theirs < mine {
        return (false, format!("its log (term {}, index {}) is further along", mine.0, mine.1));
    }
    (true, String::new())
}

/// A per-replica pseudo-random sequence for the election timeout (seeded by
/// the replica's id: replays the same).
struct Jitter(u64);

impl Jitter {
    fn next(&mut self, lo: Duration, hi: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(if span == 0 { 0 } else { self.0 % (span + 1) })
    }
}

/// Runs the elector for replica `me` until `stop` turns true.
pub async fn run(
    raft: MusterRaft,
    me: u64,
    network: Network,
    heard: LastHeard,
    last_log: LastLogReader,
    timing: ElectionTiming,
    mut stop: watch::Receiver<bool>,
) {
    let mut jitter = Jitter(0x9E37_79B9_7F4A_7C15 ^ me.wrapping_mul(0x100_0000_01B3));
    let mut wait = timing.lease + jitter.next(timing.timeout.0, timing.timeout.1);
    let mut tick = tokio::time::interval(timing.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        let voters: Vec<u64> = membership.voter_ids().collect();
        if m.state == ServerState::Leader || m.state == ServerState::Shutdown || !voters.contains(&me) {
            // A leader, or a learner or removed voter (which knows a
            // membership, so some leader gave it one): neither campaigns,
            // and neither grants a pre-vote within a lease of now. A
            // replica that knows no membership yet has heard from no leader:
            // its silence runs on, so that it grants the bootstrapping
            // replica's pre-vote when that replica's first campaign failed
            // (else nobody could ever lead).
            if !voters.is_empty() {
                heard.heard();
            }
            continue;
        }
        if heard.silent() < wait {
            continue;
        }
        let mut granted = vec![me];
        let mut refusals = Vec::new();
        let mine = last_log();
        for &peer in voters.iter().filter(|&&v| v != me) {
            let Some(addr) = membership.get_node(&peer).map(|n| n.addr.clone()) else { continue };
            match ask(&network, &addr, me, mine, peer, timing.lease).await {
                Ok((true, _)) => granted.push(peer),
                Ok((false, why)) => refusals.push(format!("replica {peer}: {why}")),
                Err(e) => refusals.push(format!("replica {peer}: {e}")),
            }
        }
        if granted.len() * 2 > voters.len() {
            tracing::info!(
                silent_ms = heard.silent().as_millis() as u64,
                granted = ?granted,
                refusals = ?refusals,
                voters = voters.len(),
                "no leader heard from; a quorum agrees: campaigning"
            );
            metrics::counter!("muster_raft_elections_started_total").increment(1);
            if raft.trigger().elect().await.is_err() {
                return;
            }
            // If this campaign does not win (another replica campaigned in
            // the same term and the votes split), the next one waits over a
            // range three times as wide: two replicas that timed out
            // together, with only the election timeout's spread between
            // them, would otherwise split again and again under load.
            heard.heard();
            wait = timing.lease + jitter.next(timing.timeout.0, timing.timeout.1 * 3);
            continue;
        }
        tracing::debug!(refusals = ?refusals, "pre-vote refused: a leader is alive; not campaigning");
        metrics::counter!("muster_raft_pre_votes_refused_total").increment(1);
        // A fresh timeout before the next look: a leader's appends take
        // that long to come.
        heard.heard();
        wait = timing.lease + jitter.next(timing.timeout.0, timing.timeout.1);
    }
}

/// Asks `peer` at `addr` for its pre-vote.
async fn ask(
    network: &Network,
    addr: &str,
    me: u64,
    mine: LastLog,
    peer: u64,
    deadline: Duration,
) -> Result<(bool, String), String> {
    let channel = network.channel(addr)?;
    let mut client = RaftServiceClient::new(channel);
    let mut req =
        tonic::Request::new(v1::PreVoteRequest { candidate: me, last_log_term: mine.0, last_log_index: mine.1 });
    req.set_timeout(deadline);
    if let Ok(v) = peer.to_string().parse() {
        req.metadata_mut().insert("x-muster-raft-to", v);
    }
    match tokio::time::timeout(deadline, client.pre_vote(req)).await {
        Ok(Ok(r)) => {
            let r = r.into_inner();
            Ok((r.granted, r.reason))
        }
        Ok(Err(status)) => Err(status.message().to_string()),
        Err(_) => Err("no answer in time".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_clock::ManualClock;

    #[test]
    fn a_voter_grants_only_when_it_heard_no_leader_for_the_lease_and_is_not_further_along() {
        let lease = Duration::from_millis(500);
        let log = (3, 100);
        assert!(!pre_vote_answer(true, Duration::from_secs(9), lease, log, log).0, "a leader never grants");
        let (granted, why) = pre_vote_answer(false, Duration::from_millis(120), lease, log, log);
        assert!(!granted && why.contains("120 ms ago"), "{why}");
        assert!(pre_vote_answer(false, lease, lease, log, log).0);
        // A candidate resumed far behind cannot win: refused.
        let (granted, why) = pre_vote_answer(false, lease, lease, (3, 612), (1, 90));
        assert!(!granted && why.contains("further along"), "{why}");
        // A newer term wins over a longer log, as in Raft's vote.
        assert!(pre_vote_answer(false, lease, lease, (3, 612), (4, 500)).0);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_counts_from_the_last_leader_heard() {
        let clock = ManualClock::new(0);
        let heard = LastHeard::new(SharedClock::new(clock.clone()));
        clock.advance(700);
        assert_eq!(heard.silent(), Duration::from_millis(700));
        heard.heard();
        assert_eq!(heard.silent(), Duration::ZERO);
        clock.advance(30);
        assert_eq!(heard.silent(), Duration::from_millis(30));
    }

    #[test]
    fn the_timeout_is_drawn_within_its_bounds() {
        let mut j = Jitter(42);
        let (lo, hi) = (Duration::from_millis(400), Duration::from_millis(500));
        let draws: Vec<Duration> = (0..200).map(|_| j.next(lo, hi)).collect();
        assert!(draws.iter().all(|d| *d >= lo && *d <= hi));
        assert!(draws.iter().any(|d| *d != draws[0]), "randomised");
    }
}
