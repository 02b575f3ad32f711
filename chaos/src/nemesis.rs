//! The nemesis: one fault at a time, chosen and timed by the seed, each
//! healed before the next.
//!
//! | fault | what it does |
//! |---|---|
//! | `kill-leader` | `kill -9` the leader; restart it 1–3 s later |
//! | `power-loss-replica` | `kill -9` a replica and drop every write it had not fsynced (the crash image); restart it 1–3 s later |
//! | `power-loss-all` | the same to all three replicas at once (a whole-cluster outage) |
//! | `pause-leader` | SIGSTOP the leader past the election timeout (2–4 s), then SIGCONT: a deposed leader wakes up |
//! | `partition-leader` | cut the leader off from everyone, both ways, for 2–5 s |
//! | `partition-follower` | cut a follower off for 2–5 s |
//! | `slow-network` | every link: 75 ms ± 50 ms, half the chunks held as if lost, for 3–5 s |
//! | `lagging-follower` | cut a follower off until the leader has snapshotted and purged the log past it (at most 20 s), then heal: it must catch up by snapshot |
//! | `kill-agent` | `kill -9` an agent; restart it 1–3 s later (its tasks are killed by the new agent and re-placed) |
//! | `pause-agent` | SIGSTOP an agent for 1–3 s (less than the 8 s it takes to be flagged dead) |
//! | `restart-agent` | stop the busiest agent run with `--keep-tasks` (SIGTERM: it exits, its tasks run on), start it again 1–3 s later: it adopts what still runs and reports what ended meanwhile |
//! | `disk-eio` | a replica's `fdatasync`s fail with EIO for 2–4 s; it must stop (status 75) without acknowledging what it did not persist; then its machine is power-cycled and it restarts on what its disk kept |
//! | `disk-full` | a replica's log writes fail with ENOSPC, half written, for 2–4 s; it must stop (status 75) and restart cleanly |
//! | `partition-agent` | cut an agent off from every replica: the first time (and every other time) until the leader has marked the node lost and placed its tasks elsewhere, plus 2–4 s; otherwise for 5–7 s (past the agent's fence at half the 8 s node-lost window, short of the window); no task may run twice |
//! | `slow-disk` | a replica's `fdatasync`s take 200–600 ms longer for 3–5 s; it keeps serving, slowly |
//! | `stall-leader-disk` | the leader's syncs all wait for 1–3 s: it has sent its newest entries to its followers but cannot count itself, answer or heartbeat; a successor may commit them, and it steps down when its flush completes |
//! | `agent-disk-full` | the busiest agent's disk fills for 3–5 s, and on until a start has met it (at most 10 s) (its writes that need new space fail with ENOSPC: new attempts cannot be recorded, so they are refused); then it dies (`kill -9`), its disk gets room, and it restarts 1–2 s later: what it started must still be found |
//! | `clock-jump-forward` | the leader's wall clock jumps 5 s – 2 min ahead for 3–6 s, then back |
//! | `clock-jump-back` | the leader's wall clock jumps 5 s – 2 min back for 3–6 s, then forward again |
//! | `grow-cluster` | two fresh replicas (new ids, empty data dirs) join as learners and are promoted: 3 voters become 5 (at 5, it shrinks instead) |
//! | `shrink-cluster` | two voters, the leader one of them half the time, are removed, stopped and retired: 5 become 3 (at 3, it grows instead) |
//! | `replace-replica` | a voter, the leader half the time, is replaced by a fresh replica with a new id (see `membership.rs`) |
//! | `partition-gang` | cut the busiest agent's node off from every other node's ranks (the gang fabric, not the control plane) for 3–6 s: ranks that lose their master give up after 2 s and exit 1, while the master waits, blocked as in a collective, until the leader tears the gang down |
//! | `clock-skew` | a follower's clock runs 2–8 % fast or slow for 4–8 s; then the leader is killed (and restarted 1–2 s later), so the skewed replica may lead on its skewed clock; it is put right 1–2 s later |

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client;
use super::fabric::Fabric;
use super::membership::{self, Change};
use super::procs::Procs;
use super::proxy::{Proxy, Slowness};
use super::workload::now_ms;
use muster_proto::v1;
use muster_raft_store::DiskFault;
use muster_sim::SimRng;

