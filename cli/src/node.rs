//! `muster node list|get|watch|drain|cancel-drain|stop|restart|terminate|scale-down|admit|label`:
//! the nodes as the scheduler knows them, their lifecycle (docs/nodes.md),
//! and what admins decide about them (admission, reserved labels).

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
    /// Every node, in id order: status, GPUs, memory and CPUs as
    /// used/total, tasks.
    List {
        /// Add a column with each node's labels (KEY=VALUE, in key order).
        #[arg(long)]
        labels: bool,
    },
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
    /// Admit a node: the most it may claim when its agent registers, the
    /// labels it may report, and optionally the certificate it must present.
    /// Under `muster server --node-admission required` (the default) a node
    /// registers only once admitted. Takes effect at its next registration.
    Admit {
        /// The node id (it need not have registered yet).
        id: String,
        /// GPUs it may report.
        #[arg(long, default_value_t = 0)]
        gpus: u32,
        /// MB of GPU memory it may report (per node, in all).
        #[arg(long, default_value_t = 0)]
        vram_mb: u64,
        /// MB of memory it may report.
        #[arg(long)]
        mem_mb: Option<u64>,
        /// CPUs it may report.
        #[arg(long)]
        cpus: Option<u32>,
        /// A label it may report, KEY=VALUE (repeatable; KEY=* admits any
        /// value, for descriptive labels such as hostname and cpu.model,
        /// never for one jobs are placed by); any other label
        /// it reports is refused.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Pin the agent's certificate: a PEM file (its SHA-256 is kept).
        #[arg(long, conflicts_with = "cert_sha256")]
        cert: Option<std::path::PathBuf>,
        /// Pin the agent's certificate by the hex SHA-256 of its DER.
        #[arg(long)]
        cert_sha256: Option<String>,
        /// Withdraw the node's admission instead.
        #[arg(long, conflicts_with_all = ["gpus", "vram_mb", "mem_mb", "cpus", "labels", "cert", "cert_sha256"])]
        revoke: bool,
    },
    /// Set (KEY=VALUE) and remove (KEY-) a node's admin labels: laid over
    /// what its agent reports, and the only way to set the reserved
    /// `muster.*` labels (e.g. muster.vcluster, muster.drain-timeout).
    Label {
        /// The node id (it need not have registered yet).
        id: String,
        /// KEY=VALUE to set, KEY- to remove.
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        changes: Vec<String>,
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
        "reported_labels": n.reported_labels,
        "admin_labels": n.admin_labels,
        "admission": n.admission.as_ref().map(admission_json),
        "images": n.images,
    })
}

fn admission_json(a: &v1::NodeAdmission) -> serde_json::Value {
    let r = a.resources.unwrap_or_default();
    json!({
        "gpus": r.gpus, "vram_mb": r.vram_mb, "mem_mb": r.mem_mb, "cpus": r.cpus,
        "labels": a.labels, "cert_sha256": a.cert_sha256, "by": a.by, "at_ms": a.at_ms,
    })
}

