//! The Raft log on plain files, in the shape of a write-ahead log:
//! append-only segments with a versioned header, made durable by one
//! `fdatasync` per group of appends.
//!
//! ```text
//!   <data-dir>/log/
//!     seg-00000000000000000001.log   header, then records (format.rs)
//!     seg-00000000000000052114.log   (a new segment past 64 MiB; named by its first index)
//!     vote.meta  purged.meta  committed.meta
//! ```
//!
//! - [`format`] pairs an encoder with a decoder for each piece on disk.
//! - [`recover`] opens a directory: checks everything, cuts off a torn
//!   tail, refuses damage and unknown versions by name.
//! - [`vfs`] is the seam under appends and syncs, where tests and the chaos
//!   harness put a failing disk.
//!
//! - **Append** writes the records to the active segment (one `write`) and
//!   returns; the entries are readable at once. [`LogFile::sync`] makes
//!   everything written so far durable with one `fdatasync`.
//! - **Truncate** cuts the segment holding the first removed entry and
//!   deletes the segments after it, durably, before returning.
//! - **Purge** first makes the purge marker durable, then deletes the
//!   segments whose entries are all purged; entries at or below the marker
//!   are skipped on open.
//! - **Vote and purge marker** are written to a temporary file, synced, and
//!   renamed into place (then the directory is synced).
//! - **The committed index** is overwritten in place and never synced (it is
//!   written on every commit, on the commit path): a lost one is recomputed
//!   by the cluster, so one that does not check out on open reads as absent.
//!   A rename would cost a journal commit per entry here (ext4's
//!   replace-by-rename writes the new file's data back first).
//!
//! The live entries are also kept in memory, encoded, for reads: the log
//! between two snapshots is bounded by the snapshot policy.

mod format;
mod recover;

pub(crate) use recover::read_only;
pub(crate) mod vfs;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use self::vfs::{RealDisk, Vfs};

/// A segment past this size is closed and a new one started.
const SEGMENT_BYTES: u64 = 64 << 20;

/// The metadata kept beside the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Meta {
    /// The vote (durable).
    Vote,
    /// The last purged log id (durable; written before segments go).
    Purged,
    /// The committed log id (not synced).
    Committed,
}

impl Meta {
    fn file(self) -> &'static str {
        match self {
            Meta::Vote => "vote.meta",
            Meta::Purged => "purged.meta",
            Meta::Committed => "committed.meta",
        }
    }
}

/// Everything a log holds, as of one moment: the crash shim's image of
/// what was durable (see `crash_image`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogImage {
    pub(crate) vote: Option<Vec<u8>>,
    pub(crate) purged: Option<Vec<u8>>,
    pub(crate) committed: Option<Vec<u8>>,
    /// The live entries (index, encoded), in order.
    pub(crate) entries: Vec<(u64, Vec<u8>)>,
}

impl LogImage {
    /// The last index the image holds: its last entry, or what its purge
    /// marker covers.
    pub(crate) fn last_index(&self) -> u64 {
        let purged = self.purged.as_deref().and_then(crate::disk::purged_index);
        self.entries.last().map(|&(i, _)| i).into_iter().chain(purged).max().unwrap_or(0)
    }
}

/// One live entry: where its record starts, and its encoded bytes.
struct Located {
    segment: u64,
    offset: u64,
    bytes: Arc<[u8]>,
}

struct Segment {
    file: Arc<File>,
    len: u64,
}

struct Inner {
    entries: BTreeMap<u64, Located>,
    /// By first index; the last one is the active segment.
    segments: BTreeMap<u64, Segment>,
    meta: BTreeMap<Meta, Vec<u8>>,
    /// Entries at or below this index are purged (skipped on open).
    purged: Option<u64>,
    /// How far the last successful sync reached: (segment, length).
    /// Everything before it is on stable storage.
    synced: (u64, u64),
    /// Why the log stopped taking writes: a sync failed (see [`LogFile::sync`]).
    failed: Option<String>,
}

