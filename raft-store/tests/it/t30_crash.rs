//! The crash-consistency shim: a simulated power loss keeps exactly what the
//! store made durable, so every acknowledged write must survive it, and a
//! store that acknowledges before fsyncing is caught. The applied log keeps
//! the committed history past compaction.

use std::path::Path;

use muster_raft_store::{
    AppliedRecord, CommandBatch, DiskFault, LogStore, RaftConfig, StateMachineStore, StoreFault, StoreOptions,
    acked_beyond_durable, acked_beyond_readable, open_with, read_applied_log, restore_crash_image, set_disk_fault,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{RaftLogReader, RaftSnapshotBuilder, StorageError, Vote};
use tempfile::TempDir;

use crate::kv::{Kv, Set, entries, log_id};

type C = RaftConfig<Kv>;

fn shim() -> StoreOptions {
    StoreOptions { crash_image: true, ..StoreOptions::default() }
}

fn open(dir: &Path, opts: &StoreOptions) -> (LogStore<Kv>, StateMachineStore<Kv>) {
    open_with::<Kv>(dir, opts).expect("open the data dir")
}

/// Appends 1..=10, votes, appends 11..=20 (each append acknowledged), then
/// loses power; returns the acknowledged indexes that did not survive.
async fn acknowledged_but_lost(opts: StoreOptions) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open(dir.path(), &opts);
        log.blocking_append(entries(1, 10)).await.unwrap();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        for i in 11..=20 {
            log.blocking_append(entries(i, i)).await.unwrap();
        }
    }
    restore_crash_image(dir.path()).unwrap();
    let (mut log, _sm) = open(dir.path(), &opts);
    let kept: Vec<u64> = log.try_get_log_entries(0..=20).await.unwrap().iter().map(|e| e.log_id.index).collect();
    (1..=20).filter(|i| !kept.contains(i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_append_survives_a_power_loss() {
    assert_eq!(acknowledged_but_lost(shim()).await, Vec::<u64>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_acknowledges_before_fsync_loses_entries_and_is_caught() {
    let buggy = StoreOptions { fault: Some(StoreFault::AckBeforeFsync), ..shim() };
    // The vote's fsync made 1..=10 durable; nothing synced 11..=20.
    assert_eq!(acknowledged_but_lost(buggy).await, (11..=20).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_drops_unsynced_writes_and_keeps_vote_purge_and_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, meta) = {
        let (mut log, mut sm) = open(dir.path(), &shim());
        log.blocking_append(entries(1, 30)).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        sm.apply(entries(1, 30)).await.unwrap();
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        log.purge(log_id(1, 25)).await.unwrap();
        // Not synced: the committed index is recomputed by the cluster.
        log.save_committed(Some(log_id(1, 30))).await.unwrap();
        (sm.reader().applied_and_digest().1, snapshot.meta)
    };
    restore_crash_image(dir.path()).unwrap();
    let (mut log, mut sm) = open(dir.path(), &shim());
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 25)));
    assert_eq!(state.last_log_id, Some(log_id(1, 30)));
    assert_eq!(log.try_get_log_entries(0..=30).await.unwrap(), entries(26, 30));
    // Read back uncommitted: a replica never resumes leading in its old term.
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    assert_eq!(log.read_committed().await.unwrap(), None, "an unsynced write must not survive a power loss");
    assert_eq!(sm.reader().applied_and_digest(), (Some(log_id(1, 30)), digest));
    assert_eq!(sm.get_current_snapshot().await.unwrap().expect("snapshot kept").meta, meta);

    // The restored store keeps recording: a second power loss keeps new work.
    log.blocking_append(entries(31, 32)).await.unwrap();
    drop((log, sm));
    restore_crash_image(dir.path()).unwrap();
    let (mut log, _sm) = open(dir.path(), &shim());
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 32)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_before_any_fsync_leaves_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), &shim()));
    restore_crash_image(dir.path()).unwrap();
    let (mut log, mut sm) = open(dir.path(), &shim());
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, None);
    assert_eq!(log.read_vote().await.unwrap(), None);
    assert_eq!(sm.applied_state().await.unwrap().0, None);
}

