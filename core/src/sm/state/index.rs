//! Shared checks and moves: reports, leaving a node, settling a gang, and the derived indexes.

use super::*;
use std::sync::Arc;

impl State {
    pub(super) fn live_alloc(&self, id: AllocId) -> Result<&Allocation, Rejection> {
        let Some(a) = self.allocs.get(&id) else {
            return Err(match self.compacted.get(&id) {
                Some(c) => Rejection::AlreadyTerminal { alloc: id, status: c.status },
                None => Rejection::UnknownAllocation(id),
            });
        };
        if a.status.is_terminal() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status: a.status });
        }
        Ok(a)
    }

    /// Checks a node's claim or report about one task: the task exists, is
    /// placed on that node, under the current reservation epoch, in one of
    /// the `accepted` statuses (the first is named when it is not).
    pub(super) fn check_report(
        &self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        accepted: &[TaskStatus],
    ) -> Result<(NodeSlot, TaskStatus), Rejection> {
        let a = self.live_alloc(id)?;
        let t = a.tasks.get(task as usize).ok_or(Rejection::UnknownTask { alloc: id, task })?;
        let slot = self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        let wrong_status = Rejection::WrongTaskStatus { alloc: id, task, status: t.status, expected: accepted[0] };
        match t.node {
            None => return Err(wrong_status),
            Some(placed) if placed != slot => return Err(Rejection::WrongNode { alloc: id, task, node: node.clone() }),
            Some(_) => {}
        }
        if t.reservation_epoch != epoch {
            return Err(Rejection::StaleTaskEpoch { alloc: id, task, current: t.reservation_epoch, got: epoch });
        }
        if !accepted.contains(&t.status) {
            return Err(wrong_status);
        }
        Ok((slot, t.status))
    }

    /// Moves a running or preempting task off its node into `status`.
    pub(super) fn leave_node(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        status: TaskStatus,
        exit_code: Option<i32>,
    ) {
        let now = self.now_ms;
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        self.release(slot, &usage, (id, task));
        let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
        t.status = status;
        t.finished_at_ms = Some(now);
        t.exit_code = exit_code;
        t.reserved_at_ms = None;
    }

    /// Completes a teardown whose last task has stopped, then decides a
    /// gang's fate once nothing of it runs, waits to be claimed or is being
    /// torn down:
    /// all done ⇒ done; otherwise, if any task finished or any blocked task
    /// used up its retries ⇒ failed (the seed's completion rule); else the
    /// whole gang is queued again.
    pub(super) fn settle(&mut self, id: AllocId) -> Vec<Event> {
        let now = self.now_ms;
        let before = self.allocs[&id].status;
        let mut events = self.complete_teardown(id);
        self.refresh(id);
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("settle of a known allocation");
        if a.status.is_terminal() {
            // A cancel's teardown just completed.
        } else if a.tasks.iter().all(|t| t.status == TaskStatus::Done) {
            a.status = AllocStatus::Done;
            a.finished_at_ms = Some(now);
            events.push(Event::AllocationDone { alloc: id });
        } else if a.is_queued() {
            // Nothing runs or waits: blocked (and maybe done) tasks only.
            let done = a.tasks.iter().find(|t| t.status == TaskStatus::Done).map(|t| t.index);
            let exhausted = a
                .tasks
                .iter()
                .find(|t| t.status == TaskStatus::Blocked && t.attempts >= a.spec.max_retries)
                .map(|t| t.index);
            let cap = self.limits.watchdog_max_retries;
            let wedged = a.tasks.iter().find(|t| t.status == TaskStatus::Blocked && t.watchdog_trips > cap);
            let max = a.spec.max_retries;
            let last_error = || {
                a.last_failure
                    .as_ref()
                    .and_then(|f| f.error_line())
                    .map_or(String::new(), |line| format!("; last error: {}", super::gangs::clip_line(line)))
            };
            let reason = match (done, exhausted, wedged) {
                (Some(task), _, _) => Some(format!("task {task} finished before its gang could be restarted whole")),
                _ if a.give_up.is_some() => a.give_up.clone(),
                (None, Some(task), _) => Some(format!("task {task} failed {max} times{}", last_error())),
                (None, None, _) if a.failures >= max => {
                    let task = a.last_failure.as_ref().map_or(String::new(), |f| format!(", task {} last", f.task));
                    Some(format!("the gang failed {max} times{task}{}", last_error()))
                }
                (None, None, Some(t)) => Some(format!(
                    "task {} tripped the {} watchdog after {} retries",
                    t.index,
                    t.last_watchdog.map_or("?", |k| k.as_str()),
                    cap
                )),
                (None, None, None) => None,
            };
            if let Some(reason) = reason {
                for t in a.tasks.iter_mut().filter(|t| t.status == TaskStatus::Blocked) {
                    t.status = TaskStatus::Failed;
                }
                a.status = AllocStatus::Failed;
                a.suspended = false;
                a.finished_at_ms = Some(now);
                events.push(Event::AllocationFailed { alloc: id, reason });
            } else if !matches!(before, AllocStatus::Queued | AllocStatus::Suspended) {
                events.push(Event::GangRequeued { alloc: id });
            }
        }
        if self.allocs[&id].status.is_terminal() {
            self.retire_checkpoints(id);
        }
        self.reindex_alloc(id);
        events
    }

    /// Re-derives a live allocation's status from its tasks.
    pub(super) fn refresh(&mut self, id: AllocId) {
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("refresh of a known allocation");
        if a.status.is_terminal() || a.status == AllocStatus::Waiting {
            return;
        }
        let count = |s: TaskStatus| a.tasks.iter().filter(|t| t.status == s).count();
        let (blocked, reserved) = (count(TaskStatus::Blocked), count(TaskStatus::Reserved));
        let was_queued = a.is_queued();
        a.status = if a.teardown.is_some() {
            AllocStatus::TearingDown
        } else if blocked > 0 && reserved == 0 {
            if a.suspended { AllocStatus::Suspended } else { AllocStatus::Queued }
        } else if reserved > 0 {
            AllocStatus::Reserved
        } else {
            AllocStatus::Running
        };
        if a.is_queued() && !was_queued {
            a.queued_since_ms = self.now_ms;
        }
        self.reindex_alloc(id);
    }

    pub(super) fn reindex_alloc(&mut self, id: AllocId) {
        let a = &self.allocs[&id];
        let key = QueueKey::of(a);
        let home = self.home_key(&a.spec.vcluster);
        let shape = (home, Shape::of(a));
        let class = (Reverse(a.spec.preemption_class), key);
        if a.is_queued() && a.nomination.is_none() && a.spec.preemption_class > 0 {
            self.index.preemptors.insert(class);
        } else {
            self.index.preemptors.remove(&class);
        }
        if a.is_queued() && a.nomination.is_none() {
            self.index.queue.insert(key);
            self.index.queue_fifo.insert(id);
            if self.index.queue_by_shape.entry(shape).or_default().insert(key) {
                *self.index.vc_queued.entry(home).or_default() += 1;
                *self.index.queued_by_class.entry(a.spec.preemption_class).or_default() += 1;
            }
        } else if self.index.queue.remove(&key) {
            self.index.queue_fifo.remove(&id);
            decrement(&mut self.index.vc_queued, home);
            decrement(&mut self.index.queued_by_class, a.spec.preemption_class);
            let group = self.index.queue_by_shape.get_mut(&shape).expect("a queued shape has a group");
            group.remove(&key);
            if group.is_empty() {
                self.index.queue_by_shape.remove(&shape);
            }
        }
        let gpus = u64::from(a.spec.gang_size) * u64::from(a.spec.resources.gpus);
        if !a.status.is_terminal() {
            let d = self.index.vc_live.entry(a.spec.vcluster.clone()).or_default();
            if d.allocs.insert(id) {
                d.gpus += gpus;
            }
        } else if let Some(d) = self.index.vc_live.get_mut(&a.spec.vcluster)
            && d.allocs.remove(&id)
        {
            d.gpus -= gpus;
            if d.allocs.is_empty() {
                self.index.vc_live.remove(&a.spec.vcluster);
            }
        }
        if !a.status.is_terminal() && a.has_reserved() {
            self.index.reserved.insert(id);
        } else {
            self.index.reserved.remove(&id);
        }
        if a.is_queued() && a.retry_after_ms > 0 {
            self.index.backoffs.insert((a.retry_after_ms, id));
        } else {
            self.index.backoffs.remove(&(a.retry_after_ms, id));
        }
        if a.teardown.is_some() {
            self.index.tearing_down.insert(id);
        } else {
            self.index.tearing_down.remove(&id);
        }
        let mut ended_now = false;
        let end = (a.finished_at_ms.unwrap_or(a.submit_time_ms), id);
        if a.status.is_terminal() && self.index.detailed.insert(end) {
            if a.finish_seq == 0 {
                ended_now = true;
                self.finished_total += 1;
                self.allocs.get_mut(&id).map(Arc::make_mut).expect("indexed").finish_seq = self.finished_total;
            }
            self.touched.finished.push(id);
            // It runs no more: its secrets are kept nowhere.
            self.secrets.remove(&id);
        }
        self.index_dependencies(id);
        // Every reindex passes here; with no arrays, no element to index.
        if !self.arrays.is_empty() {
            self.index_array_element(id, ended_now);
        }
    }

    pub(super) fn index_node(&mut self, slot: NodeSlot) {
        let node = &self.nodes[slot.0 as usize];
        if node.status == NodeStatus::Ready && !self.index.held.contains_key(&slot) {
            self.index.free_gpus.insert((self.index.node_home[slot.0 as usize], node.free().gpus, slot));
        }
    }

    pub(super) fn unindex_node(&mut self, slot: NodeSlot) {
        let node = &self.nodes[slot.0 as usize];
        self.index.free_gpus.remove(&(self.index.node_home[slot.0 as usize], node.free().gpus, slot));
    }

    pub(super) fn occupy(&mut self, slot: NodeSlot, usage: &Usage, task: (AllocId, TaskIndex)) {
        self.touched.nodes.insert(slot);
        self.index.tasks_by_node.entry(slot).or_default().insert(task);
        self.add_holder(slot, task.0, *usage);
        self.unindex_node(slot);
        let node = &mut self.nodes[slot.0 as usize];
        node.used = node.used.plus(usage);
        assert!(Usage::of(&node.resources).covers(&node.used), "node {} over-committed", node.id);
        self.index_node(slot);
    }

    pub(super) fn release(&mut self, slot: NodeSlot, usage: &Usage, task: (AllocId, TaskIndex)) {
        self.touched.nodes.insert(slot);
        if task.1 == 0 {
            self.return_ports(task.0, slot);
        }
        if let Some(holders) = self.index.holders.get_mut(slot.0 as usize)
            && let Ok(i) = holders.binary_search_by_key(&task.0, |h| h.alloc)
        {
            let h = holders.remove(i);
            let vc = &self.allocs[&h.alloc].spec.vcluster;
            let lender = self.lender(slot, vc);
            if let Some(home) = lender {
                let lent = self.index.lent.get_mut(&home).expect("a borrower is in its lender's index");
                decrement(lent, h.alloc);
                if lent.is_empty() {
                    self.index.lent.remove(&home);
                }
            }
            let load = self.index.vc_load.get_mut(vc).expect("a holder is in its vCluster's load");
            load.gpus -= u64::from(h.usage.gpus);
            if lender.is_some() {
                load.borrowed_gpus -= u64::from(h.usage.gpus);
            }
            decrement(&mut load.allocs, h.alloc);
            decrement(&mut load.nodes, slot);
            if load.allocs.is_empty() {
                self.index.vc_load.remove(vc);
            }
        }
        if let Some(tasks) = self.index.tasks_by_node.get_mut(&slot) {
            tasks.remove(&task);
            if tasks.is_empty() {
                self.index.tasks_by_node.remove(&slot);
                if matches!(self.node(slot).status, NodeStatus::Draining | NodeStatus::Stopping) {
                    self.index.emptied.push(slot);
                }
            }
        }
        self.unindex_node(slot);
        let node = &mut self.nodes[slot.0 as usize];
        assert!(node.used.covers(usage), "node {} releases more than it holds", node.id);
        node.used = node.used.minus(usage);
        self.index_node(slot);
    }

    /// Rendezvous ports of `slot`'s range that no gang holds, lowest first.
    pub fn free_ports(&self, slot: NodeSlot) -> impl Iterator<Item = u16> + '_ {
        let held = self.index.ports_held.get(&slot);
        let range = self.node(slot).ports();
        (0..range.count).map(move |i| range.first + i).filter(move |p| held.is_none_or(|h| !h.contains(p)))
    }

    /// How many rendezvous ports of `slot` no gang holds.
    pub fn free_port_count(&self, slot: NodeSlot) -> u32 {
        let range = self.node(slot).ports();
        let held = self.index.ports_held.get(&slot).map_or(0, |h| h.iter().filter(|&&p| range.contains(p)).count());
        u32::from(range.count) - held as u32
    }

    /// Gives `id` the lowest free rendezvous ports its spec asks for on
    /// `slot` (task 0's node; checked to have them).
    pub(super) fn take_ports(&mut self, id: AllocId, slot: NodeSlot) {
        let want = self.allocs[&id].spec.ports as usize;
        let ports: Vec<u16> = self.free_ports(slot).take(want).collect();
        assert_eq!(ports.len(), want, "task 0's node was checked to have the ports");
        if !ports.is_empty() {
            self.index.ports_held.entry(slot).or_default().extend(ports.iter().copied());
        }
        self.allocs.get_mut(&id).map(Arc::make_mut).expect("placing a known allocation").ports = ports;
    }

    /// Returns the rendezvous ports `id` holds on `slot` (its task 0 left).
    fn return_ports(&mut self, id: AllocId, slot: NodeSlot) {
        let ports = std::mem::take(
            &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("releasing a known allocation").ports,
        );
        if ports.is_empty() {
            return;
        }
        let held = self.index.ports_held.get_mut(&slot).expect("held ports are indexed");
        for p in &ports {
            assert!(held.remove(p), "allocation {id} returns port {p} it does not hold on {slot:?}");
        }
        if held.is_empty() {
            self.index.ports_held.remove(&slot);
        }
    }

    /// The task of `id` holding `slot` (re)started or was reserved again
    /// there, now: its walltime runs from now.
    pub(super) fn restart_walltime(&mut self, id: AllocId, slot: NodeSlot) {
        let ends = self.now_ms.saturating_add(self.allocs[&id].spec.walltime_s.saturating_mul(1000));
        let holders = &mut self.index.holders[slot.0 as usize];
        let i = holders.binary_search_by_key(&id, |h| h.alloc).expect("the task holds its node");
        holders[i].walltime_ends_ms = ends;
    }

    /// Records that a task of `alloc` holds `usage` on `slot` (a gang has at
    /// most one task per node).
    pub(super) fn add_holder(&mut self, slot: NodeSlot, alloc: AllocId, usage: Usage) {
        let a = &self.allocs[&alloc];
        let class = a.spec.preemption_class;
        // Being placed now (its task not updated yet), or indexed again from
        // a task that holds the node.
        let since = match a.tasks.iter().find(|t| t.node == Some(slot) && t.status.holds_capacity()) {
            Some(t) if t.status == TaskStatus::Reserved => t.reserved_at_ms,
            Some(t) => t.started_at_ms.or(t.reserved_at_ms),
            None => None,
        };
        let walltime_ends_ms = since.unwrap_or(self.now_ms).saturating_add(a.spec.walltime_s.saturating_mul(1000));
        let holders = &mut self.index.holders[slot.0 as usize];
        let at = holders.binary_search_by_key(&alloc, |h| h.alloc).expect_err("one task per node per gang");
        holders.insert(at, Holder { alloc, class, usage, walltime_ends_ms });
        let vc = &self.allocs[&alloc].spec.vcluster;
        let lender = self.lender(slot, vc);
        if let Some(home) = lender {
            *self.index.lent.entry(home).or_default().entry(alloc).or_default() += 1;
        }
        let load = self.index.vc_load.entry(vc.clone()).or_default();
        load.gpus += u64::from(usage.gpus);
        if lender.is_some() {
            load.borrowed_gpus += u64::from(usage.gpus);
        }
        *load.allocs.entry(alloc).or_default() += 1;
        *load.nodes.entry(slot).or_default() += 1;
    }

    /// Moves the clock as applying an entry stamped `time_ms` would.
    #[cfg(test)]
    pub(crate) fn advance_clock(&mut self, time_ms: u64) {
        self.now_ms = self.now_ms.max(time_ms);
    }

    /// Rebuilds every derived index from the replicated fields (after decode).
    pub(crate) fn rebuild_indexes(&mut self) {
        self.index = Indexes::default();
        self.index.holders = vec![Vec::new(); self.nodes.len()];
        self.index.home_names = self.vclusters().into_iter().map(|v| v.name).collect();
        self.index.home_key =
            self.index.home_names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32 + 1)).collect();
        self.index.node_home = self.homes_of(self.nodes.iter());
        for a in self.allocs.values() {
            for &slot in a.nomination.iter().flat_map(|n| &n.nodes) {
                self.index.held.insert(slot, a.id);
            }
        }
        for slot in 0..self.nodes.len() {
            let slot = NodeSlot(slot as u32);
            self.index.node_by_id.insert(self.node(slot).id.clone(), slot);
            self.index.by_status.entry(self.node(slot).status).or_default().insert(slot);
            self.index_node(slot);
        }
        self.index.key_expiry =
            self.forgotten_keys.iter().map(|((owner, key), f)| (f.expires_ms, owner.clone(), key.clone())).collect();
        self.index.finished_arrays = self.arrays.values().filter_map(|a| Some((a.finished_at_ms?, a.id))).collect();
        let mut by_end: Vec<(u64, AllocId)> = self.compacted.iter().map(|(&id, c)| (c.end_ms, id)).collect();
        by_end.sort_unstable();
        self.index.compacted_by_end = by_end.into_iter().map(|(_, id)| id).collect();
        self.index.workflow_steps = self
            .workflows
            .values()
            .flat_map(|w| w.steps.iter().enumerate().map(|(k, &(_, s))| (s, (w.id, k as u32))))
            .collect();
        let ids: Vec<AllocId> = self.allocs.keys().copied().collect();
        for id in ids {
            self.reindex_alloc(id);
            let usage = Usage::of(&self.allocs[&id].spec.resources);
            let placed: Vec<(NodeSlot, TaskIndex)> = self.allocs[&id]
                .tasks
                .iter()
                .filter(|t| t.status.holds_capacity())
                .map(|t| (t.node.expect("a placed task has a node"), t.index))
                .collect();
            for (slot, task) in placed {
                self.index.tasks_by_node.entry(slot).or_default().insert((id, task));
                self.add_holder(slot, id, usage);
                if task == 0 {
                    let held = self.index.ports_held.entry(slot).or_default();
                    for &p in &self.allocs[&id].ports {
                        assert!(held.insert(p), "port {p} held twice on {slot:?}");
                    }
                }
            }
            self.index.ports_held.retain(|_, h| !h.is_empty());
        }
        self.rebuild_checkpoint_indexes();
        self.touched.finished.sort_by_key(|id| self.allocs[id].finish_seq);
        self.flush_finished();
    }
}
