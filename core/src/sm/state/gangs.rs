//! Gangs: submit, reserve, roll back, start, finish and fail tasks, watchdog trips.

use super::*;
use std::sync::Arc;

impl State {
    /// What an earlier submit with the same owner and idempotency key made
    /// of this spec: the allocation when the spec is the same (a retry),
    /// `IdempotencyConflict` when it differs, `None` when the key is new (or
    /// absent). Keys are scoped by owner, and outlive a forgotten
    /// allocation until their window ends (see `retention`).
    pub fn submitted_before(&self, spec: &AllocSpec) -> Option<Result<AllocId, Rejection>> {
        let key = spec.idempotency_key.as_ref()?;
        let name = (spec.owner.clone(), key.clone());
        let (existing, same) = match self.idempotency.get(&name) {
            Some(&id) => match (self.allocs.get(&id), self.compacted.get(&id)) {
                (Some(a), _) => (id, a.spec == *spec),
                (None, Some(c)) => (id, c.key.as_ref().is_some_and(|k| k.spec_sha256 == spec_sha256(spec))),
                (None, None) => (id, false),
            },
            None => {
                let f = self.forgotten_keys.get(&name)?;
                (f.alloc, f.spec_sha256 == spec_sha256(spec))
            }
        };
        Some(if same {
            Ok(existing)
        } else {
            Err(Rejection::IdempotencyConflict { key: key.clone(), alloc: existing })
        })
    }

    pub(super) fn submit(&mut self, spec: &AllocSpec, secrets: &Secrets) -> Applied {
        validate_spec(spec, &self.limits)?;
        validate_secrets(spec, secrets)?;
        if let Some(earlier) = self.submitted_before(spec) {
            return earlier.map(|alloc| vec![Event::Submitted { alloc, duplicate: true }]);
        }
        // Every allocation belongs to a vCluster that exists (`default`
        // always does).
        if self.vcluster(&spec.vcluster).is_none() {
            return Err(Rejection::UnknownVCluster(spec.vcluster.clone()));
        }
        if let Some(reason) = self.submit_quota_excess(spec) {
            return Err(Rejection::OverQuota { vcluster: spec.vcluster.clone(), reason });
        }
        self.check_job_store(spec)?;
        self.check_dependencies(&spec.after)?;
        let id = self.next_alloc_id;
        self.next_alloc_id += 1;
        self.insert_allocation(id, spec.clone(), self.now_ms, secrets.names());
        if let Some(key) = &spec.idempotency_key {
            self.idempotency.insert((spec.owner.clone(), key.clone()), id);
        }
        if !secrets.is_empty() {
            self.secrets.insert(id, secrets.clone());
        }
        let mut events = vec![Event::Submitted { alloc: id, duplicate: false }];
        // Dependencies that already stand settle it at once.
        events.extend(self.settle_waiting(id));
        Ok(events)
    }

    /// Adds allocation `id` of `spec`, every task blocked: queued, or
    /// waiting when it names dependencies; indexed.
    pub(super) fn insert_allocation(
        &mut self,
        id: AllocId,
        spec: AllocSpec,
        submit_time_ms: u64,
        secret_names: Vec<String>,
    ) {
        let tasks = (0..spec.gang_size)
            .map(|index| Task {
                index,
                status: TaskStatus::Blocked,
                node: None,
                attempts: 0,
                runs: 0,
                reservation_epoch: 0,
                reserved_at_ms: None,
                started_at_ms: None,
                finished_at_ms: None,
                exit_code: None,
                run_nodes: Vec::new(),
                preemption_epoch: 0,
                checkpoints: Vec::new(),
                watchdog_trips: 0,
                last_watchdog: None,
                drain_retries: 0,
                attempt_log: Vec::new(),
                attempts_dropped: 0,
            })
            .collect();
        let status = if spec.after.is_empty() { AllocStatus::Queued } else { AllocStatus::Waiting };
        self.allocs.insert(
            id,
            Arc::new(Allocation {
                id,
                spec,
                submit_time_ms,
                queued_since_ms: self.now_ms,
                status,
                reservation_epoch: 0,
                first_reserved_at_ms: None,
                revision: 0,
                history: VecDeque::new(),
                finished_at_ms: None,
                tasks,
                preemption_epoch: 0,
                teardown: None,
                preempted_count: 0,
                suspended: false,
                nomination: None,
                retry_first: false,
                avoid_nodes: Vec::new(),
                finish_seq: 0,
                ports: Vec::new(),
                secret_names,
                failures: 0,
                last_failure: None,
                give_up: None,
                retry_after_ms: 0,
                image_pull_failures: 0,
                waits: super::super::types::WaitLog::default(),
            }),
        );
        self.reindex_alloc(id);
    }

