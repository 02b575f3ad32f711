//! The gRPC `HistoryService` that `muster history`, `muster usage` and the
//! peers' catch-up call, and the history's export for backups.

use std::sync::Arc;

use muster_core::history::{AttemptRecord, JobRecord};
use muster_history::{Filter, Group, HistoryStore};
use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::history_service_server::HistoryService;
use tonic::{Request, Response, Status};

use super::convert::alloc_status_to_proto;
use crate::server::history::{FETCH_LIMIT, MAX_HISTORY_PAGE, lag};
use crate::server::raft::Consensus;
use crate::sm::AllocStatus;

/// The gRPC `HistoryService`.
pub struct HistoryApi {
    shared: Consensus,
    store: Arc<HistoryStore>,
}

impl HistoryApi {
    /// The service over the replica's consensus and its history store.
    pub fn new(shared: Consensus, store: Arc<HistoryStore>) -> HistoryApi {
        HistoryApi { shared, store }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&HistoryStore) -> Result<T, muster_history::HistoryError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| Status::internal(format!("job history: {e}")))?
            .map_err(|e| Status::internal(e.to_string()))
    }

    async fn missing(&self) -> Result<(u64, u64), Status> {
        let shared = self.shared.clone();
        self.blocking(move |s| lag(&shared, s)).await
    }
}

fn status_filter(raw: i32) -> Result<Option<AllocStatus>, Status> {
    match super::convert::alloc_status_filter(raw)? {
        None => Ok(None),
        Some(s) if s.is_terminal() => Ok(Some(s)),
        Some(s) => Err(Status::invalid_argument(format!(
            "invalid status: the history holds finished allocations only (done, failed, cancelled), not {}",
            s.as_str()
        ))),
    }
}

/// The wire form of a record.
pub fn record_to_proto(r: &JobRecord) -> v1::HistoryRecord {
    v1::HistoryRecord {
        seq: r.seq,
        id: r.id,
        owner: r.owner.clone(),
        vcluster: r.vcluster.clone(),
        preemption_class: u32::from(r.class),
        priority: r.priority,
        gang_size: r.gang_size,
        resources: Some(v1::Resources {
            gpus: r.resources.gpus,
            vram_mb: r.resources.vram_mb,
            mem_mb: r.resources.mem_mb,
            cpus: r.resources.cpus,
        }),
        command: r.command.clone(),
        submit_time_ms: r.submit_ms,
        start_time_ms: r.start_ms.unwrap_or(0),
        end_time_ms: r.end_ms,
        status: alloc_status_to_proto(r.status) as i32,
        reason: r.reason.clone(),
        preemptions: r.preemptions,
        watchdog_trips: r.watchdog_trips,
        gpu_seconds: r.gpu_seconds,
        attempts: r.attempts.iter().map(attempt_to_proto).collect(),
        idempotency_key: r.idempotency_key.clone().unwrap_or_default(),
        array_id: r.array.map_or(0, |(a, _)| a),
        array_index: r.array.map_or(0, |(_, i)| i),
        waits: super::convert::waits_to_proto(&r.waits, r.end_ms),
        waits_dropped: r.waits.dropped,
    }
}

fn attempt_to_proto(a: &AttemptRecord) -> v1::HistoryAttempt {
    v1::HistoryAttempt {
        task: a.task,
        attempt: a.run,
        node_id: a.node.clone(),
        start_ms: a.start_ms,
        end_ms: a.end_ms,
        outcome: a.end.as_str().to_string(),
        exit_code: a.exit_code,
        gpu_seconds: a.gpu_seconds,
        preempted: a.preempted,
        watchdog: a.watchdog.map(|w| w.as_str().to_string()).unwrap_or_default(),
        usage: a.usage.as_ref().map(super::convert::usage_to_proto),
    }
}

/// Times, ids and sequence numbers are stored as SQLite integers (i64): a
/// value above i64::MAX would wrap negative in the query and match
/// everything or nothing, so it is refused, naming the field.
fn stored_range(field: &str, v: u64) -> Result<(), Status> {
    if v > i64::MAX as u64 {
        return Err(Status::invalid_argument(format!("invalid {field}: {v} is above the maximum of {}", i64::MAX)));
    }
    Ok(())
}

