//! The checkpoints on this node's disk, served to other nodes' agents
//! (`muster.v1.CheckpointService`), each only to the node the leader
//! granted it to.
//!
//! ```text
//!   leader ── CheckpointGrants{(seq, key, node)…} ──▶ Grants (replaced whole)
//!   agent B ── Fetch{key} (mutual TLS, agent certificate for B) ──▶ granted (key, B)? ──▶ chunks
//!                                                                 └ no: PERMISSION_DENIED
//! ```
//!
//! The caller is the node its certificate names (without TLS, the node its
//! `x-muster-node` header says: an insecure cluster trusts everyone). At
//! most [`MAX_CONCURRENT_FETCHES`] fetches are served at once; the rest
//! wait for a slot. The bytes are not checked here: the fetcher checks them
//! against the manifest's digest, so a wrong answer cannot be restored.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::checkpoint_service_server::{CheckpointService, CheckpointServiceServer};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The header naming the fetching node when agents run without TLS.
pub const NODE_HEADER: &str = "x-muster-node";

/// Fetches served at once; more wait.
pub const MAX_CONCURRENT_FETCHES: usize = 8;

/// The size of each chunk sent.
const CHUNK_BYTES: usize = 1 << 20;

/// The checkpoints this node may serve now, and to whom: `(key, node)`.
#[derive(Clone, Default)]
pub struct Grants(Arc<Mutex<BTreeSet<(String, String)>>>);

impl Grants {
    /// Replaces the grants with the leader's latest set.
    pub fn replace(&self, grants: impl IntoIterator<Item = (String, String)>) {
        *self.0.lock().expect("grants lock") = grants.into_iter().collect();
    }

    /// Whether `node` may fetch `key`.
    pub fn allows(&self, key: &str, node: &str) -> bool {
        self.0.lock().expect("grants lock").contains(&(key.to_string(), node.to_string()))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.lock().expect("grants lock").len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The service.
pub struct CheckpointServer {
    root: PathBuf,
    grants: Grants,
    tls: bool,
    slots: Arc<Semaphore>,
}

impl CheckpointServer {
    /// Serves the checkpoints under `root` (this node's store) under
    /// `grants`; `tls` says whether callers are identified by certificate.
    pub fn new(root: PathBuf, grants: Grants, tls: bool) -> CheckpointServer {
        CheckpointServer { root, grants, tls, slots: Arc::new(Semaphore::new(MAX_CONCURRENT_FETCHES)) }
    }

    /// The tonic service.
    pub fn into_service(self) -> CheckpointServiceServer<CheckpointServer> {
        CheckpointServiceServer::new(self)
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<String, Status> {
        if self.tls {
            match muster_tls::peer_role(req.extensions())? {
                muster_tls::Role::Agent(node) => Ok(node),
                other => Err(Status::permission_denied(format!("{other} is not a node agent"))),
            }
        } else {
            req.metadata()
                .get(NODE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| Status::unauthenticated(format!("say which node is fetching ({NODE_HEADER})")))
        }
    }
}

#[tonic::async_trait]
impl CheckpointService for CheckpointServer {
    type FetchStream = ReceiverStream<Result<v1::CheckpointChunk, Status>>;

    async fn fetch(&self, req: Request<v1::FetchCheckpoint>) -> Result<Response<Self::FetchStream>, Status> {
        req.get_ref().check_bounds()?;
        let node = self.caller(&req)?;
        let f = req.into_inner();
        let plain = !f.key.is_empty()
            && f.key.len() <= muster_core::sm::MAX_CHECKPOINT_KEY_BYTES
            && !f.key.starts_with('/')
            && f.key.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
        if !plain {
            return Err(Status::invalid_argument(format!("invalid key: {:?} is not a checkpoint key", f.key)));
        }
        if !self.grants.allows(&f.key, &node) {
            metrics::counter!("muster_agent_checkpoint_fetches_refused_total").increment(1);
            tracing::warn!(node = %node, key = %f.key, "checkpoint fetch without a grant refused");
            return Err(Status::permission_denied(format!(
                "node {node} holds no grant to fetch checkpoint {} from this node",
                f.key
            )));
        }
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| Status::unavailable("shutting down"))?;
        let path = self.root.join(&f.key);
        let mut file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| Status::not_found(format!("checkpoint {} is not on this node: {e}", f.key)))?;
        let total = file.metadata().await.map_err(|e| Status::internal(e.to_string()))?.len();
        file.seek(std::io::SeekFrom::Start(f.offset)).await.map_err(|e| Status::internal(e.to_string()))?;
        let (tx, rx) = mpsc::channel(4);
        let key = f.key.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut first = true;
            let mut sent = 0u64;
            loop {
                let mut buf = vec![0u8; CHUNK_BYTES];
                match file.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => {
                        buf.truncate(n);
                        sent += n as u64;
                        let chunk = v1::CheckpointChunk { data: buf, total: if first { total } else { 0 } };
                        first = false;
                        if tx.send(Ok(chunk)).await.is_err() {
                            return; // the fetcher went away
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(format!("reading {key}: {e}")))).await;
                        return;
                    }
                }
            }
            metrics::counter!("muster_agent_checkpoint_bytes_served_total").increment(sent);
            tracing::info!(node = %node, key = %key, bytes = sent, "checkpoint served");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
