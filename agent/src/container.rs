//! The built-in container runtime: runs a task inside its image with no
//! outside runtime, so it works on every node (crun refuses hybrid cgroup
//! layouts; this needs only namespaces and overlayfs).
//!
//! ```text
//!   agent child (in the attempt's cgroup, its own process group)
//!     └─ exec `muster task-container --plan FILE`   waits, mirrors the exit (a shim)
//!          unshare(mount, PID, UTS, IPC)
//!          └─ fork ─▶ PID 1 of the new namespace:
//!               mounts: / private; overlay(image layers + per-attempt upper) at ROOT;
//!                       /proc, a small /dev (null zero full random urandom tty, pts,
//!                       shm, the task's GPUs), /sys read-only, the host's
//!                       resolv.conf and hosts, the task's checkpoint dir and
//!                       launcher files at their own paths, operator-allowed mounts
//!               pivot_root(ROOT); the old root detached
//!               └─ fork ─▶ the command: working dir, the task's account, execve
//!               waits for the command (reaping orphans), exits as it did
//! ```
//!
//! The network is the node's (rendezvous ports and peers' addresses work as
//! outside). The mounts live in the attempt's own mount namespace and go
//! with it; the per-attempt upper directory is removed when the attempt
//! ends ([`remove_attempt_dirs`]). Nothing in the image is followed out of
//! its root: a mount point on a path through a symlink is refused.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The subcommand of the `muster` binary that runs [`run_container`].
pub const CONTAINER_SUBCOMMAND: &str = "task-container";

/// The command search path when the image's environment and the task's
/// set none (what a shell would use).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The exit code of an attempt whose container could not be set up (as
/// `docker run` uses 125).
pub const SETUP_FAILED: i32 = 125;

/// A host path seen inside the container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Its path inside the container.
    pub target: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

/// Everything `muster task-container` needs, written by the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerPlan {
    /// The image's unpacked layers, lowest first.
    pub layers: Vec<PathBuf>,
    /// The attempt's writable layer and overlayfs's work directory.
    pub upper: PathBuf,
    /// overlayfs's work directory (on the upper's file system).
    pub work: PathBuf,
    /// Where the root is mounted (then pivoted into).
    pub root: PathBuf,
    /// Host paths to bind, in order.
    pub binds: Vec<Bind>,
    /// Host device nodes to bind at their own paths (the task's GPUs).
    pub devices: Vec<PathBuf>,
    /// The container's host name.
    pub hostname: String,
    /// Where the command starts.
    pub workdir: String,
    /// argv.
    pub argv: Vec<String>,
    /// The whole environment, `KEY=VALUE`.
    pub env: Vec<String>,
    /// The account the command runs as (`TaskUser::to_arg`; `None`: the
    /// agent's).
    pub user: Option<String>,
    /// Where to write the exit status (a kept task's, as the shim does).
    pub status: Option<PathBuf>,
    /// The installed OCI runtime the container is handed to (`None`: the
    /// built-in runtime; see [`crate::oci`]).
    #[serde(default)]
    pub oci: Option<crate::oci::OciRuntime>,
    /// `nvidia-container-cli`, run for the task's GPUs once the root is
    /// mounted (see [`crate::nvidia`]); `None`: no GPU, or no tool.
    #[serde(default)]
    pub nvidia: Option<crate::nvidia::NvidiaHook>,
}

/// The per-attempt directories of a container: `DIR/containers/A-T-N/`.
pub fn attempt_dir(work_dir: &Path, alloc: u64, task: u32, attempt: u32) -> PathBuf {
    work_dir.join("containers").join(format!("{alloc}-{task}-{attempt}"))
}

/// The file in an attempt's directory naming the cgroup an OCI runtime
/// ran its container in.
const OCI_CGROUP_FILE: &str = "oci-cgroup";