    /// Allocation `id`'s secrets, for the agents its tasks are placed on
    /// (an array element's are its array's).
    pub fn secrets(&self, id: AllocId) -> Option<&Secrets> {
        self.secrets.get(&id).or_else(|| self.secrets.get(&self.array_of(id)?.0.id))
    }

    pub(super) fn reserve_gang(&mut self, id: AllocId, epoch: u64, nodes: &[NodeId]) -> Applied {
        let a = self.live_alloc(id)?;
        if !a.is_queued() {
            return Err(Rejection::NotQueued { alloc: id, status: a.status });
        }
        if a.nomination.is_some() {
            return Err(Rejection::AlreadyNominated { alloc: id });
        }
        if epoch != a.reservation_epoch + 1 {
            return Err(Rejection::StaleReservationEpoch { alloc: id, expected: a.reservation_epoch + 1, got: epoch });
        }
        let slots = self.check_nodes(a, nodes, &BTreeMap::new())?;
        if let Some(reason) = self.quota_excess(a, &slots, None, &[]) {
            return Err(Rejection::QuotaExceeded { alloc: id, reason });
        }
        if let Some(reason) = self.borrow_excess(a, &slots, 0, 0) {
            return Err(Rejection::BorrowRefused { alloc: id, reason });
        }
        Ok(self.place_gang(id, &slots))
    }

    /// Checks a placement of gang `a`, task `i` on `nodes[i]`: one node per
    /// task, each known, distinct, ready, held for nobody, and with room for
    /// a task once `freed` (capacity about to be released there) is counted.
    pub(super) fn check_nodes(
        &self,
        a: &Allocation,
        nodes: &[NodeId],
        freed: &BTreeMap<NodeSlot, Usage>,
    ) -> Result<Vec<NodeSlot>, Rejection> {
        if nodes.len() != a.spec.gang_size as usize {
            return Err(Rejection::WrongNodeCount {
                alloc: a.id,
                expected: a.spec.gang_size,
                got: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            });
        }
        let mut slots = Vec::with_capacity(nodes.len());
        let mut seen = BTreeSet::new();
        for (task, node_id) in nodes.iter().enumerate() {
            let slot = self.node_slot(node_id).ok_or_else(|| Rejection::UnknownNode(node_id.clone()))?;
            if !seen.insert(slot) {
                return Err(Rejection::NodeRepeated(node_id.clone()));
            }
            let node = self.node(slot);
            if node.status != NodeStatus::Ready {
                return Err(Rejection::NodeNotReady(node_id.clone()));
            }
            if let Some(holder) = self.held_for(slot) {
                return Err(Rejection::NodeHeld { node: node_id.clone(), holder });
            }
            let free = node.free().plus(&freed.get(&slot).copied().unwrap_or_default());
            if !fits(&a.spec.resources, &node.resources, &free) {
                return Err(Rejection::InsufficientCapacity {
                    node: node_id.clone(),
                    alloc: a.id,
                    task: task as TaskIndex,
                });
            }
            if let Some(c) = a.spec.placement.unmet(&node.labels) {
                return Err(Rejection::ConstraintUnmet {
                    node: node_id.clone(),
                    alloc: a.id,
                    constraint: c.to_string(),
                });
            }
            if task == 0 && a.spec.ports > 0 {
                let free = self.free_port_count(slot);
                if free < a.spec.ports {
                    return Err(Rejection::NoFreePorts {
                        node: node_id.clone(),
                        alloc: a.id,
                        wanted: a.spec.ports,
                        free,
                    });
                }
            }
            slots.push(slot);
        }
        if let Some(p) = a.spec.placement.pack_by.as_ref().filter(|p| p.required) {
            let values: BTreeSet<Option<&String>> = slots.iter().map(|&s| self.node(s).labels.get(&p.key)).collect();
            if values.len() != 1 || values.contains(&None) {
                return Err(Rejection::PackingBroken { alloc: a.id, key: p.key.clone() });
            }
        }
        Ok(slots)
    }

