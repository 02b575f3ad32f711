//! vClusters: create and update, home nodes, quotas and their loads.

use super::*;
use std::sync::Arc;

impl State {
    /// A vCluster by name (the built-in `default` even if never changed).
    pub fn vcluster(&self, name: &str) -> Option<VCluster> {
        match self.vclusters.get(name) {
            Some(v) => Some(v.clone()),
            None => (name == DEFAULT_VCLUSTER).then(VCluster::builtin_default),
        }
    }

    /// Every vCluster by name, the built-in `default` included.
    pub fn vclusters(&self) -> Vec<VCluster> {
        let mut all: Vec<VCluster> = self.vclusters.values().cloned().collect();
        if !self.vclusters.contains_key(DEFAULT_VCLUSTER) {
            all.push(VCluster::builtin_default());
            all.sort_by(|a, b| a.name.cmp(&b.name));
        }
        all
    }

    /// The nodes a vCluster's home selector picks, in slot order.
    pub fn home_nodes(&self, v: &VCluster) -> Vec<NodeSlot> {
        self.nodes.iter().filter(|n| v.spec.home.matches(n)).map(|n| n.slot).collect()
    }

    /// The revision a create (`create`) or update of vCluster `name` would
    /// get, or why it is refused.
    pub(super) fn check_put_vcluster(
        &self,
        name: &str,
        spec: &VClusterSpec,
        by: &str,
        create: bool,
    ) -> Result<u64, Rejection> {
        crate::sm::vcluster::validate_name(name)?;
        crate::sm::vcluster::validate_spec(spec)?;
        validate_node_request(by, "", None, &self.limits)?;
        match (create, self.vcluster(name)) {
            (true, Some(_)) => Err(Rejection::VClusterExists(name.to_string())),
            (false, None) => Err(Rejection::UnknownVCluster(name.to_string())),
            (true, None) => Ok(1),
            (false, Some(v)) => Ok(v.revision + 1),
        }
    }

    pub(super) fn put_vcluster(&mut self, name: &str, spec: &VClusterSpec, by: &str, create: bool) -> Applied {
        let revision = self.check_put_vcluster(name, spec, by, create)?;
        let created_ms = self.vclusters.get(name).map_or(self.now_ms, |v| v.created_ms);
        let v = VCluster {
            name: name.to_string(),
            spec: spec.clone(),
            created_ms,
            updated_ms: self.now_ms,
            updated_by: by.to_string(),
            revision,
        };
        self.vclusters.insert(name.to_string(), v);
        // Home keys and nodes may have moved: which tasks are borrowed too.
        self.rebuild_indexes();
        Ok(vec![if create {
            Event::VClusterCreated { name: name.to_string(), by: by.to_string() }
        } else {
            Event::VClusterUpdated { name: name.to_string(), revision, by: by.to_string() }
        }])
    }

    /// Why a submission is refused by its vCluster's hard quotas: in any
    /// mode when the gang alone is larger than a quota (it could never
    /// run); in `reject` mode also when the vCluster's live allocations
    /// (queued, reserved, running) and this one together would be. Log
    /// order decides racing submissions: the later one is refused.
    pub(super) fn submit_quota_excess(&self, spec: &AllocSpec) -> Option<String> {
        self.submit_quota_excess_with(spec, 1, 0, 0)
    }

    /// [`State::submit_quota_excess`] of a submission that may hold
    /// `copies` allocations of `spec` live at once (an array: as many as
    /// its throttle lets run), as if the vCluster's live allocations also
    /// held `extra_allocs` more needing `extra_gpus` (the earlier steps of a
    /// workflow being submitted).
    pub(super) fn submit_quota_excess_with(
        &self,
        spec: &AllocSpec,
        copies: u64,
        extra_gpus: u64,
        extra_allocs: usize,
    ) -> Option<String> {
        let vc = self.vclusters.get(&spec.vcluster)?;
        let q = vc.spec.quota;
        let need = u64::from(spec.gang_size) * u64::from(spec.resources.gpus);
        let name = &vc.name;
        if let Some(max) = q.max_gpus
            && need > u64::from(max)
        {
            return Some(format!("the gang needs {need} GPUs; vCluster {name}'s quota is {max}"));
        }
        if let Some(max) = q.max_nodes
            && spec.gang_size > max
        {
            return Some(format!("the gang needs {} nodes; vCluster {name}'s quota is {max}", spec.gang_size));
        }
        if vc.spec.over_quota != OverQuota::Reject {
            return None;
        }
        let empty = VcDemand::default();
        let live = self.index.vc_live.get(name).unwrap_or(&empty);
        let (gpus, allocs) = (live.gpus + extra_gpus, live.allocs.len() + extra_allocs);
        let (this, needs) = if copies == 1 {
            ("this one".to_string(), ", this one".to_string())
        } else {
            (format!("{copies} elements of this array at once"), format!(", {copies} elements of this array at once"))
        };
        let hint = if copies == 1 { "" } else { " (a lower throttle, --array …%N, runs fewer at once)" };
        if let Some(max) = q.max_gpus
            && gpus + copies * need > u64::from(max)
        {
            return Some(format!(
                "vCluster {name}'s GPU quota: its live allocations need {gpus} GPUs{needs} {}, at most {max}{hint}",
                copies * need
            ));
        }
        if let Some(max) = q.max_allocations
            && allocs as u64 + copies > u64::from(max)
        {
            return Some(if copies == 1 {
                format!("vCluster {name}'s allocation quota: {allocs} live, at most {max}")
            } else {
                format!("vCluster {name}'s allocation quota: {allocs} live and {this}, at most {max}{hint}")
            });
        }
        None
    }

