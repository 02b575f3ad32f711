//! `muster.v1.NodeService`: the nodes as the state machine knows them, and
//! their lifecycle (docs/nodes.md): drain, cancel a drain, stop, restart,
//! terminate, scale down, and a watch of their events.
//!
//! Every transition is a command through the log; `apply` decides whether
//! the node's status allows it (FAILED_PRECONDITION naming the status and
//! what is allowed otherwise). A drain's timeout is resolved here, before
//! the command is made: the request's, else the node's
//! `muster.drain-timeout` label, else the server default.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::server::api::client::{MAX_PAGE_BYTES, MAX_PAGE_SIZE};
use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::node_service_server::NodeService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::bound_by;
use super::convert::{node_event_to_proto, node_to_proto, propose_error_to_status, rejection_to_status};
use crate::policy::{drain_timeout_ms, plan_admission, plan_scale_down, planned_nodes};
use crate::server::leader::LeaderWork;
use crate::server::policies::Policies;
use crate::server::raft::Consensus;
use crate::sm::{Command, NodeId, NodeStatus, Outcome};

/// The node API of one replica.
pub struct NodeApi {
    s: Consensus,
    work: LeaderWork,
    policies: Arc<Policies>,
}

impl NodeApi {
    /// The node API over a replica's shared parts and its settings.
    pub fn new(s: Consensus, work: LeaderWork, policies: Arc<Policies>) -> Self {
        NodeApi { s, work, policies }
    }

    fn node(&self, id: &NodeId) -> Result<v1::Node, Status> {
        self.s
            .reader()
            .read(|st| st.node_slot(id).map(|slot| node_to_proto(st, st.node(slot))))
            .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))
    }

    /// Proposes a lifecycle command and answers with the node after it.
    async fn transition(&self, id: &NodeId, cmd: Command) -> Result<Response<v1::Node>, Status> {
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {
                self.work.wake_admission();
                self.node(id).map(Response::new)
            }
            Outcome::Rejected(r) => Err(rejection_to_status(&r)),
        }
    }

    /// The drain timeout a request resolves to for node `id`.
    async fn timeout_for(&self, id: &NodeId, requested_ms: Option<u64>) -> Result<u64, Status> {
        if requested_ms.is_none() {
            // The label must be read from the current state.
            self.s.linearizable().await?;
        }
        let default_ms = self.policies.drain_timeout().as_millis() as u64;
        self.s
            .reader()
            .read(|st| st.node_slot(id).map(|slot| drain_timeout_ms(st.node(slot), requested_ms, default_ms)))
            .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))
    }
}

/// An operator's request with its `by` field bound to the caller's identity.
fn with_bound_by<T>(req: Request<T>, by: fn(&mut T) -> &mut String) -> T {
    let caller = muster_tls::Caller::of(&req);
    let mut q = req.into_inner();
    let field = by(&mut q);
    *field = bound_by(&caller, field);
    q
}

fn action(req: Request<v1::NodeActionRequest>) -> v1::NodeActionRequest {
    with_bound_by(req, |q| &mut q.by)
}

fn node_id(raw: String) -> Result<NodeId, Status> {
    if raw.is_empty() {
        return Err(Status::invalid_argument("invalid id: must name a node"));
    }
    Ok(NodeId::new(raw))
}

