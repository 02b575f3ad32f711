//! `muster image prefetch`: warm the image caches of the nodes a large gang
//! will run on, before it is submitted (docs/containers.md).

use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::node_service_client::NodeServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Pull an image into the caches of the ready nodes that run images and
    /// meet the constraints (admins only). The tag is pinned to its digest
    /// first; nodes that hold it already are left alone.
    Prefetch {
        /// The image (REGISTRY/REPOSITORY[:TAG][@DIGEST]).
        image: String,
        /// Only nodes meeting this label expression (as submit's
        /// --constraint; repeatable).
        #[arg(long = "constraint", value_name = "EXPR")]
        constraints: Vec<String>,
        /// Wait until every node asked holds it, at most this long (e.g.
        /// 10m); a node that does not by then fails the command.
        #[arg(long, value_name = "DURATION")]
        wait: Option<String>,
    },
}

pub async fn run(cluster: &mut Cluster, cmd: ImageCmd, out: Output) -> anyhow::Result<()> {
    let ImageCmd::Prefetch { image, constraints, wait } = cmd;
    let wait =
        wait.map(|w| crate::args::parse_duration_s(&w).context("--wait").map(Duration::from_secs)).transpose()?;
    let req = v1::PrefetchImageRequest { image, constraints };
    let r = cluster
        .call(|ch| {
            let req = req.clone();
            async move { NodeServiceClient::new(ch).prefetch_image(req).await }
        })
        .await?
        .into_inner();
    let mut missing: Vec<String> = Vec::new();
    if let Some(wait) = wait {
        missing = wait_for(cluster, &r.digest, &r.node_ids, wait).await?;
    }
    match out {
        Output::Json => out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "image": r.image,
                "digest": r.digest,
                "asked": r.node_ids,
                "cached": r.cached,
                "unreachable": r.unreachable,
                "not_cached_in_time": missing,
            }))?
        ),
        Output::Text => {
            out!("image {}", r.image);
            out!(
                "{} node(s) asked to pull it, {} hold it already{}",
                r.node_ids.len(),
                r.cached.len(),
                if r.unreachable.is_empty() {
                    String::new()
                } else {
                    format!(", {} with no agent connected: {}", r.unreachable.len(), r.unreachable.join(", "))
                }
            );
            if wait.is_some() && missing.is_empty() {
                out!("every node asked holds it now");
            }
        }
    }
    if !missing.is_empty() {
        bail!("{} node(s) did not hold the image in time: {}", missing.len(), missing.join(", "));
    }
    if r.node_ids.is_empty() && r.cached.is_empty() {
        bail!("no ready node that runs images meets the constraints");
    }
    Ok(())
}

/// Waits until every node of `nodes` reports holding `digest` (its
/// `images`), or `limit` passes; returns those that do not.
async fn wait_for(
    cluster: &mut Cluster,
    digest: &str,
    nodes: &[String],
    limit: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut left: Vec<String> = nodes.to_vec();
    loop {
        let mut still = Vec::new();
        for id in &left {
            let q = v1::GetNodeRequest { id: id.clone() };
            let n = cluster
                .call(|ch| {
                    let q = q.clone();
                    async move { NodeServiceClient::new(ch).get_node(q).await }
                })
                .await?
                .into_inner();
            if !n.images.iter().any(|d| d == digest) {
                still.push(id.clone());
            }
        }
        left = still;
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
