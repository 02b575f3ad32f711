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
//! Commands queue in two lanes. A node's registration
//! ([`Proposer::propose_first`]) goes into the next entry ahead of whatever
//! waits in the main lane: under load that lane holds seconds of the
//! fleet's claims and reports, and after a failover every agent of the
//! fleet registers with the successor at once; behind them, a registration
//! kept its agent without a stream (and its tasks without a leader to
//! answer them) for those seconds. Each lane is first in, first out.
//!
//! An entry whose outcome does not come is answered "did not complete"
//! after [`NO_OUTCOME_FOLLOWING`] (this replica no longer leads) or
//! [`NO_OUTCOME_LEADING`], and leaves the pipeline: openraft answers an
//! entry only when this replica applies it from its log or truncates it, so
//! an entry a snapshot covered (installed after this replica lost the
//! leadership) is never answered, and would hold the pipeline, and every
//! write behind it, for good.
//!
//! Metrics: `muster_raft_batch_commands` (histogram), `muster_raft_commit_seconds`
//! (histogram), `muster_raft_proposals_total{result}` (counter),
//! `muster_raft_outcomes_missing_total` (counter).

use std::time::Duration;

use muster_raft_store::CommandBatch;
use openraft::BasicNode;
use openraft::error::{ClientWriteError, Fatal, RaftError};
use openraft::raft::ClientWriteResponse;
use tokio::sync::{mpsc, oneshot};

use std::collections::VecDeque;

use super::leader_time::LeaderTime;
use crate::server::{MusterRaft, TypeConfig};
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
    /// The command alone is larger than a log entry may be: it is refused
    /// before the log (every replica would have to store and replicate it,
    /// and one append must carry it within its deadline).
    #[error("the command is {bytes} bytes encoded, over the {limit}-byte limit of a log entry")]
    TooLarge {
        /// Its encoded size.
        bytes: usize,
        /// [`MAX_ENTRY_BYTES`].
        limit: usize,
    },
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
    /// Its encoded size.
    bytes: usize,
    reply: oneshot::Sender<Result<Outcome, ProposeError>>,
}

/// The most bytes of commands one log entry carries. A batch closes before
/// the command that would pass it (that command opens the next entry), and a
/// single command over it is refused before the log: an entry must fit in
/// one append to a follower, sent and synced within the append's deadline
/// (`muster_raft_store::MAX_APPEND_BYTES` is twice this).
pub const MAX_ENTRY_BYTES: usize = 1 << 20;

impl Pending {
    fn new(command: Command, reply: oneshot::Sender<Result<Outcome, ProposeError>>) -> Pending {
        Pending { bytes: command.encoded_len(), command, reply }
    }
}

/// A command handed to the proposer ([`Proposer::submit`]), its outcome to
/// come.
pub struct Proposed(oneshot::Receiver<Result<Outcome, ProposeError>>);

impl Proposed {
    /// Waits for the command's outcome.
    pub async fn outcome(self) -> Result<Outcome, ProposeError> {
        self.await
    }
}

/// Polled in place (`&mut proposed`), so that a caller can keep several in
/// a queue and wait on the oldest.
impl Future for Proposed {
    type Output = Result<Outcome, ProposeError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(ProposeError::Raft("the replica is shutting down".into()))))
    }
}

/// The handle callers propose through.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    /// The lane that goes first.
    first: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the proposer task for `raft`; at most `max_batch` commands go
    /// into one entry.
    /// Each entry carries the replicated time `time` reads; `committed` sees
    /// every outcome before its caller does (the replica records metrics).
    pub fn start(raft: MusterRaft, max_batch: usize, time: LeaderTime, committed: fn(&Outcome)) -> Proposer {
        Proposer::start_on(raft, max_batch, move || time.now(), committed)
    }

    /// [`Proposer::start`] on any [`Log`], stamping entries with `now`.
    fn start_on<L: Log>(
        log: L,
        max_batch: usize,
        now: impl Fn() -> u64 + Send + 'static,
        committed: fn(&Outcome),
    ) -> Proposer {
        let (tx, rx) = mpsc::channel(max_batch.max(1) * 4);
        let (first, first_rx) = mpsc::channel(max_batch.max(1));
        tokio::spawn(run(log, Lanes { first: first_rx, rest: rx }, max_batch.max(1), now, committed));
        Proposer { tx, first }
    }

    /// Proposes one command and waits for its outcome.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        self.submit(command).await?.outcome().await
    }

    /// Proposes one command ahead of every command waiting in the main lane
    /// (they may apply after it), and waits for its outcome. For a node's
    /// registration, which nothing queued before it depends on.
    pub async fn propose_first(&self, command: Command) -> Result<Outcome, ProposeError> {
        queue(&self.first, command).await?.outcome().await
    }

    /// Hands one command to the proposer and returns without waiting for
    /// its outcome. Commands submitted one after another are applied in
    /// that order (the queue is first in, first out, and entries apply in
    /// log order), so a caller may go on to its next command at once.
    pub async fn submit(&self, command: Command) -> Result<Proposed, ProposeError> {
        queue(&self.tx, command).await
    }

    /// Proposes several commands (they share entries) and waits for all.
    pub async fn propose_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, ProposeError>> {
        let mut waiting = Vec::with_capacity(commands.len());
        for command in commands {
            let Ok(proposed) = self.submit(command).await else { break };
            waiting.push(proposed);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for proposed in waiting {
            out.push(proposed.await);
        }
        out
    }
}

