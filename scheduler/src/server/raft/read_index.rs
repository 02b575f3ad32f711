//! Linearizable reads, batched (read-index batching, as etcd does).
//!
//! A read that must be current waits until this replica has confirmed, with
//! a quorum, that it still leads, and has applied the log up to the commit
//! index of that moment (openraft's `ensure_linearizable`). Asking a quorum
//! once per read makes a burst of reads a burst of heartbeat rounds: under
//! 8,000 concurrent reads some rounds timed out and failed reads that a
//! retry would have served ("not enough for a quorum", with no leader
//! change). Instead, waiting reads share rounds:
//!
//! ```text
//!   read ──▶ joins `waiting` ──▶ (no round running?) start the driver
//!   driver: loop { take every waiting read; one confirmation round
//!                  (retried on a transient failure); answer them all }
//!           until nobody waits
//! ```
//!
//! A read that arrives while a round is running waits for the next one: a
//! round that began before a read arrived cannot vouch for it. A round that
//! fails transiently (a heartbeat lost in the burst) is retried a few times
//! before its reads are failed; a replica that is not the leader answers at
//! once with the leader's address.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::oneshot;
use tonic::Status;

use super::consensus::not_leader_status;
use crate::server::MusterRaft;

/// Confirmation rounds a batch gets before its reads fail (with 50, 100,
/// 200 ms between them).
const ROUNDS: u32 = 4;

type Waiter = oneshot::Sender<Result<(), Status>>;

/// Reads waiting for a leadership confirmation, shared by a replica's
/// services.
#[derive(Clone, Default)]
pub struct ReadBatcher {
    inner: Arc<Mutex<Waiting>>,
}

#[derive(Default)]
struct Waiting {
    /// A driver is running rounds.
    running: bool,
    /// Reads that arrived since the current round began.
    reads: Vec<Waiter>,
}

impl ReadBatcher {
    /// Waits until a read may be answered from this replica's state: a
    /// confirmation round that began after this call has succeeded.
    pub async fn confirm(&self, raft: &MusterRaft) -> Result<(), Status> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = self.inner.lock().expect("read batcher lock");
            w.reads.push(tx);
            !std::mem::replace(&mut w.running, true)
        };
        if start {
            tokio::spawn(drive(self.inner.clone(), raft.clone()));
        }
        rx.await.unwrap_or_else(|_| Err(Status::unavailable("the replica is shutting down")))
    }
}

/// Runs rounds while reads wait; each round answers the reads that were
/// waiting when it began.
async fn drive(inner: Arc<Mutex<Waiting>>, raft: MusterRaft) {
    loop {
        let batch = {
            let mut w = inner.lock().expect("read batcher lock");
            if w.reads.is_empty() {
                w.running = false;
                return;
            }
            std::mem::take(&mut w.reads)
        };
        metrics::histogram!("muster_read_batch_size").record(batch.len() as f64);
        let result = confirm_with_retries(&raft).await;
        for read in batch {
            let _ = read.send(result.clone());
        }
    }
}

/// One confirmation, retried while it fails for a reason a retry can fix.
async fn confirm_with_retries(raft: &MusterRaft) -> Result<(), Status> {
    let mut last = String::new();
    for round in 0..ROUNDS {
        match raft.ensure_linearizable().await {
            Ok(_) => return Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                return Err(not_leader_status(f.leader_id.zip(f.leader_node.map(|n| n.addr))));
            }
            Err(e) => {
                last = e.to_string();
                if round + 1 < ROUNDS {
                    tokio::time::sleep(Duration::from_millis(50 << round)).await;
                }
            }
        }
    }
    Err(Status::unavailable(format!("cannot confirm leadership after {ROUNDS} rounds: {last}")))
}
