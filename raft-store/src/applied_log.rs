//! The applied log: with [`StoreOptions::applied_log`](crate::StoreOptions),
//! every entry the state machine applies is also appended to
//! `<data-dir>/applied.log`, so the committed history outlives log
//! compaction. A chaos run replays it from the first entry; an operator can
//! audit it. It is written (not fsynced) in apply order and grows without
//! bound: a test and audit aid, off by default.
//!
//! Format: records of `u32 little-endian length ‖ codec(AppliedRecord)`. A
//! replica that re-applies entries after a restart appends them again; a
//! reader keeps the first record of each index and reports any record that
//! disagrees with it. A torn last record (a crash mid-write) is ignored.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use openraft::{Entry, EntryPayload};
use serde::{Deserialize, Serialize};

use crate::{CommandBatch, RaftConfig, StateMachineApp, codec};

const FILE: &str = "applied.log";

/// One applied entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord<C> {
    /// Log index.
    pub index: u64,
    /// Term of the leader that created it.
    pub term: u64,
    /// Its commands; `None` for a blank or membership entry.
    pub batch: Option<CommandBatch<C>>,
}

/// Why an applied log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AppliedLogError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A whole record does not decode.
    #[error("{path}: record at byte {offset} does not decode: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: usize,
        /// Why.
        reason: String,
    },
}

pub(crate) fn open_writer(data_dir: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(data_dir.join(FILE))
}

/// Appends the records of `entries` with one write.
pub(crate) fn append<A: StateMachineApp>(file: &mut File, entries: &[Entry<RaftConfig<A>>]) -> io::Result<()> {
    let mut buf = Vec::new();
    for entry in entries {
        let record = AppliedRecord {
            index: entry.log_id.index,
            term: entry.log_id.leader_id.term,
            batch: match &entry.payload {
                EntryPayload::Normal(batch) => Some(batch.clone()),
                EntryPayload::Blank | EntryPayload::Membership(_) => None,
            },
        };
        let bytes = codec::encode(&record).map_err(io::Error::other)?;
        let len = u32::try_from(bytes.len()).map_err(io::Error::other)?;
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&bytes);
    }
    file.write_all(&buf)
}

/// Every record of a data dir's applied log, in file order (an index may
/// repeat after a restart). A data dir without one gives an empty list.
pub fn read_applied_log<A: StateMachineApp>(
    data_dir: &Path,
) -> Result<Vec<AppliedRecord<A::Command>>, AppliedLogError> {
    let path = data_dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AppliedLogError::Io { path, source }),
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")) as usize;
        let Some(body) = bytes.get(at + 4..at + 4 + len) else { break };
        let record = codec::decode(body).map_err(|e| AppliedLogError::Corrupt {
            path: path.clone(),
            offset: at,
            reason: e.to_string(),
        })?;
        out.push(record);
        at += 4 + len;
    }
    Ok(out)
}
