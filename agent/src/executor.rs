//! The executor: runs each task attempt as a child process in its own
//! process group, with the task's environment and per-attempt log files, and
//! stops it with SIGTERM → grace → SIGKILL to the whole group.
//!
//! ```text
//!   spawn(spec) ──▶ setpgid(0,0) child ── stdout/stderr ──▶ logs/alloc-A/task-T/attempt-N.{out,err}
//!        │
//!        ├── wait() ──▶ Exit { code | signal }   (then SIGKILL the group: no orphans)
//!        └── stop(grace): SIGTERM group ─ grace ─▶ SIGKILL group
//! ```
//!
//! A child that traps SIGTERM, or a grandchild that outlives its parent,
//! still dies: signals go to the process group, not the one pid. With a
//! cgroup ([`crate::cgroup`]) the task joins it before it runs (the child
//! joins and execs it without forking the agent: [`child`]), signals go to
//! every process in it too, and an attempt has ended only once its cgroup
//! is empty: a process that left the group (`setsid`, a double fork) dies
//! with it.
//!
//! Tasks that must outlive their agent (`muster agent --keep-tasks`) start
//! under a shim (`muster task-shim`, [`run_shim`]) that leads the process
//! group, waits for the command, and writes its exit status to a file
//! before mirroring it. A restarted agent cannot wait() for a process it did
//! not start, so it [`adopt`]s the group instead: it polls the shim's pid
//! and reads the status file once the shim is gone.
//!
//! ```text
//!   agent ── spawn ──▶ shim (pgid leader, ignores TERM/USR1) ──▶ command
//!                        └── command ends ──▶ exits/A-T-E (code N | signal N) ──▶ exit the same way
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::cgroup::{TaskCgroup, Usage};

/// Everything needed to start one attempt of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLaunch {
    /// The allocation.
    pub alloc: u64,
    /// The task's index in its gang.
    pub task: u32,
    /// The gang's size.
    pub gang_size: u32,
    /// The reservation epoch the attempt runs under.
    pub epoch: u64,
    /// The attempt number (1 for the first).
    pub attempt: u32,
    /// argv.
    pub command: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The addresses of the gang's nodes, in task order.
    pub peers: Vec<String>,
    /// The gang's rendezvous ports on task 0's node (`MASTER_PORT` first).
    pub ports: Vec<u16>,
    /// The GPU indices this task may use (`CUDA_VISIBLE_DEVICES`).
    pub gpu_ids: Vec<u32>,
    /// Where the task may leave a checkpoint when preempted
    /// (`MUSTER_CHECKPOINT_DIR`; restored there before a resumed attempt).
    pub checkpoint_dir: PathBuf,
    /// The account the task runs as (`None`: the agent's own user).
    pub user: Option<crate::users::TaskUser>,
    /// The image it runs in (`None`: the node's own system).
    pub container: Option<ContainerLaunch>,
}

/// A task's image, pulled, and how it sees the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerLaunch {
    /// The image's unpacked layers, lowest first.
    pub layers: Vec<PathBuf>,
    /// The image's configuration (ENV, ENTRYPOINT, CMD, WORKDIR).
    pub config: muster_registry::ImageConfig,
    /// Operator-allowed host paths it sees.
    pub binds: Vec<crate::container::Bind>,
    /// Where its command starts (else the image's WORKDIR, else `/`).
    pub workdir: Option<String>,
    /// The installed OCI runtime it is handed to (`None`: the built-in
    /// runtime).
    pub runtime: Option<PathBuf>,
    /// The node's `nvidia-container-cli`, run when the task holds GPUs.
    pub nvidia: Option<PathBuf>,
}

impl ContainerLaunch {
    /// argv as `docker run` makes it: the ENTRYPOINT, then the command
    /// given, else the image's CMD.
    pub fn argv(&self, command: &[String]) -> Vec<String> {
        let rest = if command.is_empty() { &self.config.cmd } else { command };
        self.config.entrypoint.iter().chain(rest).cloned().collect()
    }
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The process exited with this code.
    Code(i32),
    /// The process was killed by this signal.
    Signal(i32),
}

