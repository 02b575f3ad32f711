//! Gang teardowns and cancels: stopping tasks, their acks, forced ends, completion.

use super::*;
use std::sync::Arc;

impl State {
    /// After `trigger` failed: if siblings still run, they are torn down
    /// together; otherwise unclaimed siblings are released and the gang
    /// settles (requeued, or failed).
    pub(super) fn start_teardown_or_settle(&mut self, id: AllocId, trigger: TaskIndex) -> Vec<Event> {
        if self.allocs[&id].has_running() {
            return vec![self.begin_teardown(id, TeardownCause::TaskFailed { trigger })];
        }
        self.release_reserved(id);
        self.settle(id)
    }

    /// The seed's PreemptGang, in one command, for any cause (a failed
    /// task, a priority preemption's victim, a node drain's deadline):
    /// running tasks → preempting under a new shared preemption epoch, each
    /// refunded its claim-time attempt (a failed trigger is not: its count is
    /// the signal that ends a gang that keeps failing); unclaimed tasks →
    /// blocked; blocked, done and failed tasks untouched.
    pub(super) fn begin_teardown(&mut self, id: AllocId, cause: TeardownCause) -> Event {
        let now = self.now_ms;
        let released = self.release_reserved(id);
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        a.preemption_epoch += 1;
        let epoch = a.preemption_epoch;
        a.teardown = Some(Teardown { epoch, cause, started_at_ms: now, failed_checkpoints: 0 });
        let mut preempting = Vec::new();
        for t in a.tasks.iter_mut().filter(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            // A task already stopping for an earlier round (a cancel during
            // a teardown) moves to this round's epoch; it was refunded then.
            if t.status == TaskStatus::Running {
                t.attempts = t.attempts.saturating_sub(1);
            }
            t.status = TaskStatus::Preempting;
            t.preemption_epoch = epoch;
            preempting.push((t.index, t.node.expect("a running task has a node")));
        }
        let preempting = preempting.into_iter().map(|(task, slot)| (task, self.node(slot).id.clone())).collect();
        self.refresh(id);
        Event::TeardownStarted { alloc: id, cause, epoch, preempting, released }
    }

    /// A preempting task's agent acknowledges that the process stopped. A
    /// preempted task that was asked to checkpoint and did not answer in
    /// time (`checkpoint_failed`) is charged an attempt, and its gang is
    /// requeued rather than suspended (the seed: "mark as failed, requeue if
    /// policy allows").
    pub(super) fn task_preempted(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        checkpoint_failed: bool,
    ) -> Applied {
        let slot = self.check_preempting(id, task, node, epoch)?;
        let asked = self.allocs[&id].teardown.is_some_and(|td| td.asks_checkpoint());
        let mut events = vec![self.stopped(id, task, slot, None, false, checkpoint_failed && asked)];
        events.extend(self.settle(id));
        Ok(events)
    }

    /// A stopping (preempting) task's process is gone: it leaves its node as
    /// preempted under its teardown's epoch, charged an attempt when the
    /// checkpoint it owed never came. `forced`: the leader forced it at the
    /// deadline (or its node was lost) rather than its agent confirming.
    pub(super) fn stopped(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        exit_code: Option<i32>,
        forced: bool,
        checkpoint_failed: bool,
    ) -> Event {
        let epoch = self.allocs[&id].tasks[task as usize].preemption_epoch;
        self.leave_node(id, task, slot, TaskStatus::Preempted, exit_code);
        if checkpoint_failed {
            self.charge_failed_checkpoint(id, task);
        }
        Event::TaskPreempted { alloc: id, task, epoch, forced, checkpoint_failed }
    }

    /// A preempted task that did not checkpoint in time: charged an attempt
    /// (it was refunded when the preemption started) and counted.
    pub(super) fn charge_failed_checkpoint(&mut self, id: AllocId, task: TaskIndex) {
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        a.tasks[task as usize].attempts += 1;
        if let Some(td) = a.teardown.as_mut() {
            td.failed_checkpoints += 1;
        }
    }

