//! The data directory: the Raft log (plain append-only files, see
//! [`log_file`](crate::log_file)), one file for the current snapshot, and the
//! flusher thread that makes appended entries durable before openraft counts
//! them.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::faults::{FaultSwitch, FaultyDisk};
use crate::log_file::vfs::{RealDisk, Vfs};
use crate::log_file::{LogFile, SyncErrors};
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
    /// Read injected disk faults from this control file (tests and chaos
    /// only; see [`DiskFault`](crate::DiskFault)).
    pub disk_fault_file: Option<PathBuf>,
}

/// Deliberate storage bugs (tests of the crash-consistency checks only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFault {
    /// Acknowledge appended log entries without flushing or fsyncing them.
    AckBeforeFsync,
    /// Acknowledge appended log entries even when their `fdatasync` failed,
    /// and keep writing (the "fsyncgate" mistake).
    AckDespiteSyncError,
    /// Acknowledge appended log entries even when their write failed (a full
    /// disk), leaving the partial record where it landed and writing the
    /// next ones after it.
    AckDespiteWriteError,
}

/// Why a data directory could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The directory could not be created or read, or its log is damaged.
    #[error("data dir {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Another process (or a replica in this one) has the log open.
    #[error("cannot open the log in {path}: {}", crate::log_file::IN_USE)]
    InUse {
        /// The log directory.
        path: PathBuf,
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

/// Shared handle on the data directory.
#[derive(Clone)]
pub(crate) struct Disk {
    pub(crate) dir: PathBuf,
    /// The log and its metadata.
    pub(crate) log: Arc<LogFile>,
    pub(crate) opts: StoreOptions,
    /// Serialises durable points with the crash image's recording of them.
    image_lock: Arc<Mutex<()>>,
    /// The applied log, when kept.
    pub(crate) applied: Option<Arc<Mutex<File>>>,
    /// Appends waiting for durability, handed to the flusher thread.
    flusher: std::sync::mpsc::Sender<Box<dyn FnOnce(io::Result<()>) + Send>>,
    /// With the crash shim: the last log index acknowledged to openraft.
    pub(crate) acked: Option<Arc<crash_image::AckedRecord>>,
}

impl Disk {
    /// Calls `done` once everything written so far is durable. The flusher
    /// thread takes every waiting append at once and makes them durable with
    /// one sync (group fsync), so an append returns as soon as it is written
    /// and the leader replicates while it syncs.
    pub(crate) fn flush_then(
        &self,
        last: u64,
        callback: openraft::storage::LogFlushed<crate::RaftConfig<impl crate::StateMachineApp>>,
    ) {
        let acked = self.acked.clone();
        let done: Box<dyn FnOnce(io::Result<()>) + Send> = Box::new(move |r| {
            if let (Ok(()), Some(a)) = (&r, &acked) {
                a.raise(last);
            }
            callback.log_io_completed(r)
        });
        if let Err(refused) = self.flusher.send(done) {
            (refused.0)(Err(io::Error::other("the log flusher has stopped")));
        }
    }

    /// Held while a sync runs when the crash shim records images (so an
    /// image holds exactly what that sync made durable); `None` otherwise.
    pub(crate) fn image_guard(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.opts.crash_image.then(|| self.image_lock.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What a durable point needs (the flusher thread holds one of its own,
    /// so that it does not keep the flusher's channel open).
    fn durable_point(&self) -> DurablePoint {
        DurablePoint {
            dir: self.dir.clone(),
            log: self.log.clone(),
            crash_image: self.opts.crash_image,
            image_lock: self.image_lock.clone(),
            ack_despite_sync_error: self.opts.fault == Some(StoreFault::AckDespiteSyncError),
        }
    }

    /// Runs a durable log change (vote, truncate, purge), then syncs the
    /// appended entries and records the image.
    pub(crate) async fn durably(
        &self,
        change: impl FnOnce(&LogFile) -> io::Result<()> + Send + 'static,
    ) -> io::Result<()> {
        let point = self.durable_point();
        tokio::task::spawn_blocking(move || point.reach(change))
            .await
            .map_err(|e| io::Error::other(format!("log write task failed: {e}")))?
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
    let sync_errors = match opts.fault {
        Some(StoreFault::AckDespiteSyncError) => SyncErrors::CarryOn,
        _ => SyncErrors::Stop,
    };
    let disk: Arc<dyn Vfs> = match &opts.disk_fault_file {
        Some(control) => Arc::new(FaultyDisk(FaultSwitch(control.clone()))),
        None => Arc::new(RealDisk),
    };
    let log = LogFile::open(&log_dir, purged_index)
        .map_err(|source| match source.kind() {
            io::ErrorKind::WouldBlock => OpenError::InUse { path: log_dir.clone() },
            _ => OpenError::Io { path: log_dir.clone(), source },
        })?
        .with_disk(disk, sync_errors)
        .ignoring_write_errors(opts.fault == Some(StoreFault::AckDespiteWriteError));
    let acked = match opts.crash_image {
        true => Some(Arc::new(crash_image::AckedRecord::open(dir).map_err(io_err)?)),
        false => None,
    };
    let applied = match opts.applied_log {
        true => Some(Arc::new(Mutex::new(applied_log::open_writer(dir).map_err(io_err)?))),
        false => None,
    };
    let (flusher, waiting) = std::sync::mpsc::channel();
    let disk = Disk {
        dir: dir.to_path_buf(),
        log: Arc::new(log),
        opts: opts.clone(),
        image_lock: Arc::default(),
        applied,
        flusher,
        acked,
    };
    spawn_flusher(disk.durable_point(), waiting).map_err(io_err)?;
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

type Waiting = Box<dyn FnOnce(io::Result<()>) + Send>;

/// A durable point of the log: a change (or none), one sync, and the crash
/// image of what it made durable, all under the image lock.
struct DurablePoint {
    dir: PathBuf,
    log: Arc<LogFile>,
    crash_image: bool,
    image_lock: Arc<Mutex<()>>,
    /// The injected bug: a failed sync is reported as done.
    ack_despite_sync_error: bool,
}

impl DurablePoint {
    fn reach(&self, change: impl FnOnce(&LogFile) -> io::Result<()>) -> io::Result<()> {
        let _image = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        change(&self.log)?;
        let started = std::time::Instant::now();
        match self.log.sync() {
            Ok(()) => {}
            // Nothing reached the disk: no image, but the bug says done.
            Err(e) if self.ack_despite_sync_error => {
                tracing::warn!(error = %e, "log sync failed; acknowledging anyway (injected bug)");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        metrics::histogram!("muster_raft_log_sync_seconds").record(started.elapsed().as_secs_f64());
        // Appends take the image lock while the shim is on, so nothing was
        // written between the sync and this read.
        if self.crash_image {
            crash_image::record_log(&self.dir, &self.log.image())?;
        }
        Ok(())
    }
}

/// The flusher thread: waits for an append, takes every append waiting, syncs
/// once, and calls them all back. It ends when every `Disk` (and so every
/// sender) is gone.
fn spawn_flusher(point: DurablePoint, waiting: std::sync::mpsc::Receiver<Waiting>) -> io::Result<()> {
    std::thread::Builder::new().name("raft-log-flush".into()).spawn(move || {
        while let Ok(first) = waiting.recv() {
            let mut batch = vec![first];
            batch.extend(waiting.try_iter());
            let result = point.reach(|_| Ok(()));
            for done in batch {
                done(match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
    })?;
    Ok(())
}

/// The index of a stored purge marker (an encoded log id).
pub(crate) fn purged_index(bytes: &[u8]) -> Option<u64> {
    codec::decode::<openraft::LogId<u64>>(bytes).ok().map(|id| id.index)
}
