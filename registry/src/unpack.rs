//! Unpacks one image layer (a tar stream, already decompressed) into a
//! directory an overlay mount uses as a lower layer. Layers are untrusted
//! input: the unpacker never follows a symlink while writing, and refuses
//!
//! ```text
//!   a path with a `..` component              ("../etc/passwd")
//!   a symlink whose target climbs out of the root ("x -> ../../../etc")
//!   a hard link to a path out of the root or through a symlink
//!   a character or block device node
//!   a setuid or setgid file (unless the agent allows them)
//!   a whiteout for a path out of the root     (".wh..." naming "..")
//!   more bytes than the caller allows         (a decompression bomb)
//! ```
//!
//! Whiteouts become overlayfs's own: `.wh.NAME` a 0/0 character device
//! `NAME`, `.wh..wh..opq` the `trusted.overlay.opaque` attribute on its
//! directory (made by the agent, never taken from the layer).

use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a layer was refused.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// An entry the unpacker refuses, and why.
    #[error("layer entry {path:?}: {reason}")]
    Refused {
        /// The entry's path as the layer gives it.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// More bytes than allowed.
    #[error("the layer unpacks to more than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Reading the stream or writing the directory failed.
    #[error("unpacking: {0}")]
    Io(#[from] io::Error),
}

/// What the unpacker allows beyond the safe default.
#[derive(Clone, Copy, Debug)]
pub struct UnpackPolicy {
    /// Keep setuid and setgid bits (refused otherwise).
    pub allow_setuid: bool,
    /// The most bytes of file content one layer may unpack to.
    pub max_bytes: u64,
}

impl Default for UnpackPolicy {
    fn default() -> Self {
        UnpackPolicy { allow_setuid: false, max_bytes: 64 << 30 }
    }
}

/// What an unpacked layer holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

fn refused(path: &str, reason: impl Into<String>) -> UnpackError {
    UnpackError::Refused { path: path.chars().take(256).collect(), reason: reason.into() }
}

/// The entry's path relative to the layer root, clean: a leading `/` or
/// `./` is dropped (layers are written both ways), `..` is refused.
fn clean(raw: &str) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for c in Path::new(raw).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(refused(raw, "a '..' component points out of the root")),
            Component::Prefix(_) => return Err(refused(raw, "not a Unix path")),
        }
    }
    Ok(out)
}

/// Whether symlink `target`, written at `link` (relative to the root),
/// stays in the root when resolved lexically from the link's directory (an
/// absolute target from the root).
fn target_stays_inside(link: &Path, target: &Path) -> bool {
    let mut depth = if target.is_relative() { link.parent().map_or(0, |p| p.components().count()) } else { 0 };
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => {
                if depth == 0 {
                    return false;
                }
                depth -= 1;
            }
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return false,
        }
    }
    true
}

/// Makes `rel`'s parent directories under `root`, refusing to pass through
/// anything but a real directory (a symlink planted by an earlier entry
/// would otherwise carry later writes out of the root).
fn make_parents(root: &Path, rel: &Path, raw: &str) -> Result<PathBuf, UnpackError> {
    let mut at = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(_) => return Err(refused(raw, format!("{} is not a directory", at.display()))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&at)?,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(root.join(rel))
}

/// Removes what is at `path` (not following a symlink), if anything, so an
/// entry may replace an earlier one of the same layer; a directory stays
/// when the new entry is one too.
fn clear(path: &Path, keep_dir: bool) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {
            if keep_dir {
                Ok(())
            } else {
                fs::remove_dir_all(path)
            }
        }
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

/// Sets owner and group without following a symlink.
fn lchown(path: &Path, uid: u64, gid: u64) -> io::Result<()> {
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "uid or gid out of range"));
    };
    let c = cstr(path)?;
    // SAFETY: a valid NUL-terminated path; lchown does not follow links.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A 0/0 character device: overlayfs's whiteout.