/// Removes an attempt's container directories (its writable layer); a
/// root still mounted (a namespace that outlived the attempt) is detached
/// first. After an OCI runtime, what it left in cgroup hierarchies goes
/// too (its shim does so itself unless it was killed).
pub fn remove_attempt_dirs(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if let Ok(cgroup) = std::fs::read_to_string(dir.join(OCI_CGROUP_FILE)) {
        crate::oci::remove_leftovers(cgroup.trim());
    }
    let root = dir.join("root");
    if let Ok(c) = cstring(&root) {
        // SAFETY: a valid path; EINVAL (not a mount point) is fine.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    std::fs::remove_dir_all(dir)
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

fn mount(source: &str, target: &Path, fstype: &str, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let (s, t, f, d) = (
        CString::new(source).expect("no NUL"),
        cstring(target)?,
        CString::new(fstype).expect("no NUL"),
        CString::new(data).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in mount data"))?,
    );
    let data_ptr = if data.is_empty() { std::ptr::null() } else { d.as_ptr().cast() };
    let fs_ptr = if fstype.is_empty() { std::ptr::null() } else { f.as_ptr() };
    // SAFETY: valid NUL-terminated strings (or null where allowed).
    let r = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), fs_ptr, flags, data_ptr) };
    check(r, &format!("mount {source} on {}", target.display()))
}

fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    let s = source.to_str().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path is not UTF-8"))?;
    mount(s, target, "", libc::MS_BIND | libc::MS_REC, "")?;
    if read_only {
        mount("", target, "", libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_REC, "")?;
    }
    Ok(())
}

/// `path` (absolute, inside the container) under `root`, made as a
/// directory, never through a symlink of the image's.
fn mount_dir(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut at = root.to_path_buf();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => at.push(n),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a clean path", path.display()),
                ));
            }
        }
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is a symlink in the image: nothing is mounted through it", path.display()),
                ));
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a directory in the image", path.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// A file mount point for `path` under `root` (its parents as
/// [`mount_dir`]); an image's own file there is kept, a symlink refused.
fn mount_file(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let dir = mount_dir(root, parent)?;
    let at = dir.join(path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?);
    match std::fs::symlink_metadata(&at) {
        Ok(m) if m.file_type().is_symlink() => {
            // An image's /etc/resolv.conf is often a symlink: replace it in
            // the attempt's own layer (the image's stays as it is).
            std::fs::remove_file(&at)?;
        }
        Ok(m) if m.file_type().is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a directory in the image", path.display()),
            ));
        }
        Ok(_) => return Ok(at),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).mode(0o644).open(&at)?;
    Ok(at)
}

/// Makes this mount namespace's mounts private, then mounts the image's
/// layers and the attempt's writable layer as one overlay at the plan's
/// root.
fn mount_root(plan: &ContainerPlan) -> io::Result<()> {
    mount("", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, "")?;
    for d in [&plan.upper, &plan.work, &plan.root] {
        std::fs::create_dir_all(d)?;
    }
    let lower: Vec<String> = plan.layers.iter().rev().map(|p| p.display().to_string()).collect();
    let data =
        format!("lowerdir={},upperdir={},workdir={}", lower.join(":"), plan.upper.display(), plan.work.display());
    if data.len() > 4000 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} layers are more than one mount can stack", plan.layers.len()),
        ));
    }
    mount("overlay", &plan.root, "overlay", 0, &data)
}

