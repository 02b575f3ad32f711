//! Simulated attempts, for fleet benches: an attempt "runs" for a duration
//! drawn from a distribution (or `sleep N`'s N seconds) and exits 0. It
//! starts no process and writes no file, except its answer to a checkpoint
//! hint. Everything around it is the real agent: registration, the stream,
//! claims, watchdogs, hints, end reports and their acknowledgements.
//!
//! ```text
//!   spawn ──▶ ends_at = now + draw ── wait() ──▶ Exit::Code(0)
//!     Term ──▶ ends within term_delay (Signal 15); Kill ──▶ now (Signal 9)
//!     Checkpoint ──▶ after hint_reply: writes a state file and .muster/done
//! ```
//!
//! Draws are deterministic: seeded by the config's seed, the node and the
//! attempt (allocation, task, epoch, attempt), not by the order of events.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::{Attempt, AttemptFuture, Executor, Exit, Muster, SpawnError, TaskLaunch, TaskSignal};
use crate::cgroup::{TaskCgroup, Usage};

/// How long simulated attempts run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Durations {
    /// Always this long.
    Fixed(Duration),
    /// Uniform between the two.
    Uniform(Duration, Duration),
    /// Exponential with this mean.
    Exp(Duration),
}

impl Durations {
    /// Parses `fixed:5s`, `uniform:1s..10s` or `exp:30s` (a number with
    /// `ms`, `s`, `m` or `h`).
    pub fn parse(s: &str) -> Result<Durations, String> {
        let d = |v: &str| parse_duration(v.trim()).ok_or_else(|| format!("{v:?} is not a duration (500ms, 2s, 1m)"));
        match s.split_once(':') {
            Some(("fixed", v)) => Ok(Durations::Fixed(d(v)?)),
            Some(("exp", v)) => Ok(Durations::Exp(d(v)?)),
            Some(("uniform", v)) => {
                let (lo, hi) = v.split_once("..").ok_or_else(|| format!("uniform:{v}: expected LOW..HIGH"))?;
                let (lo, hi) = (d(lo)?, d(hi)?);
                if lo > hi {
                    return Err(format!("uniform:{v}: {lo:?} is above {hi:?}"));
                }
                Ok(Durations::Uniform(lo, hi))
            }
            _ => Err(format!("{s:?}: expected fixed:D, uniform:LOW..HIGH or exp:MEAN")),
        }
    }

    /// The duration for a draw `u` in [0, 1).
    fn at(self, u: f64) -> Duration {
        match self {
            Durations::Fixed(d) => d,
            Durations::Uniform(lo, hi) => lo + (hi - lo).mul_f64(u),
            Durations::Exp(mean) => mean.mul_f64(-(1.0 - u).ln()),
        }
    }
}

/// How simulated attempts behave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    /// How long an attempt whose command is not `sleep N` runs.
    pub durations: Durations,
    /// Seeds the draws.
    pub seed: u64,
    /// How long a stopped attempt takes to end after SIGTERM (one that
    /// takes longer than the stop's grace is killed).
    pub term_delay: Duration,
    /// How long after a checkpoint hint the attempt writes its checkpoint
    /// and says it is done (`None`: it ignores hints, and is killed when
    /// its checkpoint timeout passes).
    pub hint_reply: Option<Duration>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            durations: Durations::Fixed(Duration::from_secs(1)),
            seed: 0,
            term_delay: Duration::ZERO,
            hint_reply: Some(Duration::from_millis(100)),
        }
    }
}

/// Starts simulated attempts for one node.
#[derive(Debug)]
pub struct SimExecutor {
    cfg: SimConfig,
    node: u64,
}

impl SimExecutor {
    /// The executor of node `node_id`.
    pub fn new(cfg: SimConfig, node_id: &str) -> SimExecutor {
        SimExecutor { cfg, node: fnv1a(node_id.as_bytes()) }
    }

    /// How long `launch` runs: `sleep N`'s N seconds, else a draw.
    pub fn run_time(&self, launch: &TaskLaunch) -> Duration {
        if let [program, secs] = launch.command.as_slice()
            && Path::new(program).file_name().is_some_and(|n| n == "sleep")
            && let Ok(s) = secs.parse::<f64>()
            && s.is_finite()
            && s >= 0.0
        {
            return Duration::from_secs_f64(s.min(1e9));
        }
        let key = launch.alloc.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(launch.task).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
            ^ launch.epoch.wrapping_mul(0x1656_67B1_9E37_79F9)
            ^ u64::from(launch.attempt).rotate_left(48);
        let bits = splitmix64(self.cfg.seed ^ self.node ^ key);
        self.cfg.durations.at((bits >> 11) as f64 / (1u64 << 53) as f64)
    }
}

