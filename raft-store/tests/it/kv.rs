//! A small key-value application to store: enough to check that the storage
//! layer applies, snapshots and restores an application faithfully.

use std::collections::BTreeMap;

use muster_raft_store::{CommandBatch, RestoreError, StateMachineApp, codec};
use serde::{Deserialize, Serialize};

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

    fn apply_batch(&mut self, batch: &CommandBatch<Set>) -> Vec<Option<String>> {
        self.last_time_ms = batch.time_ms;
        batch.commands.iter().map(|Set(k, v)| self.map.insert(k.clone(), v.clone())).collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        codec::encode(self).unwrap()
    }

    fn restore(bytes: &[u8]) -> Result<Self, RestoreError> {
        codec::decode(bytes).map_err(|e| RestoreError(e.to_string()))
    }

    fn digest(&self) -> [u8; 32] {
        let mut d = [0u8; 32];
        for (i, b) in self.snapshot().iter().enumerate() {
            d[i % 32] ^= b.rotate_left(i as u32 % 8);
        }
        d
    }
}