/// Mounts the root and everything in it, then pivots into it.
fn set_up(plan: &ContainerPlan) -> io::Result<()> {
    mount_root(plan)?;
    let root = &plan.root;
    let proc_dir = mount_dir(root, Path::new("/proc"))?;
    mount("proc", &proc_dir, "proc", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "")?;
    let dev = mount_dir(root, Path::new("/dev"))?;
    mount("tmpfs", &dev, "tmpfs", libc::MS_NOSUID | libc::MS_STRICTATIME, "mode=755,size=65536k")?;
    for n in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(n);
        if host.exists() {
            let at = mount_file(root, &host)?;
            bind(&host, &at, false)?;
        }
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link))?;
    }
    let pts = mount_dir(root, Path::new("/dev/pts"))?;
    mount("devpts", &pts, "devpts", libc::MS_NOSUID | libc::MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")?;
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx"))?;
    let shm = mount_dir(root, Path::new("/dev/shm"))?;
    mount("tmpfs", &shm, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, "mode=1777")?;
    for d in &plan.devices {
        let at = mount_file(root, d)?;
        bind(d, &at, false)?;
    }
    let sys = mount_dir(root, Path::new("/sys"))?;
    bind(Path::new("/sys"), &sys, true)?;
    for f in ["/etc/resolv.conf", "/etc/hosts"] {
        let host = Path::new(f);
        if host.is_file() {
            let at = mount_file(root, host)?;
            bind(host, &at, true)?;
        }
    }
    for b in &plan.binds {
        let meta = std::fs::metadata(&b.source)
            .map_err(|e| io::Error::new(e.kind(), format!("mount source {}: {e}", b.source.display())))?;
        let at = if meta.is_dir() { mount_dir(root, &b.target)? } else { mount_file(root, &b.target)? };
        bind(&b.source, &at, b.read_only)?;
    }
    // The driver's libraries, before the host's paths are out of reach.
    if let Some(hook) = &plan.nvidia {
        hook.run(crate::nvidia::host_pid()?, root)?;
    }
    // Into the new root; the old one detached.
    let c = cstring(root)?;
    // SAFETY: valid paths; plain syscalls.
    unsafe {
        check(libc::chdir(c.as_ptr()), "chdir into the root")?;
    }
    let old = Path::new(".old_root");
    std::fs::create_dir(old)?;
    let (dot, old_c) = (CString::new(".").expect("no NUL"), cstring(old)?);
    // SAFETY: valid NUL-terminated paths.
    unsafe {
        check(libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), old_c.as_ptr()) as libc::c_int, "pivot_root")?;
        check(libc::chdir(c"/".as_ptr()), "chdir /")?;
        check(libc::umount2(c"/.old_root".as_ptr(), libc::MNT_DETACH), "detach the old root")?;
    }
    std::fs::remove_dir("/.old_root")?;
    let host = CString::new(plan.hostname.clone()).unwrap_or_default();
    // SAFETY: a valid buffer of the given length.
    unsafe {
        check(libc::sethostname(host.as_ptr(), host.as_bytes().len()), "sethostname")?;
    }
    Ok(())
}

/// How a process ended, as the status pipe carries it.
fn encode(status: libc::c_int) -> [u8; 8] {
    let (kind, n): (i32, i32) =
        if libc::WIFSIGNALED(status) { (1, libc::WTERMSIG(status)) } else { (0, libc::WEXITSTATUS(status)) };
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&kind.to_le_bytes());
    b[4..].copy_from_slice(&n.to_le_bytes());
    b
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("muster: container: {what}: {e}");
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(SETUP_FAILED) }
}

/// PID 1 of the container: sets it up, runs the command, reaps what it
/// leaves, and reports the command's end on `report`.
fn init(plan: &ContainerPlan, report: libc::c_int) -> ! {
    if let Err(e) = set_up(plan) {
        fail("setting up", e);
    }
    let argv: Vec<CString> = match plan.argv.iter().map(|a| CString::new(a.as_str())).collect() {
        Ok(v) => v,
        Err(e) => fail("argv", e),
    };
    let env: Vec<CString> = match plan.env.iter().map(|a| CString::new(a.as_str())).collect() {
        Ok(v) => v,
        Err(e) => fail("the environment", e),
    };
    let Some(program) = plan.argv.first() else { fail("the command", "no command and no ENTRYPOINT or CMD") };
    let user = match plan.user.as_deref().map(crate::users::TaskUser::from_arg).transpose() {
        Ok(u) => u,
        Err(e) => fail("the account", e),
    };
    let workdir = PathBuf::from(&plan.workdir);
    // The working directory is made if the image lacks it, as docker does.
    if let Err(e) = mount_dir(Path::new("/"), &workdir) {
        fail("the working directory", e);
    }
    // SAFETY: this process is single-threaded (a fresh exec, then fork).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail("fork", io::Error::last_os_error());
    }
    if pid == 0 {
        for sig in crate::executor::SHIM_IGNORES {
            // SAFETY: resetting a disposition has no preconditions.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        if let Err(e) = std::env::set_current_dir(&workdir) {
            eprintln!("muster: container: cannot enter {}: {e}", workdir.display());
            // SAFETY: _exit has no preconditions.
            unsafe { libc::_exit(SETUP_FAILED) };
        }
        if let Some(u) = &user
            && let Err(e) = crate::users::drop_to(u)
        {
            eprintln!("muster: container: cannot become {}: {e}", u.name);
            // SAFETY: as above.
            unsafe { libc::_exit(SETUP_FAILED) };
        }
        // Found as execvp would, in the container's root (pivot_root is done).
        let path = plan.env.iter().find_map(|kv| kv.strip_prefix("PATH=")).unwrap_or(DEFAULT_PATH);
        let found = match crate::executor::find_program(program, path, &workdir) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("muster: container: cannot start {program:?}: {e}");
                // SAFETY: as above.
                unsafe { libc::_exit(127) };
            }
        };
        let path = cstring(&found).unwrap_or_default();
        let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_p.push(std::ptr::null());
        let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
        env_p.push(std::ptr::null());
        // SAFETY: NUL-terminated arrays of valid strings.
        unsafe { libc::execve(path.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
        eprintln!("muster: container: cannot start {program:?}: {}", io::Error::last_os_error());
        // SAFETY: as above.
        unsafe { libc::_exit(127) };
    }
    loop {
        let mut status = 0;
        // SAFETY: a valid pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == pid {
            let b = encode(status);
            // SAFETY: a valid buffer.
            unsafe { libc::write(report, b.as_ptr().cast(), b.len()) };
            // SAFETY: _exit has no preconditions; the kernel ends what is left.
            unsafe { libc::_exit(0) };
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: as above.
            unsafe { libc::_exit(SETUP_FAILED) };
        }
    }
}

