//! Job arrays: one submit, many elements, materialised lazily.
//!
//! ```text
//!   SubmitArray{spec, 0-9999%64}   one entry: the array gets id A, its
//!                                  elements ids A+1 ..= A+10000
//!   materialise (in apply, after every command that touches the array):
//!     while  elements not yet ended  < throttle (%64; none: no limit)
//!       and  elements not yet placed < ARRAY_WINDOW
//!       and  positions remain        ──▶ element A+1+k, an ordinary allocation
//!   every element ended, none left  ──▶ ArrayFinished
//! ```
//!
//! A pending element is a position in the array's ranges until it is
//! materialised; cancelling it then only marks the position skipped. The
//! throttle and the window are enforced here, in apply, so every replica
//! materialises the same elements at the same entry.

use super::*;
use crate::sm::types::{
    ARRAY_WINDOW, AfterWhen, ArrayIndices, ArrayRange, Dependency, JobArray, MAX_DEPENDENCIES, Standing,
};

fn invalid(field: &str, reason: String) -> Rejection {
    Rejection::InvalidSpec { field: field.to_string(), reason }
}

/// The hash a forgotten array's idempotency key keeps: of its spec, indices
/// and `--after-corr` together.
pub fn array_sha256(spec: &AllocSpec, indices: &ArrayIndices, corr: Option<AllocId>) -> [u8; 32] {
    let bytes = postcard::to_stdvec(&(spec, indices, corr)).expect("encoding into memory cannot fail");
    sha2::Sha256::digest(&bytes).into()
}

/// An array's elements, counted by status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayCounts {
    /// Not materialised yet (and not cancelled).
    pub pending: u64,
    /// Materialised elements by status (the ended ones that retention has
    /// forgotten are in `done`, `failed` and `cancelled` only).
    pub by_status: BTreeMap<AllocStatus, u64>,
}

impl State {
    /// Array `id`, if it is one.
    pub fn array(&self, id: AllocId) -> Option<&JobArray> {
        self.arrays.get(&id)
    }

    /// Every array, in id order.
    pub fn arrays(&self) -> impl Iterator<Item = &JobArray> {
        self.arrays.values()
    }

    /// The array allocation `id` is an element of, and its position there.
    pub fn array_of(&self, id: AllocId) -> Option<(&JobArray, u64)> {
        let (_, array) = self.arrays.range(..id).next_back()?;
        Some((array, array.position_of_element(id)?))
    }

