//! What the replicated log needs from an application's state machine, kept
//! in the pure core so that the core's own [`State`](crate::sm::State)
//! implements it (the storage layer, `muster-raft-store`, re-exports it).
//!
//! One log entry carries the leader's `time_ms` and a batch of commands;
//! each command is applied at that time, in order, and yields its own
//! outcome.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::sm::{ApplyCtx, Command, Outcome, State};

/// The payload of one application log entry: the leader's wall clock when it
/// proposed the entry and the commands it batched into it (group commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandBatch<C> {
    /// Leader wall-clock time, ms since the Unix epoch.
    pub time_ms: u64,
    /// The commands, applied in order.
    pub commands: Vec<C>,
}

/// Why a snapshot could not be restored.
#[derive(Debug, Error)]
#[error("cannot restore the state machine from a snapshot: {0}")]
pub struct RestoreError(pub String);

/// What the storage layer needs from the application's state machine.
///
/// `apply_batch` must be deterministic: the same batches in the same order
/// give the same outcomes and the same [`StateMachineApp::digest`] on every
/// replica.
pub trait StateMachineApp: Default + Sized + Send + Sync + 'static {
    /// One command.
    type Command: Serialize + for<'de> Deserialize<'de> + Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static;
    /// The result of one command.
    type Outcome: Serialize + for<'de> Deserialize<'de> + Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static;
    /// What applying leaves for the shell to store outside the state (for
    /// Muster, the job-history record of each finished allocation).
    type Record: Send + 'static;

    /// Applies every command of one entry, in order, at the entry's time.
    fn apply_batch(&mut self, batch: &CommandBatch<Self::Command>) -> Vec<Self::Outcome>;

    /// The whole state as snapshot bytes.
    fn snapshot(&self) -> Vec<u8>;

    /// A copy whose [`snapshot`](StateMachineApp::snapshot) and
    /// [`digest`](StateMachineApp::digest) are this state's, cheap enough
    /// to take under the lock that guards the state, so that the slow
    /// encoding runs after the lock is let go and applies do not wait for
    /// it. Nothing is applied to the copy.
    fn encoding_copy(&self) -> Self;

    /// The state a snapshot holds.
    fn restore(bytes: &[u8]) -> Result<Self, RestoreError>;

    /// A stable digest of the state (equal on replicas at the same index).
    fn digest(&self) -> [u8; 32];

    /// The keys (for Muster, node slots) the entries applied since the last
    /// call touched, in order; clears them. The storage layer wakes only
    /// the watchers of these keys. None by default.
    fn take_touched(&mut self) -> Vec<u32> {
        Vec::new()
    }

    /// The records the entries applied since the last call left (and, right
    /// after a restore, those the snapshot offers); clears them. None by
    /// default.
    fn take_records(&mut self) -> Vec<Self::Record> {
        Vec::new()
    }
}

impl StateMachineApp for State {
    type Command = Command;
    type Outcome = Outcome;
    type Record = crate::history::JobRecord;

    fn apply_batch(&mut self, batch: &CommandBatch<Command>) -> Vec<Outcome> {
        let ctx = ApplyCtx { time_ms: batch.time_ms };
        batch.commands.iter().map(|cmd| self.apply(cmd, &ctx)).collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        self.to_snapshot()
    }

    fn encoding_copy(&self) -> Self {
        State::encoding_copy(self)
    }

    fn restore(bytes: &[u8]) -> Result<Self, RestoreError> {
        State::from_snapshot(bytes).map_err(|e| RestoreError(e.to_string()))
    }

    fn digest(&self) -> [u8; 32] {
        self.state_digest().0
    }

    fn take_touched(&mut self) -> Vec<u32> {
        self.take_touched_nodes().into_iter().map(|s| s.0).collect()
    }

    fn take_records(&mut self) -> Vec<crate::history::JobRecord> {
        self.take_finished_records()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sm::{AllocSpec, Event, NodeId, Resources};

    #[test]
    fn a_batch_applies_in_order_at_the_entry_time_and_round_trips() {
        let mut s = State::default();
        let node = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 };
        let task = Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 };
        let batch = CommandBatch {
            time_ms: 42_000,
            commands: vec![
                Command::RegisterNode { node: NodeId::new("n0"), resources: node, labels: BTreeMap::new() },
                Command::Submit { spec: AllocSpec::new("u", 1, task, vec!["x".into()]) },
                Command::CancelAllocation { alloc: 99 },
            ],
        };
        let out = s.apply_batch(&batch);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].events(), &[Event::Submitted { alloc: 1, duplicate: false }]);
        assert!(!out[2].is_accepted());
        assert_eq!(s.alloc(1).unwrap().submit_time_ms, 42_000);
        let back = <State as StateMachineApp>::restore(&StateMachineApp::snapshot(&s)).unwrap();
        assert_eq!(StateMachineApp::digest(&back), StateMachineApp::digest(&s));
        assert!(<State as StateMachineApp>::restore(b"junk").is_err());
    }
}
