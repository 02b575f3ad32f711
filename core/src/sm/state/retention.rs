//! Retention: finished allocations are compacted after a short window and
//! leave the live state after a longer one, and idempotency keys after
//! theirs. The job history keeps their records.
//!
//! ```text
//!   finished (done, failed, cancelled) at t
//!     ── CompactFinished at t + detail ──▶ compacted: status, whether it started, its end,
//!                                          its key's spec hash (44 bytes, not 2.9 KiB);
//!                                          get/watch answer from the job history's record
//!     ── ForgetFinished at t + retention ──▶ gone
//!                                          (ids are never reused: get/watch answer
//!                                           NOT_FOUND, naming the history)
//!   idempotency key of a submit at s: honoured while its allocation is held,
//!   and until s + key window, whichever is later (a tombstone with the spec's
//!   hash answers a retried submit after the allocation is gone)
//! ```

use sha2::{Digest as _, Sha256};

use super::*;

/// The most finished allocations a compaction may keep whole.
pub const MAX_KEEP_WHOLE: u64 = 10_000_000;

/// The least retention a forget may use: an allocation is never forgotten
/// in the same breath as it finishes.
pub const MIN_RETENTION_MS: u64 = 1_000;

/// The most allocations (and keys) one forget may drop: bounds the cost of
/// one entry on every replica.
pub const MAX_FORGET_PER_ENTRY: u32 = 10_000;

/// An idempotency key whose allocation was forgotten, kept until its window
/// ends so that a retried submit still finds what it made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgottenKey {
    /// The allocation the key made.
    pub alloc: AllocId,
    /// SHA-256 of the submitted spec's canonical (postcard) encoding: a retry
    /// must send the same spec.
    pub spec_sha256: [u8; 32],
    /// When the key stops being honoured (entry time, ms).
    pub expires_ms: u64,
}

/// A finished allocation past the detail window, as the live state keeps
/// it: what dependencies on it, a retried submit with its key, a cancel
/// and retention need (24 bytes; its job-history record, found by id,
/// holds the rest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compacted {
    /// Done, failed or cancelled.
    pub status: AllocStatus,
    /// Whether a task of it ever started.
    pub started: bool,
    /// Entry time it finished.
    pub end_ms: u64,
    /// Its idempotency key while the key still names it (boxed: most
    /// allocations have none, and then this costs one pointer).
    pub key: Option<Box<CompactKey>>,
}

/// The idempotency key of a compacted allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactKey {
    /// The submit's owner.
    pub owner: String,
    /// The key.
    pub key: String,
    /// SHA-256 of the submitted spec ([`spec_sha256`]).
    pub spec_sha256: [u8; 32],
    /// Entry time of the submit (the key's window counts from it).
    pub submit_ms: u64,
}

/// The hash a [`ForgottenKey`] keeps of a spec.
pub fn spec_sha256(spec: &AllocSpec) -> [u8; 32] {
    let bytes = postcard::to_stdvec(spec).expect("encoding a spec into memory cannot fail");
    Sha256::digest(&bytes).into()
}

impl State {
    /// Whether allocation `id` existed and was forgotten after its
    /// retention window (ids are never reused).
    pub fn was_forgotten(&self, id: AllocId) -> bool {
        id >= 1
            && id < self.next_alloc_id
            && !self.holds(id)
            && !self.arrays.contains_key(&id)
            && !self.workflows.contains_key(&id)
            && self.array_of(id).is_none_or(|(a, position)| position < a.next && !a.is_skipped(position))
    }

    /// Whether the live state holds allocation `id`, whole or compacted.
    pub fn holds(&self, id: AllocId) -> bool {
        self.allocs.contains_key(&id) || self.compacted.contains_key(&id)
    }

    /// Allocation `id`, if it is finished and compacted.
    pub fn compacted(&self, id: AllocId) -> Option<&Compacted> {
        self.compacted.get(&id)
    }

    /// How many finished allocations are held compacted.
    pub fn compacted_len(&self) -> usize {
        self.compacted.len()
    }

    /// How many finished allocations are held whole.
    pub fn detailed_len(&self) -> usize {
        self.index.detailed.len()
    }

    /// Whether a compaction at `now_ms` with this detail window, keeping at
    /// most `keep_whole` finished allocations whole, has something to do.
    pub fn compact_due(&self, now_ms: u64, detail_ms: u64, keep_whole: u64) -> bool {
        let cutoff = now_ms.saturating_sub(detail_ms);
        self.index.detailed.first().is_some_and(|&(end, _)| end <= cutoff)
            || self.index.detailed.len() as u64 > keep_whole
    }

