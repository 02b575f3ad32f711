//! Replicated time, as this replica's leader stamps it on entries and its
//! leader loop compares deadlines with: the wall clock, paced by
//! [`muster_clock::Pacer`] on the monotonic clock, so that a jump of this
//! machine's clock during a term reaches replicated deadlines at most 10 %
//! of the time that passes (see `docs/reliability.md#clocks`).

use std::sync::{Arc, Mutex};

use muster_clock::{Pacer, SharedClock};
use muster_raft_store::AppReader;
use openraft::{BasicNode, RaftMetrics};
use tokio::sync::watch;

use crate::sm::State;

/// This replica's replicated time (one per replica, shared by its proposer
/// and its leader loop).
#[derive(Clone)]
pub struct LeaderTime {
    clock: SharedClock,
    reader: AppReader<State>,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    pacer: Arc<Mutex<Pacer>>,
    /// The injected bug `unpaced-leader-clock`: the raw wall clock.
    unpaced: bool,
}

impl LeaderTime {
    /// Paces `clock` for a replica whose applied state `reader` reads and
    /// whose Raft reports its term through `metrics`. `unpaced` stamps the
    /// raw wall clock instead (a deliberate bug, for the chaos checks).
    pub fn new(
        clock: SharedClock,
        reader: AppReader<State>,
        metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
        unpaced: bool,
    ) -> LeaderTime {
        LeaderTime { clock, reader, metrics, pacer: Arc::default(), unpaced }
    }

    /// Replicated time now, never behind the last applied entry's.
    pub fn now(&self) -> u64 {
        let floor = self.reader.read(|st| st.now_ms());
        self.at_least(floor)
    }

    /// Replicated time now, never behind `floor_ms` (the applied state's
    /// time, when the caller already reads the state).
    pub fn at_least(&self, floor_ms: u64) -> u64 {
        let wall = self.clock.wall_ms();
        if self.unpaced {
            return wall.max(floor_ms);
        }
        let term = self.metrics.borrow().current_term;
        self.pacer.lock().expect("pacer lock poisoned").now(term, wall, self.clock.mono_ms(), floor_ms)
    }
}
