//! `muster vcluster`: create, update, get and list vClusters
//! (docs/vclusters.md). Writes need an admin identity.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use muster_proto::v1;
use muster_proto::v1::v_cluster_service_client::VClusterServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

#[derive(Subcommand, Debug)]
pub enum VClusterCmd {
    /// Create a vCluster (home nodes default to the label muster.vcluster=NAME).
    Create {
        /// Its name: 1-63 characters of a-z 0-9 -, not starting with -.
        name: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// Change a vCluster: the flags given replace those fields, the rest stay.
    Update {
        /// Its name ("default" always exists).
        name: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// One vCluster: spec, revision, and the nodes its home selector picks.
    Get {
        /// Its name.
        name: String,
    },
    /// Every vCluster.
    List,
}

/// The fields of a spec; unset flags keep the current value (update) or
/// take the default (create).
#[derive(Args, Debug, Default)]
pub struct SpecArgs {
    /// hpc-batch, ml-training, service, sensitive or interactive.
    #[arg(long = "type")]
    vtype: Option<String>,
    /// Home nodes are those with every such label (repeatable); replaces
    /// --home-node.
    #[arg(long = "home-label", value_name = "KEY=VALUE")]
    home_labels: Vec<String>,
    /// Home nodes are exactly these (repeatable); replaces --home-label.
    #[arg(long = "home-node", value_name = "NODE")]
    home_nodes: Vec<String>,
    /// Most GPUs its tasks may hold at once, or "none".
    #[arg(long)]
    max_gpus: Option<String>,
    /// Most nodes its tasks may occupy, or "none".
    #[arg(long)]
    max_nodes: Option<String>,
    /// Most allocations reserved or running at once, or "none".
    #[arg(long)]
    max_allocations: Option<String>,
    /// The share of its demand it may run on other vClusters' idle nodes,
    /// e.g. 20 or 20%.
    #[arg(long)]
    borrow_limit: Option<String>,
    /// What happens to a submission past a quota: queue or reject.
    #[arg(long)]
    over_quota: Option<String>,
    /// Where its allocations' checkpoints go (node, a shared path, an
    /// object-store URL), or "cluster" for the cluster's store.
    #[arg(long, value_name = "STORE")]
    checkpoint_store: Option<String>,
    /// The largest checkpoint its tasks may save (e.g. 500G), or "cluster"
    /// for the cluster's cap.
    #[arg(long, value_name = "SIZE")]
    max_checkpoint_bytes: Option<String>,
}

/// `none` or a positive number, for a quota flag.
fn quota(flag: &str, v: &str) -> anyhow::Result<Option<u32>> {
    if v == "none" {
        return Ok(None);
    }
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => bail!("--{flag} {v:?}: a positive number, or none for no limit"),
    }
}

impl SpecArgs {
    /// Applies the flags given to `spec`.
    fn apply(&self, spec: &mut v1::VClusterSpec) -> anyhow::Result<()> {
        if let Some(t) = &self.vtype {
            spec.r#type = t.clone();
        }
        if !self.home_labels.is_empty() && !self.home_nodes.is_empty() {
            bail!("--home-label and --home-node: give one or the other");
        }
        if !self.home_labels.is_empty() {
            spec.home_nodes.clear();
            spec.home_labels.clear();
            for kv in &self.home_labels {
                let (k, v) = kv.split_once('=').with_context(|| format!("--home-label {kv:?} is not KEY=VALUE"))?;
                spec.home_labels.insert(k.to_string(), v.to_string());
            }
        }
        if !self.home_nodes.is_empty() {
            spec.home_labels.clear();
            spec.home_nodes = self.home_nodes.clone();
        }
        if let Some(v) = &self.max_gpus {
            spec.max_gpus = quota("max-gpus", v)?;
        }
        if let Some(v) = &self.max_nodes {
            spec.max_nodes = quota("max-nodes", v)?;
        }
        if let Some(v) = &self.max_allocations {
            spec.max_allocations = quota("max-allocations", v)?;
        }
        if let Some(b) = &self.borrow_limit {
            spec.borrow_limit_pct = b
                .trim_end_matches('%')
                .parse::<u32>()
                .ok()
                .filter(|p| *p <= 100)
                .with_context(|| format!("--borrow-limit {b:?}: a percentage from 0 to 100"))?;
        }
        if let Some(o) = &self.over_quota {
            spec.over_quota = o.clone();
        }
        match self.checkpoint_store.as_deref() {
            None => {}
            Some("cluster") => spec.checkpoint_store.clear(),
            Some(st) => {
                muster_scheduler::sm::CheckpointStore::parse(st)
                    .map_err(|e| anyhow::anyhow!("--checkpoint-store {e}"))?;
                spec.checkpoint_store = st.to_string();
            }
        }
        match self.max_checkpoint_bytes.as_deref() {
            None => {}
            Some("cluster") => spec.max_checkpoint_bytes = None,
            Some(b) => {
                let n =
                    muster_agent::janitor::parse_size(b).map_err(|e| anyhow::anyhow!("--max-checkpoint-bytes {e}"))?;
                spec.max_checkpoint_bytes = Some(n);
            }
        }
        Ok(())
    }
}

fn vcluster_json(v: &v1::VCluster) -> serde_json::Value {
    let s = v.spec.clone().unwrap_or_default();
    json!({
        "name": v.name,
        "type": s.r#type,
        "home_labels": s.home_labels,
        "home_nodes": s.home_nodes,
        "home_node_ids": v.home_node_ids,
        "max_gpus": s.max_gpus,
        "max_nodes": s.max_nodes,
        "max_allocations": s.max_allocations,
        "borrow_limit_pct": s.borrow_limit_pct,
        "over_quota": s.over_quota,
        "checkpoint_store": s.checkpoint_store,
        "max_checkpoint_bytes": s.max_checkpoint_bytes,
        "revision": v.revision,
        "created_ms": v.created_ms,
        "updated_ms": v.updated_ms,
        "updated_by": v.updated_by,
    })
}

fn limit(v: Option<u32>) -> String {
    v.map_or("-".to_string(), |n| n.to_string())
}

fn home(s: &v1::VClusterSpec) -> String {
    if s.home_nodes.is_empty() {
        let mut labels: Vec<String> = s.home_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        labels.join(",")
    } else {
        s.home_nodes.join(",")
    }
}

fn print(vs: &[v1::VCluster], out: Output) -> anyhow::Result<()> {
    match out {
        Output::Json if vs.len() == 1 => out!("{}", serde_json::to_string_pretty(&vcluster_json(&vs[0]))?),
        Output::Json => {
            let all: Vec<_> = vs.iter().map(vcluster_json).collect();
            out!("{}", serde_json::to_string_pretty(&json!({ "vclusters": all }))?)
        }
        Output::Text => {
            out!(
                "{:<20} {:<12} {:>8} {:>9} {:>11} {:>12} {:<16} {:>8} {:>10}  HOME_SELECTOR",
                "NAME",
                "TYPE",
                "MAX_GPUS",
                "MAX_NODES",
                "MAX_ALLOCS",
                "BORROW_LIMIT",
                "OVER_QUOTA",
                "REVISION",
                "HOME_NODES"
            );
            for v in vs {
                let s = v.spec.clone().unwrap_or_default();
                out!(
                    "{:<20} {:<12} {:>8} {:>9} {:>11} {:>11}% {:<16} {:>8} {:>10}  {}",
                    v.name,
                    s.r#type,
                    limit(s.max_gpus),
                    limit(s.max_nodes),
                    limit(s.max_allocations),
                    s.borrow_limit_pct,
                    s.over_quota,
                    v.revision,
                    v.home_node_ids.len(),
                    home(&s)
                );
            }
        }
    }
    Ok(())
}

async fn get(cluster: &mut Cluster, name: &str) -> anyhow::Result<v1::VCluster> {
    let req = v1::GetVClusterRequest { name: name.to_string() };
    Ok(cluster
        .call(|ch| {
            let req = req.clone();
            async move { VClusterServiceClient::new(ch).get_v_cluster(req).await }
        })
        .await?
        .into_inner())
}

/// Creates vCluster `name` with the defaults (type hpc-batch, home nodes
/// labelled `muster.vcluster=<name>`) unless it exists. Each call waits
/// through an election ([`Cluster::call`]).
pub async fn ensure(cluster: &mut Cluster, name: &str) -> anyhow::Result<()> {
    if get(cluster, name).await.is_err() {
        let req = v1::VClusterRequest { name: name.to_string(), spec: Some(Default::default()) };
        put(cluster, req, true).await.with_context(|| format!("cannot create vCluster {name}"))?;
    }
    Ok(())
}

/// Creates (`create`) or updates a vCluster through the leader.
async fn put(cluster: &mut Cluster, req: v1::VClusterRequest, create: bool) -> anyhow::Result<v1::VCluster> {
    Ok(cluster
        .call(|ch| {
            let req = req.clone();
            async move {
                let mut c = VClusterServiceClient::new(ch);
                if create { c.create_v_cluster(req).await } else { c.update_v_cluster(req).await }
            }
        })
        .await?
        .into_inner())
}

pub async fn run(cluster: &mut Cluster, cmd: VClusterCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        VClusterCmd::Create { name, spec } => {
            let mut s = v1::VClusterSpec::default();
            spec.apply(&mut s)?;
            print(&[put(cluster, v1::VClusterRequest { name, spec: Some(s) }, true).await?], out)
        }
        VClusterCmd::Update { name, spec } => {
            let mut s = get(cluster, &name).await?.spec.unwrap_or_default();
            spec.apply(&mut s)?;
            print(&[put(cluster, v1::VClusterRequest { name, spec: Some(s) }, false).await?], out)
        }
        VClusterCmd::Get { name } => print(&[get(cluster, &name).await?], out),
        VClusterCmd::List => {
            // Every page, in name order.
            let (mut all, mut token) = (Vec::new(), String::new());
            loop {
                let q = v1::ListVClustersRequest { page_size: 1000, page_token: token.clone() };
                let r = cluster
                    .call(|ch| {
                        let q = q.clone();
                        async move { VClusterServiceClient::new(ch).list_v_clusters(q).await }
                    })
                    .await?
                    .into_inner();
                all.extend(r.vclusters);
                if r.next_page_token.is_empty() {
                    break;
                }
                token = r.next_page_token;
            }
            print(&all, out)
        }
    }
}
