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
//!       end:     usage (peak memory, CPU time, OOM kills) read, then kept as a spare (v1) or removed
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
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod files;
mod spare;
mod task;
#[cfg(test)]
mod tests;

pub use task::TaskCgroup;

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
    /// The subtree's cgroup path within the hierarchy (`/muster/NAME`).
    path: String,
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
    /// Whether the subtree is on cgroupfs (`false`: a fake tree of
    /// regular files, in tests).
    cgroupfs: bool,
    /// Where the agent's own process went (v2, out of the cgroup it
    /// delegates to its tasks), if it moved.
    moved_to: Option<PathBuf>,
    /// Emptied attempt cgroups kept for the next attempts (v1 only:
    /// v2 cannot rename a cgroup).
    spares: Option<Arc<spare::Spares>>,
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

/// Where cgroup path `path` (as `/proc/self/cgroup` names it) lies in each
/// mounted hierarchy, v1 and v2: (whether v2, its directory). A mount whose
/// root does not contain the path is left out.
pub(crate) fn dirs_in_every_hierarchy(mountinfo: &str, path: &str) -> Vec<(bool, PathBuf)> {
    parse_mountinfo(mountinfo)
        .into_iter()
        .filter(|m| m.root == "/" || path.starts_with(&format!("{}/", m.root.trim_end_matches('/'))))
        .map(|m| (m.v2, join_cg(&m.point, &within(path, &m.root))))
        .collect()
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
                let path = subtree(&within(own_path, &m.root));
                let root = join_cg(&at(&m.point), &path);
                hierarchies.push(Hierarchy { controllers: m.controllers.clone(), root, path });
            }
            let iso = Isolation {
                version: Version::V1,
                hierarchies,
                gpu_devices: opts.gpu_devices.clone(),
                pids_default,
                has_swap_limit: false,
                has_kill: false,
                cgroupfs: false,
                moved_to: None,
                spares: None,
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
        let path = subtree(&own_path);
        let root = join_cg(&top, &path);
        let controllers = V2_REQUIRED.iter().map(|c| c.to_string()).collect();
        let mut iso = Isolation {
            version: Version::V2,
            hierarchies: vec![Hierarchy { controllers, root, path }],
            gpu_devices: opts.gpu_devices.clone(),
            pids_default,
            has_swap_limit: false,
            has_kill: false,
            cgroupfs: false,
            moved_to: None,
            spares: None,
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
        self.cgroupfs = self.hierarchies.iter().all(|h| on_cgroupfs(&h.root));
        raise_open_files_limit();
        match self.version {
            Version::V1 => {
                let mem = self.dir_of("memory");
                self.has_swap_limit = mem.join("memory.memsw.limit_in_bytes").exists();
                self.spares = Some(Arc::new(spare::Spares::new(self.roots(), self.has_swap_limit)));
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

    /// The subtree's cgroup path when it is the same in every hierarchy
    /// (always on v2; on v1 unless the agent's own cgroups differ between
    /// controllers and `--cgroup-root` is relative): what an OCI runtime,
    /// which names one path for all, needs.
    pub fn uniform_path(&self) -> Option<&str> {
        let first = self.hierarchies.first()?.path.as_str();
        self.hierarchies.iter().all(|h| h.path == first).then_some(first)
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
            applied: None,
            spares: self.spares.clone(),
            handles: files::Handles::new(!self.cgroupfs),
        }
    }

    /// How many emptied cgroups are kept for the next attempts now.
    pub fn spares(&self) -> usize {
        self.spares.as_ref().map_or(0, |s| s.len())
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

    /// Creates attempt `key`'s cgroup with `limits`: a spare renamed
    /// (v1, [`spare`]) or a new one. A leftover of the same name (an
    /// earlier agent's) is emptied and reused.
    pub fn create(&self, key: (u64, u32, u64), limits: &Limits) -> Result<TaskCgroup, String> {
        let name = Isolation::attempt_name(key);
        if let Some(spares) = &self.spares
            && !spares.exists(&name)
            && let Some((before, open)) = spares.take(&name)
        {
            let mut cg = self.cgroup_named(&name);
            cg.handles = files::Handles::from(open, !self.cgroupfs);
            match self.reuse(&cg, limits, &before) {
                Ok(applied) => {
                    cg.applied = Some(applied);
                    return Ok(cg);
                }
                Err(e) => {
                    tracing::debug!(cgroup = %name, error = %e, "cannot reuse a spare cgroup; making a new one");
                    cg.spares = None;
                    cg.remove();
                }
            }
        }
        let mut cg = self.cgroup_named(&name);
        for (_, dir) in &cg.dirs {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        }
        cg.applied = Some(self.apply(&cg, limits, None)?);
        Ok(cg)
    }

    /// Readies a spare renamed to `cg` for its next attempt: its peak and
    /// CPU counters reset, its device list the parent's again, and the
    /// limits that differ from `before` written.
    fn reuse(&self, cg: &TaskCgroup, limits: &Limits, before: &spare::Applied) -> Result<spare::Applied, String> {
        cg.set("memory", "memory.max_usage_in_bytes", "0")?;
        cg.set("cpuacct", "cpuacct.usage", "0")?;
        cg.set("devices", "devices.allow", "a")?;
        self.apply(cg, limits, Some(before))
    }

    /// Writes `limits` to `cg`, all of them to a new cgroup (`before`:
    /// `None`), or those that differ from what a reused one holds.
    fn apply(
        &self,
        cg: &TaskCgroup,
        limits: &Limits,
        before: Option<&spare::Applied>,
    ) -> Result<spare::Applied, String> {
        let want = spare::Applied {
            pids: if limits.pids == 0 { self.pids_default } else { limits.pids },
            mem_bytes: limits.mem_mb.saturating_mul(1024 * 1024),
            cpu_quota_us: u64::from(limits.cpus) * 100_000,
        };
        // A new cgroup holds the kernel's defaults: no pids limit (0
        // never matches), no memory limit, no quota.
        let fresh = before.is_none();
        let before = before.cloned().unwrap_or_default();
        if want.pids != before.pids {
            cg.set("pids", "pids.max", &want.pids.to_string())?;
        }
        match self.version {
            Version::V1 => {
                if want.mem_bytes != before.mem_bytes {
                    // The swap limit (memory + swap) may not go under the
                    // memory limit: raise both in the order that keeps
                    // that true from any earlier values.
                    if self.has_swap_limit {
                        let _ = cg.set("memory", "memory.memsw.limit_in_bytes", "-1");
                    }
                    if want.mem_bytes > 0 {
                        cg.set("memory", "memory.limit_in_bytes", &want.mem_bytes.to_string())?;
                        if self.has_swap_limit {
                            cg.set("memory", "memory.memsw.limit_in_bytes", &want.mem_bytes.to_string())?;
                        }
                    } else {
                        cg.set("memory", "memory.limit_in_bytes", "-1")?;
                    }
                }
                if fresh {
                    // Best effort: some kernels refuse it under a parent
                    // with a hierarchy; the swap limit above is what holds.
                    let _ = cg.set("memory", "memory.swappiness", "0");
                }
                // The period is the kernel's default, 100 ms (a spare is
                // taken back only with it).
                if want.cpu_quota_us != before.cpu_quota_us {
                    let quota = if want.cpu_quota_us == 0 { "-1".to_string() } else { want.cpu_quota_us.to_string() };
                    cg.set("cpu", "cpu.cfs_quota_us", &quota)?;
                }
                // Reading and writing are what a GPU is used by; mknod
                // needs CAP_MKNOD, which no task has. Leaving `m` lets an
                // OCI runtime's own group below this one keep its default
                // `c *:* m` (the kernel refuses a child any overlap with a
                // parent's deny).
                for (i, d) in self.gpu_devices.iter().enumerate() {
                    if !limits.gpus.contains(&(i as u32)) {
                        cg.set("devices", "devices.deny", &format!("c {}:{} rw", d.major, d.minor))?;
                    }
                }
            }
            Version::V2 => {
                if want.mem_bytes > 0 {
                    cg.set("memory", "memory.max", &want.mem_bytes.to_string())?;
                    if self.has_swap_limit {
                        cg.set("memory", "memory.swap.max", "0")?;
                    }
                }
                if want.cpu_quota_us > 0 {
                    cg.set("cpu", "cpu.max", &format!("{} 100000", want.cpu_quota_us))?;
                }
            }
        }
        Ok(want)
    }

    /// Removes the agent's subtree if nothing is left in it (a clean
    /// shutdown).
    pub fn remove_if_empty(&self) {
        if let Some(spares) = &self.spares {
            spares.clear();
        }
        for h in &self.hierarchies {
            let _ = fs::remove_dir(&h.root);
        }
    }
}

/// Whether `dir` is on a cgroup file system (v1's or v2's).
fn on_cgroupfs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const CGROUP_SUPER_MAGIC: i64 = 0x27e0eb;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs writes only into `st`; `path` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let magic = st.f_type as i64;
    magic == CGROUP_SUPER_MAGIC || magic == CGROUP2_SUPER_MAGIC
}

/// Raises the soft limit on open files to the hard one: each attempt's
/// cgroup (and each spare) holds its directories and files open
/// ([`files`]), some thirty descriptors, and a service's default soft
/// limit is often 1,024.
fn raise_open_files_limit() {
    // SAFETY: getrlimit/setrlimit read and write only `lim`.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "cannot raise the open files limit");
            }
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
