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

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// The directory under `MUSTER_CHECKPOINT_DIR` the protocol's files live in
/// (never packed into the checkpoint).
pub const PROTOCOL_DIR: &str = ".muster";

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
        let dir = checkpoint_dir.join(PROTOCOL_DIR);
        fs::create_dir_all(&dir)?;
        for stale in ["ack", "defer", "done"] {
            let _ = fs::remove_file(dir.join(stale));
        }
        let request = format!(
            "{{\"epoch\":{},\"deadline_unix_ms\":{},\"timeout_ms\":{},\"max_deferral_ms\":{}}}\n",
            hint.epoch,
            unix_ms + hint.timeout.as_millis() as u64,
            hint.timeout.as_millis(),
            hint.max_deferral.as_millis()
        );
        let tmp = dir.join("request.tmp");
        fs::write(&tmp, request)?;
        fs::rename(&tmp, dir.join("request"))?;
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
        if self.dir.join("done").exists() {
            return Verdict::Done;
        }
        if let Ok(text) = fs::read_to_string(self.dir.join("defer")) {
            // Consumed, so that a later request is a new one.
            let _ = fs::remove_file(self.dir.join("defer"));
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
        if !self.extended && self.dir.join("ack").exists() {
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
}
