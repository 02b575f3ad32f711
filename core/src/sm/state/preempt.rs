//! Priority preemption and reclamation: decisions, held nodes (nominations), victims released.

use super::*;
use std::sync::Arc;

impl State {
    /// Victim `victim` of preemptor `by` no longer holds capacity. When it
    /// was the last one the preemptor waited for, the preemptor is reserved
    /// on its held nodes now (or, if one of them can no longer take it, its
    /// hold is dropped and it waits in the queue like any gang).
    pub(super) fn victim_released(&mut self, victim: AllocId, by: AllocId) -> Vec<Event> {
        let Some(p) = self.allocs.get_mut(&by).map(Arc::make_mut) else { return Vec::new() };
        let Some(nomination) = p.nomination.as_mut() else { return Vec::new() };
        nomination.waiting_for.retain(|&v| v != victim);
        if !nomination.waiting_for.is_empty() {
            return Vec::new();
        }
        let slots = nomination.nodes.clone();
        let need = p.spec.resources;
        let unusable = slots.iter().find(|&&slot| {
            let node = self.node(slot);
            node.status != NodeStatus::Ready || !fits(&need, &node.resources, &node.free())
        });
        let reason = unusable
            .map(|&slot| format!("held node {} can no longer take a task", self.node(slot).id))
            .or_else(|| self.quota_excess(&self.allocs[&by], &slots, None, &[]));
        self.drop_nomination(by);
        match reason {
            None => self.place_gang(by, &slots),
            Some(reason) => vec![Event::NominationDropped { alloc: by, reason }],
        }
    }

    /// Lets a preemptor's held nodes go (it returns to the queue).
    pub(super) fn drop_nomination(&mut self, id: AllocId) {
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let Some(nomination) = a.nomination.take() else { return };
        for slot in nomination.nodes {
            self.unindex_node(slot);
            self.index.held.remove(&slot);
            self.index_node(slot);
        }
        self.reindex_alloc(id);
    }

