//! `muster node list|get|watch|drain|cancel-drain|stop|restart|terminate|scale-down`:
//! the nodes as the scheduler knows them, and their lifecycle (docs/nodes.md).

use std::collections::HashMap;

use anyhow::{Context, bail};
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
    /// One node, with its drain (if any) and its latest events.
    Get {
        /// The node id.
        id: String,
    },
    /// Follow node events (drain started/cancelled/completed/timed out,
    /// stopped, …): one node from the beginning of its kept history, or
    /// every node from now on.
    Watch {
        /// The node id (left out: every node).
        id: Option<String>,
        /// Start after this revision of the node (with an id).
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Take a node out of service gracefully: no new work lands there, its
    /// running tasks finish, and it stops once empty. At the deadline the
    /// remaining tasks are preempted (checkpoint hint or SIGTERM) and
    /// re-queued elsewhere.
    Drain {
        /// The node id.
        id: String,
        /// Until the remaining tasks are moved (e.g. 30m, 4h). Default: the
        /// node's muster.drain-timeout label, else the server's (4h).
        #[arg(long)]
        timeout: Option<String>,
        /// Why (recorded with the drain).
        #[arg(long, default_value = "")]
        reason: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
    /// Cancel a drain: the node is ready again.
    CancelDrain {
        /// The node id.
        id: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
    /// Stop a node that holds nothing (ready, draining, stopping or lost).
    Stop {
        /// The node id.
        id: String,
        /// Why (recorded).
        #[arg(long, default_value = "")]
        reason: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
    /// Return a stopped node to service.
    Restart {
        /// The node id.
        id: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
    /// Retire a stopped node for good.
    Terminate {
        /// The node id.
        id: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
    /// Pick K nodes to retire (idle ones first) and drain them.
    ScaleDown {
        /// How many nodes.
        #[arg(long)]
        count: u32,
        /// Only say which nodes would be drained.
        #[arg(long)]
        dry_run: bool,
        /// Drain timeout (as for `drain`).
        #[arg(long)]
        timeout: Option<String>,
        /// Only nodes with this label (KEY=VALUE; repeatable).
        #[arg(long = "selector")]
        selector: Vec<String>,
        /// Why (recorded with each drain).
        #[arg(long, default_value = "")]
        reason: String,
        /// Who asks (default: $USER, else the login name).
        #[arg(long)]
        by: Option<String>,
    },
}

fn status_name(raw: i32) -> String {
    v1::NodeStatus::try_from(raw)
        .map(|s| s.as_str_name().trim_start_matches("NODE_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

fn event_json(e: &v1::NodeEvent) -> serde_json::Value {
    json!({
        "node": e.node_id, "revision": e.revision, "time_ms": e.time_ms, "kind": e.kind,
        "detail": e.detail, "status": status_name(e.status),
    })
}

fn node_json(n: &v1::Node) -> serde_json::Value {
    let r = n.resources.unwrap_or_default();
    let u = n.used.unwrap_or_default();
    json!({
        "id": n.id,
        "status": status_name(n.status),
        "status_since_ms": n.status_since_ms,
        "gpus": r.gpus, "gpus_used": u.gpus, "vram_mb": r.vram_mb,
        "mem_mb": r.mem_mb, "mem_mb_used": u.mem_mb,
        "cpus": r.cpus, "cpus_used": u.cpus,
        "tasks": n.tasks,
        "labels": n.labels,
        "registered_at_ms": n.registered_at_ms,
        "drain": n.drain.as_ref().map(|d| json!({
            "started_at_ms": d.started_at_ms, "deadline_ms": d.deadline_ms, "reason": d.reason, "by": d.by,
        })),
        "revision": n.revision,
        "events": n.events.iter().map(event_json).collect::<Vec<_>>(),
    })
}

/// The header of [`node_line`]'s table.
fn node_header() -> String {
    format!("{:<16}  {:<10}  {:<7}  {:<17}  {:<9}  TASKS", "NODE", "STATUS", "GPUS", "MEMORY (MB)", "CPUS")
}

/// One node: what it has in use of what it offers.
fn node_line(n: &v1::Node) -> String {
    let r = n.resources.unwrap_or_default();
    let u = n.used.unwrap_or_default();
    format!(
        "{:<16}  {:<10}  {:<7}  {:<17}  {:<9}  {}",
        n.id,
        status_name(n.status),
        format!("{}/{}", u.gpus, r.gpus),
        format!("{}/{}", u.mem_mb, r.mem_mb),
        format!("{}/{}", u.cpus, r.cpus),
        n.tasks
    )
}

/// Milliseconds since the epoch as UTC, to the second.
fn when(ms: u64) -> String {
    muster_scheduler::server::convert::format_time_ms(ms)
}

fn event_line(e: &v1::NodeEvent) -> String {
    format!("{}  #{:<3} {:<16} {}", when(e.time_ms), e.revision, e.kind, e.detail)
}

fn print_node(n: &v1::Node, out: Output) -> anyhow::Result<()> {
    match out {
        Output::Json => out!("{}", serde_json::to_string_pretty(&node_json(n))?),
        Output::Text => {
            out!("{}", node_header());
            out!("{}", node_line(n));
            if let Some(d) = &n.drain {
                out!(
                    "  drain: by {} since {}, deadline {}{}",
                    d.by,
                    when(d.started_at_ms),
                    when(d.deadline_ms),
                    if d.reason.is_empty() { String::new() } else { format!(" ({})", d.reason) }
                );
            }
            for (k, v) in &n.labels {
                out!("  {k}={v}");
            }
            if !n.events.is_empty() {
                out!("  events:");
                for e in &n.events {
                    out!("    {}", event_line(e));
                }
            }
        }
    }
    Ok(())
}

/// Who asks: `--by`, else `$USER` or `$LOGNAME`, else the login name of
/// this process's user (`uid N` when it has none).
fn who(by: Option<String>) -> anyhow::Result<String> {
    if let Some(b) = by {
        if b.trim().is_empty() {
            bail!("--by must not be empty");
        }
        return Ok(b);
    }
    let env = ["USER", "LOGNAME"].iter().filter_map(|k| std::env::var(k).ok()).find(|v| !v.trim().is_empty());
    Ok(env.unwrap_or_else(login_name))
}

fn login_name() -> String {
    // SAFETY: getuid has no preconditions; getpwuid returns null or a
    // pointer to a static record whose pw_name is a C string, read at once.
    unsafe {
        let uid = libc::getuid();
        let pw = libc::getpwuid(uid);
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            return std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned();
        }
        format!("uid {uid}")
    }
}

fn timeout_ms(timeout: Option<&str>) -> anyhow::Result<Option<u64>> {
    timeout
        .map(|t| {
            crate::alloc::parse_duration_s(t)
                .context("--timeout")
                .and_then(|s| s.checked_mul(1000).with_context(|| format!("--timeout {t:?} is too long")))
        })
        .transpose()
}

pub async fn run(cluster: &mut Cluster, cmd: NodeCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::List => {
            // Every page, in id order.
            let mut nodes = Vec::new();
            let mut token = String::new();
            loop {
                let q = v1::ListNodesRequest { page_size: 1000, page_token: token.clone() };
                let page = cluster
                    .call(|ch| {
                        let q = q.clone();
                        async move { NodeServiceClient::new(ch).list_nodes(q).await }
                    })
                    .await?
                    .into_inner();
                nodes.extend(page.nodes);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "nodes": nodes.iter().map(node_json).collect::<Vec<_>>() }))?
                ),
                Output::Text if nodes.is_empty() => out!("no nodes registered"),
                Output::Text => {
                    out!("{}", node_header());
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
            print_node(&n, out)?;
        }
        NodeCmd::Drain { id, timeout, reason, by } => {
            let req = v1::DrainNodeRequest { id, timeout_ms: timeout_ms(timeout.as_deref())?, reason, by: who(by)? };
            let n = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).drain_node(req).await }
                })
                .await?
                .into_inner();
            print_node(&n, out)?;
        }
        NodeCmd::CancelDrain { id, by } => {
            let req = v1::NodeActionRequest { id, reason: String::new(), by: who(by)? };
            let n = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).cancel_drain(req).await }
                })
                .await?
                .into_inner();
            print_node(&n, out)?;
        }
        NodeCmd::Stop { id, reason, by } => {
            let req = v1::NodeActionRequest { id, reason, by: who(by)? };
            let n = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).stop_node(req).await }
                })
                .await?
                .into_inner();
            print_node(&n, out)?;
        }
        NodeCmd::Restart { id, by } => {
            let req = v1::NodeActionRequest { id, reason: String::new(), by: who(by)? };
            let n = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).restart_node(req).await }
                })
                .await?
                .into_inner();
            print_node(&n, out)?;
        }
        NodeCmd::Terminate { id, by } => {
            let req = v1::NodeActionRequest { id, reason: String::new(), by: who(by)? };
            let n = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).terminate_node(req).await }
                })
                .await?
                .into_inner();
            print_node(&n, out)?;
        }
        NodeCmd::ScaleDown { count, dry_run, timeout, selector, reason, by } => {
            if count == 0 {
                bail!("--count must be at least 1");
            }
            let mut labels = HashMap::new();
            for kv in &selector {
                let (k, v) = kv.split_once('=').with_context(|| format!("--selector {kv:?} is not KEY=VALUE"))?;
                labels.insert(k.to_string(), v.to_string());
            }
            let req = v1::ScaleDownRequest {
                count,
                dry_run,
                timeout_ms: timeout_ms(timeout.as_deref())?,
                reason,
                by: who(by)?,
                selector: labels,
            };
            let resp = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).scale_down(req).await }
                })
                .await?
                .into_inner();
            let failed = resp.chosen.iter().filter(|c| !c.error.is_empty()).count();
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "dry_run": dry_run,
                        "short_by": resp.short_by,
                        "chosen": resp.chosen.iter().map(|c| json!({
                            "id": c.id, "idle": c.idle, "tasks": c.tasks, "gpus_used": c.gpus_used,
                            "drained": c.drained, "error": c.error,
                        })).collect::<Vec<_>>(),
                    }))?
                ),
                Output::Text => {
                    for c in &resp.chosen {
                        let what = if c.idle {
                            "idle".to_string()
                        } else {
                            format!("busy: {} task(s), {} GPU(s)", c.tasks, c.gpus_used)
                        };
                        let done = match (dry_run, c.drained, c.error.as_str()) {
                            (true, _, _) => "would drain".to_string(),
                            (false, true, _) => "draining".to_string(),
                            (false, false, e) => format!("not drained: {e}"),
                        };
                        out!("{:<16}  {:<32}  {done}", c.id, what);
                    }
                    if resp.short_by > 0 {
                        out!("{} fewer ready node(s) matched than asked for", resp.short_by);
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} chosen node(s) could not be drained", resp.chosen.len());
            }
        }
        NodeCmd::Watch { id, from } => {
            let req = v1::WatchNodesRequest { id: id.unwrap_or_default(), from_revision: from };
            let mut stream = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).watch_nodes(req).await }
                })
                .await?
                .into_inner();
            while let Some(e) = stream.message().await.map_err(|s| anyhow::anyhow!(crate::client::describe(&s)))? {
                match out {
                    Output::Json => out!("{}", event_json(&e)),
                    Output::Text => out!("{:<16}  {}", e.node_id, event_line(&e)),
                }
            }
        }
    }
    Ok(())
}
