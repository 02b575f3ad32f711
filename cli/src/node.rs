//! `muster node list|get`: the nodes as the scheduler knows them.

use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::node_service_client::NodeServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// Every node: status, GPUs used/total, memory, CPUs, tasks.
    List,
    /// One node.
    Get {
        /// The node id.
        id: String,
    },
}

fn status_name(raw: i32) -> String {
    v1::NodeStatus::try_from(raw)
        .map(|s| s.as_str_name().trim_start_matches("NODE_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

fn node_json(n: &v1::Node) -> serde_json::Value {
    let r = n.resources.unwrap_or_default();
    let u = n.used.unwrap_or_default();
    json!({
        "id": n.id,
        "status": status_name(n.status),
        "gpus": r.gpus, "gpus_used": u.gpus, "vram_mb": r.vram_mb,
        "mem_mb": r.mem_mb, "mem_mb_used": u.mem_mb,
        "cpus": r.cpus, "cpus_used": u.cpus,
        "tasks": n.tasks,
        "labels": n.labels,
        "registered_at_ms": n.registered_at_ms,
    })
}

fn node_line(n: &v1::Node) -> String {
    let r = n.resources.unwrap_or_default();
    let u = n.used.unwrap_or_default();
    format!(
        "{:<16}  {:<6}  GPUs {:>3}/{:<3}  mem {:>8}/{:<8} MB  CPUs {:>4}/{:<4}  tasks {}",
        n.id,
        status_name(n.status),
        u.gpus,
        r.gpus,
        u.mem_mb,
        r.mem_mb,
        u.cpus,
        r.cpus,
        n.tasks
    )
}

pub async fn run(cluster: &mut Cluster, cmd: NodeCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::List => {
            let nodes = cluster
                .call(|ch| async move { NodeServiceClient::new(ch).list_nodes(v1::ListNodesRequest {}).await })
                .await?
                .into_inner()
                .nodes;
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "nodes": nodes.iter().map(node_json).collect::<Vec<_>>() }))?
                ),
                Output::Text if nodes.is_empty() => out!("no nodes registered"),
                Output::Text => {
                    for n in &nodes {
                        out!("{}", node_line(n));
                    }
                }
            }
        }
        NodeCmd::Get { id } => {
            let n = cluster
                .call(|ch| {
                    let id = id.clone();
                    async move { NodeServiceClient::new(ch).get_node(v1::GetNodeRequest { id }).await }
                })
                .await?
                .into_inner();
            match out {
                Output::Json => out!("{}", serde_json::to_string_pretty(&node_json(&n))?),
                Output::Text => {
                    out!("{}", node_line(&n));
                    for (k, v) in &n.labels {
                        out!("  {k}={v}");
                    }
                }
            }
        }
    }
    Ok(())
}
