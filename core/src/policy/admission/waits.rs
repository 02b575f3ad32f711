//! Why gangs wait, as an admission pass finds it: the notes a pass makes
//! for the gangs it looks at and cannot place (`Command::NoteWaits`), only
//! where a gang's reason changed (`sm/types/wait.rs`).

use super::Pass;
use crate::policy::capacity::Overlay;
use crate::sm::{
    AllocId, Allocation, MAX_WAIT_HOLDERS, MAX_WAIT_NOTES, MIN_WAIT_NOTE_GAP_MS, NodeSlot, NodeStatus, Shape, Usage,
    Wait, WaitHolder, WaitNote,
};

/// Most gangs behind one that found no room whose reason a pass notes (the
/// same as that gang's: its stream is not walked further).
pub const MAX_FOLLOWER_NOTES: usize = 16;

impl Pass<'_> {
    /// Notes that `a` waits for `wait` (holders from `holders`), if the
    /// pass notes waits, `a`'s recorded reason differs, and its last reason
    /// is at least `MIN_WAIT_NOTE_GAP_MS` old.
    pub(super) fn note(&mut self, a: &Allocation, wait: Wait, holders: impl FnOnce(&mut Self) -> Vec<WaitHolder>) {
        if !self.may_note(a) || a.waits.current() == wait {
            return;
        }
        let mut holders = holders(self);
        holders.truncate(MAX_WAIT_HOLDERS);
        self.notes.push(WaitNote { alloc: a.id, epoch: a.reservation_epoch, wait, holders });
    }

    /// Whether a note about `a` would be made now: the pass notes waits
    /// and has room for one more, `a` is not a preemptor, and its last
    /// reason from admission is at least `MIN_WAIT_NOTE_GAP_MS` old.
    pub(super) fn may_note(&self, a: &Allocation) -> bool {
        self.note_waits
            && self.notes.len() < MAX_WAIT_NOTES
            && a.nomination.is_none()
            && a.waits.last().is_none_or(|last| {
                !last.wait.is_admission_reason() || self.now_ms >= last.since_ms.saturating_add(MIN_WAIT_NOTE_GAP_MS)
            })
    }

    /// Notes the gangs behind `head` in its stream (which found no room)
    /// with its reason.
    pub(super) fn note_followers(&mut self, head: &Allocation, rest: impl Iterator<Item = AllocId>) {
        if !self.note_waits {
            return;
        }
        let shape = (self.state.home_key(&head.spec.vcluster), Shape::of(head));
        let Some((wait, holders)) = self.shape_wait.get(&shape).cloned() else { return };
        for id in rest {
            let a = self.state.alloc(id).expect("queue names a known allocation");
            let holders = holders.clone();
            self.note(a, wait, |_| holders);
        }
    }

    /// The largest holders of `a`'s vCluster's quota (its allocations
    /// holding the most GPUs), looked up once per pass.
    pub(super) fn quota_holders(&mut self, a: &Allocation) -> Vec<WaitHolder> {
        let state = self.state;
        self.quota_holders
            .entry(a.spec.vcluster.clone())
            .or_insert_with(|| {
                let Some(load) = state.vcluster_load(&a.spec.vcluster) else { return Vec::new() };
                let mut by_gpus: Vec<(u64, AllocId)> = load
                    .allocs
                    .iter()
                    .map(|(&id, &tasks)| {
                        let gpus = state.alloc(id).map_or(0, |h| u64::from(h.spec.resources.gpus));
                        (gpus * u64::from(tasks), id)
                    })
                    .collect();
                by_gpus.sort_by_key(|&(gpus, id)| (std::cmp::Reverse(gpus), id));
                by_gpus.into_iter().take(MAX_WAIT_HOLDERS).map(|(_, id)| state.wait_holder(id)).collect()
            })
            .clone()
    }

    /// Why `a`, of `shape`, found no room: its nodes are busy (capacity),
    /// too few match it (constraint) or some are out of service (drain), or no
    /// single rack has room for it (packing); with what holds the capacity.
    pub(super) fn why_no_room(
        &self,
        a: &Allocation,
        shape: (u32, Shape),
        capacity: &Overlay,
    ) -> (Wait, Vec<WaitHolder>) {
        let state = self.state;
        let need = a.spec.resources;
        let n = a.spec.gang_size as usize;
        if self.unplannable.contains(&shape) {
            // Could enough nodes ever take it? Those that could, by status.
            let placement = &a.spec.placement;
            let (mut ready, mut draining) = (0usize, 0usize);
            for node in state.nodes() {
                let home = state.node_home(node.slot);
                if (home != shape.0 && home != 0)
                    || !crate::sm::fits(&need, &node.resources, &Usage::of(&node.resources))
                    || !(placement.is_any() || placement.admits(&node.labels))
                {
                    continue;
                }
                match node.status {
                    NodeStatus::Ready => ready += 1,
                    NodeStatus::Terminated => {}
                    _ => draining += 1,
                }
            }
            if ready < n {
                return (if ready + draining >= n { Wait::Drain } else { Wait::Constraint }, Vec::new());
            }
        }
        if placement_packed(a) {
            let mut nodes = Vec::new();
            let admits = |s: NodeSlot| a.spec.placement.admits(&state.node(s).labels);
            if capacity.find_where(&need, n, &[shape.0, 0], &mut nodes, admits) {
                return (Wait::Packing, Vec::new());
            }
        }
        // Its own planned start: what runs on those nodes holds it.
        if let Some(p) = self.planned.last().filter(|p| p.alloc == a.id) {
            let mut held: Vec<(u64, AllocId)> =
                p.nodes.iter().flat_map(|&s| state.holders(s)).map(|h| (h.walltime_ends_ms, h.alloc)).collect();
            for s in &p.nodes {
                for &id in self.placed_on.get(s).into_iter().flatten() {
                    let ends = state.alloc(id).map_or(0, |o| self.end_of(o));
                    held.push((ends, id));
                }
            }
            held.sort_by_key(|&(end, id)| (std::cmp::Reverse(end), id));
            let mut ids: Vec<AllocId> = Vec::new();
            for (_, id) in held {
                if !ids.contains(&id) && ids.len() < MAX_WAIT_HOLDERS {
                    ids.push(id);
                }
            }
            return (Wait::Capacity, ids.into_iter().map(|id| state.wait_holder(id)).collect());
        }
        // Behind another gang's planned start at its home.
        let ahead = self.planned.iter().find(|p| {
            state.alloc(p.alloc).is_some_and(|o| state.home_key(&o.spec.vcluster) == shape.0) && p.alloc != a.id
        });
        (Wait::Capacity, ahead.map(|p| vec![state.wait_holder(p.alloc)]).unwrap_or_default())
    }
}

/// Whether `a` must run under one value of a packing label.
pub(super) fn placement_packed(a: &Allocation) -> bool {
    a.spec.placement.pack_by.as_ref().is_some_and(|p| p.required)
}
