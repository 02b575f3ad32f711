//! Starting a task's process without forking the agent, and waiting for it.
//!
//! A task must be in its cgroups, in its own process group and (on a root
//! agent) its own account before it runs a line of its code. The standard
//! library can do that only in a pre-exec step, which makes it `fork` the
//! whole agent (its page tables, for every start); a helper that joins and
//! then execs the task costs a second `exec` per start. [`start`] does what
//! glibc's `posix_spawn` does inside: a `clone(CLONE_VM | CLONE_VFORK)`
//! child on its own small stack shares the agent's memory (nothing is
//! copied), runs the steps below, and execs; the calling thread sleeps
//! until it has.
//!
//! ```text
//!   agent thread ── signals blocked ── clone(VM|VFORK) ──────────────── resumes: pid, or the step that failed
//!                                         │
//!                                         └─ child: default signal handlers → write "0" to each cgroup.procs
//!                                            → setpgid(0,0) → stdin/stdout/stderr → chdir → setgroups/setresgid/
//!                                            setresuid (raw syscalls) → empty signal mask → execve
//! ```
//!
//! Between `clone` and `execve` the child touches only memory the agent
//! prepared before it (argv, envp, descriptors), allocates nothing, takes
//! no lock and calls only async-signal-safe functions. It changes its
//! credentials with raw system calls: glibc's `setuid` would ask every
//! thread of what it believes is its (the agent's) process to change too.
//!
//! [`Process`] waits for the child through a pidfd, so no `SIGCHLD` handler
//! and no poll is needed (a poll every 50 ms where the kernel has none).

use std::ffi::{CString, c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::Exit;
use crate::users::TaskUser;

/// What the child does before it execs `program`.
pub(super) struct Plan {
    /// The program's path, found as `execvp` would.
    pub program: CString,
    /// argv (argv\[0\] as the user wrote it).
    pub argv: Vec<CString>,
    /// The whole environment, `KEY=VALUE`.
    pub env: Vec<CString>,
    /// The working directory.
    pub cwd: CString,
    /// Standard input, output and error.
    pub stdio: [OwnedFd; 3],
    /// The `cgroup.procs` files to write 0 (the writer) to (held open by
    /// the attempt's cgroup).
    pub join: Vec<std::sync::Arc<std::fs::File>>,
    /// The account to become (`None`: stay the agent's).
    pub user: Option<TaskUser>,
}

/// The step of the child that failed, with its error.
#[derive(Debug)]
pub(super) enum Failed {
    /// `clone` itself.
    Clone(io::Error),
    /// Joining a cgroup.
    Join(io::Error),
    /// Its process group, standard descriptors or working directory.
    Setup(io::Error),
    /// Becoming the task's account.
    User(io::Error),
    /// `execve`.
    Exec(io::Error),
}

const STEP_JOIN: i32 = 1;
const STEP_SETUP: i32 = 2;
const STEP_USER: i32 = 3;
const STEP_EXEC: i32 = 4;

/// The child's stack: its own frames only (argv and envp are the agent's).
const STACK: usize = 128 * 1024;

/// What the child reads (all of it prepared by the parent) and where it
/// leaves the step that failed and its errno.
struct Shared {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    join: *const RawFd,
    join_len: usize,
    user: Option<(*const libc::gid_t, usize, libc::uid_t, libc::gid_t)>,
    step: AtomicI32,
    errno: AtomicI32,
}

/// Starts `plan`'s program; returns its pid once it has exec'd.
pub(super) fn start(plan: &Plan) -> Result<i32, Failed> {
    let mut argv: Vec<*const libc::c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = plan.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let join: Vec<RawFd> = plan.join.iter().map(AsRawFd::as_raw_fd).collect();
    let shared = Shared {
        program: plan.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: plan.cwd.as_ptr(),
        stdio: [plan.stdio[0].as_raw_fd(), plan.stdio[1].as_raw_fd(), plan.stdio[2].as_raw_fd()],
        join: join.as_ptr(),
        join_len: join.len(),
        user: plan.user.as_ref().map(|u| (u.groups.as_ptr(), u.groups.len(), u.uid, u.gid)),
        step: AtomicI32::new(0),
        errno: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; STACK];
    // The stack grows down from its (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    // SAFETY: the child runs `child` on its own stack, reading `shared`
    // (and what it points to), all of which outlives the call: CLONE_VFORK
    // suspends this thread until the child has exec'd or exited. Every
    // signal is blocked across the clone so that no handler of the agent's
    // runs in the child before it has reset them.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw const shared).cast_mut().cast(),
        );
        let error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(Failed::Clone(error));
        }
        pid
    };
    drop(stack);
    let step = shared.step.load(Ordering::Acquire);
    if step == 0 {
        return Ok(pid);
    }
    // The child has exited: reap it, and say which step failed.
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let error = io::Error::from_raw_os_error(shared.errno.load(Ordering::Acquire));
    Err(match step {
        STEP_JOIN => Failed::Join(error),
        STEP_SETUP => Failed::Setup(error),
        STEP_USER => Failed::User(error),
        _ => Failed::Exec(error),
    })
}