    /// The seed's preemption decision, committed: every victim's running
    /// tasks move to preempting under a new preemption epoch (refunded: a
    /// victim is not at fault), and the preemptor's nodes are held for it.
    /// Everything is checked first: the preemptor is queued and holds no
    /// nodes; each victim is running whole, in the reservation the decision
    /// saw, of a lower class, and preemptible; each node is ready, held for
    /// nobody, a home (or shared) node of the preemptor's vCluster, and
    /// takes one of the preemptor's tasks once the victims' tasks on it are
    /// gone.
    ///
    /// A reclamation (`reclaim`) is the same but for its victims: gangs of
    /// other vClusters running on borrowed nodes of the preemptor's
    /// vCluster, whatever their class.
    pub(super) fn preempt(
        &mut self,
        id: AllocId,
        victims: &[(AllocId, u64)],
        nodes: &[NodeId],
        hold_ms: u64,
        reclaim: bool,
    ) -> Applied {
        let p = self.live_alloc(id)?;
        if !p.is_queued() {
            return Err(Rejection::NotQueued { alloc: id, status: p.status });
        }
        if p.nomination.is_some() {
            return Err(Rejection::AlreadyNominated { alloc: id });
        }
        if nodes.len() != p.spec.gang_size as usize {
            return Err(Rejection::WrongNodeCount {
                alloc: id,
                expected: p.spec.gang_size,
                got: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            });
        }
        let class = p.spec.preemption_class;
        let home = self.home_key(&p.spec.vcluster);
        let reason = if reclaim {
            PreemptReason::Reclaim
        } else if p.spec.is_sensitive() {
            PreemptReason::Sensitive
        } else {
            PreemptReason::Priority
        };
        let not = |victim: AllocId, reason: String| Rejection::NotPreemptible { alloc: id, victim, reason };
        if victims.is_empty() {
            return Err(not(0, "a preemption needs at least one victim".into()));
        }
        if !reclaim && p.failed_before() {
            return Err(not(0, "a gang that failed before never preempts: its retry waits for free nodes".into()));
        }
        let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut victim_vclusters = Vec::with_capacity(victims.len());
        for &(v, epoch) in victims {
            if v == id || !seen.insert(v) {
                return Err(not(v, "named twice, or the preemptor itself".into()));
            }
            let a = self.live_alloc(v)?;
            if a.status != AllocStatus::Running || a.tasks.iter().any(|t| t.status != TaskStatus::Running) {
                return Err(not(v, format!("it is {:?}, not running whole", a.status).to_lowercase()));
            }
            if a.reservation_epoch != epoch {
                return Err(Rejection::StaleReservationEpoch { alloc: v, expected: a.reservation_epoch, got: epoch });
            }
            if let Some(why) = a.spec.never_preempted() {
                return Err(not(v, why.into()));
            }
            if reclaim {
                let borrows_here = a.tasks.iter().any(|t| t.node.is_some_and(|s| self.node_home(s) == home));
                if self.home_key(&a.spec.vcluster) == home || !borrows_here {
                    return Err(not(v, "it runs on no node it borrowed from the reclaiming vCluster".into()));
                }
            } else if a.spec.preemption_class >= class {
                return Err(not(v, format!("its class {} is not below {class}", a.spec.preemption_class)));
            }
            if !reclaim && self.service_at_home(a) {
                return Err(not(v, "service allocations are preempted only on borrowed nodes".into()));
            }
            victim_vclusters.push(a.spec.vcluster.clone());
            let usage = Usage::of(&a.spec.resources);
            for t in &a.tasks {
                let slot = t.node.expect("a running task has a node");
                let f = freed.entry(slot).or_default();
                *f = f.plus(&usage);
            }
        }
        let slots = self.check_nodes(&self.allocs[&id], nodes, &freed)?;
        let p = &self.allocs[&id];
        if let Some((slot, from)) = slots.iter().find_map(|&s| self.borrowed_from(s, p).map(|from| (s, from))) {
            let node = &self.node(slot).id;
            let reason = format!("node {node} is vCluster {from}'s: a preemption takes nodes only at home");
            return Err(Rejection::BorrowRefused { alloc: id, reason });
        }
        let now = self.now_ms;
        let victim_ids: Vec<AllocId> = victims.iter().map(|&(v, _)| v).collect();
        if let Some(reason) = self.quota_excess(&self.allocs[&id], &slots, None, &victim_ids) {
            return Err(Rejection::QuotaExceeded { alloc: id, reason });
        }
        let mut events = vec![Event::PreemptionDecided {
            alloc: id,
            victims: victim_ids.clone(),
            nodes: nodes.to_vec(),
            reason,
            victim_vclusters,
        }];
        for &slot in &slots {
            self.unindex_node(slot);
            self.index.held.insert(slot, id);
        }
        let p = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        p.nomination = Some(Nomination {
            nodes: slots,
            waiting_for: victim_ids.clone(),
            decided_at_ms: now,
            expires_at_ms: now.saturating_add(hold_ms),
        });
        self.reindex_alloc(id);
        for v in victim_ids {
            events.push(self.begin_teardown(v, TeardownCause::Preempted { by: id, reason }));
        }
        Ok(events)
    }

    /// A preemptor's hold outlived its deadline: the nodes are let go.
    pub(super) fn expire_nomination(&mut self, id: AllocId) -> Applied {
        let a = self.live_alloc(id)?;
        let n = a.nomination.as_ref().ok_or(Rejection::NotNominated { alloc: id })?;
        if self.now_ms < n.expires_at_ms {
            return Err(Rejection::NominationNotExpired { alloc: id, expires_at_ms: n.expires_at_ms });
        }
        let waiting = n.waiting_for.len();
        self.drop_nomination(id);
        Ok(vec![Event::NominationDropped {
            alloc: id,
            reason: format!("the hold expired with {waiting} victim(s) still stopping"),
        }])
    }

    /// Returns every unclaimed reservation of a gang to blocked; how many.
    pub(super) fn release_reserved(&mut self, id: AllocId) -> u32 {
        let a = &self.allocs[&id];
        let usage = Usage::of(&a.spec.resources);
        let reserved: Vec<(TaskIndex, NodeSlot)> = a
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Reserved)
            .map(|t| (t.index, t.node.expect("a reserved task has a node")))
            .collect();
        let count = reserved.len() as u32;
        for (task, slot) in reserved {
            self.release(slot, &usage, (id, task));
            let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
            t.status = TaskStatus::Blocked;
            t.node = None;
            t.reserved_at_ms = None;
        }
        count
    }
}