impl Inner {
    fn refuse_if_failed(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(io::Error::other(format!(
                "the log takes no more writes after a failed sync ({why}); restart the replica"
            ))),
        }
    }
}

/// What the log does when `fdatasync` fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum SyncErrors {
    /// Stop: keep only what the last good sync made durable and take no
    /// more writes (production).
    #[default]
    Stop,
    /// Report the error and carry on as if the data were safe: the classic
    /// mistake, kept only so that a test can prove the chaos checks catch it.
    CarryOn,
}

/// The log directory.
pub(crate) struct LogFile {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// `committed.meta`, overwritten in place.
    committed: File,
    /// `LOCK`, held exclusively while the log is open.
    _lock: File,
    /// Appends and syncs go through it (a failing disk in tests and chaos).
    disk: Arc<dyn Vfs>,
    sync_errors: SyncErrors,
    /// The injected bug of a store that ignores failed writes.
    ignore_write_errors: bool,
}

/// Why the log directory is not ours to open.
pub(crate) const IN_USE: &str = "the log is in use by another process or replica";

/// Takes the directory's lock. A store dropped a moment ago in this process
/// may still be closing (its flusher thread lets go last): retry briefly.
fn lock_dir(dir: &Path) -> io::Result<File> {
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("LOCK"))?;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < give_up => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(fs::TryLockError::WouldBlock) => return Err(io::Error::new(io::ErrorKind::WouldBlock, IN_USE)),
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

