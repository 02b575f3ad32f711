//! `muster restore`: prepares an empty data dir to start as one member of a
//! new cluster from a backup (`muster cluster backup`), offline. Run it
//! once per member, with the same backup and the same `--peers`, then start
//! each `muster server` on its data dir.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use muster_raft_store::{Backup, restore_data_dir};
use muster_scheduler::sm::State;

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The backup file (`muster cluster backup --out FILE`).
    #[arg(long)]
    backup: PathBuf,
    /// The new replica's data dir: must not hold a log or a snapshot.
    #[arg(long)]
    data_dir: PathBuf,
    /// The new cluster, every member: 1=host:port,2=host:port,3=host:port.
    #[arg(long)]
    peers: String,
}

pub fn run(args: &RestoreArgs) -> anyhow::Result<()> {
    let members = crate::server::parse_peers(&args.peers)?;
    if members.is_empty() {
        bail!("--peers must name at least one member");
    }
    let bytes = std::fs::read(&args.backup).with_context(|| format!("cannot read {}", args.backup.display()))?;
    let backup = Backup::decode(&bytes).with_context(|| args.backup.display().to_string())?;
    let history_path = args.data_dir.join("history.sqlite");
    if history_path.exists() {
        bail!("{} already holds a job history; restore only into an empty data dir", args.data_dir.display());
    }
    restore_data_dir::<State>(&args.data_dir, &backup, &members)?;
    // The job history the backup carries (none in a backup from before
    // backups had one: the restored replicas rebuild what the state holds).
    let records = if backup.extra.is_empty() {
        0
    } else {
        let tmp = args.data_dir.join("history.sqlite.tmp");
        std::fs::write(&tmp, &backup.extra).with_context(|| format!("cannot write {}", tmp.display()))?;
        let count = muster_history::HistoryStore::open(&tmp)
            .and_then(|h| h.count())
            .with_context(|| "the backup's job history does not open".to_string())?;
        std::fs::rename(&tmp, &history_path).with_context(|| format!("cannot write {}", history_path.display()))?;
        count
    };
    let digest: String = backup.digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    out!(
        "{} prepared from the backup of index {} (state digest {digest}…, {records} job-history records): a new \
         cluster of {} member(s) ({}).",
        args.data_dir.display(),
        backup.index,
        members.len(),
        args.peers
    );
    out!("Prepare every member the same way, then start each: muster server --id ID --data-dir DIR --listen ADDR");
    Ok(())
}
