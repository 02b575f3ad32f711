//! Checkpoint directories: what a task leaves in `MUSTER_CHECKPOINT_DIR` is
//! packed into one opaque blob for the leader when its process ends, and
//! unpacked into the directory of the task's next attempt. The blob format
//! is `muster_proto::checkpoint_blob` (the leader checks uploads with it).
//!
//! Paths are packed in sorted order (so the same directory packs to the
//! same bytes). Only regular files
//! are packed; symlinks and other special files are skipped, and so is the
//! top-level `.muster/` (the checkpoint-hint protocol's files). Unpacking
//! refuses absolute paths and `..`, so a blob cannot write outside the
//! directory.
//!
//! A task may be SIGKILLed in the middle of writing a file, so tasks write
//! each checkpoint file under a temporary name and rename it into place
//! (`rename` is atomic): the directory then only ever holds whole files.
//! Files with a temporary name ([`is_temporary`]: `*.tmp`, `*.part`,
//! `*.partial`, `*~`, `.tmp*`, `.#*`, `*.swp`) are never packed, so a file
//! torn mid-write is never uploaded.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use muster_proto::checkpoint_blob::{self, BlobError};

use thiserror::Error;

/// Checkpoints with one file no larger than this are also given to the next
/// attempt as `CHECKPOINT_DATA` (base64), as the seed does; anything bigger
/// only through the directory (environment variables are small).
pub const INLINE_LIMIT: usize = 48 * 1024;

/// Why a directory could not be packed.
#[derive(Debug, Error)]
pub enum PackError {
    /// Reading the directory failed.
    #[error("cannot read the checkpoint directory {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The files add up to more than the leader stores.
    #[error(
        "the checkpoint directory holds more than {limit} bytes (the cap); it was not saved: \
         keep large state on a shared volume and checkpoint a pointer to it"
    )]
    TooLarge {
        /// The cap.
        limit: usize,
    },
}

/// Why a blob could not be unpacked.
#[derive(Debug, Error)]
pub enum UnpackError {
    /// The bytes are not a well-formed blob, or name a path outside the
    /// directory.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// Writing a file failed.
    #[error("cannot restore the checkpoint into {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// A task's checkpoint directory: `WORK_DIR/checkpoints/alloc-A-task-T`.
pub fn dir(work_dir: &Path, alloc: u64, task: u32) -> PathBuf {
    work_dir.join("checkpoints").join(format!("alloc-{alloc}-task-{task}"))
}

/// The (allocation, task) a checkpoint directory's name belongs to.
pub fn parse_dir_name(name: &str) -> Option<(u64, u32)> {
    let (alloc, task) = name.strip_prefix("alloc-")?.split_once("-task-")?;
    Some((alloc.parse().ok()?, task.parse().ok()?))
}

/// Where emptied checkpoint directories wait to be reused:
/// `WORK_DIR/checkpoints/spare/`. A node starting hundreds of tasks a second
/// then neither creates nor removes a directory per task; on ext4 every
/// removal slows later creations in its directory for a while.
const SPARE: &str = "spare";

fn collect(root: &Path, rel: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), PackError> {
    let here = root.join(rel);
    let io = |source| PackError::Io { path: here.clone(), source };
    let mut entries: Vec<_> = fs::read_dir(&here).map_err(io)?.collect::<Result<_, _>>().map_err(io)?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if rel.as_os_str().is_empty() && e.file_name() == crate::hint::PROTOCOL_DIR {
            continue; // the hint protocol's files, not the task's state
        }
        let kind = e.file_type().map_err(io)?;
        if kind.is_file() && is_temporary(&e.file_name().to_string_lossy()) {
            continue; // being written: whole files are renamed into place
        }
        let rel = rel.join(e.file_name());
        if kind.is_dir() {
            collect(root, &rel, out)?;
        } else if kind.is_file() {
            let name = rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            out.push((name, root.join(&rel)));
        }
    }
    Ok(())
}

