//! Why allocations wait: the changes `apply` sees itself, and admission's
//! notes (`Command::NoteWaits`). See `types/wait.rs`.

use std::sync::Arc;

use super::{Applied, State};
use crate::sm::command::WaitNote;
use crate::sm::types::{AllocId, AllocStatus, Allocation, MAX_WAIT_HOLDERS, MAX_WAIT_NOTES, Wait, WaitHolder};
use crate::sm::{Event, Rejection};

/// The phase a wait is in: a change of phase is recorded by `apply`;
/// admission's reasons are all of the queued phase.
fn phase(w: Wait) -> u8 {
    match w {
        Wait::Dependency => 1,
        Wait::Preempting => 2,
        Wait::Placed => 3,
        Wait::Ended => 4,
        _ => 0,
    }
}

impl State {
    /// A holder naming allocation (or array) `id`, with its owner and class
    /// when the state still holds it.
    pub fn wait_holder(&self, id: AllocId) -> WaitHolder {
        match self.alloc(id) {
            Some(a) => WaitHolder::new(id, &a.spec.owner, a.spec.preemption_class),
            None => match self.array(id) {
                Some(array) => WaitHolder::new(id, &array.spec.owner, array.spec.preemption_class),
                None => WaitHolder::new(id, "", 0),
            },
        }
    }

    /// Where allocation `a`'s wait stands by its status alone, with what
    /// holds it.
    fn wait_by_status(&self, a: &Allocation) -> (Wait, Vec<WaitHolder>) {
        match a.status {
            AllocStatus::Waiting => (
                Wait::Dependency,
                a.spec.after.deps.iter().take(MAX_WAIT_HOLDERS).map(|d| self.wait_holder(d.on)).collect(),
            ),
            AllocStatus::Queued | AllocStatus::Suspended => match &a.nomination {
                Some(n) => (
                    Wait::Preempting,
                    n.waiting_for.iter().take(MAX_WAIT_HOLDERS).map(|&v| self.wait_holder(v)).collect(),
                ),
                None if a.retry_after_ms > self.now_ms => (Wait::Backoff, Vec::new()),
                None => (Wait::Queued, Vec::new()),
            },
            AllocStatus::Reserved | AllocStatus::Running | AllocStatus::TearingDown => (Wait::Placed, Vec::new()),
            AllocStatus::Done | AllocStatus::Failed | AllocStatus::Cancelled => (Wait::Ended, Vec::new()),
        }
    }

    /// After an event about allocation `id`: the change of its wait's phase
    /// to record, if its status moved it to another phase (a preemptor's
    /// victims also change while it stays preempting).
    pub(super) fn wait_phase_change(&self, id: AllocId) -> Option<(Wait, Vec<WaitHolder>)> {
        let a = self.allocs.get(&id)?;
        let (wait, holders) = self.wait_by_status(a);
        let last = a.waits.last();
        let same =
            last.is_some_and(|l| phase(l.wait) == phase(wait) && (wait != Wait::Preempting || l.holders == holders));
        (!same).then_some((wait, holders))
    }

    /// Applies admission's notes: each names a queued, unnominated gang at
    /// its current reservation epoch, or is skipped.
    pub(super) fn note_waits(&mut self, notes: &[WaitNote]) -> Applied {
        if notes.is_empty() || notes.len() > MAX_WAIT_NOTES {
            return Err(Rejection::InvalidWaitNotes(format!("{} notes, not within 1..={MAX_WAIT_NOTES}", notes.len())));
        }
        for n in notes {
            if !n.wait.is_admission_reason() {
                return Err(Rejection::InvalidWaitNotes(format!(
                    "allocation {}: {} is not a reason admission names",
                    n.alloc,
                    n.wait.as_str()
                )));
            }
            if n.holders.len() > MAX_WAIT_HOLDERS {
                return Err(Rejection::InvalidWaitNotes(format!(
                    "allocation {}: {} holders, at most {MAX_WAIT_HOLDERS}",
                    n.alloc,
                    n.holders.len()
                )));
            }
            if let Some(h) = n.holders.iter().find(|h| h.owner.len() > crate::sm::types::MAX_WAIT_OWNER_BYTES) {
                return Err(Rejection::InvalidWaitNotes(format!(
                    "allocation {}: holder {}'s owner is over {} bytes",
                    n.alloc,
                    h.alloc,
                    crate::sm::types::MAX_WAIT_OWNER_BYTES
                )));
            }
        }
        let mut events = Vec::new();
        for n in notes {
            let Some(a) = self.allocs.get_mut(&n.alloc) else { continue };
            if !a.is_queued() || a.nomination.is_some() || a.reservation_epoch != n.epoch {
                continue;
            }
            let a = Arc::make_mut(a);
            if a.waits.push(self.now_ms, n.wait, n.holders.clone()) {
                events.push(Event::WaitChanged { alloc: n.alloc, wait: n.wait, holders: n.holders.clone() });
            }
        }
        Ok(events)
    }
}