    /// Array `id`'s materialised elements that have not ended, in id order.
    pub fn array_live(&self, id: AllocId) -> impl Iterator<Item = AllocId> + '_ {
        self.index.array_live.get(&id).into_iter().flatten().copied()
    }

    /// Array `id`'s elements counted by status: those materialised and
    /// held, those ended (held or forgotten), and those still to come.
    pub fn array_counts(&self, array: &JobArray) -> ArrayCounts {
        let mut by_status: BTreeMap<AllocStatus, u64> = BTreeMap::new();
        for id in self.array_live(array.id) {
            *by_status.entry(self.allocs[&id].status).or_default() += 1;
        }
        for (status, n) in [
            (AllocStatus::Done, array.done),
            (AllocStatus::Failed, array.failed),
            (AllocStatus::Cancelled, array.cancelled),
        ] {
            if n > 0 {
                by_status.insert(status, n);
            }
        }
        ArrayCounts { pending: array.unmaterialised(), by_status }
    }

    /// What an earlier submit with the same owner and key made: the array
    /// when its spec, indices and `--after-corr` are the same, a conflict
    /// when they differ (or the key names a plain allocation).
    pub fn array_submitted_before(
        &self,
        spec: &AllocSpec,
        indices: &ArrayIndices,
        corr: Option<AllocId>,
    ) -> Option<Result<AllocId, Rejection>> {
        let key = spec.idempotency_key.as_ref()?;
        let name = (spec.owner.clone(), key.clone());
        let (existing, same) = match self.idempotency.get(&name) {
            Some(&id) => match self.arrays.get(&id) {
                Some(a) => (id, a.spec == *spec && a.indices == *indices && a.corr == corr),
                None => (id, false),
            },
            None => {
                let f = self.forgotten_keys.get(&name)?;
                (f.alloc, f.spec_sha256 == array_sha256(spec, indices, corr))
            }
        };
        Some(if same {
            Ok(existing)
        } else {
            Err(Rejection::IdempotencyConflict { key: key.clone(), alloc: existing })
        })
    }

    /// Checks `--after-corr`: an existing array holding every index of
    /// this one, and room for the dependency it adds to each element.
    pub fn check_corr(&self, spec: &AllocSpec, indices: &ArrayIndices, corr: AllocId) -> Result<(), Rejection> {
        let Some(other) = self.arrays.get(&corr) else {
            return Err(invalid(
                "after_corr",
                format!("allocation {corr} is not an array (--after-corr names an existing array)"),
            ));
        };
        if spec.after.any_of {
            return Err(invalid("after_corr", "--after-corr cannot be combined with --after-any-of".to_string()));
        }
        if spec.after.deps.len() >= MAX_DEPENDENCIES {
            return Err(invalid(
                "after_corr",
                format!("with --after-corr an element may name at most {} other dependencies", {
                    MAX_DEPENDENCIES - 1
                }),
            ));
        }
        if let Some(missing) = indices.iter().find(|&i| other.indices.position_of(i).is_none()) {
            return Err(invalid("after_corr", format!("array {corr} has no element with index {missing}")));
        }
        Ok(())
    }

    pub(super) fn submit_array(
        &mut self,
        spec: &AllocSpec,
        indices: &ArrayIndices,
        corr: Option<AllocId>,
        secrets: &Secrets,
    ) -> Applied {
        validate_spec(spec, &self.limits)?;
        validate_secrets(spec, secrets)?;
        indices.validate().map_err(|reason| invalid("array", reason))?;
        if let Some(earlier) = self.array_submitted_before(spec, indices, corr) {
            return earlier.map(|array| vec![Event::ArraySubmitted { array, count: indices.count(), duplicate: true }]);
        }
        if self.vcluster(&spec.vcluster).is_none() {
            return Err(Rejection::UnknownVCluster(spec.vcluster.clone()));
        }
        // In reject mode the array counts as many elements as its throttle
        // lets be live at once.
        let most_live = indices.most_live(indices.count());
        if let Some(reason) = self.submit_quota_excess_with(spec, most_live, 0, 0) {
            return Err(Rejection::OverQuota { vcluster: spec.vcluster.clone(), reason });
        }
        self.check_job_store(spec)?;
        self.check_dependencies(&spec.after)?;
        if let Some(corr) = corr {
            self.check_corr(spec, indices, corr)?;
        }
        let id = self.next_alloc_id;
        let count = indices.count();
        self.next_alloc_id += 1 + count;
        self.arrays.insert(
            id,
            JobArray {
                id,
                spec: spec.clone(),
                indices: indices.clone(),
                corr,
                submit_time_ms: self.now_ms,
                next: 0,
                skipped: Vec::new(),
                done: 0,
                failed: 0,
                cancelled: 0,
                started: false,
                finished_at_ms: None,
            },
        );
        if let Some(key) = &spec.idempotency_key {
            self.idempotency.insert((spec.owner.clone(), key.clone()), id);
        }
        if !secrets.is_empty() {
            self.secrets.insert(id, secrets.clone());
        }
        let mut events = vec![Event::ArraySubmitted { array: id, count, duplicate: false }];
        events.extend(self.fill_array(id));
        Ok(events)
    }

    /// Materialises array `id`'s next elements while its throttle and the
    /// window allow, and finishes it once every element has ended.
    pub(super) fn fill_array(&mut self, id: AllocId) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let Some(a) = self.arrays.get_mut(&id) else { return events };
            if a.finished_at_ms.is_some() {
                return events;
            }
            // Skip positions cancelled before they were materialised (the
            // ranges are merged, so one range holds them all).
            let at = a.skipped.partition_point(|&(_, to)| to <= a.next);
            if let Some(&(from, to)) = a.skipped.get(at)
                && from <= a.next
            {
                a.next = to;
            }
            let (next, count, throttle) = (a.next, a.count(), u64::from(a.indices.throttle));
            let live = self.index.array_live.get(&id).map_or(0, |s| s.len() as u64);
            if next >= count {
                if live == 0 {
                    events.push(self.finish_array(id));
                }
                return events;
            }
            let unplaced = self.index.array_unplaced.get(&id).map_or(0, |s| s.len() as u64);
            if (throttle > 0 && live >= throttle) || unplaced >= ARRAY_WINDOW {
                return events;
            }
            events.extend(self.materialise(id, next));
        }
    }

    /// Makes the element at `position` of array `id` an allocation.
    fn materialise(&mut self, id: AllocId, position: u64) -> Vec<Event> {
        let array = &self.arrays[&id];
        let mut spec = array.spec.clone();
        spec.idempotency_key = None;
        if let Some(corr) = array.corr {
            let index = array.indices.index_at(position).expect("a position within the array");
            // Its partner; were the other array forgotten (retention keeps
            // it while this one lives), its tombstone would answer.
            let on = match self.arrays.get(&corr) {
                Some(other) => other.element_id(other.indices.position_of(index).expect("checked at submit")),
                None => corr,
            };
            spec.after.deps.push(Dependency { on, when: AfterWhen::Ok });
        }
        let (submit_time_ms, element) = (array.submit_time_ms, array.element_id(position));
        self.arrays.get_mut(&id).expect("checked").next = position + 1;
        let secret_names = self.secrets.get(&id).map(Secrets::names).unwrap_or_default();
        self.insert_allocation(element, spec, submit_time_ms, secret_names);
        let mut events = vec![Event::Submitted { alloc: element, duplicate: false }];
        events.extend(self.settle_waiting(element));
        events
    }

    /// Every element of array `id` has ended.
    fn finish_array(&mut self, id: AllocId) -> Event {
        let now = self.now_ms;
        let a = self.arrays.get_mut(&id).expect("checked");
        a.finished_at_ms = Some(now);
        let event = Event::ArrayFinished { array: id, done: a.done, failed: a.failed, cancelled: a.cancelled };
        self.index.finished_arrays.insert((now, id));
        self.secrets.remove(&id);
        event
    }

    /// Keeps the array indexes in step with element `id` (called by every
    /// reindex), and counts the element's end once.
    pub(super) fn index_array_element(&mut self, id: AllocId, ended_now: bool) {
        let Some((array, _)) = self.array_of(id) else { return };
        let array = array.id;
        let a = &self.allocs[&id];
        let live = !a.status.is_terminal();
        let unplaced = live && (a.is_queued() || a.status == AllocStatus::Waiting);
        let (status, started) = (a.status, a.ever_started());
        for (set, member) in [(&mut self.index.array_live, live), (&mut self.index.array_unplaced, unplaced)] {
            if member {
                set.entry(array).or_default().insert(id);
            } else if let Some(s) = set.get_mut(&array) {
                s.remove(&id);
                if s.is_empty() {
                    set.remove(&array);
                }
            }
        }
        let record = self.arrays.get_mut(&array).expect("found");
        record.started |= started;
        if ended_now {
            match status {
                AllocStatus::Done => record.done += 1,
                AllocStatus::Failed => record.failed += 1,
                _ => record.cancelled += 1,
            }
        }
    }

    /// The arrays `events` touch (their own, or one of their elements'),
    /// not yet finished, in id order.
    pub(super) fn arrays_touched(&self, events: &[Event]) -> BTreeSet<AllocId> {
        if self.arrays.is_empty() {
            return BTreeSet::new();
        }
        events
            .iter()
            .filter_map(Event::alloc)
            .filter_map(|id| match self.arrays.get(&id) {
                Some(a) => Some(a),
                None => self.array_of(id).map(|(a, _)| a),
            })
            .filter(|a| a.finished_at_ms.is_none())
            .map(|a| a.id)
            .collect()
    }

    /// Where a dependency on array `array` stands: as one allocation that
    /// ends when its last element does (done only when every element was
    /// done). `ok` can never be met once one element failed or was
    /// cancelled; `started` is met once one element started.
    pub(super) fn array_standing(&self, d: &Dependency, array: &JobArray) -> Standing {
        if let Some(status) = array.final_status() {
            return d.standing(status, array.started);
        }
        match d.when {
            AfterWhen::Started if array.started => Standing::Met,
            AfterWhen::Ok if array.failed + array.cancelled > 0 => Standing::Never(format!(
                "dependency {} (an array) had an element {}",
                array.id,
                if array.failed > 0 { "fail" } else { "cancelled" }
            )),
            _ => Standing::Pending,
        }
    }

    /// Where a dependency on an element not held as an allocation stands:
    /// pending until it is materialised, never when it was cancelled
    /// first; `None` when `d.on` is no element of a held array, or one
    /// that was materialised and is forgotten.
    pub(super) fn unmaterialised_standing(&self, d: &Dependency) -> Option<Standing> {
        let (array, position) = self.array_of(d.on)?;
        if array.is_skipped(position) {
            return Some(d.standing(AllocStatus::Cancelled, false));
        }
        (position >= array.next).then_some(Standing::Pending)
    }

    /// Cancels array `id`'s elements at `indices` (all of them with
    /// `None`): materialised ones like any allocation, the rest by marking
    /// their positions skipped.
    pub(super) fn cancel_array(&mut self, id: AllocId, indices: Option<&ArrayIndices>) -> Applied {
        let array = self.arrays.get(&id).ok_or(Rejection::UnknownArray(id))?;
        if let Some(status) = array.final_status() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status });
        }
        // Positions to cancel, as sorted half-open ranges.
        let positions: Vec<(u64, u64)> = match indices {
            None => vec![(0, array.count())],
            Some(wanted) => {
                wanted.validate().map_err(|reason| invalid("indices", reason))?;
                if let Some(missing) = wanted.iter().find(|&i| array.indices.position_of(i).is_none()) {
                    return Err(invalid("indices", format!("array {id} has no element with index {missing}")));
                }
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                for p in wanted.iter().filter_map(|i| array.indices.position_of(i)) {
                    match ranges.last_mut() {
                        Some(last) if last.1 == p => last.1 = p + 1,
                        _ => ranges.push((p, p + 1)),
                    }
                }
                ranges
            }
        };
        let next = array.next;
        let live: Vec<AllocId> = positions
            .iter()
            .flat_map(|&(from, to)| {
                let (from, to) = (array.element_id(from), array.element_id(to.min(next)));
                self.index.array_live.get(&id).into_iter().flat_map(move |s| s.range(from..to.max(from)))
            })
            .copied()
            .filter(|e| self.check_cancel(*e).is_ok())
            .collect();
        let ahead: Vec<(u64, u64)> =
            positions.iter().map(|&(from, to)| (from.max(next), to)).filter(|&(f, t)| f < t).collect();
        let array = self.arrays.get_mut(&id).expect("checked");
        let skipped = array.skip(&ahead);
        array.cancelled += skipped;
        let mut events = Vec::new();
        if skipped > 0 || indices.is_none() {
            events.push(Event::ArrayCancelled { array: id, skipped });
        }
        for e in live {
            events.extend(self.cancel(e).expect("checked by check_cancel"));
        }
        if events.is_empty() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Cancelled });
        }
        Ok(events)
    }

    /// Whether cancelling `id` (an allocation, an array, or an element not
    /// yet materialised) would be accepted, judged before proposing.
    pub fn check_cancel_any(&self, id: AllocId) -> Result<(), Rejection> {
        if let Some(w) = self.workflows.get(&id) {
            return match self.workflow_finished(w) {
                true => Err(Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Done }),
                false => Ok(()),
            };
        }
        if let Some(array) = self.arrays.get(&id) {
            return match array.final_status() {
                Some(status) => Err(Rejection::AlreadyTerminal { alloc: id, status }),
                None => Ok(()),
            };
        }
        if !self.allocs.contains_key(&id)
            && let Some((array, position)) = self.array_of(id)
            && (position >= array.next || array.is_skipped(position))
        {
            if array.is_skipped(position) {
                return Err(Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Cancelled });
            }
            return Ok(());
        }
        self.check_cancel(id)
    }

    /// Who owns `id`: an allocation's owner, or its array's (for an array
    /// or an element not yet materialised).
    pub fn owner_of(&self, id: AllocId) -> Option<&str> {
        if let Some(a) = self.allocs.get(&id) {
            return Some(&a.spec.owner);
        }
        if let Some(w) = self.workflows.get(&id) {
            return Some(&w.owner);
        }
        let array = self.arrays.get(&id).or_else(|| self.array_of(id).map(|(a, _)| a))?;
        Some(&array.spec.owner)
    }

    /// Cancels element `id` of an array before it was materialised.
    pub(super) fn cancel_unmaterialised(&mut self, id: AllocId) -> Option<Applied> {
        let (array, position) = self.array_of(id)?;
        if position < array.next && !array.is_skipped(position) {
            return None;
        }
        let index = array.indices.index_at(position).expect("a position within the array");
        let one = ArrayRange { first: index, last: index, step: 1 };
        let indices = ArrayIndices { ranges: vec![one], throttle: 0 };
        let array = array.id;
        if self.arrays[&array].is_skipped(position) {
            return Some(Err(Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Cancelled }));
        }
        Some(self.cancel_array(array, Some(&indices)))
    }

    pub(super) fn set_array_throttle(&mut self, id: AllocId, throttle: u32, by: &str) -> Applied {
        let array = self.arrays.get(&id).ok_or(Rejection::UnknownArray(id))?;
        if let Some(status) = array.final_status() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status });
        }
        if u64::from(throttle) > array.count() {
            return Err(invalid(
                "throttle",
                format!("{throttle} is more than the array's {} elements (0: no limit)", array.count()),
            ));
        }
        check_name("by", by, &self.limits).map_err(|r| invalid("by", r))?;
        // A higher throttle lets more be live at once: in reject mode the
        // vCluster's quota must hold them as it would at submit.
        let remaining = array.count() - array.done - array.failed - array.cancelled;
        let live = self.index.array_live.get(&id).map_or(0, |l| l.len() as u64);
        let raised = ArrayIndices { ranges: Vec::new(), throttle }.most_live(remaining).saturating_sub(live);
        if raised > 0
            && let Some(reason) = self.submit_quota_excess_with(&array.spec, raised, 0, 0)
        {
            return Err(Rejection::OverQuota { vcluster: array.spec.vcluster.clone(), reason });
        }
        self.arrays.get_mut(&id).expect("checked").indices.throttle = throttle;
        Ok(vec![Event::ArrayThrottled { array: id, throttle, by: by.to_string() }])
    }
}
