//! openraft's storage conformance suite against our log-file store.

use muster_raft_store::{LogStore, RaftConfig, StateMachineStore, open};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

use crate::kv::Kv;

struct Builder;

impl StoreBuilder<RaftConfig<Kv>, LogStore<Kv>, StateMachineStore<Kv>, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore<Kv>, StateMachineStore<Kv>), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = open::<Kv>(dir.path()).expect("open a fresh data dir");
        Ok((dir, log, sm))
    }
}

/// A plain test: the suite makes its own tokio runtimes.
#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(Builder).expect("storage suite");
}
