//! The admission pass's view of free capacity: the state's free-GPU index
//! copied once per pass and kept in step as the pass takes and gives
//! capacity, the rendezvous ports it takes, and, for gangs with a
//! placement, an index of each label they pack by or name values of.
//!
//! ```text
//!   Overlay ── find_where: best fit over (home, free GPUs, slot)
//!           ── place: constraints (find_constrained over a label's values)
//!                     and packing (find_packed: tightest value with room)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::admission::PackChoice;
use crate::sm::{Allocation, LabelOp, NodeSlot, NodeStatus, Placement, Resources, State, Usage, fits};

/// Free capacity as this pass sees it: a copy of the state's free-GPU index
/// (one O(nodes) copy per pass, never per gang), kept in step as the pass
/// takes and gives capacity, and the free consumables of the nodes changed.
pub(super) struct Overlay<'a> {
    state: &'a State,
    /// Ready nodes by (home key, free GPUs, slot), as of this point of the
    /// pass.
    index: BTreeSet<(u32, u32, NodeSlot)>,
    /// Free consumables of the nodes this pass changed.
    touched: BTreeMap<NodeSlot, Usage>,
    /// Rendezvous ports this pass took (+) or gave back (−), per node.
    ports: BTreeMap<NodeSlot, i64>,
    /// Which rack a packed gang takes.
    pack_choice: PackChoice,
    /// Per packing label used in this pass, its values' nodes (built at the
    /// first packed gang, kept in step after).
    racks: BTreeMap<String, Racks>,
    /// Per image digest, the nodes holding it (built at the first gang with
    /// a pinned image).
    holders: Option<BTreeMap<String, Vec<NodeSlot>>>,
}

/// One packing label's values as a pass sees them.
struct Racks {
    /// Each node's value (by slot), as an index into `nodes`.
    value_of: Vec<Option<u32>>,
    /// Per value (in label order), its ready nodes not held for a
    /// preemptor, by (home key, free GPUs, slot)…
    nodes: Vec<BTreeSet<(u32, u32, NodeSlot)>>,
    /// …and how many of them have each number of free GPUs, per home key.
    counts: Vec<BTreeMap<u32, Vec<u32>>>,
    /// Each value's index.
    ids: BTreeMap<String, u32>,
}

impl Racks {
    fn build(state: &State, key: &str, index: &BTreeSet<(u32, u32, NodeSlot)>) -> Racks {
        let labelled: Vec<Option<&str>> = state.nodes().iter().map(|n| n.labels.get(key).map(String::as_str)).collect();
        let values: BTreeSet<&str> = labelled.iter().flatten().copied().collect();
        let ids: BTreeMap<&str, u32> = values.iter().enumerate().map(|(i, v)| (*v, i as u32)).collect();
        let value_of: Vec<Option<u32>> = labelled.iter().map(|v| v.map(|v| ids[v])).collect();
        // The index is sorted, so each value's nodes arrive sorted: build
        // the sets in bulk.
        let mut sorted: Vec<Vec<(u32, u32, NodeSlot)>> = vec![Vec::new(); values.len()];
        let mut counts: Vec<BTreeMap<u32, Vec<u32>>> = vec![BTreeMap::new(); values.len()];
        for &(home, free, slot) in index {
            if let Some(v) = value_of[slot.0 as usize] {
                sorted[v as usize].push((home, free, slot));
                let by_free = counts[v as usize].entry(home).or_default();
                if by_free.len() <= free as usize {
                    by_free.resize(free as usize + 1, 0);
                }
                by_free[free as usize] += 1;
            }
        }
        Racks {
            value_of,
            nodes: sorted.into_iter().map(BTreeSet::from_iter).collect(),
            counts,
            ids: ids.iter().map(|(v, &i)| (v.to_string(), i)).collect(),
        }
    }