impl Exit {
    /// Whether the attempt succeeded.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

/// Why a task could not be started.
#[derive(Debug, Error)]
pub enum SpawnError {
    /// The command is empty.
    #[error("the command is empty")]
    EmptyCommand,
    /// The log directory or files could not be created.
    #[error("cannot create log files in {path}: {source}")]
    Logs {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The attempt's cgroup could not be joined.
    #[error("cannot put the task in its cgroup: {0}")]
    Cgroup(io::Error),
    /// The task could not become its account.
    #[error("cannot run the task as its account: {0}")]
    User(io::Error),
    /// The program could not be executed.
    #[error("cannot start {program:?}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The error.
        source: io::Error,
    },
}

/// Where an attempt's output goes: `DIR/logs/alloc-A/task-T/attempt-N.{out,err}`.
pub fn log_paths(work_dir: &Path, alloc: u64, task: u32, attempt: u32) -> (PathBuf, PathBuf) {
    let dir = work_dir.join("logs").join(format!("alloc-{alloc}")).join(format!("task-{task}"));
    (dir.join(format!("attempt-{attempt}.out")), dir.join(format!("attempt-{attempt}.err")))
}

/// The tail of an attempt's stderr log as the scheduler keeps it
/// (`muster_core::sm::failure_tail`: its last lines, at most 1 KiB); empty
/// when the log cannot be read. Reads only the file's last 8 KiB.
pub fn stderr_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const READ: u64 = 8 * 1024;
    let Ok(mut f) = File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(SeekFrom::Start(len.saturating_sub(READ))).is_err() {
        return String::new();
    }
    let mut buf = Vec::with_capacity(READ as usize);
    if f.take(READ).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    // A read that starts mid-file drops its first, partial line.
    let text = String::from_utf8_lossy(&buf);
    let text = if len > READ { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    muster_core::sm::failure_tail(text)
}

/// A running attempt.
pub struct RunningTask {
    inner: Inner,
    pgid: i32,
    /// How its leader (the command, or its shim) ended, once it has.
    leader: Option<Exit>,
    /// How it ended, once nothing of it is left.
    exited: Option<Exit>,
    /// Its cgroup (`None`: an agent run with `--no-isolation`).
    cgroup: Option<TaskCgroup>,
    /// What it used, read from its cgroup at its end.
    usage: Option<Usage>,
}

enum Inner {
    /// Our own child: waited for directly.
    Child(child::Process),
    /// A shim started by an earlier agent: polled, its status read from the
    /// file.
    Adopted { status: PathBuf },
}

/// How often an adopted task's shim is checked for having exited.
const ADOPTED_POLL: Duration = Duration::from_millis(200);

/// Where the shim of attempt (`alloc`, `task`, `epoch`) writes its exit status.
pub fn status_path(work_dir: &Path, alloc: u64, task: u32, epoch: u64) -> PathBuf {
    work_dir.join("exits").join(format!("{alloc}-{task}-{epoch}"))
}

/// Reads a status file: `code N` or `signal N`.
pub fn read_status(path: &Path) -> Option<Exit> {
    let text = fs::read_to_string(path).ok()?;
    let (kind, n) = text.trim().split_once(' ')?;
    let n: i32 = n.parse().ok()?;
    match kind {
        "code" => Some(Exit::Code(n)),
        "signal" => Some(Exit::Signal(n)),
        _ => None,
    }
}

/// Whether `pid` is a live process (a zombie counts as dead: it runs
/// nothing).
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
    }
}

/// Whether `pid` runs a task shim (not some process that reused the pid):
/// `muster task-shim`, `muster task-exec --status` (the shim of a task
/// that runs as another account), or `muster task-container` (an image
/// task's, which writes its status where its plan says).
pub fn is_shim(pid: i32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let has = |word: &str| c.split(|b| *b == 0).any(|arg| arg == word.as_bytes());
        has(SHIM_SUBCOMMAND)
            || (has(TASK_EXEC_SUBCOMMAND) && has("--status"))
            || has(crate::container::CONTAINER_SUBCOMMAND)
    })
}

/// The subcommand of the `muster` binary that runs [`run_shim`].
pub const SHIM_SUBCOMMAND: &str = "task-shim";

/// The signals the agent sends a task's group that the shim must survive
/// (its command gets them; the shim only waits and reports).
pub(crate) const SHIM_IGNORES: [i32; 7] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE];

/// The shim's body: runs `command` (inheriting stdio, environment, working
/// dir and process group), waits for it, writes its exit status to `status`
/// (atomically: a temporary file renamed), and returns the code to exit
/// with. A command that died of a signal is mirrored by the shim raising
/// the same signal, so a waiting agent sees what it would have without the
/// shim.
pub fn run_shim(status: &Path, command: &[String]) -> i32 {
    run_shim_as(status, command, None)
}

