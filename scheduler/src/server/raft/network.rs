//! Raft between replicas over gRPC: the client side (openraft's
//! `RaftNetworkFactory`, with one pooled lazy channel per peer address) and
//! the server side (`RaftService`, handing requests to the local `Raft`).
//!
//! Payloads are versioned postcard encodings of openraft's own types inside a
//! protobuf `bytes` field; the reply is `Result<response, RaftError>`, so a
//! peer's Raft error crosses the wire as itself. Appends (heartbeats
//! included) go over one `AppendStream` per peer, a message and its reply
//! at a time, and fall back to unary `AppendEntries` calls for a peer that
//! does not know the stream; votes and snapshot chunks are unary calls. A
//! peer that cannot be reached (or does not answer within the RPC's
//! deadline) is reported as `Unreachable`, which makes openraft back off
//! before retrying.
//!
//! openraft logs every failed call to a down peer, twice a second, with the
//! whole error chain; the server's default log filter silences those
//! modules. Instead this network says once when a peer stops answering
//! (WARN, with the root cause) and once when it answers again (INFO).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::RaftPayload;
use muster_proto::v1::raft_service_client::RaftServiceClient;
use muster_proto::v1::raft_service_server::RaftService;
use muster_raft_store::codec;
use muster_tls::TlsMaterial;
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::server::{MusterRaft, TypeConfig};

/// The largest gRPC message between replicas (snapshot chunks are smaller).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 << 20;

