//! gRPC clients of a chaos run: the workload's, which reaches the replicas
//! through their proxies and follows leader hints like a user's client, and
//! the harness's control path, which talks to each replica's real port
//! (unaffected by partitions) to find the leader and read state.

use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::Code;
use tonic::transport::Channel;

/// How a call ended, as a linearizability checker must see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer<T> {
    /// It took effect, with this result.
    Ok(T),
    /// It certainly did not take effect (refused, or never reached a leader).
    Failed(String),
    /// It may or may not have taken effect (timed out, or the leader lost
    /// its lead after the proposal).
    Unknown(String),
}

/// The harness's own certificate (an admin's): one chaos run at a time per
/// process sets it before any call.
static TLS: std::sync::RwLock<Option<muster_tls::TlsMaterial>> = std::sync::RwLock::new(None);

/// Sets the material every harness connection presents.
pub fn set_tls(tls: Option<muster_tls::TlsMaterial>) {
    *TLS.write().unwrap_or_else(|e| e.into_inner()) = tls;
}

/// A fresh connection to `addr` over mutual TLS, or why not.
pub async fn connect(addr: &str, timeout: Duration) -> Result<Channel, String> {
    let tls = TLS.read().unwrap_or_else(|e| e.into_inner()).clone();
    muster_tls::endpoint(addr, tls.as_ref())
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| format!("{addr}: {e}"))
}

/// The workload's client: tries the leader it last saw, follows hints.
pub struct Client {
    addrs: Vec<String>,
    leader: usize,
    timeout: Duration,
}

/// How a call that no leader answered fails (never applied: no replica
/// took it, or each said it does not lead).
pub const NO_LEADER: &str = "no leader answered";

impl Client {
    /// A client of these (proxied) replica addresses.
    pub fn new(addrs: Vec<String>, timeout: Duration) -> Client {
        Client { addrs, leader: 0, timeout }
    }

