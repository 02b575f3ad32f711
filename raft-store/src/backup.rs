//! Backups: a consistent copy of the applied state at one committed index,
//! and restoring it into fresh data directories to start a new cluster (as
//! `etcdctl snapshot save` / `snapshot restore` do).
//!
//! ```text
//!   leader: linearizable read ──▶ (index, digest, state bytes) ──▶ backup file
//!   backup file ──▶ restore_data_dir(dir, members) ──▶ snapshot.bin at `index`,
//!                   membership = the new members, empty log, no vote
//! ```
//!
//! Copying a live replica's data dir is not a backup: restoring a voter's
//! older log and vote under the same id lets it vote twice in one term, and
//! openraft's leader refuses a follower whose log went backwards. A
//! restored cluster is a *new* cluster: every member starts from the same
//! snapshot, elects a leader among themselves, and carries on from the
//! backup's index.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use crate::state_machine::StoredSnapshot;
use crate::{StateMachineApp, codec};

/// The first bytes of a backup file.
pub const BACKUP_MAGIC: &[u8; 8] = b"MUSTERB2";

/// The first bytes of a backup file from before backups carried the
/// application's side data (still read: their `extra` is empty).
pub const BACKUP_MAGIC_V1: &[u8; 8] = b"MUSTERBK";

/// A backup: the application state at a committed index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    /// The last log index the state includes.
    pub index: u64,
    /// The state digest at that index (checked on restore).
    pub digest: [u8; 32],
    /// When it was taken (the serving replica's wall clock, ms since the
    /// Unix epoch).
    pub taken_at_ms: u64,
    /// Which replica served it.
    pub taken_from: u64,
    /// The application's snapshot bytes.
    pub state: Vec<u8>,
    /// What the application keeps beside the state, opaque here (for
    /// Muster, the serving replica's job-history database); empty: none.
    pub extra: Vec<u8>,
}

/// A version-1 backup's body.
#[derive(Serialize, Deserialize)]
struct BackupV1 {
    index: u64,
    digest: [u8; 32],
    taken_at_ms: u64,
    taken_from: u64,
    state: Vec<u8>,
}

/// Why a backup could not be read or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Not a backup file.
    #[error("not a muster backup (no {magic:?} header)", magic = String::from_utf8_lossy(BACKUP_MAGIC))]
    NotABackup,
    /// Its body could not be decoded.
    #[error("corrupt backup: {0}")]
    Corrupt(String),
    /// Its state does not restore, or restores to another digest.
    #[error("backup state does not restore: {0}")]
    BadState(String),
    /// The target is not a fresh data dir.
    #[error("{path} already holds a replica's data (a log or a snapshot); restore only into an empty data dir")]
    NotFresh {
        /// The data dir.
        path: String,
    },
    /// The new membership is unusable.
    #[error("members: {0}")]
    Members(String),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

impl Backup {
    /// The backup file's bytes: the magic, then the versioned codec.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = BACKUP_MAGIC.to_vec();
        out.extend(codec::encode(self).expect("a backup always encodes"));
        out
    }

    /// Reads a backup file's bytes (either version).
    pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
        if let Some(body) = bytes.strip_prefix(BACKUP_MAGIC.as_slice()) {
            return codec::decode(body).map_err(|e| BackupError::Corrupt(e.to_string()));
        }
        let body = bytes.strip_prefix(BACKUP_MAGIC_V1.as_slice()).ok_or(BackupError::NotABackup)?;
        let v1: BackupV1 = codec::decode(body).map_err(|e| BackupError::Corrupt(e.to_string()))?;
        Ok(Backup {
            index: v1.index,
            digest: v1.digest,
            taken_at_ms: v1.taken_at_ms,
            taken_from: v1.taken_from,
            state: v1.state,
            extra: Vec::new(),
        })
    }

    /// Checks that the state restores to the recorded digest.
    pub fn verify<A: StateMachineApp>(&self) -> Result<A, BackupError> {
        let app = A::restore(&self.state).map_err(|e| BackupError::BadState(e.to_string()))?;
        if app.digest() != self.digest {
            return Err(BackupError::BadState("its state's digest differs from the recorded one".into()));
        }
        Ok(app)
    }
}

/// Prepares the empty data dir `dir` to start as one member of a new
/// cluster restored from `backup`: a `snapshot.bin` at the backup's index
/// whose membership is `members` (id → address, every one a voter). Every
/// member of the new cluster is prepared from the same backup with the same
/// `members`, then started (without `--peers`: it is already initialised).
pub fn restore_data_dir<A: StateMachineApp>(
    dir: &Path,
    backup: &Backup,
    members: &BTreeMap<u64, String>,
) -> Result<(), BackupError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| BackupError::Io { path, source }
    };
    if members.is_empty() || members.contains_key(&0) {
        return Err(BackupError::Members("at least one member, ids from 1".into()));
    }
    backup.verify::<A>()?;
    if dir.join("log").exists() || dir.join("snapshot.bin").exists() {
        return Err(BackupError::NotFresh { path: dir.display().to_string() });
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    // Term 0: the new cluster's first election (term 1) comes after it, as
    // openraft's own initial membership entry does.
    let log_id = LogId::new(CommittedLeaderId::new(0, 0), backup.index);
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let nodes: BTreeMap<u64, BasicNode> = members.iter().map(|(id, a)| (*id, BasicNode::new(a.clone()))).collect();
    let membership = Membership::new(vec![voters], nodes);
    let stored = StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::new(Some(log_id), membership),
            snapshot_id: format!("restored-{}", backup.index),
        },
        data: backup.state.clone(),
    };
    let bytes = codec::encode(&stored).map_err(|e| BackupError::Corrupt(e.to_string()))?;
    let tmp = dir.join("snapshot.bin.tmp");
    let path = dir.join("snapshot.bin");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_round_trips_and_a_version_1_file_still_reads() {
        let b = Backup {
            index: 7,
            digest: [3; 32],
            taken_at_ms: 1_000,
            taken_from: 2,
            state: b"state".to_vec(),
            extra: b"history".to_vec(),
        };
        assert_eq!(Backup::decode(&b.encode()).unwrap(), b);
        let v1 = BackupV1 { index: 7, digest: [3; 32], taken_at_ms: 1_000, taken_from: 2, state: b"state".to_vec() };
        let mut bytes = BACKUP_MAGIC_V1.to_vec();
        bytes.extend(codec::encode(&v1).unwrap());
        assert_eq!(Backup::decode(&bytes).unwrap(), Backup { extra: Vec::new(), ..b });
        assert!(matches!(Backup::decode(b"MUSTERXXjunk"), Err(BackupError::NotABackup)));
    }
}
