//! The cluster's users: the submitters, which keep a bounded backlog of
//! arrays and gangs, and the probe, which times one high-priority job at a
//! time from its submit to its start, step by step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_tls::TlsMaterial;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::common;
use crate::record::{PROBE, Starts};

/// The address the users (submitters, probe) call: the leader's, replaced
/// after a failover; and the users' certificate (none: insecure).
#[derive(Clone)]
pub struct LeaderAddr(Arc<Mutex<String>>, Option<TlsMaterial>);

impl LeaderAddr {
    pub fn new(addr: &str, tls: Option<TlsMaterial>) -> LeaderAddr {
        LeaderAddr(Arc::new(Mutex::new(addr.to_string())), tls)
    }

    pub fn set(&self, addr: &str) {
        *self.0.lock().unwrap() = addr.to_string();
    }

    /// A client on `conn`, connected again when the leader's address
    /// changed (`None` while it cannot connect).
    pub async fn client(&self, conn: &mut Option<(String, Channel)>) -> Option<AllocationServiceClient<Channel>> {
        let addr = self.0.lock().unwrap().clone();
        if conn.as_ref().is_none_or(|(a, _)| *a != addr) {
            let ch = muster_tls::endpoint(&addr, self.1.as_ref()).unwrap().connect().await.ok()?;
            *conn = Some((addr, ch));
        }
        let ch = conn.as_ref().map(|(_, ch)| ch.clone())?;
        Some(AllocationServiceClient::new(ch).max_decoding_message_size(64 << 20))
    }

    /// Submits `req` to the leader; whether it was accepted (within 30 s:
    /// a call to a replica that stopped leading is given up, and retried).
    pub async fn submit(&self, conn: &mut Option<(String, Channel)>, req: v1::SubmitRequest) -> bool {
        match self.client(conn).await {
            Some(mut c) => matches!(tokio::time::timeout(Duration::from_secs(30), c.submit(req)).await, Ok(Ok(_))),
            None => false,
        }
    }
}

/// One probe's steps, from its submit: when its answer came, the times of
/// the entries that submitted, reserved and started it (the leader's clock,
/// on this machine), and when its start was seen on the watch.
pub struct ProbeTimes {
    /// When it was submitted.
    pub at: Instant,
    pub acked: Duration,
    pub entered: Duration,
    pub reserved: Duration,
    pub started: Duration,
    pub seen: Duration,
}

/// This machine's wall clock in ms (the leader stamps entries with it).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn spec(gang_size: u32, gpus: u32, command: &[&str]) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "fleet".into(),
        gang_size,
        resources: Some(v1::Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: command.iter().map(|s| s.to_string()).collect(),
        checkpoint: v1::CheckpointMode::None as i32,
        ports: Some(0),
        ..Default::default()
    }
}

/// What the submitters submit: `tasks` in all, shared by `submitters`,
/// in arrays of `array_size` one-GPU elements each followed by
/// `gangs_per_array` four-task gangs of whole nodes, with at most
/// `backlog` tasks submitted and not yet started.
pub struct Workload {
    pub tasks: u64,
    pub submitters: u64,
    pub backlog: u64,
    pub array_size: u64,
    pub gangs_per_array: u64,
}

