//! Checkpoints: pre-log checks and saving them (on preemption hints and on exit).

use super::*;
use std::sync::Arc;

impl State {
    /// Checks a command the edge judges before proposing as apply would,
    /// changing nothing, so that what apply would refuse costs no log entry:
    /// an agent's checkpoint upload (`SaveCheckpoint`, `SaveExitCheckpoint`),
    /// `CancelAllocation`, `RevokeToken`, `CreateVCluster` and
    /// `UpdateVCluster`. Apply runs the same checks again (the state may
    /// move before the entry commits). Every other command passes.
    pub fn precheck(&self, cmd: &Command) -> Result<(), Rejection> {
        match cmd {
            Command::SaveCheckpoint { alloc, task, node, epoch, data } => {
                self.check_checkpoint(*alloc, *task, data)?;
                self.check_preempting(*alloc, *task, node, *epoch).map(drop)
            }
            Command::SaveExitCheckpoint { alloc, task, node, epoch, data } => {
                self.check_checkpoint(*alloc, *task, data)?;
                self.check_report(*alloc, *task, node, *epoch, &[TaskStatus::Running, TaskStatus::Preempting]).map(drop)
            }
            Command::CancelAllocation { alloc } => self.check_cancel(*alloc),
            Command::RevokeToken { id, by } => self.check_revoke(id, by),
            Command::CreateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, true).map(drop),
            Command::UpdateVCluster { name, spec, by } => self.check_put_vcluster(name, spec, by, false).map(drop),
            _ => Ok(()),
        }
    }

    /// The checkpoint rules every upload meets: the allocation is live and
    /// checkpoints, and the data is within the cap.
    pub(super) fn check_checkpoint(&self, id: AllocId, task: TaskIndex, data: &[u8]) -> Result<(), Rejection> {
        let a = self.live_alloc(id)?;
        if a.spec.checkpoint == CheckpointMode::None {
            return Err(Rejection::CheckpointDisabled { alloc: id });
        }
        if data.len() > self.limits.max_checkpoint_bytes {
            return Err(Rejection::CheckpointTooLarge {
                alloc: id,
                task,
                bytes: data.len() as u64,
                limit: self.limits.max_checkpoint_bytes as u64,
            });
        }
        Ok(())
    }

    /// Stores the checkpoint a task left when its process exited (replacing
    /// any older one), while the exit is not yet recorded: the task runs, or
    /// is stopping, on that node under reservation `epoch`.
    pub(super) fn save_exit_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        data: &[u8],
    ) -> Applied {
        self.check_checkpoint(id, task, data)?;
        self.check_report(id, task, node, epoch, &[TaskStatus::Running, TaskStatus::Preempting])?;
        let now = self.now_ms;
        let t = &mut self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked").tasks[task as usize];
        let epoch = t.preemption_epoch;
        t.checkpoint = Some(Checkpoint { epoch, saved_at_ms: now, data: data.to_vec() });
        Ok(vec![Event::CheckpointSaved {
            alloc: id,
            task,
            epoch,
            bytes: data.len() as u64,
            after_ms: 0,
            preempted: false,
        }])
    }

    /// Stores a preempting task's checkpoint (replacing any older one).
    pub(super) fn save_checkpoint(
        &mut self,
        id: AllocId,
        task: TaskIndex,
        node: &NodeId,
        epoch: u64,
        data: &[u8],
    ) -> Applied {
        self.check_checkpoint(id, task, data)?;
        self.check_preempting(id, task, node, epoch)?;
        let now = self.now_ms;
        let a = self.allocs.get_mut(&id).map(Arc::make_mut).expect("checked");
        let after_ms = a.teardown.map_or(0, |td| now.saturating_sub(td.started_at_ms));
        let preempted = a.teardown.is_some_and(|td| td.asks_checkpoint());
        let t = &mut a.tasks[task as usize];
        t.checkpoint = Some(Checkpoint { epoch, saved_at_ms: now, data: data.to_vec() });
        Ok(vec![Event::CheckpointSaved { alloc: id, task, epoch, bytes: data.len() as u64, after_ms, preempted }])
    }
}
