//! A small key-value application to store: enough to check that the storage
//! layer applies, snapshots and restores an application faithfully.

use std::collections::BTreeMap;

use muster_raft_store::{CommandBatch, RaftConfig, RestoreError, StateMachineApp, codec};
use openraft::{BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership};
use serde::{Deserialize, Serialize};

thread_local! {
    /// Digests computed on this thread (each one hashes the whole state).
    static DIGESTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many digests this thread has computed.
pub fn digests_here() -> u64 {
    DIGESTS.with(|n| n.get())
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kv {
    pub map: BTreeMap<String, String>,
    pub last_time_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Set(pub String, pub String);

impl StateMachineApp for Kv {
    type Command = Set;
    type Outcome = Option<String>;
    type Record = ();

    fn apply_batch(&mut self, batch: &CommandBatch<Set>) -> Vec<Option<String>> {
        self.last_time_ms = batch.time_ms;
        batch.commands.iter().map(|Set(k, v)| self.map.insert(k.clone(), v.clone())).collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        codec::encode(self).unwrap()
    }

    fn encoding_copy(&self) -> Self {
        self.clone()
    }

    fn restore(bytes: &[u8]) -> Result<Self, RestoreError> {
        codec::decode(bytes).map_err(|e| RestoreError(e.to_string()))
    }

    fn digest(&self) -> [u8; 32] {
        DIGESTS.with(|n| n.set(n.get() + 1));
        let mut d = [0u8; 32];
        for (i, b) in self.snapshot().iter().enumerate() {
            d[i % 32] ^= b.rotate_left(i as u32 % 8);
        }
        d
    }
}

/// A log id of term `term` (leader 1).
pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// Entries `from..=to`: a membership entry at 1, then `Set(k{i % 3}, v{i})` at `1000 + i` ms.
pub fn entries(from: u64, to: u64) -> Vec<Entry<RaftConfig<Kv>>> {
    (from..=to)
        .map(|i| {
            let payload = if i == 1 {
                let nodes =
                    [(1, BasicNode::new("127.0.0.1:1"))].into_iter().collect::<std::collections::BTreeMap<_, _>>();
                EntryPayload::Membership(Membership::new(vec![[1].into_iter().collect()], nodes))
            } else {
                EntryPayload::Normal(CommandBatch {
                    time_ms: 1_000 + i,
                    commands: vec![Set(format!("k{}", i % 3), format!("v{i}"))],
                })
            };
            Entry { log_id: log_id(1, i), payload }
        })
        .collect()
}
