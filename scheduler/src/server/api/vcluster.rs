//! `muster.v1.VClusterService`: create, update, get and list vClusters.
//! Writes go through the log as `CreateVCluster` / `UpdateVCluster` (apply
//! validates again and decides a race by log order); reads are linearizable.

use std::collections::BTreeMap;

use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::v_cluster_service_server::VClusterService;
use muster_tls::Caller;
use tonic::{Request, Response, Status};

use super::auth::bound_by;
use super::convert::{propose_error_to_status, rejection_to_status};
use crate::server::raft::Consensus;
use crate::sm::{Command, HomeNodes, NodeId, Outcome, OverQuota, Quota, State, VCluster, VClusterSpec, VClusterType};

/// The vCluster API of one replica.
pub struct VClusterApi {
    s: Consensus,
}

impl VClusterApi {
    /// The vCluster API over a replica's shared parts.
    pub fn new(s: Consensus) -> Self {
        VClusterApi { s }
    }

    async fn put(&self, req: Request<v1::VClusterRequest>, create: bool) -> Result<Response<v1::VCluster>, Status> {
        let by = bound_by(&Caller::of(&req), "");
        let r = req.into_inner();
        let spec = spec_from_proto(&r.name, r.spec.unwrap_or_default())?;
        let name = r.name;
        // What can be judged without the log is refused before it: the name
        // and the spec anywhere, and on the leader (whose state holds every
        // acknowledged write) whether the vCluster exists, as apply checks.
        crate::sm::validate_vcluster_name(&name)
            .and_then(|()| crate::sm::validate_vcluster_spec(&spec))
            .map_err(|r| rejection_to_status(&r))?;
        let cmd = if create {
            Command::CreateVCluster { name: name.clone(), spec, by }
        } else {
            Command::UpdateVCluster { name: name.clone(), spec, by }
        };
        if self.s.is_leader() {
            self.s.reader().read(|st| st.precheck(&cmd)).map_err(|r| rejection_to_status(&r))?;
        }
        match self.s.proposer().propose(cmd).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {}
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        self.get_now(&name).map(Response::new)
    }

    fn get_now(&self, name: &str) -> Result<v1::VCluster, Status> {
        self.s
            .reader()
            .read(|st| st.vcluster(name).map(|v| to_proto(st, &v)))
            .ok_or_else(|| Status::not_found(format!("no vcluster {name}")))
    }
}

/// The spec a request describes; an unusable field is INVALID_ARGUMENT
/// naming it (apply checks the rest again).
pub fn spec_from_proto(name: &str, p: v1::VClusterSpec) -> Result<VClusterSpec, Status> {
    let bad = |field: &str, why: String| Status::invalid_argument(format!("invalid spec.{field}: {why}"));
    let vtype = match p.r#type.as_str() {
        "" => VClusterType::HpcBatch,
        t => VClusterType::parse(t)
            .ok_or_else(|| bad("type", format!("{t:?} (hpc-batch, ml-training, service, sensitive or interactive)")))?,
    };
    let home = match (p.home_labels.is_empty(), p.home_nodes.is_empty()) {
        (false, false) => return Err(bad("home_nodes", "give home labels or home nodes, not both".into())),
        (true, true) => HomeNodes::default_for(name),
        (false, true) => HomeNodes::Labels(p.home_labels.into_iter().collect::<BTreeMap<_, _>>()),
        (true, false) => HomeNodes::Nodes(p.home_nodes.into_iter().map(NodeId::new).collect()),
    };
    let borrow_limit_pct = u8::try_from(p.borrow_limit_pct)
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| bad("borrow_limit_pct", format!("{} is not between 0 and 100", p.borrow_limit_pct)))?;
    let over_quota = match p.over_quota.as_str() {
        "" => OverQuota::Queue,
        o => OverQuota::parse(o).ok_or_else(|| bad("over_quota", format!("{o:?} (queue or reject)")))?,
    };
    let store = Some(p.checkpoint_store.trim())
        .filter(|s| !s.is_empty())
        .map(crate::sm::CheckpointStore::parse)
        .transpose()
        .map_err(|e| bad("checkpoint_store", e))?;
    if let Some(cap) = p.max_checkpoint_bytes {
        crate::sm::check_cap(cap).map_err(|e| bad("max_checkpoint_bytes", e))?;
    }
    Ok(VClusterSpec {
        vtype,
        home,
        quota: Quota { max_gpus: p.max_gpus, max_nodes: p.max_nodes, max_allocations: p.max_allocations },
        borrow_limit_pct,
        over_quota,
        checkpoints: crate::sm::VcCheckpoints { store, max_bytes: p.max_checkpoint_bytes },
    })
}

