//! Watchdogs: the agent stops an attempt that can no longer finish, so a
//! hung task frees its GPU in minutes instead of its whole walltime
//! (`../shared/seeds/watchdogs.txt`).
//!
//! ```text
//!   budget      elapsed ≥ the allocation's walltime                    → trip
//!   stall       (opt-in: stall_timeout_s > 0)
//!     Inert ── first beat ──▶ Armed ── no beat for the window ──▶ Confirming
//!       ▲ (model loading is never policed)   ▲ beat                 │ confirm_samples reads,
//!                                            └── busy: re-arm, log ─┤ confirm_poll apart
//!                                                 idle and static ──┴─▶ trip
//!   gpu_health  (GPU tasks) after a load grace, GPU idle and memory static
//!               for the whole window                                 → trip
//! ```
//!
//! "Idle" is one definition shared by the stall confirmation and the GPU
//! health window: the process group's GPU utilisation at most `idle_pct`,
//! its resident memory moved at most `ram_delta_mb`, and — where GPU
//! utilisation cannot be read (no NVML) — its CPU time advanced less than
//! `cpu_busy_ms` (a CPU-bound step is not a stall). A beat is any change to
//! the task's `MUSTER_PROGRESS_FILE` (touched or appended to, by any
//! language, or by `muster beat`).
//!
//! [`Watchdogs`] decides from the times and samples it is given; the
//! agent's waiter feeds it real ones ([`ProcSampler`]), tests feed fakes.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// The agent's watchdog knobs (the seed's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WatchdogConfig {
    /// How often the waiter checks (beats, deadlines, health samples).
    pub poll: Duration,
    /// Reads taken to confirm a suspected stall.
    pub confirm_samples: u32,
    /// Spacing between confirmation reads.
    pub confirm_poll: Duration,
    /// GPU utilisation (percent) at or under which the GPU counts as idle.
    pub idle_pct: f64,
    /// Resident-memory movement (MiB) above which the task counts as working.
    pub ram_delta_mb: u64,
    /// Without GPU readings: CPU time (ms) over a confirmation or health
    /// window above which the task counts as working.
    pub cpu_busy_ms: u64,
    /// GPU health: how long idle and static before a trip.
    pub gpu_health_window: Duration,
    /// GPU health: not policed this long after the start (loading).
    pub gpu_health_grace: Duration,
    /// GPU health: how often it samples.
    pub gpu_health_every: Duration,
    /// Whether GPU tasks get the GPU-health watchdog at all (off for agents
    /// that advertise fake GPUs, as `muster dev` does).
    pub gpu_health: bool,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            poll: Duration::from_secs(1),
            confirm_samples: 3,
            confirm_poll: Duration::from_secs(1),
            idle_pct: 5.0,
            ram_delta_mb: 5120,
            cpu_busy_ms: 500,
            gpu_health_window: Duration::from_secs(300),
            gpu_health_grace: Duration::from_secs(300),
            gpu_health_every: Duration::from_secs(10),
            gpu_health: true,
        }
    }
}

/// What one attempt is policed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The wall-clock budget (the allocation's walltime).
    pub budget: Option<Duration>,
    /// The stall window (opt-in).
    pub stall: Option<Duration>,
    /// Whether the GPU-health watchdog runs (the task has GPUs).
    pub gpu_health: bool,
}

/// One reading of a process group.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Highest GPU utilisation of its processes, percent; `None` where it
    /// cannot be read (no NVML): counted as idle, CPU time decides instead.
    pub gpu_util_pct: Option<f64>,
    /// Resident memory of the group, MiB.
    pub rss_mb: u64,
    /// CPU time of the group so far (user + system), ms.
    pub cpu_ms: u64,
}

/// Reads a process group's GPU utilisation, memory and CPU time.
pub trait Sampler: Send {
    /// A reading of the processes in group `pgid`.
    fn sample(&mut self, pgid: i32) -> Sample;

    /// A reading of the GPUs with these indices (a task's own), for its
    /// accounting: `None` where they cannot be read (no NVML).
    fn gpus(&mut self, _indices: &[u32]) -> Option<GpuReading> {
        None
    }
}

