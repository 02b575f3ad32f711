//! The agent-sync planner: what the leader tells one node's agent, decided
//! from the state and from what this stream has already been told.
//!
//! ```text
//!   entry touching node N applied ──▶ N's stream: plan_sync(&State, N, &SentMemory, repeat)
//!                                         ──▶ SyncPlan { notice, assign, preempt, stop }
//!                                         ──▶ the hub sends it, then SentMemory::sent(&plan)
//! ```
//!
//! - **Notice**: the node's status (and drain deadline) when it changed
//!   since the last notice; always once per stream.
//! - **Assign**: each task newly reserved on this node, once per stream.
//! - **Preempt / Hint**: each task the state has stopping on this node, once
//!   per stream and preemption epoch, and again on every heartbeat
//!   (`repeat`) until its ack commits. A priority preemption's victim that
//!   can checkpoint gets a checkpoint hint instead; one that cannot gets
//!   the preemption grace.
//! - **Stop**: each task the agent said it runs (at registration) that is
//!   no longer placed on this node.
//! - **Grants**: the checkpoints on this node's disk that another node may
//!   fetch now (their task is placed there), sent whole whenever the set
//!   changes; this node's agent serves a fetch only under a grant.
//! - **Delete**: retired checkpoints this node's agent is to delete, once
//!   per stream, and again on every heartbeat until the deletion commits.
//!
//! Nothing about a teardown lives in [`SentMemory`]: a new leader's first
//! plan finds the stopping tasks in the replicated state and signals them
//! again.

use std::collections::BTreeSet;

use crate::sm::{
    AllocId, CheckpointManifest, CheckpointMode, CheckpointStore, NodeId, NodeStatus, State, TaskIndex, TaskStatus,
};

/// The label a node's gang-peer address is kept under.
pub const ADDRESS_LABEL: &str = "muster.address";

/// The label the address of a node's checkpoint service (where other
/// agents fetch the checkpoints on its disk) is kept under.
pub const CHECKPOINT_ADDRESS_LABEL: &str = "muster.checkpoints";

/// A checkpoint an assignment may restore from, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreFrom {
    /// Its manifest.
    pub manifest: CheckpointManifest,
    /// For a checkpoint on a node's disk: that node's checkpoint service
    /// address (empty when it is this node, or the node gave none).
    pub source: String,
}

/// Leave to fetch one checkpoint from this node's disk.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// The manifest's number.
    pub seq: u64,
    /// Its key.
    pub key: String,
    /// The node that may fetch it (its task is placed there).
    pub node: NodeId,
}

/// One attempt of one task: allocation, task index, reservation epoch.
pub type TaskKey = (AllocId, TaskIndex, u64);

/// The stop graces the planner hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncConfig {
    /// SIGTERM → SIGKILL grace for a task stopped by a teardown, a cancel or
    /// a drain, ms.
    pub stop_grace_ms: u32,
    /// The same, for a priority preemption's victim (after its checkpoint,
    /// or at once when it cannot checkpoint), ms.
    pub preemption_grace_ms: u32,
}

/// How a stopping task is to be stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopHow {
    /// SIGTERM, this grace, SIGKILL.
    Preempt {
        /// The grace, ms.
        grace_ms: u32,
    },
    /// Ask for a checkpoint first (the hint carries the deadlines).
    Hint,
}

/// A task newly reserved on the node: what its agent needs to start it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The attempt.
    pub key: TaskKey,
    /// Tasks in the gang.
    pub gang_size: u32,
    /// The command line.
    pub command: Vec<String>,
    /// Extra environment, in name order.
    pub env: Vec<(String, String)>,
    /// The allocation's secrets (its `Debug` shows names only).
    pub secrets: crate::sm::Secrets,
    /// Each gang task's node address (its `muster.address` label, else its
    /// id; empty for a task not placed).
    pub peers: Vec<String>,
    /// GPUs the task holds.
    pub gpus: u32,
    /// Host memory the task asked for, MiB (its hard limit on an isolating
    /// node).
    pub mem_mb: u64,
    /// CPU cores the task asked for (its CPU quota there).
    pub cpus: u32,
    /// The allocation's owner (whose account the task runs as).
    pub owner: String,
    /// Its pids limit (0: the agent's default).
    pub pids_max: u32,
    /// The checkpoints to resume from, newest first: every one the task
    /// holds that can be reached now (the agent tries them in turn).
    pub restore: Vec<RestoreFrom>,
    /// Where the task's checkpoints go.
    pub store: CheckpointStore,
    /// The largest checkpoint the task may save, bytes.
    pub max_checkpoint_bytes: u64,
    /// The walltime, s.
    pub walltime_s: u64,
    /// The stall timeout, s (0: the agent's default).
    pub stall_timeout_s: u32,
    /// Whether the gang checkpoints (so the agent saves one on exit).
    pub checkpointing: bool,
    /// The gang's rendezvous ports on task 0's node (`MASTER_PORT` first).
    pub ports: Vec<u16>,
    /// The image the task runs in, with its mounts and working directory.
    pub container: Option<crate::sm::ContainerSpec>,
}

