//! The crash-consistency shim: a simulated power loss.
//!
//! With [`StoreOptions::crash_image`](crate::StoreOptions) set, every
//! successful durable point — a log `fdatasync`, or a snapshot file written
//! and renamed into place — records what is on stable storage at that moment
//! in `<data-dir>/crash-image/`: the whole log (entries, vote, committed,
//! purge marker) as of the sync (`log.image`), and a hard link to the
//! snapshot file. [`restore_crash_image`] then replaces the data dir's log
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
//!
//! The shim also keeps, in `crash-image/acked`, the last log index the store
//! told openraft was durable. [`acked_beyond_durable`] compares the two
//! before a simulated power loss: a replica that acknowledged an entry its
//! last durable point does not hold lied to the cluster about it, whether or
//! not a later fault turns that into a lost write.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::codec;
use crate::disk::OpenError;
use crate::log_file::{LogFile, LogImage};

const IMAGE_DIR: &str = "crash-image";
const LOG_FILE: &str = "log.image";
const SNAPSHOT_FILE: &str = "snapshot.bin";
const ACKED_FILE: &str = "acked";

pub(crate) fn image_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(IMAGE_DIR)
}

/// Records the log's contents (as of the sync just done) as the image.
pub(crate) fn record_log(data_dir: &Path, log: &LogImage) -> io::Result<()> {
    let bytes = codec::encode(log).map_err(io::Error::other)?;
    let dir = image_dir(data_dir);
    fs::create_dir_all(&dir)?;
    let tmp = dir.join("log.image.tmp");
    fs::File::create(&tmp)?.write_all(&bytes)?;
    fs::rename(&tmp, dir.join(LOG_FILE))
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

/// The last log index the store acknowledged to openraft as durable, kept
/// in the crash image's directory (not synced: only a process kill and a
/// simulated power loss are ever applied to it, and the page cache
/// survives the first while the harness reads it before the second).
pub(crate) struct AckedRecord {
    file: PathBuf,
    value: Mutex<u64>,
}

impl AckedRecord {
    /// The record of `data_dir` (0 when none was kept yet).
    pub(crate) fn open(data_dir: &Path) -> io::Result<AckedRecord> {
        let dir = image_dir(data_dir);
        fs::create_dir_all(&dir)?;
        let file = dir.join(ACKED_FILE);
        let value = read_acked(&file)?.unwrap_or(0);
        Ok(AckedRecord { file, value: Mutex::new(value) })
    }

    /// Entries up to `index` were acknowledged.
    pub(crate) fn raise(&self, index: u64) {
        self.set(|v| v.max(index));
    }

    /// Entries after `index` are no longer acknowledged (truncated).
    pub(crate) fn lower_to(&self, index: u64) {
        self.set(|v| v.min(index));
    }

    fn set(&self, f: impl FnOnce(u64) -> u64) {
        let mut value = self.value.lock().unwrap_or_else(|e| e.into_inner());
        let next = f(*value);
        if next != *value {
            *value = next;
            if let Err(e) = fs::write(&self.file, next.to_le_bytes()) {
                tracing::warn!(error = %e, "cannot record the acknowledged index (crash shim)");
            }
        }
    }
}

fn read_acked(file: &Path) -> io::Result<Option<u64>> {
    match fs::read(file) {
        Ok(bytes) => Ok(bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The image's log (empty when nothing was ever made durable).
fn image_log(data_dir: &Path) -> Result<LogImage, OpenError> {
    let image = image_dir(data_dir);
    match fs::read(image.join(LOG_FILE)) {
        Ok(bytes) => codec::decode(&bytes).map_err(|e| OpenError::Snapshot {
            path: image.join(LOG_FILE),
            reason: format!("crash image unreadable: {e}"),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(LogImage::default()),
        Err(e) => Err(OpenError::Io { path: data_dir.to_path_buf(), source: e }),
    }
}

/// Before a simulated power loss of a data dir kept with the crash shim:
/// `Some((acknowledged, durable))` when its replica acknowledged log
/// entries past what its last durable point holds, `None` when everything
/// it acknowledged is durable (or it kept no record).
pub fn acked_beyond_durable(data_dir: &Path) -> Result<Option<(u64, u64)>, OpenError> {
    let acked = read_acked(&image_dir(data_dir).join(ACKED_FILE))
        .map_err(|source| OpenError::Io { path: data_dir.to_path_buf(), source })?;
    let Some(acked) = acked else { return Ok(None) };
    let durable = image_log(data_dir)?.last_index();
    Ok((acked > durable).then_some((acked, durable)))
}

/// After a replica's process is gone (stopped, or exited on a storage
/// error) but before it restarts on its data dir, with the crash shim:
/// `Some((acknowledged, readable))` when it acknowledged log entries past
/// the last one its log reads back (a record it left torn in the middle of
/// its log cuts off everything after it on open), `None` when all it
/// acknowledged reads back. The log is read from a copy
/// (`<data-dir>/readback/`, removed after), so nothing the replica will
/// start on is changed.
pub fn acked_beyond_readable(data_dir: &Path) -> Result<Option<(u64, u64)>, OpenError> {
    let io_err = |source| OpenError::Io { path: data_dir.to_path_buf(), source };
    let Some(acked) = read_acked(&image_dir(data_dir).join(ACKED_FILE)).map_err(io_err)? else { return Ok(None) };
    let copy = data_dir.join("readback");
    match fs::remove_dir_all(&copy) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(e)),
        _ => {}
    }
    fs::create_dir_all(&copy).map_err(io_err)?;
    let log_dir = data_dir.join("log");
    if log_dir.exists() {
        for entry in fs::read_dir(&log_dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            if entry.file_type().map_err(io_err)?.is_file() && entry.file_name() != "LOCK" {
                fs::copy(entry.path(), copy.join(entry.file_name())).map_err(io_err)?;
            }
        }
    }
    let readable = LogFile::open(&copy, crate::disk::purged_index).map(|log| log.last_index().unwrap_or(0));
    fs::remove_dir_all(&copy).map_err(io_err)?;
    let readable = readable.map_err(|source| OpenError::Io { path: log_dir, source })?;
    Ok((acked > readable).then_some((acked, readable)))
}

/// Simulates a power loss on a data dir whose process is gone: the log
/// and snapshot become what the last durable point recorded in the
/// crash image (empty when nothing was ever made durable). The image stays,
/// so a store reopened with the shim carries on recording.
pub fn restore_crash_image(data_dir: &Path) -> Result<(), OpenError> {
    let io_err = |source| OpenError::Io { path: data_dir.to_path_buf(), source };
    let image = image_dir(data_dir);
    let log = image_log(data_dir)?;
    // After the power loss the replica has acknowledged only what survived.
    if let Some(acked) = read_acked(&image.join(ACKED_FILE)).map_err(io_err)? {
        let durable = log.last_index();
        if acked > durable {
            fs::write(image.join(ACKED_FILE), durable.to_le_bytes()).map_err(io_err)?;
        }
    }
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
    LogFile::create_from_image(&log_dir, &log).map_err(|source| OpenError::Io { path: log_dir, source })
}
