//! Every invariant of the state, checked by tests, the simulator and snapshot decoding.

use super::*;

impl State {
    /// Checks every invariant of the state; `Err` names the first one broken.
    /// Tests and the simulator call this; a broken invariant is a bug.
    pub fn check_invariants(&self) -> Result<(), String> {
        // Secrets are held only for allocations that may still run.
        for id in self.secrets.keys() {
            let live_array = self.arrays.get(id).is_some_and(|a| a.finished_at_ms.is_none());
            if !live_array && self.allocs.get(id).is_none_or(|a| a.status.is_terminal()) {
                return Err(format!("secrets of allocation {id}, which is finished or gone, are kept"));
            }
        }
        let mut used = vec![Usage::default(); self.nodes.len()];
        // (reserved, running or preempting) GPUs, task by task.
        let mut held_gpus = (0u64, 0u64);
        let mut ports: BTreeMap<NodeSlot, BTreeSet<u16>> = BTreeMap::new();
        for a in self.allocs.values() {
            // Rendezvous ports: held exactly while task 0 holds capacity, as
            // many as asked, none twice on one node.
            let task0 = a.tasks.first().filter(|t| t.status.holds_capacity()).and_then(|t| t.node);
            match task0 {
                Some(slot) if a.ports.len() == a.spec.ports as usize => {
                    for &p in &a.ports {
                        if !ports.entry(slot).or_default().insert(p) {
                            return Err(format!("port {p} of node {} is held twice", self.node(slot).id));
                        }
                    }
                }
                None if a.ports.is_empty() => {}
                _ => return Err(format!("allocation {} holds ports {:?} out of step with task 0", a.id, a.ports)),
            }
            let has = |s: TaskStatus| a.tasks.iter().any(|t| t.status == s);
            if has(TaskStatus::Blocked) && has(TaskStatus::Reserved) {
                return Err(format!("allocation {} is partly reserved", a.id));
            }
            if has(TaskStatus::Blocked) && has(TaskStatus::Running) {
                return Err(format!("allocation {} is partly running", a.id));
            }
            match a.teardown {
                Some(td) => {
                    if a.status != AllocStatus::TearingDown {
                        return Err(format!("allocation {} has a teardown but is {:?}", a.id, a.status));
                    }
                    if has(TaskStatus::Running) || has(TaskStatus::Reserved) || !has(TaskStatus::Preempting) {
                        return Err(format!("allocation {}'s teardown has no task preempting, or one placed", a.id));
                    }
                    if a.tasks.iter().any(|t| t.status == TaskStatus::Preempting && t.preemption_epoch != td.epoch) {
                        return Err(format!("allocation {} has a task preempting under an old epoch", a.id));
                    }
                    if td.epoch != a.preemption_epoch {
                        return Err(format!("allocation {}'s teardown epoch is not its latest", a.id));
                    }
                }
                None => {
                    if a.status == AllocStatus::TearingDown || has(TaskStatus::Preempting) || has(TaskStatus::Preempted)
                    {
                        return Err(format!("allocation {} is preempting outside a teardown", a.id));
                    }
                }
            }
            if a.status.is_terminal() && a.tasks.iter().any(|t| !t.checkpoints.is_empty()) {
                return Err(format!("terminal allocation {} still keeps checkpoints", a.id));
            }
            if a.tasks.len() != a.spec.gang_size as usize {
                return Err(format!(
                    "allocation {} has {} tasks for a gang of {}",
                    a.id,
                    a.tasks.len(),
                    a.spec.gang_size
                ));
            }
            let mut nodes = BTreeSet::new();
            for t in &a.tasks {
                match (t.status.holds_capacity(), t.node) {
                    (true, Some(slot)) => {
                        if !nodes.insert(slot) {
                            return Err(format!("allocation {} has two tasks on one node", a.id));
                        }
                        let u = &mut used[slot.0 as usize];
                        *u = u.plus(&Usage::of(&a.spec.resources));
                        let gpus = u64::from(a.spec.resources.gpus);
                        if t.status == TaskStatus::Reserved {
                            held_gpus.0 += gpus;
                        } else {
                            held_gpus.1 += gpus;
                        }
                    }
                    (true, None) => return Err(format!("allocation {} task {} is placed nowhere", a.id, t.index)),
                    (false, _) => {}
                }
                if a.status.is_terminal() && t.status.holds_capacity() {
                    return Err(format!("terminal allocation {} still holds capacity", a.id));
                }
            }
            if let Some(n) = &a.nomination {
                if !a.is_queued() {
                    return Err(format!("allocation {} holds nodes but is {:?}", a.id, a.status));
                }
                if n.nodes.len() != a.spec.gang_size as usize {
                    return Err(format!(
                        "allocation {} holds {} nodes for a gang of {}",
                        a.id,
                        n.nodes.len(),
                        a.tasks.len()
                    ));
                }
                for v in &n.waiting_for {
                    let by = self.allocs.get(v).and_then(|v| v.teardown).and_then(|td| td.preempted_by());
                    if by != Some(a.id) {
                        return Err(format!("allocation {} waits for {v}, which is not being preempted for it", a.id));
                    }
                }
                if n.waiting_for.is_empty() {
                    return Err(format!("allocation {} holds nodes but waits for no victim", a.id));
                }
            }
            if a.status == AllocStatus::Waiting {
                // Waiting: never placed, and its dependencies still pending
                // (or it keeps waiting on ones that cannot be met).
                if a.tasks.iter().any(|t| t.status != TaskStatus::Blocked) || a.reservation_epoch != 0 {
                    return Err(format!("allocation {} is waiting but was placed", a.id));
                }
                match self.after_standing(&a.spec.after) {
                    crate::sm::types::Standing::Pending => {}
                    crate::sm::types::Standing::Never(_) if a.spec.after.keep_if_unsatisfiable => {}
                    s => return Err(format!("allocation {} is waiting, but its dependencies stand: {s:?}", a.id)),
                }
            }
            if a.suspended != (a.status == AllocStatus::Suspended) {
                return Err(format!("allocation {} is {:?} with suspended = {}", a.id, a.status, a.suspended));
            }
            // A reclamation preempts whatever the class, and a cancel during
            // a preemption keeps its preemptor.
            let reclaim = matches!(
                a.teardown.map(|td| td.cause),
                Some(TeardownCause::Preempted { reason: PreemptReason::Reclaim, .. } | TeardownCause::Cancelled { .. })
            );
            if let Some(by) = a.teardown.and_then(|td| td.preempted_by())
                && !reclaim
                && self.allocs.get(&by).is_none_or(|p| p.spec.preemption_class <= a.spec.preemption_class)
            {
                return Err(format!("allocation {} is preempted for {by}, which is not of a higher class", a.id));
            }
            if (a.is_queued() && a.nomination.is_none()) != self.index.queue.contains(&QueueKey::of(a)) {
                return Err(format!("queue index out of step for allocation {}", a.id));
            }
        }
        ports.retain(|_, p| !p.is_empty());
        if ports != self.index.ports_held {
            return Err("rendezvous port index out of step".to_string());
        }
        if self.held_gpus() != held_gpus {
            return Err(format!(
                "held GPUs {:?} (reserved, running), but the tasks hold {held_gpus:?}",
                self.held_gpus()
            ));
        }
        for (node, used) in self.nodes.iter().zip(&used) {
            if node.used != *used {
                return Err(format!("node {} records {:?} used but its tasks hold {:?}", node.id, node.used, used));
            }
            if !Usage::of(&node.resources).covers(used) {
                return Err(format!("node {} is over-committed", node.id));
            }
            if !node.status.may_hold_work() && *used != Usage::default() {
                return Err(format!("{} node {} still holds tasks", node.status.as_str(), node.id));
            }
            let draining = matches!(node.status, NodeStatus::Draining | NodeStatus::Stopping);
            if draining != node.drain.is_some() {
                return Err(format!("node {} is {} with drain {:?}", node.id, node.status.as_str(), node.drain));
            }
            if draining && self.tasks_on_node(node.slot).next().is_none() {
                return Err(format!("{} node {} holds nothing but did not stop", node.status.as_str(), node.id));
            }
        }
        // Checkpoint manifests: numbered once each, and a retired one is
        // named by no task.
        let mut seqs = BTreeSet::new();
        for t in self.allocs.values().flat_map(|a| &a.tasks) {
            for m in &t.checkpoints {
                if m.seq >= self.next_checkpoint_seq || !seqs.insert(m.seq) {
                    return Err(format!("checkpoint {} is numbered twice or ahead of the count", m.seq));
                }
            }
        }
        for (seq, r) in &self.retired_checkpoints {
            if *seq != r.manifest.seq || seqs.contains(seq) || *seq >= self.next_checkpoint_seq {
                return Err(format!("retired checkpoint {seq} is still named, or misnumbered"));
            }
        }
        self.check_array_invariants()?;
        for w in self.workflows.values() {
            if self.allocs.contains_key(&w.id) || self.arrays.contains_key(&w.id) {
                return Err(format!("workflow {} shares its id", w.id));
            }
            if w.steps.iter().any(|&(_, s)| s <= w.id || s >= self.next_alloc_id) {
                return Err(format!("workflow {}'s steps are not the ids after it", w.id));
            }
        }
        let mut fresh = self.clone();
        fresh.rebuild_indexes();
        if fresh.index != self.index {
            return Err("derived indexes differ from a rebuild".to_string());
        }
        Ok(())
    }

