//! Checkpoints: pre-log checks, manifests saved (on preemption and on
//! exit), dropped and retired, the retired ones' deletion, and the settings.
//!
//! ```text
//!   SaveCheckpoint / SaveExitCheckpoint ──▶ task.checkpoints (newest first, ≤ keep)
//!        └─ past keep: the oldest ──▶ retired ──▶ deleter's agent deletes ──▶ ForgetCheckpoints
//!   DropCheckpoint (restore failed) ──▶ retired
//!   allocation finished ──▶ all its manifests retired
//! ```
//!
//! A retired manifest is never one a task still names: it left the task
//! first. Its bytes are deleted by its writer's agent (for a shared or
//! object store, another ready node's once the writer is terminated); a
//! node-local checkpoint whose node is terminated went with the node.

use super::*;
use crate::sm::types::{
    CheckpointManifest, CheckpointSettings, CheckpointStore, MAX_FORGET_CHECKPOINTS, MAX_RETIRED_CHECKPOINTS,
    ManifestUpload, RetiredCheckpoint,
};
use std::sync::Arc;

impl State {
    /// Checks a command the edge judges before proposing as apply would,
    /// changing nothing, so that what apply would refuse costs no log entry:
    /// an agent's checkpoint manifest (`SaveCheckpoint`,
    /// `SaveExitCheckpoint`), `CancelAllocation`, `RevokeToken`,
    /// `CreateVCluster`, `UpdateVCluster` and `ForgetCheckpoints`. Apply
    /// runs the same checks again (the state may move before the entry
    /// commits). Every other command passes.
    pub fn precheck(&self, cmd: &Command) -> Result<(), Rejection> {
        match cmd {
            Command::SaveCheckpoint { alloc, task, node, epoch, manifest } => {
                self.check_manifest(*alloc, *task, node, manifest)?;
                self.check_preempting(*alloc, *task, node, *epoch).map(drop)
            }
            Command::SaveExitCheckpoint { alloc, task, node, epoch, manifest } => {
                self.check_manifest(*alloc, *task, node, manifest)?;
                self.check_report(*alloc, *task, node, *epoch, &[TaskStatus::Running, TaskStatus::Preempting]).map(drop)
            }
            Command::CancelAllocation { alloc } => self.check_cancel_any(*alloc),
            Command::RevokeToken { id, by } => self.check_revoke(id, by),
            Command::CreateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, true).map(drop),
            Command::UpdateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, false).map(drop),
            Command::ForgetCheckpoints { node, seqs } => self.check_forget_checkpoints(node, seqs),
            _ => Ok(()),
        }
    }

    /// The cluster's checkpoint settings.
    pub fn checkpoint_settings(&self) -> &CheckpointSettings {
        &self.checkpoint_settings
    }

    /// Where allocation `a`'s checkpoints go: its own choice, else its
    /// vCluster's, else the cluster's.
    pub fn checkpoint_store_of(&self, a: &Allocation) -> CheckpointStore {
        if let Some(s) = &a.spec.checkpoint_store {
            return s.clone();
        }
        self.vclusters
            .get(&a.spec.vcluster)
            .and_then(|v| v.spec.checkpoints.store.clone())
            .unwrap_or_else(|| self.checkpoint_settings.store.clone())
    }

    /// The largest checkpoint allocation `a`'s tasks may save: its
    /// vCluster's cap, else the cluster's.
    pub fn checkpoint_cap_of(&self, a: &Allocation) -> u64 {
        self.vclusters
            .get(&a.spec.vcluster)
            .and_then(|v| v.spec.checkpoints.max_bytes)
            .unwrap_or(self.checkpoint_settings.max_bytes)
    }

    /// Whether a job may choose `store`: `node`, or a store within one an
    /// operator configured (the cluster's, or any vCluster's).
    pub fn store_allowed(&self, store: &CheckpointStore) -> bool {
        *store == CheckpointStore::Node
            || store.within(&self.checkpoint_settings.store)
            || self.vclusters.values().filter_map(|v| v.spec.checkpoints.store.as_ref()).any(|s| store.within(s))
    }

    /// A job's own store is `node` or lies within a store an operator
    /// configured: a path of its choosing would have root-run agents write
    /// where it likes.
    pub fn check_job_store(&self, spec: &AllocSpec) -> Result<(), Rejection> {
        match &spec.checkpoint_store {
            Some(store) if !self.store_allowed(store) => Err(Rejection::InvalidSpec {
                field: "checkpoint_store".into(),
                reason: format!(
                    "{store} is neither node nor within a store an operator configured (the cluster's is {})",
                    self.checkpoint_settings.store
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Whether a manifest's bytes can be reached now: in a shared or object
    /// store always; on a node's disk while that node's agent may answer:
    /// not lost (silent) or terminated. A stopped node's agent may still
    /// serve (a drained node stays up until its operator powers it off); if
    /// it does not, the fetching agent falls back to an older checkpoint.
    pub fn checkpoint_reachable(&self, m: &CheckpointManifest) -> bool {
        match m.store {
            CheckpointStore::Node => self
                .node_slot(&m.writer)
                .is_some_and(|s| !matches!(self.node(s).status, NodeStatus::Lost | NodeStatus::Terminated)),
            _ => true,
        }
    }

    /// The rules every manifest meets: the allocation is live and
    /// checkpoints, the size is within its cap, the key names this task,
    /// and the store is the uploading node's disk or the allocation's store.
    pub(super) fn check_manifest(
        &self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        m: &ManifestUpload,
    ) -> Result<(), Rejection> {
        let a = self.live_alloc(id)?;
        if a.spec.checkpoint == CheckpointMode::None {
            return Err(Rejection::CheckpointDisabled { alloc: id });
        }
        let limit = self.checkpoint_cap_of(a);
        if m.bytes > limit {
            return Err(Rejection::CheckpointTooLarge { alloc: id, task, bytes: m.bytes, limit });
        }
        let invalid =
            |field: &str, reason: String| Rejection::InvalidCheckpoint { alloc: id, task, field: field.into(), reason };
        m.check_key(id, task).map_err(|r| invalid("key", r))?;
        if m.store != CheckpointStore::Node && m.store != self.checkpoint_store_of(a) {
            return Err(invalid(
                "store",
                format!("{} is not where this allocation's checkpoints go ({})", m.store, self.checkpoint_store_of(a)),
            ));
        }
        // The node's own name for the writer must be a node the state knows.
        self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        Ok(())
    }

    /// Records a checkpoint an agent stored for a task, newest first, and
    /// retires what falls past the cluster's `keep`. The same key again (an
    /// agent re-sending its report after a reconnect) changes nothing.
    fn store_manifest(&mut self, id: AllocId, task: TaskIndex, node: &NodeId, epoch: u64, m: &ManifestUpload) -> u64 {
        if let Some(same) = self.allocs[&id].tasks[task as usize].checkpoints.iter().find(|c| c.key == m.key) {
            return same.seq;
        }
        let seq = self.next_checkpoint_seq;
        self.next_checkpoint_seq += 1;
        let keep = self.checkpoint_settings.keep as usize;
        let now = self.now_ms;
        let old = self.allocs[&id].tasks[task as usize].checkpoints.clone();
        let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
        t.checkpoints.insert(
            0,
            CheckpointManifest {
                seq,
                epoch,
                attempt: t.runs,
                saved_at_ms: now,
                step: m.step,
                bytes: m.bytes,
                sha256: m.sha256,
                writer: node.clone(),
                store: m.store.clone(),
                key: m.key.clone(),
            },
        );
        let past: Vec<CheckpointManifest> = t.checkpoints.drain(keep.min(t.checkpoints.len())..).collect();
        self.reindex_checkpoints(id, task, &old);
        for m in past {
            self.retire(m);
        }
        seq
    }

    /// Stores the checkpoint a task left when its process exited, while the
    /// exit is not yet recorded: the task runs, or is stopping, on that node
    /// under reservation `epoch`.
    pub(super) fn save_exit_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        m: &ManifestUpload,
    ) -> Applied {
        self.check_manifest(id, task, node, m)?;
        self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let epoch = self.allocs[&id].tasks[task as usize].preemption_epoch;
        let seq = self.store_manifest(id, task, node, epoch, m);
        Ok(vec![Event::CheckpointSaved { alloc: id, task, epoch, bytes: m.bytes, after_ms: 0, preempted: false, seq }])
    }

    /// Stores a preempting task's checkpoint.
    pub(super) fn save_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        m: &ManifestUpload,
    ) -> Applied {
        self.check_manifest(id, task, node, m)?;
        self.check_preempting(id, task, node, epoch)?;
        let now = self.now_ms;
        let a = &self.allocs[&id];
        let after_ms = a.teardown.map_or(0, |td| now.saturating_sub(td.started_at_ms));
        let preempted = a.teardown.is_some_and(|td| td.asks_checkpoint());
        let seq = self.store_manifest(id, task, node, epoch, m);
        Ok(vec![Event::CheckpointSaved { alloc: id, task, epoch, bytes: m.bytes, after_ms, preempted, seq }])
    }

    /// A checkpoint the task's attempt could not restore is dropped (and its
    /// bytes deleted); the agent has moved on to an older one or a fresh
    /// start. Nothing is charged.
    pub(super) fn drop_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        seq: u64,
        reason: &str,
    ) -> Applied {
        check_agent_reason(reason)?;
        self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let old = self.allocs[&id].tasks[task as usize].checkpoints.clone();
        let Some(at) = old.iter().position(|c| c.seq == seq) else {
            return Err(Rejection::UnknownCheckpoint { alloc: id, task, seq });
        };
        let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
        let m = t.checkpoints.remove(at);
        self.reindex_checkpoints(id, task, &old);
        self.retire(m);
        Ok(vec![Event::CheckpointDropped { alloc: id, task, node: node.clone(), reason: reason.to_string(), seq }])
    }

    /// A finished allocation's checkpoints will never be restored: every
    /// one of them is retired (its bytes deleted), so they stop weighing
    /// on the state and on the nodes' disks.
    pub(super) fn retire_checkpoints(&mut self, id: AllocId) {
        let tasks = self.allocs[&id].tasks.len();
        for task in 0..tasks {
            let old = std::mem::take(
                &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("known").tasks[task].checkpoints,
            );
            if old.is_empty() {
                continue;
            }
            self.reindex_checkpoints(id, task as TaskIndex, &old);
            for m in old {
                self.retire(m);
            }
        }
    }

    /// Queues a manifest's bytes for deletion by its writer (or, in a
    /// shared or object store whose writer is terminated, by the first
    /// ready node). A node-local checkpoint on a terminated or unknown node
    /// went with it: nothing to delete.
    fn retire(&mut self, m: CheckpointManifest) {
        let usable = |st: &State, slot: NodeSlot| st.node(slot).status != NodeStatus::Terminated;
        let writer = self.node_slot(&m.writer).filter(|&s| usable(self, s));
        let deleter = match (&m.store, writer) {
            (_, Some(slot)) => slot,
            (CheckpointStore::Node, None) => return,
            (_, None) => match self.index.by_status.get(&NodeStatus::Ready).and_then(|s| s.first()) {
                Some(&slot) => slot,
                None => {
                    self.abandoned_checkpoints += 1;
                    return;
                }
            },
        };
        let deleter_id = self.node(deleter).id.clone();
        self.index.retired_by_deleter.entry(deleter_id.clone()).or_default().insert(m.seq);
        self.touched.nodes.insert(deleter);
        self.retired_checkpoints.insert(m.seq, RetiredCheckpoint { manifest: m, deleter: deleter_id });
        while self.retired_checkpoints.len() > MAX_RETIRED_CHECKPOINTS {
            let (seq, r) = self.retired_checkpoints.pop_first().expect("over the cap");
            self.unindex_retired(seq, &r.deleter);
            self.abandoned_checkpoints += 1;
        }
    }

    fn unindex_retired(&mut self, seq: u64, deleter: &NodeId) {
        if let Some(set) = self.index.retired_by_deleter.get_mut(deleter) {
            set.remove(&seq);
            if set.is_empty() {
                self.index.retired_by_deleter.remove(deleter);
            }
        }
    }

    /// A terminated node deletes nothing more: its node-local retired
    /// checkpoints went with it, and the shared or object ones pass to the
    /// first ready node.
    pub(super) fn reassign_retired(&mut self, node: &NodeId) {
        let Some(seqs) = self.index.retired_by_deleter.remove(node) else { return };
        for seq in seqs {
            let r = self.retired_checkpoints.remove(&seq).expect("indexed");
            self.retire(r.manifest);
        }
    }

    /// Keeps `checkpoints_on_node` in step with task `task`'s manifests,
    /// which were `old` before the change.
    fn reindex_checkpoints(&mut self, id: AllocId, task: TaskIndex, old: &[CheckpointManifest]) {
        let on_disk = |ms: &[CheckpointManifest]| -> BTreeSet<NodeId> {
            ms.iter().filter(|m| m.store == CheckpointStore::Node).map(|m| m.writer.clone()).collect()
        };
        let before = on_disk(old);
        let after = on_disk(&self.allocs[&id].tasks[task as usize].checkpoints);
        for n in before.difference(&after) {
            let set = self.index.checkpoints_on_node.get_mut(n).expect("indexed");
            set.remove(&(id, task));
            if set.is_empty() {
                self.index.checkpoints_on_node.remove(n);
            }
        }
        for n in after.difference(&before) {
            self.index.checkpoints_on_node.entry(n.clone()).or_default().insert((id, task));
            if let Some(slot) = self.node_slot(n) {
                self.touched.nodes.insert(slot);
            }
        }
    }

    /// The deleter's check: every named manifest that is still retired is
    /// this node's to delete (numbers already forgotten are skipped).
    fn check_forget_checkpoints(&self, node: &NodeId, seqs: &[u64]) -> Result<(), Rejection> {
        if seqs.len() > MAX_FORGET_CHECKPOINTS {
            return Err(Rejection::InvalidNode {
                field: "seqs".into(),
                reason: format!("{} checkpoints, over {MAX_FORGET_CHECKPOINTS}", seqs.len()),
            });
        }
        self.node_slot(node).ok_or_else(|| Rejection::UnknownNode(node.clone()))?;
        for &seq in seqs {
            if let Some(r) = self.retired_checkpoints.get(&seq)
                && r.deleter != *node
            {
                return Err(Rejection::NotDeleter { node: node.clone(), seq });
            }
        }
        Ok(())
    }

    /// A node's agent deleted these retired checkpoints.
    pub(super) fn forget_checkpoints(&mut self, node: &NodeId, seqs: &[u64]) -> Applied {
        self.check_forget_checkpoints(node, seqs)?;
        let mut count = 0;
        for seq in seqs {
            if let Some(r) = self.retired_checkpoints.remove(seq) {
                self.unindex_retired(*seq, &r.deleter);
                count += 1;
            }
        }
        Ok(vec![Event::CheckpointsDeleted { node: node.clone(), count }])
    }

    /// An admin sets the cluster's checkpoint settings. Tasks keeping more
    /// checkpoints than the new `keep` retire the oldest at their next save.
    pub(super) fn set_checkpoint_settings(&mut self, settings: &CheckpointSettings, by: &str) -> Applied {
        settings
            .check()
            .map_err(|reason| Rejection::InvalidCheckpointSettings { field: "checkpoints".into(), reason })?;
        if CheckpointStore::parse(&settings.store.spec()).as_ref() != Ok(&settings.store) {
            return Err(Rejection::InvalidCheckpointSettings {
                field: "store".into(),
                reason: format!("{:?} is not a store spelling", settings.store.spec()),
            });
        }
        self.checkpoint_settings = settings.clone();
        Ok(vec![Event::CheckpointSettingsChanged { settings: settings.clone(), by: by.to_string() }])
    }

    /// The retired checkpoints `node`'s agent is to delete, oldest first.
    pub fn checkpoints_to_delete(&self, node: &NodeId) -> impl Iterator<Item = &RetiredCheckpoint> + '_ {
        self.index
            .retired_by_deleter
            .get(node)
            .into_iter()
            .flatten()
            .map(|seq| self.retired_checkpoints.get(seq).expect("indexed"))
    }

    /// Retired checkpoints waiting for deletion, and those abandoned.
    pub fn retired_checkpoint_counts(&self) -> (usize, u64) {
        (self.retired_checkpoints.len(), self.abandoned_checkpoints)
    }

    /// The tasks with a checkpoint on `node`'s disk (whose agent serves
    /// them to the node each is placed on next).
    pub fn tasks_with_checkpoints_on(&self, node: &NodeId) -> impl Iterator<Item = (AllocId, TaskIndex)> + '_ {
        self.index.checkpoints_on_node.get(node).into_iter().flatten().copied()
    }

    /// Rebuilds the checkpoint indexes from the replicated fields.
    pub(super) fn rebuild_checkpoint_indexes(&mut self) {
        for a in self.allocs.values() {
            for t in &a.tasks {
                for m in t.checkpoints.iter().filter(|m| m.store == CheckpointStore::Node) {
                    self.index.checkpoints_on_node.entry(m.writer.clone()).or_default().insert((a.id, t.index));
                }
            }
        }
        for (seq, r) in &self.retired_checkpoints {
            self.index.retired_by_deleter.entry(r.deleter.clone()).or_default().insert(*seq);
        }
    }
}
