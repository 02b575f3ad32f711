//! `muster cluster …`: the replicas' status and membership, and the
//! cluster's checkpoint settings.

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use serde_json::json;

use crate::client::{Cluster, describe};
use crate::output::Output;

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Every member's id, address, role, term, applied index and state digest.
    Status,
    /// Add a replica as a learner (it copies the log but does not vote yet).
    AddLearner {
        /// The new replica's id.
        #[arg(long)]
        id: u64,
        /// Its host:port.
        #[arg(long)]
        address: String,
    },
    /// Make learners voting members.
    Promote {
        /// Replica ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove replicas from the cluster.
    Remove {
        /// Replica ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Build a snapshot now (and purge the log behind it) on every reachable member.
    Snapshot,
    /// Take a consistent backup of the cluster's state through the leader
    /// (everything committed before the call) into a file; `muster restore`
    /// starts a new cluster from it.
    Backup {
        /// The file to write (via FILE.tmp, fsynced, then renamed).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Move leadership to a replica: it campaigns now; succeeds once it leads.
    TransferLeader {
        /// The replica that should lead.
        #[arg(long)]
        to: u64,
    },
    /// The cluster's checkpoint settings (docs/checkpointing.md); with any
    /// flag, change them (admins; the rest stay as they are).
    Checkpoints {
        /// Where checkpoints go: node (each node's own disk), an absolute
        /// path on a file system every node mounts, or an object-store URL
        /// (s3://bucket/prefix, gs://…, az://…, file:///…).
        #[arg(long)]
        store: Option<String>,
        /// Checkpoints each task keeps, newest first (1-16).
        #[arg(long)]
        keep: Option<u32>,
        /// The largest checkpoint a task may save (e.g. 200G); a vCluster
        /// may set its own.
        #[arg(long, value_name = "SIZE")]
        max_bytes: Option<String>,
    },
}

async fn status_at(cluster: &Cluster, addr: &str) -> Result<v1::ReplicaStatus, String> {
    let ch = cluster.connect(addr, Duration::from_secs(2)).await.map_err(|e| e.to_string())?;
    let mut client = AdminServiceClient::new(ch);
    let mut req = tonic::Request::new(v1::StatusRequest {});
    req.set_timeout(Duration::from_secs(5));
    client.status(req).await.map(|r| r.into_inner()).map_err(|s| describe(&s))
}

/// The member list from whichever listed replica answers first.
async fn members(cluster: &Cluster) -> anyhow::Result<Vec<v1::Member>> {
    let mut problems = Vec::new();
    for addr in cluster.addresses() {
        match status_at(cluster, addr).await {
            Ok(s) if !s.members.is_empty() => return Ok(s.members),
            Ok(s) => problems.push(format!("{addr}: replica {} is not part of a cluster yet", s.id)),
            Err(e) => problems.push(e),
        }
    }
    bail!("cannot reach any scheduler replica at {}: {}", cluster.addresses().join(", "), problems.join("; "))
}

fn member_json(m: &v1::Member, s: &Result<v1::ReplicaStatus, String>) -> serde_json::Value {
    match s {
        Ok(s) => json!({
            "id": m.id, "address": m.address, "voter": m.voter, "reachable": true,
            "role": s.role, "term": s.term, "leader_id": s.leader_id,
            "applied_index": s.applied_index, "last_log_index": s.last_log_index,
            "snapshot_index": s.snapshot_index, "state_digest": s.state_digest,
        }),
        Err(e) => json!({ "id": m.id, "address": m.address, "voter": m.voter, "reachable": false, "error": e }),
    }
}

pub async fn status(cluster: &Cluster, out: Output) -> anyhow::Result<()> {
    let members = members(cluster).await?;
    let mut rows = Vec::new();
    for m in &members {
        rows.push((m.clone(), status_at(cluster, &m.address).await));
    }
    let leader_id = rows.iter().find_map(|(_, s)| s.as_ref().ok().filter(|s| s.role == "leader").map(|s| s.id));
    match out {
        Output::Json => {
            let replicas: Vec<_> = rows.iter().map(|(m, s)| member_json(m, s)).collect();
            out!("{}", serde_json::to_string_pretty(&json!({ "leader_id": leader_id, "replicas": replicas }))?);
        }
        Output::Text => {
            match leader_id {
                Some(id) => out!("leader: replica {id}"),
                None => out!("leader: none (election in progress or no quorum)"),
            }
            out!("{:>4}  {:<22}  {:<9}  {:>6}  {:>9}  digest", "id", "address", "role", "term", "applied");
            for (m, s) in &rows {
                match s {
                    Ok(s) => out!(
                        "{:>4}  {:<22}  {:<9}  {:>6}  {:>9}  {}",
                        m.id,
                        m.address,
                        if m.voter { s.role.clone() } else { format!("{} (learner)", s.role) },
                        s.term,
                        s.applied_index,
                        &s.state_digest[..16.min(s.state_digest.len())]
                    ),
                    Err(e) => out!("{:>4}  {:<22}  unreachable: {e}", m.id, m.address),
                }
            }
        }
    }
    if leader_id.is_none() {
        // The table above says what each replica sees; scripts and probes
        // get a failure, since nothing can be committed.
        let reachable = rows.iter().filter(|(_, s)| s.is_ok()).count();
        bail!(
            "no leader: {reachable} of {} replicas answer and none leads (an election in progress, or no quorum)",
            rows.len()
        );
    }
    Ok(())
}

fn print_members(resp: &v1::MembershipResponse, out: Output) -> anyhow::Result<()> {
    match out {
        Output::Json => {
            let members: Vec<_> =
                resp.members.iter().map(|m| json!({ "id": m.id, "address": m.address, "voter": m.voter })).collect();
            out!("{}", serde_json::to_string_pretty(&json!({ "members": members, "log_index": resp.log_index }))?);
        }
        Output::Text => {
            for m in &resp.members {
                out!("{:>4}  {:<22}  {}", m.id, m.address, if m.voter { "voter" } else { "learner" });
            }
        }
    }
    Ok(())
}

async fn change_membership(cluster: &mut Cluster, req: v1::ChangeMembershipRequest, out: Output) -> anyhow::Result<()> {
    let resp = cluster
        .call(|ch| {
            let req = req.clone();
            async move { AdminServiceClient::new(ch).change_membership(req).await }
        })
        .await?
        .into_inner();
    print_members(&resp, out)
}

pub async fn run(cluster: &mut Cluster, cmd: ClusterCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Status => status(cluster, out).await,
        ClusterCmd::AddLearner { id, address } => {
            let resp = cluster
                .call(|ch| {
                    let address = address.clone();
                    async move { AdminServiceClient::new(ch).add_learner(v1::AddLearnerRequest { id, address }).await }
                })
                .await?
                .into_inner();
            print_members(&resp, out)
        }
        ClusterCmd::Promote { ids } => {
            change_membership(cluster, v1::ChangeMembershipRequest { promote: ids, remove: vec![] }, out).await
        }
        ClusterCmd::Remove { ids } => {
            change_membership(cluster, v1::ChangeMembershipRequest { promote: vec![], remove: ids }, out).await
        }
        ClusterCmd::Backup { out: file } => {
            let (bytes, index, digest) = fetch_backup(cluster).await?;
            let backup = muster_raft_store::Backup::decode(&bytes)?;
            backup.verify::<muster_scheduler::sm::State>()?;
            write_atomically(&file, &bytes)?;
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "file": file.display().to_string(), "index": index, "state_digest": digest,
                        "bytes": bytes.len(), "taken_from": backup.taken_from,
                    }))?
                ),
                Output::Text => out!(
                    "backup of index {index} (state digest {}…, from replica {}) written to {} ({} bytes)",
                    &digest[..digest.len().min(16)],
                    backup.taken_from,
                    file.display(),
                    bytes.len()
                ),
            }
            Ok(())
        }
        ClusterCmd::Snapshot => {
            let members = members(cluster).await?;
            let mut results = Vec::new();
            for m in &members {
                let r = async {
                    let ch = cluster.connect(&m.address, Duration::from_secs(2)).await.map_err(|e| e.to_string())?;
                    let mut req = tonic::Request::new(v1::StatusRequest {});
                    req.set_timeout(Duration::from_secs(70));
                    AdminServiceClient::new(ch)
                        .trigger_snapshot(req)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|s| describe(&s))
                }
                .await;
                results.push((m.id, r));
            }
            let failed = results.iter().filter(|(_, r)| r.is_err()).count();
            match out {
                Output::Json => {
                    let rows: Vec<_> = results
                        .iter()
                        .map(|(id, r)| match r {
                            Ok(s) => json!({ "id": id, "snapshot_index": s.snapshot_index }),
                            Err(e) => json!({ "id": id, "error": e }),
                        })
                        .collect();
                    out!("{}", serde_json::to_string_pretty(&json!({ "replicas": rows }))?);
                }
                Output::Text => {
                    for (id, r) in &results {
                        match r {
                            Ok(s) => out!("replica {id}: snapshot at index {}", s.snapshot_index),
                            Err(e) => out!("replica {id}: {e}"),
                        }
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} replicas did not snapshot", results.len());
            }
            Ok(())
        }
        ClusterCmd::Checkpoints { store, keep, max_bytes } => {
            if let Some(s) = &store {
                muster_scheduler::sm::CheckpointStore::parse(s).map_err(|e| anyhow::anyhow!("--store {e}"))?;
            }
            let max_bytes = max_bytes
                .map(|m| muster_agent::janitor::parse_size(&m).map_err(|e| anyhow::anyhow!("--max-bytes {e}")))
                .transpose()?;
            let now = cluster
                .call(
                    |ch| async move { AdminServiceClient::new(ch).get_checkpoint_settings(v1::StatusRequest {}).await },
                )
                .await?
                .into_inner();
            let settings = if store.is_none() && keep.is_none() && max_bytes.is_none() {
                now
            } else {
                let want = v1::CheckpointSettings {
                    store: store.unwrap_or(now.store),
                    keep: keep.unwrap_or(now.keep),
                    max_bytes: max_bytes.unwrap_or(now.max_bytes),
                    ..Default::default()
                };
                cluster
                    .call(|ch| {
                        let want = want.clone();
                        async move { AdminServiceClient::new(ch).set_checkpoint_settings(want).await }
                    })
                    .await?
                    .into_inner()
            };
            match out {
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "store": settings.store, "keep": settings.keep, "max_bytes": settings.max_bytes,
                        "retired": settings.retired, "abandoned": settings.abandoned,
                    }))?
                ),
                Output::Text => {
                    out!("store      {}", settings.store);
                    out!("keep       {} per task", settings.keep);
                    out!("max bytes  {} ({})", settings.max_bytes, muster_scheduler::words::bytes(settings.max_bytes));
                    out!("retired    {} waiting to be deleted, {} abandoned", settings.retired, settings.abandoned);
                }
            }
            Ok(())
        }
        ClusterCmd::TransferLeader { to } => {
            let members = members(cluster).await?;
            let Some(target) = members.iter().find(|m| m.id == to) else {
                bail!("replica {to} is not a member");
            };
            if !target.voter {
                bail!("replica {to} is a learner; promote it before it can lead");
            }
            let ch = cluster.connect(&target.address, Duration::from_secs(2)).await?;
            let mut admin = AdminServiceClient::new(ch);
            // openraft 0.9 has no leadership transfer: ask the target to
            // campaign, which it wins when its log is up to date.
            for _ in 0..5 {
                let s =
                    admin.status(v1::StatusRequest {}).await.map_err(|s| anyhow::anyhow!(describe(&s)))?.into_inner();
                if s.role == "leader" {
                    if out == Output::Json {
                        out!("{}", json!({ "leader_id": to, "term": s.term }));
                    } else {
                        out!("replica {to} leads (term {})", s.term);
                    }
                    return Ok(());
                }
                admin.trigger_election(v1::StatusRequest {}).await.map_err(|s| anyhow::anyhow!(describe(&s)))?;
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            bail!("replica {to} campaigned but did not become leader (its log may be behind); try again")
        }
    }
}

/// The backup file's bytes, its index and state digest, streamed from the
/// leader.
async fn fetch_backup(cluster: &mut Cluster) -> anyhow::Result<(Vec<u8>, u64, String)> {
    let mut stream = cluster
        .call(|ch| async move {
            let mut req = tonic::Request::new(v1::BackupRequest {});
            req.set_timeout(Duration::from_secs(600));
            AdminServiceClient::new(ch).backup(req).await
        })
        .await?
        .into_inner();
    let (mut bytes, mut index, mut digest, mut total) = (Vec::new(), 0, String::new(), 0);
    while let Some(chunk) =
        stream.message().await.map_err(|s| anyhow::anyhow!("backup interrupted: {}", describe(&s)))?
    {
        bytes.extend_from_slice(&chunk.data);
        (index, digest, total) = (chunk.index, chunk.state_digest, chunk.total_bytes);
    }
    if bytes.is_empty() || bytes.len() as u64 != total {
        bail!("backup incomplete: received {} of {total} bytes", bytes.len());
    }
    Ok((bytes, index, digest))
}

/// Writes `bytes` to `path` so that a crash leaves either nothing or the
/// whole file: FILE.tmp, fsync, rename, fsync the directory.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}