/// [`run_shim`], its command run as `user` (the shim stays the agent's
/// user: the task can neither signal it nor forge its status file).
fn run_shim_as(status: &Path, command: &[String], user: Option<&crate::users::TaskUser>) -> i32 {
    use std::os::unix::process::CommandExt;
    let Some(program) = command.first() else {
        eprintln!("muster task-shim: no command");
        return 127;
    };
    // Ignore first, then reset in the child: no window where a signal
    // meant for the command kills the shim.
    for sig in SHIM_IGNORES {
        // SAFETY: setting a disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(&command[1..]);
    let user = user.cloned();
    // SAFETY: only async-signal-safe calls (signal, setgroups, setgid,
    // setuid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for sig in SHIM_IGNORES {
                libc::signal(sig, libc::SIG_DFL);
            }
            match &user {
                Some(u) => crate::users::drop_to(u),
                None => Ok(()),
            }
        });
    }
    let exit = match cmd.spawn().and_then(|mut c| c.wait()) {
        Ok(status) => exit_of(status),
        Err(e) => {
            eprintln!("muster task-shim: cannot start {program:?}: {e}");
            Exit::Code(127)
        }
    };
    finish_shim(Some(status), exit)
}

/// A shim's end: writes `exit` to `status` (if given; atomically, a
/// temporary file renamed) and returns the code to exit with, or mirrors a
/// signal by raising it.
pub(crate) fn finish_shim(status: Option<&Path>, exit: Exit) -> i32 {
    if let Some(status) = status {
        let line = match exit {
            Exit::Code(c) => format!("code {c}\n"),
            Exit::Signal(s) => format!("signal {s}\n"),
        };
        let tmp = status.with_extension("tmp");
        if let Err(e) = fs::write(&tmp, line).and_then(|()| fs::rename(&tmp, status)) {
            eprintln!("muster task-shim: cannot write {}: {e}", status.display());
        }
    }
    match exit {
        Exit::Code(c) => c,
        Exit::Signal(sig) => {
            // SAFETY: restoring the default action and raising a signal at
            // ourselves has no memory-safety preconditions.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            128 + sig
        }
    }
}

/// Takes over an attempt whose shim (process group `pgid`) an earlier agent
/// started; its exit status will be read from `status`, and whatever is
/// left in its `cgroup` is killed at its end.
pub fn adopt(pgid: i32, status: PathBuf, cgroup: Option<TaskCgroup>) -> RunningTask {
    RunningTask { inner: Inner::Adopted { status }, pgid, leader: None, exited: None, cgroup, usage: None }
}

/// Sends `signal` to a process group.
pub fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg has no memory-safety preconditions; a group that is
    // already gone gives ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(sig)) => Exit::Signal(sig),
        (None, None) => Exit::Code(-1),
    }
}

/// Finds `program` as `execvp` would: a path (relative to `cwd`) as it is,
/// a bare name on `path`; an error as exec's (ENOENT, EACCES) when it
/// cannot be run.
pub(crate) fn find_program(program: &str, path: &str, cwd: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        let p = cwd.join(program);
        return match runnable(&p) {
            Ok(true) => Ok(p),
            Ok(false) => Err(io::Error::from_raw_os_error(libc::EACCES)),
            Err(e) => Err(e),
        };
    }
    let mut denied = false;
    for dir in path.split(':') {
        let p = cwd.join(if dir.is_empty() { "." } else { dir }).join(program);
        match runnable(&p) {
            Ok(true) => return Ok(p),
            Ok(false) => denied = true,
            Err(_) => {}
        }
    }
    Err(io::Error::from_raw_os_error(if denied { libc::EACCES } else { libc::ENOENT }))
}

/// Finds `program` on this process's `PATH` as `execvp` would
/// ([`find_program`]; a path is taken as it is).
pub fn find_on_path(program: &str) -> io::Result<PathBuf> {
    find_program(program, &std::env::var("PATH").unwrap_or_default(), Path::new("/"))
}

/// The `muster` binary, where the tasks need it: to run under
/// `muster task-shim` (kept across agent restarts) and to start as another
/// user through `muster task-exec`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Muster<'a> {
    /// The binary (`None`: not known; a task that must switch user then
    /// does it in a pre-exec step of a forked agent).
    pub exe: Option<&'a Path>,
    /// Start each task under the shim (`exe` must be known).
    pub shim: bool,
}