/// `KEY=VALUE` flags as a map, naming the flag in errors.
fn key_values(flag: &str, kvs: &[String]) -> anyhow::Result<HashMap<String, String>> {
    kvs.iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').with_context(|| format!("{flag} {kv:?} is not KEY=VALUE"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// The hex SHA-256 of the first certificate in a PEM file.
fn cert_sha256(path: &std::path::Path) -> anyhow::Result<String> {
    let pem = std::fs::read_to_string(path).with_context(|| format!("--cert {}", path.display()))?;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END CERTIFICATE-----"))
        .collect();
    if body.is_empty() {
        bail!("--cert {}: holds no PEM certificate", path.display());
    }
    let der =
        base64_decode(&body).with_context(|| format!("--cert {}: the certificate is not base64", path.display()))?;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(&der);
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

fn base64_decode(s: &str) -> anyhow::Result<Vec<u8>> {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = ABC.iter().position(|&a| a == c).with_context(|| format!("{:?} is not base64", c as char))?;
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// The header of [`node_line`]'s table.
fn node_header() -> String {
    format!(
        "{:<16}  {:<10}  {:<15}  {:<21}  {:<15}  TASKS",
        "NODE", "STATUS", "GPUS used/total", "MEMORY MB used/total", "CPUS used/total"
    )
}

/// One node: what it has in use of what it offers.
fn node_line(n: &v1::Node) -> String {
    let r = n.resources.unwrap_or_default();
    let u = n.used.unwrap_or_default();
    format!(
        "{:<16}  {:<10}  {:<15}  {:<21}  {:<15}  {}",
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
    muster_scheduler::server::api::convert::format_time_ms(ms)
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
                let set_by = if n.admin_labels.contains_key(k) { "  (admin)" } else { "" };
                out!("  {k}={v}{set_by}");
            }
            if let Some(a) = &n.admission {
                let r = a.resources.unwrap_or_default();
                out!(
                    "  admitted by {} for {} GPUs, {} MB, {} CPUs{}{}",
                    a.by,
                    r.gpus,
                    r.mem_mb,
                    r.cpus,
                    if a.labels.is_empty() { String::new() } else { format!(", {} label(s)", a.labels.len()) },
                    if a.cert_sha256.is_empty() { String::new() } else { format!(", certificate {}", &a.cert_sha256) }
                );
            }
            if !n.images.is_empty() {
                out!("  images cached: {}", n.images.len());
                for d in &n.images {
                    out!("    {d}");
                }
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
            crate::args::parse_duration_s(t)
                .context("--timeout")
                .and_then(|s| s.checked_mul(1000).with_context(|| format!("--timeout {t:?} is too long")))
        })
        .transpose()
}

pub async fn run(cluster: &mut Cluster, cmd: NodeCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::List { labels } => {
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
                    out!("{}{}", node_header(), if labels { "  LABELS" } else { "" });
                    for n in &nodes {
                        let mut l: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        l.sort();
                        out!("{}{}", node_line(n), if labels { format!("  {}", l.join(",")) } else { String::new() });
                    }
                }
            }
        }
        NodeCmd::Admit { id, gpus, vram_mb, mem_mb, cpus, labels, cert, cert_sha256: pin, revoke } => {
            let admission = if revoke {
                None
            } else {
                let (Some(mem_mb), Some(cpus)) = (mem_mb, cpus) else {
                    bail!(
                        "muster node admit needs --mem-mb and --cpus (and --gpus, --vram-mb for GPU nodes), or --revoke"
                    );
                };
                let pin = match (cert, pin) {
                    (Some(path), _) => cert_sha256(&path)?,
                    (None, Some(hex)) => hex.to_ascii_lowercase(),
                    (None, None) => String::new(),
                };
                Some(v1::NodeAdmission {
                    resources: Some(v1::Resources { gpus, vram_mb, mem_mb, cpus }),
                    labels: key_values("--label", &labels)?,
                    cert_sha256: pin,
                    ..Default::default()
                })
            };
            let req = v1::AdmitNodeRequest { id, admission, revoke };
            let r = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).admit_node(req).await }
                })
                .await?
                .into_inner();
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(
                        &json!({"id": r.id, "admission": r.admission.as_ref().map(admission_json)})
                    )?
                ),
                Output::Text => match &r.admission {
                    Some(a) => {
                        let res = a.resources.unwrap_or_default();
                        out!(
                            "node {} admitted for {} GPUs, {} MB GPU memory, {} MB, {} CPUs; labels: {}{}",
                            r.id,
                            res.gpus,
                            res.vram_mb,
                            res.mem_mb,
                            res.cpus,
                            if a.labels.is_empty() {
                                "none".to_string()
                            } else {
                                let mut l: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                                l.sort();
                                l.join(" ")
                            },
                            if a.cert_sha256.is_empty() {
                                String::new()
                            } else {
                                format!("; certificate {}", a.cert_sha256)
                            }
                        );
                    }
                    None => out!("node {}: admission withdrawn (its next registration is refused)", r.id),
                },
            }
        }
        NodeCmd::Label { id, changes } => {
            let (mut set, mut remove) = (HashMap::new(), Vec::new());
            for c in &changes {
                if let Some((k, v)) = c.split_once('=') {
                    set.insert(k.to_string(), v.to_string());
                } else if let Some(k) = c.strip_suffix('-') {
                    remove.push(k.to_string());
                } else {
                    bail!("{c:?} is neither KEY=VALUE (set) nor KEY- (remove)");
                }
            }
            let req = v1::LabelNodeRequest { id, set, remove };
            let r = cluster
                .call(|ch| {
                    let req = req.clone();
                    async move { NodeServiceClient::new(ch).label_node(req).await }
                })
                .await?
                .into_inner();
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "id": r.id, "admin_labels": r.admin_labels, "labels": r.labels, "registered": r.registered,
                    }))?
                ),
                Output::Text => {
                    let mut l: Vec<String> = r.admin_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    l.sort();
                    out!(
                        "node {}: admin labels {}{}",
                        r.id,
                        if l.is_empty() { "none".to_string() } else { l.join(" ") },
                        if r.registered { "" } else { " (applied when it registers)" }
                    );
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