    fn insert(&mut self, (home, free, slot): (u32, u32, NodeSlot)) {
        if let Some(v) = self.value_of[slot.0 as usize] {
            self.nodes[v as usize].insert((home, free, slot));
            let by_free = self.counts[v as usize].entry(home).or_default();
            if by_free.len() <= free as usize {
                by_free.resize(free as usize + 1, 0);
            }
            by_free[free as usize] += 1;
        }
    }

    fn remove(&mut self, (home, free, slot): (u32, u32, NodeSlot)) {
        if let Some(v) = self.value_of[slot.0 as usize]
            && self.nodes[v as usize].remove(&(home, free, slot))
        {
            self.counts[v as usize].get_mut(&home).expect("counted")[free as usize] -= 1;
        }
    }

    /// Nodes of value `v` in these homes with at least `gpus` free.
    fn room(&self, v: usize, homes: &[u32], gpus: u32) -> usize {
        homes
            .iter()
            .filter_map(|h| self.counts[v].get(h))
            .map(|by_free| by_free.iter().skip(gpus as usize).map(|&k| k as usize).sum::<usize>())
            .sum()
    }
}

impl<'a> Overlay<'a> {
    pub(super) fn new(state: &'a State, pack_choice: PackChoice) -> Self {
        Overlay {
            state,
            index: state.free_gpu_index().clone(),
            touched: BTreeMap::new(),
            ports: BTreeMap::new(),
            pack_choice,
            racks: BTreeMap::new(),
            holders: None,
        }
    }

    pub(super) fn free(&self, slot: NodeSlot) -> Usage {
        self.touched.get(&slot).copied().unwrap_or_else(|| self.state.node(slot).free())
    }

    fn set_free(&mut self, slot: NodeSlot, free: Usage) {
        let before = self.free(slot);
        let home = self.state.node_home(slot);
        let was = self.index.remove(&(home, before.gpus, slot));
        self.touched.insert(slot, free);
        let is = self.state.node(slot).status == NodeStatus::Ready && self.state.held_for(slot).is_none();
        if is {
            self.index.insert((home, free.gpus, slot));
        }
        for racks in self.racks.values_mut() {
            if was {
                racks.remove((home, before.gpus, slot));
            }
            if is {
                racks.insert((home, free.gpus, slot));
            }
        }
    }

    pub(super) fn take(&mut self, slot: NodeSlot, usage: &Usage) {
        let free = self.free(slot);
        debug_assert!(free.covers(usage), "admission took more than a node had free");
        self.set_free(slot, free.minus(usage));
    }

    pub(super) fn give(&mut self, slot: NodeSlot, usage: &Usage) {
        let free = self.free(slot);
        self.set_free(slot, free.plus(usage));
    }

    /// Rendezvous ports free on `slot` as of this point of the pass.
    pub(super) fn free_ports(&self, slot: NodeSlot) -> u32 {
        let delta = self.ports.get(&slot).copied().unwrap_or(0);
        (i64::from(self.state.free_port_count(slot)) - delta).max(0) as u32
    }

    pub(super) fn take_ports(&mut self, slot: NodeSlot, n: u32) {
        if n > 0 {
            *self.ports.entry(slot).or_default() += i64::from(n);
        }
    }

    pub(super) fn give_ports(&mut self, slot: NodeSlot, n: u32) {
        if n > 0 {
            *self.ports.entry(slot).or_default() -= i64::from(n);
        }
    }