impl Muster<'_> {
    /// Neither shim nor helper.
    pub const NONE: Muster<'static> = Muster { exe: None, shim: false };
}

/// Creates a directory (and those above it) searchable but not listable by
/// others (0711): a task running as another user can reach what it is
/// given inside, and nothing else.
fn private_dirs(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(0o711).create(dir)
}

/// Creates a file only the agent can read (0600): a task writes its logs
/// through the descriptor it is given.
fn private_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)
}

/// Starts an attempt in its own process group, in `work_dir`; with
/// `muster.shim`, under `muster task-shim`, so the attempt can outlive this
/// agent and be adopted by the next. With `cgroup`, the child joins it
/// before it execs, so nothing the task starts is outside it. With
/// `launch.user`, it runs as that account (its groups, gid and uid are set
/// after it joined its cgroup, before the task runs a line of its code).
pub fn spawn(
    launch: &TaskLaunch,
    work_dir: &Path,
    muster: Muster<'_>,
    cgroup: Option<TaskCgroup>,
) -> Result<RunningTask, SpawnError> {
    if launch.container.is_none() && launch.command.is_empty() {
        return Err(SpawnError::EmptyCommand);
    }
    let program = launch.command.first().cloned().unwrap_or_else(|| "task-container".to_string());
    let program = &program;
    let (out_path, err_path) = log_paths(work_dir, launch.alloc, launch.task, launch.attempt);
    let dir = out_path.parent().expect("log path has a parent").to_path_buf();
    let logs = |source| SpawnError::Logs { path: dir.clone(), source };
    private_dirs(&dir).map_err(logs)?;
    let stdout = private_file(&out_path).map_err(logs)?;
    let stderr = private_file(&err_path).map_err(logs)?;
    let hosts = dir.join(format!("attempt-{}.hostfile", launch.attempt));
    fs::write(&hosts, crate::launcher::hostfile(&launch.peers, launch.gpu_ids.len())).map_err(logs)?;
    let progress = crate::watchdog::progress_path(work_dir, launch.alloc, launch.task, launch.attempt);
    // Each run starts with no beat in its progress file (a watchdog re-run
    // on the same node has the same path): the watcher counts whatever it
    // first finds there as a beat.
    match &launch.user {
        Some(user) => {
            // What the task itself writes or reads here is its own; the
            // rest of the attempt's directory stays the agent's.
            private_file(&progress).map_err(logs)?;
            for path in [&hosts, &progress] {
                std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid)).map_err(logs)?;
            }
        }
        None => match fs::remove_file(&progress) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(logs(e)),
            _ => {}
        },
    }
    let status_file = match (muster.shim, muster.exe) {
        (true, Some(_)) => {
            let status = status_path(work_dir, launch.alloc, launch.task, launch.epoch);
            let dir = status.parent().expect("status path has a parent").to_path_buf();
            fs::create_dir_all(&dir).map_err(|source| SpawnError::Logs { path: dir, source })?;
            let _ = fs::remove_file(&status);
            Some(status)
        }
        _ => None,
    };
    let task_path = launch.env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
    let exec_error = |source| SpawnError::Exec { program: program.clone(), source };
    let found = match &launch.container {
        // Found inside the image, by the container's init.
        Some(_) => PathBuf::new(),
        None => find_program(program, &task_path, work_dir).map_err(exec_error)?,
    };
    // The child joins the cgroups, leads its own process group and (unless
    // a shim does it for the command) becomes the task's account, then
    // execs what runs the task: the command itself, or its shim in front
    // of it (`muster task-shim`, or `muster task-exec`, which stays the
    // agent's and starts the command as the account). An image task's
    // container init becomes the account and writes the status itself.
    let container = launch.container.as_ref();
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    let mut drop_to = if container.is_some() { None } else { launch.user.clone() };
    if let (Some(status), Some(exe), None) = (&status_file, muster.exe, container) {
        match drop_to.take() {
            Some(user) => argv.extend([
                exe.into(),
                TASK_EXEC_SUBCOMMAND.into(),
                "--user".into(),
                user.to_arg().into(),
                "--status".into(),
                status.into(),
            ]),
            None => argv.extend([exe.into(), SHIM_SUBCOMMAND.into(), "--status".into(), status.into()]),
        }
        argv.push("--".into());
    }
    let path = if argv.is_empty() { found.into_os_string() } else { argv[0].clone() };
    argv.extend(launch.command.iter().map(Into::into));
    // A container sees the image's environment and the task's, never the
    // agent's own.
    let mut env: BTreeMap<std::ffi::OsString, std::ffi::OsString> = match container {
        Some(c) => c.config.env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect(),
        None => std::env::vars_os().collect(),
    };
    let launcher = crate::launcher::launcher_env(launch, &hosts);
    let ours = [
        ("MUSTER_ALLOC_ID", launch.alloc.to_string()),
        ("MUSTER_TASK_INDEX", launch.task.to_string()),
        ("MUSTER_GANG_SIZE", launch.gang_size.to_string()),
        ("MUSTER_GANG_PEERS", launch.peers.join(",")),
        ("MUSTER_ATTEMPT", launch.attempt.to_string()),
        ("MUSTER_EPOCH", launch.epoch.to_string()),
        ("CUDA_VISIBLE_DEVICES", launch.gpu_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
    ];
    let pairs = launcher
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    env.extend(pairs.map(|(k, v)| (k.into(), v.into())));
    env.extend(ours.iter().map(|(k, v)| ((*k).into(), v.into())));
    env.insert("MUSTER_CHECKPOINT_DIR".into(), launch.checkpoint_dir.clone().into_os_string());
    // An image task execs the container helper, its plan holding the
    // task's command and environment.
    let (path, argv, env) = match container {
        None => (path, argv, env),
        Some(c) => {
            let exe = muster.exe.ok_or_else(|| {
                exec_error(io::Error::new(io::ErrorKind::NotFound, "an image task needs the muster binary's path"))
            })?;
            let plan_path = container_plan(launch, c, work_dir, &hosts, &progress, &env, status_file.clone())
                .map_err(|source| SpawnError::Logs { path: dir.clone(), source })?;
            let argv: Vec<std::ffi::OsString> = vec![
                exe.into(),
                crate::container::CONTAINER_SUBCOMMAND.into(),
                "--plan".into(),
                plan_path.into_os_string(),
            ];
            (argv[0].clone(), argv, BTreeMap::new())
        }
    };
    let c = |s: std::ffi::OsString| {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::CString::new(s.into_vec()).map_err(|_| {
            exec_error(io::Error::new(io::ErrorKind::InvalidInput, "an argument or variable holds a NUL byte"))
        })
    };
    let devnull = File::open("/dev/null").map_err(exec_error)?;
    let plan = child::Plan {
        program: c(path)?,
        argv: argv.into_iter().map(c).collect::<Result<_, _>>()?,
        env: env
            .into_iter()
            .map(|(mut k, v)| {
                k.push("=");
                k.push(v);
                c(k)
            })
            .collect::<Result<_, _>>()?,
        cwd: c(work_dir.as_os_str().to_owned())?,
        stdio: [devnull.into(), stdout.into(), stderr.into()],
        join: match &cgroup {
            Some(cg) => cg.join_files().map_err(SpawnError::Cgroup)?,
            None => Vec::new(),
        },
        user: drop_to,
    };
    let pid = child::start(&plan).map_err(|failed| match failed {
        child::Failed::Join(e) => SpawnError::Cgroup(e),
        child::Failed::User(e) => SpawnError::User(e),
        child::Failed::Clone(e) | child::Failed::Setup(e) | child::Failed::Exec(e) => exec_error(e),
    })?;
    Ok(RunningTask {
        inner: Inner::Child(child::Process::new(pid)),
        pgid: pid,
        leader: None,
        exited: None,
        cgroup,
        usage: None,
    })
}

