//! Node registration and lifecycle (docs/nodes.md): ready, drain, stop, restart, terminate, lost.

use super::*;
use crate::sm::{MAX_NODE_IMAGES, is_image_digest};

impl State {
    /// A new node joins as pending (its agent proposes `MarkNodeReady` once it
    /// has reconciled). A known node's resources and labels are updated; a
    /// lost one is ready again; every other status is kept (a draining or
    /// stopped node whose agent restarts stays out of service), and a
    /// terminated one is refused.
    pub(super) fn register_node(
        &mut self,
        id: &NodeId,
        resources: &Resources,
        reported: &BTreeMap<String, String>,
    ) -> Applied {
        if let Some(k) = reported.keys().find(|k| !agent_may_set(k)) {
            return Err(Rejection::InvalidNode {
                field: "labels".into(),
                reason: format!("{k} is reserved: only an admin sets it (muster node label)"),
            });
        }
        validate_node(id, resources, reported, &self.limits)?;
        let policy = self.node_policies.get(id);
        if let Some(why) = policy.and_then(|p| p.admission.as_ref()).and_then(|a| a.refuses(resources, reported)) {
            return Err(Rejection::NotAdmitted { node: id.clone(), reason: why });
        }
        let mut labels = reported.clone();
        labels.extend(policy.map(|p| p.labels.clone()).unwrap_or_default());
        validate_node(id, resources, &labels, &self.limits)?;
        if let Some(slot) = self.node_slot(id) {
            let node = self.node(slot);
            if node.status == NodeStatus::Terminated {
                return Err(Rejection::NodeTerminated(id.clone()));
            }
            if !Usage::of(resources).covers(&node.used) {
                return Err(Rejection::ShrinkBelowUsage(id.clone()));
            }
            let was_lost = node.status == NodeStatus::Lost;
            self.nodes[slot.0 as usize].reported_labels = reported.clone();
            self.relabel(slot, resources, labels);
            if was_lost {
                self.set_node_status(slot, NodeStatus::Ready);
            }
            return Ok(vec![Event::NodeRegistered { node: id.clone(), updated: true }]);
        }
        let slot = NodeSlot(u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes"));
        self.nodes.push(Node {
            id: id.clone(),
            slot,
            resources: *resources,
            labels,
            reported_labels: reported.clone(),
            status: NodeStatus::Pending,
            status_since_ms: self.now_ms,
            drain: None,
            used: Usage::default(),
            registered_at_ms: self.now_ms,
            revision: 0,
            history: Default::default(),
            images: Vec::new(),
        });
        self.index.node_by_id.insert(id.clone(), slot);
        self.index.holders.push(Vec::new());
        let home = self.homes_of(std::iter::once(self.node(slot)));
        self.index.node_home.extend(home);
        self.index.by_status.entry(NodeStatus::Pending).or_default().insert(slot);
        Ok(vec![Event::NodeRegistered { node: id.clone(), updated: false }])
    }

    /// Gives a registered node new resources and labels, keeping the
    /// indexes (and, when its home changed, which tasks are borrowed) right.
    fn relabel(&mut self, slot: NodeSlot, resources: &Resources, labels: BTreeMap<String, String>) {
        self.unindex_node(slot);
        let node = &mut self.nodes[slot.0 as usize];
        node.resources = *resources;
        node.labels = labels;
        self.index_node(slot);
        if self.homes_of(std::iter::once(self.node(slot))) != [self.node_home(slot)] {
            // Its home changed: which tasks are borrowed changes too.
            self.rebuild_indexes();
        }
        self.touched.nodes.insert(slot);
    }

    /// Records (or withdraws) what node `id` is admitted for. A registered
    /// node keeps what it has until it registers again.
    pub(super) fn admit_node(&mut self, id: &NodeId, admission: Option<&Admission>) -> Applied {
        check_name("node_id", id.as_str(), &self.limits).map_err(|r| invalid_node("node_id", r))?;
        if let Some(a) = admission {
            validate_admission(a, &self.limits)?;
        }
        let policy = self.node_policies.entry(id.clone()).or_default();
        policy.admission = admission.cloned();
        if policy.is_empty() {
            self.node_policies.remove(id);
        }
        Ok(vec![Event::NodeAdmitted { node: id.clone(), admitted: admission.is_some() }])
    }

    /// Sets and removes admin labels of node `id`; a registered node's
    /// labels change at once.
    pub(super) fn label_node(
        &mut self,
        id: &NodeId,
        set: &BTreeMap<String, String>,
        remove: &[String],
        by: &str,
    ) -> Applied {
        check_name("node_id", id.as_str(), &self.limits).map_err(|r| invalid_node("node_id", r))?;
        check_name("by", by, &self.limits).map_err(|r| invalid_node("by", r))?;
        if let Some(k) = remove.iter().find(|k| set.contains_key(*k)) {
            return Err(invalid_node("remove", format!("{k} is both set and removed")));
        }
        if let Some(k) = set.keys().chain(remove).find(|k| AGENT_SET_LABELS.contains(&k.as_str())) {
            return Err(invalid_node("labels", format!("{k} comes from the agent's registration")));
        }
        let mut admin = self.node_policies.get(id).map(|p| p.labels.clone()).unwrap_or_default();
        for k in remove {
            admin.remove(k);
        }
        admin.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        let slot = self.node_slot(id);
        let reported = slot.map(|s| self.node(s).reported_labels.clone()).unwrap_or_default();
        let mut labels = reported;
        labels.extend(admin.clone());
        let resources = slot.map_or(Resources { gpus: 0, vram_mb: 0, mem_mb: 1, cpus: 1 }, |s| self.node(s).resources);
        validate_node(id, &resources, &labels, &self.limits)?;
        let policy = self.node_policies.entry(id.clone()).or_default();
        policy.labels = admin;
        if policy.is_empty() {
            self.node_policies.remove(id);
        }
        if let Some(slot) = slot {
            self.relabel(slot, &resources, labels);
        }
        Ok(vec![Event::NodeLabelled { node: id.clone(), by: by.to_string() }])
    }

    /// What admins decided about node `id`, if anything.
    pub fn node_policy(&self, id: &NodeId) -> Option<&NodePolicy> {
        self.node_policies.get(id)
    }

    /// Every node name admins decided something about, in name order.
    pub fn node_policies(&self) -> &BTreeMap<NodeId, NodePolicy> {
        &self.node_policies
    }

    /// The slot of node `id`, if its status is one of `allowed` for `action`.
    pub(super) fn node_for(&self, id: &NodeId, action: &str, allowed: &[NodeStatus]) -> Result<NodeSlot, Rejection> {
        let slot = self.node_slot(id).ok_or_else(|| Rejection::UnknownNode(id.clone()))?;
        let from = self.node(slot).status;
        if !allowed.contains(&from) {
            return Err(Rejection::IllegalNodeTransition {
                node: id.clone(),
                from,
                action: action.to_string(),
                allowed: allowed.to_vec(),
            });
        }
        Ok(slot)
    }

    /// Moves a node to `status`, keeping every index in step.
    pub(super) fn set_node_status(&mut self, slot: NodeSlot, status: NodeStatus) {
        self.touched.nodes.insert(slot);
        let old = self.node(slot).status;
        self.unindex_node(slot);
        if let Some(set) = self.index.by_status.get_mut(&old) {
            set.remove(&slot);
            if set.is_empty() {
                self.index.by_status.remove(&old);
            }
        }
        let now = self.now_ms;
        let node = &mut self.nodes[slot.0 as usize];
        node.status = status;
        node.status_since_ms = now;
        if !matches!(status, NodeStatus::Draining | NodeStatus::Stopping) {
            node.drain = None;
        }
        self.index.by_status.entry(status).or_default().insert(slot);
        self.index_node(slot);
    }

    /// Lets go of a preemptor's hold on `slot`, if there is one: a node
    /// leaving service cannot take the preemptor (it queues again; its
    /// victims still stop).
    pub(super) fn release_hold(&mut self, slot: NodeSlot, why: &str) -> Vec<Event> {
        let Some(holder) = self.held_for(slot) else { return Vec::new() };
        self.drop_nomination(holder);
        vec![Event::NominationDropped { alloc: holder, reason: format!("held node {} {why}", self.node(slot).id) }]
    }

    /// The image digests a node's cache holds, replacing those it held: at
    /// most [`MAX_NODE_IMAGES`], each a `sha256:` digest, kept sorted and
    /// without repeats. The same set again changes nothing.
    pub(super) fn set_node_images(&mut self, id: &NodeId, digests: &[String]) -> Applied {
        let slot = self.node_slot(id).ok_or_else(|| Rejection::UnknownNode(id.clone()))?;
        if digests.len() > MAX_NODE_IMAGES {
            return Err(Rejection::InvalidNode {
                field: "images".into(),
                reason: format!("{} digests, over {MAX_NODE_IMAGES}", digests.len()),
            });
        }
        if let Some(bad) = digests.iter().find(|d| !is_image_digest(d)) {
            return Err(Rejection::InvalidNode {
                field: "images".into(),
                reason: format!("{:?} is not an image digest (sha256:<64 hex digits>)", super::gangs::clip_line(bad)),
            });
        }
        let sorted = image_set(digests);
        let node = &mut self.nodes[slot.0 as usize];
        if node.images == sorted {
            return Ok(Vec::new());
        }
        let count = sorted.len() as u32;
        node.images = sorted;
        Ok(vec![Event::NodeImagesChanged { node: id.clone(), count }])
    }

    /// Whether node `id` holds exactly these images already: a
    /// `SetNodeImages` of them would change nothing.
    pub fn holds_images(&self, id: &NodeId, digests: &[String]) -> bool {
        self.node_slot(id).is_some_and(|slot| self.node(slot).images == image_set(digests))
    }

    pub(super) fn node_ready(&mut self, id: &NodeId) -> Applied {
        let slot = self.node_for(id, "become ready", &[NodeStatus::Pending])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::NodeReady { node: id.clone() }])
    }

    /// The seed's `start_draining`: only a ready node drains (the seed's 409
    /// otherwise). Its holds are let go; an empty node stops at once.
    pub(super) fn drain_node(&mut self, id: &NodeId, timeout_ms: u64, reason: &str, by: &str) -> Applied {
        validate_node_request(by, reason, Some(timeout_ms), &self.limits)?;
        let slot = self.node_for(id, "drain", &[NodeStatus::Ready])?;
        let now = self.now_ms;
        let deadline_ms = now.saturating_add(timeout_ms);
        let mut events = self.release_hold(slot, "is draining");
        self.set_node_status(slot, NodeStatus::Draining);
        self.nodes[slot.0 as usize].drain =
            Some(Drain { started_at_ms: now, deadline_ms, reason: reason.to_string(), by: by.to_string() });
        let tasks = self.tasks_on_node(slot).count() as u32;
        if tasks == 0 {
            self.index.emptied.push(slot);
        }
        events.insert(
            0,
            Event::DrainStarted {
                node: id.clone(),
                by: by.to_string(),
                reason: reason.to_string(),
                deadline_ms,
                tasks,
            },
        );
        Ok(events)
    }

    pub(super) fn cancel_drain(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "cancel a drain", &[NodeStatus::Draining])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::DrainCancelled { node: id.clone(), by: by.to_string() }])
    }

    /// The seed's drain timeout: the node is stopping, and every gang on it
    /// is preempted the proper way (a teardown that asks for a checkpoint,
    /// or SIGTERM where the gang cannot checkpoint; its tasks elsewhere go
    /// too, since a gang runs whole) to resume elsewhere, uncharged. A gang
    /// with only unclaimed reservations here is simply requeued. The node
    /// stops when its last task has left.
    pub(super) fn expire_drain(&mut self, id: &NodeId) -> Applied {
        let slot = self.node_for(id, "time out a drain", &[NodeStatus::Draining])?;
        let deadline_ms = self.node(slot).drain.as_ref().expect("a draining node has a drain").deadline_ms;
        if self.now_ms < deadline_ms {
            return Err(Rejection::DrainNotExpired { node: id.clone(), deadline_ms });
        }
        let mut allocs: Vec<AllocId> = self.tasks_on_node(slot).map(|(a, _)| a).collect();
        allocs.dedup();
        self.set_node_status(slot, NodeStatus::Stopping);
        let mut events = vec![Event::DrainTimedOut { node: id.clone(), allocs: allocs.clone() }];
        for alloc in allocs {
            let a = &self.allocs[&alloc];
            if a.teardown.is_some() {
                continue; // already stopping; its tasks here leave when they ack
            }
            if a.has_running() {
                events.push(self.begin_teardown(alloc, TeardownCause::NodeDrain));
            } else {
                self.release_reserved(alloc);
                events.extend(self.settle(alloc));
            }
        }
        if self.tasks_on_node(slot).next().is_none() {
            self.index.emptied.push(slot);
        }
        Ok(events)
    }

    /// The seed's direct transition to stopped, for a node holding nothing.
    pub(super) fn stop_node(&mut self, id: &NodeId, reason: &str, by: &str) -> Applied {
        validate_node_request(by, reason, None, &self.limits)?;
        let allowed = [NodeStatus::Ready, NodeStatus::Draining, NodeStatus::Stopping, NodeStatus::Lost];
        let slot = self.node_for(id, "stop", &allowed)?;
        let tasks = self.tasks_on_node(slot).count() as u32;
        if tasks > 0 {
            return Err(Rejection::NodeBusy { node: id.clone(), tasks });
        }
        let now = self.now_ms;
        let drain_ms = self.node(slot).drain.as_ref().map(|d| now.saturating_sub(d.started_at_ms));
        let mut events = self.release_hold(slot, "was stopped");
        self.set_node_status(slot, NodeStatus::Stopped);
        let reason = if reason.is_empty() { "stopped by an operator".to_string() } else { reason.to_string() };
        events.insert(0, Event::NodeStopped { node: id.clone(), by: Some(by.to_string()), reason, drain_ms });
        Ok(events)
    }

    pub(super) fn restart_node(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "restart", &[NodeStatus::Stopped])?;
        self.set_node_status(slot, NodeStatus::Ready);
        Ok(vec![Event::NodeRestarted { node: id.clone(), by: by.to_string() }])
    }

    pub(super) fn terminate_node(&mut self, id: &NodeId, by: &str) -> Applied {
        validate_node_request(by, "", None, &self.limits)?;
        let slot = self.node_for(id, "terminate", &[NodeStatus::Stopped])?;
        self.set_node_status(slot, NodeStatus::Terminated);
        self.reassign_retired(id);
        Ok(vec![Event::NodeTerminated { node: id.clone(), by: by.to_string() }])
    }

    /// Draining or stopping nodes whose last task left during this command
    /// stop now (the seed's `check_drain_completion`): draining → stopping
    /// → stopped, or stopping → stopped after a timed-out drain.
    pub(super) fn stop_emptied_nodes(&mut self) -> Vec<Event> {
        let mut slots = std::mem::take(&mut self.index.emptied);
        slots.sort_unstable();
        slots.dedup();
        let now = self.now_ms;
        let mut events = Vec::new();
        for slot in slots {
            let node = self.node(slot);
            let status = node.status;
            if !matches!(status, NodeStatus::Draining | NodeStatus::Stopping)
                || self.tasks_on_node(slot).next().is_some()
            {
                continue;
            }
            let id = node.id.clone();
            let drain_ms = now.saturating_sub(node.drain.as_ref().expect("a draining node has a drain").started_at_ms);
            let reason = if status == NodeStatus::Draining {
                events.push(Event::DrainCompleted { node: id.clone(), drain_ms });
                self.set_node_status(slot, NodeStatus::Stopping);
                "drain completed: no work left".to_string()
            } else {
                "drain deadline passed: its remaining work was moved".to_string()
            };
            self.set_node_status(slot, NodeStatus::Stopped);
            events.push(Event::NodeStopped { node: id, by: None, reason, drain_ms: Some(drain_ms) });
        }
        events
    }

    /// A node stopped answering while holding work: it takes no more, and
    /// every task on it ends: a running task fails (charged; its running
    /// siblings are torn down), an unclaimed one fails to start (charged, and
    /// a teardown if siblings run; otherwise its gang's reservation is simply
    /// released), and a preempting one is preempted (its process is presumed
    /// gone with the node). Re-registering makes it ready again.
    ///
    /// A draining or stopping node that goes silent is stopped instead of
    /// lost: its drain wanted it empty and out of service, and losing it
    /// did both (its agent coming back finds it stopped, not ready).
    pub(super) fn mark_node_lost(&mut self, node: &NodeId) -> Applied {
        let allowed = [NodeStatus::Ready, NodeStatus::Draining, NodeStatus::Stopping];
        let slot = self.node_for(node, "be marked lost", &allowed)?;
        let tasks: Vec<(AllocId, TaskIndex)> = self.tasks_on_node(slot).collect();
        let now = self.now_ms;
        let drain_ms = self.node(slot).drain.as_ref().map(|d| now.saturating_sub(d.started_at_ms));
        let mut events = vec![Event::NodeLost { node: node.clone(), tasks: tasks.clone() }];
        match drain_ms {
            None => self.set_node_status(slot, NodeStatus::Lost),
            Some(_) => {
                self.set_node_status(slot, NodeStatus::Stopped);
                events.push(Event::NodeStopped {
                    node: node.clone(),
                    by: None,
                    reason: "lost while draining: its tasks were failed over".to_string(),
                    drain_ms,
                });
            }
        }
        for (id, task) in tasks {
            let t = &self.allocs[&id].tasks[task as usize];
            if t.node != Some(slot) {
                continue; // already moved off by an earlier task of the same gang
            }
            match t.status {
                TaskStatus::Running => {
                    self.charge_gang_failure(id, false);
                    events.extend(self.fail_running(id, task, slot, None))
                }
                TaskStatus::Reserved if self.allocs[&id].has_running() => {
                    events.extend(self.abandon_reserved(id, task, false))
                }
                TaskStatus::Reserved => {
                    self.release_reserved(id);
                    events.extend(self.settle(id));
                }
                TaskStatus::Preempting => {
                    events.push(self.stopped(id, task, slot, None, true, false));
                    events.extend(self.settle(id));
                }
                other => unreachable!("task {id}/{task} on a node while {other:?}"),
            }
        }
        Ok(events)
    }
}

/// Digests as a node keeps them: sorted, without repeats.
fn image_set(digests: &[String]) -> Vec<String> {
    let mut set = digests.to_vec();
    set.sort_unstable();
    set.dedup();
    set
}