/// Entries handed to Raft and not yet applied. Two lets the next entry's
/// local fsync run while the previous one is out at the followers; more
/// would only split batches (openraft 0.9 syncs each entry on its own).
const IN_FLIGHT: usize = 2;

/// How long an entry may wait for its outcome while this replica does not
/// lead (a leader that lost its leadership has its entries committed or
/// truncated by the next one within an election or two).
pub const NO_OUTCOME_FOLLOWING: Duration = Duration::from_secs(3);

/// How long an entry may wait for its outcome while this replica leads.
pub const NO_OUTCOME_LEADING: Duration = Duration::from_secs(10);

/// Where an entry's outcome arrives.
type OutcomeRx = oneshot::Receiver<Result<ClientWriteResponse<TypeConfig>, ClientWriteError<u64, BasicNode>>>;

/// Where the proposer writes: Raft, or a test's stand-in.
trait Log: Send + Sync + 'static {
    /// Hands `batch` to the log: its outcome arrives on the receiver.
    fn write(&self, batch: CommandBatch<Command>) -> impl Future<Output = Result<OutcomeRx, Fatal<u64>>> + Send;
    /// Whether this replica leads now.
    fn leads(&self) -> bool;
}

impl Log for MusterRaft {
    fn write(&self, batch: CommandBatch<Command>) -> impl Future<Output = Result<OutcomeRx, Fatal<u64>>> + Send {
        self.client_write_ff(batch)
    }

    fn leads(&self) -> bool {
        self.metrics().borrow().state.is_leader()
    }
}

/// One entry handed to Raft: its callers, and where its outcome arrives.
struct InFlight {
    batch: Vec<Pending>,
    outcome: OutcomeRx,
    started: tokio::time::Instant,
}

/// Puts `command` in `lane`; its outcome comes on the returned handle.
async fn queue(lane: &mpsc::Sender<Pending>, command: Command) -> Result<Proposed, ProposeError> {
    let (reply, rx) = oneshot::channel();
    lane.send(Pending::new(command, reply))
        .await
        .map_err(|_| ProposeError::Raft("the replica is shutting down".into()))?;
    Ok(Proposed(rx))
}

/// The proposer's two queues: `first` goes ahead of `rest`.
struct Lanes {
    first: mpsc::Receiver<Pending>,
    rest: mpsc::Receiver<Pending>,
}

impl Lanes {
    /// The next command queued now, first lane first.
    fn try_next(&mut self) -> Option<Pending> {
        self.first.try_recv().or_else(|_| self.rest.try_recv()).ok()
    }

    /// The next command, first lane first, waiting for one; `None` once
    /// both lanes are closed and empty.
    async fn next(&mut self) -> Option<Pending> {
        if let Some(p) = self.try_next() {
            return Some(p);
        }
        tokio::select! {
            biased;
            Some(p) = self.first.recv() => Some(p),
            p = self.rest.recv() => match p {
                Some(p) => Some(p),
                // The handles are dropped together: whatever the first
                // lane still holds is taken before the end.
                None => self.first.try_recv().ok(),
            },
        }
    }
}

