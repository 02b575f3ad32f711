//! The allocations by id, in shared chunks: a snapshot's encoding copy,
//! taken under the state machine's lock, clones a map of one pointer per
//! 1,024 ids instead of one per allocation (which at half a million
//! allocations held the lock for 65 ms idle and 631 ms on a saturated
//! leader, long enough to cost it its leadership; docs/performance.md).
//! A change after a copy copies the one chunk it touches, once.
//!
//! It encodes as the `BTreeMap<AllocId, Arc<Allocation>>` it replaced (a
//! map, in id order), so the snapshot format and digests are unchanged.
//! (The compacted finished allocations, of which there may be a million,
//! are chunked the same way, in sorted vectors: `compactmap.rs`.)

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sm::{AllocId, Allocation};

/// Ids per chunk, as a power of two.
const CHUNK_BITS: u32 = 10;

type Chunk = BTreeMap<AllocId, Arc<Allocation>>;

/// Allocations by id (see the module's doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocMap {
    chunks: BTreeMap<u64, Arc<Chunk>>,
    len: usize,
}

/// The chunk holding `id` (compacted allocations are chunked the same way).
pub(super) fn chunk_of(id: AllocId) -> u64 {
    id >> CHUNK_BITS
}

impl AllocMap {
    /// An empty map.
    pub fn new() -> AllocMap {
        AllocMap::default()
    }

    /// How many allocations it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocation `id`.
    pub fn get(&self, id: &AllocId) -> Option<&Arc<Allocation>> {
        self.chunks.get(&chunk_of(*id))?.get(id)
    }

    /// Whether it holds allocation `id`.
    pub fn contains_key(&self, id: &AllocId) -> bool {
        self.get(id).is_some()
    }

    /// Allocation `id`, to change: its chunk is copied first if a copy of
    /// the map shares it.
    pub fn get_mut(&mut self, id: &AllocId) -> Option<&mut Arc<Allocation>> {
        let chunk = self.chunks.get_mut(&chunk_of(*id))?;
        if !chunk.contains_key(id) {
            return None;
        }
        Arc::make_mut(chunk).get_mut(id)
    }

    /// Inserts allocation `id`, returning the one it replaced.
    pub fn insert(&mut self, id: AllocId, a: Arc<Allocation>) -> Option<Arc<Allocation>> {
        let old = Arc::make_mut(self.chunks.entry(chunk_of(id)).or_default()).insert(id, a);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes allocation `id` (and its chunk, once empty).
    pub fn remove(&mut self, id: &AllocId) -> Option<Arc<Allocation>> {
        let key = chunk_of(*id);
        let chunk = self.chunks.get_mut(&key)?;
        if !chunk.contains_key(id) {
            return None;
        }
        let chunk = Arc::make_mut(chunk);
        let old = chunk.remove(id);
        if chunk.is_empty() {
            self.chunks.remove(&key);
        }
        self.len -= 1;
        old
    }

    /// Every allocation, in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&AllocId, &Arc<Allocation>)> {
        self.chunks.values().flat_map(|c| c.iter())
    }

