//! The Raft log on plain files: append-only segments, made durable by one
//! `fdatasync` per group of appends.
//!
//! ```text
//!   <data-dir>/log/
//!     seg-00000000000000000001.log   records: [len u32][crc32 u32][index u64][entry bytes]
//!     seg-00000000000000052114.log   (a new segment past 64 MiB; named by its first index)
//!     vote.meta  purged.meta  committed.meta    [crc32 u32][bytes], replaced by rename
//! ```
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
//! - **Open** reads every segment in order and checks each record's length,
//!   checksum and index. A torn record at the end of the last segment (a
//!   write cut short by a crash: it was never acknowledged) is cut off;
//!   anything wrong elsewhere is corruption and refuses to open.
//!
//! The live entries are also kept in memory, encoded, for reads: the log
//! between two snapshots is bounded by the snapshot policy.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::faults::{self, DiskFault, FaultSwitch};

/// A segment past this size is closed and a new one started.
const SEGMENT_BYTES: u64 = 64 << 20;
/// Record header: length, checksum, index.
const HEADER: usize = 16;
/// The largest record accepted on open (a bigger length is a torn header).
const MAX_RECORD: u64 = 1 << 30;

/// The metadata kept beside the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Meta {
    /// The vote (durable).
    Vote,
    /// The last purged log id (durable; written before segments go).
    Purged,
    /// The committed log id (not synced).
    Committed,
}

impl Meta {
    const ALL: [Meta; 3] = [Meta::Vote, Meta::Purged, Meta::Committed];