/// One fault injected.
#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    /// Its kind (the table above).
    pub kind: &'static str,
    /// Replica id or agent node id.
    pub target: String,
    /// Wall-clock ms.
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// Anything worth knowing (e.g. how far behind a lagging follower was).
    pub note: String,
    /// The largest shift of a replica's wall clock it made, ms (ahead when
    /// positive); 0 for every other kind.
    pub clock_ms: i64,
}

/// A kind of fault the nemesis injects (`--faults` names them; the table
/// at the top of this file says what each does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// `kill-leader`
    KillLeader,
    /// `power-loss-replica`
    PowerLossReplica,
    /// `power-loss-all`
    PowerLossAll,
    /// `pause-leader`
    PauseLeader,
    /// `partition-leader`
    PartitionLeader,
    /// `partition-follower`
    PartitionFollower,
    /// `slow-network`
    SlowNetwork,
    /// `lagging-follower`
    LaggingFollower,
    /// `kill-agent`
    KillAgent,
    /// `pause-agent`
    PauseAgent,
    /// `disk-eio`
    DiskEio,
    /// `disk-full`
    DiskFull,
    /// `slow-disk`
    SlowDisk,
    /// `stall-leader-disk`
    StallLeaderDisk,
    /// `partition-agent`
    PartitionAgent,
    /// `restart-agent`
    RestartAgent,
    /// `agent-disk-full`
    AgentDiskFull,
    /// `clock-jump-forward`
    ClockJumpForward,
    /// `clock-jump-back`
    ClockJumpBack,
    /// `clock-skew`
    ClockSkew,
    /// `grow-cluster`
    GrowCluster,
    /// `shrink-cluster`
    ShrinkCluster,
    /// `replace-replica`
    ReplaceReplica,
    /// `partition-gang`
    PartitionGang,
}