struct ShimBuilder;

impl StoreBuilder<C, LogStore<Kv>, StateMachineStore<Kv>, TempDir> for ShimBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore<Kv>, StateMachineStore<Kv>), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let opts = StoreOptions { applied_log: true, crash_image: true, ..StoreOptions::default() };
        let (log, sm) = open_with::<Kv>(dir.path(), &opts).expect("open a fresh data dir");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes_with_the_applied_log_and_the_crash_shim() {
    Suite::test_all(ShimBuilder).expect("storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applied_log_keeps_every_applied_entry_past_compaction_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { applied_log: true, ..StoreOptions::default() };
    {
        let (mut log, mut sm) = open(dir.path(), &opts);
        log.blocking_append(entries(1, 12)).await.unwrap();
        sm.apply(entries(1, 12)).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        log.purge(log_id(1, 12)).await.unwrap();
    }
    {
        // A restart re-applies what followed the snapshot: records repeat.
        let (_log, mut sm) = open(dir.path(), &opts);
        sm.apply(entries(13, 15)).await.unwrap();
        sm.apply(entries(13, 15)).await.unwrap();
    }
    let records = read_applied_log::<Kv>(dir.path()).unwrap();
    let indexes: Vec<u64> = records.iter().map(|r| r.index).collect();
    assert_eq!(indexes, [(1..=15).collect::<Vec<_>>(), (13..=15).collect()].concat());
    assert_eq!(records[0], AppliedRecord { index: 1, term: 1, batch: None }, "membership has no batch");
    assert_eq!(
        records[4].batch,
        Some(CommandBatch { time_ms: 1_005, commands: vec![Set("k2".into(), "v5".into())] }),
        "a normal entry keeps its time and commands"
    );

    // A record torn by a crash mid-write is ignored; a corrupt whole one is an error.
    let file = dir.path().join("applied.log");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2]);
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(read_applied_log::<Kv>(dir.path()).unwrap().len(), 18);
    bytes.truncate(bytes.len() - 6);
    bytes.extend_from_slice(&[2, 0, 0, 0, 9, 9]);
    std::fs::write(&file, &bytes).unwrap();
    let err = read_applied_log::<Kv>(dir.path()).unwrap_err().to_string();
    assert!(err.contains("does not decode"), "{err}");
    assert!(read_applied_log::<Kv>(tempfile::tempdir().unwrap().path()).unwrap().is_empty());
}