/// What one stream has told its agent so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SentMemory {
    assigned: BTreeSet<TaskKey>,
    preempted: BTreeSet<(TaskKey, u64)>,
    agent_running: BTreeSet<TaskKey>,
    told: Option<(NodeStatus, u64)>,
    /// The grants last sent (`None`: none yet on this stream).
    grants: Option<Vec<Grant>>,
    /// Retired checkpoints this stream asked to delete.
    deletes: BTreeSet<u64>,
}

impl SentMemory {
    /// A fresh stream whose agent said it runs `running`.
    pub fn new(running: impl IntoIterator<Item = TaskKey>) -> SentMemory {
        SentMemory { agent_running: running.into_iter().collect(), ..SentMemory::default() }
    }

    /// What the agent said it runs and has not been told to stop.
    pub fn agent_running(&self) -> &BTreeSet<TaskKey> {
        &self.agent_running
    }

    /// The agent's own list of what it runs (a heartbeat's) replaces ours.
    pub fn agent_runs_now(&mut self, running: impl IntoIterator<Item = TaskKey>) {
        self.agent_running = running.into_iter().collect();
    }

    /// The agent started `key` (its claim was granted).
    pub fn agent_started(&mut self, key: TaskKey) {
        self.agent_running.insert(key);
    }

    /// The agent reported `key` ended (exited, stopped, tripped a watchdog).
    pub fn agent_stopped(&mut self, key: &TaskKey) {
        self.agent_running.remove(key);
    }

    /// Records that `plan` was sent, and forgets whatever the node no
    /// longer holds.
    pub fn sent(&mut self, plan: &SyncPlan) {
        if let Some(notice) = plan.notice {
            self.told = Some(notice);
        }
        self.assigned.extend(plan.assign.iter().map(|a| a.key));
        self.assigned.retain(|k| plan.owned.contains(k));
        self.preempted.extend(plan.preempt.iter().map(|&(key, epoch, _)| (key, epoch)));
        self.preempted.retain(|(k, _)| plan.owned.contains(k));
        for key in &plan.stop {
            self.agent_running.remove(key);
        }
        if let Some(g) = &plan.grants {
            self.grants = Some(g.clone());
        }
        self.deletes.extend(plan.delete.iter().map(|m| m.seq));
        self.deletes.retain(|s| plan.retired.contains(s));
    }
}

/// What to send one agent now, in this order: notice, assignments,
/// preempts and hints, stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// The node's status and drain deadline (0: none), when it changed.
    pub notice: Option<(NodeStatus, u64)>,
    /// Tasks newly reserved on the node.
    pub assign: Vec<Assignment>,
    /// Stopping tasks to signal: attempt, preemption epoch, how.
    pub preempt: Vec<(TaskKey, u64, StopHow)>,
    /// Tasks the agent runs that the node no longer holds.
    pub stop: Vec<TaskKey>,
    /// Every checkpoint on this node's disk another node may fetch now,
    /// when that set changed (the agent replaces its own with it).
    pub grants: Option<Vec<Grant>>,
    /// Retired checkpoints to delete.
    pub delete: Vec<CheckpointManifest>,
    /// Every attempt the node holds now.
    owned: BTreeSet<TaskKey>,
    /// Every retired checkpoint this node is to delete now.
    retired: BTreeSet<u64>,
}

impl SyncPlan {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.notice.is_none()
            && self.assign.is_empty()
            && self.preempt.is_empty()
            && self.stop.is_empty()
            && self.grants.is_none()
            && self.delete.is_empty()
    }
}

/// The most retired checkpoints one plan asks a node to delete (the rest
/// follow in later plans).
pub const MAX_DELETES_PER_PLAN: usize = 256;

/// A task's extra environment, in name order: its spec's, an array
/// element's array variables and a workflow step's workflow id and step
/// name (which win over the spec's own).
fn task_env(st: &State, a: &crate::sm::Allocation) -> Vec<(String, String)> {
    let mut env = a.spec.env.clone();
    if let Some((array, position)) = st.array_of(a.id) {
        env.extend(array.element_env(position));
    }
    if let Some((w, step)) = st.workflow_of(a.id) {
        env.insert("MUSTER_WORKFLOW_ID".to_string(), w.id.to_string());
        env.insert("MUSTER_WORKFLOW_STEP".to_string(), step.to_string());
    }
    env.into_iter().collect()
}

