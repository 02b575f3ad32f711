//! The one clock each shell reads, and the leader's pace for replicated time.
//!
//! Muster's core never reads a clock: the replica, the agent and the agent's
//! hint code read one here and pass the times in. Each shell holds one
//! [`SharedClock`] and every path gets `now` from it, so a test (or a chaos
//! run) swaps one value to move time for all of them.
//!
//! Two readings:
//! - **wall** time, ms since the Unix epoch: what log entries carry, and
//!   what replicated deadlines (token expiry, drain and teardown deadlines,
//!   a hint's deadline) are compared with;
//! - **monotonic** time, ms since the clock was made, on tokio's clock (so
//!   `tokio::time::pause` drives it in tests): how long a node has been
//!   silent, how long since the last pass. A wall-clock jump never moves it.

#![deny(missing_docs)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

mod pace;
mod shift;

pub use pace::{Pacer, SLEW_PER_MILLE};
pub use shift::{Shift, ShiftedClock, set_shift};

/// Wall and monotonic time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Wall time, ms since the Unix epoch.
    fn wall_ms(&self) -> u64;

    /// Monotonic time, ms since the clock was made; never goes back.
    fn mono_ms(&self) -> u64;
}

/// A clock shared by every path of one shell.
#[derive(Clone, Debug)]
pub struct SharedClock(Arc<dyn Clock>);

impl SharedClock {
    /// Shares `clock`.
    pub fn new(clock: impl Clock + 'static) -> SharedClock {
        SharedClock(Arc::new(clock))
    }

    /// The host's clock.
    pub fn system() -> SharedClock {
        SharedClock::new(SystemClock::new())
    }

    /// Wall time, ms since the Unix epoch.
    pub fn wall_ms(&self) -> u64 {
        self.0.wall_ms()
    }

    /// Monotonic time, ms.
    pub fn mono_ms(&self) -> u64 {
        self.0.mono_ms()
    }
}

impl Default for SharedClock {
    fn default() -> Self {
        SharedClock::system()
    }
}

/// The host's wall clock, and tokio's monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic reading starts at zero now.
    pub fn new() -> SystemClock {
        SystemClock { origin: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    fn mono_ms(&self) -> u64 {
        Instant::now().duration_since(self.origin).as_millis() as u64
    }
}

/// A clock a test sets: wall time moves only when told to; monotonic time
/// follows tokio's clock (paused in tests, advanced with
/// `tokio::time::advance`) plus whatever [`ManualClock::advance`] added.
#[derive(Debug)]
pub struct ManualClock {
    wall_ms: AtomicU64,
    mono_extra_ms: AtomicU64,
    origin: Instant,
}

impl ManualClock {
    /// A clock reading `wall_ms`.
    pub fn new(wall_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            wall_ms: AtomicU64::new(wall_ms),
            mono_extra_ms: AtomicU64::new(0),
            origin: Instant::now(),
        })
    }

    /// Sets the wall time (it may jump back: that is what it is for).
    pub fn set_wall_ms(&self, wall_ms: u64) {
        self.wall_ms.store(wall_ms, Ordering::SeqCst);
    }

    /// Moves both readings `ms` ahead.
    pub fn advance(&self, ms: u64) {
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
        self.mono_extra_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for Arc<ManualClock> {
    fn wall_ms(&self) -> u64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn mono_ms(&self) -> u64 {
        Instant::now().duration_since(self.origin).as_millis() as u64 + self.mono_extra_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_system_clock_reads_the_host_time() {
        let c = SharedClock::system();
        let host = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(c.wall_ms().abs_diff(host) < 60_000, "{} vs {host}", c.wall_ms());
        let a = c.mono_ms();
        assert!(c.mono_ms() >= a);
    }

    #[tokio::test(start_paused = true)]
    async fn a_manual_clock_moves_only_when_told() {
        let m = ManualClock::new(1_000);
        let c = SharedClock::new(m.clone());
        assert_eq!((c.wall_ms(), c.mono_ms()), (1_000, 0));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!((c.wall_ms(), c.mono_ms()), (1_000, 250), "monotonic time follows tokio's paused clock");
        m.advance(100);
        assert_eq!((c.wall_ms(), c.mono_ms()), (1_100, 350));
        m.set_wall_ms(500);
        assert_eq!((c.wall_ms(), c.mono_ms()), (500, 350), "a wall jump back leaves monotonic time alone");
    }
}
