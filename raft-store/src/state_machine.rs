//! The application state machine as openraft drives it, and its snapshots.
//!
//! The application state lives in memory. `applied_state` reports the last
//! applied log id and membership; on restart they come from the stored
//! snapshot, and openraft re-applies the committed log after it, so applying
//! an entry writes nothing to disk. A snapshot is the application's own
//! bytes with openraft's metadata, written atomically to `snapshot.bin`.

use std::io::Cursor;
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::disk::Disk;
use crate::records::Records;
use crate::touches::{TouchWatch, Touches};
use crate::{RaftConfig, StateMachineApp, applied_log, codec};

type C<A> = RaftConfig<A>;

/// What `snapshot.bin` holds.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta<u64, BasicNode>,
    pub(crate) data: Vec<u8>,
}

struct Inner<A> {
    app: A,
    applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    snapshots_built: u64,
}

/// openraft's state-machine storage for the application `A`.
pub struct StateMachineStore<A: StateMachineApp> {
    disk: Disk,
    inner: Arc<RwLock<Inner<A>>>,
    touches: Arc<Touches>,
    records: Arc<Records<A::Record>>,
}

impl<A: StateMachineApp> Clone for StateMachineStore<A> {
    fn clone(&self) -> Self {
        StateMachineStore {
            disk: self.disk.clone(),
            inner: self.inner.clone(),
            touches: self.touches.clone(),
            records: self.records.clone(),
        }
    }
}

/// A read-only handle on the applied application state, for queries and
/// status (`applied index`, digest) beside openraft.
pub struct AppReader<A: StateMachineApp> {
    inner: Arc<RwLock<Inner<A>>>,
    touches: Arc<Touches>,
    records: Arc<Records<A::Record>>,
}

impl<A: StateMachineApp> Clone for AppReader<A> {
    fn clone(&self) -> Self {
        AppReader { inner: self.inner.clone(), touches: self.touches.clone(), records: self.records.clone() }
    }
}

impl<A: StateMachineApp> AppReader<A> {
    /// A watch that wakes when an applied entry touched `key` (see
    /// [`StateMachineApp::take_touched`]) or a snapshot replaced the state.
    pub fn watch_touches(&self, key: u32) -> TouchWatch {
        self.touches.watch(key)
    }

    /// The records applied entries left (see
    /// [`StateMachineApp::take_records`]), for the one consumer that stores
    /// them.
    pub fn records(&self) -> &Records<A::Record> {
        &self.records
    }

    /// Runs `f` on the applied state.
    pub fn read<R>(&self, f: impl FnOnce(&A) -> R) -> R {
        f(&self.inner.read().expect("state machine lock poisoned").app)
    }

    /// What a backup needs, under one lock: the last applied log id, the
    /// state's snapshot bytes and its digest.
    pub fn export(&self) -> (Option<LogId<u64>>, Vec<u8>, [u8; 32]) {
        let inner = self.inner.read().expect("state machine lock poisoned");
        (inner.applied, inner.app.snapshot(), inner.app.digest())
    }

    /// The last applied log id (cheap: no digest).
    pub fn applied(&self) -> Option<LogId<u64>> {
        self.inner.read().expect("state machine lock poisoned").applied
    }

    /// The last applied log id and the digest of the state at that point.
    /// The digest hashes the whole state (of an encoding copy, after the
    /// lock is let go): for explicit requests only, never on a timer.
    pub fn applied_and_digest(&self) -> (Option<LogId<u64>>, [u8; 32]) {
        let (applied, copy) = {
            let inner = self.inner.read().expect("state machine lock poisoned");
            (inner.applied, inner.app.encoding_copy())
        };
        (applied, copy.digest())
    }
}

impl<A: StateMachineApp> StateMachineStore<A> {
    pub(crate) fn open(disk: Disk, snapshot: Option<StoredSnapshot>) -> Result<Self, String> {
        metrics::gauge!("muster_raft_snapshot_bytes").set(snapshot.as_ref().map_or(0, |s| s.data.len()) as f64);
        let inner = match snapshot {
            None => {
                Inner { app: A::default(), applied: None, membership: StoredMembership::default(), snapshots_built: 0 }
            }
            Some(s) => Inner {
                app: A::restore(&s.data).map_err(|e| e.to_string())?,
                applied: s.meta.last_log_id,
                membership: s.meta.last_membership,
                snapshots_built: 0,
            },
        };
        let mut inner = inner;
        let records: Arc<Records<A::Record>> = Arc::default();
        records.push(inner.app.take_records());
        Ok(StateMachineStore { disk, inner: Arc::new(RwLock::new(inner)), touches: Arc::default(), records })
    }

    /// A read-only handle on the applied state.
    pub fn reader(&self) -> AppReader<A> {
        AppReader { inner: self.inner.clone(), touches: self.touches.clone(), records: self.records.clone() }
    }

