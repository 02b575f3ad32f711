//! The checkpoint-hint protocol between the agent and a task being preempted
//! for a higher class.
//!
//! ```text
//!   hint ──▶ MUSTER_CHECKPOINT_DIR/.muster/request  {"epoch":…,"deadline_unix_ms":…,…}
//!        ──▶ SIGUSR1 to the task's process group
//!   task may write, in .muster/:
//!     ack     "I am checkpointing": a deadline that passes gets one extension
//!             of timeout / 2
//!     defer   seconds: the deadline in force moves out by that much; the
//!             file is consumed, so the task may ask again, and all its
//!             deferrals together add at most max deferral
//!     done    the checkpoint is complete ──▶ SIGTERM → grace → SIGKILL
//!   (or it exits)                         ──▶ the directory is uploaded
//!   deadline passed, no answer            ──▶ killed; nothing uploaded;
//!                                             reported checkpoint_failed
//! ```
//!
//! [`HintWatch`] is the decision part: it reads the answer files and is
//! given the time, so tests drive it with any clock.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// The directory under `MUSTER_CHECKPOINT_DIR` the protocol's files live in
/// (never packed into the checkpoint).
pub const PROTOCOL_DIR: &str = ".muster";

/// The protocol's directory, opened without following a symlink: the task
/// owns its checkpoint directory (it may run as another user) and could
/// leave a link to anywhere in its place, so the agent, often root, reads,
/// writes and removes files only through this handle, and never through a
/// link inside it.
pub struct ProtocolDir(OwnedFd);

