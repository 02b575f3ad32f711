//! Keeps a node's work dir from filling its disk.
//!
//! ```text
//!   WORK_DIR/checkpoints/alloc-A-task-T/            removed once no attempt of (A, T) is here
//!   WORK_DIR/checkpoints/spare/                     emptied ones, reused by the next tasks
//!   WORK_DIR/logs/alloc-A/task-T/attempt-N.out       removed after the log retention,
//!   WORK_DIR/logs/alloc-A/task-T/attempt-N.err       or oldest first while the work
//!   WORK_DIR/logs/alloc-A/task-T/attempt-N.hostfile  dir is over its size cap; never
//!   WORK_DIR/logs/alloc-A/task-T/attempt-N.progress  a running attempt's
//!   WORK_DIR/containers/A-T-N/                      an image task's writable layer: removed
//!                                                   (its root detached first) once attempt
//!                                                   N of (A, T) is not running here
//! ```
//!
//! A checkpoint directory is a working copy: whatever a task left there that
//! matters was uploaded (at its exit or its preemption) and is in the
//! replicated state, and every new attempt unpacks the stored checkpoint
//! into a fresh directory or starts it empty. So a directory no attempt on
//! this node uses is never needed again.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The janitor's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JanitorConfig {
    /// Attempt logs and progress files older than this are removed.
    pub log_retention: Duration,
    /// The work dir's size cap in bytes: over it, the oldest logs of attempts
    /// not running are removed first (`None`: no cap).
    pub max_bytes: Option<u64>,
    /// How often it sweeps.
    pub every: Duration,
}

impl Default for JanitorConfig {
    fn default() -> Self {
        JanitorConfig {
            log_retention: Duration::from_secs(7 * 86_400),
            max_bytes: None,
            every: Duration::from_secs(60),
        }
    }
}

/// When a session's first sweep comes, after it connects: a point within
/// one interval fixed by the node's id. Every agent of a fleet connects at
/// about the same moment (a leader's election moves every stream at once),
/// and sweeps that all fell on the same second would stall every node's
/// stream together while they ran (the fleet bench saw 10,000 sweeps at
/// once fence half the agents); spread this way, a node sweeps once per
/// interval, each at its own point of it.
pub fn first_sweep_after(node_id: &str, every: Duration) -> Duration {
    point_in(node_id, every)
}

/// A point of `window` fixed by `key`: the same every time (SipHash with
/// fixed keys), and a fleet's keys fall evenly over the window. Zero for
/// an empty window.
pub fn point_in(key: impl std::hash::Hash, window: Duration) -> Duration {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(if ms == 0 { 0 } else { h.finish() % ms })
}

/// What the agent uses now: attempts it runs, and (allocation, task) pairs
/// with an attempt here it runs, was assigned or has not had confirmed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InUse {
    /// (allocation, task): their checkpoint directories stay.
    pub tasks: BTreeSet<(u64, u32)>,
    /// (allocation, task, attempt): their logs and progress files stay.
    pub attempts: BTreeSet<(u64, u32, u32)>,
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Checkpoint directories removed.
    pub checkpoints_removed: u64,
    /// Attempts whose logs and progress files were removed.
    pub logs_removed: u64,
    /// Container directories of attempts not running (an agent that died
    /// before its attempt's end removed them) removed.
    pub containers_removed: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
    /// The work dir's size after the sweep (checkpoints, logs, progress).
    pub work_dir_bytes: u64,
}

/// How old a container directory of an attempt not running must be before
/// a sweep removes it.
pub const CONTAINER_GRACE: Duration = Duration::from_secs(600);

/// One attempt's files.
#[derive(Default)]
struct AttemptFiles {
    paths: Vec<PathBuf>,
    bytes: u64,
    newest: Option<SystemTime>,
}

/// `alloc-A` → A, `task-T` → T, `attempt-N[.ext]` → N.
fn number(name: &str, prefix: &str) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?;
    let digits = rest.split('.').next()?;
    digits.parse().ok()
}

