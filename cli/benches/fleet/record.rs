//! The agents' own record of every start: the simulated executor counts
//! each one, by task and reservation epoch, so that a task run twice is
//! caught by the agents, not taken from the servers' word.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_agent::executor::sim::SimExecutor;
use muster_agent::executor::{Attempt, Executor, Muster, SpawnError, TaskLaunch};

/// The probe's command (the workload's tasks run `train`).
pub const PROBE: [&str; 2] = ["sleep", "1"];

/// Every task start, by tenth of a second since the origin, and the
/// agents' own record of each task's runs: a task started again under the
/// same reservation, or while an attempt of it still runs, breaks
/// at-most-once; one started again under a new reservation after its
/// attempt ended (a gang torn down and placed again) does not.
#[derive(Debug)]
pub struct Starts {
    pub origin: Instant,
    pub count: AtomicU64,
    pub per_tenth: Mutex<Vec<u64>>,
    /// (allocation, task) → its runs.
    pub tasks: Mutex<std::collections::HashMap<(u64, u32), Runs>>,
    /// Started again under a reservation already started.
    pub same_epoch: AtomicU64,
    /// Started while an attempt of the same task still ran.
    pub overlapping: AtomicU64,
    /// Started again under a new reservation after the last attempt ended
    /// (and of those, tasks of gangs).
    pub restarted: AtomicU64,
    pub restarted_gang: AtomicU64,
    /// Tasks of the workload (not the probe's) started at least once.
    pub distinct_work: AtomicU64,
}

impl Starts {
    pub fn note(&self, launch: &TaskLaunch) {
        self.count.fetch_add(1, Ordering::Relaxed);
        {
            let mut tasks = self.tasks.lock().unwrap();
            let (epochs, running) = tasks.entry((launch.alloc, launch.task)).or_default();
            if epochs.is_empty() && launch.command != PROBE {
                self.distinct_work.fetch_add(1, Ordering::Relaxed);
            }
            if epochs.contains(&launch.epoch) {
                self.same_epoch.fetch_add(1, Ordering::Relaxed);
            } else if *running {
                self.overlapping.fetch_add(1, Ordering::Relaxed);
            } else if !epochs.is_empty() {
                self.restarted.fetch_add(1, Ordering::Relaxed);
                if launch.gang_size > 1 {
                    self.restarted_gang.fetch_add(1, Ordering::Relaxed);
                }
            }
            epochs.push(launch.epoch);
            *running = true;
        }
        let t = (self.origin.elapsed().as_millis() / 100) as usize;
        let mut v = self.per_tenth.lock().unwrap();
        if v.len() <= t {
            v.resize(t + 1, 0);
        }
        v[t] += 1;
    }

    /// Starts per second, by second.
    pub fn per_second(&self) -> Vec<u64> {
        self.per_tenth.lock().unwrap().chunks(10).map(|c| c.iter().sum()).collect()
    }

    /// When the first start at or after `at` came, from `at` (to a tenth
    /// of a second).
    pub fn first_after(&self, at: Instant) -> Option<Duration> {
        let from = (at.saturating_duration_since(self.origin).as_millis() / 100) as usize;
        let v = self.per_tenth.lock().unwrap();
        (from..v.len())
            .find(|&t| v[t] > 0)
            .map(|t| (self.origin + Duration::from_millis(t as u64 * 100 + 100)).saturating_duration_since(at))
    }
}

/// One task's runs: the reservation epochs it started under, and whether
/// an attempt of it runs now.
pub type Runs = (Vec<u64>, bool);

/// The simulated executor, counting starts.
#[derive(Debug)]
pub struct Counting {
    pub sim: SimExecutor,
    pub starts: Arc<Starts>,
}

impl Executor for Counting {
    fn spawn(
        &self,
        launch: &TaskLaunch,
        work_dir: &std::path::Path,
        muster: Muster<'_>,
        cgroup: Option<muster_agent::cgroup::TaskCgroup>,
    ) -> Result<Box<dyn Attempt>, SpawnError> {
        self.starts.note(launch);
        let inner = self.sim.spawn(launch, work_dir, muster, cgroup)?;
        Ok(Box::new(Tracked { inner, key: (launch.alloc, launch.task), starts: self.starts.clone(), ended: false }))
    }

    fn real(&self) -> bool {
        false
    }
}

/// A simulated attempt whose end the record notes.
pub struct Tracked {
    pub inner: Box<dyn Attempt>,
    pub key: (u64, u32),
    pub starts: Arc<Starts>,
    pub ended: bool,
}

impl Tracked {
    pub fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            if let Some((_, running)) = self.starts.tasks.lock().unwrap().get_mut(&self.key) {
                *running = false;
            }
        }
    }
}

impl Attempt for Tracked {
    fn pgid(&self) -> i32 {
        self.inner.pgid()
    }

    fn wait(&mut self) -> muster_agent::executor::AttemptFuture<'_> {
        Box::pin(async move {
            let exit = self.inner.wait().await;
            self.end();
            exit
        })
    }

    fn stop(&mut self, grace: Duration) -> muster_agent::executor::AttemptFuture<'_> {
        Box::pin(async move {
            let exit = self.inner.stop(grace).await;
            self.end();
            exit
        })
    }

    fn signal(&mut self, signal: muster_agent::executor::TaskSignal) {
        self.inner.signal(signal);
    }

    fn usage_now(&self) -> Option<muster_agent::cgroup::Usage> {
        None
    }

    fn usage(&self) -> Option<muster_agent::cgroup::Usage> {
        None
    }
}
