//! The scheduler's state machine as the Raft storage layer sees it.
//!
//! One log entry carries the leader's `time_ms` and a batch of commands; each
//! command is applied at that time, in order, and yields its own outcome.

use muster_raft_store::{EntryPayload, RestoreError, StateMachineApp};

use crate::sm::{ApplyCtx, Command, Outcome, State};

impl StateMachineApp for State {
    type Command = Command;
    type Outcome = Outcome;

    fn apply_entry(&mut self, payload: &EntryPayload<Command>) -> Vec<Outcome> {
        let ctx = ApplyCtx { time_ms: payload.time_ms };
        payload.commands.iter().map(|cmd| self.apply(cmd, &ctx)).collect()
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
