//! Dependencies: an allocation submitted with `after` is `waiting` until
//! they stand. Every applied command then settles the waiting dependents of
//! the allocations its events name, in a cascade (a dependent that fails
//! settles its own dependents in the same command).
//!
//! ```text
//!   Submit{after} ──▶ waiting ──(met: all, or the first with any_of)──▶ queued (DependenciesMet)
//!                        │
//!                        └──(can never be met)──▶ failed, "dependency 12 failed"
//!                              (keep_if_unsatisfiable: stays waiting until cancelled)
//! ```
//!
//! A forgotten allocation's outcome stays in a tombstone (the newest
//! [`MAX_TOMBSTONES`]), so a dependency named on it later still counts.

use super::*;
use crate::sm::types::{After, Dependency, Standing, combined_standing};

/// How many forgotten allocations' outcomes are kept (the newest; about 10
/// bytes each in a snapshot).
pub const MAX_TOMBSTONES: usize = 100_000;

/// How a forgotten allocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Its final status.
    pub status: AllocStatus,
    /// Whether a task of it ever started.
    pub started: bool,
}

fn invalid_after(reason: String) -> Rejection {
    Rejection::InvalidSpec { field: "after".to_string(), reason }
}

impl State {
    /// Where dependency `d` stands now.
    pub fn dependency_standing(&self, d: &Dependency) -> Standing {
        if let Some(a) = self.allocs.get(&d.on) {
            return d.standing(a.status, a.ever_started());
        }
        if let Some(array) = self.arrays.get(&d.on) {
            return self.array_standing(d, array);
        }
        if let Some(c) = self.compacted.get(&d.on) {
            return d.standing(c.status, c.started);
        }
        if let Some(t) = self.tombstones.get(&d.on) {
            return d.standing(t.status, t.started);
        }
        self.unmaterialised_standing(d).unwrap_or_else(|| {
            Standing::Never(format!("dependency {} ended too long ago for its outcome to be known", d.on))
        })
    }

    /// Where `after` stands now, as a whole.
    pub fn after_standing(&self, after: &After) -> Standing {
        combined_standing(after.deps.iter().map(|d| self.dependency_standing(d)), after.any_of)
    }

    /// A submit's dependencies name existing, older allocations (a
    /// forgotten one only while its tombstone is kept).
    pub fn check_dependencies(&self, after: &After) -> Result<(), Rejection> {
        for d in &after.deps {
            if d.on >= self.next_alloc_id {
                return Err(invalid_after(format!(
                    "allocation {} does not exist (a dependency names an existing, older allocation)",
                    d.on
                )));
            }
            let held = self.holds(d.on) || self.arrays.contains_key(&d.on);
            if !held && !self.tombstones.contains_key(&d.on) && self.unmaterialised_standing(d).is_none() {
                return Err(invalid_after(format!(
                    "allocation {} was forgotten too long ago for its outcome to be known",
                    d.on
                )));
            }
        }
        Ok(())
    }

    /// Settles the waiting dependents of every allocation `events` name,
    /// and of every dependent that fails on the way; returns their events.
    pub(super) fn settle_dependents(&mut self, events: &[Event]) -> Vec<Event> {
        // Every command passes here: with nothing waiting, nothing to do.
        if self.index.dependents.is_empty() {
            return Vec::new();
        }
        let mut work: Vec<AllocId> = events.iter().filter_map(Event::alloc).collect();
        for e in events {
            // Elements cancelled before they were materialised have no
            // events of their own: their dependents settle here.
            if let Event::ArrayCancelled { array, .. } = e
                && let Some(a) = self.arrays.get(array)
            {
                work.extend(self.index.dependents.range(a.id + 1..=a.id + a.count()).map(|(&on, _)| on));
            }
        }
        // An element's end may settle what waits for its whole array.
        if !self.arrays.is_empty() {
            let arrays: Vec<AllocId> = work.iter().filter_map(|&id| Some(self.array_of(id)?.0.id)).collect();
            work.extend(arrays);
        }
        work.sort_unstable_by(|a, b| b.cmp(a));
        work.dedup();
        let mut out = Vec::new();
        while let Some(on) = work.pop() {
            let waiting: Vec<AllocId> =
                self.index.dependents.get(&on).map(|s| s.iter().copied().collect()).unwrap_or_default();
            for id in waiting {
                if let Some(e) = self.settle_waiting(id) {
                    if matches!(e, Event::AllocationFailed { .. }) {
                        work.push(id);
                        if let Some((array, _)) = self.array_of(id) {
                            work.push(array.id);
                        }
                    }
                    out.push(e);
                }
            }
        }
        out
    }

