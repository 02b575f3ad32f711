//! Checkpoint directories: what a task leaves in `MUSTER_CHECKPOINT_DIR` is
//! packed, as a stream, into one blob in the task's checkpoint store when
//! its process ends, and unpacked from the store, checked against the
//! manifest's size and SHA-256, into the directory of its next attempt.
//!
//! ```text
//!   blob = "MUSTERCK" ‖ u32 files ‖ { u32 path_len ‖ path ‖ u64 len ‖ bytes }*
//! ```
//!
//! Integers are little endian; paths are relative, `/`-separated, UTF-8, in
//! sorted order (so the same directory packs to the same bytes). Only
//! regular files are packed; symlinks and other special files are skipped,
//! and so is the top-level `.muster/` (the checkpoint-hint protocol's
//! files). Unpacking refuses absolute paths and `..`, so a blob cannot
//! write outside the directory, and a blob whose bytes do not hash to the
//! manifest's digest leaves the directory empty.
//!
//! A task may be SIGKILLed in the middle of writing a file, so tasks write
//! each checkpoint file under a temporary name and rename it into place
//! (`rename` is atomic): the directory then only ever holds whole files.
//! Files with a temporary name ([`is_temporary`]: `*.tmp`, `*.part`,
//! `*.partial`, `*~`, `.tmp*`, `.#*`, `*.swp`) are never packed, so a file
//! torn mid-write is never uploaded. A file that changes size while it is
//! being packed (an escaped child still writing) fails the pack.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;

/// The first bytes of every blob.
pub const MAGIC: &[u8; 8] = b"MUSTERCK";

/// Checkpoints with one file no larger than this are also given to the next
/// attempt as `CHECKPOINT_DATA` (base64), as the seed does; anything bigger
/// only through the directory (environment variables are small).
pub const INLINE_LIMIT: u64 = 48 * 1024;

/// The file under `.muster/` a task may write its training step to; the
/// manifest records it.
pub const STEP_FILE: &str = "step";

/// Why a directory could not be packed.
#[derive(Debug, Error)]
pub enum PackError {
    /// Reading the directory or writing the blob failed.
    #[error("cannot save the checkpoint ({path}): {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The files add up to more than the task may save.
    #[error("the checkpoint directory holds {bytes} bytes, over the {limit}-byte cap; it was not saved")]
    TooLarge {
        /// What it holds.
        bytes: u64,
        /// The cap.
        limit: u64,
    },
    /// A file changed while it was being packed.
    #[error("{0} changed while the checkpoint was being saved (is a process still writing it?); it was not saved")]
    Changed(String),
}