impl Executor for SimExecutor {
    fn spawn(
        &self,
        launch: &TaskLaunch,
        _work_dir: &Path,
        _muster: Muster<'_>,
        _cgroup: Option<TaskCgroup>,
    ) -> Result<Box<dyn Attempt>, SpawnError> {
        if launch.command.is_empty() {
            return Err(SpawnError::EmptyCommand);
        }
        Ok(Box::new(SimAttempt {
            ends_at: Instant::now() + self.run_time(launch),
            exit: Exit::Code(0),
            done: None,
            hint_at: None,
            cfg: self.cfg,
            checkpoint_dir: launch.checkpoint_dir.clone(),
            attempt: launch.attempt,
        }))
    }

    fn real(&self) -> bool {
        false
    }
}

/// One simulated attempt.
#[derive(Debug)]
pub struct SimAttempt {
    ends_at: Instant,
    exit: Exit,
    done: Option<Exit>,
    hint_at: Option<Instant>,
    cfg: SimConfig,
    checkpoint_dir: PathBuf,
    attempt: u32,
}

impl SimAttempt {
    /// Answers a checkpoint hint as a task would: its state, then `done`.
    fn answer_hint(&self) -> io::Result<()> {
        std::fs::create_dir_all(&self.checkpoint_dir)?;
        std::fs::write(self.checkpoint_dir.join("sim-state"), format!("attempt {}\n", self.attempt))?;
        crate::hint::ProtocolDir::open(&self.checkpoint_dir, true)?.write("done", "")
    }
}

impl Attempt for SimAttempt {
    fn pgid(&self) -> i32 {
        0
    }

    fn wait(&mut self) -> AttemptFuture<'_> {
        Box::pin(async move {
            loop {
                if let Some(exit) = self.done {
                    return Ok(exit);
                }
                let hint = self.hint_at.filter(|&h| h < self.ends_at);
                tokio::time::sleep_until(hint.unwrap_or(self.ends_at)).await;
                if hint.is_some() {
                    self.hint_at = None;
                    if let Err(e) = self.answer_hint() {
                        tracing::warn!(error = %e, "simulated task cannot write its checkpoint");
                    }
                } else {
                    self.done = Some(self.exit);
                }
            }
        })
    }

    fn signal(&mut self, signal: TaskSignal) {
        if self.done.is_some() {
            return;
        }
        let now = Instant::now();
        match signal {
            TaskSignal::Term if self.ends_at > now => {
                self.ends_at = self.ends_at.min(now + self.cfg.term_delay);
                self.exit = Exit::Signal(libc::SIGTERM);
            }
            TaskSignal::Term => {}
            TaskSignal::Kill => {
                if self.ends_at > now {
                    self.exit = Exit::Signal(libc::SIGKILL);
                }
                self.ends_at = now;
            }
            TaskSignal::Checkpoint => self.hint_at = self.cfg.hint_reply.map(|d| now + d),
        }
    }

    fn usage_now(&self) -> Option<Usage> {
        None
    }

    fn usage(&self) -> Option<Usage> {
        None
    }
}