/// Plans what to tell `node`'s agent, given what this stream has told it
/// (`sent`). With `repeat` (a heartbeat) every stopping task not yet acked
/// is signalled again. An unknown node gets an empty plan.
pub fn plan_sync(st: &State, node: &NodeId, sent: &SentMemory, repeat: bool, cfg: &SyncConfig) -> SyncPlan {
    let mut plan = SyncPlan::default();
    let Some(slot) = st.node_slot(node) else { return plan };
    let n = st.node(slot);
    let status = (n.status, n.drain.as_ref().map_or(0, |d| d.deadline_ms));
    if sent.told != Some(status) {
        plan.notice = Some(status);
    }
    for (alloc, task) in st.tasks_on_node(slot) {
        let a = st.alloc(alloc).expect("index names a known allocation");
        let t = &a.tasks[task as usize];
        let key = (alloc, task, t.reservation_epoch);
        plan.owned.insert(key);
        if t.status == TaskStatus::Preempting && (repeat || !sent.preempted.contains(&(key, t.preemption_epoch))) {
            let how = match a.teardown {
                Some(td) if td.asks_checkpoint() && a.spec.checkpoint == CheckpointMode::None => {
                    StopHow::Preempt { grace_ms: cfg.preemption_grace_ms }
                }
                Some(td) if td.asks_checkpoint() => StopHow::Hint,
                _ => StopHow::Preempt { grace_ms: cfg.stop_grace_ms },
            };
            plan.preempt.push((key, t.preemption_epoch, how));
        }
        if t.status == TaskStatus::Reserved && !sent.assigned.contains(&key) {
            let peers = a
                .tasks
                .iter()
                .map(|p| {
                    p.node.map_or_else(String::new, |s| {
                        let n = st.node(s);
                        n.labels.get(ADDRESS_LABEL).cloned().unwrap_or_else(|| n.id.to_string())
                    })
                })
                .collect();
            plan.assign.push(Assignment {
                key,
                gang_size: a.spec.gang_size,
                command: a.spec.command.clone(),
                env: task_env(st, a),
                secrets: st.secrets(a.id).cloned().unwrap_or_default(),
                peers,
                gpus: a.spec.resources.gpus,
                mem_mb: a.spec.resources.mem_mb,
                cpus: a.spec.resources.cpus,
                owner: a.spec.owner.clone(),
                pids_max: a.spec.pids_max,
                restore: restore_list(st, t, node),
                store: st.checkpoint_store_of(a),
                max_checkpoint_bytes: st.checkpoint_cap_of(a),
                walltime_s: a.spec.walltime_s,
                stall_timeout_s: a.spec.stall_timeout_s,
                checkpointing: a.spec.checkpoint != CheckpointMode::None,
                ports: a.ports.clone(),
                container: a.spec.container.clone(),
            });
        }
    }
    plan.stop = sent.agent_running.iter().filter(|k| !plan.owned.contains(k)).copied().collect();
    let grants = grants_for(st, node);
    if sent.grants.as_ref() != Some(&grants) {
        plan.grants = Some(grants);
    }
    for r in st.checkpoints_to_delete(node) {
        plan.retired.insert(r.manifest.seq);
        if (repeat || !sent.deletes.contains(&r.manifest.seq)) && plan.delete.len() < MAX_DELETES_PER_PLAN {
            plan.delete.push(r.manifest.clone());
        }
    }
    plan
}

/// What task `t`, placed on `node`, may restore from: each of its
/// checkpoints that can be reached now, newest first, with where to fetch
/// the ones on another node's disk.
pub fn restore_list(st: &State, t: &crate::sm::Task, node: &NodeId) -> Vec<RestoreFrom> {
    t.checkpoints
        .iter()
        .filter(|m| st.checkpoint_reachable(m))
        .map(|m| {
            let source = match m.store {
                CheckpointStore::Node if m.writer != *node => st
                    .node_slot(&m.writer)
                    .and_then(|s| st.node(s).labels.get(CHECKPOINT_ADDRESS_LABEL).cloned())
                    .unwrap_or_default(),
                _ => String::new(),
            };
            RestoreFrom { manifest: m.clone(), source }
        })
        .collect()
}

/// The checkpoints on `node`'s disk whose task is placed (reserved or
/// running) on another node now: that node may fetch them.
pub fn grants_for(st: &State, node: &NodeId) -> Vec<Grant> {
    let mut grants = Vec::new();
    for (alloc, task) in st.tasks_with_checkpoints_on(node) {
        let Some(t) = st.alloc(alloc).map(|a| &a.tasks[task as usize]) else { continue };
        let Some(slot) = t.node.filter(|_| matches!(t.status, TaskStatus::Reserved | TaskStatus::Running)) else {
            continue;
        };
        let fetcher = &st.node(slot).id;
        if fetcher == node {
            continue;
        }
        for m in t.checkpoints.iter().filter(|m| m.store == CheckpointStore::Node && m.writer == *node) {
            grants.push(Grant { seq: m.seq, key: m.key.clone(), node: fetcher.clone() });
        }
    }
    grants.sort();
    grants
}

#[cfg(test)]
#[path = "sync_test.rs"]
mod sync_test;
