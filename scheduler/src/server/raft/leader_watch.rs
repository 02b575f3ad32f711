//! Noticing that the leader's process is gone, so that a follower campaigns
//! as soon as the voters' leader lease lets it win, not a whole election
//! timeout later.
//!
//! openraft 0.9 makes a voter refuse every candidate until its leader lease
//! (the election timeout's maximum) has passed since it last heard the
//! leader, and a follower campaigns on its own only after that lease *plus*
//! its randomised election timeout. A leader that crashed is therefore
//! replaced after lease + timeout. This module shortens the case where the
//! leader's process died (crashed, killed, stopped for an upgrade) and its
//! host is still up: nothing listens at its address any more.
//!
//! ```text
//!   follower                                leader
//!   Follow(follower_id) ──────────────────▶ first event: its own id
//!        ◀ ─ ─ ─ ─ ─ ─ ─ ─ the stream ends (process gone: the kernel
//!                            closes its sockets)
//!   dial the leader's address ───────────▶ refused: nothing listens
//!   wait lease + margin + rank × stagger,
//!   still following the gone leader?
//!   raft.trigger().elect()
//! ```
//!
//! The follower with the lowest id campaigns first; each next one waits a
//! stagger longer, so that two candidates do not split the vote, and takes
//! over only if no leader has appeared by then. A leader that is alive but
//! unreachable (a partition, a paused process, a lost host) neither closes
//! the stream nor refuses the dial: that case is left to openraft's timer.
//! Starting an election is always safe in Raft; the dial only keeps a
//! follower from disturbing a leader that still runs.
//!
//! The same task publishes which leader it saw go, so that a follower
//! answering an agent during the election can wait for the successor
//! instead of naming the dead leader (see [`successor_hint`]).

use std::collections::BTreeSet;
use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::raft_service_client::RaftServiceClient;
use openraft::ServerState;
use tokio::sync::watch;

use super::network::Network;
use crate::server::MusterRaft;

/// How long after the lease a follower campaigns: the voters' clocks read
/// the lease from their own last heartbeat, which came before the leader
/// died, so the lease has passed for all of them by then.
const LEASE_MARGIN: Duration = Duration::from_millis(20);

/// How long the dial of a silent leader may take before the follower treats
/// it as alive (a partition drops packets instead of refusing them).
const DIAL_TIMEOUT: Duration = Duration::from_millis(300);

/// Raft timing the watch derives its waits from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchTiming {
    /// The voters' leader lease (openraft 0.9: the election timeout's maximum).
    pub lease: Duration,
    /// How much longer each next follower in id order waits.
    pub stagger: Duration,
    /// The pause before a stream that failed is opened again.
    pub retry: Duration,
}

impl WatchTiming {
    /// The waits for a heartbeat of `heartbeat_ms` and an election timeout
    /// of `(min, max)` ms.
    pub fn new(heartbeat_ms: u64, election_timeout_ms: (u64, u64)) -> WatchTiming {
        WatchTiming {
            lease: Duration::from_millis(election_timeout_ms.1),
            stagger: Duration::from_millis(election_timeout_ms.0 / 2),
            retry: Duration::from_millis(heartbeat_ms),
        }
    }
}

/// How long `me` waits, after seeing leader `gone` leave, before it
/// campaigns; `None` when it is not a voter (or is the gone leader itself).
/// Followers campaign in id order, a stagger apart.
pub fn campaign_delay(me: u64, gone: u64, voters: &BTreeSet<u64>, timing: WatchTiming) -> Option<Duration> {
    if me == gone || !voters.contains(&me) {
        return None;
    }
    let rank = voters.iter().filter(|v| **v != gone).position(|v| *v == me)?;
    Some(timing.lease + LEASE_MARGIN + timing.stagger * rank as u32)
}