impl ProtocolDir {
    /// Opens `checkpoint_dir/.muster`, creating it first if `create`.
    pub fn open(checkpoint_dir: &Path, create: bool) -> io::Result<ProtocolDir> {
        let path = checkpoint_dir.join(PROTOCOL_DIR);
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if create {
            // SAFETY: a valid NUL-terminated path.
            if unsafe { libc::mkdir(c.as_ptr(), 0o755) } != 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return Err(e);
                }
            }
        }
        // SAFETY: as above; the result is checked before it is owned.
        let fd =
            unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        Ok(ProtocolDir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn name(name: &str) -> CString {
        CString::new(name).expect("protocol file names have no NUL")
    }

    fn open_at(&self, name: &str, flags: i32) -> io::Result<std::fs::File> {
        let n = Self::name(name);
        // SAFETY: a valid directory descriptor and NUL-terminated name.
        let fd =
            unsafe { libc::openat(self.0.as_raw_fd(), n.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o644) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// Writes `name` whole (a temporary file renamed into place).
    pub fn write(&self, name: &str, text: &str) -> io::Result<()> {
        use std::io::Write;
        let tmp = format!("{name}.tmp");
        self.remove(&tmp);
        let mut f = self.open_at(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)?;
        f.write_all(text.as_bytes())?;
        let (from, to) = (Self::name(&tmp), Self::name(name));
        let fd = self.0.as_raw_fd();
        // SAFETY: valid descriptors and NUL-terminated names.
        if unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads `name`, a regular file, up to 4 KiB of it.
    pub fn read(&self, name: &str) -> io::Result<String> {
        let f = self.open_at(name, libc::O_RDONLY | libc::O_NONBLOCK)?;
        if !f.metadata()?.is_file() {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        let mut text = String::new();
        f.take(4096).read_to_string(&mut text)?;
        Ok(text)
    }

    /// Whether `name` is there (a link counts, and is never followed).
    pub fn exists(&self, name: &str) -> bool {
        let n = Self::name(name);
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, name and out pointer.
        unsafe { libc::fstatat(self.0.as_raw_fd(), n.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 }
    }

    /// Removes `name` (a link is removed, not what it points at).
    pub fn remove(&self, name: &str) {
        let n = Self::name(name);
        // SAFETY: valid descriptor and name; an absent file is fine.
        unsafe { libc::unlinkat(self.0.as_raw_fd(), n.as_ptr(), 0) };
    }
}

/// What the scheduler asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    /// The preemption epoch.
    pub epoch: u64,
    /// How long the task has to checkpoint.
    pub timeout: Duration,
    /// The longest deferral it may ask for (from the hint).
    pub max_deferral: Duration,
    /// SIGTERM → SIGKILL grace once it is done (or out of time).
    pub grace: Duration,
}

/// What to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep waiting.
    Wait,
    /// The checkpoint is complete: stop the task.
    Done,
    /// No answer in time: kill it; it did not checkpoint.
    TimedOut,
}

/// One task's hint in progress.
#[derive(Debug)]
pub struct HintWatch {
    hint: Hint,
    dir: PathBuf,
    deadline: Instant,
    extended: bool,
    /// Time the task's deferrals have added so far (≤ max deferral).
    deferred: Duration,
}

impl HintWatch {
    /// Starts a hint for the task whose checkpoint directory is `checkpoint_dir`
    /// at `now` (wall time `unix_ms`, from the agent's clock: the request
    /// file tells the task its deadline in wall time): clears old answers
    /// and writes the request file. The caller signals the process group.
    pub fn start(hint: Hint, checkpoint_dir: &Path, now: Instant, unix_ms: u64) -> std::io::Result<HintWatch> {
        let dir = checkpoint_dir.to_path_buf();
        let protocol = ProtocolDir::open(&dir, true)?;
        for stale in ["ack", "defer", "done"] {
            protocol.remove(stale);
        }
        let request = format!(
            "{{\"epoch\":{},\"deadline_unix_ms\":{},\"timeout_ms\":{},\"max_deferral_ms\":{}}}\n",
            hint.epoch,
            unix_ms + hint.timeout.as_millis() as u64,
            hint.timeout.as_millis(),
            hint.max_deferral.as_millis()
        );
        protocol.write("request", &request)?;
        Ok(HintWatch { hint, dir, deadline: now + hint.timeout, extended: false, deferred: Duration::ZERO })
    }

    /// The hint.
    pub fn hint(&self) -> &Hint {
        &self.hint
    }

    /// The current deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads the task's answers and decides, at `now`.
    pub fn check(&mut self, now: Instant) -> Verdict {
        // A directory the task removed or replaced reads as no answer.
        let protocol = ProtocolDir::open(&self.dir, false).ok();
        let exists = |name| protocol.as_ref().is_some_and(|p| p.exists(name));
        if exists("done") {
            return Verdict::Done;
        }
        if let Some(text) = protocol.as_ref().and_then(|p| p.read("defer").ok()) {
            // Consumed, so that a later request is a new one.
            if let Some(p) = &protocol {
                p.remove("defer");
            }
            let asked = text.trim().parse::<u64>().map(Duration::from_secs).unwrap_or(self.hint.max_deferral);
            let granted = asked.min(self.hint.max_deferral.saturating_sub(self.deferred));
            self.deferred += granted;
            self.deadline += granted;
            tracing::info!(
                epoch = self.hint.epoch,
                asked_s = asked.as_secs(),
                granted_s = granted.as_secs(),
                deferred_s = self.deferred.as_secs(),
                "task asked to defer its checkpoint"
            );
        }
        if now < self.deadline {
            return Verdict::Wait;
        }
        if !self.extended && exists("ack") {
            self.extended = true;
            self.deadline = now.max(self.deadline) + self.hint.timeout / 2;
            tracing::info!(epoch = self.hint.epoch, "slow checkpoint acknowledged; extending the deadline by 50 %");
            return Verdict::Wait;
        }
        Verdict::TimedOut
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn hint() -> Hint {
        Hint {
            epoch: 3,
            timeout: Duration::from_secs(600),
            max_deferral: Duration::from_secs(300),
            grace: Duration::from_secs(30),
        }
    }

    fn answer(dir: &Path, file: &str, text: &str) {
        fs::write(dir.join(PROTOCOL_DIR).join(file), text).unwrap();
    }

    #[test]
    fn the_request_file_names_the_epoch_and_stale_answers_are_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join(PROTOCOL_DIR)).unwrap();
        answer(tmp.path(), "done", "");
        let t0 = Instant::now();
        let mut w = HintWatch::start(hint(), tmp.path(), t0, 1_000).unwrap();
        let req = fs::read_to_string(tmp.path().join(".muster/request")).unwrap();
        assert!(req.contains("\"epoch\":3") && req.contains("\"timeout_ms\":600000"), "{req}");
        assert_eq!(w.check(t0), Verdict::Wait, "an old done marker does not count");
        answer(tmp.path(), "done", "");
        assert_eq!(w.check(t0 + Duration::from_secs(1)), Verdict::Done);
    }

    #[test]
    fn silence_past_the_timeout_is_unresponsive() {
        let tmp = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut w = HintWatch::start(hint(), tmp.path(), t0, 1_000).unwrap();
        assert_eq!(w.check(t0 + Duration::from_secs(599)), Verdict::Wait);
        assert_eq!(w.check(t0 + Duration::from_secs(600)), Verdict::TimedOut);
    }

    #[test]
    fn an_acknowledged_slow_checkpoint_gets_one_fifty_percent_extension() {
        let tmp = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut w = HintWatch::start(hint(), tmp.path(), t0, 1_000).unwrap();
        answer(tmp.path(), "ack", "");
        assert_eq!(w.check(t0 + Duration::from_secs(600)), Verdict::Wait, "extended");
        assert_eq!(w.deadline(), t0 + Duration::from_secs(900));
        assert_eq!(w.check(t0 + Duration::from_secs(899)), Verdict::Wait);
        assert_eq!(w.check(t0 + Duration::from_secs(900)), Verdict::TimedOut, "only once");
    }

    #[test]
    fn a_deferral_extends_the_deadline_in_force_up_to_the_maximum_in_all() {
        let tmp = tempfile::tempdir().unwrap();
        let short = Hint { timeout: Duration::from_secs(60), ..hint() };
        let t0 = Instant::now();
        let mut w = HintWatch::start(short, tmp.path(), t0, 1_000).unwrap();
        answer(tmp.path(), "defer", "120\n");
        assert_eq!(w.check(t0 + Duration::from_secs(1)), Verdict::Wait);
        assert_eq!(w.deadline(), t0 + Duration::from_secs(180), "the 60 s deadline plus 120 s");
        assert_eq!(w.check(t0 + Duration::from_secs(179)), Verdict::Wait);
        assert_eq!(w.check(t0 + Duration::from_secs(180)), Verdict::TimedOut);

        // With the default timeout longer than the maximum deferral, a
        // deferral still adds time (it used to be absorbed by the timeout).
        let tmp = tempfile::tempdir().unwrap();
        let mut w = HintWatch::start(hint(), tmp.path(), t0, 1_000).unwrap();
        answer(tmp.path(), "defer", "40");
        assert_eq!(w.check(t0 + Duration::from_secs(1)), Verdict::Wait);
        assert_eq!(w.deadline(), t0 + Duration::from_secs(640));

        // Asked again, the total is capped at the maximum deferral.
        let tmp = tempfile::tempdir().unwrap();
        let mut w = HintWatch::start(short, tmp.path(), t0, 1_000).unwrap();
        answer(tmp.path(), "defer", "200");
        assert_eq!(w.check(t0 + Duration::from_secs(1)), Verdict::Wait);
        answer(tmp.path(), "defer", "200");
        assert_eq!(w.check(t0 + Duration::from_secs(2)), Verdict::Wait);
        assert_eq!(w.deadline(), t0 + Duration::from_secs(360), "60 s + 300 s of deferral in all");
        answer(tmp.path(), "defer", "100000");
        assert_eq!(w.check(t0 + Duration::from_secs(3)), Verdict::Wait);
        assert_eq!(w.deadline(), t0 + Duration::from_secs(360), "nothing more");
        answer(tmp.path(), "done", "");
        assert_eq!(w.check(t0 + Duration::from_secs(200)), Verdict::Done);
    }

    #[test]
    fn links_a_task_leaves_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (task, elsewhere) = (tmp.path().join("ckpt"), tmp.path().join("elsewhere"));
        fs::create_dir_all(&task).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        // The protocol directory replaced by a link: no request is written
        // through it, and nothing of the target's is removed.
        fs::write(elsewhere.join("done"), "keep").unwrap();
        std::os::unix::fs::symlink(&elsewhere, task.join(PROTOCOL_DIR)).unwrap();
        assert!(HintWatch::start(hint(), &task, Instant::now(), 0).is_err());
        assert!(!elsewhere.join("request").exists() && elsewhere.join("done").exists());
        // A `defer` that links to another file is not read; the link goes.
        fs::remove_file(task.join(PROTOCOL_DIR)).unwrap();
        let mut w = HintWatch::start(hint(), &task, Instant::now(), 0).unwrap();
        fs::write(elsewhere.join("secret"), "99999").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("secret"), task.join(PROTOCOL_DIR).join("defer")).unwrap();
        let deadline = w.deadline();
        assert_eq!(w.check(Instant::now()), Verdict::Wait);
        assert_eq!(w.deadline(), deadline, "a linked defer is no answer");
        assert!(elsewhere.join("secret").exists());
    }
}