    /// Calls the allocation API once (on one replica, then any leader it
    /// names). `Ok(Err(status))` is a definite answer that is an error.
    async fn call<T, F, Fut>(&mut self, mut f: F) -> Answer<Result<T, tonic::Status>>
    where
        F: FnMut(AllocationServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut target = self.leader;
        let mut last = String::from("no replica tried");
        for _ in 0..=self.addrs.len() {
            let addr = self.addrs[target].clone();
            let channel = match connect(&addr, self.timeout).await {
                Ok(c) => c,
                Err(e) => {
                    // Never sent: try the next replica.
                    last = e;
                    target = (target + 1) % self.addrs.len();
                    self.leader = target;
                    continue;
                }
            };
            let answer = tokio::time::timeout(self.timeout, f(AllocationServiceClient::new(channel))).await;
            if !matches!(answer, Ok(Ok(_))) {
                // Whatever went wrong here, the next attempt tries elsewhere
                // first (a hint below overrides this).
                self.leader = (target + 1) % self.addrs.len();
            }
            let status = match answer {
                Err(_) => return Answer::Unknown(format!("{addr}: no answer in {:?}", self.timeout)),
                Ok(Ok(r)) => return Answer::Ok(Ok(r.into_inner())),
                Ok(Err(status)) => status,
            };
            let hint = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok());
            match status.code() {
                Code::Unavailable if status.message().contains("did not complete") => {
                    return Answer::Unknown(format!("{addr}: {}", status.message()));
                }
                Code::Unavailable => {
                    last = format!("{addr}: {}", status.message());
                    match hint.and_then(|h| self.addrs.iter().position(|a| a == h)) {
                        Some(i) if i != target => target = i,
                        _ => target = (target + 1) % self.addrs.len(),
                    }
                    self.leader = target;
                }
                Code::Cancelled | Code::Unknown | Code::Internal | Code::DeadlineExceeded => {
                    return Answer::Unknown(format!("{addr}: {:?}: {}", status.code(), status.message()));
                }
                _ => return Answer::Ok(Err(status)),
            }
        }
        Answer::Failed(format!("{NO_LEADER} ({last})"))
    }

    /// Submits `spec` once: the allocation id when acknowledged.
    pub async fn submit(&mut self, spec: &v1::AllocationSpec) -> Answer<u64> {
        let req = v1::SubmitRequest { spec: Some(spec.clone()), dry_run: false, ..Default::default() };
        match self
            .call(move |mut c| {
                let req = req.clone();
                async move { c.submit(req).await }
            })
            .await
        {
            Answer::Ok(Ok(r)) => Answer::Ok(r.id),
            Answer::Ok(Err(s)) => Answer::Failed(format!("{:?}: {}", s.code(), s.message())),
            Answer::Failed(e) => Answer::Failed(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    /// Reads allocation `id`: its status in lower case, `absent`, or
    /// `forgotten`.
    pub async fn get(&mut self, id: u64) -> Answer<String> {
        match self.call(move |mut c| async move { c.get(v1::GetRequest { id }).await }).await {
            Answer::Ok(Ok(a)) => Answer::Ok(status_name(a.status)),
            Answer::Ok(Err(s)) if s.code() == Code::NotFound => Answer::Ok(not_found(&s)),
            Answer::Ok(Err(s)) => Answer::Failed(format!("{:?}: {}", s.code(), s.message())),
            Answer::Failed(e) => Answer::Failed(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    /// Cancels allocation `id`: `cancelled`, `already-ended` or `absent`.
    pub async fn cancel(&mut self, id: u64) -> Answer<String> {
        match self
            .call(move |mut c| async move { c.cancel(v1::CancelRequest { id, indices: String::new() }).await })
            .await
        {
            Answer::Ok(Ok(_)) => Answer::Ok("cancelled".into()),
            Answer::Ok(Err(s)) if s.code() == Code::NotFound => Answer::Ok(not_found(&s)),
            Answer::Ok(Err(s)) if s.code() == Code::FailedPrecondition && s.message().contains("already") => {
                Answer::Ok("already-ended".into())
            }
            Answer::Ok(Err(s)) => Answer::Failed(format!("{:?}: {}", s.code(), s.message())),
            Answer::Failed(e) => Answer::Failed(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }
}

/// An allocation status as the checks name it (`queued`, `done`, …).
pub fn status_name(raw: i32) -> String {
    v1::AllocationStatus::try_from(raw)
        .map(|s| s.as_str_name().trim_start_matches("ALLOCATION_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

/// A replica's own view, over its real address.
pub async fn status(addr: &str) -> Option<v1::ReplicaStatus> {
    let channel = connect(addr, Duration::from_millis(500)).await.ok()?;
    let mut admin = AdminServiceClient::new(channel);
    tokio::time::timeout(Duration::from_millis(800), admin.status(v1::StatusRequest {}))
        .await
        .ok()?
        .ok()
        .map(|r| r.into_inner())
}

/// Node `id`'s status as the leader among `real` sees it.
pub async fn node_status(real: &[String], id: &str) -> Option<v1::NodeStatus> {
    let (_, addr) = leader_at(real).await?;
    let channel = connect(&addr, Duration::from_millis(500)).await.ok()?;
    let mut nodes = muster_proto::v1::node_service_client::NodeServiceClient::new(channel);
    let node = tokio::time::timeout(Duration::from_millis(800), nodes.get_node(v1::GetNodeRequest { id: id.into() }))
        .await
        .ok()?
        .ok()?
        .into_inner();
    v1::NodeStatus::try_from(node.status).ok()
}

/// The leader of the highest term among `real`, and the address of `real`
/// it answered on.
pub async fn leader_at(real: &[String]) -> Option<(u64, String)> {
    let mut best: Option<(u64, u64, &String)> = None;
    for addr in real {
        if let Some(s) = status(addr).await
            && s.role == "leader"
            && best.is_none_or(|(term, _, _)| s.term > term)
        {
            best = Some((s.term, s.id, addr));
        }
    }
    best.map(|(_, id, addr)| (id, addr.clone()))
}

/// Every allocation, read from the leader's real address.
pub async fn list_all(addr: &str) -> Result<Vec<v1::Allocation>, String> {
    let channel = connect(addr, Duration::from_secs(2)).await?;
    let mut client = AllocationServiceClient::new(channel);
    let mut out = Vec::new();
    let mut token = 0;
    loop {
        let req = v1::ListRequest { page_size: 1000, page_token: token, ..Default::default() };
        let page = client.list(req).await.map_err(|s| s.message().to_string())?.into_inner();
        out.extend(page.allocations);
        if page.next_page_token == 0 {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// An allocation's kept events, from the leader's real address (the
/// allocation must have ended: the watch then closes by itself).
pub async fn history(addr: &str, id: u64) -> Result<Vec<v1::AllocationEvent>, String> {
    let channel = connect(addr, Duration::from_secs(2)).await?;
    let mut stream = AllocationServiceClient::new(channel)
        .watch(v1::WatchRequest { id, from_revision: 0 })
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner();
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Err(_) => return Err(format!("allocation {id}: the watch did not end")),
            Ok(Err(s)) => return Err(s.message().to_string()),
            Ok(Ok(None)) => return Ok(out),
            Ok(Ok(Some(e))) => out.push(e),
        }
    }
}

/// What a NOT_FOUND for an allocation says: `forgotten` (it ended and left
/// the live state after the retention window) or `absent` (never there).
fn not_found(s: &tonic::Status) -> String {
    if s.message().contains("retention") { "forgotten" } else { "absent" }.into()
}

/// Every job-history record, read from the leader's real address.
pub async fn job_history(addr: &str) -> Result<Vec<v1::HistoryRecord>, String> {
    let channel = connect(addr, Duration::from_secs(2)).await?;
    let mut client = muster_proto::v1::history_service_client::HistoryServiceClient::new(channel)
        .max_decoding_message_size(64 << 20);
    let mut out = Vec::new();
    let mut after_seq = 0;
    loop {
        let q = v1::HistoryQuery { after_seq, limit: 10_000, ..Default::default() };
        let page = client.list_history(q).await.map_err(|s| s.message().to_string())?.into_inner();
        if page.missing > 0 {
            return Err(format!("the leader's history lacks {} records", page.missing));
        }
        out.extend(page.records);
        if page.next_after_seq == 0 {
            return Ok(out);
        }
        after_seq = page.next_after_seq;
    }
}

/// A forgotten allocation, as the checks see it, from its record.
pub fn as_allocation(r: v1::HistoryRecord) -> v1::Allocation {
    v1::Allocation {
        id: r.id,
        status: r.status,
        spec: Some(v1::AllocationSpec {
            owner: r.owner,
            gang_size: r.gang_size,
            resources: r.resources,
            command: r.command,
            idempotency_key: r.idempotency_key,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The committed starts of a forgotten allocation's attempts, as the
/// `task_started` events its watch would have shown.
pub fn starts_of(r: &v1::HistoryRecord) -> Vec<v1::AllocationEvent> {
    r.attempts
        .iter()
        .map(|a| v1::AllocationEvent {
            id: r.id,
            kind: "task_started".into(),
            detail: format!("task {} started on {} (attempt {})", a.task, a.node_id, a.attempt),
            time_ms: a.start_ms,
            ..Default::default()
        })
        .collect()
}