fn make_whiteout(path: &Path) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks `dir` opaque for overlayfs (hides the lower layers' contents).
fn make_opaque(dir: &Path) -> io::Result<()> {
    let c = cstr(dir)?;
    let name = c"trusted.overlay.opaque";
    // SAFETY: valid NUL-terminated strings and a 1-byte value.
    if unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unpacks the tar stream `layer` into `root` (an empty directory).
pub fn unpack(layer: impl Read, root: &Path, policy: &UnpackPolicy) -> Result<Unpacked, UnpackError> {
    let mut archive = tar::Archive::new(layer);
    let mut done = Unpacked::default();
    unpack_entries(&mut archive, root, policy, &mut done)?;
    // Read the stream to its end (tar's padding, gzip's trailer): the
    // layer's digest is checked only once every byte has been read, and a
    // stream that goes on after the archive is refused rather than cut short.
    let rest = io::copy(&mut archive.into_inner().take(MAX_TRAILING_BYTES + 1), &mut io::sink())?;
    if rest > MAX_TRAILING_BYTES {
        return Err(refused("", format!("more than {MAX_TRAILING_BYTES} bytes follow the end of the archive")));
    }
    Ok(done)
}

/// The most bytes a layer may hold after the end of its archive (tar pads
/// to its record size, 10 KiB by default).
pub const MAX_TRAILING_BYTES: u64 = 1 << 20;

fn unpack_entries<R: Read>(
    archive: &mut tar::Archive<R>,
    root: &Path,
    policy: &UnpackPolicy,
    done: &mut Unpacked,
) -> Result<(), UnpackError> {
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw_path = entry.path_bytes().into_owned();
        let raw = String::from_utf8_lossy(&raw_path).into_owned();
        let rel = clean(&raw)?;
        if rel.as_os_str().is_empty() {
            continue; // the root itself ("./")
        }
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode()?;
        let (uid, gid) = (header.uid()?, header.gid()?);
        let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // Whiteouts.
        if name == OPAQUE {
            let dir = make_parents(root, &rel, &raw)?;
            make_opaque(dir.parent().expect("a whiteout has a parent"))?;
            done.entries += 1;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
                return Err(refused(&raw, "a whiteout must name an entry of its own directory"));
            }
            let target = rel.with_file_name(hidden);
            let path = make_parents(root, &target, &raw)?;
            clear(&path, false)?;
            make_whiteout(&path)?;
            done.entries += 1;
            continue;
        }
        if mode & 0o6000 != 0 && !policy.allow_setuid && kind.is_file() {
            return Err(refused(
                &raw,
                format!("a setuid or setgid file (mode {mode:o}); the agent does not allow them"),
            ));
        }
        let path = make_parents(root, &rel, &raw)?;
        match kind {
            tar::EntryType::Directory => {
                clear(&path, true)?;
                if !path.exists() {
                    fs::create_dir(&path)?;
                }
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                clear(&path, false)?;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&path)?;
                let left = policy.max_bytes.saturating_sub(done.bytes);
                let n = io::copy(&mut (&mut entry).take(left.saturating_add(1)), &mut f)?;
                if n > left {
                    return Err(UnpackError::TooLarge { limit: policy.max_bytes });
                }
                f.flush()?;
                done.bytes += n;
                f.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
            }
            tar::EntryType::Symlink => {
                let target =
                    entry.link_name()?.ok_or_else(|| refused(&raw, "a symlink without a target"))?.into_owned();
                if !target_stays_inside(&rel, &target) {
                    return Err(refused(&raw, format!("a symlink to {} points out of the root", target.display())));
                }
                clear(&path, false)?;
                std::os::unix::fs::symlink(&target, &path)?;
            }
            tar::EntryType::Link => {
                let target =
                    entry.link_name_bytes().ok_or_else(|| refused(&raw, "a hard link without a target"))?.into_owned();
                let target_rel = clean(&String::from_utf8_lossy(&target))?;
                let target_raw = target_rel.display().to_string();
                let source = make_parents(root, &target_rel, &raw)?;
                match fs::symlink_metadata(&source) {
                    Ok(m) if m.file_type().is_file() => {}
                    Ok(_) => return Err(refused(&raw, format!("a hard link to {target_raw}, which is not a file"))),
                    Err(_) => {
                        return Err(refused(&raw, format!("a hard link to {target_raw}, which this layer lacks")));
                    }
                }
                clear(&path, false)?;
                fs::hard_link(&source, &path)?;
            }
            tar::EntryType::Fifo => {
                clear(&path, false)?;
                let c = cstr(&path)?;
                // SAFETY: a valid NUL-terminated path.
                if unsafe { libc::mkfifo(c.as_ptr(), (mode & 0o777) as libc::mode_t) } != 0 {
                    return Err(io::Error::last_os_error().into());
                }
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refused(&raw, "a device node (an image gets its devices from the agent)"));
            }
            // Extended headers are folded into the entries they precede.
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName => continue,
            tar::EntryType::GNULongLink => continue,
            other => return Err(refused(&raw, format!("an entry of type {other:?}"))),
        }
        lchown(&path, uid, gid)?;
        // chown clears setuid and setgid bits: the mode goes on after it.
        if matches!(kind, tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Continuous) {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))?;
        }
        done.entries += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar stream built entry by entry, as a hostile layer would be.
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Layer {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn header(kind: tar::EntryType, path: &str, mode: u32, size: u64) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(size);
            h.set_uid(0);
            h.set_gid(0);
            // Written raw: the builder's own path check would refuse `..`.
            let bytes = path.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_cksum();
            h
        }

        fn dir(mut self, path: &str) -> Layer {
            let h = Self::header(tar::EntryType::Directory, path, 0o755, 0);
            self.0.append(&h, io::empty()).unwrap();
            self
        }

        fn file(mut self, path: &str, mode: u32, data: &[u8]) -> Layer {
            let h = Self::header(tar::EntryType::Regular, path, mode, data.len() as u64);
            self.0.append(&h, data).unwrap();
            self
        }

        fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Layer {
            let mut h = Self::header(kind, path, 0o777, 0);
            h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
            h.set_cksum();
            self.0.append(&h, io::empty()).unwrap();
            self
        }

        fn device(mut self, path: &str) -> Layer {
            let h = Self::header(tar::EntryType::Char, path, 0o666, 0);
            self.0.append(&h, io::empty()).unwrap();
            self
        }

        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    fn unpack_into(layer: Layer, policy: &UnpackPolicy) -> (tempfile::TempDir, Result<Unpacked, UnpackError>) {
        let dir = tempfile::tempdir().unwrap();
        let r = unpack(&layer.bytes()[..], dir.path(), policy);
        (dir, r)
    }

    fn refusal(layer: Layer) -> String {
        let (_dir, r) = unpack_into(layer, &UnpackPolicy::default());
        r.unwrap_err().to_string()
    }

    #[test]
    fn a_plain_layer_unpacks_with_modes_links_and_whiteouts() {
        let layer = Layer::new()
            .dir("./bin/")
            .file("./bin/busybox", 0o755, b"#!binary")
            .link(tar::EntryType::Symlink, "bin/sh", "/bin/busybox")
            .link(tar::EntryType::Symlink, "bin/sh2", "busybox")
            .link(tar::EntryType::Link, "bin/hard", "bin/busybox")
            .file("/etc/hostname", 0o644, b"box\n")
            .file("etc/.wh.passwd", 0o644, b"")
            .dir("data/")
            .file("data/.wh..wh..opq", 0o644, b"");
        let (dir, r) = unpack_into(layer, &UnpackPolicy::default());
        let done = r.unwrap();
        assert_eq!(done.bytes, 12);
        let root = dir.path();
        assert_eq!(fs::read(root.join("bin/busybox")).unwrap(), b"#!binary");
        assert_eq!(fs::metadata(root.join("bin/busybox")).unwrap().permissions().mode() & 0o7777, 0o755);
        assert_eq!(fs::read_link(root.join("bin/sh")).unwrap(), Path::new("/bin/busybox"));
        assert_eq!(fs::read(root.join("bin/hard")).unwrap(), b"#!binary");
        assert_eq!(fs::read(root.join("etc/hostname")).unwrap(), b"box\n");
        use std::os::unix::fs::FileTypeExt;
        let wh = fs::symlink_metadata(root.join("etc/passwd")).unwrap();
        assert!(wh.file_type().is_char_device(), "a whiteout is a 0/0 character device");
        let c = cstr(&root.join("data")).unwrap();
        let mut v = [0u8; 4];
        // SAFETY: valid strings and buffer.
        let n = unsafe { libc::lgetxattr(c.as_ptr(), c"trusted.overlay.opaque".as_ptr(), v.as_mut_ptr().cast(), 4) };
        assert_eq!((n, v[0]), (1, b'y'), "the opaque directory is marked");
    }

    #[test]
    fn hostile_layers_are_refused_naming_the_entry() {
        let cases = [
            (Layer::new().file("../escape", 0o644, b"x"), "\"../escape\": a '..' component"),
            (Layer::new().file("a/../../escape", 0o644, b"x"), "a '..' component"),
            (Layer::new().link(tar::EntryType::Symlink, "a/up", "../../etc"), "points out of the root"),
            (Layer::new().link(tar::EntryType::Symlink, "abs", "/../../etc"), "points out of the root"),
            (Layer::new().device("dev/sda"), "a device node"),
            (Layer::new().file("bin/su", 0o4755, b"x"), "a setuid or setgid file (mode 4755)"),
            (Layer::new().file("bin/sg", 0o2755, b"x"), "a setuid or setgid file"),
            (Layer::new().file("a/.wh...", 0o644, b""), "a whiteout must name an entry of its own directory"),
            (Layer::new().file("../.wh.x", 0o644, b""), "a '..' component"),
            (Layer::new().link(tar::EntryType::Link, "h", "../../etc/shadow"), "a '..' component"),
            (Layer::new().link(tar::EntryType::Link, "h", "missing"), "which this layer lacks"),
        ];
        for (layer, needle) in cases {
            let e = refusal(layer);
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn a_symlink_planted_by_one_entry_cannot_carry_a_later_write_out() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().display().to_string();
        // An absolute symlink is fine as such (it resolves in the image's
        // root at run time), but writing through it is refused.
        let layer = Layer::new().link(tar::EntryType::Symlink, "evil", &target).file("evil/planted", 0o644, b"owned");
        let e = refusal(layer);
        assert!(e.contains("is not a directory"), "{e}");
        assert!(!outside.path().join("planted").exists(), "nothing was written outside");
        // Nor a hard link through it.
        fs::write(outside.path().join("secret"), b"s").unwrap();
        let layer = Layer::new().link(tar::EntryType::Symlink, "evil", &target).link(
            tar::EntryType::Link,
            "stolen",
            "evil/secret",
        );
        assert!(refusal(layer).contains("is not a directory"));
    }

    #[test]
    fn the_stream_is_read_to_its_end_and_bytes_after_the_archive_are_bounded() {
        let mut bytes = Layer::new().file("a", 0o644, b"x").bytes();
        bytes.extend(std::iter::repeat_n(0u8, 64 * 1024));
        let dir = tempfile::tempdir().unwrap();
        let mut reader = &bytes[..];
        unpack(&mut reader, dir.path(), &UnpackPolicy::default()).unwrap();
        assert!(reader.is_empty(), "every byte was read, so the digest over them is checked");
        let mut long = Layer::new().file("a", 0o644, b"x").bytes();
        long.extend(std::iter::repeat_n(0u8, (MAX_TRAILING_BYTES + 4096) as usize));
        let dir = tempfile::tempdir().unwrap();
        let e = unpack(&long[..], dir.path(), &UnpackPolicy::default()).unwrap_err();
        assert!(e.to_string().contains("follow the end of the archive"), "{e}");
    }

    #[test]
    fn setuid_files_are_kept_when_allowed_and_a_bomb_is_cut_short() {
        let policy = UnpackPolicy { allow_setuid: true, ..UnpackPolicy::default() };
        let (dir, r) = unpack_into(Layer::new().file("bin/su", 0o4755, b"x"), &policy);
        r.unwrap();
        assert_eq!(fs::metadata(dir.path().join("bin/su")).unwrap().permissions().mode() & 0o7777, 0o4755);
        let policy = UnpackPolicy { max_bytes: 10, ..UnpackPolicy::default() };
        let layer = Layer::new().file("a", 0o644, &[0; 8]).file("b", 0o644, &[0; 8]);
        let (_dir, r) = unpack_into(layer, &policy);
        assert!(matches!(r, Err(UnpackError::TooLarge { limit: 10 })), "{r:?}");
    }
}