/// Why a blob could not be unpacked.
#[derive(Debug, Error)]
pub enum UnpackError {
    /// The bytes are not a well-formed blob.
    #[error("the checkpoint is malformed: {0}")]
    Malformed(&'static str),
    /// A path would leave the directory.
    #[error("the checkpoint names an unsafe path {0:?}")]
    UnsafePath(String),
    /// The bytes are not the ones the manifest names.
    #[error("the checkpoint's bytes do not match its manifest ({0})")]
    Mismatch(String),
    /// Reading the blob or writing a file failed.
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

/// The most spare names remembered per spares directory.
const SPARE_HINTS: usize = 64;

/// Names of spares this process put in each spares directory, newest
/// last: [`reset`] renames one into place without listing the directory
/// first (an open, a stat, a read and a close per task). Only a hint: a
/// name that is gone (taken by a listing, or removed) fails its rename,
/// and [`reset`] then lists the directory as before; a spare not named
/// here (an earlier agent's, or past the cap) is found by that listing.
static SPARE_NAMES: std::sync::Mutex<BTreeMap<PathBuf, Vec<std::ffi::OsString>>> =
    std::sync::Mutex::new(BTreeMap::new());

fn spare_hints() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Vec<std::ffi::OsString>>> {
    SPARE_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One file to pack: its name in the blob, its path, its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackFile {
    /// `/`-separated relative path.
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Its size when listed.
    pub len: u64,
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<PackFile>) -> Result<(), PackError> {
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
            let len = e.metadata().map_err(io)?.len();
            out.push(PackFile { name, path: root.join(&rel), len });
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

/// The files `dir` would pack, in order; `None` when there are none (or the
/// directory does not exist). Fails when the blob would pass `limit` bytes.
pub fn list(dir: &Path, limit: u64) -> Result<Option<Vec<PackFile>>, PackError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    collect(dir, Path::new(""), &mut files)?;
    if files.is_empty() {
        return Ok(None);
    }
    let bytes = blob_len(&files);
    if bytes > limit {
        return Err(PackError::TooLarge { bytes, limit });
    }
    Ok(Some(files))
}

/// The size of the blob of `files`.
pub fn blob_len(files: &[PackFile]) -> u64 {
    let header = MAGIC.len() as u64 + 4;
    header + files.iter().map(|f| 4 + f.name.len() as u64 + 8 + f.len).sum::<u64>()
}

/// A cheap fingerprint of what `dir` would pack (names, sizes, modification
/// times and inodes, not contents): tells whether the directory changed
/// since it was restored, without reading gigabytes. `None` when it would
/// pack nothing.
pub fn fingerprint(dir: &Path) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let files = list(dir, u64::MAX).ok()??;
    let mut h = DefaultHasher::new();
    for f in &files {
        let m = fs::metadata(&f.path).ok()?;
        (&f.name, f.len, m.mtime(), m.mtime_nsec(), m.ino()).hash(&mut h);
    }
    Some(h.finish())
}

/// The step a task wrote to `.muster/step` in its checkpoint directory, if
/// it did.
pub fn step(dir: &Path) -> Option<u64> {
    let text = crate::hint::ProtocolDir::open(dir, false).ok()?.read(STEP_FILE).ok()?;
    text.trim().parse().ok()
}

/// What a pack wrote: the blob's size and SHA-256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// Bytes written.
    pub bytes: u64,
    /// Their SHA-256.
    pub sha256: [u8; 32],
}

impl Packed {
    /// The digest in hex.
    pub fn hex(&self) -> String {
        hex(&self.sha256)
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the blob of `files` to `out` (streaming: a file at a time, in
/// pieces), and returns its size and digest. `out` is flushed, not synced.
pub fn pack_to(files: &[PackFile], out: impl Write) -> Result<Packed, PackError> {
    let mut w = Hashing { inner: io::BufWriter::with_capacity(1 << 20, out), hash: Sha256::new(), bytes: 0 };
    let werr = |source| PackError::Io { path: PathBuf::from("(the checkpoint store)"), source };
    w.write_all(MAGIC).map_err(werr)?;
    w.write_all(&(files.len() as u32).to_le_bytes()).map_err(werr)?;
    for f in files {
        let rerr = |source| PackError::Io { path: f.path.clone(), source };
        let file = fs::File::open(&f.path).map_err(rerr)?;
        w.write_all(&(f.name.len() as u32).to_le_bytes()).map_err(werr)?;
        w.write_all(f.name.as_bytes()).map_err(werr)?;
        w.write_all(&f.len.to_le_bytes()).map_err(werr)?;
        let mut body = file.take(f.len);
        let copied = io::copy(&mut body, &mut w).map_err(|source| PackError::Io { path: f.path.clone(), source })?;
        let mut file = body.into_inner();
        let mut more = [0u8; 1];
        if copied != f.len || file.read(&mut more).map_err(rerr)? != 0 {
            return Err(PackError::Changed(f.name.clone()));
        }
    }
    w.flush().map_err(werr)?;
    Ok(Packed { bytes: w.bytes, sha256: w.hash.finalize().into() })
}

/// A reader that hashes and counts what passes through it.
struct Checked<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R: Read> Checked<R> {
    fn exact<const N: usize>(&mut self) -> Result<[u8; N], UnpackError> {
        let mut b = [0u8; N];
        self.read_exact(&mut b).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => UnpackError::Malformed("truncated"),
            _ => UnpackError::Io { path: PathBuf::from("(the checkpoint store)"), source: e },
        })?;
        Ok(b)
    }
}

/// What the manifest says the blob is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Its size.
    pub bytes: u64,
    /// Its SHA-256.
    pub sha256: [u8; 32],
}

/// Empties `dir` (creating it if needed) and writes the files of the blob
/// read from `src` into it, streaming. The blob must be exactly `expect`:
/// its size and digest are checked as it is read, and on any failure the
/// directory is left empty (a task never starts on half a checkpoint).
pub fn unpack_from(src: impl Read, dir: &Path, expect: &Expect) -> Result<(), UnpackError> {
    let result = unpack_unchecked(src, dir, expect);
    if result.is_err() {
        let _ = reset(dir);
    }
    result
}

fn unpack_unchecked(src: impl Read, dir: &Path, expect: &Expect) -> Result<(), UnpackError> {
    reset(dir).map_err(|source| UnpackError::Io { path: dir.to_path_buf(), source })?;
    let mut r = Checked {
        inner: io::BufReader::with_capacity(1 << 20, src.take(expect.bytes + 1)),
        hash: Sha256::new(),
        bytes: 0,
    };
    if &r.exact::<8>()? != MAGIC {
        return Err(UnpackError::Malformed("bad magic"));
    }
    let count = u32::from_le_bytes(r.exact()?);
    for _ in 0..count {
        let len = u32::from_le_bytes(r.exact()?) as u64;
        if len > 4096 {
            return Err(UnpackError::Malformed("path too long"));
        }
        let mut name = vec![0u8; len as usize];
        r.read_exact(&mut name).map_err(|_| UnpackError::Malformed("truncated"))?;
        let name = String::from_utf8(name).map_err(|_| UnpackError::Malformed("path is not UTF-8"))?;
        if !safe_path(&name) {
            return Err(UnpackError::UnsafePath(name));
        }
        let size = u64::from_le_bytes(r.exact()?);
        let path = dir.join(&name);
        let io = |source| UnpackError::Io { path: path.clone(), source };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io)?;
        }
        let mut out = io::BufWriter::with_capacity(1 << 20, fs::File::create(&path).map_err(io)?);
        let copied = io::copy(&mut (&mut r).take(size), &mut out).map_err(io)?;
        if copied != size {
            return Err(UnpackError::Malformed("truncated"));
        }
        out.flush().map_err(io)?;
    }
    let mut more = [0u8; 1];
    if r.read(&mut more).map_err(|source| UnpackError::Io { path: dir.to_path_buf(), source })? != 0 {
        return Err(UnpackError::Mismatch(format!("longer than its {} bytes", expect.bytes)));
    }
    if r.bytes != expect.bytes {
        return Err(UnpackError::Mismatch(format!("{} bytes, not {}", r.bytes, expect.bytes)));
    }
    let got: [u8; 32] = r.hash.finalize().into();
    if got != expect.sha256 {
        return Err(UnpackError::Mismatch(format!("SHA-256 {}, not {}", hex(&got), hex(&expect.sha256))));
    }
    Ok(())
}