/// `muster task-container --plan FILE`: runs the plan's command in its
/// container, waits for it, writes its exit status where the plan says,
/// and returns the code to exit with (a signal is mirrored, as the shim
/// does).
pub fn run_container(plan_path: &Path) -> i32 {
    let plan: ContainerPlan = match std::fs::read(plan_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("muster: container: the plan {}: {e}", plan_path.display());
            return SETUP_FAILED;
        }
    };
    for sig in crate::executor::SHIM_IGNORES {
        // SAFETY: setting a disposition has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    if let Some(rt) = &plan.oci {
        let exit = run_oci(&plan, rt);
        return crate::executor::finish_shim(plan.status.as_deref(), exit);
    }
    let mut fds = [0; 2];
    // SAFETY: a valid array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("muster: container: pipe: {}", io::Error::last_os_error());
        return SETUP_FAILED;
    }
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC;
    // SAFETY: unshare has no memory-safety preconditions.
    if unsafe { libc::unshare(flags) } != 0 {
        eprintln!("muster: container: unshare: {}", io::Error::last_os_error());
        return SETUP_FAILED;
    }
    // SAFETY: single-threaded (a fresh exec).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!("muster: container: fork: {}", io::Error::last_os_error());
        return SETUP_FAILED;
    }
    if pid == 0 {
        // SAFETY: closing our copy of the read end.
        unsafe { libc::close(fds[0]) };
        init(&plan, fds[1]);
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let status = wait_child(pid);
    // SAFETY: the read end is ours.
    let mut report = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut b = [0u8; 8];
    let exit = match report.read_exact(&mut b) {
        Ok(()) => {
            let kind = i32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
            let n = i32::from_le_bytes(b[4..].try_into().expect("4 bytes"));
            if kind == 1 { crate::executor::Exit::Signal(n) } else { crate::executor::Exit::Code(n) }
        }
        // The container's init ended without a report: its own failure.
        Err(_) if libc::WIFSIGNALED(status) => crate::executor::Exit::Signal(libc::WTERMSIG(status)),
        Err(_) => crate::executor::Exit::Code(libc::WEXITSTATUS(status)),
    };
    crate::executor::finish_shim(plan.status.as_deref(), exit)
}