/// Writes the container plan of `launch` into its attempt's directory and
/// returns its path.
fn container_plan(
    launch: &TaskLaunch,
    c: &ContainerLaunch,
    work_dir: &Path,
    hosts: &Path,
    progress: &Path,
    env: &BTreeMap<std::ffi::OsString, std::ffi::OsString>,
    status: Option<PathBuf>,
) -> io::Result<PathBuf> {
    use crate::container::{Bind, ContainerPlan};
    let dir = crate::container::attempt_dir(work_dir, launch.alloc, launch.task, launch.attempt);
    crate::container::remove_attempt_dirs(&dir)?;
    private_dirs(&dir)?;
    // The task's own files at their own paths, so the launcher variables
    // and the checkpoint directory mean the same inside.
    let mut binds =
        vec![Bind { source: launch.checkpoint_dir.clone(), target: launch.checkpoint_dir.clone(), read_only: false }];
    for f in [hosts, progress] {
        if !f.exists() {
            private_file(f)?;
            if let Some(u) = &launch.user {
                std::os::unix::fs::lchown(f, Some(u.uid), Some(u.gid))?;
            }
        }
        binds.push(Bind { source: f.to_path_buf(), target: f.to_path_buf(), read_only: f == hosts });
    }
    binds.extend(c.binds.iter().cloned());
    let mut devices = Vec::new();
    if !launch.gpu_ids.is_empty() {
        for d in launch.gpu_ids.iter().map(|g| format!("/dev/nvidia{g}")).chain(
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"].map(String::from),
        ) {
            if Path::new(&d).exists() {
                devices.push(PathBuf::from(d));
            }
        }
    }
    let workdir = c
        .workdir
        .clone()
        .or_else(|| Some(c.config.working_dir.clone()).filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".to_string());
    let mut name = [0u8; 256];
    // SAFETY: a valid buffer of its length.
    let hostname = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned()
    } else {
        "muster".to_string()
    };
    let plan = ContainerPlan {
        layers: c.layers.clone(),
        upper: dir.join("upper"),
        work: dir.join("work"),
        root: dir.join("root"),
        binds,
        devices,
        hostname,
        workdir,
        argv: c.argv(&launch.command),
        env: env.iter().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect(),
        user: launch.user.as_ref().map(crate::users::TaskUser::to_arg),
        status,
        oci: c.runtime.as_ref().map(|program| crate::oci::OciRuntime {
            program: program.clone(),
            state: dir.join("state"),
            bundle: dir.join("bundle"),
            id: format!("muster-{}-{}-{}", launch.alloc, launch.task, launch.attempt),
        }),
        nvidia: c
            .nvidia
            .as_ref()
            .filter(|_| !launch.gpu_ids.is_empty())
            .map(|program| crate::nvidia::NvidiaHook { program: program.clone(), gpus: launch.gpu_ids.clone() }),
    };
    let path = dir.join("plan.json");
    crate::container::write_plan(&path, &plan)?;
    Ok(path)
}