/// A hex SHA-256 (64 digits, either case).
fn parse_sha256(hex: &str) -> Result<[u8; 32], Status> {
    let bad = || Status::invalid_argument("invalid admission.cert_sha256: must be 64 hex digits (a SHA-256)");
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

impl NodeApi {
    /// `PrefetchImage`: the reference pinned to its digest, and the ready
    /// nodes that run images and meet the constraints, each asked to pull
    /// it unless its cache holds it.
    async fn prefetch(&self, q: v1::PrefetchImageRequest) -> Result<v1::PrefetchImageResponse, Status> {
        use crate::sm::{IMAGES_LABEL, ImageRef, LabelExpr, MAX_CONSTRAINTS};
        let mut image =
            ImageRef::parse(q.image.trim()).map_err(|e| Status::invalid_argument(format!("invalid image: {e}")))?;
        let mut constraints = Vec::new();
        for c in &q.constraints {
            constraints.extend(
                LabelExpr::parse_list(c).map_err(|e| Status::invalid_argument(format!("invalid constraints: {e}")))?,
            );
        }
        if constraints.len() > MAX_CONSTRAINTS {
            return Err(Status::invalid_argument(format!(
                "invalid constraints: {} expressions, at most {MAX_CONSTRAINTS}",
                constraints.len()
            )));
        }
        constraints.extend(LabelExpr::parse_list(IMAGES_LABEL).expect("a label name is an expression"));
        // Only the leader holds the agents' streams.
        self.s.linearizable().await?;
        if image.digest.is_none() {
            let registry = self.policies.registry().ok_or_else(|| {
                Status::failed_precondition(
                    "invalid image: this scheduler does not resolve tags (muster server --no-image-resolve): \
                     give REF@sha256:…",
                )
            })?;
            let resolved = tokio::time::timeout(super::client::RESOLVE_TIMEOUT, registry.resolve(&image)).await;
            image = match resolved {
                Ok(Ok(digest)) => image.pinned(&digest),
                Ok(Err(muster_registry::PullError::NotFound(why))) => {
                    return Err(Status::invalid_argument(format!(
                        "invalid image: {image} is not in its registry: {why}"
                    )));
                }
                Ok(Err(e)) => {
                    return Err(Status::unavailable(format!("image {image}: the tag cannot be resolved: {e}")));
                }
                Err(_) => return Err(Status::deadline_exceeded(format!("image {image}: the registry did not answer"))),
            };
        }
        let digest = image.digest.clone().expect("pinned above");
        let reference = image.to_string();
        let agents = self.work.agents();
        let mut out =
            v1::PrefetchImageResponse { image: reference.clone(), digest: digest.clone(), ..Default::default() };
        self.s.reader().read(|st| {
            for n in st.nodes() {
                if n.status != NodeStatus::Ready || !constraints.iter().all(|c| c.matches(&n.labels)) {
                    continue;
                }
                let id = n.id.to_string();
                if n.images.binary_search(&digest).is_ok() {
                    out.cached.push(id);
                } else if agents.try_send(
                    &n.id,
                    v1::scheduler_message::Msg::PrefetchImage(v1::PrefetchImage { image: reference.clone() }),
                ) {
                    out.node_ids.push(id);
                } else {
                    out.unreachable.push(id);
                }
            }
        });
        tracing::info!(
            image = %reference, asked = out.node_ids.len(), cached = out.cached.len(),
            unreachable = out.unreachable.len(), "image prefetch"
        );
        metrics::counter!("muster_image_prefetch_nodes_total").increment(out.node_ids.len() as u64);
        Ok(out)
    }
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn prefetch_image(
        &self,
        req: Request<v1::PrefetchImageRequest>,
    ) -> Result<Response<v1::PrefetchImageResponse>, Status> {
        req.get_ref().check_bounds()?;
        self.prefetch(req.into_inner()).await.map(Response::new)
    }

    async fn admit_node(&self, req: Request<v1::AdmitNodeRequest>) -> Result<Response<v1::AdmitNodeResponse>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        let id = node_id(q.id)?;
        let admission = match (q.revoke, q.admission) {
            (true, Some(_)) => {
                return Err(Status::invalid_argument("invalid admission: revoke withdraws it; send one or the other"));
            }
            (true, None) => None,
            (false, None) => return Err(Status::invalid_argument("invalid admission: is required (or revoke)")),
            (false, Some(a)) => {
                let r =
                    a.resources.ok_or_else(|| Status::invalid_argument("invalid admission.resources: is required"))?;
                let admission = crate::sm::Admission {
                    resources: crate::sm::Resources {
                        gpus: r.gpus,
                        vram_mb: r.vram_mb,
                        mem_mb: r.mem_mb,
                        cpus: r.cpus,
                    },
                    labels: a.labels.into_iter().collect(),
                    cert_sha256: if a.cert_sha256.is_empty() { None } else { Some(parse_sha256(&a.cert_sha256)?) },
                    by: bound_by(&caller, &a.by),
                    at_ms: 0,
                };
                let limits = self.s.reader().read(|st| st.limits().clone());
                crate::sm::validate_admission(&admission, &limits).map_err(|r| rejection_to_status(&r))?;
                Some(admission)
            }
        };
        let cmd = Command::AdmitNode { node: id.clone(), admission };
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {}
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        let admission = self
            .s
            .reader()
            .read(|st| st.node_policy(&id).and_then(|p| p.admission.as_ref()).map(super::convert::admission_to_proto));
        Ok(Response::new(v1::AdmitNodeResponse { id: id.to_string(), admission }))
    }

    async fn label_node(&self, req: Request<v1::LabelNodeRequest>) -> Result<Response<v1::LabelNodeResponse>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        let id = node_id(q.id)?;
        if q.set.is_empty() && q.remove.is_empty() {
            return Err(Status::invalid_argument("invalid set: set or remove at least one label"));
        }
        let cmd = Command::LabelNode {
            node: id.clone(),
            set: q.set.into_iter().collect(),
            remove: q.remove,
            by: bound_by(&caller, ""),
        };
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => self.work.wake_admission(),
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        Ok(Response::new(self.s.reader().read(|st| {
            let node = st.node_slot(&id).map(|s| st.node(s));
            v1::LabelNodeResponse {
                id: id.to_string(),
                admin_labels: st.node_policy(&id).map(|p| p.labels.clone().into_iter().collect()).unwrap_or_default(),
                labels: node.map(|n| n.labels.clone().into_iter().collect()).unwrap_or_default(),
                registered: node.is_some(),
            }
        })))
    }

    type WatchNodesStream = ReceiverStream<Result<v1::NodeEvent, Status>>;

    async fn list_nodes(&self, req: Request<v1::ListNodesRequest>) -> Result<Response<v1::ListNodesResponse>, Status> {
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        if q.page_size > MAX_PAGE_SIZE {
            return Err(Status::invalid_argument(format!(
                "invalid page_size: {} is above the maximum of {MAX_PAGE_SIZE}",
                q.page_size
            )));
        }
        let page_size = if q.page_size == 0 { 100 } else { q.page_size } as usize;
        self.s.linearizable().await?;
        let (nodes, more) = self.s.reader().read(|st| {
            let mut after: Vec<&muster_core::sm::Node> =
                st.nodes().iter().filter(|n| n.id.as_str() > q.page_token.as_str()).collect();
            after.sort_by(|a, b| a.id.cmp(&b.id));
            // As alloc list: page_size nodes or MAX_PAGE_BYTES, whichever
            // comes first (always one).
            let (mut page, mut bytes) = (Vec::new(), 0);
            for n in &after {
                if page.len() == page_size || (!page.is_empty() && bytes >= MAX_PAGE_BYTES) {
                    break;
                }
                let p = node_to_proto(st, n);
                bytes += prost::Message::encoded_len(&p);
                page.push(p);
            }
            let more = page.len() < after.len();
            (page, more)
        });
        let next_page_token = if more { nodes.last().map(|n| n.id.clone()).unwrap_or_default() } else { String::new() };
        Ok(Response::new(v1::ListNodesResponse { nodes, next_page_token }))
    }

    async fn get_node(&self, req: Request<v1::GetNodeRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let id = node_id(req.into_inner().id)?;
        self.s.linearizable().await?;
        self.node(&id).map(Response::new)
    }

    async fn drain_node(&self, req: Request<v1::DrainNodeRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let q = with_bound_by(req, |q| &mut q.by);
        let id = node_id(q.id)?;
        let timeout_ms = self.timeout_for(&id, q.timeout_ms).await?;
        // An out-of-range timeout (or a bad reason) is refused before the log.
        let limits = self.s.reader().read(|st| st.limits().clone());
        crate::sm::validate_node_request(&q.by, &q.reason, Some(timeout_ms), &limits)
            .map_err(|r| rejection_to_status(&r))?;
        let cmd = Command::DrainNode { node: id.clone(), timeout_ms, reason: q.reason, by: q.by };
        self.transition(&id, cmd).await
    }

    async fn cancel_drain(&self, req: Request<v1::NodeActionRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let q = action(req);
        let id = node_id(q.id)?;
        self.transition(&id, Command::CancelDrain { node: id.clone(), by: q.by }).await
    }

    async fn stop_node(&self, req: Request<v1::NodeActionRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let q = action(req);
        let id = node_id(q.id)?;
        self.transition(&id, Command::StopNode { node: id.clone(), reason: q.reason, by: q.by }).await
    }

    async fn restart_node(&self, req: Request<v1::NodeActionRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let q = action(req);
        let id = node_id(q.id)?;
        self.transition(&id, Command::RestartNode { node: id.clone(), by: q.by }).await
    }

    async fn terminate_node(&self, req: Request<v1::NodeActionRequest>) -> Result<Response<v1::Node>, Status> {
        req.get_ref().check_bounds()?;
        let q = action(req);
        let id = node_id(q.id)?;
        self.transition(&id, Command::TerminateNode { node: id.clone(), by: q.by }).await
    }

    async fn scale_down(&self, req: Request<v1::ScaleDownRequest>) -> Result<Response<v1::ScaleDownResponse>, Status> {
        req.get_ref().check_bounds()?;
        let q = with_bound_by(req, |q| &mut q.by);
        if q.count == 0 {
            return Err(Status::invalid_argument("invalid count: must be at least 1"));
        }
        if q.by.is_empty() {
            return Err(Status::invalid_argument("invalid by: must name who asks"));
        }
        self.s.linearizable().await?;
        let selector: BTreeMap<String, String> = q.selector.into_iter().collect();
        let default_ms = self.policies.drain_timeout().as_millis() as u64;
        let admission = self.policies.admission();
        let (picked, short_by) = self.s.reader().read(|st| {
            let plan = plan_admission(st, self.s.now(st), &admission);
            let soon = planned_nodes(st, &plan.commands);
            let (choice, short_by) = plan_scale_down(st, q.count, &selector, &soon);
            let picked: Vec<(v1::ScaleDownChoice, u64)> = choice
                .into_iter()
                .map(|c| {
                    let node = st.node(c.slot);
                    let choice = v1::ScaleDownChoice {
                        id: node.id.to_string(),
                        idle: c.idle,
                        tasks: c.tasks,
                        gpus_used: c.gpus_used,
                        drained: false,
                        error: String::new(),
                    };
                    (choice, drain_timeout_ms(node, q.timeout_ms, default_ms))
                })
                .collect();
            (picked, short_by)
        });
        let mut chosen = Vec::with_capacity(picked.len());
        for (mut c, timeout_ms) in picked {
            if !q.dry_run {
                let cmd = Command::DrainNode {
                    node: NodeId::new(c.id.clone()),
                    timeout_ms,
                    reason: if q.reason.is_empty() { "scale-down".to_string() } else { q.reason.clone() },
                    by: q.by.clone(),
                };
                match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
                    Outcome::Accepted(_) => c.drained = true,
                    Outcome::Rejected(r) => c.error = rejection_to_status(&r).message().to_string(),
                }
            }
            chosen.push(c);
        }
        Ok(Response::new(v1::ScaleDownResponse { chosen, short_by }))
    }

    async fn watch_nodes(
        &self,
        req: Request<v1::WatchNodesRequest>,
    ) -> Result<Response<Self::WatchNodesStream>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let q = req.into_inner();
        self.s.linearizable().await?;
        // One node from from_revision, or every node from its current revision.
        let only = if q.id.is_empty() { None } else { Some(NodeId::new(q.id)) };
        let mut cursors: BTreeMap<NodeId, u64> = self
            .s
            .reader()
            .read(|st| match &only {
                Some(id) => st.node_slot(id).map(|_| BTreeMap::from([(id.clone(), q.from_revision)])),
                None => Some(st.nodes().iter().map(|n| (n.id.clone(), n.revision)).collect()),
            })
            .ok_or_else(|| {
                Status::not_found(format!("node {} does not exist", only.as_ref().map_or("", |n| n.as_str())))
            })?;
        let (tx, rx) = mpsc::channel(64);
        let s = self.s.clone();
        // After the linearizable read, this replica's applied state only
        // moves forward along the committed log.
        tokio::spawn(async move {
            let mut metrics = s.raft().metrics();
            loop {
                if let Err(status) = super::auth::stream_still_authorised(&s, &caller) {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                let (batch, ended) = s.reader().read(|st| {
                    let mut batch = Vec::new();
                    let nodes: Vec<&crate::sm::Node> = match &only {
                        Some(id) => st.node_slot(id).map(|slot| st.node(slot)).into_iter().collect(),
                        None => st.nodes().iter().collect(),
                    };
                    for n in nodes {
                        let cursor = cursors.get(&n.id).copied().unwrap_or(0);
                        if n.revision > cursor {
                            batch.extend(
                                n.history.iter().filter(|h| h.revision > cursor).map(|h| node_event_to_proto(n, h)),
                            );
                            cursors.insert(n.id.clone(), n.revision);
                        }
                    }
                    let ended = only
                        .as_ref()
                        .and_then(|id| st.node_slot(id))
                        .is_some_and(|slot| st.node(slot).status == NodeStatus::Terminated);
                    (batch, ended)
                });
                for e in batch {
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
                    _ = tokio::time::sleep(super::client::TOKEN_RECHECK) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
