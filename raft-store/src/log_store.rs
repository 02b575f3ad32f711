//! openraft's log storage on the [`LogFile`](crate::log_file::LogFile): an
//! append returns once written, and openraft hears that the entries are its
//! own once the flusher has synced them.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;

use crate::disk::{Disk, StoreFault};
use crate::log_file::Meta;
use crate::{RaftConfig, StateMachineApp, codec};

type C<A> = RaftConfig<A>;

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

    fn get_meta<T: DeserializeOwned>(&self, m: Meta) -> Result<Option<T>, StorageError<u64>> {
        match self.disk.log.meta(m) {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes).map(Some).map_err(read_logs_err),
        }
    }

    /// The id of the last entry in the log, or of the last purged one when
    /// the log is empty past a snapshot (what a pre-vote compares: how up
    /// to date this replica's log is).
    pub fn last_log_id(&self) -> Option<LogId<u64>> {
        let purged: Option<LogId<u64>> = self.get_meta(Meta::Purged).ok().flatten();
        self.last_entry_id().ok().flatten().or(purged)
    }

    fn last_entry_id(&self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        match self.disk.log.last() {
            None => Ok(None),
            Some(bytes) => {
                let entry: Entry<C<A>> = codec::decode(&bytes).map_err(read_logs_err)?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

impl<A: StateMachineApp> RaftLogReader<C<A>> for LogStore<A> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<C<A>>>, StorageError<u64>> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.disk.log.read(range).iter().map(|bytes| codec::decode(bytes).map_err(read_logs_err)).collect()
    }

    /// What a leader sends a follower in one append: the entries from
    /// `start`, up to [`MAX_APPEND_BYTES`] of them (always at least one).
    /// openraft would otherwise read a whole `max_payload_entries` batch
    /// (300) whatever its size, and a follower that fell behind a burst of
    /// large entries would be sent more than one append can carry within
    /// its deadline (the heartbeat interval): every try would time out and
    /// it would never catch up.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry<C<A>>>, StorageError<u64>> {
        let bytes = self.disk.log.read_limited(start, end, MAX_APPEND_BYTES);
        bytes.iter().map(|bytes| codec::decode(bytes).map_err(read_logs_err)).collect()
    }
}

/// The most bytes of encoded entries one append to a follower carries
/// (beyond its first entry, which always goes): well under the message cap
/// between replicas (64 MiB), and small enough that sending it, the
/// follower's write and its `fdatasync` fit within the append's deadline
/// (the heartbeat interval, 100 ms by default). Entries are themselves
/// bounded (the proposer refuses a command over its entry limit), so an
/// append is never larger than one entry or this.
pub const MAX_APPEND_BYTES: usize = 2 << 20;

impl<A: StateMachineApp> RaftLogStorage<C<A>> for LogStore<A> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C<A>>, StorageError<u64>> {
        let last_purged_log_id: Option<LogId<u64>> = self.get_meta(Meta::Purged)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let err = |e: io::Error| StorageError::from(StorageIOError::write_vote(AnyError::new(&e)));
        let bytes = codec::encode(vote).map_err(write_logs_err)?;
        self.disk.durably(move |log| log.set_meta(Meta::Vote, bytes)).await.map_err(err)
    }

    /// The vote, read once at startup, is handed back uncommitted: a
    /// replica never resumes as the leader it was. openraft would restore a
    /// committed vote of its own as leadership in the same term, and a
    /// leader sends entries before its own log has synced them: one that
    /// lost those entries (a power loss, a failed sync) would then write
    /// different entries at the same indexes under the same leader id, and
    /// followers holding the old ones would take them for the same entries
    /// (two replicas applying different entries at one index; `muster chaos`
    /// caught it). Uncommitted, the vote still binds this replica to its
    /// term's choice, and leading again takes an election in a later term.
    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        let vote: Option<Vote<u64>> = self.get_meta(Meta::Vote)?;
        Ok(vote.map(|v| Vote { committed: false, ..v }))
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError<u64>> {
        // Not synced: a lost committed index is recomputed by the cluster.
        let bytes = codec::encode(&committed).map_err(write_logs_err)?;
        self.disk.log.set_meta(Meta::Committed, bytes).map_err(write_logs_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        // One that does not decode was torn by a crash: the cluster knows it.
        Ok(self.get_meta::<Option<LogId<u64>>>(Meta::Committed).ok().flatten().flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C<A>>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<C<A>>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut items = Vec::new();
        for entry in entries {
            items.push((entry.log_id.index, codec::encode(&entry).map_err(write_logs_err)?));
        }
        let Some(&(last, _)) = items.last() else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        metrics::counter!("muster_raft_appended_bytes_total")
            .increment(items.iter().map(|(_, b)| b.len() as u64).sum());
        {
            // With the crash shim on, an append waits for a sync in progress,
            // so the image records exactly what that sync made durable.
            let _image = self.disk.image_guard();
            self.disk.log.append(items).map_err(write_logs_err)?;
        }
        if self.disk.opts.fault == Some(StoreFault::AckBeforeFsync) {
            if let Some(a) = &self.disk.acked {
                a.raise(last);
            }
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // The entries are readable now (replication can send them while they
        // sync); openraft counts them as this replica's only once the
        // flusher has made them durable and calls back.
        self.disk.flush_then(last, callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        // Entries from here on are no longer acknowledged: say so before
        // they go, so that a power loss at any moment finds the record at
        // or below what is durable.
        if let Some(a) = &self.disk.acked {
            a.lower_to(log_id.index.saturating_sub(1));
        }
        self.disk.durably(move |log| log.truncate(log_id.index)).await.map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let marker = codec::encode(&log_id).map_err(write_logs_err)?;
        self.disk.durably(move |log| log.purge(log_id.index, marker)).await.map_err(write_logs_err)
    }
}