/// A relative path that stays inside its directory.
fn safe_path(name: &str) -> bool {
    !name.is_empty() && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)))
}

/// A blob of `(path, contents)` files, in the given order (tests, and
/// small checkpoints built in memory).
pub fn encode<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Vec<u8> {
    let files: Vec<_> = files.into_iter().collect();
    let mut blob = MAGIC.to_vec();
    blob.extend_from_slice(&(files.len() as u32).to_le_bytes());
    for (name, data) in files {
        blob.extend_from_slice(&(name.len() as u32).to_le_bytes());
        blob.extend_from_slice(name.as_bytes());
        blob.extend_from_slice(&(data.len() as u64).to_le_bytes());
        blob.extend_from_slice(data);
    }
    blob
}

/// The size and digest of an in-memory blob.
pub fn expect_of(blob: &[u8]) -> Expect {
    Expect { bytes: blob.len() as u64, sha256: Sha256::digest(blob).into() }
}

/// Gives a task's checkpoint directory to the account the task runs as:
/// the directory (mode 0700, so no other account can read it) and all it
/// holds become that account's, with `.muster` made for the hint
/// protocol. Links are changed themselves, never followed. Called only
/// while the directory is [`seal`]ed or fresh, when no process of the task
/// can change it.
pub fn hand_over(dir: &Path, user: &crate::users::TaskUser) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let protocol = dir.join(crate::hint::PROTOCOL_DIR);
    match fs::symlink_metadata(&protocol) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&protocol)?,
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    chown_tree(dir, user.uid, user.gid)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Takes a task's checkpoint directory back once its attempt ended: the
/// agent's own, mode 0700, so no process of the task's account (another
/// job of the same owner, say) can swap a file for a link while the agent
/// packs what is inside.
pub fn seal(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: getters with no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Empties `dir`, creating it if needed (from a spare directory when one
/// waits).
pub fn reset(dir: &Path) -> io::Result<()> {
    if let Some(spares) = dir.parent().map(|p| p.join(SPARE)) {
        let hint = spare_hints().get_mut(&spares).and_then(Vec::pop);
        // Renamed over the path, a spare replaces nothing or an empty
        // directory; over one holding files it fails (emptied below).
        if let Some(name) = hint
            && fs::rename(spares.join(name), dir).is_ok()
        {
            return Ok(());
        }
    }
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
        // The spares' directory is made once: try the rename first.
        let kept = fs::rename(dir, spares.join(name)).or_else(|e| match e.kind() {
            io::ErrorKind::NotFound if dir.exists() => {
                fs::create_dir_all(&spares).and_then(|()| fs::rename(dir, spares.join(name)))
            }
            _ => Err(e),
        });
        if kept.is_ok() {
            let mut hints = spare_hints();
            let names = hints.entry(spares).or_default();
            if names.len() < SPARE_HINTS {
                names.push(name.to_os_string());
            }
            return;
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// The content of a restored directory holding exactly one file of at
/// most [`INLINE_LIMIT`] bytes, base64-encoded (for `CHECKPOINT_DATA`).
pub fn inline_data(dir: &Path) -> Option<String> {
    match list(dir, u64::MAX).ok()??.as_slice() {
        [f] if f.len <= INLINE_LIMIT => Some(base64(&fs::read(&f.path).ok()?)),
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

    /// A task's directory is handed to its account whole (links changed,
    /// never followed), and taken back whole.
    #[test]
    fn a_directory_is_handed_to_the_tasks_account_and_sealed_back() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let work = tempfile::tempdir().unwrap();
        let outside = work.path().join("outside");
        fs::write(&outside, "root's").unwrap();
        let c = dir(work.path(), 4, 0);
        fs::create_dir_all(c.join("sub")).unwrap();
        fs::write(c.join("sub/state"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, c.join("link")).unwrap();
        let user = crate::users::TaskUser { name: "t".into(), uid: 60201, gid: 60202, groups: vec![60202] };
        hand_over(&c, &user).unwrap();
        for p in [c.clone(), c.join("sub"), c.join("sub/state"), c.join(".muster")] {
            let m = fs::metadata(&p).unwrap();
            assert_eq!((m.uid(), m.gid()), (60201, 60202), "{}", p.display());
        }
        assert_eq!(fs::symlink_metadata(c.join("link")).unwrap().uid(), 60201, "the link itself");
        assert_eq!(fs::metadata(&outside).unwrap().uid(), 0, "not what it points at");
        assert_eq!(fs::metadata(&c).unwrap().permissions().mode() & 0o777, 0o700);
        seal(&c).unwrap();
        let m = fs::metadata(&c).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700));
    }

    fn pack(d: &Path, limit: u64) -> Result<Option<Vec<u8>>, PackError> {
        let Some(files) = list(d, limit)? else { return Ok(None) };
        let mut blob = Vec::new();
        let p = pack_to(&files, &mut blob)?;
        assert_eq!((p.bytes, p.bytes), (blob.len() as u64, blob_len(&files)));
        assert_eq!(expect_of(&blob).sha256, p.sha256);
        Ok(Some(blob))
    }

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

    /// A spare retired here is renamed into place from its remembered
    /// name; over a directory holding files it is not (that directory is
    /// emptied), and a remembered spare that is gone, or one this process
    /// never named, is found by listing.
    #[test]
    fn a_remembered_spare_is_reused_and_a_stale_name_falls_back() {
        let work = tempfile::tempdir().unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let spares = work.path().join("checkpoints").join(SPARE);
        let d = |t| dir(work.path(), 1, t);
        reset(&d(0)).unwrap();
        let first = inode(&d(0));
        retire(&d(0));
        assert_eq!(spare_hints()[&spares], [std::ffi::OsString::from("alloc-1-task-0")]);
        reset(&d(5)).unwrap();
        assert_eq!(inode(&d(5)), first, "the named spare became the next task's directory");
        assert!(spare_hints()[&spares].is_empty(), "its name was taken");
        retire(&d(5));
        assert_eq!(spare_hints()[&spares], [std::ffi::OsString::from("alloc-1-task-5")]);
        // Over a directory with a file: that directory is emptied, the
        // spare stays for the next.
        fs::create_dir_all(d(1)).unwrap();
        fs::write(d(1).join("old"), "x").unwrap();
        reset(&d(1)).unwrap();
        assert!(fs::read_dir(d(1)).unwrap().next().is_none());
        assert!(spares.join("alloc-1-task-5").is_dir());
        assert!(spare_hints()[&spares].is_empty());
        // Not named (as after a restart): found by listing.
        reset(&d(2)).unwrap();
        assert_eq!(inode(&d(2)), first);
        // Named but gone: found by listing too, or made.
        retire(&d(2));
        fs::remove_dir(spares.join("alloc-1-task-2")).unwrap();
        fs::create_dir(spares.join("other")).unwrap();
        let other = inode(&spares.join("other"));
        reset(&d(3)).unwrap();
        assert_eq!(inode(&d(3)), other);
        reset(&d(4)).unwrap();
        assert!(d(4).is_dir() && fs::read_dir(&spares).unwrap().next().is_none());
    }

    #[test]
    fn temporary_files_are_never_packed_and_the_fingerprint_follows_the_files() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("step"), b"7").unwrap();
        let whole = pack(d.path(), 1 << 20).unwrap().unwrap();
        let print = fingerprint(d.path()).unwrap();
        for torn in ["model.pt.tmp", ".tmpk3j2_x", "state.part", "ckpt.partial", "notes~", ".#lock", "a.swp"] {
            fs::write(d.path().join(torn), b"half a file").unwrap();
        }
        fs::create_dir_all(d.path().join(".muster")).unwrap();
        fs::write(d.path().join(".muster/step"), b"12\n").unwrap();
        let again = pack(d.path(), 1 << 20).unwrap().unwrap();
        assert_eq!(again, whole, "only the renamed-into-place file is packed");
        assert_eq!(fingerprint(d.path()), Some(print), "nothing it would pack changed");
        assert_eq!(step(d.path()), Some(12));
        fs::write(d.path().join("step.tmp"), b"8").unwrap();
        fs::rename(d.path().join("step.tmp"), d.path().join("step")).unwrap();
        assert_ne!(fingerprint(d.path()), Some(print), "a file renamed into place changes it");
        assert!(!is_temporary("model.pt") && !is_temporary("tmp") && !is_temporary("step-10"));
    }

    #[test]
    fn a_directory_round_trips_through_a_blob_checked_against_its_manifest() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("opt/state")).unwrap();
        fs::write(src.path().join("step"), b"42\n").unwrap();
        fs::write(src.path().join("opt/state/m.bin"), [0u8, 1, 2, 255]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("link")).unwrap();
        let blob = pack(src.path(), 1 << 20).unwrap().unwrap();
        assert_eq!(pack(src.path(), 1 << 20).unwrap().unwrap(), blob, "packing is deterministic");
        let dst = tempfile::tempdir().unwrap();
        fs::write(dst.path().join("stale"), b"old").unwrap();
        unpack_from(&blob[..], dst.path(), &expect_of(&blob)).unwrap();
        assert_eq!(fs::read(dst.path().join("step")).unwrap(), b"42\n");
        assert_eq!(fs::read(dst.path().join("opt/state/m.bin")).unwrap(), [0u8, 1, 2, 255]);
        assert!(!dst.path().join("stale").exists(), "the directory is emptied first");
        assert!(!dst.path().join("link").exists(), "symlinks are not packed");
        assert_eq!(inline_data(dst.path()), None, "two files are not inlined");
    }

    #[test]
    fn a_blob_that_is_not_what_its_manifest_says_leaves_the_directory_empty() {
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("weights"), vec![7u8; 10_000]).unwrap();
        let blob = pack(src.path(), 1 << 20).unwrap().unwrap();
        let expect = expect_of(&blob);
        let dst = tempfile::tempdir().unwrap();
        let mut flipped = blob.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let e = unpack_from(&flipped[..], dst.path(), &expect).unwrap_err();
        assert!(matches!(e, UnpackError::Mismatch(ref m) if m.contains("SHA-256")), "{e}");
        assert!(fs::read_dir(dst.path()).unwrap().next().is_none(), "nothing of a corrupt checkpoint is left");
        let e = unpack_from(&blob[..blob.len() - 1], dst.path(), &expect).unwrap_err();
        assert!(matches!(e, UnpackError::Malformed("truncated")), "{e}");
        let mut longer = blob.clone();
        longer.push(0);
        let e = unpack_from(&longer[..], dst.path(), &expect).unwrap_err();
        assert!(matches!(e, UnpackError::Mismatch(_)), "{e}");
        assert!(fs::read_dir(dst.path()).unwrap().next().is_none());
    }

    #[test]
    fn an_empty_or_missing_directory_packs_to_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert!(pack(d.path(), 100).unwrap().is_none());
        assert!(pack(&d.path().join("missing"), 100).unwrap().is_none());
        assert_eq!(fingerprint(d.path()), None);
    }

    #[test]
    fn a_directory_over_the_cap_is_refused_with_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("big"), vec![0u8; 2_000]).unwrap();
        let err = pack(d.path(), 1_000).unwrap_err();
        assert!(err.to_string().contains("over the 1000-byte cap"), "{err}");
    }

    #[test]
    fn a_file_that_grows_while_it_is_packed_fails_the_pack() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("log"), b"12345").unwrap();
        let files = list(d.path(), 1 << 20).unwrap().unwrap();
        fs::write(d.path().join("log"), b"1234567").unwrap();
        let err = pack_to(&files, io::sink()).unwrap_err();
        assert!(matches!(err, PackError::Changed(ref f) if f == "log"), "{err}");
    }

    #[test]
    fn one_small_file_is_inlined_as_base64() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("step"), b"step=17").unwrap();
        assert_eq!(inline_data(d.path()).as_deref(), Some("c3RlcD0xNw=="));
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn malformed_or_escaping_blobs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let junk = b"junk";
        assert!(matches!(unpack_from(&junk[..], d.path(), &expect_of(junk)), Err(UnpackError::Malformed("truncated"))));
        for evil in ["../escape", "/etc/passwd", "a/../../b", ""] {
            let blob = encode([(evil, &b"x"[..])]);
            assert!(
                matches!(unpack_from(&blob[..], d.path(), &expect_of(&blob)), Err(UnpackError::UnsafePath(_))),
                "{evil}"
            );
        }
        assert!(!d.path().parent().unwrap().join("escape").exists());
    }
}
