//! Opening a log directory: what its files hold, checked, with a write cut
//! short by a crash cut off.
//!
//! - The vote and purge marker were renamed into place whole: one that does
//!   not check out is damage, and the log refuses to open.
//! - The committed index is overwritten in place and never synced: one that
//!   does not check out reads as absent (the cluster recomputes it).
//! - Segments are read in order. Each record's length, checksum and index
//!   are checked; indexes must follow one another. A bad record (or a
//!   segment header cut short) at the end of the **last** segment is a
//!   write no sync covered, so nothing acknowledged it: it is cut off.
//!   Anywhere else it is corruption and the log refuses to open, naming the
//!   file and offset.
//! - A segment in a format version this build does not know is refused by
//!   name.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

use super::format::{self, Decoded, HeaderRead, corrupt};
use super::{Located, Meta, Segment, segment_name};

/// What a log directory holds, checked.
pub(super) struct Recovered {
    pub(super) meta: BTreeMap<Meta, Vec<u8>>,
    pub(super) purged: Option<u64>,
    pub(super) entries: BTreeMap<u64, Located>,
    pub(super) segments: BTreeMap<u64, Segment>,
    /// The end of the last segment, durable now: (first index, length).
    pub(super) synced: (u64, u64),
}

/// Reads `dir`'s log (its lock already held; `committed` is the open
/// `committed.meta`), cutting off a torn tail durably. `purged_index`
/// reads the index out of the stored purge marker.
pub(super) fn recover(
    dir: &Path,
    committed: &File,
    purged_index: impl Fn(&[u8]) -> Option<u64>,
) -> io::Result<Recovered> {
    let meta = read_meta(dir, committed)?;
    let purged = match meta.get(&Meta::Purged) {
        None => None,
        Some(bytes) => Some(
            purged_index(bytes)
                .ok_or_else(|| corrupt(format!("{} does not decode", dir.join(Meta::Purged.file()).display())))?,
        ),
    };
    let mut out = Recovered { meta, purged, entries: BTreeMap::new(), segments: BTreeMap::new(), synced: (0, 0) };
    let firsts = segment_firsts(dir)?;
    let mut last: Option<u64> = None;
    for (n, &first) in firsts.iter().enumerate() {
        let path = dir.join(segment_name(first));
        let is_last = n + 1 == firsts.len();
        let mut raw = Vec::new();
        File::open(&path)?.read_to_end(&mut raw)?;
        let start = match records_at(&raw, first, &path)? {
            Some(at) => at,
            None if raw.is_empty() && !is_last => 0,
            None if !is_last => {
                return Err(corrupt(format!("{} has a segment header cut short", path.display())));
            }
            None => {
                // Created by a crash-interrupted roll-over: nothing in it
                // was ever synced. Start it again.
                tracing::warn!(segment = %path.display(), "rewriting a segment header cut short by a crash");
                fs::write(&path, format::encode_segment_header(first))?;
                raw = format::encode_segment_header(first).to_vec();
                format::SEGMENT_HEADER
            }
        };
        let (records, at, torn) = scan_records(&raw, start, &path, purged, &mut last)?;
        for (index, offset, bytes) in records {
            out.entries.insert(index, Located { segment: first, offset: offset as u64, bytes: bytes.into() });
        }
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
            // What was read back is what later reads will trust: make it
            // durable now (a process restart keeps unsynced pages).
            file.sync_data()?;
            out.synced = (first, at as u64);
        }
        out.segments.insert(first, Segment { file: Arc::new(file), len: at as u64 });
    }
    Ok(out)
}

/// The vote, purge marker and committed index that check out.
fn read_meta(dir: &Path, mut committed: &File) -> io::Result<BTreeMap<Meta, Vec<u8>>> {
    let mut raw = Vec::new();
    committed.read_to_end(&mut raw)?;
    let mut meta = read_durable_meta(dir)?;
    if let Some(bytes) = format::decode_in_place(&raw) {
        meta.insert(Meta::Committed, bytes.to_vec());
    }
    Ok(meta)
}

/// The vote and purge marker, which were renamed into place whole.
fn read_durable_meta(dir: &Path) -> io::Result<BTreeMap<Meta, Vec<u8>>> {
    let mut meta = BTreeMap::new();
    for m in [Meta::Vote, Meta::Purged] {
        let path = dir.join(m.file());
        let raw = match fs::read(&path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match format::decode_meta(&raw) {
            Some(bytes) => {
                meta.insert(m, bytes.to_vec());
            }
            // Renamed into place whole: a bad one is damage, not a torn write.
            None => return Err(corrupt(format!("{} does not check out", path.display()))),
        }
    }
    Ok(meta)
}

/// The first indexes of the segments in `dir`, in order.
fn segment_firsts(dir: &Path) -> io::Result<Vec<u64>> {
    let mut firsts = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(first) = name.strip_prefix("seg-").and_then(|s| s.strip_suffix(".log")) {
            firsts.push(first.parse::<u64>().map_err(|_| corrupt(format!("unexpected log file {name}")))?);
        }
    }
    firsts.sort_unstable();
    Ok(firsts)
}