    /// Whether `a` is a service running on a node of its own vCluster (the
    /// seed: services are preempted only on borrowed nodes).
    pub fn service_at_home(&self, a: &Allocation) -> bool {
        let own = self.home_key(&a.spec.vcluster);
        a.spec.vcluster_type == VClusterType::Service
            && a.tasks.iter().any(|t| t.node.is_some_and(|s| self.node_home(s) == own))
    }

    /// The home key each of `nodes` gets (home keys already assigned): the
    /// first vCluster (by name) that lists it explicitly, else the first
    /// whose home labels it carries, else 0.
    pub(super) fn homes_of<'n>(&self, nodes: impl Iterator<Item = &'n Node>) -> Vec<u32> {
        let builtin = HomeNodes::default_for(DEFAULT_VCLUSTER);
        let selectors: Vec<(u32, &HomeNodes)> = (1..self.home_keys())
            .map(|k| {
                let name = self.home_name(k).expect("every key names a vCluster");
                (k, self.vclusters.get(name).map_or(&builtin, |v| &v.spec.home))
            })
            .collect();
        // Explicit lists, the first name winning (later ones inserted first).
        let mut listed: BTreeMap<&NodeId, u32> = BTreeMap::new();
        for &(k, home) in selectors.iter().rev() {
            if let HomeNodes::Nodes(ids) = home {
                listed.extend(ids.iter().map(|id| (id, k)));
            }
        }
        nodes
            .map(|node| {
                listed.get(&node.id).copied().unwrap_or_else(|| {
                    let labelled = |(_, h): &&(u32, &HomeNodes)| matches!(h, HomeNodes::Labels(_)) && h.matches(node);
                    selectors.iter().find(labelled).map_or(0, |&(k, _)| k)
                })
            })
            .collect()
    }

    /// Reserves a queued gang (already checked) on `slots`, task `i` on
    /// `slots[i]`, under the next reservation epoch.
    pub(super) fn place_gang(&mut self, id: AllocId, slots: &[NodeSlot]) -> Vec<Event> {
        let now = self.now_ms;
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        for (task, &slot) in slots.iter().enumerate() {
            self.occupy(slot, &usage, (id, task as TaskIndex));
        }
        self.take_ports(id, slots[0]);
        let nodes = slots.iter().map(|&s| self.node(s).id.clone()).collect();
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked above");
        a.reservation_epoch += 1;
        let epoch = a.reservation_epoch;
        a.first_reserved_at_ms.get_or_insert(now);
        a.suspended = false;
        for (task, slot) in a.tasks.iter_mut().zip(slots) {
            task.status = TaskStatus::Reserved;
            task.node = Some(*slot);
            task.reservation_epoch = epoch;
            task.reserved_at_ms = Some(now);
            task.started_at_ms = None;
            task.drain_retries = 0;
        }
        self.refresh(id);
        // Out of the queue now (its key was removed with the flag as it was).
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked above");
        a.retry_first = false;
        a.avoid_nodes.clear();
        let mut events = vec![Event::GangReserved { alloc: id, epoch, nodes }];
        events.extend(self.unreachable_checkpoints(id));
        events
    }

    /// For each task of a gang just placed whose newest checkpoint is on a
    /// node that is gone: which one it restores instead (or a fresh start).
    fn unreachable_checkpoints(&self, id: AllocId) -> Vec<Event> {
        let a = &self.allocs[&id];
        let mut events = Vec::new();
        for t in &a.tasks {
            let Some(newest) = t.checkpoints.first() else { continue };
            if self.checkpoint_reachable(newest) {
                continue;
            }
            let from = t.checkpoints.iter().find(|m| self.checkpoint_reachable(m)).map(|m| m.seq);
            events.push(Event::CheckpointUnreachable {
                alloc: id,
                task: t.index,
                seq: newest.seq,
                writer: newest.writer.clone(),
                from,
            });
        }
        events
    }

    /// Returns an unclaimed reservation to the queue. When some tasks of the
    /// gang already run, rolling the rest back alone would leave them waiting
    /// for peers that never come (the gang-scheduling seed's stuck state):
    /// the first unclaimed task triggers a teardown instead (uncharged: it
    /// never started), and the gang avoids its node next time.
    pub(super) fn rollback_gang(&mut self, id: AllocId, epoch: u64) -> Applied {
        let a = self.live_alloc(id)?;
        if epoch != a.reservation_epoch {
            return Err(Rejection::StaleReservationEpoch { alloc: id, expected: a.reservation_epoch, got: epoch });
        }
        let Some(first) = a.tasks.iter().find(|t| t.status == TaskStatus::Reserved).map(|t| t.index) else {
            return Err(Rejection::NothingReserved { alloc: id });
        };
        let mut events = vec![Event::GangRolledBack { alloc: id, epoch }];
        if a.has_running() {
            events.extend(self.abandon_reserved(id, first, true));
        } else {
            self.release_reserved(id);
            events.extend(self.settle(id));
        }
        Ok(events)
    }

    /// An unclaimed task whose siblings run will never be claimed (its node
    /// died, or its reservation went stale): it returns to blocked uncharged
    /// (it never started: the seeds map an unclaimed reservation back to
    /// blocked), and triggers a teardown of the running siblings. A node that
    /// let a reservation go stale while it stays up is avoided by the gang's
    /// next placement, as after a watchdog trip.
    pub(super) fn abandon_reserved(&mut self, id: AllocId, task: TaskIndex, avoid_node: bool) -> Vec<Event> {
        let t = &self.allocs[&id].tasks[task as usize];
        let slot = t.node.expect("a reserved task has a node");
        let usage = Usage::of(&self.allocs[&id].spec.resources);
        self.release(slot, &usage, (id, task));
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let t = &mut a.tasks[task as usize];
        t.status = TaskStatus::Blocked;
        t.node = None;
        t.reserved_at_ms = None;
        if avoid_node && let Err(at) = a.avoid_nodes.binary_search(&slot) {
            a.avoid_nodes.insert(at, slot);
        }
        let mut events = vec![Event::TaskFailed { alloc: id, task, exit_code: None, charged: false }];
        events.extend(self.start_teardown_or_settle(id, task));
        events
    }

    pub(super) fn start_task(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64) -> Applied {
        self.check_report(id, task, node, epoch, &[TaskStatus::Reserved])?;
        let now = self.now_ms;
        let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
        t.status = TaskStatus::Running;
        t.attempts += 1;
        t.runs += 1;
        t.run_nodes.extend(t.node);
        t.started_at_ms = Some(now);
        t.exit_code = None;
        let attempt = t.runs;
        let slot = t.node.expect("a reserved task has a node");
        self.restart_walltime(id, slot);
        self.refresh(id);
        Ok(vec![Event::TaskStarted { alloc: id, task, node: node.clone(), attempt }])
    }

    /// A task's process exited successfully. During a teardown (the process
    /// finished before the preempt reached it) the task is done all the
    /// same: finished work is never overwritten, and the gang will fail at
    /// completion because it cannot be restarted whole.
    pub(super) fn finish_task(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64) -> Applied {
        let (slot, _) = self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        self.leave_node(id, task, slot, TaskStatus::Done, Some(0));
        let mut events = vec![Event::TaskFinished { alloc: id, task }];
        events.extend(self.settle(id));
        Ok(events)
    }

    /// A running task failed: charged to its gang's retry budget, noted as
    /// the gang's latest failure (with `report`, the tail or start error and
    /// whether it never started, when the command carried one), then retried
    /// in place on a draining node or torn down with its gang. A task already
    /// being stopped has simply stopped.
    pub(super) fn fail_task(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        exit_code: Option<i32>,
        report: Option<(&str, bool)>,
    ) -> Applied {
        let (slot, status) =
            self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        if status == TaskStatus::Preempting {
            let mut events = vec![
                Event::TaskFailed { alloc: id, task, exit_code, charged: false },
                self.stopped(id, task, slot, exit_code, false, false),
            ];
            events.extend(self.settle(id));
            return Ok(events);
        }
        self.note_failure(id, task, exit_code, report);
        if let Some(events) = self.retry_on_draining_node(id, task, slot, exit_code) {
            return Ok(events);
        }
        Ok(self.fail_running(id, task, slot, exit_code))
    }

    /// `FailTaskWithTail`: a failure with its stderr tail.
    pub(super) fn fail_task_with_tail(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        exit_code: Option<i32>,
        tail: &str,
    ) -> Applied {
        if tail.len() > MAX_FAILURE_TAIL_BYTES {
            return Err(Rejection::InvalidNode {
                field: "tail".into(),
                reason: format!("{} bytes, over {MAX_FAILURE_TAIL_BYTES}", tail.len()),
            });
        }
        self.fail_task(id, task, node, epoch, exit_code, Some((tail, false)))
    }

    /// A claimed task that could not start: failed like any other failure
    /// (with no exit code), with the agent's reason in its events first.
    pub(super) fn fail_task_to_start(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        reason: &str,
    ) -> Applied {
        check_agent_reason(reason)?;
        let mut events = self.fail_task(id, task, node, epoch, None, Some((reason, true)))?;
        events.insert(0, Event::TaskStartFailed { alloc: id, task, node: node.clone(), reason: reason.to_string() });
        Ok(events)
    }

    /// Charges a failure to the gang's budget (one per gang run: only a
    /// running task's failure gets here, and it tears the rest down); a
    /// failure of the task's own making (not a lost node) also starts its
    /// back-off.
    pub(super) fn charge_gang_failure(&mut self, id: AllocId, backoff: bool) {
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        a.failures += 1;
        if backoff {
            a.retry_after_ms = now.saturating_add(self.limits.retry_backoff(a.failures));
        }
    }

    /// The fail-fast rule: a task's failure is charged and remembered; when
    /// it is early (within `early_failure_ms` of its start, or no start at
    /// all) and looks like the gang's previous failure, also early (the same
    /// way of ending and the same stderr tail, paths and numbers masked), the
    /// gang is not retried again: it fails once nothing of it runs.
    fn note_failure(&mut self, id: AllocId, task: TaskIndex, exit_code: Option<i32>, report: Option<(&str, bool)>) {
        self.charge_gang_failure(id, true);
        let usage = self.touched.usage;
        let now = self.now_ms;
        let early_ms = self.limits.early_failure_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let t = &a.tasks[task as usize];
        let not_started = report.is_some_and(|(_, n)| n);
        let oom = usage
            .filter(|(alloc, t, u)| (*alloc, *t) == (id, task) && u.oom_killed())
            .map(|(_, _, u)| OomKill { limit_bytes: u.memory_limit_bytes, peak_bytes: u.peak_memory_bytes });
        let failure = Failure {
            task,
            run: t.runs,
            exit_code,
            not_started,
            tail: report.map(|(tail, _)| failure_tail(tail)),
            early: not_started || t.started_at_ms.is_none_or(|at| now.saturating_sub(at) < early_ms),
            at_ms: now,
            oom,
        };
        let repeated = failure.early
            && a.last_failure.as_ref().is_some_and(|prev| {
                prev.early && failure.signature().is_some_and(|sig| prev.signature().as_ref() == Some(&sig))
            });
        // Out of memory twice in a row at the same limit: a third run at
        // that limit would end the same way, however long each takes.
        if let Some(oom) = &failure.oom
            && a.give_up.is_none()
            && a.last_failure.as_ref().is_some_and(|prev| prev.oom.is_some_and(|p| p.limit_bytes == oom.limit_bytes))
        {
            a.give_up = Some(format!("task {task} ran {} twice in a row: raise --mem-mb", oom.describe()));
        }
        if repeated && a.give_up.is_none() {
            let mut reason = format!(
                "task {task} failed the same way twice within {} s of starting ({})",
                early_ms / 1000,
                failure.how()
            );
            if let Some(line) = failure.error_line() {
                reason.push_str(": ");
                reason.push_str(&clip_line(line));
            }
            a.give_up = Some(reason);
        }
        a.last_failure = Some(failure);
    }

    /// The seed's failure during drain: a single task that fails on its
    /// draining node (not yet stopping) is reserved there again, under a new
    /// reservation epoch, while it has retries left and has been retried
    /// there fewer than `drain_max_retries` times; its capacity never leaves
    /// the node. A gang task goes through teardown instead (its peers run
    /// elsewhere), and so does a task past either limit.
    pub(super) fn retry_on_draining_node(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        exit_code: Option<i32>,
    ) -> Option<Vec<Event>> {
        let a = &self.allocs[&id];
        let t = &a.tasks[task as usize];
        if self.node(slot).status != NodeStatus::Draining
            || a.spec.gang_size != 1
            || t.attempts >= a.spec.max_retries
            || a.failures >= a.spec.max_retries
            || a.give_up.is_some()
            || t.drain_retries >= self.limits.drain_max_retries
        {
            return None;
        }
        let now = self.now_ms;
        let node = self.node(slot).id.clone();
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        a.reservation_epoch += 1;
        let epoch = a.reservation_epoch;
        let t = &mut a.tasks[task as usize];
        t.status = TaskStatus::Reserved;
        t.reservation_epoch = epoch;
        t.reserved_at_ms = Some(now);
        t.started_at_ms = None;
        t.finished_at_ms = Some(now);
        t.exit_code = exit_code;
        t.drain_retries += 1;
        let retry = t.drain_retries;
        self.restart_walltime(id, slot);
        self.refresh(id);
        Some(vec![
            Event::TaskFailed { alloc: id, task, exit_code, charged: true },
            Event::RetriedOnDrainingNode { alloc: id, task, node, epoch, retry },
        ])
    }

    /// A watchdog stopped a running task: it leaves its node (the capacity
    /// is free in this same command), is refunded its attempt (a wedge is
    /// not a failure of the retry budget), counts a trip, and, like a
    /// failure, tears down its running siblings or settles the gang. The
    /// gang goes first in its class and avoids this node on its next
    /// placement; past the cap, `settle` fails it with the reason. A task
    /// already being preempted has simply stopped.
    pub(super) fn trip_watchdog(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        kind: crate::sm::types::WatchdogKind,
    ) -> Applied {
        let (slot, status) =
            self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let cap = self.limits.watchdog_max_retries;
        if status == TaskStatus::Preempting {
            let mut events = vec![self.stopped(id, task, slot, None, false, false)];
            events.extend(self.settle(id));
            return Ok(events);
        }
        let a = self.leave_uncharged(id, task, slot);
        let t = &mut a.tasks[task as usize];
        t.watchdog_trips += 1;
        t.last_watchdog = Some(kind);
        let trips = t.watchdog_trips;
        a.retry_first = true;
        let mut events =
            vec![Event::WatchdogTripped { alloc: id, task, node: node.clone(), kind, trips, retried: trips <= cap }];
        events.extend(self.start_teardown_or_settle(id, task));
        Ok(events)
    }

    /// A claimed task whose image could not be pulled: it never ran, so,
    /// as after a watchdog trip, it leaves its node uncharged (its attempt
    /// refunded, nothing spent of the retry budget, no fail-fast
    /// signature) and the gang avoids the node on its next placement, after
    /// the failure back-off (a registry may be down for a while). The
    /// allocation's [`MAX_IMAGE_PULL_FAILURES`]th pull failure fails it
    /// with `image_pull_failed` and the registry's message. A task already
    /// being stopped has simply stopped.
    pub(super) fn fail_image_pull(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        reason: &str,
    ) -> Applied {
        check_agent_reason(reason)?;
        let (slot, status) =
            self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        if status == TaskStatus::Preempting {
            let mut events = vec![self.stopped(id, task, slot, None, false, false)];
            events.extend(self.settle(id));
            return Ok(events);
        }
        let failures = self.allocs[&id].image_pull_failures + 1;
        let retry_after_ms = self.now_ms.saturating_add(self.limits.retry_backoff(failures));
        let a = self.leave_uncharged(id, task, slot);
        a.image_pull_failures = failures;
        a.retry_after_ms = retry_after_ms;
        let retried = failures < MAX_IMAGE_PULL_FAILURES;
        if !retried && a.give_up.is_none() {
            a.give_up = Some(format!("image_pull_failed: {}", clip_line(reason)));
        }
        let mut events = vec![
            Event::TaskFailed { alloc: id, task, exit_code: None, charged: false },
            Event::ImagePullFailed {
                alloc: id,
                task,
                node: node.clone(),
                reason: reason.to_string(),
                failures,
                retried,
            },
        ];
        events.extend(self.start_teardown_or_settle(id, task));
        Ok(events)
    }

    /// A running task leaves its node without being charged (a watchdog
    /// trip, an image that could not be pulled): its capacity is free in
    /// this command, its attempt is refunded, and the gang's next placement
    /// avoids the node. Returns the allocation, for the caller's own marks.
    fn leave_uncharged(&mut self, id: AllocId, task: TaskIndex, slot: NodeSlot) -> &mut Allocation {
        self.leave_node(id, task, slot, TaskStatus::Blocked, None);
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let t = &mut a.tasks[task as usize];
        t.node = None;
        t.attempts = t.attempts.saturating_sub(1);
        if let Err(at) = a.avoid_nodes.binary_search(&slot) {
            a.avoid_nodes.insert(at, slot);
        }
        a
    }

    /// Fails a running task (already checked): the body of `FailTask`, also
    /// used when its node is lost. The task keeps its claim-time attempt.
    pub(super) fn fail_running(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        slot: NodeSlot,
        exit_code: Option<i32>,
    ) -> Vec<Event> {
        self.leave_node(id, task, slot, TaskStatus::Blocked, exit_code);
        self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize].node = None;
        let mut events = vec![Event::TaskFailed { alloc: id, task, exit_code, charged: true }];
        events.extend(self.start_teardown_or_settle(id, task));
        events
    }
}

/// Most bytes of an error line quoted in a reason.
const MAX_REASON_LINE_BYTES: usize = 300;

/// An error line cut to [`MAX_REASON_LINE_BYTES`] (at a character, with "…").
pub(super) fn clip_line(line: &str) -> String {
    if line.len() <= MAX_REASON_LINE_BYTES {
        return line.to_string();
    }
    let mut end = MAX_REASON_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}