impl FaultKind {
    /// The kind's name, as `--faults` and the report write it.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::PowerLossReplica => "power-loss-replica",
            FaultKind::PowerLossAll => "power-loss-all",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionFollower => "partition-follower",
            FaultKind::SlowNetwork => "slow-network",
            FaultKind::LaggingFollower => "lagging-follower",
            FaultKind::KillAgent => "kill-agent",
            FaultKind::PauseAgent => "pause-agent",
            FaultKind::DiskEio => "disk-eio",
            FaultKind::DiskFull => "disk-full",
            FaultKind::SlowDisk => "slow-disk",
            FaultKind::StallLeaderDisk => "stall-leader-disk",
            FaultKind::PartitionAgent => "partition-agent",
            FaultKind::RestartAgent => "restart-agent",
            FaultKind::AgentDiskFull => "agent-disk-full",
            FaultKind::ClockJumpForward => "clock-jump-forward",
            FaultKind::ClockJumpBack => "clock-jump-back",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::GrowCluster => "grow-cluster",
            FaultKind::ShrinkCluster => "shrink-cluster",
            FaultKind::ReplaceReplica => "replace-replica",
            FaultKind::PartitionGang => "partition-gang",
        }
    }

    /// The kind named `name`, if there is one.
    pub fn parse(name: &str) -> Option<FaultKind> {
        KINDS.iter().map(|&(_, k)| k).find(|k| k.name() == name)
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every fault and its weight in the schedule (the order and weights fix
/// what a seed draws: keep them).
pub const KINDS: &[(u32, FaultKind)] = &[
    (3, FaultKind::KillLeader),
    (1, FaultKind::PowerLossReplica),
    (1, FaultKind::PowerLossAll),
    (2, FaultKind::PauseLeader),
    (2, FaultKind::PartitionLeader),
    (1, FaultKind::PartitionFollower),
    (2, FaultKind::SlowNetwork),
    (1, FaultKind::LaggingFollower),
    (2, FaultKind::KillAgent),
    (1, FaultKind::PauseAgent),
    (1, FaultKind::DiskEio),
    (1, FaultKind::DiskFull),
    (1, FaultKind::SlowDisk),
    (1, FaultKind::StallLeaderDisk),
    (2, FaultKind::PartitionAgent),
    (1, FaultKind::RestartAgent),
    (1, FaultKind::AgentDiskFull),
    (1, FaultKind::ClockJumpForward),
    (1, FaultKind::ClockJumpBack),
    (1, FaultKind::ClockSkew),
    (1, FaultKind::GrowCluster),
    (1, FaultKind::ShrinkCluster),
    (1, FaultKind::ReplaceReplica),
    (2, FaultKind::PartitionGang),
];

/// The status `muster server` exits with when its storage failed.
const EXIT_STORAGE_FAILED: i32 = 75;

/// Tells every proxy which processes are replicas and agents (after any
/// restart), so that their connections can be told apart and cut.
pub fn refresh_known(procs: &Procs, proxies: &[Proxy]) {
    let pids: Vec<u32> = procs.server_pids().into_iter().map(|(_, p)| p).chain(procs.agent_pids()).collect();
    for p in proxies {
        p.set_known(pids.clone());
    }
}

/// The index of the agent that runs the most attempts now, by the journal
/// (an attempt that has started and not ended); `None` when none runs.
fn busiest(journal: &std::path::Path, agents: &[String]) -> Option<usize> {
    let text = std::fs::read_to_string(journal).ok()?;
    let mut running: std::collections::BTreeMap<(String, String, String), String> = Default::default();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [kind, alloc, task, attempt, _epoch, node, _ms] = w.as_slice() {
            let key = (alloc.to_string(), task.to_string(), attempt.to_string());
            match *kind {
                "end" | "lost" => {
                    running.remove(&key);
                }
                _ => {
                    running.insert(key, node.to_string());
                }
            }
        }
    }
    let count = |id: &String| running.values().filter(|n| *n == id).count();
    let (i, most) =
        agents.iter().enumerate().map(|(i, id)| (i, count(id))).max_by_key(|&(i, n)| (n, usize::MAX - i))?;
    (most > 0).then_some(i)
}

/// How many ranks gave up on their peers (journalled `lost`) since `since_ms`.
fn ranks_lost_since(journal: &std::path::Path, since_ms: u64) -> usize {
    let text = std::fs::read_to_string(journal).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("lost "))
        .filter(|l| l.rsplit(' ').next().and_then(|ms| ms.parse::<u64>().ok()).is_some_and(|ms| ms >= since_ms))
        .count()
}

/// Waits up to 10 s (not past `until`) for an agent that runs anything,
/// and returns the busiest one's index (any agent when none runs).
async fn busiest_or_any(procs: &Procs, rng: &mut SimRng, until: Instant) -> usize {
    let mut busy = busiest(&procs.journal(), procs.agent_ids());
    let wait_for_work = Instant::now() + Duration::from_secs(10);
    while busy.is_none() && Instant::now() < wait_for_work.min(until) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        busy = busiest(&procs.journal(), procs.agent_ids());
    }
    busy.unwrap_or_else(|| rng.range(0, procs.agent_ids().len() as u64 - 1) as usize)
}

/// Cuts replica `id` off both ways: nobody reaches it through its proxy,
/// and its own connections to the others are refused by theirs.
fn partition(procs: &Procs, proxies: &[Proxy], id: u64) {
    let pid = procs.server_pids().into_iter().find(|&(i, _)| i == id).map(|(_, p)| p);
    let machine = procs.machine(id);
    for (i, p) in proxies.iter().enumerate() {
        if i == machine {
            p.set_isolated(true);
        } else {
            p.set_blocked(pid.into_iter().collect());
        }
    }
}