/// Whether a file name is a temporary one, written before a rename into
/// place (`state.pt.tmp`, `.tmpa1b2c3`, `ckpt.part`, editor and download
/// leftovers): such a file may be torn and is never packed.
pub fn is_temporary(name: &str) -> bool {
    [".tmp", ".part", ".partial", ".swp", "~"].iter().any(|s| name.ends_with(s))
        || name.starts_with(".tmp")
        || name.starts_with(".#")
}

/// A fingerprint of a packed blob, to tell whether a directory changed
/// since it was last uploaded or restored (the packing is deterministic).
pub fn fingerprint(blob: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    blob.hash(&mut h);
    h.finish()
}

/// Packs the regular files under `dir`; `None` when there are none (or the
/// directory does not exist). Fails once the blob would pass `limit` bytes.
pub fn pack(dir: &Path, limit: usize) -> Result<Option<Vec<u8>>, PackError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    collect(dir, Path::new(""), &mut files)?;
    if files.is_empty() {
        return Ok(None);
    }
    let mut blob = checkpoint_blob::encode([]);
    blob[checkpoint_blob::MAGIC.len()..].copy_from_slice(&(files.len() as u32).to_le_bytes());
    for (name, path) in files {
        let data = fs::read(&path).map_err(|source| PackError::Io { path: path.clone(), source })?;
        checkpoint_blob::push_file(&mut blob, &name, &data);
        if blob.len() > limit {
            return Err(PackError::TooLarge { limit });
        }
    }
    Ok(Some(blob))
}

/// The files of a blob, checked: (relative path, contents).
pub fn files(blob: &[u8]) -> Result<Vec<(String, &[u8])>, UnpackError> {
    Ok(checkpoint_blob::files(blob)?)
}

/// Empties `dir` (creating it if needed) and writes the blob's files into it.
pub fn unpack(blob: &[u8], dir: &Path) -> Result<(), UnpackError> {
    let files = files(blob)?;
    reset(dir).map_err(|source| UnpackError::Io { path: dir.to_path_buf(), source })?;
    for (name, data) in files {
        let path = dir.join(&name);
        let io = |source| UnpackError::Io { path: path.clone(), source };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io)?;
        }
        fs::write(&path, data).map_err(io)?;
    }
    Ok(())
}

/// Empties `dir`, creating it if needed (from a spare directory when one
/// waits).
pub fn reset(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let spares = dir.parent().map(|p| p.join(SPARE));
            let spare = spares.and_then(|s| fs::read_dir(s).ok()?.flatten().next());
            if let Some(spare) = spare
                && fs::rename(spare.path(), dir).is_ok()
            {
                return Ok(());
            }
        }
        Err(e) => return Err(e),
    }
    fs::create_dir_all(dir)
}

