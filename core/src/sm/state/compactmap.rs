//! The compacted finished allocations by id: a sorted vector per 1,024 ids,
//! shared between copies like [`super::AllocMap`]'s chunks. There may be a
//! million of them, so each costs its id and its [`Compacted`] record (32
//! bytes) and little else: a `BTreeMap` per chunk, half-full nodes after
//! inserts in id order, cost nearly three times that.
//!
//! It encodes as a map in id order, as a `BTreeMap` would.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Compacted;
use super::allocmap::chunk_of;
use crate::sm::AllocId;

/// Entries a full chunk grows by: its spare room stays under 2 KiB.
const GROW_BY: usize = 64;

type Chunk = Vec<(AllocId, Compacted)>;

/// Compacted allocations by id (see the module's doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactMap {
    chunks: BTreeMap<u64, Arc<Chunk>>,
    len: usize,
}

impl CompactMap {
    /// How many it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The record of `id`.
    pub fn get(&self, id: &AllocId) -> Option<&Compacted> {
        let chunk = self.chunks.get(&chunk_of(*id))?;
        chunk.binary_search_by_key(id, |(k, _)| *k).ok().map(|at| &chunk[at].1)
    }

    /// Whether it holds `id`.
    pub fn contains_key(&self, id: &AllocId) -> bool {
        self.get(id).is_some()
    }

    /// Inserts the record of `id`, returning the one it replaced.
    pub fn insert(&mut self, id: AllocId, c: Compacted) -> Option<Compacted> {
        let chunk = Arc::make_mut(self.chunks.entry(chunk_of(id)).or_default());
        match chunk.binary_search_by_key(&id, |(k, _)| *k) {
            Ok(at) => Some(std::mem::replace(&mut chunk[at].1, c)),
            Err(at) => {
                if chunk.len() == chunk.capacity() {
                    chunk.reserve_exact(GROW_BY);
                }
                chunk.insert(at, (id, c));
                self.len += 1;
                None
            }
        }
    }

    /// Removes the record of `id` (and its chunk, once empty).
    pub fn remove(&mut self, id: &AllocId) -> Option<Compacted> {
        let key = chunk_of(*id);
        let at = self.chunks.get(&key)?.binary_search_by_key(id, |(k, _)| *k).ok()?;
        let chunk = Arc::make_mut(self.chunks.get_mut(&key).expect("found"));
        let (_, old) = chunk.remove(at);
        if chunk.is_empty() {
            self.chunks.remove(&key);
        }
        self.len -= 1;
        Some(old)
    }

    /// Every record, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&AllocId, &Compacted)> {
        self.chunks.values().flat_map(|c| c.iter().map(|(id, c)| (id, c)))
    }

    /// The records whose ids are in `first..=last`, in order.
    pub fn range(&self, first: AllocId, last: AllocId) -> impl Iterator<Item = (&AllocId, &Compacted)> {
        let chunks = if first <= last { Some(self.chunks.range(chunk_of(first)..=chunk_of(last))) } else { None };
        chunks
            .into_iter()
            .flatten()
            .flat_map(|(_, c)| c.iter().map(|(id, c)| (id, c)))
            .filter(move |(id, _)| (first..=last).contains(*id))
    }
}

impl Serialize for CompactMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.len))?;
        for (id, c) in self.iter() {
            map.serialize_entry(id, c)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for CompactMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CompactMap, D::Error> {
        let flat = BTreeMap::<AllocId, Compacted>::deserialize(d)?;
        let mut m = CompactMap::default();
        for (id, c) in flat {
            // In id order: each lands at its chunk's end.
            Arc::make_mut(m.chunks.entry(chunk_of(id)).or_default()).push((id, c));
            m.len += 1;
        }
        for chunk in m.chunks.values_mut() {
            Arc::make_mut(chunk).shrink_to_fit();
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::AllocStatus;

    fn record(end_ms: u64) -> Compacted {
        Compacted { status: AllocStatus::Done, started: true, end_ms, key: None }
    }

    /// Every operation, across chunk boundaries and in any insert order,
    /// agrees with a `BTreeMap`; a clone shares every chunk until a change;
    /// it encodes as the `BTreeMap` does.
    #[test]
    fn it_behaves_as_an_ordered_map_and_encodes_as_one() {
        let ids = [5000u64, 2, 1024, 1, 2047, 1023, 2048, 1025, 1 << 40];
        let mut m = CompactMap::default();
        let mut b = BTreeMap::new();
        for id in ids {
            assert!(m.insert(id, record(id)).is_none());
            b.insert(id, record(id));
        }
        assert_eq!(m.insert(1024, record(7)), Some(record(1024)), "a replaced entry is returned");
        b.insert(1024, record(7));
        assert_eq!(m.len(), ids.len());
        assert!(m.iter().map(|(k, v)| (*k, v.clone())).eq(b.iter().map(|(k, v)| (*k, v.clone()))));
        for (lo, hi) in [(0, 3000), (1023, 1024), (1024, 1024), (1025, 2048), (2049, 4999), (6000, u64::MAX)] {
            let ours: Vec<u64> = m.range(lo, hi).map(|(k, _)| *k).collect();
            let theirs: Vec<u64> = b.range(lo..=hi).map(|(k, _)| *k).collect();
            assert_eq!(ours, theirs, "{lo}..={hi}");
        }
        assert_eq!(m.range(3000, 2000).count(), 0, "an inverted range holds nothing");
        let bytes = postcard::to_allocvec(&m).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&b).unwrap());
        assert_eq!(postcard::from_bytes::<CompactMap>(&bytes).unwrap(), m);
        let copy = m.clone();
        assert!(m.chunks.iter().all(|(k, c)| Arc::ptr_eq(c, &copy.chunks[k])));
        assert!(m.remove(&1026).is_none() && m.get(&1026).is_none());
        assert_eq!(m.remove(&5000), Some(record(5000)));
        assert!(!m.chunks.contains_key(&chunk_of(5000)), "an emptied chunk stays");
        assert_eq!(m.len(), ids.len() - 1);
        assert!(copy.contains_key(&5000) && copy.len() == ids.len(), "the copy changed");
        let shared = m.chunks.iter().filter(|(k, c)| Arc::ptr_eq(c, &copy.chunks[*k])).count();
        assert_eq!(shared, m.chunks.len(), "a removal copied a chunk it did not touch");
    }
}