    /// Arrays: their id ranges hold no other allocation; only positions
    /// already passed are materialised; the counts add up; a finished
    /// array has nothing left; the throttle holds unless it was lowered.
    fn check_array_invariants(&self) -> Result<(), String> {
        let mut end_of_last = 0;
        for a in self.arrays.values() {
            let count = a.count();
            if a.id <= end_of_last || a.id + count >= self.next_alloc_id {
                return Err(format!("array {} overlaps another's ids or the next id", a.id));
            }
            end_of_last = a.id + count;
            if self.allocs.contains_key(&a.id) {
                return Err(format!("array {} shares its id with an allocation", a.id));
            }
            if a.next > count || a.skipped.windows(2).any(|w| w[0].1 >= w[1].0) {
                return Err(format!("array {} has next {} or skipped {:?} out of shape", a.id, a.next, a.skipped));
            }
            if a.skipped.iter().any(|&(f, t)| f >= t || t > count) {
                return Err(format!("array {} skips positions outside itself: {:?}", a.id, a.skipped));
            }
            let mut live = BTreeSet::new();
            for (&id, e) in self.allocs.range(a.id + 1..=a.id + count) {
                let position = id - a.id - 1;
                if position >= a.next || a.is_skipped(position) {
                    return Err(format!("element {id} of array {} is held but was never materialised", a.id));
                }
                if !e.status.is_terminal() {
                    live.insert(id);
                }
            }
            let indexed: BTreeSet<AllocId> = self.array_live(a.id).collect();
            if live != indexed {
                return Err(format!("array {}'s live elements are out of step with its index", a.id));
            }
            let ended = a.done + a.failed + a.cancelled;
            if ended + live.len() as u64 + a.unmaterialised() != count {
                return Err(format!(
                    "array {}: {ended} ended + {} live + {} to come is not its {count} elements",
                    a.id,
                    live.len(),
                    a.unmaterialised()
                ));
            }
            if a.finished_at_ms.is_some() != (ended == count) {
                return Err(format!(
                    "array {} is finished = {} with {ended} of {count} ended",
                    a.id,
                    a.finished_at_ms.is_some()
                ));
            }
        }
        Ok(())
    }
}