/// The leader this replica follows now, with its address and the voters;
/// `None` while it leads, campaigns, or knows no leader.
fn followed(raft: &MusterRaft, me: u64) -> Option<(u64, String, BTreeSet<u64>)> {
    let m = raft.metrics().borrow().clone();
    let leader = m.current_leader.filter(|l| *l != me)?;
    if m.state != ServerState::Follower {
        return None;
    }
    let membership = m.membership_config.membership();
    let addr = membership.get_node(&leader)?.addr.clone();
    Some((leader, addr, membership.voter_ids().collect()))
}

/// How long apart [`refuses`] dials an address that accepted.
const PROBE_GAP: Duration = Duration::from_millis(10);

/// Whether nothing listens at `addr`: a dial refused at once, within
/// `window`. A killed process's connections can break a moment before the
/// kernel closes its listening socket, and a dial in between is accepted
/// or reset; so such a dial is tried again, `PROBE_GAP` apart, until
/// `window` ends. A dial with no answer (a partition, a lost host) means
/// the leader may still be alive: openraft's timer handles that case.
async fn refuses(addr: &str, window: Duration) -> bool {
    let until = tokio::time::Instant::now() + window;
    loop {
        match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            Err(_) => return false,
            Ok(_) => {}
        }
        if tokio::time::Instant::now() + PROBE_GAP >= until {
            return false;
        }
        tokio::time::sleep(PROBE_GAP).await;
    }
}