/// Builds a lazily connecting channel to `addr` (`host:port`), over mutual
/// TLS with this replica's certificate when `tls` is given.
pub fn lazy_channel(
    addr: &str,
    connect_timeout: Duration,
    tls: Option<&TlsMaterial>,
) -> Result<Channel, tonic::transport::Error> {
    Ok(muster_tls::endpoint(addr, tls)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// openraft's network: hands out one client per target, sharing channels.
#[derive(Clone, Default)]
pub struct Network {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    tls: Option<Arc<TlsMaterial>>,
    reach: Reachability,
}

/// Which peers last failed to answer, so that a change is logged once.
#[derive(Clone, Default)]
pub(crate) struct Reachability {
    known: Arc<Mutex<BTreeMap<u64, bool>>>,
    /// The whole cluster is going away: nothing is news any more.
    quiet: Arc<std::sync::atomic::AtomicBool>,
}

impl Reachability {
    /// Records a call's outcome; returns whether it changed what is known
    /// (the first failure after success, the first success after failure)
    /// and that is worth saying (not once [`Reachability::hush`]ed).
    /// A peer never heard from counts as reachable.
    pub(crate) fn record(&self, peer: u64, answered: bool) -> bool {
        let mut known = self.known.lock().expect("reachability lock");
        let was = known.insert(peer, answered).unwrap_or(true);
        was != answered && !self.quiet.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The peers whose last call from this replica found nobody answering.
    pub(crate) fn unreachable(&self) -> Vec<u64> {
        let known = self.known.lock().expect("reachability lock");
        known.iter().filter(|&(_, &answered)| !answered).map(|(&peer, _)| peer).collect()
    }

    /// From now on peers going away are expected (every replica of a local
    /// cluster is stopping): they are no longer logged.
    pub(crate) fn hush(&self) {
        self.quiet.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The innermost cause of an error ("Connection refused (os error 111)"),
/// not the chain of wrappers around it.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut e = e;
    while let Some(next) = e.source() {
        e = next;
    }
    e.to_string()
}

impl Network {
    /// A network whose connections present `tls` (this replica's server
    /// certificate), or plain when `None` (insecure mode).
    pub fn new(tls: Option<TlsMaterial>) -> Network {
        Network { channels: Arc::default(), tls: tls.map(Arc::new), reach: Reachability::default() }
    }

    /// What says whether its peers' comings and goings are logged.
    pub(crate) fn reachability(&self) -> Reachability {
        self.reach.clone()
    }

    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channel pool lock");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let c = lazy_channel(addr, Duration::from_secs(2), self.tls.as_deref())
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?;
        channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        let client = self.channel(&node.addr).map(|c| {
            RaftServiceClient::new(c)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        });
        Peer { target, addr: node.addr.clone(), client, reach: self.reach.clone(), appends: AppendPath::Closed }
    }
}

/// A client for one peer.
pub struct Peer {
    target: u64,
    addr: String,
    client: Result<RaftServiceClient<Channel>, String>,
    reach: Reachability,
    /// Where appends go: the peer's `AppendStream`, once opened.
    appends: AppendPath,
}

/// How a peer takes appends. openraft sends one append at a time to each
/// peer and awaits its reply, so one stream carries them in turn: a
/// message and its reply cost two frames instead of a call's headers,
/// trailers and per-call task on both sides.
enum AppendPath {
    /// No stream is open; the next append opens one.
    Closed,
    /// Requests go in on `tx`, replies come back on `rx`, in order.
    Open(Box<OpenStream>),
    /// The peer does not know `AppendStream` (an older version): unary calls.
    Unary,
}

/// An open `AppendStream`.
struct OpenStream {
    tx: tokio::sync::mpsc::Sender<RaftPayload>,
    rx: tonic::Streaming<RaftPayload>,
    /// A request was sent and its reply not yet read. Still set when an
    /// append starts, it means the last one was cut short (openraft drops
    /// an append that outlives its own timeout): that reply may yet come
    /// and would answer the wrong request, so the stream is not used again.
    waiting: bool,
}

/// What became of an append sent over the stream.
enum Streamed {
    /// The peer's reply payload.
    Reply(RaftPayload),
    /// The peer has no `AppendStream`: send it as a call.
    Unsupported,
    /// The stream failed (it is closed now; the next append opens another).
    Failed(Status),
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct WireError(String);

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned + std::error::Error,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(&WireError(e.clone())))),
        };
        let data = codec::encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = Request::new(RaftPayload { data });
        request.set_timeout(option.hard_ttl());
        request.metadata_mut().insert(TO_HEADER, self.target.into());
        let reply = match rpc {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
        };
        self.answer(reply.map(Response::into_inner))
    }

    /// A peer's reply (or the call's failure) as openraft wants it, noting
    /// whether the peer answered. (The error is openraft's own type, as the
    /// `RaftNetwork` trait returns it.)
    #[allow(clippy::result_large_err)]
    fn answer<Resp, E>(
        &self,
        reply: Result<RaftPayload, Status>,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Resp: DeserializeOwned,
        E: DeserializeOwned + std::error::Error,
    {
        let reply = match reply {
            Ok(r) => {
                if self.reach.record(self.target, true) {
                    tracing::info!(peer = self.target, addr = %self.addr, "replica reachable again");
                }
                r
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled) => {
                if self.reach.record(self.target, false) {
                    tracing::warn!(
                        peer = self.target,
                        addr = %self.addr,
                        cause = %root_cause(&status),
                        "replica unreachable; retrying quietly"
                    );
                } else {
                    // Each retry, for whoever asks for them (a test waits on
                    // these to know the retries it checks for happened).
                    tracing::debug!(peer = self.target, "call to a replica known unreachable failed again");
                }
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&status))),
        };
        let result: Result<Resp, RaftError<u64, E>> =
            codec::decode(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// Sends one encoded append over the peer's `AppendStream` (opening it
    /// first when none is open) and waits up to `ttl` for its reply. Any
    /// failure closes the stream, and so does an append whose caller gave
    /// up on it before its reply came: a reply that comes late would answer
    /// the wrong request.
    async fn stream_append(&mut self, data: Vec<u8>, ttl: Duration) -> Streamed {
        let Ok(client) = &mut self.client else {
            return Streamed::Failed(Status::unavailable("no channel to this peer"));
        };
        // No stream, or one whose last append was cut short: open another.
        if !matches!(&self.appends, AppendPath::Open(open) if !open.waiting) {
            let (tx, requests) = tokio::sync::mpsc::channel(1);
            let mut request = Request::new(tokio_stream::wrappers::ReceiverStream::new(requests));
            request.metadata_mut().insert(TO_HEADER, self.target.into());
            match tokio::time::timeout(ttl, client.append_stream(request)).await {
                Ok(Ok(replies)) => {
                    self.appends =
                        AppendPath::Open(Box::new(OpenStream { tx, rx: replies.into_inner(), waiting: false }))
                }
                Ok(Err(status)) if status.code() == Code::Unimplemented => {
                    tracing::info!(peer = self.target, "peer has no AppendStream; appending with unary calls");
                    self.appends = AppendPath::Unary;
                    return Streamed::Unsupported;
                }
                Ok(Err(status)) => return Streamed::Failed(status),
                Err(_) => return Streamed::Failed(Status::deadline_exceeded("opening the append stream timed out")),
            }
        }
        let AppendPath::Open(open) = &mut self.appends else {
            unreachable!("an append stream was opened above");
        };
        let OpenStream { tx, rx, waiting } = &mut **open;
        *waiting = true;
        let exchange = async {
            tx.send(RaftPayload { data }).await.map_err(|_| Status::unavailable("the append stream closed"))?;
            match rx.message().await {
                Ok(Some(reply)) => Ok(reply),
                Ok(None) => Err(Status::unavailable("the peer ended the append stream")),
                Err(status) => Err(status),
            }
        };
        match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok(reply)) => {
                *waiting = false;
                Streamed::Reply(reply)
            }
            Ok(Err(status)) => {
                self.appends = AppendPath::Closed;
                Streamed::Failed(status)
            }
            Err(_) => {
                self.appends = AppendPath::Closed;
                Streamed::Failed(Status::deadline_exceeded("no reply on the append stream in time"))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        // Heartbeats carry no entries: only appends are timed.
        let timed = (!rpc.entries.is_empty()).then(std::time::Instant::now);
        let reply = match self.appends {
            AppendPath::Unary => self.call(Rpc::Append, &rpc, &option).await,
            _ => {
                let data = codec::encode(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                match self.stream_append(data, option.hard_ttl()).await {
                    Streamed::Reply(reply) => self.answer(Ok(reply)),
                    Streamed::Failed(status) => self.answer(Err(status)),
                    Streamed::Unsupported => self.call(Rpc::Append, &rpc, &option).await,
                }
            }
        };
        if let (Some(started), Ok(_)) = (timed, &reply) {
            metrics::histogram!("muster_raft_append_rpc_seconds").record(started.elapsed().as_secs_f64());
        }
        reply
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}

/// The server side: peers' Raft requests into the local `Raft`.
pub struct RaftRpc {
    raft: MusterRaft,
    id: u64,
    stop: tokio::sync::watch::Receiver<bool>,
    /// When a leader was last heard from (appends and snapshot chunks it
    /// took), for the elector and pre-votes.
    heard: super::elector::LastHeard,
    /// The voters' lease a pre-vote respects.
    lease: Duration,
    /// This replica's last log entry, for pre-votes.
    last_log: super::elector::LastLogReader,
}

impl RaftRpc {
    /// Serves Raft RPCs for `raft`, the replica `id`; `Follow` streams end
    /// when `stop` turns true. Every append and snapshot chunk taken from
    /// a leader is noted in `heard`; a pre-vote is granted only when none
    /// was within `lease`.
    pub fn new(
        raft: MusterRaft,
        id: u64,
        stop: tokio::sync::watch::Receiver<bool>,
        heard: super::elector::LastHeard,
        lease: Duration,
        last_log: super::elector::LastLogReader,
    ) -> Self {
        RaftRpc { raft, id, stop, heard, lease, last_log }
    }
}

/// The replica a Raft request is meant for. A machine whose address
/// passed to a new member (a replica replaced on the same host:port while
/// the old one is still in the membership) refuses its predecessor's
/// traffic instead of taking a leader's own requests, or another member's
/// votes, for its own.
const TO_HEADER: &str = "x-muster-raft-to";

/// Refuses a request addressed to another replica id (a request without the
/// header is taken: an older peer's).
fn addressed_to<T>(req: &Request<T>, me: u64) -> Result<(), Status> {
    let to = req.metadata().get(TO_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match to {
        Some(to) if to != me => Err(Status::failed_precondition(format!(
            "this address serves replica {me}, not replica {to}: remove replica {to} from the cluster"
        ))),
        _ => Ok(()),
    }
}

fn decode_request<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    decode_payload(&req.into_inner())
}

fn decode_payload<T: DeserializeOwned>(payload: &RaftPayload) -> Result<T, Status> {
    codec::decode(&payload.data).map_err(|e| Status::invalid_argument(format!("raft payload does not decode: {e}")))
}

/// One append, from a call or the stream: into the local Raft, timed when
/// it carries entries.
async fn serve_append(
    raft: &MusterRaft,
    heard: &super::elector::LastHeard,
    payload: RaftPayload,
) -> Result<RaftPayload, Status> {
    let rpc: AppendEntriesRequest<TypeConfig> = decode_payload(&payload)?;
    // A leader of this term (or a newer one) is heard the moment its append
    // arrives, not once it is on disk: a follower whose disk is slow still
    // hears its leader.
    if rpc.vote.leader_id().term >= raft.metrics().borrow().current_term {
        heard.heard();
    }
    let timed = (!rpc.entries.is_empty()).then(std::time::Instant::now);
    let reply = raft.append_entries(rpc).await;
    if let Some(started) = timed {
        metrics::histogram!("muster_raft_append_serve_seconds").record(started.elapsed().as_secs_f64());
    }
    encode_payload(&reply)
}

fn encode_payload<T: Serialize>(value: &T) -> Result<RaftPayload, Status> {
    let data = codec::encode(value).map_err(|e| Status::internal(format!("raft reply does not encode: {e}")))?;
    Ok(RaftPayload { data })
}

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    encode_payload(value).map(Response::new)
}

#[tonic::async_trait]
impl RaftService for RaftRpc {
    type FollowStream = tokio_stream::wrappers::ReceiverStream<Result<v1::FollowEvent, Status>>;

    /// Names this replica once, then holds the stream open until the
    /// follower goes or this replica stops (see `leader_watch`).
    async fn follow(&self, req: Request<v1::FollowRequest>) -> Result<Response<Self::FollowStream>, Status> {
        req.get_ref().check_bounds()?;
        let follower = req.into_inner().follower_id;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.try_send(Ok(v1::FollowEvent { replica_id: self.id })).expect("a new channel has room");
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = tx.closed() => {}
            }
            tracing::debug!(follower, "follow stream closed");
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn pre_vote(&self, req: Request<v1::PreVoteRequest>) -> Result<Response<v1::PreVoteResponse>, Status> {
        req.get_ref().check_bounds()?;
        addressed_to(&req, self.id)?;
        let leads = self.raft.metrics().borrow().state == openraft::ServerState::Leader;
        let r = req.get_ref();
        let theirs = (r.last_log_term, r.last_log_index);
        let (granted, reason) =
            super::elector::pre_vote_answer(leads, self.heard.silent(), self.lease, (self.last_log)(), theirs);
        tracing::debug!(candidate = r.candidate, granted, reason = %reason, "pre-vote");
        Ok(Response::new(v1::PreVoteResponse { granted, reason }))
    }

    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        req.get_ref().check_bounds()?;
        addressed_to(&req, self.id)?;
        serve_append(&self.raft, &self.heard, req.into_inner()).await.map(Response::new)
    }

    type AppendStreamStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<RaftPayload, Status>> + Send>>;

    /// Answers each append on the stream in turn; a request that does not
    /// decode ends the stream with its error. The stream ends when this
    /// replica stops, as `Follow` streams do: a graceful shutdown waits for
    /// every open stream, and a leader's would never end on its own.
    async fn append_stream(
        &self,
        req: Request<tonic::Streaming<RaftPayload>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        use tokio_stream::StreamExt;
        addressed_to(&req, self.id)?;
        let (raft, heard) = (self.raft.clone(), self.heard.clone());
        let replies = req.into_inner().then(move |request| {
            let (raft, heard) = (raft.clone(), heard.clone());
            async move {
                let request = request?;
                request.check_bounds()?;
                serve_append(&raft, &heard, request).await
            }
        });
        let stop = self.stop.clone();
        let stopping = tokio_stream::once(()).then(move |()| {
            let mut stop = stop.clone();
            async move {
                let _ = stop.wait_for(|s| *s).await;
            }
        });
        let mut failed = false;
        let replies = replies
            .map(Some)
            .merge(stopping.map(|()| None))
            .take_while(Option::is_some)
            .filter_map(|reply| reply)
            .take_while(move |reply| {
                let go_on = !failed;
                failed |= reply.is_err();
                go_on
            });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        req.get_ref().check_bounds()?;
        addressed_to(&req, self.id)?;
        let rpc: VoteRequest<u64> = decode_request(req)?;
        encode_reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        req.get_ref().check_bounds()?;
        addressed_to(&req, self.id)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_request(req)?;
        let reply = self.raft.install_snapshot(rpc).await;
        if reply.is_ok() {
            self.heard.heard();
        }
        encode_reply(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_proto::v1::raft_service_server::RaftServiceServer;
    use openraft::Vote;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How a fake peer treats `AppendStream`.
    #[derive(Clone, Copy)]
    enum Streams {
        /// Answers each message.
        Answer,
        /// Does not know the method (an older peer).
        Unknown,
        /// Takes messages and never answers.
        Silent,
        /// Answers the second message of the first stream late (after 2 s)
        /// with `Conflict`, and every other one at once with `Success`.
        SlowSecond,
    }

    /// A peer that answers every append with success and counts how each
    /// arrived.
    #[derive(Clone)]
    struct FakePeer {
        streams: Streams,
        opened: Arc<AtomicUsize>,
        streamed: Arc<AtomicUsize>,
        unary: Arc<AtomicUsize>,
    }

    fn success() -> RaftPayload {
        payload(AppendEntriesResponse::Success)
    }

    fn payload(r: AppendEntriesResponse<u64>) -> RaftPayload {
        let reply: Result<AppendEntriesResponse<u64>, RaftError<u64>> = Ok(r);
        RaftPayload { data: codec::encode(&reply).unwrap() }
    }

    #[tonic::async_trait]
    impl RaftService for FakePeer {
        type FollowStream = tokio_stream::wrappers::ReceiverStream<Result<v1::FollowEvent, Status>>;
        type AppendStreamStream =
            std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<RaftPayload, Status>> + Send>>;

        async fn follow(&self, _: Request<v1::FollowRequest>) -> Result<Response<Self::FollowStream>, Status> {
            Err(Status::unimplemented("not in this fake"))
        }

        async fn append_entries(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            self.unary.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(success()))
        }

        async fn append_stream(
            &self,
            req: Request<tonic::Streaming<RaftPayload>>,
        ) -> Result<Response<Self::AppendStreamStream>, Status> {
            use tokio_stream::StreamExt;
            if matches!(self.streams, Streams::Unknown) {
                return Err(Status::unimplemented("unknown method"));
            }
            let stream = self.opened.fetch_add(1, Ordering::SeqCst);
            let (streamed, streams) = (self.streamed.clone(), self.streams);
            let mut on_this_stream = 0;
            let replies = req
                .into_inner()
                .then(move |m| {
                    streamed.fetch_add(1, Ordering::SeqCst);
                    on_this_stream += 1;
                    let slow = stream == 0 && on_this_stream == 2;
                    async move {
                        m.ok()?;
                        match streams {
                            Streams::SlowSecond if slow => {
                                tokio::time::sleep(Duration::from_secs(2)).await;
                                Some(Ok(payload(AppendEntriesResponse::Conflict)))
                            }
                            Streams::Answer | Streams::SlowSecond => Some(Ok(success())),
                            Streams::Silent | Streams::Unknown => None,
                        }
                    }
                })
                .filter_map(|reply| reply);
            Ok(Response::new(Box::pin(replies)))
        }

        async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not in this fake"))
        }

        async fn install_snapshot(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not in this fake"))
        }

        async fn pre_vote(&self, _: Request<v1::PreVoteRequest>) -> Result<Response<v1::PreVoteResponse>, Status> {
            Err(Status::unimplemented("not in this fake"))
        }
    }

    /// Serves `fake` on a free loopback port; returns openraft's client for
    /// it, as replica 2.
    async fn peer_of(fake: FakePeer) -> Peer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftServiceServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Network::new(None).new_client(2, &BasicNode::new(addr)).await
    }

    fn fake(streams: Streams) -> FakePeer {
        FakePeer { streams, opened: Arc::default(), streamed: Arc::default(), unary: Arc::default() }
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        }
    }

    /// Generous: a loaded machine still answers a loopback call in time.
    const TTL: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn appends_go_over_one_stream_in_turn() {
        let f = fake(Streams::Answer);
        let mut peer = peer_of(f.clone()).await;
        for _ in 0..5 {
            let reply = peer.append_entries(heartbeat(), RPCOption::new(TTL)).await.unwrap();
            assert_eq!(reply, AppendEntriesResponse::Success);
        }
        assert_eq!(f.opened.load(Ordering::SeqCst), 1, "one stream for all five");
        assert_eq!(f.streamed.load(Ordering::SeqCst), 5);
        assert_eq!(f.unary.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_peer_without_the_stream_gets_unary_calls() {
        let f = fake(Streams::Unknown);
        let mut peer = peer_of(f.clone()).await;
        for _ in 0..3 {
            let reply = peer.append_entries(heartbeat(), RPCOption::new(TTL)).await.unwrap();
            assert_eq!(reply, AppendEntriesResponse::Success);
        }
        assert_eq!(f.unary.load(Ordering::SeqCst), 3, "every append answered, as calls");
        assert!(matches!(peer.appends, AppendPath::Unary), "asked once, not again");
    }

    #[tokio::test]
    async fn an_append_given_up_before_its_reply_never_takes_another_ones_reply() {
        let f = fake(Streams::SlowSecond);
        let mut peer = peer_of(f.clone()).await;
        let first = peer.append_entries(heartbeat(), RPCOption::new(TTL)).await.unwrap();
        assert_eq!(first, AppendEntriesResponse::Success, "the stream is open");
        // openraft wraps each append in a timeout of its own and drops it
        // when that fires; the fake answers this one 2 s later.
        let cut =
            tokio::time::timeout(Duration::from_millis(100), peer.append_entries(heartbeat(), RPCOption::new(TTL)));
        assert!(cut.await.is_err(), "given up before the reply");
        // The next append must get its own answer, not the late Conflict.
        let reply = peer.append_entries(heartbeat(), RPCOption::new(TTL)).await.unwrap();
        assert_eq!(reply, AppendEntriesResponse::Success);
        assert_eq!(f.opened.load(Ordering::SeqCst), 2, "the cut-short stream was not used again");
    }

    #[tokio::test]
    async fn a_stream_that_does_not_answer_in_time_is_dropped_and_opened_again() {
        let f = fake(Streams::Silent);
        let mut peer = peer_of(f.clone()).await;
        // Each append opens a stream if none is open, and waits 300 ms for
        // a reply that never comes (on a loaded machine the opening itself
        // may take longer: that fails the same way, and the next one tries
        // again).
        for _ in 0..100 {
            let r = peer.append_entries(heartbeat(), RPCOption::new(Duration::from_millis(300))).await;
            assert!(matches!(r, Err(RPCError::Unreachable(_))), "{r:?}");
            assert!(matches!(peer.appends, AppendPath::Closed), "a late reply would answer the wrong request");
            if f.opened.load(Ordering::SeqCst) >= 2 {
                break;
            }
        }
        assert_eq!(f.opened.load(Ordering::SeqCst), 2, "a new stream for a later append");
        assert_eq!(f.unary.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_peer_is_reported_once_when_it_goes_and_once_when_it_comes_back() {
        let r = Reachability::default();
        assert!(!r.record(2, true), "never heard from counts as reachable");
        assert!(r.record(2, false), "the first failure is news");
        assert!(!r.record(2, false) && !r.record(2, false), "repeats are not");
        assert!(!r.record(3, true), "each peer on its own");
        assert!(r.record(2, true), "back again is news");
        assert!(!r.record(2, true));
        assert!(r.record(3, false));
        assert_eq!(r.unreachable(), [3]);
        r.hush();
        assert!(!r.record(2, false), "once hushed, a peer going away is expected");
        let wrapped = std::io::Error::other(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(root_cause(&wrapped), std::io::Error::from(std::io::ErrorKind::ConnectionRefused).to_string());
    }

    #[test]
    fn a_request_for_another_replica_is_refused() {
        let to = |id: Option<u64>| {
            let mut r = Request::new(RaftPayload { data: vec![] });
            if let Some(id) = id {
                r.metadata_mut().insert(TO_HEADER, id.into());
            }
            r
        };
        assert!(addressed_to(&to(Some(4)), 4).is_ok());
        assert!(addressed_to(&to(None), 4).is_ok(), "a peer that does not say is taken at its word");
        let e = addressed_to(&to(Some(2)), 4).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("serves replica 4, not replica 2"), "{}", e.message());
    }
}