/// The `ROOT/alloc-A` directories, and the `(A, T, dir)` of every
/// `ROOT/alloc-A/task-T` directory in them except the empty ones of tasks
/// not in `in_use`, which go: a task's log directory is empty when its
/// task wrote no log (or its logs went in an earlier sweep), and one
/// `rmdir` is cheaper than listing it now and again after the removals.
/// The directory of a task in use stays: its attempt may create its
/// progress file there at any moment.
type LogDirs = (Vec<PathBuf>, Vec<(u64, u32, PathBuf)>);
fn task_dirs(root: &Path, in_use: &BTreeSet<(u64, u32)>) -> io::Result<LogDirs> {
    let (mut allocs_found, mut out) = (Vec::new(), Vec::new());
    let Ok(allocs) = fs::read_dir(root) else { return Ok((allocs_found, out)) };
    for a in allocs {
        let a = a?;
        let Some(alloc) = a.file_name().to_str().and_then(|n| number(n, "alloc-")) else { continue };
        let Ok(tasks) = fs::read_dir(a.path()) else { continue };
        for t in tasks {
            let t = t?;
            let Some(task) = t.file_name().to_str().and_then(|n| number(n, "task-")) else { continue };
            let task = task as u32;
            if !in_use.contains(&(alloc, task)) && fs::remove_dir(t.path()).is_ok() {
                continue;
            }
            out.push((alloc, task, t.path()));
        }
        allocs_found.push(a.path());
    }
    Ok((allocs_found, out))
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Removes the log directories [`task_dirs`] listed that are empty now,
/// except those of tasks in use, then their `alloc-A` directories that
/// are empty.
fn prune_empty((allocs, tasks): LogDirs, in_use: &BTreeSet<(u64, u32)>) {
    for (alloc, task, dir) in tasks {
        if !in_use.contains(&(alloc, task)) {
            let _ = fs::remove_dir(dir); // only if empty
        }
    }
    for dir in allocs {
        let _ = fs::remove_dir(dir); // only if empty
    }
}

/// Sweeps `work_dir` once at `now`.
pub fn sweep(work_dir: &Path, in_use: &InUse, now: SystemTime, cfg: &JanitorConfig) -> io::Result<Sweep> {
    let mut done = Sweep::default();
    // Checkpoint directories no attempt here uses.
    let mut checkpoint_bytes = 0;
    let checkpoints = fs::read_dir(work_dir.join("checkpoints")).into_iter().flatten().flatten();
    for entry in checkpoints {
        let Some((alloc, task)) = entry.file_name().to_str().and_then(crate::checkpoint::parse_dir_name) else {
            continue;
        };
        let dir = entry.path();
        let bytes = dir_bytes(&dir);
        if in_use.tasks.contains(&(alloc, task)) {
            checkpoint_bytes += bytes;
        } else {
            crate::checkpoint::retire(&dir);
            if !dir.exists() {
                done.checkpoints_removed += 1;
                done.bytes_freed += bytes;
            }
        }
    }
    // Every attempt's logs, host file and progress file, by (A, T, N).
    let mut attempts: BTreeMap<(u64, u32, u32), AttemptFiles> = BTreeMap::new();
    let log_dirs = task_dirs(&work_dir.join("logs"), &in_use.tasks)?;
    for &(alloc, task, ref dir) in &log_dirs.1 {
        for f in fs::read_dir(dir)?.flatten() {
            let Some(n) = f.file_name().to_str().and_then(|n| number(n, "attempt-")) else { continue };
            let Ok(meta) = f.metadata() else { continue };
            let entry = attempts.entry((alloc, task, n as u32)).or_default();
            entry.paths.push(f.path());
            entry.bytes += meta.len();
            let modified = meta.modified().unwrap_or(now);
            entry.newest = Some(entry.newest.map_or(modified, |m| m.max(modified)));
        }
    }
    let remove = |key: &(u64, u32, u32), files: &AttemptFiles, done: &mut Sweep| {
        for p in &files.paths {
            let _ = fs::remove_file(p);
        }
        done.logs_removed += 1;
        done.bytes_freed += files.bytes;
        tracing::debug!(alloc = key.0, task = key.1, attempt = key.2, bytes = files.bytes, "removed an attempt's logs");
    };
    let cutoff = now.checked_sub(cfg.log_retention).unwrap_or(SystemTime::UNIX_EPOCH);
    let mut kept: Vec<((u64, u32, u32), AttemptFiles)> = Vec::new();
    for (key, files) in attempts {
        let running = in_use.attempts.contains(&key);
        if !running && files.newest.is_some_and(|m| m < cutoff) {
            remove(&key, &files, &mut done);
        } else {
            kept.push((key, files));
        }
    }
    // Over the cap: the oldest logs of attempts not running go first.
    let mut total = checkpoint_bytes + kept.iter().map(|(_, f)| f.bytes).sum::<u64>();
    if let Some(max) = cfg.max_bytes
        && total > max
    {
        kept.sort_by_key(|(key, f)| (f.newest, *key));
        let mut rest = Vec::new();
        for (key, files) in kept {
            if total > max && !in_use.attempts.contains(&key) {
                total -= files.bytes;
                remove(&key, &files, &mut done);
            } else {
                rest.push((key, files));
            }
        }
        if total > max {
            tracing::warn!(
                bytes = total,
                max,
                "the work dir is over its cap with only running tasks' logs and checkpoints left"
            );
        }
    }
    // Image tasks' writable layers whose attempt is not running here.
    for entry in fs::read_dir(work_dir.join("containers")).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let key = name.to_str().and_then(|n| {
            let mut parts = n.splitn(3, '-');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
        });
        // Younger than the grace: an attempt started after `in_use` was
        // taken may be making it now.
        let young = entry.metadata().and_then(|m| m.modified()).is_ok_and(|m| m + CONTAINER_GRACE > now);
        if let Some(key) = key
            && !in_use.attempts.contains(&key)
            && !young
        {
            let bytes = dir_bytes(&entry.path());
            if crate::container::remove_attempt_dirs(&entry.path()).is_ok() {
                done.containers_removed += 1;
                done.bytes_freed += bytes;
            }
        }
    }
    prune_empty(log_dirs, &in_use.tasks);
    done.work_dir_bytes = total;
    Ok(done)
}