/// The child, between clone and exec. Only async-signal-safe calls, on
/// memory the parent prepared; never returns on success.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Shared`, alive while the parent is
    // suspended (CLONE_VFORK); every pointer in it is valid and
    // NUL-terminated where C expects it.
    unsafe {
        let s = &*(arg as *const Shared);
        let fail = |step: i32| -> c_int {
            s.errno.store(*libc::__errno_location(), Ordering::Release);
            s.step.store(step, Ordering::Release);
            libc::_exit(127)
        };
        // A signal caught by the agent's handlers must not run them here
        // (they share this memory): back to the default, and SIGPIPE, which
        // the agent ignores, too. (glibc refuses its own two; that is fine.)
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        for i in 0..s.join_len {
            if libc::write(*s.join.add(i), b"0".as_ptr().cast(), 1) != 1 {
                return fail(STEP_JOIN);
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(STEP_SETUP);
        }
        for (target, &fd) in s.stdio.iter().enumerate() {
            let target = target as c_int;
            // dup2 onto itself keeps close-on-exec: clear it instead.
            let done = if fd == target { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, target) };
            if done < 0 {
                return fail(STEP_SETUP);
            }
        }
        if libc::chdir(s.cwd) != 0 {
            return fail(STEP_SETUP);
        }
        if let Some((groups, n, uid, gid)) = s.user
            && (libc::syscall(libc::SYS_setgroups, n, groups) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0)
        {
            return fail(STEP_USER);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(s.program, s.argv, s.envp);
        fail(STEP_EXEC)
    }
}

/// How often a child is checked where the kernel has no pidfd.
const POLL: Duration = Duration::from_millis(50);

/// A child started by [`start`], waited for (and reaped) through a pidfd.
pub(super) struct Process {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    exit: Option<Exit>,
}

impl Process {
    /// Takes charge of child `pid`. Must be called inside a tokio runtime.
    pub(super) fn new(pid: i32) -> Process {
        // SAFETY: pidfd_open on our own child; the descriptor it returns
        // is ours to own, and the AsyncFd owns it from then on (it stays
        // open, the same description, for the AsyncFd's whole life).
        let pidfd = unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
            let fd = (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as RawFd));
            fd.and_then(|fd| AsyncFd::register_with_interest(fd, Interest::READABLE).ok())
        };
        Process { pid, pidfd, exit: None }
    }

    /// Waits for the child to exit and reaps it. Cancel-safe.
    pub(super) async fn wait(&mut self) -> io::Result<Exit> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let exit = wait_for(self.pid, self.pidfd.as_ref()).await?;
        self.exit = Some(exit);
        Ok(exit)
    }
}

/// Waits for child `pid` (through its pidfd, if any) and reaps it.
async fn wait_for(pid: i32, pidfd: Option<&AsyncFd<OwnedFd>>) -> io::Result<Exit> {
    loop {
        if let Some(exit) = try_wait(pid)? {
            return Ok(exit);
        }
        match pidfd {
            Some(fd) => fd.readable().await?.clear_ready(),
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// How child `pid` exited, if it has (reaping it).
fn try_wait(pid: i32) -> io::Result<Option<Exit>> {
    let mut status = 0;
    // SAFETY: waiting for our own child, without blocking.
    let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if got == 0 {
        return Ok(None);
    }
    Ok(Some(if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    }))
}

impl Drop for Process {
    /// A child dropped before it was reaped is reaped in the background
    /// once it exits, not left a zombie.
    fn drop(&mut self) {
        if self.exit.is_some() || !matches!(try_wait(self.pid), Ok(None)) {
            return;
        }
        let (pid, pidfd) = (self.pid, self.pidfd.take());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = wait_for(pid, pidfd.as_ref()).await;
            });
        }
    }
}
