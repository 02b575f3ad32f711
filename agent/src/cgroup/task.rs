//! One attempt's cgroup: joining it, signalling and killing everything in
//! it, its usage, its removal.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::files::{self, Handles};
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
    /// Its directories and files held open ([`files`]).
    pub(super) handles: Handles,
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
    pub(super) fn set(&self, controller: &str, file: &'static str, value: &str) -> Result<(), String> {
        let i = self.hierarchy(controller);
        self.handles
            .write(i, &self.dirs[i].1, file, value)
            .map_err(|e| format!("cannot set {} to {value:?}: {e}", self.dirs[i].1.join(file).display()))
    }

    /// The text of `file` of the hierarchy holding `controller` (a small
    /// file: a counter, a limit, a state).
    pub(super) fn read(&self, controller: &str, file: &'static str) -> Option<String> {
        let i = self.hierarchy(controller);
        self.handles.file(i, &self.dirs[i].1, file, false).and_then(|f| files::read_small(&f)).ok()
    }

    /// The index of the hierarchy holding `controller` (the first if none
    /// does).
    fn hierarchy(&self, controller: &str) -> usize {
        self.dirs.iter().position(|(c, _)| c.contains(controller)).unwrap_or(0)
    }

    /// The directory of the hierarchy holding `controller`.
    #[cfg(test)]
    pub(super) fn dir_of(&self, controller: &str) -> PathBuf {
        self.dirs[self.hierarchy(controller)].1.clone()
    }

    /// Whether hierarchy `i`'s directory holds cgroups of its own (`true`
    /// where that cannot be told).
    pub(super) fn has_subdirs(&self, i: usize) -> bool {
        self.handles.links(i, &self.dirs[i].1).map_or(true, |n| n != 2)
    }

    /// Gives its handles away (it becomes a spare): every copy of it goes
    /// back to paths.
    pub(super) fn give_away(&self) -> Option<files::Open> {
        self.handles.give_away()
    }

    /// Whether it exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().all(|(_, d)| d.join("cgroup.procs").exists())
    }

    /// The `cgroup.procs` file of each hierarchy, opened for writing, for a
    /// child to join with before it execs (see [`join_from_child`]).
    pub fn join_files(&self) -> io::Result<Vec<Arc<fs::File>>> {
        self.dirs
            .iter()
            .enumerate()
            .map(|(i, (_, d))| {
                self.handles
                    .file(i, d, "cgroup.procs", true)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.join("cgroup.procs").display())))
            })
            .collect()
    }

    /// Every process in it (and in any cgroup below it), by pid.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = BTreeSet::new();
        // The freezer's (v1) or the one hierarchy's (v2) view: every
        // process joins every hierarchy together.
        let i = self.hierarchy("freezer");
        let dir = &self.dirs[i].1;
        if let Ok(text) = self.handles.fresh(i, dir, "cgroup.procs").and_then(|f| files::read_all(&f)) {
            add_pids(&text, &mut pids);
        }
        if self.has_subdirs(i) {
            collect_below(dir, &mut pids, 0);
        }
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
            // (v2 has one hierarchy.)
            let _ = self.set("pids", "cgroup.kill", "1");
            return;
        }
        let (freeze, frozen, thaw, state) = match self.version {
            Version::V1 => ("freezer.state", "FROZEN", "THAWED", "freezer.state"),
            Version::V2 => ("cgroup.freeze", "1", "0", "cgroup.events"),
        };
        let froze = self.set("freezer", freeze, frozen).is_ok();
        if froze {
            for _ in 0..50 {
                let s = self.read("freezer", state).unwrap_or_default();
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
            let _ = self.set("freezer", freeze, thaw);
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
        let read = |controller: &str, file: &'static str| self.read(controller, file).unwrap_or_default();
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
        self.give_away();
        for (_, dir) in &self.dirs {
            remove_tree(dir);
        }
    }
}

/// Adds the pids a `cgroup.procs` lists.
fn add_pids(text: &str, pids: &mut BTreeSet<i32>) {
    pids.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
}

/// The pids of the cgroups below `dir` (and below those).
fn collect_below(dir: &Path, pids: &mut BTreeSet<i32>, depth: u32) {
    if depth > 8 {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let sub = e.path();
                if let Ok(text) = fs::read_to_string(sub.join("cgroup.procs")) {
                    add_pids(&text, pids);
                }
                if has_subdirs(&sub) {
                    collect_below(&sub, pids, depth + 1);
                }
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