    /// Compacts the finished allocations that ended `detail_ms` or more
    /// before the entry's time, and the oldest beyond the newest
    /// `keep_whole` (at most `max` in all, oldest end first).
    pub(super) fn compact_finished(&mut self, detail_ms: u64, keep_whole: u64, max: u32) -> Applied {
        if detail_ms < MIN_RETENTION_MS {
            return Err(Rejection::InvalidForget(format!(
                "detail_ms {detail_ms} is under the least, {MIN_RETENTION_MS}"
            )));
        }
        if keep_whole > MAX_KEEP_WHOLE {
            return Err(Rejection::InvalidForget(format!(
                "keep_whole {keep_whole} is over the most, {MAX_KEEP_WHOLE}"
            )));
        }
        if max == 0 || max > MAX_FORGET_PER_ENTRY {
            return Err(Rejection::InvalidForget(format!("max {max} is not within 1..={MAX_FORGET_PER_ENTRY}")));
        }
        let cutoff = self.now_ms.saturating_sub(detail_ms);
        let over = (self.index.detailed.len() as u64).saturating_sub(keep_whole);
        let due: Vec<(u64, AllocId)> = self
            .index
            .detailed
            .iter()
            .enumerate()
            .take_while(|&(k, &(end, _))| end <= cutoff || (k as u64) < over)
            .take(max as usize)
            .map(|(_, &e)| e)
            .collect();
        let Some(&(through_ms, _)) = due.last() else { return Err(Rejection::NothingToCompact) };
        for &(end, id) in &due {
            self.index.detailed.remove(&(end, id));
            let a = self.allocs.remove(&id).expect("a detailed allocation is held whole");
            let key = a
                .spec
                .idempotency_key
                .as_ref()
                .filter(|k| self.idempotency.get(&(a.spec.owner.clone(), (*k).clone())) == Some(&id));
            let key = key.map(|k| {
                let (owner, key, spec_sha256) = (a.spec.owner.clone(), k.clone(), spec_sha256(&a.spec));
                Box::new(CompactKey { owner, key, spec_sha256, submit_ms: a.submit_time_ms })
            });
            let c = Compacted { status: a.status, started: a.ever_started(), end_ms: end, key };
            self.compacted.insert(id, c);
            self.queue_compacted(end, id);
        }
        Ok(vec![Event::Compacted { allocs: due.len() as u32, through_ms }])
    }

    /// How many allocations have been forgotten since the cluster began.
    pub fn forgotten_allocs(&self) -> u64 {
        self.forgotten_allocs
    }

    /// Allocations that have finished since the cluster began (the last
    /// record's sequence number).
    pub fn finished_total(&self) -> u64 {
        self.finished_total
    }