/// The subcommand of the `muster` binary that runs [`run_task_exec`].
pub const TASK_EXEC_SUBCOMMAND: &str = "task-exec";

/// `muster task-exec --user U --status FILE -- CMD…`: the shim of a task
/// that runs as another account. It stays the agent's (the task can
/// neither signal it nor forge its status), starts CMD as the account,
/// waits for it and writes its exit status (see [`run_shim`]).
pub fn run_task_exec(user: &crate::users::TaskUser, status: &Path, command: &[String]) -> i32 {
    run_shim_as(status, command, Some(user))
}

/// A signal the agent sends a running attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskSignal {
    /// Stop (SIGTERM), to the group and every process of its cgroup.
    Term,
    /// Kill (SIGKILL), to the group and every process of its cgroup.
    Kill,
    /// The checkpoint hint (SIGUSR1), to the process group only: a process
    /// that left the group never asked for it and would die of it.
    Checkpoint,
}

/// A future an [`Attempt`] returns.
pub type AttemptFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<Exit>> + Send + 'a>>;

/// A started attempt, whatever runs it: a process group ([`RunningTask`]),
/// or a simulated one ([`sim`], for fleet benches).
pub trait Attempt: Send + 'static {
    /// Its process group (0: no process).
    fn pgid(&self) -> i32;
    /// Ends once nothing of the attempt is left. Cancel-safe: a wait
    /// dropped part-way resumes where it was.
    fn wait(&mut self) -> AttemptFuture<'_>;
    /// SIGTERM, up to `grace` for it to end, then SIGKILL.
    fn stop(&mut self, grace: Duration) -> AttemptFuture<'_> {
        Box::pin(async move {
            self.signal(TaskSignal::Term);
            match tokio::time::timeout(grace, self.wait()).await {
                Ok(exit) => exit,
                Err(_) => {
                    self.signal(TaskSignal::Kill);
                    self.wait().await
                }
            }
        })
    }
    /// Sends it `signal`.
    fn signal(&mut self, signal: TaskSignal);
    /// What it uses now (`None`: not known).
    fn usage_now(&self) -> Option<Usage>;
    /// What it used, once `wait` returned (`None`: not known).
    fn usage(&self) -> Option<Usage>;
}

