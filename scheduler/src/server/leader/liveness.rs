//! When each node was last heard from: the leader's memory, read by the tick as silence.

use std::sync::{Arc, Mutex};

use muster_clock::SharedClock;
use muster_core::tick::{Heard, Silence};

use crate::sm::NodeId;

/// When each node was last heard from, kept in memory on the leader only
/// (the leader's tick reads it through [`Silence`]), on the replica's
/// monotonic clock.
#[derive(Clone, Debug)]
pub struct Liveness {
    heard: Arc<Mutex<Heard>>,
    clock: SharedClock,
}

impl Liveness {
    /// Nothing heard yet, timed on `clock`.
    pub fn new(clock: SharedClock) -> Liveness {
        Liveness { heard: Arc::default(), clock }
    }

    /// A message from `node` arrived now.
    pub fn touch(&self, node: &NodeId) {
        let now = self.clock.mono_ms();
        self.heard.lock().expect("liveness lock").touch(node, now);
    }

    /// This replica became leader now: every node gets a full grace window.
    pub fn lead_from_now(&self) {
        let now = self.clock.mono_ms();
        self.heard.lock().expect("liveness lock").lead_from(now);
    }
}

impl Silence for Liveness {
    fn silent_ms(&self, node: &NodeId, mono_ms: u64) -> u64 {
        self.heard.lock().expect("liveness lock").silent_ms(node, mono_ms)
    }
}