    /// Every id, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &AllocId> {
        self.iter().map(|(id, _)| id)
    }

    /// Every allocation, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<Allocation>> {
        self.iter().map(|(_, a)| a)
    }

    /// The allocations whose ids are in `range`, in order.
    pub fn range<R: RangeBounds<AllocId> + Clone>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&AllocId, &Arc<Allocation>)> {
        let lo = match range.start_bound() {
            Bound::Included(id) | Bound::Excluded(id) => chunk_of(*id),
            Bound::Unbounded => 0,
        };
        let hi = match range.end_bound() {
            Bound::Included(id) | Bound::Excluded(id) => chunk_of(*id),
            Bound::Unbounded => u64::MAX,
        };
        // An inverted range names no chunk (and BTreeMap::range would panic).
        let chunks = if lo <= hi { Some(self.chunks.range(lo..=hi)) } else { None };
        chunks.into_iter().flatten().flat_map(move |(_, c)| c.range(range.clone()))
    }

    /// Whether `other` shares every chunk with this map (a copy nothing
    /// changed since).
    pub fn shares_all(&self, other: &AllocMap) -> bool {
        self.chunks.len() == other.chunks.len()
            && self.chunks.values().zip(other.chunks.values()).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl FromIterator<(AllocId, Arc<Allocation>)> for AllocMap {
    fn from_iter<I: IntoIterator<Item = (AllocId, Arc<Allocation>)>>(iter: I) -> AllocMap {
        let mut m = AllocMap::new();
        for (id, a) in iter {
            m.insert(id, a);
        }
        m
    }
}

impl Serialize for AllocMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.len))?;
        for (id, a) in self.iter() {
            map.serialize_entry(id, a)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for AllocMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AllocMap, D::Error> {
        let flat = BTreeMap::<AllocId, Arc<Allocation>>::deserialize(d)?;
        Ok(flat.into_iter().collect())
    }
}

impl std::ops::Index<&AllocId> for AllocMap {
    type Output = Arc<Allocation>;

    /// Allocation `id`; panics if it is not held, as `BTreeMap`'s does.
    fn index(&self, id: &AllocId) -> &Arc<Allocation> {
        self.get(id).expect("no allocation with this id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{Fixture, spec};

    fn alloc(id: AllocId) -> Arc<Allocation> {
        let mut f = Fixture::new(1);
        let first = f.submit(spec(1, 1));
        Arc::new(Allocation { id, ..f.s.alloc(first).unwrap().clone() })
    }

    /// Every operation, across chunk boundaries, agrees with a `BTreeMap`;
    /// a clone shares every chunk until a change, which copies one.
    #[test]
    fn it_behaves_as_an_ordered_map_and_a_change_copies_one_chunk() {
        let ids = [1u64, 2, 1023, 1024, 1025, 2047, 2048, 5000, 1 << 40];
        let mut m = AllocMap::new();
        let mut b = BTreeMap::new();
        for id in ids {
            assert!(m.insert(id, alloc(id)).is_none());
            b.insert(id, alloc(id));
        }
        assert!(m.insert(1024, alloc(1024)).is_some(), "a replaced entry is returned");
        assert_eq!(m.len(), ids.len());
        let flat = |it: &mut dyn Iterator<Item = (&AllocId, &Arc<Allocation>)>| it.map(|(k, _)| *k).collect::<Vec<_>>();
        assert_eq!(flat(&mut m.iter()), ids.to_vec());
        assert_eq!(m.keys().rev().copied().collect::<Vec<_>>(), ids.iter().rev().copied().collect::<Vec<_>>());
        for (lo, hi) in [(0, 3000), (1023, 1024), (1024, 1024), (1025, 2048), (2049, 4999), (6000, u64::MAX)] {
            assert_eq!(flat(&mut m.range(lo..=hi)), flat(&mut b.range(lo..=hi)), "{lo}..={hi}");
            assert_eq!(flat(&mut m.range(lo..)), flat(&mut b.range(lo..)), "{lo}..");
        }
        let inverted = (Bound::Included(3000), Bound::Included(2000));
        assert_eq!(m.range(inverted).count(), 0, "an inverted range holds nothing");
        let copy = m.clone();
        assert!(copy.shares_all(&m));
        m.get_mut(&1025).unwrap();
        let shared = m.chunks.iter().filter(|(k, c)| Arc::ptr_eq(c, &copy.chunks[*k])).count();
        assert_eq!(shared, copy.chunks.len() - 1, "a change copied more than its chunk");
        assert!(m.get_mut(&1026).is_none() && m.remove(&1026).is_none());
        assert!(m.remove(&5000).is_some());
        assert!(!m.chunks.contains_key(&chunk_of(5000)), "an emptied chunk stays");
        assert_eq!(m.len(), ids.len() - 1);
        assert!(copy.contains_key(&5000) && copy.len() == ids.len(), "the copy changed");
        assert_eq!(m[&2048].id, 2048);
    }
}