    /// Whether vCluster `name` has any hard quota (the built-in default,
    /// never changed, has none).
    pub fn has_quota(&self, name: &str) -> bool {
        self.vclusters.get(name).is_some_and(|v| {
            let q = v.spec.quota;
            q.max_gpus.is_some() || q.max_nodes.is_some() || q.max_allocations.is_some()
        })
    }

    /// vCluster `name`'s GPU quota, if it has one.
    pub fn gpu_quota(&self, name: &str) -> Option<u32> {
        self.vclusters.get(name)?.spec.quota.max_gpus
    }

    /// What a vCluster's tasks hold now.
    pub fn vcluster_load(&self, name: &str) -> Option<&VcLoad> {
        self.index.vc_load.get(name)
    }

    /// Why reserving gang `a` on `slots` would take its vCluster past a hard
    /// quota, or `None`. `pending` is load not yet applied (an admission
    /// pass's earlier reservations); the load of `minus` (a preemption's
    /// victims) is not counted. With no `slots`, the node quota is not
    /// checked (the nodes are not chosen yet).
    pub fn quota_excess(
        &self,
        a: &Allocation,
        slots: &[NodeSlot],
        pending: Option<&VcLoad>,
        minus: &[AllocId],
    ) -> Option<String> {
        // Borrowed, not cloned: this runs for every gang a pass considers.
        // The built-in default, never changed, has no quotas.
        let vc = self.vclusters.get(&a.spec.vcluster)?;
        let q = vc.spec.quota;
        if q.max_gpus.is_none() && q.max_nodes.is_none() && q.max_allocations.is_none() {
            return None;
        }
        let empty = VcLoad::default();
        let load = self.index.vc_load.get(&vc.name).unwrap_or(&empty);
        let pending = pending.unwrap_or(&empty);
        let gone: Vec<&Allocation> = minus
            .iter()
            .filter(|m| load.allocs.contains_key(m))
            .filter_map(|m| self.allocs.get(m).map(Arc::as_ref))
            .collect();
        let name = &vc.name;
        if let Some(max) = q.max_gpus {
            let freed: u64 =
                gone.iter().map(|m| u64::from(m.spec.resources.gpus) * u64::from(load.allocs[&m.id])).sum();
            let held = (load.gpus + pending.gpus).saturating_sub(freed);
            let need = u64::from(a.spec.resources.gpus) * u64::from(a.spec.gang_size);
            if held + need > u64::from(max) {
                return Some(format!(
                    "vCluster {name}'s GPU quota: {held} held + {need} needed > {max} (it waits; no running work is preempted for a quota)"
                ));
            }
        }
        if let Some(max) = q.max_allocations {
            let counted = load.allocs.len() + pending.allocs.len() - gone.len();
            let this = usize::from(!load.allocs.contains_key(&a.id) && !pending.allocs.contains_key(&a.id));
            if counted + this > max as usize {
                return Some(format!(
                    "vCluster {name}'s allocation quota: {counted} running or reserved, at most {max}"
                ));
            }
        }
        if let (Some(max), false) = (q.max_nodes, slots.is_empty()) {
            let mut on: BTreeMap<NodeSlot, u32> = load.nodes.clone();
            for m in &gone {
                for t in m.tasks.iter().filter(|t| t.status.holds_capacity()) {
                    if let Some(s) = t.node
                        && let Some(n) = on.get_mut(&s)
                    {
                        *n -= 1;
                        if *n == 0 {
                            on.remove(&s);
                        }
                    }
                }
            }
            let nodes: BTreeSet<NodeSlot> = on.keys().chain(pending.nodes.keys()).chain(slots).copied().collect();
            if nodes.len() > max as usize {
                return Some(format!(
                    "vCluster {name}'s node quota: the gang would put it on {} nodes, at most {max}",
                    nodes.len()
                ));
            }
        }
        None
    }
}