/// Runs the plan through an installed OCI runtime ([`crate::oci`]): the
/// root mounted in a mount namespace of this shim's own, the bundle
/// written, the runtime run and waited for; what it leaves in cgroup
/// hierarchies the agent does not manage is removed after it.
fn run_oci(plan: &ContainerPlan, rt: &crate::oci::OciRuntime) -> crate::executor::Exit {
    use crate::executor::Exit;
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("muster: container: {what}: {e}");
        Exit::Code(SETUP_FAILED)
    };
    // SAFETY: unshare has no memory-safety preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return failed("unshare", &io::Error::last_os_error());
    }
    if let Err(e) = mount_root(plan) {
        return failed("mounting the image", &e);
    }
    // runc binds the root with what is mounted in it: the driver's
    // libraries go in now, in this shim's mount namespace.
    if let Some(hook) = &plan.nvidia
        && let Err(e) = hook.run(std::process::id(), &plan.root)
    {
        return failed("the GPU driver's libraries", &e);
    }
    let cgroup = match crate::oci::enter_shim_cgroup() {
        Ok(c) => c,
        Err(e) => return failed("the attempt's cgroup", &e),
    };
    if let Some(dir) = plan.root.parent()
        && let Err(e) = std::fs::write(dir.join(OCI_CGROUP_FILE), &cgroup)
    {
        return failed("the attempt's directory", &e);
    }
    let gpus: Vec<(PathBuf, crate::oci::DeviceNode)> =
        plan.devices.iter().filter_map(|d| crate::oci::device_node(d).ok().map(|n| (d.clone(), n))).collect();
    let config = crate::oci::config(plan, &cgroup, &gpus);
    let written =
        std::fs::create_dir_all(&rt.bundle).and_then(|()| std::fs::create_dir_all(&rt.state)).and_then(|()| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(rt.bundle.join("config.json"))?;
            f.write_all(&serde_json::to_vec_pretty(&config).map_err(io::Error::other)?)
        });
    if let Err(e) = written {
        return failed("the bundle", &e);
    }
    let args: Vec<CString> = [
        rt.program.as_os_str(),
        "--root".as_ref(),
        rt.state.as_os_str(),
        "run".as_ref(),
        "--bundle".as_ref(),
        rt.bundle.as_os_str(),
        rt.id.as_ref(),
    ]
    .iter()
    .map(|a| CString::new(a.as_bytes()).unwrap_or_default())
    .collect();
    // SAFETY: single-threaded (a fresh exec); the child only resets
    // dispositions and execs.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return failed("fork", &io::Error::last_os_error());
    }
    if pid == 0 {
        // The runtime forwards the agent's signals to the container.
        for sig in crate::executor::SHIM_IGNORES {
            // SAFETY: resetting a disposition has no preconditions.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: NUL-terminated arrays of valid strings.
        unsafe { libc::execv(args[0].as_ptr(), argv.as_ptr()) };
        eprintln!("muster: container: cannot start {}: {}", rt.program.display(), io::Error::last_os_error());
        // SAFETY: _exit has no preconditions.
        unsafe { libc::_exit(SETUP_FAILED) };
    }
    let status = wait_child(pid);
    crate::oci::remove_leftovers(&cgroup);
    if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        crate::oci::exit_of(libc::WEXITSTATUS(status))
    }
}

/// Waits for child `pid` to end (through interruptions); its wait status.
fn wait_child(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: a valid pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid || (r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
            return status;
        }
    }
}

/// Writes a plan for [`run_container`].
pub fn write_plan(path: &Path, plan: &ContainerPlan) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(&serde_json::to_vec(plan).map_err(io::Error::other)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_never_pass_through_an_image_symlink() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("var")).unwrap();
        let e = mount_dir(root.path(), Path::new("/var/lib/muster")).unwrap_err();
        assert!(e.to_string().contains("/var/lib/muster is a symlink in the image"), "{e}");
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none(), "nothing made outside");
        // A file mount point replaces an image's symlink in the attempt's
        // layer, never writing through it.
        std::fs::create_dir(root.path().join("etc")).unwrap();
        let target = outside.path().join("shadow");
        std::os::unix::fs::symlink(&target, root.path().join("etc/resolv.conf")).unwrap();
        let at = mount_file(root.path(), Path::new("/etc/resolv.conf")).unwrap();
        assert!(std::fs::symlink_metadata(&at).unwrap().is_file());
        assert!(!target.exists());
        let made = mount_dir(root.path(), Path::new("/a/b")).unwrap();
        assert!(made.is_dir() && made.starts_with(root.path()));
    }

    #[test]
    fn a_plan_round_trips_and_a_status_is_encoded() {
        let plan = ContainerPlan {
            layers: vec!["/l/1".into(), "/l/2".into()],
            upper: "/c/upper".into(),
            work: "/c/work".into(),
            root: "/c/root".into(),
            binds: vec![Bind { source: "/data".into(), target: "/data".into(), read_only: true }],
            devices: vec!["/dev/nvidia0".into()],
            hostname: "n0".into(),
            workdir: "/work".into(),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: vec!["PATH=/bin".into()],
            user: Some("1000:1000:1000".into()),
            status: None,
            oci: None,
            nvidia: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plan.json");
        write_plan(&p, &plan).unwrap();
        let back: ContainerPlan = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(back, plan);
        assert_eq!(&encode(0x0900)[..], &[0, 0, 0, 0, 9, 0, 0, 0], "exit code 9");
        assert_eq!(&encode(libc::SIGKILL)[..4], &[1, 0, 0, 0], "killed by a signal");
    }
}