/// The task is over here: its checkpoint directory goes, kept as a spare
/// when it is empty (no files to remove), removed with what it holds
/// otherwise.
pub fn retire(dir: &Path) {
    let empty = fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if let (true, Some(parent), Some(name)) = (empty, dir.parent(), dir.file_name()) {
        let spares = parent.join(SPARE);
        if fs::create_dir_all(&spares).is_ok() && fs::rename(dir, spares.join(name)).is_ok() {
            return;
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// The content of a blob holding exactly one file of at most
/// [`INLINE_LIMIT`] bytes, base64-encoded (for `CHECKPOINT_DATA`).
pub fn inline_data(blob: &[u8]) -> Option<String> {
    match files(blob).ok()?.as_slice() {
        [(_, data)] if data.len() <= INLINE_LIMIT => Some(base64(data)),
        _ => None,
    }
}

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_directory_is_reused_and_a_full_one_removed() {
        let work = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir(work.path(), 1, 0), dir(work.path(), 2, 3), dir(work.path(), 3, 0));
        assert_eq!(parse_dir_name("alloc-2-task-3"), Some((2, 3)));
        assert_eq!(parse_dir_name(SPARE), None);
        reset(&a).unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let first = inode(&a);
        retire(&a);
        assert!(!a.exists());
        reset(&b).unwrap();
        assert_eq!(inode(&b), first, "the spare became the next task's directory");
        fs::write(b.join("state"), "x").unwrap();
        retire(&b);
        assert!(!b.exists());
        assert_eq!(
            fs::read_dir(work.path().join("checkpoints").join(SPARE)).unwrap().count(),
            0,
            "not kept with files"
        );
        reset(&c).unwrap();
        assert!(fs::read_dir(&c).unwrap().next().is_none());
        fs::write(c.join("old"), "x").unwrap();
        reset(&c).unwrap();
        assert!(fs::read_dir(&c).unwrap().next().is_none(), "a reset empties");
    }

    #[test]
    fn temporary_files_are_never_packed_and_the_packing_fingerprints_the_directory() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("step"), b"7").unwrap();
        let whole = pack(d.path(), 1 << 20).unwrap().unwrap();
        for torn in ["model.pt.tmp", ".tmpk3j2_x", "state.part", "ckpt.partial", "notes~", ".#lock", "a.swp"] {
            fs::write(d.path().join(torn), b"half a file").unwrap();
        }
        let again = pack(d.path(), 1 << 20).unwrap().unwrap();
        assert_eq!(again, whole, "only the renamed-into-place file is packed");
        assert_eq!(fingerprint(&again), fingerprint(&whole));
        fs::write(d.path().join("step"), b"8").unwrap();
        let newer = pack(d.path(), 1 << 20).unwrap().unwrap();
        assert_ne!(fingerprint(&newer), fingerprint(&whole));
        assert!(!is_temporary("model.pt") && !is_temporary("tmp") && !is_temporary("step-10"));
    }

    #[test]
    fn a_directory_round_trips_through_a_blob() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("opt/state")).unwrap();
        fs::write(src.path().join("step"), b"42\n").unwrap();
        fs::write(src.path().join("opt/state/m.bin"), [0u8, 1, 2, 255]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("link")).unwrap();
        let blob = pack(src.path(), 1 << 20).unwrap().unwrap();
        assert_eq!(pack(src.path(), 1 << 20).unwrap().unwrap(), blob, "packing is deterministic");
        let dst = tempfile::tempdir().unwrap();
        fs::write(dst.path().join("stale"), b"old").unwrap();
        unpack(&blob, dst.path()).unwrap();
        assert_eq!(fs::read(dst.path().join("step")).unwrap(), b"42\n");
        assert_eq!(fs::read(dst.path().join("opt/state/m.bin")).unwrap(), [0u8, 1, 2, 255]);
        assert!(!dst.path().join("stale").exists(), "the directory is emptied first");
        assert!(!dst.path().join("link").exists(), "symlinks are not packed");
        assert_eq!(inline_data(&blob), None, "two files are not inlined");
    }

    #[test]
    fn an_empty_or_missing_directory_packs_to_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert!(pack(d.path(), 100).unwrap().is_none());
        assert!(pack(&d.path().join("missing"), 100).unwrap().is_none());
    }

    #[test]
    fn a_directory_over_the_cap_is_refused_with_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("big"), vec![0u8; 2_000]).unwrap();
        let err = pack(d.path(), 1_000).unwrap_err();
        assert!(err.to_string().contains("more than 1000 bytes (the cap)"), "{err}");
    }

    #[test]
    fn one_small_file_is_inlined_as_base64() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("step"), b"step=17").unwrap();
        let blob = pack(d.path(), 1 << 20).unwrap().unwrap();
        assert_eq!(inline_data(&blob).as_deref(), Some("c3RlcD0xNw=="));
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn malformed_or_escaping_blobs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(unpack(b"junk", d.path()), Err(UnpackError::Blob(BlobError::Malformed(_)))));
        let evil = checkpoint_blob::encode([("../escape", &b"x"[..])]);
        assert!(matches!(unpack(&evil, d.path()), Err(UnpackError::Blob(BlobError::UnsafePath(_)))));
        fs::write(d.path().join("step"), b"1").unwrap();
        let mut truncated = pack(d.path(), 100).unwrap().unwrap();
        truncated.pop();
        assert!(matches!(files(&truncated), Err(UnpackError::Blob(BlobError::Malformed("truncated")))));
    }
}
