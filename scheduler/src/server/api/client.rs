//! `muster.v1.AllocationService`: submit, get, list and cancel allocations.
//!
//! Writes go through the group-commit proposer on the leader; a follower
//! answers UNAVAILABLE with the leader in metadata. Reads are linearizable:
//! the leader confirms it still leads and waits until its state machine has
//! applied everything committed before answering.

use std::sync::Arc;

use muster_history::HistoryStore;
use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::allocation_service_server::AllocationService;
use muster_tls::Role;
use tonic::{Request, Response, Status};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::convert;
use super::convert::{
    alloc_status_filter, alloc_status_to_proto, alloc_to_proto, describe_event, propose_error_to_status,
    rejection_to_status, spec_from_proto,
};
use crate::server::leader::LeaderWork;
use crate::server::policies::{BugInjector, Policies};
use crate::server::raft::Consensus;
use crate::sm::{AllocId, Command, DEFAULT_VCLUSTER, Event, Outcome, VClusterType};

/// Most allocations one `List` page returns.
pub const MAX_PAGE_SIZE: u32 = 1000;
const DEFAULT_PAGE_SIZE: u32 = 100;
/// Encoded bytes after which a page of allocations ends (one allocation at
/// its field limits is ~150 KiB, so a page is never near the 4 MiB limit).
pub const MAX_PAGE_BYTES: usize = 2 << 20;

/// The client API of one replica.
pub struct ClientApi {
    pub(super) s: Consensus,
    work: LeaderWork,
    policies: Arc<Policies>,
    bugs: Arc<BugInjector>,
    /// This replica's job history: compacted allocations are answered from
    /// their records.
    history: Arc<HistoryStore>,
}

impl ClientApi {
    /// The client API over a replica's shared parts, its settings, its job
    /// history and its injected bug (tests only).
    pub fn new(
        s: Consensus,
        work: LeaderWork,
        policies: Arc<Policies>,
        history: Arc<HistoryStore>,
        bugs: Arc<BugInjector>,
    ) -> Self {
        ClientApi { s, work, policies, bugs, history }
    }
}

/// An allocation as the live state holds it: whole, or compacted (with its
/// array's spec for an element).
enum Held {
    Whole(Box<v1::Allocation>),
    Compacted { array_spec: Option<Box<crate::sm::AllocSpec>> },
}

fn held(st: &crate::sm::State, id: AllocId) -> Result<Held, Status> {
    if let Some(a) = st.alloc(id) {
        return Ok(Held::Whole(Box::new(alloc_to_proto(a, st))));
    }
    st.compacted(id).ok_or_else(|| alloc_missing(st, id))?;
    let array_spec = st.array_of(id).map(|(array, _)| Box::new(array.spec.clone()));
    Ok(Held::Compacted { array_spec })
}

impl ClientApi {
    /// The injected bug: answers with the id the submit will get, and
    /// proposes it a second later.
    fn ack_before_commit(&self, spec: crate::sm::AllocSpec) -> v1::SubmitResponse {
        let pending = self.bugs.hold_unproposed();
        let id = self.s.reader().read(|st| st.next_alloc_id()) + pending;
        let (s, work, bugs) = (self.s.clone(), self.work.clone(), self.bugs.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let _ = s.proposer().propose(Command::Submit { spec }).await;
            bugs.release_unproposed();
            work.wake_admission();
        });
        v1::SubmitResponse { id, duplicate: false, plan: None, array_count: 0 }
    }
}

