//! Group commit: every command waiting while the previous write was in
//! flight goes into the next log entry.
//!
//! ```text
//!   callers ──(command, reply)──▶ queue ──▶ proposer task
//!                                              │ take everything queued (≤ max_batch)
//!                                              │ stamp time_ms from the leader's clock
//!                                              ▼
//!                                  raft.client_write(CommandBatch) ── one fsync
//!                                              │
//!   callers ◀── one outcome each ◀─────────────┘
//! ```
//!
//! Throughput is then bounded by batch size over commit latency rather than
//! by one fsync per transition.
//!
//! Metrics: `muster_raft_batch_commands` (histogram), `muster_raft_commit_seconds`
//! (histogram), `muster_raft_proposals_total{result}` (counter).

use muster_raft_store::CommandBatch;
use openraft::BasicNode;
use openraft::error::{ClientWriteError, Fatal, RaftError};
use openraft::raft::ClientWriteResponse;
use tokio::sync::{mpsc, oneshot};

use std::collections::VecDeque;

use super::leader_time::LeaderTime;
use super::{MusterRaft, TypeConfig};
use crate::sm::{Command, Outcome};

/// Why a proposal did not produce an outcome.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This replica is not the leader; the leader, if known, is given.
    #[error("not the leader{}", match .leader { Some((id, addr)) => format!("; the leader is replica {id} at {addr}"), None => "; no leader is known yet".to_string() })]
    NotLeader {
        /// The leader's id and address.
        leader: Option<(u64, String)>,
    },
    /// Raft failed to commit the entry (e.g. shutting down); the command may
    /// or may not have been committed.
    #[error("the write did not complete: {0}")]
    Raft(String),
    /// This replica's storage failed: Raft stopped here for good (fatal, not
    /// worth retrying on this replica). The command may or may not have been
    /// committed by the others.
    #[error("this replica's storage failed and it stopped: {0}")]
    Storage(String),
    /// A membership change was refused (another one is in progress, or the
    /// change is not allowed).
    #[error("{0}")]
    Membership(String),
}

impl From<RaftError<u64, ClientWriteError<u64, BasicNode>>> for ProposeError {
    /// The one mapping of a failed Raft write, for proposals and membership
    /// changes alike.
    fn from(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Self {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ProposeError::NotLeader { leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)) }
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => ProposeError::Membership(e.to_string()),
            RaftError::Fatal(Fatal::StorageError(e)) => ProposeError::Storage(e.to_string()),
            RaftError::Fatal(other) => ProposeError::Raft(other.to_string()),
        }
    }
}

struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, ProposeError>>,
}

/// The handle callers propose through.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the proposer task for `raft`; at most `max_batch` commands go
    /// into one entry.
    /// Each entry carries the replicated time `time` reads.
    pub fn start(raft: MusterRaft, max_batch: usize, time: LeaderTime) -> Proposer {
        let (tx, rx) = mpsc::channel(max_batch.max(1) * 4);
        tokio::spawn(run(raft, rx, max_batch.max(1), time));
        Proposer { tx }
    }

    /// Proposes one command and waits for its outcome.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { command, reply })
            .await
            .map_err(|_| ProposeError::Raft("the replica is shutting down".into()))?;
        rx.await.map_err(|_| ProposeError::Raft("the replica is shutting down".into()))?
    }

    /// Proposes several commands (they share entries) and waits for all.
    pub async fn propose_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, ProposeError>> {
        let mut waiting = Vec::with_capacity(commands.len());
        for command in commands {
            let (reply, rx) = oneshot::channel();
            if self.tx.send(Pending { command, reply }).await.is_err() {
                break;
            }
            waiting.push(rx);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for rx in waiting {
            out.push(rx.await.unwrap_or_else(|_| Err(ProposeError::Raft("the replica is shutting down".into()))));
        }
        out
    }
}

/// Entries handed to Raft and not yet applied. Two lets the next entry's
/// local fsync run while the previous one is out at the followers; more
/// would only split batches (openraft 0.9 syncs each entry on its own).
const IN_FLIGHT: usize = 2;

/// One entry handed to Raft: its callers, and where its outcome arrives.
struct InFlight {
    batch: Vec<Pending>,
    outcome: oneshot::Receiver<Result<ClientWriteResponse<TypeConfig>, ClientWriteError<u64, BasicNode>>>,
    started: std::time::Instant,
}

async fn run(raft: MusterRaft, mut rx: mpsc::Receiver<Pending>, max_batch: usize, time: LeaderTime) {
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            // The oldest entry's outcome (they apply in log order).
            outcome = async { (&mut in_flight.front_mut().expect("guarded").outcome).await }, if !in_flight.is_empty() => {
                let done = in_flight.pop_front().expect("guarded");
                let result = match outcome {
                    Ok(r) => r.map_err(|e| ProposeError::from(RaftError::APIError(e))),
                    Err(_) => Err(ProposeError::Raft("the replica is shutting down".into())),
                };
                finish(done.batch, done.started, result);
            }
            first = rx.recv(), if open && in_flight.len() < IN_FLIGHT => {
                let Some(first) = first else { open = false; continue };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                let commands = batch.iter().map(|p| p.command.clone()).collect();
                let started = std::time::Instant::now();
                match raft.client_write_ff(CommandBatch { time_ms: time.now(), commands }).await {
                    Ok(outcome) => in_flight.push_back(InFlight { batch, outcome, started }),
                    Err(fatal) => {
                        let err = ProposeError::from(RaftError::<u64, ClientWriteError<u64, BasicNode>>::Fatal(fatal));
                        finish(batch, started, Err(err));
                    }
                }
            }
        }
    }
}

/// Answers an entry's callers and records its metrics.
fn finish(
    batch: Vec<Pending>,
    started: std::time::Instant,
    result: Result<ClientWriteResponse<TypeConfig>, ProposeError>,
) {
    let size = batch.len();
    metrics::histogram!("muster_raft_batch_commands").record(size as f64);
    metrics::histogram!("muster_raft_commit_seconds").record(started.elapsed().as_secs_f64());
    metrics::counter!("muster_raft_proposals_total", "result" => if result.is_ok() { "committed" } else { "failed" })
        .increment(size as u64);
    match result {
        Ok(resp) => {
            debug_assert_eq!(resp.data.len(), size, "one outcome per command");
            for (p, outcome) in batch.into_iter().zip(resp.data) {
                super::observe::observe(&outcome);
                let _ = p.reply.send(Ok(outcome));
            }
        }
        Err(err) => {
            if let ProposeError::Storage(msg) = &err {
                tracing::error!(error = %msg, "storage failed; this replica stops serving writes");
            }
            for p in batch {
                let _ = p.reply.send(Err(err.clone()));
            }
        }
    }
}
