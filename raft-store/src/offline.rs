//! Reading a replica's data dir offline, without opening it as a store:
//! nothing is written, so a stopped replica's dir (or a copy of a live
//! one's) can be inspected by `muster replay` and `muster audit`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use openraft::{Entry, EntryPayload, LogId};

use crate::state_machine::StoredSnapshot;
use crate::{AppliedRecord, RaftConfig, StateMachineApp, codec};

/// A data dir's snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirSnapshot {
    /// The last log index it includes (0: none).
    pub index: u64,
    /// The term of that entry.
    pub term: u64,
    /// The application's snapshot bytes.
    pub data: Vec<u8>,
}

/// Why a data dir could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file does not decode.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The snapshot `dir/snapshot.bin` holds (`None`: the replica has taken
/// none yet).
pub fn read_snapshot(dir: &Path) -> Result<Option<DirSnapshot>, OfflineError> {
    let path = dir.join("snapshot.bin");
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(OfflineError::Io { path, source }),
    };
    let stored: StoredSnapshot =
        codec::decode(&bytes).map_err(|e| OfflineError::Corrupt { path: path.clone(), reason: e.to_string() })?;
    let (index, term) = stored.meta.last_log_id.map_or((0, 0), |id| (id.index, id.leader_id.term));
    Ok(Some(DirSnapshot { index, term, data: stored.data }))
}

/// What a data dir's Raft log holds, read without changing it.
#[derive(Clone, Debug, PartialEq)]
pub struct DirLog<C> {
    /// Its live entries (after the purge marker), in index order.
    pub records: Vec<AppliedRecord<C>>,
    /// The committed index it recorded (`None`: none, or one that does not
    /// check out: it is not synced, and the cluster recomputes it).
    pub committed: Option<u64>,
    /// Entries up to this index were purged (they are in the snapshot).
    pub purged: Option<u64>,
    /// A write at the end of the last segment that no sync covered, which
    /// a replica cuts off when it starts (not damage).
    pub torn_tail: Option<String>,
}

/// Reads `data_dir/log` without opening it as a store. Damage anywhere but
/// the very end (a bad checksum, a gap, an unknown version) is an error
/// naming the file and offset.
pub fn read_log<A: StateMachineApp>(data_dir: &Path) -> Result<DirLog<A::Command>, OfflineError> {
    let dir = data_dir.join("log");
    let corrupt = |path: PathBuf, reason: String| OfflineError::Corrupt { path, reason };
    let (image, torn_tail) = crate::log_file::read_only(&dir).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => corrupt(dir.clone(), e.to_string()),
        _ => OfflineError::Io { path: dir.clone(), source: e },
    })?;
    let committed = image
        .committed
        .as_deref()
        .and_then(|b| codec::decode::<Option<LogId<u64>>>(b).ok())
        .flatten()
        .map(|id| id.index);
    let purged = image.purged.as_deref().and_then(crate::disk::purged_index);
    let mut records = Vec::with_capacity(image.entries.len());
    for (index, bytes) in &image.entries {
        let entry: Entry<RaftConfig<A>> =
            codec::decode(bytes).map_err(|e| corrupt(dir.clone(), format!("entry {index} does not decode: {e}")))?;
        records.push(AppliedRecord {
            index: entry.log_id.index,
            term: entry.log_id.leader_id.term,
            batch: match entry.payload {
                EntryPayload::Normal(batch) => Some(batch),
                EntryPayload::Blank | EntryPayload::Membership(_) => None,
            },
        });
    }
    Ok(DirLog { records, committed, purged, torn_tail })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_core::audit::Auditor;
    use muster_core::sm::{AllocSpec, Command, NodeId, Resources, State};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::*;
    use crate::CommandBatch;
    use crate::log_file::LogFile;

    fn entry(index: u64, commands: Vec<Command>) -> (u64, Vec<u8>) {
        let e: Entry<RaftConfig<State>> = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(CommandBatch { time_ms: 1_000 * index, commands }),
        };
        (index, codec::encode(&e).unwrap())
    }

    fn reserve(alloc: u64) -> Command {
        Command::ReserveGang { alloc, epoch: 1, nodes: vec![NodeId::new("n1")] }
    }

    /// A log of one 8-GPU node and two 6-GPU allocations; `forged` adds an
    /// entry that reserves the second on the same node.
    fn write_log(dir: &Path, forged: bool) {
        let task = Resources { gpus: 6, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 };
        let mut spec = AllocSpec::new("u", 1, task, vec!["true".into()]);
        spec.ports = 0;
        let node = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 64_000, cpus: 32 };
        let mut items = vec![
            entry(
                1,
                vec![
                    Command::RegisterNode { node: NodeId::new("n1"), resources: node, labels: BTreeMap::new() },
                    Command::MarkNodeReady { node: NodeId::new("n1") },
                    Command::Submit { spec: spec.clone() },
                    Command::Submit { spec },
                ],
            ),
            entry(2, vec![reserve(1)]),
        ];
        if forged {
            items.push(entry(3, vec![reserve(2)]));
        }
        let log = LogFile::open(&dir.join("log"), crate::disk::purged_index).unwrap();
        log.append(items).unwrap();
        log.sync().unwrap();
    }

    fn audit(dir: &Path) -> Result<u64, String> {
        let log = read_log::<State>(dir).map_err(|e| e.to_string())?;
        let mut a = Auditor::new(State::default(), 0);
        for r in &log.records {
            a.entry(r.index, r.term, r.batch.as_ref()).map_err(|v| v.to_string())?;
        }
        Ok(a.entries)
    }

    #[test]
    fn a_log_read_offline_audits_and_a_forged_double_booking_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), false);
        assert_eq!(audit(dir.path()), Ok(2));
        let forged = tempfile::tempdir().unwrap();
        write_log(forged.path(), true);
        let err = audit(forged.path()).unwrap_err();
        assert!(err.starts_with("entry 3: gpus_not_double_booked broken"), "{err}");
        assert!(err.contains("node n1 (Ready, 6 of 8 GPUs used)"), "{err}");
    }

    #[test]
    fn a_damaged_record_is_named_by_file_and_offset_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), true);
        let seg = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "log"))
            .unwrap();
        let mut bytes = std::fs::read(&seg).unwrap();
        // A byte inside the second record's body. In the last segment a bad
        // record cannot be told from a write no sync covered: the reader
        // names it and stops there, as a replica would cut it off.
        let second = 16 + 16 + u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        bytes[second + 20] ^= 0xff;
        std::fs::write(&seg, &bytes).unwrap();
        let log = read_log::<State>(dir.path()).unwrap();
        assert_eq!(log.records.iter().map(|r| r.index).collect::<Vec<_>>(), [1]);
        let torn = log.torn_tail.unwrap();
        assert!(
            torn.contains(&format!("{} has a record whose checksum does not match at offset {second}", seg.display())),
            "{torn}"
        );
        assert_eq!(std::fs::read(&seg).unwrap(), bytes, "the reader wrote nothing");
    }
}