/// What a task's GPUs are doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// Their mean utilisation, percent.
    pub util_pct: f64,
    /// The memory they hold, bytes, all together.
    pub memory_bytes: u64,
}

/// What an attempt's GPUs did over its run, from readings taken while it
/// ran (every watchdog poll).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuUsage {
    readings: u32,
    util_sum: f64,
    /// The most memory they held at once, bytes.
    pub peak_memory_bytes: u64,
}

impl GpuUsage {
    /// Counts a reading.
    pub fn add(&mut self, r: GpuReading) {
        self.readings += 1;
        self.util_sum += r.util_pct.clamp(0.0, 100.0);
        self.peak_memory_bytes = self.peak_memory_bytes.max(r.memory_bytes);
    }

    /// The mean utilisation over the readings, percent (`None`: none).
    pub fn mean_util_pct(&self) -> Option<u32> {
        (self.readings > 0).then(|| (self.util_sum / f64::from(self.readings)).round() as u32)
    }
}

/// Which watchdog tripped, and what it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trip {
    /// `budget`, `stall` or `gpu_health`.
    pub kind: &'static str,
    /// In words, for the logs.
    pub detail: String,
}

/// What a poll decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    Fine,
    /// A stall was suspected but the task is busy: not killed, re-armed.
    Busy(String),
    /// Stop it.
    Trip(Trip),
}

#[derive(Clone, Debug, PartialEq)]
enum Stall {
    Inert,
    Armed { deadline: Instant },
    Confirming { samples: Vec<Sample>, next_at: Instant },
}

/// The three watchdogs of one attempt.
#[derive(Clone, Debug)]
pub struct Watchdogs {
    cfg: WatchdogConfig,
    limits: Limits,
    started: Instant,
    stall: Stall,
    /// GPU health: the start of the current idle-and-static streak, and
    /// the reading there.
    health: Option<(Instant, Sample)>,
    health_next: Instant,
}

/// Whether readings over a window say "doing nothing".
fn idle(cfg: &WatchdogConfig, samples: &[Sample]) -> Result<(), String> {
    let Some(first) = samples.first() else { return Ok(()) };
    let gpu =
        samples.iter().filter_map(|s| s.gpu_util_pct).fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
    if let Some(g) = gpu
        && g > cfg.idle_pct
    {
        return Err(format!("GPU busy ({g:.0} %)"));
    }
    let (lo, hi) = samples.iter().fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s.rss_mb), hi.max(s.rss_mb)));
    if hi.saturating_sub(lo) > cfg.ram_delta_mb {
        return Err(format!("memory moving ({} MiB)", hi - lo));
    }
    if gpu.is_none() {
        let last = samples.last().expect("not empty");
        let cpu = last.cpu_ms.saturating_sub(first.cpu_ms);
        if cpu > cfg.cpu_busy_ms {
            return Err(format!("CPU busy ({cpu} ms of CPU time; no GPU readings)"));
        }
    }
    Ok(())
}

impl Watchdogs {
    /// The watchdogs of an attempt started at `now`.
    pub fn new(cfg: WatchdogConfig, limits: Limits, now: Instant) -> Watchdogs {
        Watchdogs {
            cfg,
            limits,
            started: now,
            stall: Stall::Inert,
            health: None,
            health_next: now + cfg.gpu_health_grace,
        }
    }

    /// The task reported progress at `now`: the stall window (re)starts.
    pub fn beat(&mut self, now: Instant) {
        if let Some(window) = self.limits.stall {
            self.stall = Stall::Armed { deadline: now + window };
        }
    }

    /// Whether beats count for anything: only a stall watchdog (a task
    /// with a stall window) reads them, so without one the progress file
    /// is not read at all (at fleet scale, a file lookup per task per poll).
    pub fn wants_beats(&self) -> bool {
        self.limits.stall.is_some()
    }

    /// Whether the stall watchdog is armed (has seen a beat).
    pub fn armed(&self) -> bool {
        !matches!(self.stall, Stall::Inert)
    }

