//! The crash-consistency shim: a simulated power loss.
//!
//! With [`StoreOptions::crash_image`](crate::StoreOptions) set, every
//! successful durable point — a log `fdatasync`, or a snapshot file written
//! and renamed into place — records what is on stable storage at that moment
//! in `<data-dir>/crash-image/`: the whole log (entries, vote, committed,
//! purge marker) as of the sync, and a hard link to the snapshot file. [`restore_crash_image`] then replaces the data dir's log
//! and snapshot with the image, which is exactly what a machine that lost
//! power would find: everything fsynced, nothing written since.
//!
//! ```text
//!   write ─▶ (not durable) ─▶ flush + fsync ─▶ image ─▶ acknowledge
//!                                                 │
//!   kill -9 + restore_crash_image ◀───────────────┘  (later writes are gone)
//! ```
//!
//! The model is the pessimistic one (no unsynced write survives); it proves
//! that whatever the store acknowledged was fsynced first. Recovery from a
//! torn record is the log file's own test.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::codec;
use crate::disk::OpenError;
use crate::log_file::LogFile;

const IMAGE_DIR: &str = "crash-image";
const TREE_FILE: &str = "tree.bin";
const SNAPSHOT_FILE: &str = "snapshot.bin";

pub(crate) fn image_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(IMAGE_DIR)
}

/// Records the log's contents (as of the sync just done) as the image.
pub(crate) fn record_log(data_dir: &Path, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()> {
    let bytes = codec::encode(&pairs).map_err(io::Error::other)?;
    let dir = image_dir(data_dir);
    fs::create_dir_all(&dir)?;
    let tmp = dir.join("tree.bin.tmp");
    fs::File::create(&tmp)?.write_all(&bytes)?;
    fs::rename(&tmp, dir.join(TREE_FILE))
}

/// Records the snapshot file just renamed into place (a hard link: the file
/// is never modified, only replaced).
pub(crate) fn record_snapshot(data_dir: &Path, snapshot: &Path) -> io::Result<()> {
    let dir = image_dir(data_dir);
    fs::create_dir_all(&dir)?;
    let tmp = dir.join("snapshot.bin.tmp");
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::hard_link(snapshot, &tmp)?;
    fs::rename(&tmp, dir.join(SNAPSHOT_FILE))
}

/// Simulates a power loss on a data dir whose process is gone: the log
/// and snapshot become what the last durable point recorded in the
/// crash image (empty when nothing was ever made durable). The image stays,
/// so a store reopened with the shim carries on recording.
pub fn restore_crash_image(data_dir: &Path) -> Result<(), OpenError> {
    let io_err = |source| OpenError::Io { path: data_dir.to_path_buf(), source };
    let image = image_dir(data_dir);
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = match fs::read(image.join(TREE_FILE)) {
        Ok(bytes) => codec::decode(&bytes).map_err(|e| OpenError::Snapshot {
            path: image.join(TREE_FILE),
            reason: format!("crash image unreadable: {e}"),
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(e)),
    };
    let log_dir = data_dir.join("log");
    match fs::remove_dir_all(&log_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    for name in ["snapshot.bin", "snapshot.bin.tmp"] {
        match fs::remove_file(data_dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    if image.join(SNAPSHOT_FILE).exists() {
        fs::copy(image.join(SNAPSHOT_FILE), data_dir.join("snapshot.bin")).map_err(io_err)?;
    }
    LogFile::create_from_pairs(&log_dir, pairs).map_err(|source| OpenError::Io { path: log_dir, source })
}