/// Parses a size: `500M`, `50G`, `2T`, `1048576` (bytes); binary units.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 500M, 50G)"))?;
    let mult: u64 = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{s:?}: the unit must be K, M, G or T")),
    };
    n.checked_mul(mult).filter(|v| *v > 0).ok_or_else(|| format!("{s:?} is not a size above zero"))
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// A fleet's first sweeps spread over the interval, not on one moment:
    /// 10,000 nodes named in sequence fill each tenth of a minute with
    /// about a tenth of them; each node's offset is within the interval and
    /// the same on every connection.
    #[test]
    fn a_fleets_first_sweeps_spread_over_the_interval() {
        let every = Duration::from_secs(60);
        let mut tenths = [0u32; 10];
        for i in 0..10_000 {
            let id = format!("node-{i:05}");
            let at = first_sweep_after(&id, every);
            assert!(at < every, "{id}: {at:?}");
            assert_eq!(at, first_sweep_after(&id, every), "{id}: the same offset each time");
            tenths[(at.as_millis() / 6_000) as usize] += 1;
        }
        assert!(tenths.iter().all(|&n| (800..=1_200).contains(&n)), "{tenths:?}");
        assert_eq!(first_sweep_after("n", Duration::ZERO), Duration::ZERO);
    }

    /// Writes `bytes` bytes to `path`, last modified `age` before `now`.
    fn file(path: &Path, bytes: usize, now: SystemTime, age: Duration) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, vec![b'x'; bytes]).unwrap();
        File::options().write(true).open(path).unwrap().set_modified(now - age).unwrap();
    }

    fn attempt(work: &Path, a: u64, t: u32, n: u32, bytes: usize, now: SystemTime, age: Duration) {
        let logs = work.join("logs").join(format!("alloc-{a}")).join(format!("task-{t}"));
        file(&logs.join(format!("attempt-{n}.out")), bytes, now, age);
        file(&logs.join(format!("attempt-{n}.err")), bytes, now, age);
        file(&logs.join(format!("attempt-{n}.progress")), 1, now, age);
    }

    fn exists(work: &Path, a: u64, t: u32, n: u32) -> bool {
        work.join("logs").join(format!("alloc-{a}")).join(format!("task-{t}")).join(format!("attempt-{n}.out")).exists()
    }

    #[test]
    fn old_logs_go_recent_and_running_ones_stay_and_unused_checkpoints_go() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        let now = SystemTime::now();
        attempt(work, 1, 0, 1, 10, now, 8 * DAY); // old, finished
        attempt(work, 1, 0, 2, 10, now, DAY); // recent
        attempt(work, 2, 0, 1, 10, now, 30 * DAY); // old but running
        file(&work.join("checkpoints/alloc-1-task-0/state.pt"), 100, now, DAY);
        file(&work.join("checkpoints/alloc-2-task-0/state.pt"), 100, now, DAY);
        let in_use = InUse { tasks: [(2, 0)].into(), attempts: [(2, 0, 1)].into() };
        let s = sweep(work, &in_use, now, &JanitorConfig::default()).unwrap();
        assert_eq!((s.checkpoints_removed, s.logs_removed), (1, 1));
        assert!(!exists(work, 1, 0, 1) && exists(work, 1, 0, 2) && exists(work, 2, 0, 1));
        assert!(!work.join("logs/alloc-1/task-0/attempt-1.progress").exists());
        assert!(!work.join("checkpoints/alloc-1-task-0").exists());
        assert!(work.join("checkpoints/alloc-2-task-0/state.pt").exists());
        assert_eq!(s.work_dir_bytes, 100 + 21 + 21);
        assert_eq!(s.bytes_freed, 100 + 21);
        // The recent attempt's logs age out: its directory and its
        // allocation's go in the same sweep.
        let s = sweep(work, &in_use, now + 7 * DAY, &JanitorConfig::default()).unwrap();
        assert_eq!(s.logs_removed, 1);
        assert!(!work.join("logs/alloc-1").exists() && exists(work, 2, 0, 1));
    }

    /// An image task's writable layer is left only by an agent that died
    /// mid-attempt: the sweep removes it once the attempt is not running,
    /// and keeps a running one's.
    #[test]
    fn container_dirs_of_attempts_not_running_go() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        let now = SystemTime::now();
        file(&work.join("containers/1-0-1/upper/tmp/scratch"), 50, now, DAY);
        file(&work.join("containers/2-0-1/upper/tmp/scratch"), 50, now, DAY);
        file(&work.join("containers/not-an-attempt/x"), 1, now, DAY);
        file(&work.join("containers/3-0-1/plan.json"), 1, now, Duration::ZERO);
        for d in ["1-0-1", "2-0-1", "not-an-attempt"] {
            fs::File::open(work.join("containers").join(d)).unwrap().set_modified(now - DAY).unwrap();
        }
        let in_use = InUse { tasks: [(2, 0)].into(), attempts: [(2, 0, 1)].into() };
        let s = sweep(work, &in_use, now, &JanitorConfig::default()).unwrap();
        assert_eq!(s.containers_removed, 1);
        assert!(!work.join("containers/1-0-1").exists(), "the finished attempt's layer went");
        assert!(work.join("containers/2-0-1/upper/tmp/scratch").exists(), "the running one's stayed");
        assert!(work.join("containers/not-an-attempt/x").exists(), "what the janitor does not know stays");
        assert!(work.join("containers/3-0-1/plan.json").exists(), "one just made may be an attempt starting now");
    }

    /// A running task's checkpoint directory is often empty until it is
    /// asked to stop, and its log directory holds its progress file, which
    /// it may create at any moment: removing them would make its writes fail.
    #[test]
    fn a_running_tasks_empty_directories_stay() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        for (a, t) in [(1, 1), (1, 2), (2, 0)] {
            fs::create_dir_all(crate::checkpoint::dir(work, a, t)).unwrap();
            fs::create_dir_all(work.join("logs").join(format!("alloc-{a}/task-{t}"))).unwrap();
        }
        let in_use = InUse { tasks: [(1, 1)].into(), attempts: [(1, 1, 1)].into() };
        let s = sweep(work, &in_use, SystemTime::now(), &JanitorConfig::default()).unwrap();
        assert!(crate::checkpoint::dir(work, 1, 1).is_dir() && work.join("logs/alloc-1/task-1").is_dir());
        assert!(!work.join("logs/alloc-1/task-2").exists(), "an empty directory of a task not in use goes");
        assert!(!crate::checkpoint::dir(work, 2, 0).exists() && !work.join("logs/alloc-2").exists());
        assert_eq!(s.checkpoints_removed, 2);
    }

    #[test]
    fn over_the_cap_the_oldest_logs_go_first_but_never_a_running_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        let now = SystemTime::now();
        attempt(work, 1, 0, 1, 1000, now, Duration::from_secs(300)); // running, oldest
        attempt(work, 2, 0, 1, 1000, now, Duration::from_secs(200));
        attempt(work, 3, 0, 1, 1000, now, Duration::from_secs(100));
        attempt(work, 4, 0, 1, 1000, now, Duration::from_secs(10));
        let in_use = InUse { tasks: [(1, 0)].into(), attempts: [(1, 0, 1)].into() };
        let cfg = JanitorConfig { max_bytes: Some(4_500), ..JanitorConfig::default() };
        let s = sweep(work, &in_use, now, &cfg).unwrap();
        // 4 × 2001 bytes: two must go, the oldest two not running (2, 3).
        assert_eq!(s.logs_removed, 2);
        assert!(exists(work, 1, 0, 1) && !exists(work, 2, 0, 1) && !exists(work, 3, 0, 1) && exists(work, 4, 0, 1));
        assert!(s.work_dir_bytes <= 4_500);
        // Only running work left over the cap: it stays.
        let cfg = JanitorConfig { max_bytes: Some(1), ..cfg };
        let in_use = InUse { tasks: [(1, 0)].into(), attempts: [(1, 0, 1), (4, 0, 1)].into() };
        let s = sweep(work, &in_use, now, &cfg).unwrap();
        assert_eq!(s.logs_removed, 0);
        assert!(exists(work, 1, 0, 1) && exists(work, 4, 0, 1));
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("50G"), Ok(50 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("8kb"), Ok(8 << 10));
        for bad in ["", "G", "5X", "0", "-1G", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
