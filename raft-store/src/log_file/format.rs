//! The log's on-disk format, each piece as a paired encoder and decoder.
//!
//! ```text
//!   segment   [magic "MWAL"][version u32][first index u64]  record*
//!   record    [len u32][crc32 u32][index u64][entry bytes]   crc32 over index ‖ bytes
//!   meta file [crc32 u32][bytes]                              vote.meta, purged.meta
//!   in place  [len u32][crc32 u32][bytes]                     committed.meta
//! ```
//!
//! Integers are little-endian. Version 0 is the format before segments had
//! a header: its segments hold records from their first byte. It is still
//! read (and a version-0 segment is appended to in its own format until the
//! next segment starts); a version above [`VERSION`] is refused by name. A
//! version-0 record can never be mistaken for a header: the magic read as a
//! record's length is over [`MAX_RECORD`].

use std::io;

/// The first bytes of a segment that has a header.
pub(super) const MAGIC: [u8; 4] = *b"MWAL";
/// The segment format this build writes.
pub(super) const VERSION: u32 = 1;
/// A segment header's size.
pub(super) const SEGMENT_HEADER: usize = 16;
/// A record header's size: length, checksum, index.
pub(super) const RECORD_HEADER: usize = 16;
/// The largest record accepted on open (a bigger length is a torn header).
pub(super) const MAX_RECORD: u64 = 1 << 30;

/// A segment's header: where its records start and which format they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SegmentHeader {
    pub(super) version: u32,
    /// The index the segment's name says it starts at (version 0: unknown).
    pub(super) first: Option<u64>,
}

impl SegmentHeader {
    /// Where the records start.
    pub(super) fn records_at(self) -> usize {
        if self.version == 0 { 0 } else { SEGMENT_HEADER }
    }
}

/// The header of a new segment whose first entry is `first`.
pub(super) fn encode_segment_header(first: u64) -> [u8; SEGMENT_HEADER] {
    let mut out = [0u8; SEGMENT_HEADER];
    out[..4].copy_from_slice(&MAGIC);
    out[4..8].copy_from_slice(&VERSION.to_le_bytes());
    out[8..].copy_from_slice(&first.to_le_bytes());
    out
}

/// What a segment's first bytes say.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeaderRead {
    /// A header this build reads (version 0: none, records from byte 0).
    Known(SegmentHeader),
    /// Fewer bytes than a header, each as a header written now would have
    /// them (nothing, or a header cut short by a crash).
    Torn,
    /// A version this build does not know.
    Unsupported(u32),
}