    /// One check at `now`; `sample` reads the process group when a
    /// confirmation or health reading is due.
    pub fn poll(&mut self, now: Instant, mut sample: impl FnMut() -> Sample) -> Verdict {
        if let Some(budget) = self.limits.budget
            && now.duration_since(self.started) >= budget
        {
            return Verdict::Trip(Trip {
                kind: "budget",
                detail: format!("ran for its whole walltime budget ({} s)", budget.as_secs()),
            });
        }
        let mut verdict = Verdict::Fine;
        match &mut self.stall {
            Stall::Armed { deadline } if now >= *deadline => {
                self.stall = Stall::Confirming { samples: vec![sample()], next_at: now + self.cfg.confirm_poll };
            }
            Stall::Confirming { samples, next_at } if now >= *next_at => {
                samples.push(sample());
                *next_at = now + self.cfg.confirm_poll;
                if samples.len() as u32 >= self.cfg.confirm_samples.max(1) {
                    let window = self.limits.stall.expect("armed only with a window");
                    match idle(&self.cfg, samples) {
                        Ok(()) => {
                            return Verdict::Trip(Trip {
                                kind: "stall",
                                detail: format!(
                                    "no progress beat for {} s, and confirmed idle over {} readings",
                                    window.as_secs(),
                                    samples.len()
                                ),
                            });
                        }
                        Err(why) => {
                            self.stall = Stall::Armed { deadline: now + window };
                            verdict =
                                Verdict::Busy(format!("no beat for {} s but {why}: not stopped", window.as_secs()));
                        }
                    }
                }
            }
            _ => {}
        }
        if self.limits.gpu_health && now >= self.health_next {
            self.health_next = now + self.cfg.gpu_health_every;
            let s = sample();
            match self.health {
                Some((since, first)) if idle(&self.cfg, &[first, s]).is_ok() => {
                    if now.duration_since(since) >= self.cfg.gpu_health_window {
                        return Verdict::Trip(Trip {
                            kind: "gpu_health",
                            detail: format!("GPU idle and memory static for {} s", now.duration_since(since).as_secs()),
                        });
                    }
                }
                _ => self.health = Some((now, s)),
            }
        }
        verdict
    }
}

/// Watches a task's progress file: any change of its length or
/// modification time is a beat.
#[derive(Debug)]
pub struct ProgressFile {
    path: PathBuf,
    seen: Option<(u64, std::time::SystemTime)>,
}

impl ProgressFile {
    /// Watches `path`, which the executor removed (or, for a task running
    /// as another user, made empty) before it started the task: absent or
    /// empty is no beat, and whatever the task wrote before the first look,
    /// however early, is one.
    pub fn new(path: PathBuf) -> ProgressFile {
        ProgressFile { path, seen: None }
    }

    /// Whether the file changed since the last call.
    pub fn changed(&mut self) -> bool {
        let Ok(meta) = fs::metadata(&self.path) else { return false };
        let now = (meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH));
        if self.seen == Some(now) {
            return false;
        }
        let first = self.seen.is_none();
        self.seen = Some(now);
        !(first && meta.len() == 0)
    }
}

/// The progress file of an attempt, beside its logs:
/// `WORK_DIR/logs/alloc-A/task-T/attempt-N.progress` (one directory per
/// task for all of an attempt's files keeps a start to few new inodes).
pub fn progress_path(work_dir: &Path, alloc: u64, task: u32, attempt: u32) -> PathBuf {
    let (out, _) = crate::executor::log_paths(work_dir, alloc, task, attempt);
    out.with_extension("progress")
}

/// Reads nothing: for simulated attempts, which have no process
/// ([`crate::executor::sim`]). Every reading is empty, so a budget or stall
/// watchdog never sees progress from it: fleets run without them.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSampler;

impl Sampler for NullSampler {
    fn sample(&mut self, _pgid: i32) -> Sample {
        Sample::default()
    }
}