/// Heals every partition and slow link.
pub fn heal_network(proxies: &[Proxy]) {
    for p in proxies {
        p.set_isolated(false);
        p.set_blocked(BTreeSet::new());
        p.set_slow(None);
    }
}

/// How long a fault that needs the leader waits for one.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// What is recorded when a fault that needs the leader finds none.
fn no_leader(start_ms: u64) -> Fault {
    Fault {
        kind: "no-leader",
        target: String::new(),
        start_ms,
        end_ms: now_ms(),
        note: format!("no leader for {} s", LEADER_WAIT.as_secs()),
        clock_ms: 0,
    }
}

/// A member other than `id`, at random.
fn other_than(procs: &Procs, id: u64, rng: &mut SimRng) -> u64 {
    let others: Vec<u64> = procs.members().into_iter().filter(|&m| m != id).collect();
    others[rng.range(0, others.len() as u64 - 1) as usize]
}

/// Any member, at random.
fn any_member(procs: &Procs, rng: &mut SimRng) -> u64 {
    let members = procs.members();
    members[rng.range(0, members.len() as u64 - 1) as usize]
}

/// The member that says it leads with the highest term (an id the harness
/// did not make is no member: it is ignored).
pub(super) async fn leader_of(procs: &Procs) -> Option<u64> {
    let (id, _) = client::leader_at(&procs.member_addrs()).await?;
    procs.members().contains(&id).then_some(id)
}