/// Reads a segment's header from its first bytes.
pub(super) fn decode_segment_header(raw: &[u8]) -> HeaderRead {
    if raw.len() < MAGIC.len() {
        // Too short for a version-0 record as well: only a header cut
        // short (or an empty file) looks like this.
        return if MAGIC.starts_with(raw) { HeaderRead::Torn } else { HeaderRead::Known(legacy()) };
    }
    if raw[..4] != MAGIC {
        return HeaderRead::Known(legacy());
    }
    if raw.len() < SEGMENT_HEADER {
        return HeaderRead::Torn;
    }
    let version = u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes"));
    if version != VERSION {
        return HeaderRead::Unsupported(version);
    }
    HeaderRead::Known(SegmentHeader {
        version,
        first: Some(u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"))),
    })
}

fn legacy() -> SegmentHeader {
    SegmentHeader { version: 0, first: None }
}

/// Appends the record of entry `index` to `out`.
pub(super) fn encode_record(index: u64, bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&record_crc(index, bytes).to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn record_crc(index: u64, bytes: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&index.to_le_bytes());
    crc.update(bytes);
    crc.finalize()
}

/// What [`decode_record`] found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded<'a> {
    /// A whole record; the next one starts at `next`.
    Record { index: u64, bytes: &'a [u8], next: usize },
    /// The end of the segment, exactly.
    End,
    /// Something that is not a whole, intact record: a write cut short at
    /// the log's end, or damage anywhere else.
    Bad(&'static str),
}

/// Reads the record at `at` in a segment's bytes.
pub(super) fn decode_record(raw: &[u8], at: usize) -> Decoded<'_> {
    let rest = &raw[at.min(raw.len())..];
    if rest.is_empty() {
        return Decoded::End;
    }
    if rest.len() < RECORD_HEADER {
        return Decoded::Bad("a short record header");
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as u64;
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let index = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
    if len > MAX_RECORD || (rest.len() - RECORD_HEADER) < len as usize {
        return Decoded::Bad("a short record");
    }
    let bytes = &rest[RECORD_HEADER..RECORD_HEADER + len as usize];
    if record_crc(index, bytes) != crc {
        return Decoded::Bad("a record whose checksum does not match");
    }
    Decoded::Record { index, bytes, next: at + RECORD_HEADER + len as usize }
}

/// A meta file's contents: `[crc32][bytes]`.
pub(super) fn encode_meta(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 4);
    out.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// What [`encode_meta`] wrote; `None` when it does not check out.
pub(super) fn decode_meta(raw: &[u8]) -> Option<&[u8]> {
    let (crc, bytes) = raw.split_at_checked(4)?;
    (crc32fast::hash(bytes).to_le_bytes() == crc).then_some(bytes)
}

/// A value overwritten in place: `[len][crc32][bytes]` (the length says
/// where it ends, since an older, longer value may follow it).
pub(super) fn encode_in_place(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 8);
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// What [`encode_in_place`] wrote; `None` when empty or torn.
pub(super) fn decode_in_place(raw: &[u8]) -> Option<&[u8]> {
    if raw.len() < 8 {
        return None;
    }
    let len = u32::from_le_bytes(raw[..4].try_into().expect("4 bytes")) as usize;
    let bytes = raw.get(8..8 + len)?;
    (crc32fast::hash(bytes).to_le_bytes() == raw[4..8]).then_some(bytes)
}

/// The error for damage found on open.
pub(super) fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_encoded_and_any_cut_is_bad() {
        let mut raw = Vec::new();
        for (i, body) in [(7u64, &b""[..]), (8, b"x"), (9, &[0xab; 300][..])] {
            encode_record(i, body, &mut raw);
        }
        let mut at = 0;
        let mut seen = Vec::new();
        while let Decoded::Record { index, bytes, next } = decode_record(&raw, at) {
            seen.push((index, bytes.len()));
            at = next;
        }
        assert_eq!(seen, [(7, 0), (8, 1), (9, 300)]);
        assert_eq!(decode_record(&raw, at), Decoded::End);
        for cut in 1..raw.len() - 1 {
            let short = &raw[..raw.len() - cut];
            let mut at = 0;
            let end = loop {
                match decode_record(short, at) {
                    Decoded::Record { next, .. } => at = next,
                    other => break other,
                }
            };
            assert!(matches!(end, Decoded::Bad(_) | Decoded::End), "cut {cut}: {end:?}");
            assert!(at <= short.len());
        }
        let mut flipped = raw.clone();
        flipped[RECORD_HEADER + 1] ^= 1;
        assert_eq!(decode_record(&flipped, 0), Decoded::Record { index: 7, bytes: b"", next: RECORD_HEADER });
        assert_eq!(decode_record(&flipped, RECORD_HEADER), Decoded::Bad("a record whose checksum does not match"));
    }

    #[test]
    fn a_segment_header_names_its_version_and_first_index() {
        let h = encode_segment_header(42);
        assert_eq!(decode_segment_header(&h), HeaderRead::Known(SegmentHeader { version: 1, first: Some(42) }));
        assert_eq!(decode_segment_header(&h[..9]), HeaderRead::Torn);
        assert_eq!(decode_segment_header(&h[..2]), HeaderRead::Torn);
        assert_eq!(decode_segment_header(b""), HeaderRead::Torn);
        let mut future = h;
        future[4] = 9;
        assert_eq!(decode_segment_header(&future), HeaderRead::Unsupported(9));
        // A version-0 segment starts with a record, whose length can never
        // read as the magic.
        let mut old = Vec::new();
        encode_record(1, b"entry", &mut old);
        assert_eq!(decode_segment_header(&old), HeaderRead::Known(SegmentHeader { version: 0, first: None }));
        assert!(u64::from(u32::from_le_bytes(MAGIC)) > MAX_RECORD);
    }

    #[test]
    fn meta_values_decode_to_what_was_encoded_and_torn_ones_to_none() {
        assert_eq!(decode_meta(&encode_meta(b"vote")), Some(&b"vote"[..]));
        assert_eq!(decode_meta(&encode_meta(b"vote")[..5]), None);
        assert_eq!(decode_meta(b"xy"), None);
        let mut longer = encode_in_place(b"a longer value");
        let short = encode_in_place(b"c");
        longer[..short.len()].copy_from_slice(&short);
        assert_eq!(decode_in_place(&longer), Some(&b"c"[..]), "an older, longer value behind it is ignored");
        assert_eq!(decode_in_place(&short[..short.len() - 1]), None);
        assert_eq!(decode_in_place(b"\x05\0\0\0xxxxyy"), None);
    }
}
