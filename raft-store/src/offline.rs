//! Reading a replica's data dir offline, without opening it as a store:
//! nothing is written, so a stopped replica's dir (or a copy of a live
//! one's) can be inspected by `muster replay` and `muster audit`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::codec;
use crate::state_machine::StoredSnapshot;

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
