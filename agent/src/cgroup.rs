//! Containment: a cgroup per attempt, made by the agent, so that nothing a
//! task starts outlives its stop, and its memory, CPU, process and GPU
//! device limits hold.
//!
//! ```text
//!   detect (mountinfo + /proc/self/cgroup) ──▶ V2 (unified, controllers delegated)
//!                                          └─▶ V1 (memory pids cpu cpuacct devices freezer hierarchies)
//!   agent subtree  <own cgroup>/muster/<node>-<work-dir hash>   (--cgroup-root overrides)
//!   per attempt    <subtree>/a<alloc>-t<task>-e<epoch>
//!       limits:  memory (hard, swap off)  cpu quota  pids.max  devices (v1: others' GPUs denied)
//!       join:    the child writes "0" to each cgroup.procs before exec (no fork escapes the move)
//!       stop:    v2 cgroup.kill │ v1 freeze → SIGKILL every pid → thaw; repeated until empty
//!       end:     usage (peak memory, CPU time, OOM kills) read, then the directories removed
//! ```
//!
//! Every path below the mount points is derived from the attempt's key, so
//! an agent restarted with the same work dir finds an attempt's processes
//! through its cgroup, whatever became of the process group it started.
//!
//! The v2 code paths are unit-tested against a fake cgroupfs tree
//! ([`Isolation::from_parts`]); the v1 paths run against this machine's real
//! hierarchies in the executor's and the agent's tests.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup layout the node has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// Separate per-controller hierarchies (v1, or hybrid with an empty
    /// `unified` mount).
    V1,
    /// The unified hierarchy with controllers delegated.
    V2,
}

impl Version {
    /// The node label value: `cgroup-v1` or `cgroup-v2`.
    pub fn label(self) -> &'static str {
        match self {
            Version::V1 => "cgroup-v1",
            Version::V2 => "cgroup-v2",
        }
    }
}

/// The node label that says how tasks are contained there: `cgroup-v1`,
/// `cgroup-v2`, or `none` for an agent run with `--no-isolation`.
pub use muster_core::sm::ISOLATION_LABEL;

/// The v1 controllers an attempt's cgroup uses; each must be mounted.
const V1_REQUIRED: [&str; 5] = ["memory", "pids", "cpu", "devices", "freezer"];
/// The v2 controllers the agent enables for its subtree; each must be
/// available.
const V2_REQUIRED: [&str; 3] = ["memory", "pids", "cpu"];

/// Every v1 controller name (a mount's other options are not controllers).
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// The most processes an attempt may have when neither the agent nor the
/// task says otherwise.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

/// A GPU's device file, whose access the attempts holding other GPUs are
/// refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// Its path (`/dev/nvidia0`, or any character device registered with
    /// `--gpu-device`).
    pub path: PathBuf,
    /// Its major and minor numbers.
    pub major: u32,
    /// See `major`.
    pub minor: u32,
}

impl GpuDevice {
    /// Reads a character device's numbers.
    pub fn of(path: &Path) -> Result<GpuDevice, String> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.file_type().is_char_device() {
            return Err(format!("{} is not a character device", path.display()));
        }
        let rdev = meta.rdev();
        Ok(GpuDevice { path: path.to_path_buf(), major: libc::major(rdev), minor: libc::minor(rdev) })
    }
}

/// The limits of one attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Hard memory limit, MiB (0: none); swap is off for the task.
    pub mem_mb: u64,
    /// CPU quota in whole cores (0: none).
    pub cpus: u32,
    /// The most processes and threads (0: the agent's default).
    pub pids: u64,
    /// The GPU indices the attempt holds: every other registered GPU device
    /// is refused to it.
    pub gpus: Vec<u32>,
}

/// What an attempt used, read from its cgroup when it ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The most memory it held at once, bytes (0 where the kernel does not
    /// keep the peak).
    pub peak_memory_bytes: u64,
    /// CPU time, user and system, nanoseconds.
    pub cpu_ns: u64,
    /// Processes of it the kernel killed for exceeding its memory limit.
    pub oom_kills: u64,
    /// Its memory limit, bytes (0: none).
    pub memory_limit_bytes: u64,
    /// The memory it holds now, bytes.
    pub memory_bytes: u64,
}

