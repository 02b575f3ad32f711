//! Write, drop, reopen: the same log, vote, purge marker, snapshot and
//! applied state come back.

use std::path::Path;

use muster_raft_store::{LogStore, StateMachineStore, open};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};

use crate::kv::{Kv, entries, log_id};

fn reopen(dir: &Path) -> (LogStore<Kv>, StateMachineStore<Kv>) {
    open::<Kv>(dir).expect("reopen")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_vote_and_committed_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = reopen(dir.path());
        log.blocking_append(entries(1, 20)).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        log.save_committed(Some(log_id(1, 15))).await.unwrap();
        log.truncate(log_id(1, 18)).await.unwrap();
    }
    let (mut log, _sm) = reopen(dir.path());
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, 17)));
    assert_eq!(state.last_purged_log_id, None);
    // Read back uncommitted: a replica never resumes leading in its old term.
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 15)));
    let got = log.try_get_log_entries(1..=17).await.unwrap();
    assert_eq!(got, entries(1, 17));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_purge_and_applied_state_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, meta) = {
        let (mut log, mut sm) = reopen(dir.path());
        log.blocking_append(entries(1, 30)).await.unwrap();
        let outcomes = sm.apply(entries(1, 30)).await.unwrap();
        assert_eq!(outcomes.len(), 30);
        assert_eq!(outcomes[0], Vec::<Option<String>>::new(), "a membership entry has no outcomes");
        assert_eq!(outcomes[2], vec![None], "entry 3 sets k0 for the first time");
        assert_eq!(outcomes[4], vec![Some("v2".to_string())], "entry 5 overwrites k2");
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 30)));
        log.purge(log_id(1, 25)).await.unwrap();
        (sm.reader().applied_and_digest().1, snapshot.meta)
    };
    let (mut log, mut sm) = reopen(dir.path());
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 25)));
    assert_eq!(state.last_log_id, Some(log_id(1, 30)));
    assert_eq!(log.try_get_log_entries(0..=30).await.unwrap(), entries(26, 30));
    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 30)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
    assert_eq!(sm.reader().applied_and_digest(), (Some(log_id(1, 30)), digest));
    // Readiness polls the applied index twice a second on every replica:
    // that read must not hash the whole state under the lock applies need.
    let before = crate::kv::digests_here();
    assert_eq!(sm.reader().applied(), Some(log_id(1, 30)));
    assert_eq!(crate::kv::digests_here(), before, "reading the applied index computed a digest");
    let _ = sm.reader().applied_and_digest();
    assert_eq!(crate::kv::digests_here(), before + 1);
    let current = sm.get_current_snapshot().await.unwrap().expect("snapshot kept");
    assert_eq!(current.meta, meta);
    assert_eq!(sm.reader().read(|kv| kv.map.get("k0").cloned()), Some("v30".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_snapshot_replaces_the_state_and_survives_a_restart() {
    let source = tempfile::tempdir().unwrap();
    let (meta, data) = {
        let (_log, mut sm) = reopen(source.path());
        sm.apply(entries(1, 12)).await.unwrap();
        let s = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        (s.meta, s.snapshot.into_inner())
    };
    let target = tempfile::tempdir().unwrap();
    {
        let (_log, mut sm) = reopen(target.path());
        sm.apply(entries(1, 3)).await.unwrap();
        let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
        receiving.get_mut().extend_from_slice(&data);
        sm.install_snapshot(&meta, receiving).await.unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 12)));
    }
    let (_log, mut sm) = reopen(target.path());
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 12)));
    assert_eq!(sm.reader().read(|kv| kv.map.len()), 3);
}

#[test]
fn a_data_dir_in_use_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let _held = reopen(dir.path());
    let err = open::<Kv>(dir.path()).err().expect("second open refused");
    assert!(err.to_string().contains("is in use by another process"), "{err}");
}

#[test]
fn a_corrupt_snapshot_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(reopen(dir.path()));
    std::fs::write(dir.path().join("snapshot.bin"), b"\x07garbage").unwrap();
    let err = open::<Kv>(dir.path()).err().expect("corrupt snapshot refused");
    assert!(err.to_string().contains("snapshot"), "{err}");
}