    /// Finished allocations still held, whole or compacted, oldest end
    /// first, as (end, id).
    pub fn finished(&self) -> impl Iterator<Item = (u64, AllocId)> + '_ {
        self.finished_through(u64::MAX, usize::MAX).into_iter()
    }

    /// The finished allocations held, whole or compacted, that ended by
    /// `cutoff`: at most `max`, oldest (end, id) first.
    fn finished_through(&self, cutoff: u64, max: usize) -> Vec<(u64, AllocId)> {
        let by_end = |&(end, _): &(u64, AllocId)| end <= cutoff;
        let mut whole = self.index.detailed.iter().copied().take_while(by_end).peekable();
        let mut compacted =
            self.index.compacted_by_end.iter().map(|&id| (self.compacted_end(id), id)).take_while(by_end).peekable();
        let mut out = Vec::new();
        while out.len() < max {
            let next = match (whole.peek(), compacted.peek()) {
                (Some(w), Some(c)) if w < c => whole.next(),
                (Some(_), None) => whole.next(),
                _ => compacted.next(),
            };
            let Some(next) = next else { break };
            out.push(next);
        }
        out
    }

    /// The end of compacted allocation `id`.
    fn compacted_end(&self, id: AllocId) -> u64 {
        self.compacted.get(&id).expect("a queued allocation is compacted").end_ms
    }

    /// Queues compacted allocation `id`, which ended at `end`, in
    /// `compacted_by_end`: at the back unless one compacted before it ended
    /// in the same millisecond with a higher id.
    fn queue_compacted(&mut self, end: u64, id: AllocId) {
        let before = |&other: &AllocId| (self.compacted_end(other), other) < (end, id);
        let queue = &self.index.compacted_by_end;
        if queue.back().is_none_or(before) {
            self.index.compacted_by_end.push_back(id);
        } else {
            let at = queue.partition_point(before);
            self.index.compacted_by_end.insert(at, id);
        }
    }

    /// Idempotency keys kept after their allocation was forgotten.
    pub fn forgotten_keys(&self) -> usize {
        self.forgotten_keys.len()
    }

    /// Whether a forget at `now_ms` with this retention has something to do.
    pub fn forget_due(&self, now_ms: u64, retention_ms: u64) -> bool {
        let cutoff = now_ms.saturating_sub(retention_ms);
        !self.finished_through(cutoff, 1).is_empty()
            || self.index.key_expiry.first().is_some_and(|(exp, _, _)| *exp <= now_ms)
    }

    pub(super) fn forget_finished(&mut self, retention_ms: u64, key_window_ms: u64, max: u32) -> Applied {
        if retention_ms < MIN_RETENTION_MS {
            return Err(Rejection::InvalidForget(format!(
                "retention_ms {retention_ms} is under the least, {MIN_RETENTION_MS}"
            )));
        }
        if max == 0 || max > MAX_FORGET_PER_ENTRY {
            return Err(Rejection::InvalidForget(format!("max {max} is not within 1..={MAX_FORGET_PER_ENTRY}")));
        }
        let now = self.now_ms;
        let cutoff = now.saturating_sub(retention_ms);
        let allocs = self.finished_through(cutoff, max as usize);
        let keys: Vec<(u64, String, String)> =
            self.index.key_expiry.iter().take_while(|(exp, _, _)| *exp <= now).take(max as usize).cloned().collect();
        let arrays = self.arrays_to_forget(cutoff, max as usize, &allocs);
        if allocs.is_empty() && keys.is_empty() && arrays.is_empty() {
            return Err(Rejection::NothingToForget);
        }
        for (exp, owner, key) in &keys {
            self.index.key_expiry.remove(&(*exp, owner.clone(), key.clone()));
            self.forgotten_keys.remove(&(owner.clone(), key.clone()));
        }
        let mut through_ms = 0;
        for &(end, id) in &allocs {
            through_ms = end;
            self.forgotten_allocs += 1;
            if let Some(a) = self.allocs.remove(&id) {
                self.index.detailed.remove(&(end, id));
                self.bury(&a);
                let expires_ms = a.submit_time_ms.saturating_add(key_window_ms);
                let key = a.spec.idempotency_key.as_deref();
                self.retire_key(&a.spec.owner, key, id, expires_ms, || spec_sha256(&a.spec));
            } else {
                let front = self.index.compacted_by_end.pop_front();
                assert_eq!(front, Some(id), "compacted allocations are forgotten oldest first");
                let c = self.compacted.remove(&id).expect("a finished allocation is held, whole or compacted");
                self.entomb(id, Tombstone { status: c.status, started: c.started });
                if let Some(k) = c.key {
                    let expires_ms = k.submit_ms.saturating_add(key_window_ms);
                    self.retire_key(&k.owner, Some(&k.key), id, expires_ms, || k.spec_sha256);
                }
            }
        }
        for &(end, id) in &arrays {
            self.index.finished_arrays.remove(&(end, id));
            let a = self.arrays.remove(&id).expect("a finished array is held");
            self.entomb(id, Tombstone { status: a.final_status().expect("finished"), started: a.started });
            let expires_ms = a.submit_time_ms.saturating_add(key_window_ms);
            let sha = || super::array_sha256(&a.spec, &a.indices, a.corr);
            self.retire_key(&a.spec.owner, a.spec.idempotency_key.as_deref(), id, expires_ms, sha);
        }
        let workflows = if self.workflows.is_empty() { 0 } else { self.forget_workflows(key_window_ms) };
        let forgotten = (allocs.len() + arrays.len() + workflows) as u32;
        Ok(vec![Event::Forgotten { allocs: forgotten, keys: keys.len() as u32, through_ms }])
    }

    /// Finished arrays retention may forget now (at most `max`): ended by
    /// `cutoff`, none of their elements still held (beyond those `allocs`
    /// forgets in the same entry), and no live array correlated to them.
    fn arrays_to_forget(&self, cutoff: u64, max: usize, allocs: &[(u64, AllocId)]) -> Vec<(u64, AllocId)> {
        if self.index.finished_arrays.is_empty() {
            return Vec::new();
        }
        let going: BTreeSet<AllocId> = allocs.iter().map(|&(_, id)| id).collect();
        let corr: BTreeSet<AllocId> =
            self.arrays.values().filter(|a| a.finished_at_ms.is_none()).filter_map(|a| a.corr).collect();
        self.index
            .finished_arrays
            .iter()
            .take_while(|(end, _)| *end <= cutoff)
            .filter(|&&(_, id)| {
                let a = &self.arrays[&id];
                let (first, last) = (id + 1, id + a.count());
                !corr.contains(&id)
                    && self.allocs.range(first..=last).all(|(e, _)| going.contains(e))
                    && self.compacted.range(first, last).all(|(e, _)| going.contains(e))
            })
            .take(max)
            .copied()
            .collect()
    }

    /// Drops `owner`'s idempotency key `key` while it still names `id`, and
    /// keeps it honoured as a tombstone (the spec's hash) until
    /// `expires_ms` if that is still ahead.
    pub(super) fn retire_key(
        &mut self,
        owner: &str,
        key: Option<&str>,
        id: AllocId,
        expires_ms: u64,
        spec_sha256: impl FnOnce() -> [u8; 32],
    ) {
        let Some(key) = key else { return };
        let name = (owner.to_string(), key.to_string());
        if self.idempotency.get(&name) != Some(&id) {
            return;
        }
        self.idempotency.remove(&name);
        if expires_ms > self.now_ms {
            self.index.key_expiry.insert((expires_ms, name.0.clone(), name.1.clone()));
            self.forgotten_keys.insert(name, ForgottenKey { alloc: id, spec_sha256: spec_sha256(), expires_ms });
        }
    }
}