/// A vCluster on the wire, with the nodes its selector picks now.
pub fn to_proto(st: &State, v: &VCluster) -> v1::VCluster {
    let (home_labels, home_nodes) = match &v.spec.home {
        HomeNodes::Labels(l) => (l.clone().into_iter().collect(), Vec::new()),
        HomeNodes::Nodes(n) => (Default::default(), n.iter().map(|n| n.as_str().to_string()).collect()),
    };
    v1::VCluster {
        name: v.name.clone(),
        spec: Some(v1::VClusterSpec {
            r#type: v.spec.vtype.as_str().to_string(),
            home_labels,
            home_nodes,
            max_gpus: v.spec.quota.max_gpus,
            max_nodes: v.spec.quota.max_nodes,
            max_allocations: v.spec.quota.max_allocations,
            borrow_limit_pct: u32::from(v.spec.borrow_limit_pct),
            over_quota: v.spec.over_quota.as_str().to_string(),
            checkpoint_store: v.spec.checkpoints.store.as_ref().map(|s| s.spec()).unwrap_or_default(),
            max_checkpoint_bytes: v.spec.checkpoints.max_bytes,
        }),
        created_ms: v.created_ms,
        updated_ms: v.updated_ms,
        updated_by: v.updated_by.clone(),
        revision: v.revision,
        home_node_ids: st.home_nodes(v).into_iter().map(|s| st.node(s).id.as_str().to_string()).collect(),
    }
}

#[tonic::async_trait]
impl VClusterService for VClusterApi {
    async fn create_v_cluster(&self, req: Request<v1::VClusterRequest>) -> Result<Response<v1::VCluster>, Status> {
        req.get_ref().check_bounds()?;
        self.put(req, true).await
    }

    async fn update_v_cluster(&self, req: Request<v1::VClusterRequest>) -> Result<Response<v1::VCluster>, Status> {
        req.get_ref().check_bounds()?;
        self.put(req, false).await
    }

    async fn get_v_cluster(&self, req: Request<v1::GetVClusterRequest>) -> Result<Response<v1::VCluster>, Status> {
        req.get_ref().check_bounds()?;
        self.s.linearizable().await?;
        self.get_now(&req.into_inner().name).map(Response::new)
    }

    async fn list_v_clusters(
        &self,
        req: Request<v1::ListVClustersRequest>,
    ) -> Result<Response<v1::ListVClustersResponse>, Status> {
        use muster_proto::bounds::Bounded;
        use prost::Message;
        req.get_ref().check_bounds()?;
        let q = req.into_inner();
        let size = match q.page_size {
            0 => 100,
            n => n.min(super::client::MAX_PAGE_SIZE),
        } as usize;
        self.s.linearizable().await?;
        let (vclusters, more) = self.s.reader().read(|st| {
            let all = st.vclusters();
            let mut rest = all.iter().filter(|v| q.page_token.is_empty() || v.name.as_str() > q.page_token.as_str());
            let (mut page, mut bytes) = (Vec::new(), 0usize);
            for v in rest.by_ref() {
                let p = to_proto(st, v);
                bytes += p.encoded_len();
                // Every page holds at least one.
                if !page.is_empty() && (page.len() == size || bytes > super::client::MAX_PAGE_BYTES) {
                    return (page, true);
                }
                page.push(p);
            }
            (page, false)
        });
        let next_page_token =
            if more { vclusters.last().map(|v| v.name.clone()).unwrap_or_default() } else { String::new() };
        Ok(Response::new(v1::ListVClustersResponse { vclusters, next_page_token }))
    }
}