    /// Queues waiting allocation `id` when its dependencies are met, or
    /// fails it when they never can be; `None` while they are pending (or
    /// it keeps waiting).
    pub(super) fn settle_waiting(&mut self, id: AllocId) -> Option<Event> {
        let a = self.allocs.get(&id)?;
        if a.status != AllocStatus::Waiting {
            return None;
        }
        let standing = self.after_standing(&a.spec.after);
        let keep = a.spec.after.keep_if_unsatisfiable;
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("held");
        let event = match standing {
            Standing::Pending => return None,
            Standing::Never(_) if keep => return None,
            Standing::Met => {
                a.status = AllocStatus::Queued;
                a.queued_since_ms = now;
                Event::DependenciesMet { alloc: id }
            }
            Standing::Never(reason) => {
                for t in &mut a.tasks {
                    t.status = TaskStatus::Failed;
                }
                a.status = AllocStatus::Failed;
                a.finished_at_ms = Some(now);
                Event::AllocationFailed { alloc: id, reason }
            }
        };
        self.reindex_alloc(id);
        Some(event)
    }

    /// Keeps the dependents index in step with allocation `id`: listed
    /// under each allocation it waits for while it is waiting, nowhere
    /// otherwise.
    pub(super) fn index_dependencies(&mut self, id: AllocId) {
        let a = &self.allocs[&id];
        // Every reindex passes here; one without dependencies never waits.
        if a.spec.after.is_empty() {
            return;
        }
        let waiting = a.status == AllocStatus::Waiting;
        if waiting {
            self.index.waiting.insert(id);
        } else {
            self.index.waiting.remove(&id);
        }
        for d in &a.spec.after.deps {
            if waiting {
                self.index.dependents.entry(d.on).or_default().insert(id);
            } else if let Some(set) = self.index.dependents.get_mut(&d.on) {
                set.remove(&id);
                if set.is_empty() {
                    self.index.dependents.remove(&d.on);
                }
            }
        }
    }

    /// Keeps how forgotten allocation `a` ended (the newest
    /// [`MAX_TOMBSTONES`] only).
    pub(super) fn bury(&mut self, a: &Allocation) {
        self.entomb(a.id, Tombstone { status: a.status, started: a.ever_started() });
    }

    /// Keeps how forgotten allocation or array `id` ended (the newest
    /// [`MAX_TOMBSTONES`] only).
    pub(super) fn entomb(&mut self, id: AllocId, t: Tombstone) {
        self.tombstones.insert(id, t);
        while self.tombstones.len() > MAX_TOMBSTONES {
            self.tombstones.pop_first();
        }
    }

    /// Every waiting allocation, in id order.
    pub fn waiting(&self) -> impl Iterator<Item = AllocId> + '_ {
        self.index.waiting.iter().copied()
    }

    /// How many allocations are waiting.
    pub fn waiting_len(&self) -> usize {
        self.index.waiting.len()
    }

    /// Allocations waiting on `on`, in id order.
    pub fn dependents_of(&self, on: AllocId) -> impl Iterator<Item = AllocId> + '_ {
        self.index.dependents.get(&on).into_iter().flatten().copied()
    }
}