/// One hierarchy the agent uses: the controllers mounted there and the
/// agent's subtree in it.
#[derive(Clone, Debug)]
struct Hierarchy {
    controllers: BTreeSet<String>,
    /// The absolute directory of the agent's subtree.
    root: PathBuf,
}

/// The agent's cgroup subtree, and how it makes each attempt's cgroup.
#[derive(Debug)]
pub struct Isolation {
    version: Version,
    hierarchies: Vec<Hierarchy>,
    /// The GPU device files, in GPU index order.
    gpu_devices: Vec<GpuDevice>,
    /// The pids limit of an attempt that names none.
    pids_default: u64,
    /// What the kernel offers, found on the subtree itself.
    has_swap_limit: bool,
    has_kill: bool,
    /// Where the agent's own process went (v2, out of the cgroup it
    /// delegates to its tasks), if it moved.
    moved_to: Option<PathBuf>,
}

/// How the agent's subtree is chosen.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--cgroup-root`: absolute (from each hierarchy's top) or relative
    /// to the agent's own cgroup. `None`: `muster/<name>` under its own.
    pub root: Option<String>,
    /// The default subtree's last component.
    pub name: String,
    /// GPU device files, in GPU index order.
    pub gpu_devices: Vec<GpuDevice>,
    /// The pids limit of an attempt that names none (0: [`DEFAULT_PIDS_MAX`]).
    pub pids_default: u64,
}

/// A mount from `/proc/self/mountinfo`.
#[derive(Debug)]
struct Mount {
    /// The mount's root within its hierarchy (`/` unless in a container).
    root: String,
    point: PathBuf,
    v2: bool,
    controllers: BTreeSet<String>,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let (root, point) = (unescape(left[3]), PathBuf::from(unescape(left[4])));
        match right[0] {
            "cgroup2" => mounts.push(Mount { root, point, v2: true, controllers: BTreeSet::new() }),
            "cgroup" => {
                let controllers =
                    right[2].split(',').filter(|o| V1_CONTROLLERS.contains(o)).map(str::to_string).collect();
                mounts.push(Mount { root, point, v2: false, controllers });
            }
            _ => {}
        }
    }
    mounts
}

/// mountinfo escapes spaces and the like as `\040`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Some(n) = std::str::from_utf8(&b[i + 1..i + 4]).ok().and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(n);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's cgroup in each hierarchy: (controllers, path); the v2
/// line has no controllers.
fn parse_proc_cgroup(text: &str) -> Vec<(BTreeSet<String>, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            let ctrls = ctrls.split(',').filter(|c| !c.is_empty() && !c.contains('=')).map(str::to_string).collect();
            Some((ctrls, path.to_string()))
        })
        .collect()
}

/// `own` (a cgroup path) as seen inside a mount whose root is `mount_root`.
fn within(own: &str, mount_root: &str) -> String {
    if mount_root == "/" {
        return own.to_string();
    }
    own.strip_prefix(mount_root)
        .map_or_else(|| "/".to_string(), |rest| if rest.is_empty() { "/".into() } else { rest.into() })
}

/// Joins a cgroup path (`/a/b`, or relative) under `base`.
fn join_cg(base: &Path, path: &str) -> PathBuf {
    let mut out = base.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        out.push(part);
    }
    out
}

/// Keeps what a cgroup directory name may hold: letters, digits, `-_.`.
fn sanitize(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    s.trim_start_matches('.').chars().take(64).collect()
}

/// The default subtree name of an agent: its node id and a hash of its
/// work dir, so two agents on one machine never share a subtree.
pub fn default_name(node_id: &str, work_dir: &Path) -> String {
    let dir = fs::canonicalize(work_dir).unwrap_or_else(|_| work_dir.to_path_buf());
    let h = dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    format!("{}-{:08x}", sanitize(node_id), h as u32)
}

/// Why cgroups cannot be used here.
fn unusable(why: impl std::fmt::Display) -> String {
    format!(
        "cannot contain tasks in cgroups: {why} (run the agent as root on a node with cgroups, or start it with --no-isolation)"
    )
}