async fn run<L: Log>(log: L, mut rx: Lanes, max_batch: usize, now: impl Fn() -> u64, committed: fn(&Outcome)) {
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut open = true;
    // The command that would have passed the last entry's byte bound: it
    // opens the next one.
    let mut carried: Option<Pending> = None;
    let mut look = tokio::time::interval(Duration::from_millis(500));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while open || carried.is_some() || !in_flight.is_empty() {
        tokio::select! {
            // The oldest entry's outcome (they apply in log order).
            outcome = async { (&mut in_flight.front_mut().expect("guarded").outcome).await }, if !in_flight.is_empty() => {
                let done = in_flight.pop_front().expect("guarded");
                let result = match outcome {
                    Ok(r) => r.map_err(|e| ProposeError::from(RaftError::APIError(e))),
                    Err(_) => Err(ProposeError::Raft("the replica is shutting down".into())),
                };
                finish(done.batch, done.started, result, committed);
            }
            // An outcome that is not coming: answer, and free the pipeline.
            _ = look.tick(), if !in_flight.is_empty() => {
                let leads = log.leads();
                let bound = if leads { NO_OUTCOME_LEADING } else { NO_OUTCOME_FOLLOWING };
                let waited = in_flight.front().expect("guarded").started.elapsed();
                if waited >= bound {
                    let done = in_flight.pop_front().expect("guarded");
                    tracing::warn!(
                        waited_ms = waited.as_millis() as u64,
                        leads,
                        commands = done.batch.len(),
                        "an entry's outcome never came; answering that the write did not complete"
                    );
                    metrics::counter!("muster_raft_outcomes_missing_total").increment(1);
                    let msg = format!("no outcome after {:.1} s (it may still commit)", waited.as_secs_f64());
                    finish(done.batch, done.started, Err(ProposeError::Raft(msg)), committed);
                }
            }
            first = next_pending(&mut carried, &mut rx), if (open || carried.is_some()) && in_flight.len() < IN_FLIGHT => {
                let Some(first) = first else { open = false; continue };
                if first.bytes > MAX_ENTRY_BYTES {
                    metrics::counter!("muster_raft_proposals_total", "result" => "too_large").increment(1);
                    tracing::warn!(command = first.command.name(), bytes = first.bytes, "a command over the entry limit refused");
                    let _ = first.reply.send(Err(ProposeError::TooLarge { bytes: first.bytes, limit: MAX_ENTRY_BYTES }));
                    continue;
                }
                let mut bytes = first.bytes;
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_next() {
                        Some(p) if bytes + p.bytes > MAX_ENTRY_BYTES => {
                            carried = Some(p);
                            break;
                        }
                        Some(p) => {
                            bytes += p.bytes;
                            batch.push(p);
                        }
                        None => break,
                    }
                }
                let commands = batch.iter().map(|p| p.command.clone()).collect();
                let started = tokio::time::Instant::now();
                match log.write(CommandBatch { time_ms: now(), commands }).await {
                    Ok(outcome) => in_flight.push_back(InFlight { batch, outcome, started }),
                    Err(fatal) => {
                        let err = ProposeError::from(RaftError::<u64, ClientWriteError<u64, BasicNode>>::Fatal(fatal));
                        finish(batch, started, Err(err), committed);
                    }
                }
            }
        }
    }
}

/// The next command to propose: the one carried over from the last batch,
/// else the queue's next.
async fn next_pending(carried: &mut Option<Pending>, rx: &mut Lanes) -> Option<Pending> {
    match carried.take() {
        Some(p) => Some(p),
        None => rx.next().await,
    }
}

