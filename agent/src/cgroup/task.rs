//! One attempt's cgroup: joining it, signalling and killing everything in
//! it, its usage, its removal.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::spare::{Applied, Spares};
use super::{Usage, Version};

/// One attempt's cgroup: a directory in each hierarchy.
#[derive(Clone, Debug)]
pub struct TaskCgroup {
    pub(super) version: Version,
    pub(super) name: String,
    pub(super) dirs: Vec<(BTreeSet<String>, PathBuf)>,
    pub(super) has_kill: bool,
    /// The limits written to it, where the agent made it (`None`: found,
    /// as an earlier agent's attempt).
    pub(super) applied: Option<Applied>,
    /// Where it goes once empty, to be reused (v1).
    pub(super) spares: Option<Arc<Spares>>,
}

/// How often a stop checks that an attempt's cgroup is empty.
const EMPTY_POLL: Duration = Duration::from_millis(10);

impl TaskCgroup {
    /// Its name under the agent's subtree.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its directories, one per hierarchy.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Writes `value` to `file` of the hierarchy holding `controller`.
    pub(super) fn set(&self, controller: &str, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir_of(controller).join(file);
        fs::write(&path, value).map_err(|e| format!("cannot set {} to {value:?}: {e}", path.display()))
    }

    pub(super) fn dir_of(&self, controller: &str) -> PathBuf {
        self.dirs
            .iter()
            .find(|(c, _)| c.contains(controller))
            .map_or_else(|| self.dirs[0].1.clone(), |(_, d)| d.clone())
    }

    /// Whether it exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().all(|(_, d)| d.join("cgroup.procs").exists())
    }

    /// The `cgroup.procs` file of each hierarchy, opened for writing, for a
    /// child to join with before it execs (see [`join_from_child`]).
    pub fn join_files(&self) -> io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|(_, d)| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(OwnedFd::from)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.join("cgroup.procs").display())))
            })
            .collect()
    }

    /// Every process in it (and in any cgroup below it), by pid.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = BTreeSet::new();
        // The freezer's (v1) or the one hierarchy's (v2) view: every
        // process joins every hierarchy together.
        let dir = self.dir_of("freezer");
        collect_pids(&dir, &mut pids, 0);
        pids.into_iter().collect()
    }

    /// Whether no process is left in it.
    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Sends `signal` to every process in it.
    pub fn signal_all(&self, signal: i32) {
        for pid in self.pids() {
            // SAFETY: kill has no memory-safety preconditions; a pid gone
            // meanwhile gives ESRCH.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Kills every process in it once: `cgroup.kill` on v2; on v1 (or a
    /// v2 kernel without it), freeze, SIGKILL each pid, thaw, so that no
    /// process forks past the kill.
    pub async fn kill_once(&self) {
        if self.version == Version::V2 && self.has_kill {
            let _ = fs::write(self.dirs[0].1.join("cgroup.kill"), "1");
            return;
        }
        let (freeze, frozen, thaw, state) = match self.version {
            Version::V1 => ("freezer.state", "FROZEN", "THAWED", "freezer.state"),
            Version::V2 => ("cgroup.freeze", "1", "0", "cgroup.events"),
        };
        let dir = self.dir_of("freezer");
        let froze = fs::write(dir.join(freeze), frozen).is_ok();
        if froze {
            for _ in 0..50 {
                let s = fs::read_to_string(dir.join(state)).unwrap_or_default();
                let done = match self.version {
                    Version::V1 => s.trim() == "FROZEN",
                    Version::V2 => s.lines().any(|l| l.trim() == "frozen 1"),
                };
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        self.signal_all(libc::SIGKILL);
        if froze {
            let _ = fs::write(dir.join(freeze), thaw);
        }
    }

    /// Kills everything in it and waits until it is empty. A process that
    /// cannot die at once (in an uninterruptible sleep, on a hung device)
    /// keeps the wait going: its capacity is not free until it is gone.
    pub async fn kill_all(&self) {
        let mut round = 0u64;
        loop {
            if self.is_empty() {
                return;
            }
            self.kill_once().await;
            if self.is_empty() {
                return;
            }
            round += 1;
            if round.is_multiple_of(3000) {
                tracing::warn!(cgroup = %self.name, pids = ?self.pids(), "processes of a stopped attempt are still dying");
            }
            tokio::time::sleep(EMPTY_POLL).await;
        }
    }

    /// What it used: peak memory, CPU time, OOM kills, its memory limit.
    pub fn usage(&self) -> Usage {
        let read =
            |controller: &str, file: &str| fs::read_to_string(self.dir_of(controller).join(file)).unwrap_or_default();
        let num = |s: &str| s.trim().parse::<u64>().unwrap_or(0);
        let field = |text: &str, key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' '))).map_or(0, num)
        };
        match self.version {
            Version::V1 => {
                let limit = num(&read("memory", "memory.limit_in_bytes"));
                Usage {
                    peak_memory_bytes: num(&read("memory", "memory.max_usage_in_bytes")),
                    cpu_ns: num(&read("cpuacct", "cpuacct.usage")),
                    oom_kills: field(&read("memory", "memory.oom_control"), "oom_kill"),
                    // The "no limit" value is the page-rounded i64::MAX.
                    memory_limit_bytes: if limit >= 1 << 62 { 0 } else { limit },
                    memory_bytes: num(&read("memory", "memory.usage_in_bytes")),
                }
            }
            Version::V2 => Usage {
                peak_memory_bytes: num(&read("memory", "memory.peak")),
                cpu_ns: field(&read("cpu", "cpu.stat"), "usage_usec").saturating_mul(1000),
                oom_kills: field(&read("memory", "memory.events"), "oom_kill"),
                memory_limit_bytes: num(&read("memory", "memory.max")),
                memory_bytes: num(&read("memory", "memory.current")),
            },
        }
    }

    /// Removes it (it must be empty): kept as a spare for a later attempt
    /// where it can be ([`super::spare`]), its directories removed
    /// otherwise.
    pub fn remove(&self) {
        if let (Some(spares), Some(applied)) = (&self.spares, &self.applied)
            && spares.put(self, applied)
        {
            return;
        }
        for (_, dir) in &self.dirs {
            remove_tree(dir);
        }
    }
}

/// The pids of `dir`'s `cgroup.procs` and its sub-cgroups'.
fn collect_pids(dir: &Path, pids: &mut BTreeSet<i32>, depth: u32) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    if depth > 8 || !has_subdirs(dir) {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), pids, depth + 1);
            }
        }
    }
}

/// Whether a directory holds others: its link count (2 + subdirectories,
/// on cgroupfs as on disk file systems) says so without listing the
/// dozens of files a cgroup shows.
pub(super) fn has_subdirs(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(dir).map_or(true, |m| m.nlink() != 2)
}

/// Removes a cgroup directory and any below it, deepest first (cgroupfs
/// removes a directory with `rmdir`, whatever files it shows).
pub(super) fn remove_tree(dir: &Path) {
    // Most attempts make no cgroups of their own: one rmdir, no listing.
    if fs::remove_dir(dir).is_ok() {
        return;
    }
    if has_subdirs(dir)
        && let Ok(entries) = fs::read_dir(dir)
    {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    if let Err(e) = fs::remove_dir(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot remove a cgroup");
    }
}