/// `500ms`, `2s`, `1.5m`, `1h`.
fn parse_duration(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(n * scale).ok().filter(|d| *d <= Duration::from_secs(365 * 86_400))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(command: &[&str], alloc: u64, dir: &Path) -> TaskLaunch {
        TaskLaunch {
            alloc,
            task: 0,
            gang_size: 1,
            epoch: 1,
            attempt: 1,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            peers: Vec::new(),
            ports: Vec::new(),
            gpu_ids: Vec::new(),
            checkpoint_dir: dir.to_path_buf(),
            user: None,
            container: None,
        }
    }

    fn spawn(e: &SimExecutor, l: &TaskLaunch) -> Box<dyn Attempt> {
        e.spawn(l, Path::new("/nonexistent"), Muster { exe: None, shim: false }, None).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_runs_its_seconds_and_exits_zero() {
        let e = SimExecutor::new(SimConfig::default(), "n1");
        let dir = tempfile::tempdir().unwrap();
        let mut a = spawn(&e, &launch(&["sleep", "7"], 1, dir.path()));
        let t0 = Instant::now();
        assert_eq!(a.wait().await.unwrap(), Exit::Code(0));
        assert_eq!(t0.elapsed(), Duration::from_secs(7));
        assert_eq!(a.pgid(), 0);
        assert!(a.usage().is_none());
        let empty = e.spawn(&launch(&[], 1, dir.path()), dir.path(), Muster { exe: None, shim: false }, None);
        assert!(matches!(empty, Err(SpawnError::EmptyCommand)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_resumes_and_a_stop_ends_it() {
        let cfg = SimConfig { term_delay: Duration::from_secs(1), ..SimConfig::default() };
        let e = SimExecutor::new(cfg, "n1");
        let dir = tempfile::tempdir().unwrap();
        let mut a = spawn(&e, &launch(&["sleep", "100"], 1, dir.path()));
        assert!(tokio::time::timeout(Duration::from_secs(5), a.wait()).await.is_err());
        let t0 = Instant::now();
        assert_eq!(a.stop(Duration::from_secs(10)).await.unwrap(), Exit::Signal(libc::SIGTERM));
        assert_eq!(t0.elapsed(), Duration::from_secs(1), "it ends term_delay after SIGTERM");
        // One that takes longer than the grace is killed at the grace.
        let cfg = SimConfig { term_delay: Duration::from_secs(60), ..SimConfig::default() };
        let mut a = spawn(&SimExecutor::new(cfg, "n1"), &launch(&["sleep", "100"], 2, dir.path()));
        let t0 = Instant::now();
        assert_eq!(a.stop(Duration::from_secs(3)).await.unwrap(), Exit::Signal(libc::SIGKILL));
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
        // An attempt that already ended keeps its exit.
        let mut a = spawn(&e, &launch(&["sleep", "1"], 3, dir.path()));
        a.wait().await.unwrap();
        a.signal(TaskSignal::Kill);
        assert_eq!(a.stop(Duration::ZERO).await.unwrap(), Exit::Code(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_is_answered_with_a_checkpoint_and_done() {
        let e = SimExecutor::new(SimConfig::default(), "n1");
        let dir = tempfile::tempdir().unwrap();
        let mut a = spawn(&e, &launch(&["sleep", "100"], 1, dir.path()));
        let hint = crate::hint::Hint {
            epoch: 1,
            grace: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            max_deferral: Duration::ZERO,
        };
        let mut watch = crate::hint::HintWatch::start(hint, dir.path(), Instant::now(), 0).unwrap();
        a.signal(TaskSignal::Checkpoint);
        assert!(tokio::time::timeout(Duration::from_secs(1), a.wait()).await.is_err(), "it still runs");
        assert_eq!(watch.check(Instant::now()), crate::hint::Verdict::Done);
        assert!(dir.path().join("sim-state").exists());
        // Ignoring hints: no answer.
        let cfg = SimConfig { hint_reply: None, ..SimConfig::default() };
        let dir = tempfile::tempdir().unwrap();
        let mut a = spawn(&SimExecutor::new(cfg, "n1"), &launch(&["sleep", "100"], 2, dir.path()));
        let mut watch = crate::hint::HintWatch::start(hint, dir.path(), Instant::now(), 0).unwrap();
        a.signal(TaskSignal::Checkpoint);
        assert!(tokio::time::timeout(Duration::from_secs(1), a.wait()).await.is_err());
        assert_eq!(watch.check(Instant::now()), crate::hint::Verdict::Wait);
    }

    #[test]
    fn draws_are_deterministic_and_follow_their_distribution() {
        let dir = Path::new("/x");
        let cfg = |durations| SimConfig { durations, seed: 7, ..SimConfig::default() };
        let exp = SimExecutor::new(cfg(Durations::Exp(Duration::from_secs(30))), "node-1");
        let draws: Vec<Duration> = (1..=10_000).map(|id| exp.run_time(&launch(&["train"], id, dir))).collect();
        let again: Vec<Duration> = (1..=10_000).map(|id| exp.run_time(&launch(&["train"], id, dir))).collect();
        assert_eq!(draws, again);
        let mean = draws.iter().map(Duration::as_secs_f64).sum::<f64>() / draws.len() as f64;
        assert!((28.5..31.5).contains(&mean), "mean {mean}");
        let other = SimExecutor::new(cfg(Durations::Exp(Duration::from_secs(30))), "node-2");
        assert_ne!(other.run_time(&launch(&["train"], 1, dir)), draws[0], "another node draws otherwise");
        let (lo, hi) = (Duration::from_secs(1), Duration::from_secs(2));
        let uni = SimExecutor::new(cfg(Durations::Uniform(lo, hi)), "node-1");
        assert!((1..=1_000).all(|id| (lo..=hi).contains(&uni.run_time(&launch(&["x"], id, dir)))));
        assert_eq!(Durations::parse("exp:30s"), Ok(Durations::Exp(Duration::from_secs(30))));
        assert_eq!(Durations::parse("uniform:1s..2s"), Ok(Durations::Uniform(lo, hi)));
        assert_eq!(Durations::parse("fixed:500ms"), Ok(Durations::Fixed(Duration::from_millis(500))));
        assert!(Durations::parse("uniform:2s..1s").unwrap_err().contains("above"));
        assert!(Durations::parse("normal:1s").unwrap_err().contains("expected"));
        assert!(Durations::parse("exp:soon").unwrap_err().contains("not a duration"));
    }
}