impl Attempt for RunningTask {
    fn pgid(&self) -> i32 {
        self.pgid
    }

    fn wait(&mut self) -> AttemptFuture<'_> {
        Box::pin(RunningTask::wait(self))
    }

    fn stop(&mut self, grace: Duration) -> AttemptFuture<'_> {
        Box::pin(RunningTask::stop(self, grace))
    }

    fn signal(&mut self, signal: TaskSignal) {
        match signal {
            TaskSignal::Term => RunningTask::signal(self, libc::SIGTERM),
            TaskSignal::Kill => RunningTask::signal(self, libc::SIGKILL),
            TaskSignal::Checkpoint => signal_group(self.pgid, libc::SIGUSR1),
        }
    }

    fn usage_now(&self) -> Option<Usage> {
        self.cgroup.as_ref().map(TaskCgroup::usage)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

/// What starts attempts: real processes ([`ProcessExecutor`], the default)
/// or simulated ones ([`sim::SimExecutor`]).
pub trait Executor: Send + Sync + std::fmt::Debug + 'static {
    /// Starts one attempt (`cgroup`: the one it joins, if any).
    fn spawn(
        &self,
        launch: &TaskLaunch,
        work_dir: &Path,
        muster: Muster<'_>,
        cgroup: Option<TaskCgroup>,
    ) -> Result<Box<dyn Attempt>, SpawnError>;

    /// Whether its attempts are real processes, which leave logs and may
    /// be adopted by a later agent. A simulated executor's are not: the
    /// agent refuses isolation, images, a task shim and other accounts
    /// with it.
    fn real(&self) -> bool {
        true
    }
}

/// Real child processes: [`spawn`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessExecutor;

impl Executor for ProcessExecutor {
    fn spawn(
        &self,
        launch: &TaskLaunch,
        work_dir: &Path,
        muster: Muster<'_>,
        cgroup: Option<TaskCgroup>,
    ) -> Result<Box<dyn Attempt>, SpawnError> {
        spawn(launch, work_dir, muster, cgroup).map(|t| Box::new(t) as Box<dyn Attempt>)
    }
}

impl RunningTask {
    /// The process group id (the leader's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Its cgroup, if it has one.
    pub fn cgroup(&self) -> Option<&TaskCgroup> {
        self.cgroup.as_ref()
    }

    /// What it used, read from its cgroup once it ended (`None` before, or
    /// without a cgroup).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Waits for the attempt to end; then kills whatever is left of it (its
    /// process group, and every process in its cgroup, however it
    /// daemonised) and waits until none is left, so nothing it started
    /// outlives it and its capacity is free when this returns.
    /// Cancel-safe: a wait dropped part-way resumes where it was.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        let exit = match self.leader {
            Some(exit) => exit,
            None => {
                let exit = match &mut self.inner {
                    Inner::Child(child) => child.wait().await?,
                    Inner::Adopted { status } => {
                        while alive(self.pgid) {
                            tokio::time::sleep(ADOPTED_POLL).await;
                        }
                        // A shim killed outright (SIGKILL) wrote nothing.
                        read_status(status).unwrap_or(Exit::Signal(libc::SIGKILL))
                    }
                };
                self.leader = Some(exit);
                exit
            }
        };
        signal_group(self.pgid, libc::SIGKILL);
        if let Some(cg) = &self.cgroup {
            cg.kill_all().await;
            self.usage = Some(cg.usage());
            cg.remove();
        }
        self.exited = Some(exit);
        Ok(exit)
    }

    /// Stops the attempt: SIGTERM to the group and to every process in its
    /// cgroup, up to `grace` for its leader to exit, then SIGKILL to all of
    /// it. Returns how it ended.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<Exit> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        RunningTask::signal(self, libc::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(exit) => exit,
            Err(_) => {
                RunningTask::signal(self, libc::SIGKILL);
                self.wait().await
            }
        }
    }

    /// Sends `signal` to the process group and to every process in the
    /// cgroup (one that left the group with `setsid` too).
    pub fn signal(&self, signal: i32) {
        signal_group(self.pgid, signal);
        if let Some(cg) = &self.cgroup {
            cg.signal_all(signal);
        }
    }
}

mod child;
pub mod sim;
#[cfg(test)]
mod tests;