/// Starts the submitters on `users`; each answers how many tasks it
/// submitted. One submitter alone waits for each submit's answer, and the
/// queue ran dry between its arrays; unbounded, the whole run's tasks
/// would queue at once.
pub fn submit(users: &Handle, w: &Workload, leader: &LeaderAddr, starts: &Arc<Starts>) -> Vec<JoinHandle<u64>> {
    let submitted_all = Arc::new(AtomicU64::new(0));
    (0..w.submitters)
        .map(|who| {
            let leader = leader.clone();
            let (starts, submitted_all) = (starts.clone(), submitted_all.clone());
            let tasks = w.tasks / w.submitters + if who == 0 { w.tasks % w.submitters } else { 0 };
            let (backlog, array_size, gangs_per_array) = (w.backlog, w.array_size, w.gangs_per_array);
            users.spawn(async move {
                let (mut submitted, mut k) = (0u64, 0u64);
                let mut conn = None;
                while submitted < tasks {
                    while submitted_all.load(Ordering::Relaxed)
                        >= starts.distinct_work.load(Ordering::Relaxed) + backlog
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    // An array, then `gangs_per_array` gangs, in turn. Each
                    // submit is retried with its idempotency key until
                    // answered: one the old leader committed but never
                    // answered (a failover) is answered with what it made,
                    // not made again.
                    let (mut spec, array, n) = match k % (gangs_per_array + 1) {
                        0 => {
                            let n = array_size.min(tasks - submitted);
                            (spec(1, 1, &["train"]), format!("0-{}", n - 1), n)
                        }
                        _ => (spec(4, 8, &["train"]), String::new(), 4),
                    };
                    spec.idempotency_key = format!("fleet-{who}-{k}");
                    let req = v1::SubmitRequest { spec: Some(spec), array, ..Default::default() };
                    if leader.submit(&mut conn, req).await {
                        submitted += n;
                        submitted_all.fetch_add(n, Ordering::Relaxed);
                        k += 1;
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                submitted
            })
        })
        .collect()
}

/// Starts the probe on `users`: one job at a time, 500 ms apart, until
/// `done`.
pub fn probe(users: &Handle, leader: LeaderAddr, done: Arc<AtomicBool>) -> JoinHandle<Vec<ProbeTimes>> {
    users.spawn(async move {
        let mut probes = Vec::new();
        let mut conn = None;
        while !done.load(Ordering::Relaxed) {
            if let Some(c) = leader.client(&mut conn).await
                && let Some(p) = probe_once(c).await
            {
                probes.push(p);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        probes
    })
}

/// One probe: a one-GPU job ahead of the backlog (a higher priority, the
/// same class: the control plane's latency, not the queue's), watched until
/// it starts; `None` when it could not be submitted or watched, or its
/// watch went quiet for 60 s (a replica that stopped leading).
async fn probe_once(mut c: AllocationServiceClient<Channel>) -> Option<ProbeTimes> {
    let t0 = Instant::now();
    let t0_ms = wall_ms();
    let mut spec = spec(1, 1, &PROBE);
    spec.priority = 100;
    let r = c.submit(v1::SubmitRequest { spec: Some(spec), ..Default::default() }).await.ok()?;
    let acked = t0.elapsed();
    let id = r.into_inner().id;
    let mut events = c.watch(v1::WatchRequest { id, from_revision: 0 }).await.ok()?.into_inner();
    // The entries' times (the leader's clock, on this machine), from the
    // submit's.
    let at = |e: &v1::AllocationEvent| Duration::from_millis(e.time_ms.saturating_sub(t0_ms));
    let (mut entered, mut reserved) = (None, None);
    let quiet = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(quiet);
    while let Ok(Some(e)) = tokio::select! {
        e = events.message() => e,
        _ = &mut quiet => Ok(None),
    } {
        match e.kind.as_str() {
            "submitted" => entered = Some(at(&e)),
            "gang_reserved" => reserved = Some(at(&e)),
            "task_started" => {
                let seen = t0.elapsed();
                let started = at(&e).min(seen);
                let reserved = reserved.unwrap_or(started).min(started);
                let entered = entered.unwrap_or(reserved).min(reserved);
                return Some(ProbeTimes { at: t0, acked, entered, reserved, started, seen });
            }
            _ => {}
        }
    }
    None
}

/// Prints the probes' submit → running, and where their time went, by the
/// entries' times.
pub fn report(probes: &[ProbeTimes]) {
    let line = |name: &str, f: &dyn Fn(&ProbeTimes) -> Duration| {
        let mut v: Vec<Duration> = probes.iter().map(f).collect();
        v.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{name} p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms",
            ms(common::pct(&v, 0.5)),
            ms(common::pct(&v, 0.99)),
            ms(*v.last().unwrap())
        );
    };
    if probes.is_empty() {
        return;
    }
    line(&format!("  probe submit -> running: n={}", probes.len()), &|p| p.seen);
    line("    submit -> its entry (the call, the proposer's queue):", &|p| p.entered);
    line("    entry -> reserved (admission):", &|p| p.reserved.saturating_sub(p.entered));
    line("    reserved -> started (the assignment, the agent's claim, its entry):", &|p| {
        p.started.saturating_sub(p.reserved)
    });
    line("    started -> seen on the watch (commit, apply, the watch):", &|p| p.seen.saturating_sub(p.started));
    line("    submit -> answered:", &|p| p.acked);
}
