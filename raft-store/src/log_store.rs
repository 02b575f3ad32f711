//! The Raft log and its metadata (vote, committed, last purged) in one sled
//! tree, so a purge and its "last purged" marker change atomically.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::disk::{Disk, StoreFault};
use crate::{RaftConfig, StateMachineApp, codec};

type C<A> = RaftConfig<A>;

const VOTE: &[u8] = b"M:vote";
const COMMITTED: &[u8] = b"M:committed";
const PURGED: &[u8] = b"M:purged";

fn log_key(index: u64) -> [u8; 9] {
    let mut k = [b'L'; 9];
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
}

fn read_logs_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

fn write_logs_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

/// openraft's log storage for the application `A`.
pub struct LogStore<A> {
    disk: Disk,
    _app: PhantomData<fn() -> A>,
}

impl<A> Clone for LogStore<A> {
    fn clone(&self) -> Self {
        LogStore { disk: self.disk.clone(), _app: PhantomData }
    }
}

impl<A: StateMachineApp> LogStore<A> {
    pub(crate) fn new(disk: Disk) -> Self {
        LogStore { disk, _app: PhantomData }
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError<u64>> {
        match self.disk.log.get(key).map_err(read_logs_err)? {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes).map(Some).map_err(read_logs_err),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError<u64>> {
        let bytes = codec::encode(value).map_err(write_logs_err)?;
        self.disk.log.insert(key, bytes).map_err(write_logs_err)?;
        Ok(())
    }

    fn last_entry_id(&self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        match self.disk.log.range(log_key(0)..=log_key(u64::MAX)).next_back() {
            None => Ok(None),
            Some(kv) => {
                let (_, bytes) = kv.map_err(read_logs_err)?;
                let entry: Entry<C<A>> = codec::decode(&bytes).map_err(read_logs_err)?;
                Ok(Some(entry.log_id))
            }
        }
    }

    /// Keys from `from` (inclusive) to the end of the log.
    fn keys_from(&self, from: u64) -> Result<Vec<sled::IVec>, StorageError<u64>> {
        self.disk
            .log
            .range(log_key(from)..=log_key(u64::MAX))
            .keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_logs_err)
    }
}

impl<A: StateMachineApp> RaftLogReader<C<A>> for LogStore<A> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<C<A>>>, StorageError<u64>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => match i.checked_add(1) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(log_key(i)),
            Bound::Excluded(&i) => Bound::Excluded(log_key(i)),
            Bound::Unbounded => Bound::Included(log_key(u64::MAX)),
        };
        self.disk
            .log
            .range((Bound::Included(log_key(start)), end))
            .map(|kv| {
                let (_, bytes) = kv.map_err(read_logs_err)?;
                codec::decode(&bytes).map_err(read_logs_err)
            })
            .collect()
    }
}

impl<A: StateMachineApp> RaftLogStorage<C<A>> for LogStore<A> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C<A>>, StorageError<u64>> {
        let last_purged_log_id: Option<LogId<u64>> = self.get_meta(PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let err = |e: io::Error| StorageError::from(StorageIOError::write_vote(AnyError::new(&e)));
        self.put_meta(VOTE, vote)?;
        self.disk.sync().await.map_err(err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError<u64>> {
        // Not synced: a lost committed index is recomputed by the cluster.
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.get_meta::<Option<LogId<u64>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C<A>>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<C<A>>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            batch.insert(&log_key(entry.log_id.index), codec::encode(&entry).map_err(write_logs_err)?);
        }
        self.disk.log.apply_batch(batch).map_err(write_logs_err)?;
        if self.disk.opts.fault == Some(StoreFault::AckBeforeFsync) {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // Acknowledge only once the entries are on stable storage.
        match self.disk.sync().await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(write_logs_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut batch = sled::Batch::default();
        for key in self.keys_from(log_id.index)? {
            batch.remove(key);
        }
        self.disk.log.apply_batch(batch).map_err(write_logs_err)?;
        self.disk.sync().await.map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut batch = sled::Batch::default();
        batch.insert(PURGED, codec::encode(&log_id).map_err(write_logs_err)?);
        for kv in self.disk.log.range(log_key(0)..=log_key(log_id.index)).keys() {
            batch.remove(kv.map_err(read_logs_err)?);
        }
        self.disk.log.apply_batch(batch).map_err(write_logs_err)?;
        self.disk.sync().await.map_err(write_logs_err)
    }
}