/// A store with the shim reading injected disk faults from `dir/fault`.
fn faulty(dir: &Path, fault: Option<StoreFault>) -> StoreOptions {
    StoreOptions { disk_fault_file: Some(dir.join("fault")), fault, ..shim() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_never_acknowledged_and_the_log_stops_at_the_last_good_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (data, control) = (dir.path().join("data"), dir.path().join("fault"));
    {
        let (mut log, _sm) = open(&data, &faulty(dir.path(), None));
        log.blocking_append(entries(1, 5)).await.unwrap();
        set_disk_fault(&control, Some(DiskFault::SyncFails)).unwrap();
        let err = log.blocking_append(entries(6, 8)).await.unwrap_err().to_string();
        assert!(err.contains("Input/output error") || err.contains("os error 5"), "{err}");
        assert_eq!(acked_beyond_durable(&data).unwrap(), None, "nothing unsynced was acknowledged");
        // Never again, even once the disk answers: a retried fsync could
        // report success for pages that never reached it.
        set_disk_fault(&control, None).unwrap();
        let err = log.blocking_append(entries(6, 6)).await.unwrap_err().to_string();
        assert!(err.contains("no more writes"), "{err}");
        let kept: Vec<u64> = log.try_get_log_entries(0..=8).await.unwrap().iter().map(|e| e.log_id.index).collect();
        assert_eq!(kept, (1..=5).collect::<Vec<_>>(), "the unsynced entries are dropped at once");
    }
    // Restarted on the same disk (a process restart), and after a power loss.
    let (mut log, _sm) = open(&data, &faulty(dir.path(), None));
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 5)));
    log.blocking_append(entries(6, 7)).await.unwrap();
    drop(log);
    assert_eq!(acked_beyond_durable(&data).unwrap(), None);
    restore_crash_image(&data).unwrap();
    let (mut log, _sm) = open(&data, &shim());
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_acknowledges_despite_a_failed_fsync_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (data, control) = (dir.path().join("data"), dir.path().join("fault"));
    let (mut log, _sm) = open(&data, &faulty(dir.path(), Some(StoreFault::AckDespiteSyncError)));
    log.blocking_append(entries(1, 5)).await.unwrap();
    set_disk_fault(&control, Some(DiskFault::SyncFails)).unwrap();
    log.blocking_append(entries(6, 8)).await.expect("the bug acknowledges anyway");
    drop(log);
    assert_eq!(acked_beyond_durable(&data).unwrap(), Some((8, 5)), "acknowledged 6..=8, durable up to 5");
    restore_crash_image(&data).unwrap();
    assert_eq!(acked_beyond_durable(&data).unwrap(), None, "after the power loss it acknowledges what survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_acknowledges_before_fsync_is_caught_before_anything_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let buggy = StoreOptions { fault: Some(StoreFault::AckBeforeFsync), ..shim() };
    let (mut log, _sm) = open(dir.path(), &buggy);
    log.blocking_append(entries(1, 4)).await.unwrap();
    drop(log);
    assert_eq!(acked_beyond_durable(dir.path()).unwrap(), Some((4, 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_append_and_leaves_no_partial_record() {
    let dir = tempfile::tempdir().unwrap();
    let (data, control) = (dir.path().join("data"), dir.path().join("fault"));
    {
        let (mut log, _sm) = open(&data, &faulty(dir.path(), None));
        log.blocking_append(entries(1, 5)).await.unwrap();
        set_disk_fault(&control, Some(DiskFault::Full)).unwrap();
        let err = log.blocking_append(entries(6, 8)).await.unwrap_err().to_string();
        assert!(err.contains("No space left") || err.contains("os error 28"), "{err}");
        // Space again: a full disk is not a lying one, the log carries on.
        set_disk_fault(&control, None).unwrap();
        log.blocking_append(entries(6, 8)).await.unwrap();
    }
    assert_eq!(acked_beyond_readable(&data).unwrap(), None, "everything acknowledged reads back");
    let (mut log, _sm) = open(&data, &shim());
    let kept: Vec<u64> = log.try_get_log_entries(0..=8).await.unwrap().iter().map(|e| e.log_id.index).collect();
    assert_eq!(kept, (1..=8).collect::<Vec<_>>(), "no torn record between 5 and 6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_acknowledges_despite_a_failed_write_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (data, control) = (dir.path().join("data"), dir.path().join("fault"));
    {
        let (mut log, _sm) = open(&data, &faulty(dir.path(), Some(StoreFault::AckDespiteWriteError)));
        log.blocking_append(entries(1, 5)).await.unwrap();
        set_disk_fault(&control, Some(DiskFault::Full)).unwrap();
        log.blocking_append(entries(6, 8)).await.expect("the bug acknowledges anyway");
        set_disk_fault(&control, None).unwrap();
        log.blocking_append(entries(9, 10)).await.unwrap();
    }
    // The torn record cuts off everything after it when the log is read
    // back: entries the replica acknowledged are gone.
    let (acked, readable) = acked_beyond_readable(&data).unwrap().expect("caught");
    assert_eq!(acked, 10);
    assert!(readable < 8, "read back up to {readable} only");
    assert!(!data.join("readback").exists(), "the copy read back is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_is_slow_but_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (data, control) = (dir.path().join("data"), dir.path().join("fault"));
    let (mut log, _sm) = open(&data, &faulty(dir.path(), None));
    set_disk_fault(&control, Some(DiskFault::SlowSync(std::time::Duration::from_millis(60)))).unwrap();
    let started = std::time::Instant::now();
    log.blocking_append(entries(1, 3)).await.unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(60), "the sync waited for the slow disk");
    drop(log);
    assert_eq!(acked_beyond_durable(&data).unwrap(), None);
}