impl Isolation {
    /// Finds this node's layout and sets up the agent's subtree.
    pub fn detect(opts: &Options) -> Result<Isolation, String> {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").map_err(|e| unusable(format!("/proc/self/mountinfo: {e}")))?;
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| unusable(format!("/proc/self/cgroup: {e}")))?;
        Isolation::from_parts(&mountinfo, &own, Path::new("/"), opts)
    }

    /// [`Isolation::detect`] from the text of mountinfo and
    /// `/proc/self/cgroup`, with every mount point under `prefix` (a fake
    /// tree in tests; `/` for real).
    pub fn from_parts(mountinfo: &str, proc_cgroup: &str, prefix: &Path, opts: &Options) -> Result<Isolation, String> {
        let mounts = parse_mountinfo(mountinfo);
        let own = parse_proc_cgroup(proc_cgroup);
        let at = |p: &Path| prefix.join(p.strip_prefix("/").unwrap_or(p));
        let subtree = |own_path: &str| -> String {
            match &opts.root {
                Some(r) if r.starts_with('/') => r.clone(),
                Some(r) => format!("{}/{r}", own_path.trim_end_matches('/')),
                None => format!("{}/muster/{}", own_path.trim_end_matches('/'), opts.name),
            }
        };
        let v1: Vec<&Mount> = mounts.iter().filter(|m| !m.v2 && !m.controllers.is_empty()).collect();
        let pids_default = if opts.pids_default == 0 { DEFAULT_PIDS_MAX } else { opts.pids_default };
        if v1.iter().any(|m| m.controllers.contains("memory")) {
            let mut hierarchies: Vec<Hierarchy> = Vec::new();
            for c in V1_REQUIRED.iter().chain(["cpuacct"].iter()) {
                let Some(m) = v1.iter().find(|m| m.controllers.contains(*c)) else {
                    if *c == "cpuacct" {
                        continue;
                    }
                    return Err(unusable(format!("the {c} controller is not mounted")));
                };
                if hierarchies.iter().any(|h| h.controllers == m.controllers) {
                    continue;
                }
                let own_path = own.iter().find(|(cs, _)| cs == &m.controllers).map_or("/", |(_, p)| p.as_str());
                let root = join_cg(&at(&m.point), &subtree(&within(own_path, &m.root)));
                hierarchies.push(Hierarchy { controllers: m.controllers.clone(), root });
            }
            let iso = Isolation {
                version: Version::V1,
                hierarchies,
                gpu_devices: opts.gpu_devices.clone(),
                pids_default,
                has_swap_limit: false,
                has_kill: false,
                moved_to: None,
            };
            return iso.set_up();
        }
        let Some(m) = mounts.iter().find(|m| m.v2) else {
            return Err(unusable("no cgroup filesystem is mounted"));
        };
        let top = at(&m.point);
        let available = fs::read_to_string(top.join("cgroup.controllers")).unwrap_or_default();
        if let Some(c) = V2_REQUIRED.iter().find(|c| !available.split_whitespace().any(|a| a == **c)) {
            return Err(unusable(format!("the unified hierarchy at {} offers no {c} controller", m.point.display())));
        }
        let own_path = own.iter().find(|(cs, _)| cs.is_empty()).map_or("/", |(_, p)| p.as_str());
        let own_path = within(own_path, &m.root);
        let root = join_cg(&top, &subtree(&own_path));
        let mut iso = Isolation {
            version: Version::V2,
            hierarchies: vec![Hierarchy { controllers: V2_REQUIRED.iter().map(|c| c.to_string()).collect(), root }],
            gpu_devices: opts.gpu_devices.clone(),
            pids_default,
            has_swap_limit: false,
            has_kill: false,
            moved_to: None,
        };
        iso.delegate_v2(&top, &join_cg(&top, &own_path))?;
        iso.set_up()
    }

    /// v2: controllers are enabled in `cgroup.subtree_control` from the
    /// top down to the agent's subtree. A cgroup that holds processes
    /// cannot enable controllers for its children (the kernel's "no
    /// internal processes" rule), so an agent inside the subtree's path
    /// (systemd's `Delegate=yes` unit) first moves itself into a leaf
    /// `agent` beside it.
    fn delegate_v2(&mut self, top: &Path, own: &Path) -> Result<(), String> {
        let root = self.hierarchies[0].root.clone();
        // (At the top of its mount too: in a container's cgroup namespace
        // the top is the container's cgroup, which is no root.)
        if root.starts_with(own) {
            let leaf = own.join("agent");
            fs::create_dir_all(&leaf).map_err(|e| unusable(format!("{}: {e}", leaf.display())))?;
            fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
                .map_err(|e| unusable(format!("cannot move the agent into {}: {e}", leaf.display())))?;
            self.moved_to = Some(leaf);
        }
        fs::create_dir_all(&root).map_err(|e| unusable(format!("{}: {e}", root.display())))?;
        let enable = V2_REQUIRED.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
        let mut dir = top.to_path_buf();
        let rel: Vec<_> = root.strip_prefix(top).map(|r| r.components().collect()).unwrap_or_default();
        for part in std::iter::once(None).chain(rel.iter().map(Some)) {
            if let Some(p) = part {
                dir.push(p);
            }
            // Above the agent's own cgroup, enabling may be refused: the
            // operator delegates there (or not, and the check below says so).
            let wrote = fs::write(dir.join("cgroup.subtree_control"), &enable);
            if let Err(e) = wrote
                && dir.starts_with(own)
            {
                return Err(unusable(format!("cannot enable {enable} in {}: {e}", dir.display())));
            }
        }
        let on = fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        if let Some(c) = V2_REQUIRED.iter().find(|c| !on.split_whitespace().any(|a| a.trim_start_matches('+') == **c)) {
            return Err(unusable(format!("the {c} controller is not delegated to {}", root.display())));
        }
        Ok(())
    }

    /// Creates the subtree in every hierarchy and finds what the kernel
    /// offers there.
    fn set_up(mut self) -> Result<Isolation, String> {
        for h in &self.hierarchies {
            fs::create_dir_all(&h.root).map_err(|e| unusable(format!("{}: {e}", h.root.display())))?;
            if let Err(e) = fs::metadata(h.root.join("cgroup.procs")) {
                return Err(unusable(format!("{} is not a cgroup: {e}", h.root.display())));
            }
        }
        match self.version {
            Version::V1 => {
                let mem = self.dir_of("memory");
                self.has_swap_limit = mem.join("memory.memsw.limit_in_bytes").exists();
            }
            Version::V2 => {
                let root = &self.hierarchies[0].root;
                self.has_swap_limit = root.join("memory.swap.max").exists();
                self.has_kill = root.join("cgroup.kill").exists();
            }
        }
        Ok(self)
    }

    /// The layout.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The agent's subtree in each hierarchy.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.hierarchies.iter().map(|h| h.root.clone()).collect()
    }

    /// The registered GPU device files.
    pub fn gpu_devices(&self) -> &[GpuDevice] {
        &self.gpu_devices
    }

    /// The subtree of the hierarchy holding `controller`.
    fn dir_of(&self, controller: &str) -> PathBuf {
        self.hierarchies
            .iter()
            .find(|h| h.controllers.contains(controller))
            .map_or_else(|| self.hierarchies[0].root.clone(), |h| h.root.clone())
    }

    /// The name of attempt (`alloc`, `task`, `epoch`)'s cgroup.
    pub fn attempt_name(key: (u64, u32, u64)) -> String {
        format!("a{}-t{}-e{}", key.0, key.1, key.2)
    }

    /// The cgroup of attempt `key`, whether or not it exists.
    pub fn attempt(&self, key: (u64, u32, u64)) -> TaskCgroup {
        let name = Isolation::attempt_name(key);
        self.cgroup_named(&name)
    }

    fn cgroup_named(&self, name: &str) -> TaskCgroup {
        TaskCgroup {
            version: self.version,
            name: name.to_string(),
            dirs: self.hierarchies.iter().map(|h| (h.controllers.clone(), h.root.join(name))).collect(),
            has_kill: self.has_kill,
        }
    }

    /// The attempts' cgroups under the subtree now (by name), for finding
    /// what an earlier agent left.
    pub fn existing(&self) -> Vec<(u64, u32, u64)> {
        let Ok(entries) = fs::read_dir(&self.hierarchies[0].root) else { return Vec::new() };
        let mut keys: Vec<_> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_attempt_name(&e.file_name().to_string_lossy()))
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Creates attempt `key`'s cgroup with `limits`. A leftover of the same
    /// name (an earlier agent's) is emptied and reused.
    pub fn create(&self, key: (u64, u32, u64), limits: &Limits) -> Result<TaskCgroup, String> {
        let cg = self.attempt(key);
        for (_, dir) in &cg.dirs {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        }
        let set = |controller: &str, file: &str, value: &str| -> Result<(), String> {
            let path = cg.dir_of(controller).join(file);
            fs::write(&path, value).map_err(|e| format!("cannot set {} to {value:?}: {e}", path.display()))
        };
        let pids = if limits.pids == 0 { self.pids_default } else { limits.pids };
        set("pids", "pids.max", &pids.to_string())?;
        let bytes = limits.mem_mb.saturating_mul(1024 * 1024);
        match self.version {
            Version::V1 => {
                if limits.mem_mb > 0 {
                    // The swap limit (memory + swap) may not go under the
                    // memory limit: raise both in the order that keeps
                    // that true from any earlier values.
                    if self.has_swap_limit {
                        let _ = fs::write(cg.dir_of("memory").join("memory.memsw.limit_in_bytes"), "-1");
                    }
                    set("memory", "memory.limit_in_bytes", &bytes.to_string())?;
                    if self.has_swap_limit {
                        set("memory", "memory.memsw.limit_in_bytes", &bytes.to_string())?;
                    }
                }
                // Best effort: some kernels refuse it under a parent with
                // a hierarchy; the swap limit above is what holds.
                let _ = fs::write(cg.dir_of("memory").join("memory.swappiness"), "0");
                if limits.cpus > 0 {
                    set("cpu", "cpu.cfs_period_us", "100000")?;
                    set("cpu", "cpu.cfs_quota_us", &(u64::from(limits.cpus) * 100_000).to_string())?;
                }
                for (i, d) in self.gpu_devices.iter().enumerate() {
                    if !limits.gpus.contains(&(i as u32)) {
                        set("devices", "devices.deny", &format!("c {}:{} rwm", d.major, d.minor))?;
                    }
                }
            }
            Version::V2 => {
                if limits.mem_mb > 0 {
                    set("memory", "memory.max", &bytes.to_string())?;
                    if self.has_swap_limit {
                        set("memory", "memory.swap.max", "0")?;
                    }
                }
                if limits.cpus > 0 {
                    set("cpu", "cpu.max", &format!("{} 100000", u64::from(limits.cpus) * 100_000))?;
                }
            }
        }
        Ok(cg)
    }

    /// Removes the agent's subtree if nothing is left in it (a clean
    /// shutdown), and moves the agent back where it started (v2).
    pub fn remove_if_empty(&self) {
        for h in &self.hierarchies {
            let _ = fs::remove_dir(&h.root);
        }
    }
}