#[tonic::async_trait]
impl HistoryService for HistoryApi {
    async fn list_history(&self, req: Request<v1::HistoryQuery>) -> Result<Response<v1::HistoryPage>, Status> {
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        for (field, v) in [
            ("id", q.id),
            ("since_ms", q.since_ms),
            ("until_ms", q.until_ms),
            ("after_seq", q.after_seq),
            ("array_id", q.array_id),
        ] {
            stored_range(field, v)?;
        }
        let limit = match q.limit {
            0 => 1_000,
            n if n > MAX_HISTORY_PAGE => {
                return Err(Status::invalid_argument(format!(
                    "invalid limit: {n} is above the maximum of {MAX_HISTORY_PAGE}"
                )));
            }
            n => n,
        };
        if q.until_ms != 0 && q.until_ms <= q.since_ms {
            return Err(Status::invalid_argument("invalid until_ms: it must be after since_ms"));
        }
        let filter = Filter {
            id: (q.id != 0).then_some(q.id),
            owner: (!q.owner.is_empty()).then_some(q.owner),
            vcluster: (!q.vcluster.is_empty()).then_some(q.vcluster),
            array: (q.array_id != 0).then_some(q.array_id),
            status: status_filter(q.status)?,
            since_ms: (q.since_ms != 0).then_some(q.since_ms),
            until_ms: (q.until_ms != 0).then_some(q.until_ms),
            after_seq: q.after_seq,
            limit,
        };
        let records = self.blocking(move |s| s.list(&filter)).await?;
        let (stored, missing) = self.missing().await?;
        let next_after_seq = if records.len() == limit as usize { records.last().map_or(0, |r| r.seq) } else { 0 };
        Ok(Response::new(v1::HistoryPage {
            records: records.iter().map(record_to_proto).collect(),
            next_after_seq,
            stored,
            missing,
        }))
    }

    async fn usage(&self, req: Request<v1::UsageQuery>) -> Result<Response<v1::UsageReport>, Status> {
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        stored_range("since_ms", q.since_ms)?;
        stored_range("until_ms", q.until_ms)?;
        if q.until_ms <= q.since_ms {
            return Err(Status::invalid_argument("invalid until_ms: it must be after since_ms"));
        }
        let group = match q.group_by.as_str() {
            "owner" => Group::Owner,
            "vcluster" => Group::VCluster,
            "" | "owner,vcluster" | "vcluster,owner" => Group::OwnerAndVCluster,
            "array" => Group::Array,
            other => {
                return Err(Status::invalid_argument(format!(
                    "invalid group_by: {other:?} (owner, vcluster, owner,vcluster or array)"
                )));
            }
        };
        let (since, until) = (q.since_ms, q.until_ms);
        let size = match q.page_size {
            0 => 1000,
            n => n.min(10_000),
        } as usize;
        // A page starts after the (owner, vcluster, array) its token names
        // (newlines between them: no name may hold one).
        let bad_token = || Status::invalid_argument("invalid page_token: not one this server gave");
        let after = match q.page_token.split('\n').collect::<Vec<_>>().as_slice() {
            [""] => None,
            [o, v] => Some((o.to_string(), v.to_string(), 0)),
            [o, v, a] => Some((o.to_string(), v.to_string(), a.parse::<u64>().map_err(|_| bad_token())?)),
            _ => return Err(bad_token()),
        };
        let rows = self.blocking(move |s| s.usage(since, until, group)).await?;
        let (_, missing) = self.missing().await?;
        let (mut page, mut bytes, mut more) = (Vec::new(), 0usize, false);
        let past = |r: &muster_history::UsageRow| {
            after.as_ref().is_none_or(|a| (&r.owner, &r.vcluster, r.array) > (&a.0, &a.1, a.2))
        };
        for r in rows.into_iter().filter(past) {
            let row = v1::UsageRow {
                owner: r.owner,
                vcluster: r.vcluster,
                array_id: r.array,
                jobs: r.jobs,
                done: r.done,
                failed: r.failed,
                cancelled: r.cancelled,
                gpu_seconds: r.gpu_seconds,
                cpu_ms: r.cpu_ms,
                peak_memory_bytes: r.peak_memory_bytes,
                oom_killed: r.oom_killed,
            };
            bytes += prost::Message::encoded_len(&row);
            if !page.is_empty() && (page.len() == size || bytes > super::client::MAX_PAGE_BYTES) {
                more = true;
                break;
            }
            page.push(row);
        }
        let next_page_token = match page.last() {
            Some(r) if more => format!("{}\n{}\n{}", r.owner, r.vcluster, r.array_id),
            _ => String::new(),
        };
        Ok(Response::new(v1::UsageReport { rows: page, since_ms: since, until_ms: until, missing, next_page_token }))
    }

    async fn fetch_records(
        &self,
        req: Request<v1::FetchRecordsRequest>,
    ) -> Result<Response<v1::FetchRecordsResponse>, Status> {
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        stored_range("first", q.first)?;
        stored_range("last", q.last)?;
        if q.first == 0 || q.last < q.first {
            return Err(Status::invalid_argument("invalid first/last: a range 1 ≤ first ≤ last"));
        }
        let records = self.blocking(move |s| s.by_seq(q.first, q.last, FETCH_LIMIT)).await?;
        let bytes = postcard::to_stdvec(&records).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(v1::FetchRecordsResponse { records: bytes }))
    }
}

/// A consistent copy of the whole history database, as bytes (for a
/// backup): written to a temporary file beside it, read, removed.
pub fn export(store: &HistoryStore) -> Result<Vec<u8>, String> {
    let dir = store.path().parent().unwrap_or(std::path::Path::new("."));
    let tmp = dir.join(format!("history-backup-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = store
        .backup_to(&tmp)
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::read(&tmp).map_err(|e| format!("{}: {e}", tmp.display())));
    let _ = std::fs::remove_file(&tmp);
    result
}