/// How often an idle stream checks that its caller's token still works
/// (every message is checked as well).
pub(crate) const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The owner a submit is recorded under: an admin may name anyone (itself
/// when it names nobody); a client is always itself, and naming someone else
/// is refused; with `--insecure` nobody is identified, so the request's
/// owner stands (`anonymous` when empty).
pub(super) fn bind_owner(caller: &muster_tls::Caller, asked: &str) -> Result<String, Status> {
    match caller.role() {
        Some(Role::Admin(name)) => Ok(if asked.is_empty() { name.clone() } else { asked.to_string() }),
        Some(Role::Client(name)) if asked.is_empty() || asked == name => Ok(name.clone()),
        Some(Role::Client(name)) => Err(Status::permission_denied(format!(
            "invalid spec.owner: client {name} submits as itself, not as {asked:?}; only admins name another owner \
             (leave --owner out)"
        ))),
        Some(other) => Err(Status::permission_denied(format!("{other} may not submit"))),
        None => Ok(if asked.is_empty() { "anonymous".to_string() } else { asked.to_string() }),
    }
}

/// Whether `caller` may cancel allocation `id` of `owner`: admins any, a
/// client only its own.
fn may_cancel(caller: &muster_tls::Caller, id: AllocId, owner: &str) -> Result<(), Status> {
    match caller.role() {
        Some(Role::Client(name)) if name != owner => Err(Status::permission_denied(format!(
            "allocation {id} belongs to {owner}; client {name} may cancel only its own allocations"
        ))),
        Some(Role::Admin(_) | Role::Client(_)) | None => Ok(()),
        Some(other) => Err(Status::permission_denied(format!("{other} may not cancel"))),
    }
}

/// NOT_FOUND for an allocation the live state does not hold: never
/// submitted, or finished and forgotten after the retention window (its
/// record is in the job history).
pub(crate) fn alloc_missing(st: &crate::sm::State, id: u64) -> Status {
    if st.array(id).is_some() {
        return Status::not_found(format!("{id} is a job array, not an allocation (muster alloc get {id} shows it)"));
    }
    if st.workflow(id).is_some() {
        return Status::not_found(format!("{id} is a workflow, not an allocation (muster alloc get {id} shows it)"));
    }
    if let Some((array, position)) = st.array_of(id) {
        let index = array.indices.index_at(position).unwrap_or_default();
        let why = if array.is_skipped(position) { "was cancelled before it was started" } else { "is not started yet" };
        return Status::not_found(format!("allocation {id}, element {index} of array {}, {why}", array.id));
    }
    if let Some(c) = st.compacted(id) {
        return Status::not_found(format!(
            "allocation {id} {} and was compacted after the detail window (muster server --detail-retention): \
             muster alloc get {id} shows its record",
            c.status.as_str()
        ));
    }
    if st.was_forgotten(id) {
        Status::not_found(format!(
            "allocation {id} finished and left the live state after the retention window (muster server \
             --retention); its record is in the job history: muster history --id {id}"
        ))
    } else {
        Status::not_found(format!("allocation {id} does not exist"))
    }
}

/// NOT_FOUND for an id that names no array the live state holds.
fn array_missing(st: &crate::sm::State, id: u64) -> Status {
    if st.alloc(id).is_some() || st.array_of(id).is_some() {
        Status::not_found(format!("allocation {id} is not an array"))
    } else if st.was_forgotten(id) {
        Status::not_found(format!("{id} finished and left the live state after the retention window"))
    } else {
        Status::not_found(format!("array {id} does not exist"))
    }
}

fn array_or_missing(st: &crate::sm::State, id: u64) -> Result<v1::JobArray, Status> {
    st.array(id).map(|a| convert::array_to_proto(a, st)).ok_or_else(|| array_missing(st, id))
}

/// How long a submit waits for a registry to resolve its image's tag.
pub(super) const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The node and number of the attempt of a held allocation's task whose log
/// a `logs` call asks for (0: its latest).
fn attempt_node(st: &crate::sm::State, q: &v1::LogsRequest) -> Result<(crate::sm::NodeId, u32), Status> {
    let a = st.alloc(q.id).ok_or_else(|| alloc_missing(st, q.id))?;
    let t = a
        .tasks
        .get(q.task as usize)
        .ok_or_else(|| Status::not_found(format!("allocation {} has no task {}", q.id, q.task)))?;
    if t.runs == 0 {
        return Err(Status::failed_precondition(format!("task {} of allocation {} has not started", q.task, q.id)));
    }
    if q.attempt > t.runs {
        return Err(Status::not_found(format!("task {} has had {} attempts", q.task, t.runs)));
    }
    let attempt = if q.attempt == 0 { t.runs } else { q.attempt };
    // Each attempt's log lives on the node it ran on.
    let slot = t
        .run_node(attempt)
        .ok_or_else(|| Status::not_found(format!("the node of attempt {attempt} of task {} is not known", q.task)))?;
    Ok((st.node(slot).id.clone(), attempt))
}

/// The same for a compacted allocation, from its job-history record.
fn last_attempt_node(
    r: &muster_core::history::JobRecord,
    task: u32,
    attempt: u32,
) -> Result<(crate::sm::NodeId, u32), Status> {
    if task >= r.gang_size {
        return Err(Status::not_found(format!("allocation {} has no task {task}", r.id)));
    }
    let runs = r.attempts.iter().filter(|a| a.task == task).map(|a| a.run).max().unwrap_or(0);
    if runs == 0 {
        return Err(Status::failed_precondition(format!("task {task} of allocation {} never started", r.id)));
    }
    if attempt > runs {
        return Err(Status::not_found(format!("task {task} has had {runs} attempts")));
    }
    let attempt = if attempt == 0 { runs } else { attempt };
    let node = r.attempts.iter().find(|a| a.task == task && a.run == attempt).map(|a| a.node.clone());
    let node = node.ok_or_else(|| {
        Status::not_found(format!("the node of attempt {attempt} of task {task} is not in the record"))
    })?;
    Ok((crate::sm::NodeId(node), attempt))
}

impl ClientApi {
    /// The job-history record of compacted allocation `id`, read off the
    /// async workers.
    async fn record(&self, id: AllocId) -> Result<muster_core::history::JobRecord, Status> {
        let store = self.history.clone();
        let only = muster_history::Filter { id: Some(id), limit: 1, ..Default::default() };
        let records = tokio::task::spawn_blocking(move || store.list(&only))
            .await
            .map_err(|e| Status::internal(format!("job history: {e}")))?
            .map_err(|e| Status::internal(format!("job history: {e}")))?;
        records.into_iter().find(|r| r.id == id).ok_or_else(|| {
            Status::unavailable(format!(
                "allocation {id} finished and was compacted, and this replica's job history has not stored its \
                 record yet; retry shortly"
            ))
        })
    }

    /// Allocation `id` in its wire form: from the live state, or from the
    /// job history once compacted.
    async fn allocation(&self, id: AllocId) -> Result<v1::Allocation, Status> {
        match self.s.reader().read(|st| held(st, id))? {
            Held::Whole(a) => Ok(*a),
            Held::Compacted { array_spec } => {
                let r = self.record(id).await?;
                Ok(convert::record_to_alloc_proto(&r, array_spec.as_deref()))
            }
        }
    }

    /// Wakes the leader's admission (something new may be placed).
    pub(super) fn wake_admission(&self) {
        self.work.wake_admission();
    }

    /// Pins a submitted image tag to the digest it names now, so every task
    /// and every retry runs the same bytes. An image the registry says does
    /// not exist is refused before the log; when the registry cannot be
    /// reached or will not tell this scheduler (credentials only the agents
    /// hold), the tag stays as given and each agent resolves it at its pull.
    pub(super) async fn pin_image(&self, spec: &mut crate::sm::AllocSpec) -> Result<(), Status> {
        let (Some(registry), Some(c)) = (self.policies.registry(), spec.container.as_mut()) else { return Ok(()) };
        if c.image.digest.is_some() {
            return Ok(());
        }
        let resolved = tokio::time::timeout(RESOLVE_TIMEOUT, registry.resolve(&c.image)).await;
        match resolved {
            Ok(Ok(digest)) => {
                metrics::counter!("muster_image_tags_pinned_total").increment(1);
                c.image = c.image.pinned(&digest);
                Ok(())
            }
            Ok(Err(muster_registry::PullError::NotFound(why))) => {
                Err(Status::invalid_argument(format!("invalid spec.image: {} is not in its registry: {why}", c.image)))
            }
            Ok(Err(e)) => {
                tracing::info!(image = %c.image, error = %e, "image tag left for the agents to resolve");
                Ok(())
            }
            Err(_) => {
                tracing::info!(image = %c.image, "image tag left for the agents to resolve: the registry is slow");
                Ok(())
            }
        }
    }

    /// A submitted spec as the state takes it: its owner bound to the
    /// caller, its class's default walltime when it gives none, and its
    /// vCluster's type.
    pub(super) fn prepare_spec(
        &self,
        caller: &muster_tls::Caller,
        proto: Option<v1::AllocationSpec>,
    ) -> Result<crate::sm::AllocSpec, Status> {
        let limits = self.s.reader().read(|st| st.limits().clone());
        let mut proto = proto;
        if let Some(p) = proto.as_mut() {
            p.owner = bind_owner(caller, &p.owner)?;
        }
        // A submit without a walltime takes its class's default, if one is set.
        if let Some(p) = proto.as_mut()
            && p.walltime_s == 0
            && let Some(w) = u8::try_from(p.preemption_class).ok().and_then(|c| self.policies.walltime_default(c))
        {
            p.walltime_s = w;
        }
        // The allocation's type is its vCluster's (the seed's per-type
        // preemption policy belongs to the vCluster): taken when left out,
        // refused when it names another.
        if let Some(p) = proto.as_mut() {
            let name = if p.vcluster.is_empty() { DEFAULT_VCLUSTER } else { p.vcluster.as_str() };
            if let Some(t) = self.s.reader().read(|st| st.vcluster(name).map(|v| v.spec.vtype)) {
                if p.vcluster_type.is_empty() {
                    p.vcluster_type = t.as_str().to_string();
                } else if VClusterType::parse(&p.vcluster_type).is_some_and(|named| named != t) {
                    return Err(Status::invalid_argument(format!(
                        "invalid spec.vcluster_type: vCluster {name} is of type {}, not {}; leave the type out to \
                         take the vCluster's",
                        t.as_str(),
                        p.vcluster_type
                    )));
                }
            }
        }
        spec_from_proto(proto, &limits)
    }
}

#[tonic::async_trait]
impl AllocationService for ClientApi {
    type WatchStream = ReceiverStream<Result<v1::AllocationEvent, Status>>;
    type LogsStream = ReceiverStream<Result<v1::LogChunk, Status>>;

    async fn logs(&self, req: Request<v1::LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        self.s.linearizable().await?;
        let (node, attempt) = if self.s.reader().read(|st| st.compacted(q.id).is_some()) {
            last_attempt_node(&self.record(q.id).await?, q.task, q.attempt)?
        } else {
            self.s.reader().read(|st| attempt_node(st, &q))?
        };
        let (tx, rx) = mpsc::channel(16);
        let (s, work) = (self.s.clone(), self.work.clone());
        tokio::spawn(async move {
            let mut offset = 0;
            loop {
                if let Err(status) = super::auth::stream_still_authorised(&s, &caller) {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                let fetch = v1::FetchLogs {
                    request_id: 0,
                    alloc_id: q.id,
                    task_index: q.task,
                    attempt,
                    stderr: q.stderr,
                    offset,
                    max_bytes: 64 * 1024,
                };
                let chunk = match work.agents().fetch_logs(&node, fetch).await {
                    Ok(c) => c,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                if !chunk.error.is_empty() {
                    let _ = tx.send(Err(Status::not_found(chunk.error))).await;
                    return;
                }
                let empty = chunk.data.is_empty();
                offset += chunk.data.len() as u64;
                if !empty && tx.send(Ok(v1::LogChunk { data: chunk.data })).await.is_err() {
                    return;
                }
                if chunk.eof || (empty && !q.follow) {
                    return;
                }
                if empty {
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn watch(&self, req: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        self.s.linearizable().await?;
        let compacted = self.s.reader().read(|st| match (st.alloc(q.id), st.compacted(q.id)) {
            (Some(_), _) => Ok(None),
            (None, Some(c)) => Ok(Some((c.status, c.end_ms))),
            (None, None) => Err(alloc_missing(st, q.id)),
        })?;
        if let Some((status, end)) = compacted {
            // Its events went with the detail: one event names how it
            // ended, and the watch ends (a finished watch always does).
            let (tx, rx) = mpsc::channel(1);
            let event = v1::AllocationEvent {
                id: q.id,
                revision: 0,
                time_ms: end,
                kind: "compacted".to_string(),
                detail: format!(
                    "{} at {}; its events were compacted after the detail window (muster history --id {})",
                    status.as_str(),
                    convert::format_time_ms(end),
                    q.id
                ),
                status: alloc_status_to_proto(status) as i32,
                truncated: true,
            };
            tx.send(Ok(event)).await.expect("a fresh channel has room");
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        let (tx, rx) = mpsc::channel(64);
        let s = self.s.clone();
        // After the first linearizable read, this replica's applied state
        // only moves forward along the committed log, so serving from it is
        // correct even if leadership moves meanwhile.
        tokio::spawn(async move {
            let mut cursor = q.from_revision;
            let mut first = true;
            let mut metrics = s.raft().metrics();
            loop {
                if let Err(status) = super::auth::stream_still_authorised(&s, &caller) {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                let read = s.reader().read(|st| {
                    // Forgotten only once finished, and a finished watch has
                    // ended, unless retention outran this stream's first read.
                    let Some(a) = st.alloc(q.id) else { return Err(alloc_missing(st, q.id)) };
                    let status = alloc_status_to_proto(a.status) as i32;
                    let oldest = a.history.front().map_or(a.revision + 1, |h| h.revision);
                    let truncated = first && cursor + 1 < oldest;
                    let batch: Vec<v1::AllocationEvent> = a
                        .history
                        .iter()
                        .filter(|h| h.revision > cursor)
                        .enumerate()
                        .map(|(i, h)| {
                            let (kind, mut detail) = describe_event(&h.event);
                            // A watch names what a dependent waits for, and
                            // while it still waits, where that stands now.
                            if matches!(h.event, Event::Submitted { .. })
                                && h.status == Some(crate::sm::AllocStatus::Waiting)
                            {
                                detail = if a.status == crate::sm::AllocStatus::Waiting {
                                    let now = s.now(st);
                                    format!("{detail}; {}", crate::policy::waiting_summary(st, &a.spec.after, now))
                                } else {
                                    format!("{detail}; waiting for {}", a.spec.after.describe())
                                };
                            }
                            v1::AllocationEvent {
                                id: q.id,
                                revision: h.revision,
                                time_ms: h.time_ms,
                                kind: kind.to_string(),
                                detail,
                                status: h.status.map_or(status, |s| alloc_status_to_proto(s) as i32),
                                truncated: truncated && i == 0,
                            }
                        })
                        .collect();
                    Ok((batch, a.status.is_terminal()))
                });
                let (batch, ended) = match read {
                    Ok(read) => read,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                for e in batch {
                    cursor = e.revision;
                    first = false;
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                if ended {
                    return;
                }
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() {
                        let _ = tx.send(Err(Status::unavailable("the replica is shutting down"))).await;
                        return;
                    },
                    // An idle stream still notices its token expire.
                    _ = tokio::time::sleep(TOKEN_RECHECK) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn submit(&self, req: Request<v1::SubmitRequest>) -> Result<Response<v1::SubmitResponse>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let req = req.into_inner();
        let mut spec = self.prepare_spec(&caller, req.spec)?;
        self.pin_image(&mut spec).await?;
        let array = match req.array.as_str() {
            "" => None,
            expr => Some(
                crate::sm::ArrayIndices::parse(expr)
                    .map_err(|e| Status::invalid_argument(format!("invalid array: {e}")))?,
            ),
        };
        let corr = (req.after_corr != 0).then_some(req.after_corr);
        if corr.is_some() && array.is_none() {
            return Err(Status::invalid_argument(
                "invalid after_corr: only an array (--array) pairs its elements with another array's",
            ));
        }
        let secrets = crate::sm::Secrets(req.secrets.into_iter().collect());
        crate::sm::validate_secrets(&spec, &secrets).map_err(|r| rejection_to_status(&r))?;
        self.s.reader().read(|st| st.check_job_store(&spec)).map_err(|r| rejection_to_status(&r))?;
        // Each dependency names an existing, older allocation (apply checks
        // again: ids only grow, and a forgotten one's tombstone may go). A
        // follower's state may lag the allocation just made: it proposes,
        // and is told to redirect, as for the idempotency check below.
        if self.s.is_leader() {
            self.s.reader().read(|st| st.check_dependencies(&spec.after)).map_err(|r| rejection_to_status(&r))?;
            if let (Some(indices), Some(corr)) = (&array, corr) {
                self.s.reader().read(|st| st.check_corr(&spec, indices, corr)).map_err(|r| rejection_to_status(&r))?;
            }
        }
        // A retried submit is answered from the state, and a key reused with
        // another spec is refused, before anything is proposed.
        if !req.dry_run && self.s.is_leader() {
            let before = self.s.reader().read(|st| match &array {
                Some(indices) => st.array_submitted_before(&spec, indices, corr),
                None => st.submitted_before(&spec),
            });
            let array_count = array.as_ref().map_or(0, |a| a.count());
            match before {
                Some(Ok(id)) => {
                    return Ok(Response::new(v1::SubmitResponse { id, duplicate: true, plan: None, array_count }));
                }
                Some(Err(r)) => return Err(rejection_to_status(&r)),
                None => {}
            }
        }
        // What no registered node can ever run is refused before the log,
        // unless the caller expects nodes that are not here yet.
        if !req.dry_run
            && !req.queue_if_unsatisfiable
            && let Some(why) = self.s.reader().read(|st| crate::policy::unsatisfiable(st, &spec))
        {
            return Err(Status::failed_precondition(format!(
                "unsatisfiable: no registered node can ever run it: {why} (submit with --queue-if-unsatisfiable, \
                 queue_if_unsatisfiable in the API, to queue it for nodes yet to join)"
            )));
        }
        if req.dry_run {
            self.s.linearizable().await?;
            let cfg = self.policies.preemption();
            let plan = self.s.reader().read(|st| {
                let now = self.s.now(st);
                convert::explanation_to_proto(crate::policy::explain_spec(st, &spec, now, &cfg), st, now)
            });
            return Ok(Response::new(v1::SubmitResponse { id: 0, duplicate: false, plan: Some(plan), array_count: 0 }));
        }
        if self.bugs.has(crate::server::policies::InjectedBug::AckBeforeCommit) {
            return Ok(Response::new(self.ack_before_commit(spec)));
        }
        let cmd = match array {
            Some(indices) => Command::SubmitArray { spec, indices, corr, secrets },
            None if secrets.is_empty() => Command::Submit { spec },
            None => Command::SubmitWithSecrets { spec, secrets },
        };
        let propose = self.s.proposer().propose(cmd);
        let outcome = if self.bugs.has(crate::server::policies::InjectedBug::RefuseSlowWrites) {
            // The bug: a write that is merely slow is refused, though it
            // stays proposed and may well commit.
            match tokio::time::timeout(crate::server::policies::SLOW_WRITE_REFUSED_AFTER, propose).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(Status::aborted("the write was refused: it took too long")),
            }
        } else {
            propose.await
        };
        match outcome.map_err(propose_error_to_status)? {
            Outcome::Accepted(events) => match events.as_slice() {
                [Event::Submitted { alloc, duplicate }, ..] => {
                    self.work.wake_admission();
                    Ok(Response::new(v1::SubmitResponse {
                        id: *alloc,
                        duplicate: *duplicate,
                        plan: None,
                        array_count: 0,
                    }))
                }
                [Event::ArraySubmitted { array, count, duplicate }, ..] => {
                    self.work.wake_admission();
                    Ok(Response::new(v1::SubmitResponse {
                        id: *array,
                        duplicate: *duplicate,
                        plan: None,
                        array_count: *count,
                    }))
                }
                other => Err(Status::internal(format!("unexpected submit events {other:?}"))),
            },
            Outcome::Rejected(r) => Err(rejection_to_status(&r)),
        }
    }

    async fn cancel(&self, req: Request<v1::CancelRequest>) -> Result<Response<v1::Allocation>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        let id = q.id;
        if id == 0 {
            return Err(Status::invalid_argument("invalid id: allocation ids start at 1"));
        }
        let cmd = match q.indices.as_str() {
            "" => Command::CancelAllocation { alloc: id },
            expr => {
                let mut indices = crate::sm::ArrayIndices::parse(expr)
                    .map_err(|e| Status::invalid_argument(format!("invalid indices: {e}")))?;
                if indices.throttle != 0 {
                    return Err(Status::invalid_argument("invalid indices: a throttle (%N) has no place in a cancel"));
                }
                indices.throttle = 0;
                Command::CancelArrayElements { array: id, indices }
            }
        };
        // Judged on the leader's state before proposing: a cancel that apply
        // would refuse, or that this caller may not make, writes nothing.
        // (An allocation's owner never changes; apply checks the rest again.)
        // A follower's state may lag: it proposes, and is told to redirect.
        if self.s.is_leader() {
            self.s.reader().read(|st| {
                if let Some(c) = st.compacted(id) {
                    let r = crate::sm::Rejection::AlreadyTerminal { alloc: id, status: c.status };
                    return Err(rejection_to_status(&r));
                }
                let owner = st.owner_of(id).ok_or_else(|| alloc_missing(st, id))?;
                may_cancel(&caller, id, owner)?;
                if let Command::CancelArrayElements { indices, .. } = &cmd {
                    let array = st.array(id).ok_or_else(|| {
                        Status::invalid_argument(format!("invalid indices: allocation {id} is not an array"))
                    })?;
                    if let Some(missing) = indices.iter().find(|&i| array.indices.position_of(i).is_none()) {
                        return Err(Status::invalid_argument(format!(
                            "invalid indices: array {id} has no element with index {missing}"
                        )));
                    }
                }
                st.precheck(&cmd).map_err(|r| rejection_to_status(&r))
            })?;
        }
        let outcome = self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)?;
        if let Outcome::Rejected(r) = outcome {
            return Err(rejection_to_status(&r));
        }
        self.work.wake_admission();
        self.s
            .reader()
            .read(|st| match st.alloc(id) {
                Some(a) => Ok(alloc_to_proto(a, st)),
                // A workflow: its id, cancelled.
                None if st.workflow(id).is_some() => Ok(v1::Allocation {
                    id,
                    status: alloc_status_to_proto(crate::sm::AllocStatus::Cancelled) as i32,
                    ..Default::default()
                }),
                // An array, or an element cancelled before it existed: the
                // allocation form of what is known.
                None => st.array(id).or_else(|| st.array_of(id).map(|(a, _)| a)).map_or_else(
                    || Err(alloc_missing(st, id)),
                    |array| {
                        Ok(v1::Allocation {
                            id,
                            spec: Some(convert::spec_to_proto(&array.spec)),
                            submit_time_ms: array.submit_time_ms,
                            status: alloc_status_to_proto(crate::sm::AllocStatus::Cancelled) as i32,
                            array_id: array.id,
                            ..Default::default()
                        })
                    },
                ),
            })
            .map(Response::new)
    }

    async fn explain(&self, req: Request<v1::GetRequest>) -> Result<Response<v1::Explanation>, Status> {
        req.get_ref().check_bounds()?;
        let id = req.into_inner().id;
        self.s.linearizable().await?;
        let (cfg, admission) = (self.policies.preemption(), self.policies.admission());
        let agents = self.work.agents();
        let e = self.s.reader().read(|st| {
            let now = self.s.now(st);
            let mut e = crate::policy::explain_with_admission(st, id, now, &cfg, &admission)
                .map(|e| convert::explanation_to_proto(e, st, now))
                .ok_or_else(|| alloc_missing(st, id))?;
            // Pulls under way, as the agents of the tasks' own nodes said.
            let placed = |task: u32, node: &crate::sm::NodeId, epoch: u64| {
                st.alloc(id).and_then(|a| a.tasks.get(task as usize)).is_some_and(|t| {
                    t.status == crate::sm::TaskStatus::Running
                        && t.reservation_epoch == epoch
                        && t.node.is_some_and(|slot| st.node(slot).id == *node)
                })
            };
            e.pulls = agents
                .pulls_of(id, placed)
                .into_iter()
                .map(|(node, p)| v1::ImagePullProgress {
                    task: p.task.map_or(0, |t| t.task_index),
                    node_id: node.to_string(),
                    image: p.image,
                    done_bytes: p.done_bytes,
                    total_bytes: p.total_bytes,
                    elapsed_ms: p.elapsed_ms,
                })
                .collect();
            Ok::<_, Status>(e)
        })?;
        Ok(Response::new(e))
    }

    async fn get(&self, req: Request<v1::GetRequest>) -> Result<Response<v1::Allocation>, Status> {
        req.get_ref().check_bounds()?;
        let id = req.into_inner().id;
        self.s.linearizable().await?;
        self.allocation(id).await.map(Response::new)
    }

    async fn submit_workflow(
        &self,
        req: Request<v1::SubmitWorkflowRequest>,
    ) -> Result<Response<v1::SubmitWorkflowResponse>, Status> {
        self.submit_workflow_request(req).await
    }

    async fn get_workflow(&self, req: Request<v1::GetRequest>) -> Result<Response<v1::WorkflowInfo>, Status> {
        self.get_workflow_request(req).await
    }

    async fn get_array(&self, req: Request<v1::GetRequest>) -> Result<Response<v1::JobArray>, Status> {
        req.get_ref().check_bounds()?;
        let id = req.into_inner().id;
        self.s.linearizable().await?;
        self.s.reader().read(|st| array_or_missing(st, id)).map(Response::new)
    }

    async fn set_array_throttle(
        &self,
        req: Request<v1::SetArrayThrottleRequest>,
    ) -> Result<Response<v1::JobArray>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        let by = match caller.role() {
            Some(Role::Client(name) | Role::Admin(name)) => name.clone(),
            Some(other) => return Err(Status::permission_denied(format!("{other} may not change a throttle"))),
            None => "anonymous".to_string(),
        };
        let cmd = Command::SetArrayThrottle { array: q.id, throttle: q.throttle, by };
        if self.s.is_leader() {
            self.s.reader().read(|st| {
                let array = st.array(q.id).ok_or_else(|| array_missing(st, q.id))?;
                may_cancel(&caller, q.id, &array.spec.owner)?;
                if u64::from(q.throttle) > array.count() {
                    return Err(Status::invalid_argument(format!(
                        "invalid throttle: {} is more than array {}'s {} elements (0: no limit)",
                        q.throttle,
                        q.id,
                        array.count()
                    )));
                }
                if let Some(status) = array.final_status() {
                    return Err(rejection_to_status(&crate::sm::Rejection::AlreadyTerminal { alloc: q.id, status }));
                }
                Ok(())
            })?;
        }
        let outcome = self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)?;
        if let Outcome::Rejected(r) = outcome {
            return Err(rejection_to_status(&r));
        }
        self.work.wake_admission();
        self.s.reader().read(|st| array_or_missing(st, q.id)).map(Response::new)
    }

    async fn list(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::ListResponse>, Status> {
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        let status = alloc_status_filter(q.status)?;
        if q.page_size > MAX_PAGE_SIZE {
            return Err(Status::invalid_argument(format!(
                "invalid page_size: {} is above the maximum of {MAX_PAGE_SIZE}",
                q.page_size
            )));
        }
        let page_size = if q.page_size == 0 { DEFAULT_PAGE_SIZE } else { q.page_size } as usize;
        self.s.linearizable().await?;
        let (allocations, more, arrays) = self.s.reader().read(|st| {
            let mut matching = st
                .allocs()
                .range(q.page_token.saturating_add(1)..)
                .map(|(_, a)| a)
                .filter(|a| status.is_none_or(|s| a.status == s))
                .filter(|a| q.owner.is_empty() || a.spec.owner == q.owner)
                .filter(|a| q.preemption_class.is_none_or(|c| u32::from(a.spec.preemption_class) == c))
                .filter(|a| q.expand || st.array_of(a.id).is_none());
            // A page ends at page_size allocations or MAX_PAGE_BYTES encoded,
            // whichever comes first (always one): the response stays well
            // under the 4 MiB message limit whatever the allocations hold.
            let mut page: Vec<v1::Allocation> = Vec::new();
            let mut bytes = 0;
            let mut more = false;
            for a in matching.by_ref() {
                if page.len() == page_size || (!page.is_empty() && bytes >= MAX_PAGE_BYTES) {
                    more = true;
                    break;
                }
                let p = alloc_to_proto(a, st);
                bytes += prost::Message::encoded_len(&p);
                page.push(p);
            }
            // Folded arrays: those whose ids fall within this page.
            let mut arrays = Vec::new();
            if !q.expand {
                let through = if more { page.last().map_or(u64::MAX, |a| a.id) } else { u64::MAX };
                for array in st.arrays().filter(|a| a.id > q.page_token && a.id <= through) {
                    if !q.owner.is_empty() && array.spec.owner != q.owner {
                        continue;
                    }
                    if q.preemption_class.is_some_and(|c| u32::from(array.spec.preemption_class) != c) {
                        continue;
                    }
                    let p = convert::array_to_proto(array, st);
                    // With a status filter, an array is listed when an
                    // element has that status (a pending one counts as
                    // queued).
                    let queued_too = status == Some(crate::sm::AllocStatus::Queued) && p.pending > 0;
                    if status.is_some_and(|s| !p.by_status.contains_key(s.as_str())) && !queued_too {
                        continue;
                    }
                    arrays.push(p);
                }
            }
            (page, more, arrays)
        });
        let next_page_token = if more { allocations.last().map_or(0, |a| a.id) } else { 0 };
        Ok(Response::new(v1::ListResponse { allocations, next_page_token, arrays }))
    }
}
