//! The checkpoint blob: what a `CheckpointUpload` and an `Assign` carry.
//!
//! ```text
//!   blob = "MUSTERCK" ‖ u32 files ‖ { u32 path_len ‖ path ‖ u64 len ‖ bytes }*
//! ```
//!
//! Integers are little endian; paths are relative, `/`-separated, UTF-8, in
//! sorted order. The agent packs and unpacks it (`muster-agent`'s
//! `checkpoint` module); the leader checks every upload with [`files`]
//! before it proposes it, so a malformed blob, or one naming a path outside
//! the directory (`..`, absolute), never reaches the log or another job.

use std::fmt;
use std::path::{Component, Path};

/// The first bytes of every blob.
pub const MAGIC: &[u8; 8] = b"MUSTERCK";

/// Why a blob is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlobError {
    /// The bytes are not a checkpoint blob.
    Malformed(&'static str),
    /// A path would leave the directory.
    UnsafePath(String),
}

impl fmt::Display for BlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobError::Malformed(why) => write!(f, "the checkpoint is malformed: {why}"),
            BlobError::UnsafePath(p) => write!(f, "the checkpoint names an unsafe path {p:?}"),
        }
    }
}

impl std::error::Error for BlobError {}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BlobError> {
        if self.0.len() < n {
            return Err(BlobError::Malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, BlobError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, BlobError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// The files of a blob, checked: (relative path, contents).
pub fn files(blob: &[u8]) -> Result<Vec<(String, &[u8])>, BlobError> {
    let mut r = Reader(blob);
    if r.take(MAGIC.len())? != MAGIC {
        return Err(BlobError::Malformed("bad magic"));
    }
    let count = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..count {
        let len = r.u32()? as usize;
        let name = std::str::from_utf8(r.take(len)?).map_err(|_| BlobError::Malformed("path is not UTF-8"))?;
        let safe = !name.is_empty() && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)));
        if !safe {
            return Err(BlobError::UnsafePath(name.to_string()));
        }
        let len = usize::try_from(r.u64()?).map_err(|_| BlobError::Malformed("file too long"))?;
        out.push((name.to_string(), r.take(len)?));
    }
    if !r.0.is_empty() {
        return Err(BlobError::Malformed("trailing bytes"));
    }
    Ok(out)
}

/// A blob of `(path, contents)` files, in the given order.
pub fn encode<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Vec<u8> {
    let mut blob = MAGIC.to_vec();
    let files: Vec<_> = files.into_iter().collect();
    blob.extend_from_slice(&(files.len() as u32).to_le_bytes());
    for (name, data) in files {
        push_file(&mut blob, name, data);
    }
    blob
}

/// Appends one file's record to a blob being written.
pub fn push_file(blob: &mut Vec<u8>, name: &str, data: &[u8]) {
    blob.extend_from_slice(&(name.len() as u32).to_le_bytes());
    blob.extend_from_slice(name.as_bytes());
    blob.extend_from_slice(&(data.len() as u64).to_le_bytes());
    blob.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_round_trips_and_bad_ones_are_refused_by_name() {
        let blob = encode([("step", &b"7"[..]), ("model/w.bin", &b"\0\x01"[..])]);
        assert_eq!(
            files(&blob).unwrap(),
            vec![("step".to_string(), &b"7"[..]), ("model/w.bin".into(), &b"\0\x01"[..])]
        );
        assert_eq!(files(b"junk"), Err(BlobError::Malformed("truncated")));
        assert_eq!(files(b"NOTABLOB\0\0\0\0"), Err(BlobError::Malformed("bad magic")));
        for evil in ["../../etc/cron.d/x", "/etc/passwd", "a/../../b", ""] {
            let blob = encode([(evil, &b"x"[..])]);
            assert_eq!(files(&blob), Err(BlobError::UnsafePath(evil.into())), "{evil}");
        }
        let mut long = encode([("step", &b"7"[..])]);
        long.push(0);
        assert_eq!(files(&long), Err(BlobError::Malformed("trailing bytes")));
        assert_eq!(files(&blob[..blob.len() - 1]), Err(BlobError::Malformed("truncated")));
    }
}
