//! [`LeaderWork`]: what only a leading replica does with what it hears,
//! shared by the services that hear it. Its fields are private.

use std::sync::Arc;

use muster_clock::SharedClock;
use tokio::sync::Notify;

use super::liveness::Liveness;
use super::registry::AgentRegistry;

/// The leader's work in memory: the wake-up of its admission loop, when
/// each agent was last heard from, and the agent streams it holds. Cheap to
/// clone; every clone is the same work.
#[derive(Clone)]
pub struct LeaderWork {
    admission_wake: Arc<Notify>,
    liveness: Liveness,
    agents: AgentRegistry,
}

impl LeaderWork {
    /// Nothing heard and no stream held, timed on `clock`.
    pub fn new(clock: SharedClock) -> LeaderWork {
        LeaderWork {
            admission_wake: Arc::new(Notify::new()),
            liveness: Liveness::new(clock),
            agents: AgentRegistry::default(),
        }
    }

    /// Something changed that admission should look at now (a submit, a
    /// release, a node that came or went).
    pub fn wake_admission(&self) {
        self.admission_wake.notify_one();
    }

    /// Resolves at the next [`LeaderWork::wake_admission`] (or at once when
    /// one is pending).
    pub async fn admission_woken(&self) {
        self.admission_wake.notified().await;
    }

    /// When each agent was last heard from.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The agent streams this replica holds.
    pub fn agents(&self) -> &AgentRegistry {
        &self.agents
    }
}