/// `a<alloc>-t<task>-e<epoch>`.
fn parse_attempt_name(name: &str) -> Option<(u64, u32, u64)> {
    let rest = name.strip_prefix('a')?;
    let (a, rest) = rest.split_once("-t")?;
    let (t, e) = rest.split_once("-e")?;
    Some((a.parse().ok()?, t.parse().ok()?, e.parse().ok()?))
}

/// One attempt's cgroup: a directory in each hierarchy.
#[derive(Clone, Debug)]
pub struct TaskCgroup {
    version: Version,
    name: String,
    dirs: Vec<(BTreeSet<String>, PathBuf)>,
    has_kill: bool,
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

    fn dir_of(&self, controller: &str) -> PathBuf {
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

    /// Removes its directories (it must be empty).
    pub fn remove(&self) {
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
    if depth > 8 {
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

/// Removes a cgroup directory and any below it, deepest first (cgroupfs
/// removes a directory with `rmdir`, whatever files it shows).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
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

/// Joins the cgroups whose `cgroup.procs` files are `fds`: called in a
/// forked child before it execs. Writing `0` moves the writer, so the
/// process is in its cgroup before it runs a line of the task's code, and
/// nothing it forks can start outside.
///
/// # Safety
/// Only async-signal-safe calls (`write`): fit for `pre_exec`.
pub unsafe fn join_from_child(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: writing a static byte to an open descriptor.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The raw descriptors of `files`, for [`join_from_child`].
pub fn raw_fds(files: &[OwnedFd]) -> Vec<RawFd> {
    files.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_MOUNTINFO: &str = "25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n\
                                30 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n";

    /// A fake unified hierarchy: the files a kernel would show where the
    /// agent reads them.
    fn fake_v2(own: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("sys/fs/cgroup");
        fs::create_dir_all(&top).unwrap();
        fs::write(top.join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n").unwrap();
        fs::write(top.join("cgroup.procs"), "").unwrap();
        (dir, format!("0::{own}\n"))
    }

    /// The subtree files a v2 kernel shows once the parent delegates.
    fn kernel_files(dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        for f in ["cgroup.procs", "cgroup.kill", "memory.swap.max", "cgroup.subtree_control"] {
            fs::write(dir.join(f), "").unwrap();
        }
    }

    fn opts() -> Options {
        Options { name: "n1-0000abcd".into(), ..Options::default() }
    }

    #[test]
    fn v2_delegates_controllers_down_to_the_subtree_and_sets_each_limit() {
        let (dir, own) = fake_v2("/");
        let top = dir.path().join("sys/fs/cgroup");
        kernel_files(&top.join("muster/n1-0000abcd"));
        let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap();
        assert_eq!(iso.version(), Version::V2);
        assert_eq!(iso.roots(), vec![top.join("muster/n1-0000abcd")]);
        // Its own cgroup (here the top) is where the subtree goes: the
        // agent left it for a leaf, so the top may enable controllers.
        assert_eq!(iso.moved_to, Some(top.join("agent")));
        for d in [top.clone(), top.join("muster"), top.join("muster/n1-0000abcd")] {
            assert_eq!(fs::read_to_string(d.join("cgroup.subtree_control")).unwrap(), "+memory +pids +cpu", "{d:?}");
        }
        let limits = Limits { mem_mb: 512, cpus: 2, pids: 0, gpus: vec![] };
        let cg = iso.create((7, 1, 3), &limits).unwrap();
        let at = top.join("muster/n1-0000abcd/a7-t1-e3");
        assert_eq!(cg.dirs(), vec![at.clone()]);
        let read = |f: &str| fs::read_to_string(at.join(f)).unwrap();
        assert_eq!(read("memory.max"), (512u64 << 20).to_string());
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("cpu.max"), "200000 100000");
        assert_eq!(read("pids.max"), DEFAULT_PIDS_MAX.to_string());
        assert_eq!(iso.existing(), vec![(7, 1, 3)]);
        // No memory or CPU asked: neither limit is written.
        let cg2 = iso.create((8, 0, 1), &Limits { pids: 64, ..Limits::default() }).unwrap();
        let at2 = &cg2.dirs()[0];
        assert!(!at2.join("memory.max").exists() && !at2.join("cpu.max").exists());
        assert_eq!(fs::read_to_string(at2.join("pids.max")).unwrap(), "64");
    }

    #[tokio::test]
    async fn v2_reads_usage_and_kills_through_cgroup_kill() {
        let (dir, own) = fake_v2("/");
        let top = dir.path().join("sys/fs/cgroup");
        kernel_files(&top.join("muster/n1-0000abcd"));
        let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap();
        let cg = iso.create((1, 0, 1), &Limits { mem_mb: 64, ..Limits::default() }).unwrap();
        let at = cg.dirs()[0].clone();
        fs::write(at.join("memory.peak"), "1048576\n").unwrap();
        fs::write(at.join("memory.current"), "0\n").unwrap();
        fs::write(at.join("cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n").unwrap();
        fs::write(at.join("memory.events"), "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n").unwrap();
        assert_eq!(
            cg.usage(),
            Usage {
                peak_memory_bytes: 1 << 20,
                cpu_ns: 2_500_000_000,
                oom_kills: 1,
                memory_limit_bytes: 64 << 20,
                memory_bytes: 0
            }
        );
        // A child cgroup the task made counts as its own.
        fs::create_dir_all(at.join("inner")).unwrap();
        fs::write(at.join("cgroup.procs"), "").unwrap();
        fs::write(at.join("inner/cgroup.procs"), "999999\n").unwrap();
        assert_eq!(cg.pids(), vec![999_999]);
        fs::write(at.join("cgroup.kill"), "").unwrap();
        cg.kill_once().await;
        assert_eq!(fs::read_to_string(at.join("cgroup.kill")).unwrap(), "1");
    }

    #[test]
    fn v2_an_agent_inside_its_delegated_cgroup_moves_itself_into_a_leaf() {
        let own = "/system.slice/muster-agent.service";
        let (dir, proc_cgroup) = fake_v2(own);
        let top = dir.path().join("sys/fs/cgroup");
        let svc = top.join("system.slice/muster-agent.service");
        kernel_files(&svc);
        kernel_files(&svc.join("muster/n1-0000abcd"));
        let iso = Isolation::from_parts(V2_MOUNTINFO, &proc_cgroup, dir.path(), &opts()).unwrap();
        assert_eq!(iso.moved_to, Some(svc.join("agent")));
        assert_eq!(fs::read_to_string(svc.join("agent/cgroup.procs")).unwrap(), std::process::id().to_string());
        assert_eq!(fs::read_to_string(svc.join("cgroup.subtree_control")).unwrap(), "+memory +pids +cpu");
        assert_eq!(iso.roots(), vec![svc.join("muster/n1-0000abcd")]);
    }

    #[test]
    fn v2_without_a_controller_or_delegation_is_refused_with_the_reason() {
        let (dir, own) = fake_v2("/");
        let top = dir.path().join("sys/fs/cgroup");
        fs::write(top.join("cgroup.controllers"), "cpu io\n").unwrap();
        let err = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap_err();
        assert!(err.contains("offers no memory controller") && err.contains("--no-isolation"), "{err}");
        let none = Isolation::from_parts("30 1 8:1 / / rw - ext4 /dev/sda1 rw\n", &own, dir.path(), &opts());
        assert!(none.unwrap_err().contains("no cgroup filesystem is mounted"));
    }

    #[test]
    fn a_root_option_is_absolute_or_under_the_agents_own_cgroup() {
        let (dir, own) = fake_v2("/");
        let top = dir.path().join("sys/fs/cgroup");
        kernel_files(&top.join("jobs/gpu"));
        let o = Options { root: Some("/jobs/gpu".into()), ..opts() };
        let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &o).unwrap();
        assert_eq!(iso.roots(), vec![top.join("jobs/gpu")]);
    }

    #[test]
    fn v1_hierarchies_are_found_in_mountinfo_with_the_agents_own_paths() {
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let own = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n5:devices:/\n4:memory:/box/1\n2:cpu,cpuacct:/\n0::/\n";
        let dir = tempfile::tempdir().unwrap();
        for d in ["cpu,cpuacct", "memory/box/1", "devices", "freezer", "pids"] {
            let base = dir.path().join("sys/fs/cgroup").join(d).join("muster/n1-0000abcd");
            fs::create_dir_all(&base).unwrap();
            fs::write(base.join("cgroup.procs"), "").unwrap();
        }
        let iso = Isolation::from_parts(mountinfo, own, dir.path(), &opts()).unwrap();
        assert_eq!(iso.version(), Version::V1);
        let cg = dir.path().join("sys/fs/cgroup");
        let sub = "muster/n1-0000abcd";
        assert_eq!(
            iso.roots(),
            vec![
                cg.join("memory/box/1").join(sub),
                cg.join("pids").join(sub),
                cg.join("cpu,cpuacct").join(sub),
                cg.join("devices").join(sub),
                cg.join("freezer").join(sub),
            ]
        );
        // No freezer: a stop could not be sure to end every process.
        let without: String = mountinfo.lines().filter(|l| !l.contains("freezer")).map(|l| format!("{l}\n")).collect();
        let err = Isolation::from_parts(&without, own, dir.path(), &opts()).unwrap_err();
        assert!(err.contains("the freezer controller is not mounted"), "{err}");
    }

    #[test]
    fn names_parse_back_and_default_names_differ_by_work_dir() {
        assert_eq!(parse_attempt_name(&Isolation::attempt_name((12, 3, 45))), Some((12, 3, 45)));
        assert_eq!(parse_attempt_name("agent"), None);
        assert_ne!(default_name("n1", Path::new("/a")), default_name("n1", Path::new("/b")));
        assert!(default_name("gpu node/1", Path::new("/a")).starts_with("gpu_node_1-"));
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
    }
}
