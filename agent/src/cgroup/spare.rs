//! Reusing emptied attempt cgroups (v1).
//!
//! Making a cgroup costs a `mkdir` in each of six hierarchies, and
//! removing it six `rmdir`s and the kernel's work destroying it; under a
//! stream of short tasks that was most of containment's cost
//! (docs/performance.md, "Containment's cost"). So an attempt's cgroup,
//! once empty, is renamed to `spare-N` and kept; the next attempt renames
//! a spare to its own name (v1 cgroupfs renames within a parent; v2 has no
//! rename, so there every attempt makes its own).
//!
//! A spare is taken back only when nothing of its last attempt can reach
//! the next one: no process left, no cgroup below it, no OOM kill counted
//! (the counter cannot be reset, and a later attempt would read it as its
//! own), at most [`SPARE_MEMORY_MAX`] still charged (page cache of what the
//! task wrote), thawed, and every knob a task running as root could have
//! changed reading back what the agent wrote or the kernel's default. On
//! reuse its peak-memory and CPU counters are reset, its device list is
//! reset to the parent's and the unassigned GPUs denied again, and only
//! the limits that differ from the last attempt's are written.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::TaskCgroup;
use super::files::{self, Open};

/// The most spares an agent keeps: more than the attempts a node runs at
/// once is churn the pool no longer saves.
pub(super) const SPARES_MAX: usize = 64;

/// The most memory a cgroup may still have charged to be reused (page
/// cache its task left): a later attempt starts with it counted.
pub(super) const SPARE_MEMORY_MAX: u64 = 4 << 20;

/// The prefix of a spare's name.
const PREFIX: &str = "spare-";

/// The limits an attempt's cgroup holds, as written: a reused one gets
/// only the writes that differ.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// `pids.max`.
    pub(super) pids: u64,
    /// The memory (and memory + swap) limit, bytes (0: none).
    pub(super) mem_bytes: u64,
    /// `cpu.cfs_quota_us` (0: none).
    pub(super) cpu_quota_us: u64,
}

/// The emptied cgroups of an agent's subtree (v1).
#[derive(Debug)]
pub(crate) struct Spares {
    /// The agent's subtree in each hierarchy, in the attempts' order.
    roots: Vec<PathBuf>,
    /// Each root's directory held open (`O_PATH`; `None` where it could
    /// not be opened): renames relative to it skip the path walk.
    root_fds: Vec<Option<fs::File>>,
    has_swap_limit: bool,
    /// The spares: their names, the limits they hold, and their
    /// directories and files still open ([`super::files`]).
    free: Mutex<Vec<(String, Applied, Open)>>,
    next: AtomicU64,
}

