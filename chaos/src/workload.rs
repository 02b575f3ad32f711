//! The client: submits allocations of mixed gang sizes, GPUs and classes,
//! each with its own idempotency key, retried with the same key until
//! answered; reads them back (often right after the acknowledgement) and
//! cancels some. Every attempt is recorded with its timestamps for the
//! checks. Each task is one rank of its gang ([`super::rank`]): it beats
//! with its peers over the gang fabric, and appends its start, beats and end
//! to a shared execution journal.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use muster_proto::v1;
use serde::Serialize;

use super::DEFAULT_TASK_MS;
use super::client::{Answer, Client};
use muster_sim::SimRng;

/// One client call, as the checkers see it.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    /// The idempotency key of the allocation it is about.
    pub key: String,
    /// `submit`, `get` or `cancel`.
    pub kind: &'static str,
    /// Wall-clock ms when it was sent and answered.
    pub invoke_ms: u64,
    /// When it was answered (or given up on).
    pub complete_ms: u64,
    /// `ok`, `failed` or `unknown`.
    pub outcome: &'static str,
    /// The allocation id (a submit's, when ok).
    pub alloc: Option<u64>,
    /// What a get saw (a status in lower case, or `absent`) or what a cancel
    /// did (`cancelled`, `already-ended`, `absent`), when ok.
    pub result: Option<String>,
    /// The error, otherwise.
    pub error: Option<String>,
}

/// Wall-clock milliseconds (the journal and the history share this clock:
/// everything runs on one machine).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What every task runs, and where it reaches the harness.
pub struct Tasks {
    /// The `muster` binary: each task is `muster chaos-rank` ([`super::rank`]).
    pub bin: PathBuf,
    /// The shared execution journal.
    pub journal: PathBuf,
    /// The gang fabric's address ([`super::fabric`]).
    pub fabric: String,
    /// MiB of state each rank checkpoints (0: none; see [`super::rank`]).
    pub checkpoint_mb: u32,
    /// Each rank starts a daemon that escapes its process group.
    pub daemonising: bool,
}

/// One allocation of the mix.
fn spec(rng: &mut SimRng, key: String, tasks: &Tasks, task_ms: (u64, u64)) -> v1::AllocationSpec {
    let gang_size = rng.weighted(&[(5, 1u32), (3, 2), (2, 3)]);
    let gpus = rng.weighted(&[(3, 1u32), (2, 2)]);
    let class = rng.range(0, 9) as u32;
    let checkpoint = if rng.chance(0.5) { v1::CheckpointMode::Auto } else { v1::CheckpointMode::None };
    v1::AllocationSpec {
        owner: "chaos".into(),
        gang_size,
        resources: Some(v1::Resources { gpus, vram_mb: 1_000, mem_mb: 500, cpus: 1 }),
        preemption_class: class,
        checkpoint: checkpoint as i32,
        checkpoint_estimate_s: 5,
        walltime_s: 120,
        max_retries: 8,
        command: vec![
            tasks.bin.display().to_string(),
            "chaos-rank".into(),
            "--beats".into(),
            rng.range(task_ms.0 / 250, task_ms.1 / 250).max(1).to_string(),
        ],
        env: [
            ("CHAOS_JOURNAL".to_string(), tasks.journal.display().to_string()),
            ("CHAOS_FABRIC".to_string(), tasks.fabric.clone()),
            ("CHAOS_CHECKPOINT_MB".to_string(), tasks.checkpoint_mb.to_string()),
            ("CHAOS_DAEMON".to_string(), if tasks.daemonising { "1" } else { "0" }.to_string()),
        ]
        .into(),
        idempotency_key: key,
        ..Default::default()
    }
}

/// Whether a failed call's error is a replica's definite refusal (a gRPC
/// status it answered), not a call that found no leader.
pub fn is_refusal(error: &str) -> bool {
    !error.starts_with(super::client::NO_LEADER)
}

fn record<T: Clone>(
    ops: &mut Vec<Op>,
    key: &str,
    kind: &'static str,
    invoke_ms: u64,
    answer: &Answer<T>,
    fill: impl Fn(&T) -> (Option<u64>, Option<String>),
) {
    let complete_ms = now_ms();
    let (outcome, (alloc, result), error) = match answer {
        Answer::Ok(v) => ("ok", fill(v), None),
        Answer::Failed(e) => ("failed", (None, None), Some(e.clone())),
        Answer::Unknown(e) => ("unknown", (None, None), Some(e.clone())),
    };
    ops.push(Op { key: key.to_string(), kind, invoke_ms, complete_ms, outcome, alloc, result, error });
}

/// Until `until`: every 150–600 ms a new allocation (an unanswered submit,
/// or one that found no leader, is retried with its key for up to 20 s; a
/// refused one is not; half the time it is read back at
/// once), a read of an earlier one (30 %), a cancel of one (8 %). Returns
/// every call.
/// Each task runs for about `task_ms` (low, high) milliseconds.
pub async fn run(addrs: Vec<String>, seed: u64, tasks: &Tasks, until: Instant, task_ms: (u64, u64)) -> Vec<Op> {
    let mut rng = SimRng::new(seed ^ 0x05EE_D0FC_4A05);
    let mut client = Client::new(addrs, Duration::from_secs(2));
    let mut ops = Vec::new();
    let mut acked: Vec<(String, u64)> = Vec::new();
    let mut n = 0u64;
    // Longer tasks, fewer submissions: the cluster must be able to drain
    // what was submitted in the liveness phase.
    let slower = ((task_ms.0 + task_ms.1) / 2).div_ceil((DEFAULT_TASK_MS.0 + DEFAULT_TASK_MS.1) / 2).max(1);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.range(150, 600) * slower)).await;
        n += 1;
        let key = format!("chaos-{seed}-{n}");
        let spec = spec(&mut rng, key.clone(), tasks, task_ms);
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let invoke_ms = now_ms();
            let answer = client.submit(&spec).await;
            record(&mut ops, &key, "submit", invoke_ms, &answer, |id| (Some(*id), None));
            if let Answer::Ok(id) = answer {
                acked.push((key.clone(), id));
                if rng.chance(0.5) {
                    let invoke_ms = now_ms();
                    let seen = client.get(id).await;
                    record(&mut ops, &key, "get", invoke_ms, &seen, |r| (Some(id), Some(r.clone())));
                }
                break;
            }
            // A definite refusal from a replica is final, as for any real
            // client: the key is given up (and must then never exist).
            if Instant::now() >= give_up || matches!(&answer, Answer::Failed(e) if is_refusal(e)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !acked.is_empty() && rng.chance(0.3) {
            let (key, id) = acked[rng.range(0, acked.len() as u64 - 1) as usize].clone();
            let invoke_ms = now_ms();
            let seen = client.get(id).await;
            record(&mut ops, &key, "get", invoke_ms, &seen, |r| (Some(id), Some(r.clone())));
        }
        if !acked.is_empty() && rng.chance(0.08) {
            let (key, id) = acked[rng.range(0, acked.len() as u64 - 1) as usize].clone();
            let invoke_ms = now_ms();
            let did = client.cancel(id).await;
            record(&mut ops, &key, "cancel", invoke_ms, &did, |r| (Some(id), Some(r.clone())));
        }
    }
    ops
}