    /// The most free GPUs on any ready node of these homes.
    pub(super) fn max_free_gpus(&self, homes: &[u32]) -> u32 {
        homes
            .iter()
            .filter_map(|&h| self.index.range((h, 0, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX))).next_back())
            .map(|&(_, g, _)| g)
            .max()
            .unwrap_or(0)
    }

    /// The ready nodes of these homes with at least `gpus` free, by (free
    /// GPUs, slot) across all of them.
    pub(super) fn nodes_of(&self, homes: &[u32], gpus: u32) -> impl Iterator<Item = NodeSlot> + '_ {
        let mut ranges: Vec<_> = homes
            .iter()
            .map(|&h| self.index.range((h, gpus, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX))).peekable())
            .collect();
        std::iter::from_fn(move || {
            let best =
                ranges.iter_mut().enumerate().filter_map(|(i, r)| r.peek().map(|&&(_, g, s)| ((g, s), i))).min()?.1;
            ranges[best].next().map(|&(_, _, s)| s)
        })
    }

    /// Collects the nodes of these homes gang `a` may take, each passing
    /// `ok`, by its placement: best fit among the nodes meeting its
    /// constraints, all under one value of its packing label when it packs
    /// (preferred packing falls back to spreading). False if it falls short.
    pub(super) fn place(
        &mut self,
        a: &Allocation,
        homes: &[u32],
        out: &mut Vec<NodeSlot>,
        ok: impl Fn(NodeSlot) -> bool,
    ) -> bool {
        let (need, n, p) = (&a.spec.resources, a.spec.gang_size as usize, &a.spec.placement);
        if p.is_any() {
            let given = out.len();
            let placed = self.find_where(need, n, homes, out, &ok);
            if placed {
                self.prefer_holders(a, homes, &mut out[given..], &ok);
            }
            return placed;
        }
        let state = self.state;
        let admits = |slot: NodeSlot| ok(slot) && p.admits(&state.node(slot).labels);
        match &p.pack_by {
            Some(pack) if self.find_packed(need, n, homes, &pack.key, out, &admits) => true,
            Some(pack) if pack.required => false,
            _ => {
                out.clear();
                let placed = self.find_constrained(need, n, homes, p, out, &admits);
                if placed {
                    self.prefer_holders(a, homes, out, &admits);
                }
                placed
            }
        }
    }

    /// Among equally good fits, nodes that hold the gang's image (the
    /// digest its tag was pinned to; [`crate::sm::Node::images`]): best fit
    /// takes every fitting node of each free-GPU count before the next, so
    /// only the last count's nodes in `out` were a choice among equals, and
    /// there a node holding the image takes the place of one that does not.
    /// A gang without a pinned image, or one packed by a label, is left as
    /// placed.
    fn prefer_holders(&mut self, a: &Allocation, homes: &[u32], out: &mut [NodeSlot], ok: &impl Fn(NodeSlot) -> bool) {
        let Some(digest) = a.spec.container.as_ref().and_then(|c| c.image.digest.as_deref()) else { return };
        let Some(&last) = out.last() else { return };
        let group = self.free(last).gpus;
        let state = self.state;
        if self.holders.is_none() {
            let mut by_digest: BTreeMap<String, Vec<NodeSlot>> = BTreeMap::new();
            for node in state.nodes() {
                for d in &node.images {
                    by_digest.entry(d.clone()).or_default().push(node.slot);
                }
            }
            self.holders = Some(by_digest);
        }
        let Some(holding) = self.holders.as_ref().and_then(|h| h.get(digest)) else { return };
        let holds = |slot: NodeSlot| state.node(slot).images.binary_search_by(|d| d.as_str().cmp(digest)).is_ok();
        let in_group = |slot: NodeSlot| homes.iter().any(|&h| self.index.contains(&(h, group, slot)));
        let need = &a.spec.resources;
        let swappable: Vec<usize> = (0..out.len()).filter(|&i| in_group(out[i]) && !holds(out[i])).collect();
        let mut swappable = swappable.into_iter();
        for &slot in holding {
            if out.contains(&slot)
                || !in_group(slot)
                || !ok(slot)
                || !fits(need, &state.node(slot).resources, &self.free(slot))
            {
                continue;
            }
            let Some(i) = swappable.next() else { return };
            out[i] = slot;
        }
    }

    /// Builds the index of label `key`'s values, once per pass.
    fn index_label(&mut self, key: &str) {
        if !self.racks.contains_key(key) {
            let racks = Racks::build(self.state, key, &self.index);
            self.racks.insert(key.to_string(), racks);
        }
    }

    /// Best fit over the nodes meeting `p`'s constraints. A constraint that
    /// names values of a label (`=`, `in`) walks only those values' nodes,
    /// merged in best-fit order, so a gang asking for a rare GPU model does
    /// not wade through every other model's nodes.
    fn find_constrained(
        &mut self,
        need: &Resources,
        n: usize,
        homes: &[u32],
        p: &Placement,
        out: &mut Vec<NodeSlot>,
        admits: &impl Fn(NodeSlot) -> bool,
    ) -> bool {
        let named = p.constraints.iter().find_map(|c| match &c.op {
            LabelOp::Eq(v) => Some((c.key.as_str(), std::slice::from_ref(v))),
            LabelOp::In(vs) => Some((c.key.as_str(), vs.as_slice())),
            _ => None,
        });
        let Some((key, values)) = named else {
            return self.find_where(need, n, homes, out, admits);
        };
        self.index_label(key);
        let racks = &self.racks[key];
        let mut ranges: Vec<_> = values
            .iter()
            .filter_map(|v| racks.ids.get(v))
            .flat_map(|&v| {
                homes.iter().map(move |&h| {
                    racks.nodes[v as usize].range((h, need.gpus, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX)))
                })
            })
            .map(Iterator::peekable)
            .collect();
        while out.len() < n {
            let Some(best) =
                ranges.iter_mut().enumerate().filter_map(|(i, r)| r.peek().map(|&&(_, g, s)| ((g, s), i))).min()
            else {
                return false;
            };
            let &(_, _, slot) = ranges[best.1].next().expect("peeked");
            if admits(slot) && fits(need, &self.state.node(slot).resources, &self.free(slot)) {
                out.push(slot);
            }
        }
        true
    }

    /// Puts into `out` `n` nodes passing `ok` that share one value of label
    /// `key`. Tightest: of the values with room for the gang, the one with
    /// the fewest nodes with enough free GPUs (so the values with the most
    /// room stay whole for larger gangs), then the least value; first fit:
    /// the least value with room. Best fit within it. The label's values
    /// are indexed once per pass, so a packed gang costs O(values + the
    /// chosen value's nodes), not a scan of every node.
    fn find_packed(
        &mut self,
        need: &Resources,
        n: usize,
        homes: &[u32],
        key: &str,
        out: &mut Vec<NodeSlot>,
        ok: &impl Fn(NodeSlot) -> bool,
    ) -> bool {
        self.index_label(key);
        let racks = &self.racks[key];
        let mut order: Vec<(usize, usize)> = (0..racks.nodes.len())
            .map(|v| (racks.room(v, homes, need.gpus), v))
            .filter(|&(room, _)| room >= n)
            .collect();
        if self.pack_choice == PackChoice::Tightest {
            order.sort_unstable();
        }
        let mut found: Vec<(u32, NodeSlot)> = Vec::new();
        for (_, v) in order {
            found.clear();
            for &h in homes {
                let range = racks.nodes[v].range((h, need.gpus, NodeSlot(0))..=(h, u32::MAX, NodeSlot(u32::MAX)));
                for &(_, free, slot) in range {
                    if ok(slot) && fits(need, &self.state.node(slot).resources, &self.free(slot)) {
                        found.push((free, slot));
                    }
                }
            }
            if found.len() >= n {
                found.sort_unstable();
                out.clear();
                out.extend(found[..n].iter().map(|&(_, s)| s));
                return true;
            }
        }
        false
    }

    /// Tops `out` up to `n` nodes of these homes that pass `ok` and can
    /// each take one task of `need` (best fit). False if it falls short.
    pub(super) fn find_where(
        &self,
        need: &Resources,
        n: usize,
        homes: &[u32],
        out: &mut Vec<NodeSlot>,
        ok: impl Fn(NodeSlot) -> bool,
    ) -> bool {
        if out.len() >= n {
            return true;
        }
        let given = out.len();
        for slot in self.nodes_of(homes, need.gpus) {
            if out[..given].contains(&slot) || !ok(slot) {
                continue;
            }
            let node = self.state.node(slot);
            if fits(need, &node.resources, &self.free(slot)) {
                out.push(slot);
                if out.len() == n {
                    return true;
                }
            }
        }
        false
    }
}