    fn file(self) -> &'static str {
        match self {
            Meta::Vote => "vote.meta",
            Meta::Purged => "purged.meta",
            Meta::Committed => "committed.meta",
        }
    }

    /// The key this value has in a crash image.
    pub(crate) fn key(self) -> &'static [u8] {
        match self {
            Meta::Vote => b"M:vote",
            Meta::Purged => b"M:purged",
            Meta::Committed => b"M:committed",
        }
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
    meta: BTreeMap<&'static [u8], Vec<u8>>,
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
    /// `committed.meta`, overwritten in place: `[len u32][crc32 u32][bytes]`.
    committed: File,
    /// `LOCK`, held exclusively while the log is open.
    _lock: File,
    /// Injected disk faults (tests and chaos only).
    faults: Option<FaultSwitch>,
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

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn record(index: u64, bytes: &[u8], out: &mut Vec<u8>) {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&index.to_le_bytes());
    crc.update(bytes);
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Writes `bytes` (with a checksum) to `dir/name` durably: temp file,
/// sync, rename, sync of the directory.
fn write_meta(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(&crc32fast::hash(bytes).to_le_bytes())?;
    f.write_all(bytes)?;
    f.sync_data()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Overwrites `file` from its start with `[len][crc32][bytes]` (not synced).
fn write_in_place(file: &File, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = Vec::with_capacity(bytes.len() + 8);
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    buf.extend_from_slice(bytes);
    file.write_all_at(&buf, 0)
}

/// What [`write_in_place`] wrote; `None` when empty or torn.
fn read_in_place(mut file: &File) -> io::Result<Option<Vec<u8>>> {
    let mut raw = Vec::new();
    file.read_to_end(&mut raw)?;
    if raw.len() < 8 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(raw[..4].try_into().unwrap()) as usize;
    let Some(bytes) = raw.get(8..8 + len) else { return Ok(None) };
    Ok((crc32fast::hash(bytes).to_le_bytes() == raw[4..8]).then(|| bytes.to_vec()))
}

/// A meta file's bytes; `None` when absent or when it does not check out.
fn read_meta(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let raw = match fs::read(path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if raw.len() < 4 {
        return Ok(None);
    }
    let (crc, bytes) = raw.split_at(4);
    Ok((crc32fast::hash(bytes).to_le_bytes() == crc).then(|| bytes.to_vec()))
}

impl LogFile {
    /// Opens (or creates) the log in `dir`, recovering from a torn tail.
    /// `purged_index` reads the index out of the stored purge marker.
    pub(crate) fn open(dir: &Path, purged_index: impl Fn(&[u8]) -> Option<u64>) -> io::Result<LogFile> {
        fs::create_dir_all(dir)?;
        let lock = lock_dir(dir)?;
        let mut meta = BTreeMap::new();
        let committed = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(Meta::Committed.file()))?;
        if let Some(bytes) = read_in_place(&committed)? {
            meta.insert(Meta::Committed.key(), bytes);
        }
        for m in [Meta::Vote, Meta::Purged] {
            match read_meta(&dir.join(m.file()))? {
                Some(bytes) => {
                    meta.insert(m.key(), bytes);
                }
                // They are renamed into place whole: a bad one is damage,
                // not a torn write.
                None if dir.join(m.file()).exists() => {
                    return Err(corrupt(format!("{} does not check out", dir.join(m.file()).display())));
                }
                None => {}
            }
        }
        let purged = match meta.get(Meta::Purged.key()) {
            None => None,
            Some(bytes) => Some(
                purged_index(bytes)
                    .ok_or_else(|| corrupt(format!("{} does not decode", dir.join(Meta::Purged.file()).display())))?,
            ),
        };
        let mut firsts = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(first) = name.strip_prefix("seg-").and_then(|s| s.strip_suffix(".log")) {
                let first = first.parse::<u64>().map_err(|_| corrupt(format!("unexpected log file {name}")))?;
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let mut inner =
            Inner { entries: BTreeMap::new(), segments: BTreeMap::new(), meta, purged, synced: (0, 0), failed: None };
        let mut last: Option<u64> = None;
        for (n, &first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(first));
            let is_last = n + 1 == firsts.len();
            let mut raw = Vec::new();
            File::open(&path)?.read_to_end(&mut raw)?;
            let mut at = 0usize;
            let torn = loop {
                if at == raw.len() {
                    break None;
                }
                if raw.len() - at < HEADER {
                    break Some("a short record header");
                }
                let len = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap()) as u64;
                let crc = u32::from_le_bytes(raw[at + 4..at + 8].try_into().unwrap());
                let index = u64::from_le_bytes(raw[at + 8..at + 16].try_into().unwrap());
                if len > MAX_RECORD || (raw.len() - at - HEADER) < len as usize {
                    break Some("a short record");
                }
                let body = &raw[at + HEADER..at + HEADER + len as usize];
                let mut h = crc32fast::Hasher::new();
                h.update(&index.to_le_bytes());
                h.update(body);
                if h.finalize() != crc {
                    break Some("a record whose checksum does not match");
                }
                if purged.is_none_or(|p| index > p) {
                    if let Some(prev) = last
                        && index != prev + 1
                    {
                        return Err(corrupt(format!(
                            "{} holds entry {index} after entry {prev}: the log has a gap",
                            path.display()
                        )));
                    }
                    last = Some(index);
                    inner.entries.insert(index, Located { segment: first, offset: at as u64, bytes: body.into() });
                }
                at += HEADER + len as usize;
            };
            if let Some(why) = torn {
                if !is_last {
                    return Err(corrupt(format!("{} has {why} at offset {at}", path.display())));
                }
                // A write cut short by a crash: never synced, never acknowledged.
                tracing::warn!(segment = %path.display(), offset = at, "cutting off a torn write at the log's end");
                let f = OpenOptions::new().write(true).open(&path)?;
                f.set_len(at as u64)?;
                f.sync_all()?;
            }
            let file = OpenOptions::new().append(true).open(&path)?;
            if is_last {
                // What was read back is what later reads will trust: make
                // it durable now (a process restart keeps unsynced pages).
                file.sync_data()?;
                inner.synced = (first, at as u64);
            }
            inner.segments.insert(first, Segment { file: Arc::new(file), len: at as u64 });
        }
        Ok(LogFile {
            dir: dir.to_path_buf(),
            inner: Mutex::new(inner),
            committed,
            _lock: lock,
            faults: None,
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
            .or_else(|| inner.meta.get(Meta::Purged.key()).and_then(|b| crate::disk::purged_index(b)))
    }

    /// Reads injected disk faults from `switch` (tests and chaos only), and
    /// handles a failed sync as `sync_errors` says.
    pub(crate) fn with_faults(mut self, switch: Option<FaultSwitch>, sync_errors: SyncErrors) -> LogFile {
        self.faults = switch;
        self.sync_errors = sync_errors;
        self
    }

    fn fault(&self) -> Option<DiskFault> {
        self.faults.as_ref().and_then(FaultSwitch::current)
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
        self.lock().meta.get(m.key()).cloned()
    }

    /// Stores a metadata value; the vote and purge marker durably.
    pub(crate) fn set_meta(&self, m: Meta, bytes: Vec<u8>) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        match m {
            Meta::Committed => write_in_place(&self.committed, &bytes)?,
            Meta::Vote | Meta::Purged => write_meta(&self.dir, m.file(), &bytes)?,
        }
        inner.meta.insert(m.key(), bytes);
        Ok(())
    }

    /// Writes entries (index, encoded) after the last one; not yet durable.
    pub(crate) fn append(&self, items: Vec<(u64, Vec<u8>)>) -> io::Result<()> {
        let Some(&(first_index, _)) = items.first() else { return Ok(()) };
        let fault = self.fault();
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let active = inner.segments.last_key_value().map(|(&k, s)| (k, s.len));
        let segment = match active {
            Some((k, len)) if len < SEGMENT_BYTES => k,
            _ => {
                // Close the full segment (synced now, so the flusher only
                // ever syncs the active one), then start the next.
                if let Some((_, s)) = inner.segments.last_key_value() {
                    let closed = match fault {
                        Some(DiskFault::SyncFails) => Err(faults::eio()),
                        _ => s.file.sync_data(),
                    };
                    if let Err(e) = closed {
                        drop(inner);
                        return Err(self.fail(e));
                    }
                }
                let path = self.dir.join(segment_name(first_index));
                let file = OpenOptions::new().create(true).append(true).open(&path)?;
                sync_dir(&self.dir)?;
                inner.segments.insert(first_index, Segment { file: Arc::new(file), len: 0 });
                inner.synced = (first_index, 0);
                first_index
            }
        };
        let start = inner.segments[&segment].len;
        let mut buf = Vec::with_capacity(items.iter().map(|(_, b)| b.len() + HEADER).sum());
        let mut located = Vec::with_capacity(items.len());
        for (index, bytes) in &items {
            located.push((*index, start + buf.len() as u64));
            record(*index, bytes, &mut buf);
        }
        let seg = inner.segments.get_mut(&segment).expect("active segment");
        let written = match fault {
            // A full disk: part of the write lands, then ENOSPC.
            Some(DiskFault::Full) => (&*seg.file).write_all(&buf[..buf.len() / 2]).and(Err(faults::enospc())),
            _ => (&*seg.file).write_all(&buf),
        };
        if let Err(e) = written {
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
        let synced = match self.fault() {
            Some(DiskFault::SyncFails) => Err(faults::eio()),
            Some(DiskFault::SlowSync(d)) => {
                std::thread::sleep(d);
                file.sync_data()
            }
            Some(DiskFault::StalledSync) => {
                while self.fault() == Some(DiskFault::StalledSync) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                file.sync_data()
            }
            _ => file.sync_data(),
        };
        match synced {
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
        inner.meta.insert(Meta::Purged.key(), marker);
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

    /// Everything stored, as (key, value) pairs: `"L"` + big-endian index
    /// for entries, [`Meta::key`] for metadata (the crash image's form).
    pub(crate) fn pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let inner = self.lock();
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = inner.meta.iter().map(|(k, v)| (k.to_vec(), v.clone())).collect();
        out.extend(inner.entries.iter().map(|(i, l)| (entry_key(*i).to_vec(), l.bytes.to_vec())));
        out
    }

    /// Writes a fresh log directory holding exactly `pairs` (from
    /// [`LogFile::pairs`]), durably.
    pub(crate) fn create_from_pairs(dir: &Path, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()> {
        fs::create_dir_all(dir)?;
        let mut items = Vec::new();
        for (k, v) in pairs {
            if k.as_slice() == Meta::Committed.key() {
                let f = File::create(dir.join(Meta::Committed.file()))?;
                write_in_place(&f, &v)?;
                f.sync_all()?;
            } else if let Some(m) = Meta::ALL.iter().find(|m| m.key() == k.as_slice()) {
                write_meta(dir, m.file(), &v)?;
            } else if k.len() == 9 && k[0] == b'L' {
                items.push((u64::from_be_bytes(k[1..].try_into().unwrap()), v));
            } else {
                return Err(corrupt(format!("unexpected key {k:?} in a crash image")));
            }
        }
        items.sort_by_key(|(i, _)| *i);
        if let Some(&(first, _)) = items.first() {
            let mut buf = Vec::new();
            for (i, v) in &items {
                record(*i, v, &mut buf);
            }
            let mut f = File::create(dir.join(segment_name(first)))?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        sync_dir(dir)
    }
}

/// An entry's key in a crash image.
fn entry_key(index: u64) -> [u8; 9] {
    let mut k = [b'L'; 9];
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
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
        record(6, b"entry 6", &mut more);
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
            let mut f = File::create(dir.path().join(segment_name(4))).unwrap();
            let mut buf = Vec::new();
            record(4, b"entry 4", &mut buf);
            f.write_all(&buf).unwrap();
        }
        let seg = dir.path().join(segment_name(1));
        let mut raw = fs::read(&seg).unwrap();
        raw[HEADER + 2] ^= 0xff;
        fs::write(&seg, &raw).unwrap();
        let err = LogFile::open(dir.path(), index).err().expect("corruption is refused");
        assert!(err.to_string().contains("checksum"), "{err}");
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
    fn pairs_round_trip_through_a_fresh_directory() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::open(dir.path(), index).unwrap();
        log.append(items(3, 6)).unwrap();
        log.set_meta(Meta::Vote, b"vote".to_vec()).unwrap();
        log.set_meta(Meta::Committed, b"c".to_vec()).unwrap();
        let pairs = log.pairs();
        let copy = tempfile::tempdir().unwrap();
        LogFile::create_from_pairs(copy.path(), pairs.clone()).unwrap();
        let again = LogFile::open(copy.path(), index).unwrap();
        assert_eq!(again.pairs(), pairs);
        assert_eq!(again.meta(Meta::Vote).as_deref(), Some(&b"vote"[..]));
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
