//! A cgroup's directories and files held open.
//!
//! Opening a cgroup file walks its path through kernfs (a lookup and a
//! revalidation per component, seven or eight of them below
//! `/sys/fs/cgroup`) and sets up an open file; an attempt reads and writes
//! about thirty of them, and under a stream of short tasks that was the
//! largest part of containment's cost after the `mkdir`s
//! (docs/performance.md, "Containment's cost"). So a cgroup's directories
//! are opened once (`O_PATH`), its files once each through them, and both
//! are kept with it: across its attempt, and on v1 across the attempts that
//! reuse it as a spare (a rename keeps open files valid).
//!
//! Two files are never read through a kept descriptor: v1 caches a
//! `cgroup.procs` (and `tasks`) listing per open file and hands it out
//! again to a later read of the same file, so each read of a process list
//! opens it anew (relative to the kept directory). Every other file is
//! read with `pread` at offset 0, which makes kernfs show it afresh.
//!
//! A handle given away (its cgroup became a spare) is empty for every
//! other copy of the cgroup: those fall back to paths, which name a
//! directory that no longer exists, so a stale copy can never reach the
//! attempt that reuses the cgroup.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The most bytes a cgroup file read here holds (`memory.oom_control`,
/// a counter, a limit: well under it); a process list is read in full.
const SMALL: usize = 4096;

/// What is open of one cgroup.
#[derive(Debug, Default)]
pub(crate) struct Open {
    /// Each hierarchy's directory (`None`: not opened yet).
    dirs: Vec<Option<File>>,
    /// Files opened through them: (hierarchy, name, for writing).
    files: Vec<(usize, &'static str, bool, Arc<File>)>,
}

/// A cgroup's handles, shared by its copies; `None` once given away.
#[derive(Clone, Debug)]
pub(crate) struct Handles {
    open: Arc<Mutex<Option<Open>>>,
    /// A fake tree of regular files (tests): a file written is created.
    fake: bool,
}

impl Handles {
    /// Nothing opened yet.
    pub(crate) fn new(fake: bool) -> Handles {
        Handles::from(Open::default(), fake)
    }

    /// Handles that were given away earlier, taken over.
    pub(crate) fn from(open: Open, fake: bool) -> Handles {
        Handles { open: Arc::new(Mutex::new(Some(open))), fake }
    }

    /// Takes what is open away from every copy (the cgroup becomes a
    /// spare, or is removed).
    pub(crate) fn give_away(&self) -> Option<Open> {
        self.open.lock().expect("cgroup handles lock").take()
    }

    /// `name` in hierarchy `i` (directory `dir`), opened for reading or
    /// writing and kept; opened by path and not kept once given away.
    pub(crate) fn file(&self, i: usize, dir: &Path, name: &'static str, write: bool) -> io::Result<Arc<File>> {
        let mut guard = self.open.lock().expect("cgroup handles lock");
        let Some(open) = guard.as_mut() else {
            return open_path(&dir.join(name), write, self.fake).map(Arc::new);
        };
        if let Some((.., f)) = open.files.iter().find(|(h, n, w, _)| *h == i && *n == name && *w == write) {
            return Ok(f.clone());
        }
        let f = Arc::new(open_in(open.dir(i, dir)?.as_raw_fd(), name, write, self.fake)?);
        open.files.push((i, name, write, f.clone()));
        Ok(f)
    }

    /// Writes `value` to `name` in hierarchy `i`, through the kept file.
    pub(crate) fn write(&self, i: usize, dir: &Path, name: &'static str, value: &str) -> io::Result<()> {
        write_value(&*self.file(i, dir, name, true)?, value, self.fake)
    }

    /// `name` in hierarchy `i`, opened anew for reading (through the kept
    /// directory where there is one).
    pub(crate) fn fresh(&self, i: usize, dir: &Path, name: &str) -> io::Result<File> {
        let mut guard = self.open.lock().expect("cgroup handles lock");
        match guard.as_mut() {
            Some(open) => open_in(open.dir(i, dir)?.as_raw_fd(), name, false, false),
            None => open_path(&dir.join(name), false, false),
        }
    }

    /// The link count of hierarchy `i`'s directory (2 + its
    /// subdirectories).
    pub(crate) fn links(&self, i: usize, dir: &Path) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let mut guard = self.open.lock().expect("cgroup handles lock");
        match guard.as_mut() {
            Some(open) => open.dir(i, dir)?.metadata(),
            None => std::fs::metadata(dir),
        }
        .map(|m| m.nlink())
    }
}

impl Open {
    /// Hierarchy `i`'s directory, opened from `dir` the first time.
    fn dir(&mut self, i: usize, dir: &Path) -> io::Result<&File> {
        if self.dirs.len() <= i {
            self.dirs.resize_with(i + 1, || None);
        }
        if self.dirs[i].is_none() {
            self.dirs[i] = Some(open_dir(dir)?);
        }
        Ok(self.dirs[i].as_ref().expect("opened above"))
    }
}

/// The directory `dir`, opened as a path (`O_PATH`): to open, stat and
/// rename relative to, not to read.
pub(crate) fn open_dir(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// `name` opened relative to the directory `dir` (made if `create`).
fn open_in(dir: RawFd, name: &str, write: bool, create: bool) -> io::Result<File> {
    let c = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name holds a NUL byte"))?;
    let mode = match (write, create) {
        (false, _) => libc::O_RDONLY,
        (true, false) => libc::O_WRONLY,
        (true, true) => libc::O_WRONLY | libc::O_CREAT,
    };
    // SAFETY: `c` is NUL-terminated and `dir` an open directory; the
    // descriptor returned is owned by the File.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), mode | libc::O_CLOEXEC, 0o644 as libc::c_uint) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{name}: {e}")));
    }
    // SAFETY: as above.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn open_path(path: &Path, write: bool, create: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .create(write && create)
        .truncate(false)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Reads all of `f` from its start.
pub(crate) fn read_all(f: &File) -> io::Result<String> {
    let mut buf = vec![0u8; SMALL];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = f.read_at(&mut buf[len..], len as u64)?;
        if n == 0 {
            break;
        }
        len += n;
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Reads a small file of `f` from its start (one `pread` for anything
/// that fits [`SMALL`]).
pub(crate) fn read_small(f: &File) -> io::Result<String> {
    let mut buf = [0u8; SMALL];
    let n = f.read_at(&mut buf, 0)?;
    if n == SMALL {
        return read_all(f);
    }
    std::str::from_utf8(&buf[..n])
        .map(str::to_string)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Writes `value` to `f` at its start, in one write (as cgroupfs takes
/// it); on a regular file (a fake tree), cuts what an earlier, longer
/// value left after it.
fn write_value(f: &File, value: &str, regular: bool) -> io::Result<()> {
    let n = f.write_at(value.as_bytes(), 0)?;
    if n != value.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "a short write"));
    }
    if regular {
        f.set_len(n as u64)?;
    }
    Ok(())
}
