//! The scheduler's state machine as the Raft storage layer sees it.
//!
//! One log entry carries the leader's `time_ms` and a batch of commands; each
//! command is applied at that time, in order, and yields its own outcome.

use muster_raft_store::{CommandBatch, RestoreError, StateMachineApp};

use crate::sm::{ApplyCtx, Command, Outcome, State};

impl StateMachineApp for State {
    type Command = Command;
    type Outcome = Outcome;

    fn apply_batch(&mut self, batch: &CommandBatch<Command>) -> Vec<Outcome> {
        let ctx = ApplyCtx { time_ms: batch.time_ms };
        batch.commands.iter().map(|cmd| self.apply(cmd, &ctx)).collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        self.to_snapshot()
    }

    fn restore(bytes: &[u8]) -> Result<Self, RestoreError> {
        State::from_snapshot(bytes).map_err(|e| RestoreError(e.to_string()))
    }

    fn digest(&self) -> [u8; 32] {
        self.state_digest().0
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