async fn leader_or_wait(procs: &Procs, until: Instant) -> Option<u64> {
    while Instant::now() < until {
        if let Some(l) = leader_of(procs).await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// The leader, and the replica a leader fault of `kind` hits: a follower
/// for the follower kinds, else the leader; `None` when no leader shows up
/// within [`LEADER_WAIT`].
async fn leader_target(procs: &Procs, kind: FaultKind, rng: &mut SimRng) -> Option<(u64, u64)> {
    let leader = leader_or_wait(procs, Instant::now() + LEADER_WAIT).await?;
    let follower = matches!(kind, FaultKind::PartitionFollower | FaultKind::LaggingFollower);
    Some((leader, if follower { other_than(procs, leader, rng) } else { leader }))
}

/// Injects faults of the given kinds until `until`; every fault is healed
/// before it returns.
pub async fn run(
    procs: &mut Procs,
    proxies: &[Proxy],
    fabric: &Fabric,
    kinds: &[(u32, FaultKind)],
    seed: u64,
    until: Instant,
) -> Vec<Fault> {
    let mut rng = SimRng::new(seed ^ 0x0BAD_F00D);
    let mut faults = Vec::new();
    let agents = procs.agent_ids().len();
    let mut agent_partitions = 0u32;
    // Let the cluster settle and the workload start.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while Instant::now() + Duration::from_secs(3) < until {
        let mut kind = rng.weighted(kinds);
        let hold = |rng: &mut SimRng, lo: u64, hi: u64| Duration::from_millis(rng.range(lo, hi));
        let start_ms = now_ms();
        let mut clock_ms = 0i64;
        let (target, note) = match kind {
            FaultKind::KillLeader => {
                let Some((_, target)) = leader_target(procs, kind, &mut rng).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let note = {
                    procs.kill_server(target);
                    tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                    let note = procs.spawn_server(target).err().map(|e| format!("restart failed: {e}"));
                    refresh_known(procs, proxies);
                    note.unwrap_or_default()
                };
                (format!("replica {target}"), note)
            }
            FaultKind::PauseLeader => {
                let Some((_, target)) = leader_target(procs, kind, &mut rng).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let note = {
                    procs.pause_server(target, true);
                    tokio::time::sleep(hold(&mut rng, 2_000, 4_000)).await;
                    procs.pause_server(target, false);
                    String::new()
                };
                (format!("replica {target}"), note)
            }
            FaultKind::StallLeaderDisk => {
                let Some((_, target)) = leader_target(procs, kind, &mut rng).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let note = {
                    // Every sync waits until the disk comes back: the
                    // leader has sent its newest entries to its followers
                    // but cannot count itself, nor answer or heartbeat.
                    let held = hold(&mut rng, 1_000, 3_000);
                    let mut notes: Vec<String> =
                        procs.set_disk_fault(target, Some(DiskFault::StalledSync)).err().into_iter().collect();
                    tokio::time::sleep(held).await;
                    notes.extend(procs.set_disk_fault(target, None).err());
                    notes.push(format!("syncs held for {:.1} s", held.as_secs_f64()));
                    notes.join("; ")
                };
                (format!("replica {target}"), note)
            }
            FaultKind::LaggingFollower => {
                let Some((leader, target)) = leader_target(procs, kind, &mut rng).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let note = {
                    partition(procs, proxies, target);
                    let behind = client::status(procs.addr(target)).await.map_or(0, |s| s.applied_index);
                    let give_up = Instant::now() + Duration::from_secs(20);
                    let mut purged = false;
                    while Instant::now() < give_up && Instant::now() < until {
                        let snap = client::status(procs.addr(leader)).await.map_or(0, |s| s.snapshot_index);
                        if snap > behind + 30 {
                            purged = true;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    heal_network(proxies);
                    format!("applied {behind} when cut off; leader snapshotted past it: {purged}")
                };
                (format!("replica {target}"), note)
            }
            FaultKind::PartitionLeader | FaultKind::PartitionFollower => {
                let Some((_, target)) = leader_target(procs, kind, &mut rng).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let note = {
                    partition(procs, proxies, target);
                    tokio::time::sleep(hold(&mut rng, 2_000, 5_000)).await;
                    heal_network(proxies);
                    String::new()
                };
                (format!("replica {target}"), note)
            }
            FaultKind::PowerLossReplica => {
                let target = any_member(procs, &mut rng);
                let mut note = procs.power_loss_server(target).err().unwrap_or_default();
                tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                if let Err(e) = procs.spawn_server(target) {
                    note = format!("restart failed: {e}");
                }
                refresh_known(procs, proxies);
                (format!("replica {target}"), note)
            }
            FaultKind::PowerLossAll => {
                let ids = procs.members();
                let mut notes = Vec::new();
                for &id in &ids {
                    notes.extend(procs.power_loss_server(id).err());
                }
                tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                for &id in &ids {
                    notes.extend(procs.spawn_server(id).err().map(|e| format!("restart of {id} failed: {e}")));
                }
                refresh_known(procs, proxies);
                ("all replicas".to_string(), notes.join("; "))
            }
            FaultKind::SlowNetwork => {
                let slow = Slowness { delay: Duration::from_millis(75), jitter: Duration::from_millis(50), loss: 0.5 };
                for p in proxies {
                    p.set_slow(Some(slow));
                }
                tokio::time::sleep(hold(&mut rng, 3_000, 5_000)).await;
                heal_network(proxies);
                ("all links".to_string(), "75 ms ± 50 ms, 50 % held".to_string())
            }
            FaultKind::DiskEio | FaultKind::DiskFull | FaultKind::SlowDisk => {
                let target = any_member(procs, &mut rng);
                let (fault, held) = match kind {
                    FaultKind::DiskEio => (DiskFault::SyncFails, hold(&mut rng, 2_000, 4_000)),
                    FaultKind::DiskFull => (DiskFault::Full, hold(&mut rng, 2_000, 4_000)),
                    _ => (DiskFault::SlowSync(hold(&mut rng, 200, 600)), hold(&mut rng, 3_000, 5_000)),
                };
                let per_sync = match fault {
                    DiskFault::SlowSync(d) => {
                        format!("{} ms more per sync for {:.1} s", d.as_millis(), held.as_secs_f64())
                    }
                    _ => String::new(),
                };
                let mut notes: Vec<String> = procs.set_disk_fault(target, Some(fault)).err().into_iter().collect();
                tokio::time::sleep(held).await;
                notes.extend(procs.set_disk_fault(target, None).err());
                // Whether the replica is down now (it stopped, or is stopped).
                let stopped = match procs.server_exit(target) {
                    Some(status) if status.code() == Some(EXIT_STORAGE_FAILED) => {
                        notes.push(format!("stopped with status {EXIT_STORAGE_FAILED}"));
                        true
                    }
                    Some(status) => {
                        procs.unexpected_exit(format!("replica {target} exited {status} under {kind}"));
                        true
                    }
                    None if kind == FaultKind::SlowDisk => {
                        notes.push(per_sync);
                        false
                    }
                    None => {
                        // No write met the fault, or one did and the replica
                        // carried on: restarted all the same once the disk is
                        // fixed, its log read back first.
                        notes.push("kept running; restarted".into());
                        procs.kill_server(target);
                        true
                    }
                };
                if stopped {
                    // What the replica restarts on must hold all it acknowledged.
                    procs.read_back(target);
                    if kind == FaultKind::DiskEio {
                        // A machine whose disk failed is power-cycled: the
                        // replica comes back on what its disk kept.
                        notes.extend(procs.power_loss_server(target).err());
                    }
                    notes.extend(procs.spawn_server(target).err().map(|e| format!("restart failed: {e}")));
                }
                refresh_known(procs, proxies);
                (format!("replica {target}"), notes.join("; "))
            }
            FaultKind::ClockJumpForward | FaultKind::ClockJumpBack | FaultKind::ClockSkew => {
                let Some(leader) = leader_or_wait(procs, Instant::now() + LEADER_WAIT).await else {
                    faults.push(no_leader(start_ms));
                    continue;
                };
                let mut notes = Vec::new();
                let target = if kind == FaultKind::ClockSkew {
                    let follower = other_than(procs, leader, &mut rng);
                    let fast = rng.chance(0.5);
                    let per_mille = rng.range(20, 80) as i64 * if fast { 1 } else { -1 };
                    let since = now_ms();
                    let shift = muster_clock::Shift { offset_ms: 0, drift_per_mille: per_mille, since_ms: since };
                    notes.extend(procs.set_clock(follower, Some(shift)).err());
                    tokio::time::sleep(hold(&mut rng, 4_000, 8_000)).await;
                    // The leader goes: the skewed replica may succeed it.
                    procs.kill_server(leader);
                    tokio::time::sleep(hold(&mut rng, 1_000, 2_000)).await;
                    notes.extend(procs.spawn_server(leader).err().map(|e| format!("restart of {leader} failed: {e}")));
                    refresh_known(procs, proxies);
                    tokio::time::sleep(hold(&mut rng, 1_000, 2_000)).await;
                    let successor = leader_of(procs).await;
                    clock_ms = (now_ms().saturating_sub(since) as i64 * per_mille) / 1000;
                    notes.extend(procs.set_clock(follower, None).err());
                    notes.push(format!(
                        "{:.1} % {} until {} ms {}; leader {leader} killed; {}",
                        per_mille.abs() as f64 / 10.0,
                        if fast { "fast" } else { "slow" },
                        clock_ms.abs(),
                        if fast { "ahead" } else { "behind" },
                        match successor {
                            Some(l) if l == follower => "the skewed replica led".to_string(),
                            Some(l) => format!("replica {l} led"),
                            None => "no leader yet".to_string(),
                        }
                    ));
                    follower
                } else {
                    let size = rng.range(5_000, 120_000) as i64;
                    clock_ms = if kind == FaultKind::ClockJumpForward { size } else { -size };
                    let shift = muster_clock::Shift { offset_ms: clock_ms, ..Default::default() };
                    notes.extend(procs.set_clock(leader, Some(shift)).err());
                    let held = hold(&mut rng, 3_000, 6_000);
                    tokio::time::sleep(held).await;
                    notes.extend(procs.set_clock(leader, None).err());
                    notes.push(format!("{clock_ms:+} ms for {:.1} s", held.as_secs_f64()));
                    leader
                };
                (format!("replica {target}"), notes.join("; "))
            }
            FaultKind::GrowCluster => {
                let (made, target, note) = membership::run(procs, proxies, &mut rng, Change::Grow).await;
                kind = made;
                (target, note)
            }
            FaultKind::ShrinkCluster => {
                let (made, target, note) = membership::run(procs, proxies, &mut rng, Change::Shrink).await;
                kind = made;
                (target, note)
            }
            FaultKind::ReplaceReplica => {
                let (made, target, note) = membership::run(procs, proxies, &mut rng, Change::Replace).await;
                kind = made;
                (target, note)
            }
            FaultKind::KillAgent => {
                let i = rng.range(0, agents as u64 - 1) as usize;
                procs.kill_agent(i);
                tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                let note = procs.spawn_agent(i).err().map(|e| format!("restart failed: {e}")).unwrap_or_default();
                refresh_known(procs, proxies);
                (procs.agent_ids()[i].clone(), note)
            }
            FaultKind::AgentDiskFull => {
                let i = busiest(&procs.journal(), procs.agent_ids())
                    .unwrap_or_else(|| rng.range(0, agents as u64 - 1) as usize);
                let refused = procs.agent_refused_starts(i);
                let mut notes: Vec<String> = procs.set_agent_disk_full(i, true).err().into_iter().collect();
                // 3–5 s, and on until a start has met the full disk (at
                // most 10 s in all), so that the fault bites.
                let full = Instant::now();
                tokio::time::sleep(hold(&mut rng, 3_000, 5_000)).await;
                while procs.agent_refused_starts(i) == refused && full.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let held = full.elapsed();
                procs.kill_agent(i);
                notes.extend(procs.set_agent_disk_full(i, false).err());
                tokio::time::sleep(hold(&mut rng, 1_000, 2_000)).await;
                notes.extend(procs.spawn_agent(i).err().map(|e| format!("restart failed: {e}")));
                refresh_known(procs, proxies);
                notes.insert(
                    0,
                    format!(
                        "disk full for {:.1} s ({} attempts refused), then killed and restarted",
                        held.as_secs_f64(),
                        procs.agent_refused_starts(i).saturating_sub(refused)
                    ),
                );
                (procs.agent_ids()[i].clone(), notes.join("; "))
            }
            FaultKind::RestartAgent => {
                let keepers: Vec<usize> = (0..agents).filter(|&i| procs.keeps_tasks(i)).collect();
                let drawn = match keepers.len() {
                    0 => rng.range(0, agents as u64 - 1) as usize,
                    n => keepers[rng.range(0, n as u64 - 1) as usize],
                };
                // The busiest keeper (the most attempts running, by the
                // journal): its restart has the most to adopt, so the fault
                // bites even when a loaded machine runs few tasks at once.
                // (The draw stays, so a seed draws the same schedule.)
                let ids: Vec<String> = keepers.iter().map(|&k| procs.agent_ids()[k].clone()).collect();
                let i = busiest(&procs.journal(), &ids).map_or(drawn, |k| keepers[k]);
                let exit = match procs.terminate_agent(i) {
                    Some(mut child) => {
                        let give_up = Instant::now() + Duration::from_secs(10);
                        let mut status = child.try_wait().ok().flatten();
                        while status.is_none() && Instant::now() < give_up {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            status = child.try_wait().ok().flatten();
                        }
                        if status.is_none() {
                            let _ = child.kill();
                            status = child.wait().ok();
                        }
                        status
                    }
                    None => None,
                };
                tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                let mut note = match exit {
                    Some(status) if status.success() => "exited 0, tasks left running".to_string(),
                    Some(status) => format!("exited {status}"),
                    None => "was not running".to_string(),
                };
                if let Err(e) = procs.spawn_agent(i) {
                    note = format!("{note}; restart failed: {e}");
                }
                refresh_known(procs, proxies);
                (procs.agent_ids()[i].clone(), note)
            }
            FaultKind::PartitionAgent => {
                // The agent running the most attempts, so that the cut
                // bites (waiting a little for one that runs anything).
                let i = busiest_or_any(procs, &mut rng, until).await;
                let id = procs.agent_ids()[i].clone();
                // Alternately past the leader marking the node lost, and short of it.
                let past_lost = agent_partitions.is_multiple_of(2);
                agent_partitions += 1;
                let pid: BTreeSet<u32> = procs.agent_pid(i).into_iter().collect();
                let cut = Instant::now();
                for p in proxies {
                    p.set_blocked(pid.clone());
                }
                let lost = if past_lost {
                    // Until the leader has marked the node lost (and placed
                    // its tasks elsewhere), and a little longer.
                    // Generous: on a loaded machine the status reads and the
                    // leader's liveness pass are slow.
                    let give_up = Instant::now() + Duration::from_secs(40);
                    let mut lost = false;
                    while !lost && Instant::now() < give_up {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        lost = client::node_status(&procs.member_addrs(), &id).await == Some(v1::NodeStatus::Lost);
                    }
                    tokio::time::sleep(hold(&mut rng, 2_000, 4_000)).await;
                    lost
                } else {
                    // Past the agent's fence (half the 8 s window), short of the window.
                    tokio::time::sleep(hold(&mut rng, 5_000, 7_000)).await;
                    false
                };
                heal_network(proxies);
                let note = format!(
                    "cut off from every replica for {:.1} s{}",
                    cut.elapsed().as_secs_f64(),
                    if lost { ", past the leader marking it lost" } else { "" }
                );
                (id, note)
            }
            FaultKind::PartitionGang => {
                let i = busiest_or_any(procs, &mut rng, until).await;
                let id = procs.agent_ids()[i].clone();
                let cut_ms = now_ms();
                fabric.cut(&id);
                let held = hold(&mut rng, 3_000, 6_000);
                tokio::time::sleep(held).await;
                fabric.heal();
                let lost = ranks_lost_since(&procs.journal(), cut_ms);
                (
                    id,
                    format!(
                        "cut off from the other nodes' ranks for {:.1} s; {lost} ranks gave up",
                        held.as_secs_f64()
                    ),
                )
            }
            FaultKind::PauseAgent => {
                let i = rng.range(0, agents as u64 - 1) as usize;
                procs.pause_agent(i, true);
                tokio::time::sleep(hold(&mut rng, 1_000, 3_000)).await;
                procs.pause_agent(i, false);
                (procs.agent_ids()[i].clone(), String::new())
            }
        };
        faults.push(Fault { kind: kind.name(), target, start_ms, end_ms: now_ms(), note, clock_ms });
        tokio::time::sleep(hold(&mut rng, 1_000, 2_500)).await;
    }
    heal_network(proxies);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table at the top of this file is the reference for `--faults`
    /// (docs/reliability.md points at it): every kind has its row, and
    /// every row is a kind.
    #[test]
    fn the_fault_table_lists_every_kind_and_only_those() {
        let source = include_str!("nemesis.rs");
        let rows: BTreeSet<&str> = source
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter_map(|l| l.strip_prefix("//! | `")?.split('`').next())
            .collect();
        let kinds: BTreeSet<&str> = KINDS.iter().map(|&(_, k)| k.name()).collect();
        assert_eq!(rows, kinds);
        for &(_, k) in KINDS {
            assert_eq!(FaultKind::parse(k.name()), Some(k));
        }
        assert_eq!(FaultKind::parse("meteor"), None);
    }
}
