//! Raft between replicas over gRPC: the client side (openraft's
//! `RaftNetworkFactory`, with one pooled lazy channel per peer address) and
//! the server side (`RaftService`, handing requests to the local `Raft`).
//!
//! Payloads are versioned postcard encodings of openraft's own types inside a
//! protobuf `bytes` field; the reply is `Result<response, RaftError>`, so a
//! peer's Raft error crosses the wire as itself. A peer that cannot be
//! reached (or does not answer within the RPC's deadline) is reported as
//! `Unreachable`, which makes openraft back off before retrying.
//!
//! openraft logs every failed call to a down peer, twice a second, with the
//! whole error chain; the server's default log filter silences those
//! modules. Instead this network says once when a peer stops answering
//! (WARN, with the root cause) and once when it answers again (INFO).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

use super::{MusterRaft, TypeConfig};

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
pub(crate) struct Reachability(Arc<Mutex<BTreeMap<u64, bool>>>);

impl Reachability {
    /// Records a call's outcome; returns whether it changed what is known
    /// (the first failure after success, the first success after failure).
    /// A peer never heard from counts as reachable.
    pub(crate) fn record(&self, peer: u64, answered: bool) -> bool {
        let mut known = self.0.lock().expect("reachability lock");
        let was = known.insert(peer, answered).unwrap_or(true);
        was != answered
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
        Peer { target, addr: node.addr.clone(), client, reach: self.reach.clone() }
    }
}

/// A client for one peer.
pub struct Peer {
    target: u64,
    addr: String,
    client: Result<RaftServiceClient<Channel>, String>,
    reach: Reachability,
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
        let reply = match reply {
            Ok(r) => {
                if self.reach.record(self.target, true) {
                    tracing::info!(peer = self.target, addr = %self.addr, "replica reachable again");
                }
                r.into_inner()
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled) => {
                if self.reach.record(self.target, false) {
                    tracing::warn!(
                        peer = self.target,
                        addr = %self.addr,
                        cause = %root_cause(&status),
                        "replica unreachable; retrying quietly"
                    );
                }
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&status))),
        };
        let result: Result<Resp, RaftError<u64, E>> =
            codec::decode(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
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
        let reply = self.call(Rpc::Append, &rpc, &option).await;
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
}

impl RaftRpc {
    /// Serves Raft RPCs for `raft`, the replica `id`; `Follow` streams end
    /// when `stop` turns true.
    pub fn new(raft: MusterRaft, id: u64, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        RaftRpc { raft, id, stop }
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
fn addressed_to(req: &Request<RaftPayload>, me: u64) -> Result<(), Status> {
    let to = req.metadata().get(TO_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match to {
        Some(to) if to != me => Err(Status::failed_precondition(format!(
            "this address serves replica {me}, not replica {to}: remove replica {to} from the cluster"
        ))),
        _ => Ok(()),
    }
}

fn decode_request<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    codec::decode(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("raft payload does not decode: {e}")))
}

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    let data = codec::encode(value).map_err(|e| Status::internal(format!("raft reply does not encode: {e}")))?;
    Ok(Response::new(RaftPayload { data }))
}

#[tonic::async_trait]
impl RaftService for RaftRpc {
    type FollowStream = tokio_stream::wrappers::ReceiverStream<Result<v1::FollowEvent, Status>>;

    /// Names this replica once, then holds the stream open until the
    /// follower goes or this replica stops (see `leader_watch`).
    async fn follow(&self, req: Request<v1::FollowRequest>) -> Result<Response<Self::FollowStream>, Status> {
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

    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        addressed_to(&req, self.id)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode_request(req)?;
        let timed = (!rpc.entries.is_empty()).then(std::time::Instant::now);
        let reply = self.raft.append_entries(rpc).await;
        if let Some(started) = timed {
            metrics::histogram!("muster_raft_append_serve_seconds").record(started.elapsed().as_secs_f64());
        }
        encode_reply(&reply)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        addressed_to(&req, self.id)?;
        let rpc: VoteRequest<u64> = decode_request(req)?;
        encode_reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        addressed_to(&req, self.id)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_request(req)?;
        encode_reply(&self.raft.install_snapshot(rpc).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_reported_once_when_it_goes_and_once_when_it_comes_back() {
        let r = Reachability::default();
        assert!(!r.record(2, true), "never heard from counts as reachable");
        assert!(r.record(2, false), "the first failure is news");
        assert!(!r.record(2, false) && !r.record(2, false), "repeats are not");
        assert!(!r.record(3, true), "each peer on its own");
        assert!(r.record(2, true), "back again is news");
        assert!(!r.record(2, true));
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