impl Spares {
    /// The pool of the subtree at `roots`; spares an earlier agent left
    /// there are removed (what they held is not known).
    pub(super) fn new(roots: Vec<PathBuf>, has_swap_limit: bool) -> Spares {
        for root in &roots {
            let Ok(entries) = fs::read_dir(root) else { continue };
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(PREFIX) && e.file_type().is_ok_and(|t| t.is_dir()) {
                    super::task::remove_tree(&e.path());
                }
            }
        }
        let root_fds = roots.iter().map(|r| files::open_dir(r).ok()).collect();
        Spares { roots, root_fds, has_swap_limit, free: Mutex::new(Vec::new()), next: AtomicU64::new(0) }
    }

    /// Whether the first hierarchy holds a cgroup named `name`.
    pub(super) fn exists(&self, name: &str) -> bool {
        let (Some(Some(dir)), Ok(c)) = (self.root_fds.first(), CString::new(name)) else {
            return self.roots[0].join(name).exists();
        };
        // SAFETY: fstatat writes only into `st`; `c` is NUL-terminated and
        // `dir` open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 }
    }

    /// How many spares are kept now.
    pub(crate) fn len(&self) -> usize {
        self.free.lock().expect("spares lock").len()
    }

    /// Takes a spare, renamed to `name` in every hierarchy, with the
    /// limits it holds and what of it is open; `None` when there is none
    /// (or a rename failed, and the spare was removed).
    pub(super) fn take(&self, name: &str) -> Option<(Applied, Open)> {
        let (spare, applied, open) = self.free.lock().expect("spares lock").pop()?;
        self.rename_all(&spare, name).then_some((applied, open))
    }

    /// Keeps `cg` (whose limits are `applied`) as a spare if nothing of
    /// its attempt can reach the next one; otherwise returns `false` and
    /// leaves it as it is. A rename that fails part-way removes it under
    /// both names.
    pub(super) fn put(&self, cg: &TaskCgroup, applied: &Applied) -> bool {
        if self.len() >= SPARES_MAX || !self.clean(cg, applied) {
            return false;
        }
        let spare = format!("{PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
        // Every other copy of `cg` loses its handles: a stale copy must
        // not reach the attempt that reuses the cgroup.
        let open = cg.give_away().unwrap_or_default();
        if !self.rename_all(cg.name(), &spare) {
            return true;
        }
        let mut free = self.free.lock().expect("spares lock");
        free.push((spare, applied.clone(), open));
        true
    }

    /// Removes every spare (a clean shutdown).
    pub(super) fn clear(&self) {
        let spares = std::mem::take(&mut *self.free.lock().expect("spares lock"));
        for (name, ..) in spares {
            for root in &self.roots {
                super::task::remove_tree(&root.join(&name));
            }
        }
    }

    /// Renames `from` to `to` under each root; on a failure part-way,
    /// removes both names' directories and returns `false`.
    fn rename_all(&self, from: &str, to: &str) -> bool {
        for (i, root) in self.roots.iter().enumerate() {
            if let Err(e) = self.rename(i, from, to) {
                tracing::debug!(dir = %root.join(from).display(), error = %e, "cannot rename a cgroup");
                for r in &self.roots {
                    super::task::remove_tree(&r.join(from));
                    super::task::remove_tree(&r.join(to));
                }
                return false;
            }
        }
        true
    }

    /// Renames `from` to `to` under root `i`.
    fn rename(&self, i: usize, from: &str, to: &str) -> std::io::Result<()> {
        let (Some(Some(dir)), Ok(f), Ok(t)) = (self.root_fds.get(i), CString::new(from), CString::new(to)) else {
            return fs::rename(self.roots[i].join(from), self.roots[i].join(to));
        };
        let dir = dir.as_raw_fd();
        // SAFETY: both names are NUL-terminated and `dir` is open.
        if unsafe { libc::renameat(dir, f.as_ptr(), dir, t.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether `cg` may be handed to another attempt (see the module's
    /// doc).
    fn clean(&self, cg: &TaskCgroup, applied: &Applied) -> bool {
        let read = |controller: &str, file: &'static str| cg.read(controller, file);
        let num =
            |controller: &str, file: &'static str| read(controller, file).and_then(|s| s.trim().parse::<i64>().ok());
        // The kernel's "no limit" reads as the page-rounded i64::MAX.
        let unlimited = |v: Option<i64>| v.is_some_and(|v| v >= 1 << 62);
        let limit = |v: Option<i64>, want: u64| match want {
            0 => unlimited(v),
            w => v == Some(w as i64),
        };
        let oom = read("memory", "memory.oom_control").unwrap_or_default();
        let oom_field = |key: &str| {
            oom.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' '))).map(|v| v.trim() == "0")
        };
        (0..cg.dirs.len()).all(|i| !cg.has_subdirs(i))
            && cg.is_empty()
            && oom_field("oom_kill_disable") == Some(true)
            && oom_field("oom_kill").unwrap_or(true)
            && num("memory", "memory.usage_in_bytes").is_some_and(|u| (u as u64) <= SPARE_MEMORY_MAX)
            && limit(num("memory", "memory.limit_in_bytes"), applied.mem_bytes)
            && (!self.has_swap_limit || limit(num("memory", "memory.memsw.limit_in_bytes"), applied.mem_bytes))
            && unlimited(num("memory", "memory.soft_limit_in_bytes"))
            && num("pids", "pids.max") == Some(applied.pids as i64)
            && match applied.cpu_quota_us {
                0 => num("cpu", "cpu.cfs_quota_us") == Some(-1),
                q => num("cpu", "cpu.cfs_quota_us") == Some(q as i64),
            }
            && num("cpu", "cpu.cfs_period_us") == Some(100_000)
            && num("cpu", "cpu.shares") == Some(1024)
            && read("freezer", "freezer.state").is_some_and(|s| s.trim() == "THAWED")
    }
}