/// Reads `dir`'s log without changing it (an offline audit): the same
/// checks as [`recover`], but a torn tail at the end of the last segment is
/// left in place and described in the second value instead of cut off.
pub(crate) fn read_only(dir: &Path) -> io::Result<(super::LogImage, Option<String>)> {
    let committed = match fs::read(dir.join(Meta::Committed.file())) {
        Ok(raw) => format::decode_in_place(&raw).map(<[u8]>::to_vec),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let mut meta = read_durable_meta(dir)?;
    let purged = match meta.get(&Meta::Purged) {
        None => None,
        Some(bytes) => Some(
            crate::disk::purged_index(bytes)
                .ok_or_else(|| corrupt(format!("{} does not decode", dir.join(Meta::Purged.file()).display())))?,
        ),
    };
    let mut image = super::LogImage {
        vote: meta.remove(&Meta::Vote),
        purged: meta.remove(&Meta::Purged),
        committed,
        entries: Vec::new(),
    };
    let firsts = segment_firsts(dir)?;
    let mut torn_tail = None;
    let mut last: Option<u64> = None;
    for (n, &first) in firsts.iter().enumerate() {
        let path = dir.join(segment_name(first));
        let is_last = n + 1 == firsts.len();
        let raw = fs::read(&path)?;
        let start = match records_at(&raw, first, &path)? {
            Some(at) => at,
            None if raw.is_empty() || is_last => continue,
            None => return Err(corrupt(format!("{} has a segment header cut short", path.display()))),
        };
        let (records, at, torn) = scan_records(&raw, start, &path, purged, &mut last)?;
        image.entries.extend(records.into_iter().map(|(index, _, bytes)| (index, bytes.to_vec())));
        match torn {
            None => {}
            Some(why) if is_last => {
                torn_tail = Some(format!(
                    "{} has {why} at offset {at}, with {} bytes from there to its end: a write no sync covered, or \
                     damage; a replica cuts it off when it starts",
                    path.display(),
                    raw.len() - at
                ));
            }
            Some(why) => return Err(corrupt(format!("{} has {why} at offset {at}", path.display()))),
        }
    }
    Ok((image, torn_tail))
}

/// Where the records of segment `first` (at `path`, its bytes `raw`) start,
/// after a header that names it and a format this build reads; `None` when
/// the header is cut short.
fn records_at(raw: &[u8], first: u64, path: &Path) -> io::Result<Option<usize>> {
    match format::decode_segment_header(raw) {
        HeaderRead::Known(h) => match h.first.filter(|&f| f != first) {
            Some(said) => Err(corrupt(format!("{}'s header says it starts at entry {said}", path.display()))),
            None => Ok(Some(h.records_at())),
        },
        HeaderRead::Unsupported(v) => Err(corrupt(format!(
            "{} is in log format version {v}; this build reads versions 0 to {}: run the muster that wrote it",
            path.display(),
            format::VERSION
        ))),
        HeaderRead::Torn => Ok(None),
    }
}

/// The records of a segment's bytes from offset `start`: each live one
/// (above the purge marker) with its offset, checked to follow `last`;
/// where reading stopped; and, when it stopped at a bad record, why.
#[allow(clippy::type_complexity)]
fn scan_records<'a>(
    raw: &'a [u8],
    start: usize,
    path: &Path,
    purged: Option<u64>,
    last: &mut Option<u64>,
) -> io::Result<(Vec<(u64, usize, &'a [u8])>, usize, Option<&'static str>)> {
    let mut records = Vec::new();
    let mut at = start;
    loop {
        match format::decode_record(raw, at) {
            Decoded::End => return Ok((records, at, None)),
            Decoded::Bad(why) => return Ok((records, at, Some(why))),
            Decoded::Record { index, bytes, next } => {
                if purged.is_none_or(|p| index > p) {
                    if let Some(prev) = *last
                        && index != prev + 1
                    {
                        return Err(corrupt(format!(
                            "{} holds entry {index} after entry {prev}: the log has a gap",
                            path.display()
                        )));
                    }
                    *last = Some(index);
                    records.push((index, at, bytes));
                }
                at = next;
            }
        }
    }
}