/// Answers an entry's callers, shows each outcome to `committed` and
/// records the entry's metrics.
fn finish(
    batch: Vec<Pending>,
    started: tokio::time::Instant,
    result: Result<ClientWriteResponse<TypeConfig>, ProposeError>,
    committed: fn(&Outcome),
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
                committed(&outcome);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use openraft::{CommittedLeaderId, LogId};

    use super::*;

    type OutcomeTx = oneshot::Sender<Result<ClientWriteResponse<TypeConfig>, ClientWriteError<u64, BasicNode>>>;

    /// A log that keeps every entry's reply channel for the test to answer
    /// (or never).
    #[derive(Clone, Default)]
    struct Held {
        replies: Arc<Mutex<Vec<(usize, OutcomeTx)>>>,
        /// Every command written, in log order.
        written: Arc<Mutex<Vec<Command>>>,
        leads: Arc<AtomicBool>,
    }

    impl Log for Held {
        fn write(&self, batch: CommandBatch<Command>) -> impl Future<Output = Result<OutcomeRx, Fatal<u64>>> + Send {
            let (tx, rx) = oneshot::channel();
            self.replies.lock().unwrap().push((batch.commands.len(), tx));
            self.written.lock().unwrap().extend(batch.commands);
            async move { Ok(rx) }
        }

        fn leads(&self) -> bool {
            self.leads.load(Ordering::SeqCst)
        }
    }

    impl Held {
        /// Answers the oldest unanswered entry as applied.
        fn apply_next(&self) {
            let (n, tx) = self.replies.lock().unwrap().remove(0);
            let data = vec![Outcome::Accepted(Vec::new()); n];
            let log_id = LogId::new(CommittedLeaderId::new(1, 1), 1);
            let _ = tx.send(Ok(ClientWriteResponse { log_id, data, membership: None }));
        }

        fn held(&self) -> usize {
            self.replies.lock().unwrap().len()
        }

        /// Waits (in paused time) until `n` entries are held.
        async fn until_held(&self, n: usize) {
            while self.held() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }

        /// The allocations of the `ExpireNomination`s written, in log order.
        fn written_allocs(&self) -> Vec<u64> {
            self.written
                .lock()
                .unwrap()
                .iter()
                .map(|c| match c {
                    Command::ExpireNomination { alloc } => *alloc,
                    other => panic!("unexpected {other:?}"),
                })
                .collect()
        }
    }

    fn command() -> Command {
        Command::ExpireNomination { alloc: 1 }
    }

    /// Entries whose outcome never comes (as for entries a snapshot covered
    /// after this replica lost its leadership) fill the pipeline; each is
    /// answered "did not complete" once it has waited its bound (shorter
    /// when this replica does not lead), and writes flow again.
    #[tokio::test(start_paused = true)]
    async fn an_outcome_that_never_comes_frees_the_pipeline_after_its_bound() {
        let log = Held::default();
        log.leads.store(true, Ordering::SeqCst);
        // One command per entry, so that each fills a place in the pipeline.
        let proposer = Proposer::start_on(log.clone(), 1, || 0, |_| {});
        let stuck: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let p = proposer.clone();
                tokio::spawn(async move { p.propose(command()).await })
            })
            .collect();
        log.until_held(IN_FLIGHT).await;
        // The pipeline is full: a third write waits, whatever time passes
        // short of the leader's bound.
        let p = proposer.clone();
        let third = tokio::spawn(async move { p.propose(command()).await });
        tokio::time::sleep(NO_OUTCOME_FOLLOWING + Duration::from_secs(1)).await;
        assert_eq!(log.held(), IN_FLIGHT, "nothing gave up while leading, short of {NO_OUTCOME_LEADING:?}");
        assert!(!third.is_finished());
        // This replica stops leading: past the follower's bound, the stuck
        // entries are answered and the third goes out, and is applied.
        log.leads.store(false, Ordering::SeqCst);
        for s in stuck {
            let err = s.await.unwrap().unwrap_err();
            assert!(matches!(&err, ProposeError::Raft(m) if m.contains("no outcome after")), "{err}");
        }
        log.until_held(IN_FLIGHT + 1).await;
        // The stuck entries' channels are still held (their outcome may yet
        // come, to nobody): answer the third, which is last.
        let (n, tx) = log.replies.lock().unwrap().pop().unwrap();
        let data = vec![Outcome::Accepted(Vec::new()); n];
        let log_id = LogId::new(CommittedLeaderId::new(2, 1), 3);
        let _ = tx.send(Ok(ClientWriteResponse { log_id, data, membership: None }));
        assert!(matches!(third.await.unwrap(), Ok(Outcome::Accepted(_))));
        // A late outcome for an abandoned entry reaches nobody and harms nothing.
        log.apply_next();
        assert!(matches!(proposer.propose_all(vec![]).await.as_slice(), []));
    }

    /// Entries are bounded in bytes: a batch closes before the command that
    /// would pass [`MAX_ENTRY_BYTES`] (it opens the next entry), and a
    /// single command over the bound is refused before the log.
    #[tokio::test(start_paused = true)]
    async fn entries_are_bounded_in_bytes_and_an_oversized_command_is_refused() {
        let log = Held::default();
        log.leads.store(true, Ordering::SeqCst);
        let proposer = Proposer::start_on(log.clone(), 4096, || 0, |_| {});
        let sized = |bytes: usize| Command::FailTaskToStart {
            alloc: 1,
            task: 0,
            node: crate::sm::NodeId::new("n"),
            epoch: 1,
            reason: "x".repeat(bytes),
        };
        let third = MAX_ENTRY_BYTES / 3;
        let over = proposer.propose(sized(MAX_ENTRY_BYTES)).await.unwrap_err();
        assert!(
            matches!(over, ProposeError::TooLarge { bytes, limit } if bytes > MAX_ENTRY_BYTES && limit == MAX_ENTRY_BYTES),
            "{over}"
        );
        assert_eq!(log.held(), 0, "nothing reached the log");
        // Four commands of a third of the bound each: three fit one entry,
        // the fourth opens the next.
        let p = proposer.clone();
        let all = tokio::spawn(async move { p.propose_all((0..4).map(|_| sized(third - 64)).collect()).await });
        log.until_held(2).await;
        let sizes: Vec<usize> = log.replies.lock().unwrap().iter().map(|(n, _)| *n).collect();
        assert_eq!(sizes, vec![3, 1]);
        log.apply_next();
        log.apply_next();
        assert!(all.await.unwrap().iter().all(|r| matches!(r, Ok(Outcome::Accepted(_)))));
    }

    /// `submit` returns once the command is queued, before its entry is
    /// written; commands submitted one after another reach the log in that
    /// order, and each outcome comes to its own submitter.
    #[tokio::test(start_paused = true)]
    async fn submitted_commands_keep_their_order_and_each_gets_its_outcome() {
        let log = Held::default();
        log.leads.store(true, Ordering::SeqCst);
        let proposer = Proposer::start_on(log.clone(), 2, || 0, |_| {});
        let mut proposed = Vec::new();
        for alloc in 1..=5 {
            proposed.push(proposer.submit(Command::ExpireNomination { alloc }).await.unwrap());
        }
        // Two entries of two go out (the pipeline's depth); the fifth waits.
        log.until_held(IN_FLIGHT).await;
        log.apply_next();
        log.apply_next();
        log.until_held(1).await;
        log.apply_next();
        for p in proposed {
            assert!(matches!(p.outcome().await, Ok(Outcome::Accepted(_))));
        }
        assert_eq!(log.written_allocs(), vec![1, 2, 3, 4, 5]);
    }

    /// A command proposed first (a node's registration) goes into the next
    /// entry ahead of the commands queued before it; the main lane keeps
    /// its own order.
    #[tokio::test(start_paused = true)]
    async fn a_command_proposed_first_goes_ahead_of_the_queue() {
        let log = Held::default();
        log.leads.store(true, Ordering::SeqCst);
        let proposer = Proposer::start_on(log.clone(), 2, || 0, |_| {});
        let mut proposed = Vec::new();
        for alloc in 1..=5 {
            proposed.push(proposer.submit(Command::ExpireNomination { alloc }).await.unwrap());
        }
        // Two entries of two are out; the fifth waits in the queue.
        log.until_held(IN_FLIGHT).await;
        let p = proposer.clone();
        let first = tokio::spawn(async move { p.propose_first(Command::ExpireNomination { alloc: 99 }).await });
        // Until it is queued behind the fifth.
        let queued =
            |p: &Proposer| (p.first.max_capacity() - p.first.capacity()) + (p.tx.max_capacity() - p.tx.capacity());
        while queued(&proposer) < 2 {
            tokio::task::yield_now().await;
        }
        log.apply_next();
        log.until_held(IN_FLIGHT).await;
        log.apply_next();
        log.apply_next();
        assert!(matches!(first.await.unwrap(), Ok(Outcome::Accepted(_))));
        for p in proposed {
            assert!(matches!(p.outcome().await, Ok(Outcome::Accepted(_))));
        }
        assert_eq!(log.written_allocs(), vec![1, 2, 3, 4, 99, 5]);
    }

    /// While leading, an entry waits up to the leader's bound, no longer.
    #[tokio::test(start_paused = true)]
    async fn a_leaders_entry_waits_its_longer_bound() {
        let log = Held::default();
        log.leads.store(true, Ordering::SeqCst);
        let proposer = Proposer::start_on(log.clone(), 8, || 0, |_| {});
        let started = tokio::time::Instant::now();
        let err = proposer.propose(command()).await.unwrap_err();
        let waited = started.elapsed();
        assert!(waited >= NO_OUTCOME_LEADING && waited < NO_OUTCOME_LEADING + Duration::from_secs(1), "{waited:?}");
        assert!(err.to_string().contains("the write did not complete: no outcome after 10"), "{err}");
    }
}
