//! The data directory: one sled database for the log and its metadata, one
//! file for the current snapshot, and the fsyncs that make an acknowledged
//! write durable.
//!
//! sled's own flush writes with `sync_file_range`, which survives a process
//! crash but not a power loss, and does not sync blob files at all; after
//! every flush we `fsync` the data file and any blob files ourselves. sled's
//! `flush_async` can hang under concurrency (sled #1308, #1241, #1357), so
//! the blocking `flush` runs on tokio's blocking pool instead.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::log_store::LogStore;
use crate::state_machine::StateMachineStore;
use crate::{StateMachineApp, applied_log, codec, crash_image};

/// How a data directory is opened. The default is what production runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Append every applied entry to `<data-dir>/applied.log` (see
    /// [`read_applied_log`](crate::read_applied_log)): the committed history
    /// kept past log compaction, for replay and audit. Grows without bound.
    pub applied_log: bool,
    /// The crash-consistency shim (tests only): record what every durable
    /// point made durable in `<data-dir>/crash-image/`, so that
    /// [`restore_crash_image`](crate::restore_crash_image) can simulate a
    /// power loss.
    pub crash_image: bool,
    /// A deliberate storage bug, to prove the crash shim catches one.
    pub fault: Option<StoreFault>,
}

/// Deliberate storage bugs (tests of the crash-consistency checks only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFault {
    /// Acknowledge appended log entries without flushing or fsyncing them.
    AckBeforeFsync,
}

/// Why a data directory could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The directory could not be created or read.
    #[error("data dir {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// sled refused to open (another process holds it, or it is corrupt).
    #[error("cannot open the log database in {path}: {source}")]
    Sled {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: sled::Error,
    },
    /// The stored snapshot is unreadable.
    #[error("the snapshot in {path} is unreadable: {reason}")]
    Snapshot {
        /// The snapshot file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// sled's largest inline item is a quarter of a segment; 8 MiB segments keep
/// log entries (batches of commands) inline, where our fsync covers them.
const SEGMENT_SIZE: usize = 8 << 20;

/// Shared handle on the data directory.
#[derive(Clone)]
pub(crate) struct Disk {
    pub(crate) dir: PathBuf,
    pub(crate) db: sled::Db,
    /// The single tree holding log entries and log metadata, so that one
    /// `Batch` changes both atomically.
    pub(crate) log: sled::Tree,
    data_file: Arc<File>,
    pub(crate) opts: StoreOptions,
    /// Serialises durable points with the crash image's recording of them.
    image_lock: Arc<Mutex<()>>,
    /// The applied log, when kept.
    pub(crate) applied: Option<Arc<Mutex<File>>>,
}

impl Disk {
    /// Flushes sled and fsyncs its files, on the blocking pool.
    pub(crate) async fn sync(&self) -> io::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.sync_blocking())
            .await
            .map_err(|e| io::Error::other(format!("flush task failed: {e}")))?
    }

    fn sync_blocking(&self) -> io::Result<()> {
        let _image = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.db.flush()?;
        self.data_file.sync_all()?;
        let blobs = self.dir.join("log").join("blobs");
        if let Ok(entries) = fs::read_dir(&blobs) {
            for entry in entries {
                File::open(entry?.path())?.sync_all()?;
            }
            File::open(&blobs)?.sync_all()?;
        }
        if self.opts.crash_image {
            // Openraft calls the log store from one task, so nothing wrote
            // to the tree between the flush and this read.
            crash_image::record_tree(&self.dir, &self.log)?;
        }
        Ok(())
    }

    pub(crate) fn snapshot_path(&self) -> PathBuf {
        self.dir.join("snapshot.bin")
    }

    /// Writes the snapshot file atomically: temp file, fsync, rename, fsync dir.
    pub(crate) async fn write_snapshot(&self, bytes: Vec<u8>) -> io::Result<()> {
        let dir = self.dir.clone();
        let path = self.snapshot_path();
        let image = self.opts.crash_image.then(|| self.image_lock.clone());
        tokio::task::spawn_blocking(move || {
            let recording = image.as_ref().map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
            let tmp = dir.join("snapshot.bin.tmp");
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, &path)?;
            File::open(&dir)?.sync_all()?;
            if recording.is_some() {
                crash_image::record_snapshot(&dir, &path)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| io::Error::other(format!("snapshot write task failed: {e}")))?
    }

    pub(crate) fn read_snapshot_file(&self) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.snapshot_path()) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Opens (or creates) the data directory `dir` and returns the two halves
/// openraft needs. A stored snapshot is restored into the state machine; the
/// log after it is re-applied by openraft on start-up.
pub fn open<A: StateMachineApp>(dir: &Path) -> Result<(LogStore<A>, StateMachineStore<A>), OpenError> {
    open_with(dir, &StoreOptions::default())
}

/// [`open`] with options (the applied log, the crash shim).
pub fn open_with<A: StateMachineApp>(
    dir: &Path,
    opts: &StoreOptions,
) -> Result<(LogStore<A>, StateMachineStore<A>), OpenError> {
    let io_err = |source| OpenError::Io { path: dir.to_path_buf(), source };
    fs::create_dir_all(dir).map_err(io_err)?;
    let log_dir = dir.join("log");
    let (db, log) = open_sled(&log_dir)?;
    let data_file = File::open(log_dir.join("db")).map_err(io_err)?;
    let applied = match opts.applied_log {
        true => Some(Arc::new(Mutex::new(applied_log::open_writer(dir).map_err(io_err)?))),
        false => None,
    };
    let disk = Disk {
        dir: dir.to_path_buf(),
        db,
        log,
        data_file: Arc::new(data_file),
        opts: opts.clone(),
        image_lock: Arc::default(),
        applied,
    };
    let snapshot = match disk.read_snapshot_file().map_err(io_err)? {
        None => None,
        Some(bytes) => Some(
            codec::decode(&bytes)
                .map_err(|e| OpenError::Snapshot { path: disk.snapshot_path(), reason: e.to_string() })?,
        ),
    };
    let sm = StateMachineStore::open(disk.clone(), snapshot)
        .map_err(|reason| OpenError::Snapshot { path: disk.snapshot_path(), reason })?;
    Ok((LogStore::new(disk), sm))
}

/// Opens the sled database in `log_dir` and its log tree.
///
/// sled finishes writes of a dropped database on its own thread pool, which
/// holds the file lock a moment longer: a reopen in the same process (a
/// restart test, the crash shim) retries the lock for up to a second. A
/// lock another process holds is still refused.
pub(crate) fn open_sled(log_dir: &Path) -> Result<(sled::Db, sled::Tree), OpenError> {
    let err = |source| OpenError::Sled { path: log_dir.to_path_buf(), source };
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let db = loop {
        match sled::Config::new().path(log_dir).segment_size(SEGMENT_SIZE).open() {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => break result.map_err(err)?,
        }
    };
    let log = db.open_tree("raft").map_err(err)?;
    Ok((db, log))
}