fn segment_name(first: u64) -> String {
    format!("seg-{first:020}.log")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` (with a checksum) to `dir/name` durably: temp file,
/// sync, rename, sync of the directory.
fn write_meta(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(&format::encode_meta(bytes))?;
    f.sync_data()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Overwrites `file` from its start (not synced).
fn write_in_place(file: &File, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(&format::encode_in_place(bytes), 0)
}

impl LogFile {
    /// Opens (or creates) the log in `dir`, recovering from a torn tail
    /// (see [`recover`]). `purged_index` reads the index out of the stored
    /// purge marker.
    pub(crate) fn open(dir: &Path, purged_index: impl Fn(&[u8]) -> Option<u64>) -> io::Result<LogFile> {
        fs::create_dir_all(dir)?;
        let lock = lock_dir(dir)?;
        let committed = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(Meta::Committed.file()))?;
        let r = recover::recover(dir, &committed, purged_index)?;
        let inner = Inner {
            entries: r.entries,
            segments: r.segments,
            meta: r.meta,
            purged: r.purged,
            synced: r.synced,
            failed: None,
        };
        Ok(LogFile {
            dir: dir.to_path_buf(),
            inner: Mutex::new(inner),
            committed,
            _lock: lock,
            disk: Arc::new(RealDisk),
            sync_errors: SyncErrors::Stop,
            ignore_write_errors: false,
        })
    }

    /// Treats a failed write as done: the partial record stays where it
    /// landed and later records follow it. A deliberate bug, kept only so
    /// that a test can prove the chaos checks catch it.
    pub(crate) fn ignoring_write_errors(mut self, ignore: bool) -> LogFile {
        self.ignore_write_errors = ignore;
        self
    }

    /// The last entry's index, or the purge marker's when no entry is left.
    pub(crate) fn last_index(&self) -> Option<u64> {
        let inner = self.lock();
        inner
            .entries
            .keys()
            .next_back()
            .copied()
            .or_else(|| inner.meta.get(&Meta::Purged).and_then(|b| crate::disk::purged_index(b)))
    }

    /// Appends and syncs through `disk` (a failing one in tests and chaos),
    /// and handles a failed sync as `sync_errors` says.
    pub(crate) fn with_disk(mut self, disk: Arc<dyn Vfs>, sync_errors: SyncErrors) -> LogFile {
        self.disk = disk;
        self.sync_errors = sync_errors;
        self
    }

    /// A sync failed. Its pages may be gone from the cache without having
    /// reached the disk, and a retried `fdatasync` can report success for
    /// them ("fsyncgate"), so the log never syncs again: it drops every
    /// entry the last good sync did not cover, cuts the file back to that
    /// point, and refuses further writes until the replica restarts and
    /// reads back what is really on disk.
    fn fail(&self, e: io::Error) -> io::Error {
        if self.sync_errors == SyncErrors::CarryOn {
            return e;
        }
        let mut inner = self.lock();
        let (segment, len) = inner.synced;
        inner.entries.retain(|_, l| (l.segment, l.offset) < (segment, len));
        let later: Vec<u64> = inner.segments.range(segment + 1..).map(|(&k, _)| k).collect();
        for k in later {
            inner.segments.remove(&k);
            let _ = fs::remove_file(self.dir.join(segment_name(k)));
        }
        if let Some(seg) = inner.segments.get_mut(&segment) {
            let _ = seg.file.set_len(len);
            seg.len = len;
        }
        tracing::error!(error = %e, "a log sync failed: the log keeps what the last good sync made durable and takes no more writes");
        inner.failed = Some(e.to_string());
        io::Error::new(e.kind(), format!("log sync failed: {e}"))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stored metadata value.
    pub(crate) fn meta(&self, m: Meta) -> Option<Vec<u8>> {
        self.lock().meta.get(&m).cloned()
    }

    /// Stores a metadata value; the vote and purge marker durably.
    pub(crate) fn set_meta(&self, m: Meta, bytes: Vec<u8>) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        match m {
            Meta::Committed => write_in_place(&self.committed, &bytes)?,
            Meta::Vote | Meta::Purged => write_meta(&self.dir, m.file(), &bytes)?,
        }
        inner.meta.insert(m, bytes);
        Ok(())
    }

    /// Starts the segment whose first entry is `first`: its header, synced,
    /// and the directory entry, synced. Nothing is left of it on failure.
    fn start_segment(&self, first: u64) -> io::Result<Segment> {
        let path = self.dir.join(segment_name(first));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let header = format::encode_segment_header(first);
        let started = self.disk.append(&file, &header).and_then(|()| self.disk.sync(&file));
        if let Err(e) = started.and_then(|()| sync_dir(&self.dir)) {
            drop(file);
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(Segment { file: Arc::new(file), len: header.len() as u64 })
    }

    /// Writes entries (index, encoded) after the last one; not yet durable.
    pub(crate) fn append(&self, items: Vec<(u64, Vec<u8>)>) -> io::Result<()> {
        let Some(&(first_index, _)) = items.first() else { return Ok(()) };
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let active = inner.segments.last_key_value().map(|(&k, s)| (k, s.len));
        let segment = match active {
            Some((k, len)) if len < SEGMENT_BYTES => k,
            _ => {
                // Close the full segment (synced now, so the flusher only
                // ever syncs the active one), then start the next.
                if let Some((_, s)) = inner.segments.last_key_value()
                    && let Err(e) = self.disk.sync(&s.file)
                {
                    drop(inner);
                    return Err(self.fail(e));
                }
                let seg = self.start_segment(first_index)?;
                inner.synced = (first_index, seg.len);
                inner.segments.insert(first_index, seg);
                first_index
            }
        };
        let start = inner.segments[&segment].len;
        let mut buf = Vec::with_capacity(items.iter().map(|(_, b)| b.len() + format::RECORD_HEADER).sum());
        let mut located = Vec::with_capacity(items.len());
        for (index, bytes) in &items {
            located.push((*index, start + buf.len() as u64));
            format::encode_record(*index, bytes, &mut buf);
        }
        let seg = inner.segments.get_mut(&segment).expect("active segment");
        if let Err(e) = self.disk.append(&seg.file, &buf) {
            if self.ignore_write_errors {
                tracing::error!(error = %e, "a log write failed; carrying on as if it had landed (injected bug)");
            } else {
                // Leave no partial record behind a later append.
                seg.file.set_len(start)?;
                return Err(e);
            }
        }
        seg.len += buf.len() as u64;
        for ((index, offset), (_, bytes)) in located.into_iter().zip(items) {
            inner.entries.insert(index, Located { segment, offset, bytes: bytes.into() });
        }
        Ok(())
    }

    /// Makes everything appended so far durable (the active segment's
    /// `fdatasync`; closed segments were synced when they closed).
    /// A sync that fails stops the log for good (see [`LogFile::fail`]).
    pub(crate) fn sync(&self) -> io::Result<()> {
        let active = {
            let inner = self.lock();
            inner.refuse_if_failed()?;
            inner.segments.last_key_value().map(|(&k, s)| (k, s.len, s.file.clone()))
        };
        let Some((segment, len, file)) = active else { return Ok(()) };
        match self.disk.sync(&file) {
            Ok(()) => {
                let mut inner = self.lock();
                inner.synced = inner.synced.max((segment, len));
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The encoded entries in `range`, in order.
    pub(crate) fn read(&self, range: impl RangeBounds<u64>) -> Vec<Arc<[u8]>> {
        self.lock().entries.range(range).map(|(_, l)| l.bytes.clone()).collect()
    }

    /// The encoded entries from `start` up to (not including) `end`, in
    /// order, stopping once they add up to `max_bytes`: the first entry is
    /// always returned whatever its size (a range that holds entries never
    /// reads as empty), and no later one that would pass the bound.
    pub(crate) fn read_limited(&self, start: u64, end: u64, max_bytes: usize) -> Vec<Arc<[u8]>> {
        let inner = self.lock();
        let mut out = Vec::new();
        let mut total = 0usize;
        for (_, l) in inner.entries.range(start..end) {
            if !out.is_empty() && total + l.bytes.len() > max_bytes {
                break;
            }
            total += l.bytes.len();
            out.push(l.bytes.clone());
        }
        out
    }

    /// The last live entry, encoded.
    pub(crate) fn last(&self) -> Option<Arc<[u8]>> {
        self.lock().entries.last_key_value().map(|(_, l)| l.bytes.clone())
    }

    /// Removes every entry from `since` on, durably.
    pub(crate) fn truncate(&self, since: u64) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let removed = inner.entries.split_off(&since);
        let Some((_, first)) = removed.first_key_value() else { return Ok(()) };
        let (segment, offset) = (first.segment, first.offset);
        let later: Vec<u64> = inner.segments.range(segment + 1..).map(|(&k, _)| k).collect();
        for k in &later {
            inner.segments.remove(k);
            fs::remove_file(self.dir.join(segment_name(*k)))?;
        }
        let seg = inner.segments.get_mut(&segment).expect("the segment of a live entry");
        seg.file.set_len(offset)?;
        seg.len = offset;
        let file = seg.file.clone();
        inner.synced = inner.synced.min((segment, offset));
        drop(inner);
        if let Err(e) = file.sync_all() {
            return Err(self.fail(e));
        }
        if !later.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Records `marker` (the purged log id, for entries up to `upto`)
    /// durably, then drops those entries and the segments that hold nothing
    /// else.
    pub(crate) fn purge(&self, upto: u64, marker: Vec<u8>) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        write_meta(&self.dir, Meta::Purged.file(), &marker)?;
        inner.meta.insert(Meta::Purged, marker);
        inner.purged = Some(upto);
        inner.entries = inner.entries.split_off(&(upto.saturating_add(1)));
        // A segment holds [its first, the next one's first); the active
        // (last) segment always stays.
        let firsts: Vec<u64> = inner.segments.keys().copied().collect();
        let mut gone = false;
        for pair in firsts.windows(2) {
            if pair[1] - 1 <= upto {
                inner.segments.remove(&pair[0]);
                fs::remove_file(self.dir.join(segment_name(pair[0])))?;
                gone = true;
            }
        }
        if gone {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Everything the log holds now.
    pub(crate) fn image(&self) -> LogImage {
        let inner = self.lock();
        LogImage {
            vote: inner.meta.get(&Meta::Vote).cloned(),
            purged: inner.meta.get(&Meta::Purged).cloned(),
            committed: inner.meta.get(&Meta::Committed).cloned(),
            entries: inner.entries.iter().map(|(&i, l)| (i, l.bytes.to_vec())).collect(),
        }
    }

    /// Writes a fresh log directory holding exactly `image`, durably, in
    /// the current format.
    pub(crate) fn create_from_image(dir: &Path, image: &LogImage) -> io::Result<()> {
        fs::create_dir_all(dir)?;
        if let Some(v) = &image.committed {
            let f = File::create(dir.join(Meta::Committed.file()))?;
            write_in_place(&f, v)?;
            f.sync_all()?;
        }
        for (m, v) in [(Meta::Vote, &image.vote), (Meta::Purged, &image.purged)] {
            if let Some(v) = v {
                write_meta(dir, m.file(), v)?;
            }
        }
        if let Some(&(first, _)) = image.entries.first() {
            let mut buf = format::encode_segment_header(first).to_vec();
            for (i, v) in &image.entries {
                format::encode_record(*i, v, &mut buf);
            }
            let mut f = File::create(dir.join(segment_name(first)))?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(bytes: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    fn items(from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
        (from..=to).map(|i| (i, format!("entry {i}").into_bytes())).collect()
    }

    fn indexes(log: &LogFile) -> Vec<u64> {
        log.read(..)
            .iter()
            .map(|b| std::str::from_utf8(b).unwrap().trim_start_matches("entry ").parse().unwrap())
            .collect()
    }

    /// A bounded read stops before the entry that would pass the bound,
    /// but always returns the first one, however large.
    #[test]
    fn a_bounded_read_stops_at_its_byte_bound_and_never_reads_empty() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        log.append((1..=6).map(|i| (i, vec![i as u8; 100 * i as usize])).collect()).unwrap();
        let sizes = |v: Vec<Arc<[u8]>>| v.iter().map(|b| b.len()).collect::<Vec<_>>();
        assert_eq!(sizes(log.read_limited(1, 7, 600)), vec![100, 200, 300], "100 + 200 + 300 = 600 fits");
        assert_eq!(sizes(log.read_limited(1, 7, 599)), vec![100, 200]);
        assert_eq!(sizes(log.read_limited(6, 7, 10)), vec![600], "a lone entry over the bound still goes");
        assert_eq!(sizes(log.read_limited(4, 6, 1 << 20)), vec![400, 500], "the range's end is kept");
        assert!(log.read_limited(7, 9, 1 << 20).is_empty());
    }

    #[test]
    fn entries_survive_a_reopen_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = LogFile::open(dir.path(), index).unwrap();
            log.append(items(1, 5)).unwrap();
            log.sync().unwrap();
        }
        // A crash mid-write leaves half a record at the end.
        let seg = dir.path().join(segment_name(1));
        let full = fs::read(&seg).unwrap();
        let mut torn = full.clone();
        let mut more = Vec::new();
        format::encode_record(6, b"entry 6", &mut more);
        torn.extend_from_slice(&more[..more.len() - 3]);
        fs::write(&seg, &torn).unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3, 4, 5]);
        assert_eq!(fs::read(&seg).unwrap(), full, "the torn record is cut off");
        log.append(items(6, 7)).unwrap();
        drop(log);
        assert_eq!(indexes(&LogFile::open(dir.path(), index).unwrap()), (1..=7).collect::<Vec<_>>());
    }

    #[test]
    fn a_damaged_record_before_the_end_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = LogFile::open(dir.path(), index).unwrap();
            log.append(items(1, 3)).unwrap();
            log.set_meta(Meta::Vote, b"v".to_vec()).unwrap();
        }
        {
            // A second segment makes the first one closed.
            let mut buf = format::encode_segment_header(4).to_vec();
            format::encode_record(4, b"entry 4", &mut buf);
            fs::write(dir.path().join(segment_name(4)), &buf).unwrap();
        }
        let seg = dir.path().join(segment_name(1));
        let mut raw = fs::read(&seg).unwrap();
        raw[format::SEGMENT_HEADER + format::RECORD_HEADER + 2] ^= 0xff;
        fs::write(&seg, &raw).unwrap();
        let err = LogFile::open(dir.path(), index).err().expect("corruption is refused");
        assert!(err.to_string().contains("checksum") && err.to_string().contains("offset 16"), "{err}");
    }

    /// A directory written before segments had a header (format version
    /// 0) is read, and its last segment is appended to; the next segment
    /// starts in the current format, and both read back.
    #[test]
    fn a_log_of_the_headerless_format_is_read_and_carries_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = Vec::new();
        for (i, body) in items(1, 3) {
            format::encode_record(i, &body, &mut old);
        }
        fs::write(dir.path().join(segment_name(1)), &old).unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        log.append(items(4, 4)).unwrap();
        log.sync().unwrap();
        assert_eq!(fs::read(dir.path().join(segment_name(1))).unwrap()[..old.len()], old[..]);
        log.lock().segments.get_mut(&1).unwrap().len = SEGMENT_BYTES;
        log.append(items(5, 6)).unwrap();
        let new = fs::read(dir.path().join(segment_name(5))).unwrap();
        assert_eq!(new[..format::SEGMENT_HEADER], format::encode_segment_header(5));
        drop(log);
        assert_eq!(indexes(&LogFile::open(dir.path(), index).unwrap()), (1..=6).collect::<Vec<_>>());
    }

    /// A segment of a later format, or one whose header names another
    /// first entry than its file name, is refused, saying which and why.
    #[test]
    fn a_segment_of_an_unknown_version_or_the_wrong_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        LogFile::open(dir.path(), index).unwrap().append(items(1, 2)).unwrap();
        let seg = dir.path().join(segment_name(1));
        let mut raw = fs::read(&seg).unwrap();
        raw[4] = 7;
        fs::write(&seg, &raw).unwrap();
        let err = LogFile::open(dir.path(), index).err().expect("a later version is refused").to_string();
        assert!(err.contains("log format version 7") && err.contains(&segment_name(1)), "{err}");
        raw[4] = 1;
        fs::write(dir.path().join(segment_name(9)), &raw).unwrap();
        fs::remove_file(&seg).unwrap();
        let err = LogFile::open(dir.path(), index).err().expect("a renamed segment is refused").to_string();
        assert!(err.contains("header says it starts at entry 1"), "{err}");
    }

    /// A crash while a new segment's header was being written leaves it cut
    /// short (nothing in it was synced): it is started again, and the
    /// entries before it stay.
    #[test]
    fn a_segment_header_cut_short_at_the_end_is_started_again() {
        let dir = tempfile::tempdir().unwrap();
        LogFile::open(dir.path(), index).unwrap().append(items(1, 3)).unwrap();
        let next = dir.path().join(segment_name(4));
        fs::write(&next, &format::encode_segment_header(4)[..6]).unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        assert_eq!(fs::read(&next).unwrap(), format::encode_segment_header(4));
        log.append(items(4, 4)).unwrap();
        drop(log);
        assert_eq!(indexes(&LogFile::open(dir.path(), index).unwrap()), vec![1, 2, 3, 4]);
        // Cut short anywhere but at the end, it is damage.
        fs::write(dir.path().join(segment_name(9)), format::encode_segment_header(9)).unwrap();
        fs::write(&next, &format::encode_segment_header(4)[..6]).unwrap();
        let err = LogFile::open(dir.path(), index).err().expect("refused").to_string();
        assert!(err.contains("segment header cut short"), "{err}");
    }

    /// A disk that fails under the log, through the seam: a full disk's
    /// half-written append leaves nothing behind; a failed sync keeps what
    /// the last good one made durable and stops the log.
    #[test]
    fn a_failing_disk_under_the_seam_loses_nothing_acknowledged() {
        use crate::faults::{DiskFault, FaultSwitch, FaultyDisk, set_disk_fault};
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("fault");
        let disk = Arc::new(FaultyDisk(FaultSwitch(control.clone())));
        let log = LogFile::open(&dir.path().join("log"), index).unwrap().with_disk(disk, SyncErrors::Stop);
        log.append(items(1, 3)).unwrap();
        log.sync().unwrap();
        set_disk_fault(&control, Some(DiskFault::Full)).unwrap();
        assert_eq!(log.append(items(4, 5)).unwrap_err().raw_os_error(), Some(28));
        set_disk_fault(&control, None).unwrap();
        log.append(items(4, 4)).unwrap();
        set_disk_fault(&control, Some(DiskFault::SyncFails)).unwrap();
        assert!(log.sync().unwrap_err().to_string().contains("log sync failed"));
        assert_eq!(indexes(&log), vec![1, 2, 3], "what no good sync covered is dropped");
        set_disk_fault(&control, None).unwrap();
        assert!(log.append(items(4, 4)).unwrap_err().to_string().contains("no more writes"));
        drop(log);
        assert_eq!(indexes(&LogFile::open(&dir.path().join("log"), index).unwrap()), vec![1, 2, 3]);
    }

    #[test]
    fn truncate_purge_and_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        log.append(items(1, 10)).unwrap();
        log.truncate(8).unwrap();
        assert_eq!(indexes(&log), (1..=7).collect::<Vec<_>>());
        log.append(items(8, 9)).unwrap();
        // A second segment, as if the first were full.
        {
            let mut inner = log.lock();
            inner.segments.get_mut(&1).unwrap().len = SEGMENT_BYTES;
        }
        log.append(items(10, 12)).unwrap();
        assert!(dir.path().join(segment_name(10)).exists());
        log.purge(9, 9u64.to_le_bytes().to_vec()).unwrap();
        assert!(!dir.path().join(segment_name(1)).exists(), "a wholly purged segment is deleted");
        assert_eq!(indexes(&log), vec![10, 11, 12]);
        log.truncate(11).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = LogFile::open(dir.path(), index).unwrap();
        assert_eq!(indexes(&log), vec![10]);
        // Purging past the end keeps the active segment; reopening skips
        // its purged entries.
        log.purge(20, 20u64.to_le_bytes().to_vec()).unwrap();
        log.append(items(21, 21)).unwrap();
        drop(log);
        assert_eq!(indexes(&LogFile::open(dir.path(), index).unwrap()), vec![21]);
    }

    #[test]
    fn an_image_round_trips_through_a_fresh_directory() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        log.append(items(3, 6)).unwrap();
        log.set_meta(Meta::Vote, b"vote".to_vec()).unwrap();
        log.set_meta(Meta::Committed, b"c".to_vec()).unwrap();
        let image = log.image();
        assert_eq!(image.last_index(), 6);
        let copy = tempfile::tempdir().unwrap();
        LogFile::create_from_image(copy.path(), &image).unwrap();
        let again = LogFile::open(copy.path(), index).unwrap();
        assert_eq!(again.image(), image);
        assert_eq!(again.meta(Meta::Vote).as_deref(), Some(&b"vote"[..]));
        let marker = crate::codec::encode(&openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 9u64)).unwrap();
        let purged_only = LogImage { purged: Some(marker), ..LogImage::default() };
        assert_eq!(purged_only.last_index(), 9);
    }

    #[test]
    fn a_torn_committed_index_reads_as_absent_but_a_torn_vote_refuses() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = LogFile::open(dir.path(), index).unwrap();
            log.set_meta(Meta::Committed, b"c".to_vec()).unwrap();
        }
        fs::write(dir.path().join(Meta::Committed.file()), b"\x05\0\0\0xxxxyy").unwrap();
        assert_eq!(LogFile::open(dir.path(), index).unwrap().meta(Meta::Committed), None);
        fs::write(dir.path().join(Meta::Vote.file()), b"xxxxx").unwrap();
        assert!(LogFile::open(dir.path(), index).is_err());
    }
}