/// Reads process groups from `/proc`, and GPU utilisation per process from
/// NVML where the library is present.
pub struct ProcSampler {
    nvml: Option<&'static nvml_wrapper::Nvml>,
    page_kb: u64,
    tick_ms: u64,
}

impl Default for ProcSampler {
    fn default() -> Self {
        // SAFETY: sysconf has no memory-safety preconditions.
        let (page, ticks) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_CLK_TCK)) };
        ProcSampler { nvml: nvml(), page_kb: (page.max(4096) / 1024) as u64, tick_ms: 1000 / (ticks.max(1) as u64) }
    }
}

/// The process's NVML handle, initialised by the first sampler (`None`
/// where the library or its driver is absent). Every attempt makes a
/// sampler: initialising NVML for each loaded and searched the library
/// anew (and on a GPU node, `nvmlInit` takes milliseconds).
fn nvml() -> Option<&'static nvml_wrapper::Nvml> {
    static NVML: std::sync::OnceLock<Option<nvml_wrapper::Nvml>> = std::sync::OnceLock::new();
    NVML.get_or_init(|| nvml_wrapper::Nvml::init().ok()).as_ref()
}

/// `(pgrp, utime + stime ticks, rss pages)` from a `/proc/PID/stat` line.
pub fn parse_stat(line: &str) -> Option<(i32, u64, u64)> {
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'.
    let rest = &line[line.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); pgrp is field 5, utime 14, stime 15, rss 24.
    let pgrp = f.get(2)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let rss: u64 = f.get(21)?.parse().ok()?;
    Some((pgrp, utime + stime, rss))
}