    /// Checks an ack or upload for a preempting task: the epoch first (a late
    /// message from an earlier round is stale whatever the task does now),
    /// then the status, then the node.
    pub(super) fn check_preempting(
        &self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
    ) -> Result<NodeSlot, Rejection> {
        let a = self.live_alloc(id)?;
        let t = a.tasks.get(task as usize).ok_or(Rejection::UnknownTask { alloc: id, task })?;
        let slot = self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        if t.preemption_epoch != epoch {
            return Err(Rejection::StalePreemptionEpoch { alloc: id, current: t.preemption_epoch, got: epoch });
        }
        if t.status != TaskStatus::Preempting {
            return Err(Rejection::WrongTaskStatus {
                alloc: id,
                task,
                status: t.status,
                expected: TaskStatus::Preempting,
            });
        }
        if t.node != Some(slot) {
            return Err(Rejection::WrongNode { alloc: id, task, node: node.clone() });
        }
        Ok(slot)
    }

    /// Moves every task of teardown `epoch` still preempting to preempted,
    /// without an ack; the gang then completes.
    pub(super) fn force_teardown(&mut self, id: AllocId, epoch: u64) -> Applied {
        let a = self.live_alloc(id)?;
        let teardown = a.teardown.ok_or(Rejection::NotTearingDown { alloc: id })?;
        if teardown.epoch != epoch {
            return Err(Rejection::StalePreemptionEpoch { alloc: id, current: teardown.epoch, got: epoch });
        }
        let stuck: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempting)
            .map(|t| (t.index, t.node.expect("a preempting task has a node")))
            .collect();
        let mut events = Vec::new();
        let checkpoint_failed = teardown.asks_checkpoint();
        for (task, slot) in stuck {
            events.push(self.stopped(id, task, slot, None, true, checkpoint_failed));
        }
        events.extend(self.settle(id));
        Ok(events)
    }

    /// The seed's CompletePreemption, run by `settle` the moment the last
    /// task of a teardown stops: preempted tasks return to blocked, and the gang is
    /// either blocked as a unit (requeued) or failed: failed if any task used
    /// up its retries or any task already finished (finished work is never
    /// overwritten; done rows stay done). `settle` applies the verdict.
    ///
    /// A priority preemption ends the same way, except that a gang whose
    /// every task stopped in time is **suspended** (queued again with its
    /// original submit time, to resume from its checkpoints) and counts one
    /// more preemption; and its preemptor learns that these nodes are free.
    pub(super) fn complete_teardown(&mut self, id: AllocId) -> Vec<Event> {
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let Some(teardown) = a.teardown else { return Vec::new() };
        if a.tasks.iter().any(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            return Vec::new();
        }
        a.teardown = None;
        if teardown.is_cancel() {
            return self.complete_cancel(id, teardown);
        }
        for t in a.tasks.iter_mut().filter(|t| t.status == TaskStatus::Preempted) {
            t.status = TaskStatus::Blocked;
            t.node = None;
        }
        let max = a.spec.max_retries;
        let cap = self.limits.watchdog_max_retries;
        let fails = a.give_up.is_some()
            || a.failures >= max
            || a.tasks.iter().any(|t| {
                matches!(t.status, TaskStatus::Done | TaskStatus::Failed)
                    || (t.status == TaskStatus::Blocked && (t.attempts >= max || t.watchdog_trips > cap))
            });
        let preemptor = teardown.preempted_by();
        let outcome = if fails {
            TeardownOutcome::Failed
        } else if teardown.asks_checkpoint() && teardown.failed_checkpoints == 0 {
            TeardownOutcome::Suspended
        } else {
            TeardownOutcome::Blocked
        };
        if teardown.asks_checkpoint() {
            // The seed counts a preemption when the gang is suspended; a
            // victim charged for a missed checkpoint is requeued, not
            // suspended, and its count stays.
            a.suspended = outcome == TeardownOutcome::Suspended;
            if a.suspended {
                a.preempted_count += 1;
            }
        }
        let mut events = vec![Event::TeardownCompleted {
            alloc: id,
            epoch: teardown.epoch,
            cause: teardown.cause,
            outcome,
            drain_ms: now.saturating_sub(teardown.started_at_ms),
            preempted_count: a.preempted_count,
        }];
        if let Some(by) = preemptor {
            events.extend(self.victim_released(id, by));
        }
        events
    }

    /// The end of a cancel's teardown: every task that stopped, and every
    /// task still waiting, is cancelled (finished tasks stay done), and so is
    /// the allocation. A preemptor waiting for these nodes gets them.
    pub(super) fn complete_cancel(&mut self, id: AllocId, teardown: Teardown) -> Vec<Event> {
        let stopped = self.allocs[&id]
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Preempted)
            .filter_map(|t| Some((t.index, t.node?)))
            .collect();
        let mut events = vec![self.end_cancelled(id, stopped)];
        if let Some(by) = teardown.preempted_by() {
            events.extend(self.victim_released(id, by));
        }
        events
    }

    /// Cancels an allocation. With nothing running, it ends now: reserved
    /// tasks release their capacity and every unfinished task is cancelled.
    /// Otherwise the cancel is a gang teardown with its own cause: running
    /// (and already stopping) tasks are stopped under a new preemption epoch
    /// and keep their capacity until their agents confirm they stopped, or
    /// until the force deadline; the allocation is cancelled when the last
    /// one stops (`complete_teardown`).
    pub(super) fn check_cancel(&self, id: AllocId) -> Result<(), Rejection> {
        if self.live_alloc(id)?.teardown.is_some_and(|td| td.is_cancel()) {
            return Err(Rejection::AlreadyCancelling { alloc: id });
        }
        Ok(())
    }

    pub(super) fn cancel(&mut self, id: AllocId) -> Applied {
        if self.arrays.contains_key(&id) {
            return self.cancel_array(id, None);
        }
        if self.workflows.contains_key(&id) {
            return self.cancel_workflow(id);
        }
        if !self.allocs.contains_key(&id)
            && let Some(applied) = self.cancel_unmaterialised(id)
        {
            return applied;
        }
        self.check_cancel(id)?;
        self.drop_nomination(id);
        let a = &self.allocs[&id];
        if a.tasks.iter().any(|t| matches!(t.status, TaskStatus::Running | TaskStatus::Preempting)) {
            let preempted_by = a.teardown.and_then(|td| td.preempted_by());
            return Ok(vec![self.begin_teardown(id, TeardownCause::Cancelled { preempted_by })]);
        }
        let usage = Usage::of(&a.spec.resources);
        let held: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status.holds_capacity())
            .map(|t| (t.index, t.node.expect("a placed task has a node")))
            .collect();
        for &(task, slot) in &held {
            self.release(slot, &usage, (id, task));
        }
        Ok(vec![self.end_cancelled(id, held)])
    }

    /// Cancels every unfinished task and the allocation itself (finished
    /// tasks stay done); `stopped` are the tasks that held capacity on
    /// these nodes until now.
    pub(super) fn end_cancelled(&mut self, id: AllocId, stopped: Vec<(TaskIndex, NodeSlot)>) -> Event {
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        for t in a.tasks.iter_mut().filter(|t| !t.status.is_terminal()) {
            if t.status == TaskStatus::Preempted {
                t.node = None; // it has left its node
            }
            t.status = TaskStatus::Cancelled;
        }
        a.status = AllocStatus::Cancelled;
        a.suspended = false;
        a.finished_at_ms = Some(now);
        self.retire_checkpoints(id);
        let stopped = stopped.into_iter().map(|(task, slot)| (task, self.node(slot).id.clone())).collect();
        self.reindex_alloc(id);
        Event::AllocationCancelled { alloc: id, stopped }
    }
}