    /// Writes a snapshot (built or installed) to disk: the stored form is
    /// encoded, as the snapshot's bytes were, on a blocking thread, so that
    /// copying hundreds of megabytes never holds up an async worker (and
    /// with it the heartbeats). Returns `data` back.
    async fn store_snapshot(
        &self,
        meta: &SnapshotMeta<u64, BasicNode>,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, StorageError<u64>> {
        let err =
            |e: String| StorageError::from(StorageIOError::write_snapshot(Some(meta.signature()), AnyError::error(e)));
        let size = data.len();
        let stored = StoredSnapshot { meta: meta.clone(), data };
        let (stored, bytes) = tokio::task::spawn_blocking(move || {
            let bytes = codec::encode(&stored);
            (stored, bytes)
        })
        .await
        .map_err(|e| err(format!("encoding task: {e}")))?;
        let bytes = bytes.map_err(|e| err(e.to_string()))?;
        self.disk.write_snapshot(bytes).await.map_err(|e| err(e.to_string()))?;
        // Built or installed: the snapshot this replica holds now.
        metrics::gauge!("muster_raft_snapshot_bytes").set(size as f64);
        Ok(stored.data)
    }
}

impl<A: StateMachineApp> RaftSnapshotBuilder<C<A>> for StateMachineStore<A> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<C<A>>, StorageError<u64>> {
        let copying = std::time::Instant::now();
        let (meta, data) = {
            let mut inner = self.inner.write().expect("state machine lock poisoned");
            inner.snapshots_built += 1;
            let snapshot_id = match inner.applied {
                Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, inner.snapshots_built),
                None => format!("0-0-{}", inner.snapshots_built),
            };
            let meta =
                SnapshotMeta { last_log_id: inner.applied, last_membership: inner.membership.clone(), snapshot_id };
            (meta, inner.app.encoding_copy())
        };
        metrics::histogram!("muster_raft_snapshot_copy_seconds").record(copying.elapsed().as_secs_f64());
        // Encoded off the lock (and off the async workers): applies and
        // reads go on meanwhile.
        let started = std::time::Instant::now();
        let data = tokio::task::spawn_blocking(move || data.snapshot()).await.map_err(|e| {
            StorageError::from(StorageIOError::write_snapshot(None, AnyError::error(format!("encoding task: {e}"))))
        })?;
        metrics::histogram!("muster_raft_snapshot_encode_seconds").record(started.elapsed().as_secs_f64());
        let data = self.store_snapshot(&meta, data).await?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl<A: StateMachineApp> RaftStateMachine<C<A>> for StateMachineStore<A> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let inner = self.inner.read().expect("state machine lock poisoned");
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<A::Outcome>>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<C<A>>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<C<A>>> = entries.into_iter().collect();
        if let Some(file) = &self.disk.applied {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            applied_log::append::<A>(&mut file, &entries).map_err(|e| {
                StorageError::from(StorageIOError::write_state_machine(AnyError::error(format!(
                    "cannot append to the applied log: {e}"
                ))))
            })?;
        }
        let started = std::time::Instant::now();
        let mut inner = self.inner.write().expect("state machine lock poisoned");
        let mut responses = Vec::new();
        for entry in entries {
            inner.applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Vec::new()),
                EntryPayload::Normal(batch) => responses.push(inner.app.apply_batch(&batch)),
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    responses.push(Vec::new());
                }
            }
        }
        let touched = inner.app.take_touched();
        let records = inner.app.take_records();
        drop(inner);
        self.touches.touch(&touched);
        self.records.push(records);
        metrics::histogram!("muster_raft_apply_seconds").record(started.elapsed().as_secs_f64());
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        // Decoded on a blocking thread: a large state takes seconds, and
        // an async worker held that long stops answering the leader.
        let (data, app) = tokio::task::spawn_blocking(move || {
            let app = A::restore(&data);
            (data, app)
        })
        .await
        .map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                AnyError::error(format!("decoding task: {e}")),
            ))
        })?;
        let app = app.map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e)))
        })?;
        self.store_snapshot(meta, data).await?;
        let mut inner = self.inner.write().expect("state machine lock poisoned");
        inner.app = app;
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        let records = inner.app.take_records();
        drop(inner);
        self.touches.touch_all();
        self.records.push(records);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<C<A>>>, StorageError<u64>> {
        // Read and decoded on a blocking thread (a lagging follower is sent
        // the whole snapshot).
        let disk = self.disk.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<Option<StoredSnapshot>, String> {
            let Some(bytes) = disk.read_snapshot_file().map_err(|e| e.to_string())? else { return Ok(None) };
            codec::decode(&bytes).map(Some).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, AnyError::error(e))))?;
        Ok(read.map(|stored| Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}