impl Sampler for ProcSampler {
    fn sample(&mut self, pgid: i32) -> Sample {
        let mut s = Sample::default();
        let mut pids = BTreeSet::new();
        if let Ok(dir) = fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                let Some((pgrp, ticks, rss)) =
                    fs::read_to_string(e.path().join("stat")).ok().as_deref().and_then(parse_stat)
                else {
                    continue;
                };
                if pgrp == pgid {
                    pids.insert(pid);
                    s.cpu_ms += ticks * self.tick_ms;
                    s.rss_mb += rss * self.page_kb / 1024;
                }
            }
        }
        if let Some(nvml) = &self.nvml {
            let mut best: Option<f64> = None;
            for i in 0..nvml.device_count().unwrap_or(0) {
                let Ok(dev) = nvml.device_by_index(i) else { continue };
                // No samples for this device means none of its processes ran there.
                let util = dev.process_utilization_stats(None::<u64>).unwrap_or_default();
                for p in util.iter().filter(|p| pids.contains(&p.pid)) {
                    best = Some(best.unwrap_or(0.0).max(f64::from(p.sm_util)));
                }
            }
            // NVML present: a group with no GPU samples is idle on the GPU.
            s.gpu_util_pct = Some(best.unwrap_or(0.0));
        }
        s
    }

    fn gpus(&mut self, indices: &[u32]) -> Option<GpuReading> {
        let nvml = self.nvml.as_ref()?;
        // The task holds these GPUs alone: what the devices do is its.
        let (mut util, mut memory, mut read) = (0.0, 0, 0u32);
        for &i in indices {
            let Ok(dev) = nvml.device_by_index(i) else { continue };
            let (Ok(rates), Ok(info)) = (dev.utilization_rates(), dev.memory_info()) else { continue };
            util += f64::from(rates.gpu);
            memory += info.used;
            read += 1;
        }
        (read > 0).then(|| GpuReading { util_pct: util / f64::from(read), memory_bytes: memory })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> WatchdogConfig {
        WatchdogConfig {
            gpu_health_window: Duration::from_secs(300),
            gpu_health_grace: Duration::from_secs(300),
            gpu_health_every: Duration::from_secs(10),
            ..WatchdogConfig::default()
        }
    }

    fn stall_only(window_s: u64) -> Limits {
        Limits { budget: None, stall: Some(Duration::from_secs(window_s)), gpu_health: false }
    }

    fn idle_gpu() -> Sample {
        Sample { gpu_util_pct: Some(0.0), rss_mb: 10_000, cpu_ms: 0 }
    }

    /// Polls once a second from `from` to `to` (seconds after `t0`), until
    /// a trip (the waiter stops the task then).
    fn run(
        w: &mut Watchdogs,
        t0: Instant,
        from: u64,
        to: u64,
        mut s: impl FnMut(u64) -> Sample,
    ) -> Vec<(u64, Verdict)> {
        let mut out = Vec::new();
        for sec in from..=to {
            let v = w.poll(t0 + Duration::from_secs(sec), || s(sec));
            let tripped = matches!(v, Verdict::Trip(_));
            if v != Verdict::Fine {
                out.push((sec, v));
            }
            if tripped {
                break;
            }
        }
        out
    }

    #[test]
    fn gpu_usage_is_the_mean_utilisation_and_the_peak_memory_of_its_readings() {
        let mut u = GpuUsage::default();
        assert_eq!(u.mean_util_pct(), None, "nothing read: unknown, not idle");
        for (pct, mib) in [(40.0, 100), (90.0, 900), (170.0, 300)] {
            u.add(GpuReading { util_pct: pct, memory_bytes: mib << 20 });
        }
        assert_eq!(u.mean_util_pct(), Some(77), "(40 + 90 + 100) / 3: a reading over 100 counts as 100");
        assert_eq!(u.peak_memory_bytes, 900 << 20);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_stall_window_asks_for_the_progress_files_beats() {
        let now = Instant::now();
        assert!(Watchdogs::new(cfg(), stall_only(120), now).wants_beats());
        for limits in [
            Limits { budget: Some(Duration::from_secs(3_600)), stall: None, gpu_health: true },
            Limits { budget: None, stall: None, gpu_health: false },
        ] {
            assert!(!Watchdogs::new(cfg(), limits, now).wants_beats(), "{limits:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_stall_watchdog_is_inert_until_the_first_beat() {
        let t0 = Instant::now();
        let mut w = Watchdogs::new(cfg(), stall_only(120), t0);
        assert!(run(&mut w, t0, 0, 1_000, |_| idle_gpu()).is_empty(), "loading for 1000 s is never policed");
        assert!(!w.armed());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_and_static_after_the_window_trips_after_the_confirmation() {
        let t0 = Instant::now();
        let mut w = Watchdogs::new(cfg(), stall_only(120), t0);
        w.beat(t0 + Duration::from_secs(10));
        let got = run(&mut w, t0, 11, 200, |_| idle_gpu());
        assert_eq!(got.len(), 1, "{got:?}");
        let (at, Verdict::Trip(t)) = &got[0] else { panic!("{got:?}") };
        assert_eq!(t.kind, "stall");
        // Deadline at 130 s; three reads 1 s apart: 130, 131, 132.
        assert_eq!(*at, 132, "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_gpu_or_moving_memory_re_arms_instead_of_killing() {
        let t0 = Instant::now();
        let mut w = Watchdogs::new(cfg(), stall_only(120), t0);
        w.beat(t0);
        let busy = |sec: u64| Sample { gpu_util_pct: Some(if sec < 300 { 80.0 } else { 0.0 }), ..idle_gpu() };
        let got = run(&mut w, t0, 1, 400, busy);
        assert!(matches!(&got[0], (122, Verdict::Busy(why)) if why.contains("GPU busy")), "{got:?}");
        // Re-armed at 122: confirmed again at 242-244 (still busy), then idle at 364-366: trip.
        assert!(matches!(got.last(), Some((366, Verdict::Trip(t))) if t.kind == "stall"), "{got:?}");

        let mut w = Watchdogs::new(cfg(), stall_only(120), t0);
        w.beat(t0);
        let loading = |sec: u64| Sample { rss_mb: 1_000 + sec * 4_000, ..idle_gpu() };
        let got = run(&mut w, t0, 1, 200, loading);
        assert!(matches!(&got[0], (122, Verdict::Busy(why)) if why.contains("memory moving")), "{got:?}");
        assert!(got.iter().all(|(_, v)| !matches!(v, Verdict::Trip(_))), "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn without_gpu_readings_cpu_time_counts_as_busy() {
        let t0 = Instant::now();
        let mut w = Watchdogs::new(cfg(), stall_only(60), t0);
        w.beat(t0);
        let cpu_bound = |sec: u64| Sample { gpu_util_pct: None, rss_mb: 100, cpu_ms: sec * 1_000 };
        let got = run(&mut w, t0, 1, 100, cpu_bound);
        assert!(matches!(&got[0], (62, Verdict::Busy(why)) if why.contains("CPU busy")), "{got:?}");
        let mut w = Watchdogs::new(cfg(), stall_only(60), t0);
        w.beat(t0);
        let sleeping = |_| Sample { gpu_util_pct: None, rss_mb: 100, cpu_ms: 42 };
        assert!(matches!(run(&mut w, t0, 1, 100, sleeping).first(), Some((62, Verdict::Trip(_)))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_during_the_confirmation_wins() {
        let t0 = Instant::now();
        let mut w = Watchdogs::new(cfg(), stall_only(10), t0);
        w.beat(t0);
        assert_eq!(w.poll(t0 + Duration::from_secs(10), idle_gpu), Verdict::Fine); // confirming
        w.beat(t0 + Duration::from_secs(11));
        assert_eq!(w.poll(t0 + Duration::from_secs(12), idle_gpu), Verdict::Fine);
        assert_eq!(w.poll(t0 + Duration::from_secs(20), idle_gpu), Verdict::Fine, "re-armed to 21");
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_trips_at_the_deadline() {
        let t0 = Instant::now();
        let limits = Limits { budget: Some(Duration::from_secs(3_600)), stall: None, gpu_health: false };
        let mut w = Watchdogs::new(cfg(), limits, t0);
        assert_eq!(w.poll(t0 + Duration::from_secs(3_599), idle_gpu), Verdict::Fine);
        assert!(matches!(w.poll(t0 + Duration::from_secs(3_600), idle_gpu), Verdict::Trip(t) if t.kind == "budget"));
    }

    #[tokio::test(start_paused = true)]
    async fn gpu_health_waits_out_the_grace_then_a_whole_idle_window() {
        let t0 = Instant::now();
        let limits = Limits { budget: None, stall: None, gpu_health: true };
        let mut w = Watchdogs::new(cfg(), limits, t0);
        // Busy until 400 s, then idle and static: the streak starts at the
        // first idle reading (400 s) and trips 300 s later.
        let s = |sec: u64| Sample { gpu_util_pct: Some(if sec < 400 { 50.0 } else { 1.0 }), ..idle_gpu() };
        let got = run(&mut w, t0, 0, 1_000, s);
        assert!(matches!(got.as_slice(), [(700, Verdict::Trip(t))] if t.kind == "gpu_health"), "{got:?}");
    }

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let line = "4242 (my (odd) cmd) S 1 4240 4240 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 123 1000000 2560 18446744073709551615";
        assert_eq!(parse_stat(line), Some((4240, 300, 2560)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_progress_file_beats_on_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let mut p = ProgressFile::new(path.clone());
        assert!(!p.changed(), "no file yet");
        fs::write(&path, "").unwrap();
        assert!(!p.changed(), "made empty by the agent: no beat");
        fs::write(&path, "1").unwrap();
        assert!(p.changed());
        assert!(!p.changed());
        fs::write(&path, "12").unwrap();
        assert!(p.changed(), "appended");
        // A beat written before the watcher's first look still counts
        // (a task that beats at once, before its agent starts watching).
        let mut late = ProgressFile::new(path.clone());
        assert!(late.changed(), "what the task wrote before the first look");
        assert!(!late.changed());
    }

    #[test]
    fn the_proc_sampler_reads_a_real_process_group() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(300));
        let s = ProcSampler::default().sample(pgid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(s.rss_mb < 1_000, "{s:?}");
        assert!(s.cpu_ms > 0 || s.rss_mb > 0, "the group was found: {s:?}");
    }
}