/// Follows each leader this replica learns of until `stop` turns true;
/// publishes a leader whose process it saw go in `gone`.
pub async fn run(
    raft: MusterRaft,
    me: u64,
    network: Network,
    timing: WatchTiming,
    gone: watch::Sender<Option<u64>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    loop {
        if *stop.borrow() {
            return;
        }
        let Some((leader, addr, voters)) = followed(&raft, me) else {
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        };
        gone.send_if_modified(|g| {
            let stale = g.is_some_and(|g| g != leader);
            if stale {
                *g = None;
            }
            stale
        });
        // Hold the stream until it ends, the leader changes, or we stop.
        let ended = tokio::select! {
            ended = hold(&network, &addr, me, leader) => ended,
            _ = leader_changes(&raft, me, leader) => continue,
            _ = stop.wait_for(|s| *s) => return,
        };
        if followed(&raft, me).is_some_and(|(l, ..)| l == leader) && refuses(&addr, timing.retry).await {
            tracing::warn!(leader, addr = %addr, why = %ended, "the leader's process is gone: nothing listens at its address");
            metrics::counter!("muster_raft_leader_gone_total").increment(1);
            gone.send_replace(Some(leader));
            if let Some(delay) = campaign_delay(me, leader, &voters, timing) {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = leader_changes(&raft, me, leader) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
                if followed(&raft, me).is_some_and(|(l, ..)| l == leader) {
                    tracing::info!(gone = leader, "campaigning for the gone leader's place");
                    metrics::counter!("muster_raft_fast_elections_total").increment(1);
                    if raft.trigger().elect().await.is_err() {
                        return;
                    }
                }
            }
            // Wait for whatever comes next (a successor, or the same leader
            // back after a restart).
            tokio::select! {
                _ = leader_changes(&raft, me, leader) => {}
                _ = tokio::time::sleep(timing.lease * 4) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        // The stream ended but the leader still listens (it restarted, shut
        // a connection, or refused the call): open it again shortly.
        tracing::debug!(leader, why = %ended, "the follow stream ended; the leader still listens");
        tokio::select! {
            _ = tokio::time::sleep(timing.retry) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Resolves when this replica no longer follows `leader`.
async fn leader_changes(raft: &MusterRaft, me: u64, leader: u64) {
    let mut metrics = raft.metrics();
    loop {
        if followed(raft, me).is_none_or(|(l, ..)| l != leader) {
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Opens a `Follow` stream to `addr` and waits for it to end; returns why.
async fn hold(network: &Network, addr: &str, me: u64, leader: u64) -> String {
    let channel = match network.channel(addr) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let mut client = RaftServiceClient::new(channel);
    let mut events = match client.follow(v1::FollowRequest { follower_id: me }).await {
        Ok(r) => r.into_inner(),
        Err(status) => return format!("the call failed: {}", status.message()),
    };
    loop {
        match events.message().await {
            Ok(Some(e)) if e.replica_id != leader => {
                return format!("replica {} answers at the leader's address", e.replica_id);
            }
            Ok(Some(_)) => {}
            Ok(None) => return "the stream ended".into(),
            Err(status) => return format!("the stream broke: {}", status.message()),
        }
    }
}

/// What a follower tells an agent about the leader to go to (the agent hub
/// holds it; nothing else needs it).
#[derive(Clone)]
pub struct SuccessorHint {
    raft: MusterRaft,
    gone: watch::Receiver<Option<u64>>,
    wait: Duration,
}

impl SuccessorHint {
    /// Over `raft`, told by [`run`] which leader was seen to go; waits up
    /// to `wait` for a successor.
    pub fn new(raft: MusterRaft, gone: watch::Receiver<Option<u64>>, wait: Duration) -> SuccessorHint {
        SuccessorHint { raft, gone, wait }
    }

    /// The leader a follower should name to an agent or client: the one it
    /// follows, unless its process was seen to go, in which case this
    /// waits (up to its `wait`) for a successor. `None` when none is known
    /// in time.
    pub async fn get(&self) -> Option<(u64, String)> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let hint = {
                let m = metrics.borrow_and_update();
                let dead = *self.gone.borrow();
                m.current_leader
                    .filter(|l| Some(*l) != dead)
                    .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| (l, n.addr.clone())))
            };
            if hint.is_some() {
                return hint;
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> WatchTiming {
        WatchTiming::new(100, (400, 500))
    }

    #[test]
    fn followers_campaign_in_id_order_a_stagger_apart_after_the_lease() {
        let voters: BTreeSet<u64> = [1, 2, 3].into();
        let t = timing();
        assert_eq!(t.lease, Duration::from_millis(500));
        assert_eq!(campaign_delay(2, 1, &voters, t), Some(Duration::from_millis(520)));
        assert_eq!(campaign_delay(3, 1, &voters, t), Some(Duration::from_millis(720)));
        assert_eq!(campaign_delay(1, 2, &voters, t), Some(Duration::from_millis(520)));
        assert_eq!(campaign_delay(3, 2, &voters, t), Some(Duration::from_millis(720)));
    }

    #[test]
    fn the_gone_leader_and_non_voters_never_campaign() {
        let voters: BTreeSet<u64> = [1, 2, 3].into();
        assert_eq!(campaign_delay(1, 1, &voters, timing()), None);
        assert_eq!(campaign_delay(4, 1, &voters, timing()), None, "a learner");
    }

    #[test]
    fn five_voters_rank_four_followers() {
        let voters: BTreeSet<u64> = [1, 2, 3, 4, 5].into();
        let t = timing();
        let delays: Vec<_> = [1, 2, 4, 5].iter().map(|me| campaign_delay(*me, 3, &voters, t).unwrap()).collect();
        assert!(delays.windows(2).all(|w| w[1] - w[0] == t.stagger), "{delays:?}");
        assert!(delays[0] > t.lease, "nobody campaigns inside the lease");
    }

    #[tokio::test]
    async fn a_refused_dial_means_nothing_listens_and_a_listener_means_alive() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        assert!(!refuses(&addr, Duration::from_millis(50)).await, "a listener accepts");
        drop(l);
        assert!(refuses(&addr, Duration::ZERO).await, "nothing listens after it closes");
    }

    /// The leader's connections broke, but its dying process still holds
    /// the listening socket for a moment: the first dial is accepted, and
    /// the next one, after the socket closed, is refused. One accepted dial
    /// alone does not make the leader alive.
    #[tokio::test]
    async fn a_listener_that_closes_while_probed_is_found_gone() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let closing = tokio::spawn(async move {
            let _ = l.accept().await;
            drop(l);
        });
        assert!(refuses(&addr, Duration::from_secs(30)).await, "found gone once the listener closed");
        closing.await.unwrap();
    }
}
