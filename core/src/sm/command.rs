//! Commands: every state change the log can carry.
//!
//! Commands are imperative (`ReserveGang`), built by the leader's loops (from
//! pure policies) or by the API edge, and re-validated in `apply`, which may
//! reject any of them deterministically.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::types::{
    Admission, AllocId, AllocSpec, CheckpointSettings, ManifestUpload, NodeId, Resources, Secrets, TaskIndex, TokenRole,
};
use super::vcluster::VClusterSpec;

/// One state transition, as carried in a Raft log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Add a node, or update the resources and labels of a known one.
    RegisterNode {
        /// The node's name.
        node: NodeId,
        /// What it has.
        resources: Resources,
        /// Its labels.
        labels: BTreeMap<String, String>,
    },
    /// Add an allocation; every task starts blocked.
    Submit {
        /// What the user asked for.
        spec: AllocSpec,
    },
    /// [`Command::Submit`] with secret environment variables, kept apart
    /// from the spec (a duplicate keeps the first submission's).
    SubmitWithSecrets {
        /// What the user asked for.
        spec: AllocSpec,
        /// The secrets.
        secrets: Secrets,
    },
    /// Place a whole gang: task `i` on `nodes[i]`, under reservation `epoch`,
    /// which must be exactly one past the allocation's current epoch.
    ReserveGang {
        /// The allocation.
        alloc: AllocId,
        /// The new reservation epoch.
        epoch: u64,
        /// One distinct ready node per task, by task index.
        nodes: Vec<NodeId>,
    },
    /// Return an unclaimed (stale) reservation to the queue. If some tasks of
    /// the gang already run, the first unclaimed task is charged an attempt
    /// and becomes the trigger of a gang teardown instead.
    RollbackGang {
        /// The allocation.
        alloc: AllocId,
        /// The reservation being rolled back (must be current).
        epoch: u64,
    },
    /// A node's agent claims its reserved task and starts it.
    StartTask {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The claiming node (must be the one reserved).
        node: NodeId,
        /// The reservation epoch the agent was told (must be current).
        epoch: u64,
    },
    /// A task's process exited successfully.
    FinishTask {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch of the attempt.
        epoch: u64,
    },
    /// A task's process failed.
    FailTask {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch of the attempt.
        epoch: u64,
        /// The exit code, if the process exited with one.
        exit_code: Option<i32>,
    },
    /// Cancel an allocation and every unfinished task of it.
    CancelAllocation {
        /// The allocation.
        alloc: AllocId,
    },
    /// A preempting task's agent reports the process stopped (after SIGTERM,
    /// the grace and SIGKILL if needed).
    ConfirmPreempted {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The preemption epoch the agent was told (must be current).
        epoch: u64,
        /// The task was asked to checkpoint and did not answer within its
        /// checkpoint timeout: it was killed, and is charged an attempt.
        checkpoint_failed: bool,
    },
    /// Priority preemption, decided by the leader's pure policy: stop every
    /// `victims` gang (checkpoint hint, or SIGTERM when it cannot
    /// checkpoint) and hold `nodes` for `alloc`, which is reserved there the
    /// moment the last victim releases its nodes.
    Preempt {
        /// The preemptor (queued, class above every victim's).
        alloc: AllocId,
        /// Each victim with the reservation epoch the decision saw (a victim
        /// that was re-placed since is a different run: stale).
        victims: Vec<(AllocId, u64)>,
        /// Task `i` of the preemptor goes to `nodes[i]` once they are free.
        nodes: Vec<NodeId>,
        /// How long the nodes are held at most (from now).
        hold_ms: u64,
    },
    /// A node's agent stopped a running task because a watchdog tripped
    /// (budget, stall, GPU health). The task is retried on another node
    /// (first in its class, not charged to its retry budget) while its trips
    /// are within the cap; a gang goes through teardown; past the cap the
    /// allocation fails with the reason.
    TripWatchdog {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch of the attempt.
        epoch: u64,
        /// Which watchdog.
        kind: super::types::WatchdogKind,
    },
    /// The leader's clock says a preemptor's hold expired before it could be
    /// reserved: release the held nodes.
    ExpireNomination {
        /// The preemptor.
        alloc: AllocId,
    },
    /// A preempting task's agent has stored what the task left in its
    /// checkpoint directory, and records its manifest (never the bytes).
    SaveCheckpoint {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The preemption epoch the agent was told (must be current).
        epoch: u64,
        /// Where the checkpoint is, its size and digest.
        manifest: ManifestUpload,
    },
    /// The leader's deadline pass: every task of the teardown `epoch`
    /// still preempting is moved to preempted without an ack (its node died
    /// mid-teardown, or its agent never answers).
    ForceTeardown {
        /// The allocation.
        alloc: AllocId,
        /// The teardown's preemption epoch (must be current).
        epoch: u64,
    },
    /// A node went silent while holding work (proposed by the leader's
    /// liveness loop): fail its tasks and take it out of placement.
    MarkNodeLost {
        /// The node.
        node: NodeId,
    },
    /// A pending node's agent has registered and reconciled: the node takes
    /// work.
    MarkNodeReady {
        /// The node.
        node: NodeId,
    },
    /// An operator drains a ready node: it takes no new reservations, its
    /// tasks run on, and it stops once empty; at `now + timeout_ms` its
    /// remaining tasks are preempted and re-queued elsewhere.
    DrainNode {
        /// The node.
        node: NodeId,
        /// From now to the deadline (already resolved from the flag, the
        /// node's `muster.drain-timeout` label or the server default).
        timeout_ms: u64,
        /// Why, in the operator's words (may be empty).
        reason: String,
        /// Who asked.
        by: String,
    },
    /// An admin admits node `node` for at most `admission` (its resources,
    /// labels and certificate), or (`None`) withdraws its admission. Takes
    /// effect at the node's next registration.
    AdmitNode {
        /// The node's name (it need not be registered yet).
        node: NodeId,
        /// What it may claim; `None` withdraws.
        admission: Option<Admission>,
    },
    /// An admin sets (`set`) and removes (`remove`) labels of node `node`,
    /// laid over what its agent reports; the only way to set the reserved
    /// `muster.*` labels. Takes effect at once on a registered node.
    LabelNode {
        /// The node's name (it need not be registered yet).
        node: NodeId,
        /// Labels to set.
        set: BTreeMap<String, String>,
        /// Label keys to remove.
        remove: Vec<String>,
        /// Who asked.
        by: String,
    },
    /// An operator cancels a drain: the node is ready again.
    CancelDrain {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// The leader's clock passed a draining node's deadline: the node is
    /// stopping and every gang on it is preempted (checkpoint hint, or
    /// SIGTERM) to resume elsewhere.
    ExpireDrain {
        /// The node.
        node: NodeId,
    },
    /// An operator stops an empty node directly (from ready, draining,
    /// stopping or lost).
    StopNode {
        /// The node.
        node: NodeId,
        /// Why (may be empty).
        reason: String,
        /// Who asked.
        by: String,
    },
    /// An operator returns a stopped node to service.
    RestartNode {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// An operator retires a stopped node for good.
    TerminateNode {
        /// The node.
        node: NodeId,
        /// Who asked.
        by: String,
    },
    /// An admin creates a bearer token (the replica made the secret and
    /// hashed it; only the hash enters the log).
    CreateToken {
        /// Its id.
        id: String,
        /// Its holder.
        name: String,
        /// What it allows.
        role: TokenRole,
        /// SHA-256 of the secret.
        sha256: [u8; 32],
        /// When it stops working, ms since the epoch.
        expires_ms: u64,
        /// The admin.
        by: String,
    },
    /// An admin revokes a token: every call and stream using it fails from
    /// the entry's commit on.
    RevokeToken {
        /// Its id.
        id: String,
        /// The admin.
        by: String,
    },
    /// An admin creates a vCluster (refused if the name is taken).
    CreateVCluster {
        /// Its name.
        name: String,
        /// What it is.
        spec: VClusterSpec,
        /// The admin.
        by: String,
    },
    /// An admin replaces a vCluster's spec (refused if it does not exist;
    /// the built-in `default` always does).
    UpdateVCluster {
        /// Its name.
        name: String,
        /// Its new spec, whole.
        spec: VClusterSpec,
        /// The admin.
        by: String,
    },
    /// Elastic reclamation (the preemption-policy seed's trigger 2): queued
    /// gang `alloc` of a vCluster whose home nodes were lent out takes them
    /// back. Every `victims` gang (running on borrowed capacity of `alloc`'s
    /// vCluster, whatever its class) goes through the same checkpoint-hint
    /// teardown as a priority preemption, and `nodes` (home or shared ones)
    /// are held for `alloc` until they are free.
    Reclaim {
        /// The home vCluster's queued gang.
        alloc: AllocId,
        /// Each borrowing gang with the reservation epoch the decision saw.
        victims: Vec<(AllocId, u64)>,
        /// Task `i` of `alloc` goes to `nodes[i]` once they are free.
        nodes: Vec<NodeId>,
        /// How long the nodes are held at most (from now).
        hold_ms: u64,
    },
    /// A claimed task's process could not be started: the same as
    /// `FailTask` with no exit code, and the agent's reason is kept in the
    /// task's events.
    FailTaskToStart {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch the claim was made under.
        epoch: u64,
        /// Why it did not start (at most [`MAX_AGENT_REASON_BYTES`]).
        reason: String,
    },
    /// A checkpoint a task's agent was given could not be restored there
    /// (it cannot be fetched, its digest does not match, it does not
    /// unpack): the agent tries the next older one or starts the task
    /// without, and this one is dropped (retired) so no later attempt trips
    /// on it. Nothing is charged.
    DropCheckpoint {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch of the attempt that tried to restore it.
        epoch: u64,
        /// The manifest's number.
        seq: u64,
        /// What went wrong (at most [`MAX_AGENT_REASON_BYTES`]).
        reason: String,
    },
    /// A task's process exited (on its own, or killed) with a checkpoint
    /// directory that changed since its last upload: its agent uploads it
    /// before reporting the exit, so a gang whose rank died resumes from
    /// each rank's latest checkpoint. Fenced by the reservation epoch: the
    /// task must still be running or stopping on that node in that attempt.
    SaveExitCheckpoint {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The task's reservation epoch (its attempt).
        epoch: u64,
        /// Where the checkpoint is, its size and digest.
        manifest: ManifestUpload,
    },
    /// Forget finished allocations (done, failed or cancelled) whose end is
    /// at least `retention_ms` before the entry's time, oldest first, and
    /// idempotency keys whose window has passed; at most `max` of each.
    /// Apply decides from the entry's own time, so every replica forgets
    /// the same ones. Their records live on in the job history.
    ForgetFinished {
        /// How long a finished allocation stays in the live state, ms.
        retention_ms: u64,
        /// How long after its submit an idempotency key is honoured at
        /// least (it is also honoured while its allocation is held), ms.
        key_window_ms: u64,
        /// Most allocations, and most keys, one entry forgets.
        max: u32,
    },
    /// A node's agent deleted the bytes of these retired checkpoints (it is
    /// their deleter): the state forgets them.
    ForgetCheckpoints {
        /// The reporting node.
        node: NodeId,
        /// The manifests' numbers (at most
        /// [`MAX_FORGET_CHECKPOINTS`](super::types::MAX_FORGET_CHECKPOINTS)).
        seqs: Vec<u64>,
    },
    /// A task's process failed, with the tail of its stderr: `FailTask`
    /// plus what the fail-fast rule compares (the same early failure twice
    /// in a row fails the allocation) and `alloc get` shows.
    FailTaskWithTail {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch of the attempt.
        epoch: u64,
        /// The exit code, if the process exited with one.
        exit_code: Option<i32>,
        /// The last lines of its stderr (at most
        /// [`crate::sm::MAX_FAILURE_TAIL_BYTES`], as
        /// [`crate::sm::failure_tail`] cuts them).
        tail: String,
    },
    /// An admin sets the cluster's checkpoint settings: the default store,
    /// how many checkpoints each task keeps, and the default cap.
    SetCheckpointSettings {
        /// The settings, whole.
        settings: CheckpointSettings,
        /// The admin.
        by: String,
    },
    /// An attempt's end report (`FinishTask`, `FailTask`,
    /// `FailTaskWithTail`, `ConfirmPreempted` or `TripWatchdog`) with what
    /// the attempt used, from its cgroup: applied as the report, and the
    /// usage kept with the attempt. An attempt the kernel killed in part for
    /// going over its memory limit ends `oom_killed`.
    Accounted {
        /// What the attempt used.
        usage: super::types::AttemptUsage,
        /// The end report.
        report: Box<Command>,
    },
    /// A job array: one spec, elements materialised lazily (the array
    /// takes the next id, its elements the ids after it).
    SubmitArray {
        /// What every element runs.
        spec: AllocSpec,
        /// Its indices and throttle.
        indices: super::types::ArrayIndices,
        /// `--after-corr`: element k waits for element k of this array.
        corr: Option<AllocId>,
        /// The secrets of every element.
        secrets: Secrets,
    },
    /// Cancel some elements of an array (materialised ones like any
    /// allocation; the rest are never materialised).
    CancelArrayElements {
        /// The array.
        array: AllocId,
        /// Which elements, by index (the throttle is ignored).
        indices: super::types::ArrayIndices,
    },
    /// A workflow: every step (an allocation or an array) submitted in
    /// one entry, accepted or refused whole.
    SubmitWorkflow {
        /// Its steps and what each waits for.
        workflow: super::types::WorkflowSpec,
    },
    /// Change how many of an array's elements may run at once (0: no limit).
    SetArrayThrottle {
        /// The array.
        array: AllocId,
        /// The new throttle.
        throttle: u32,
        /// Who asked.
        by: String,
    },
    /// A claimed task's image could not be pulled on its node (not found,
    /// refused, unreachable, a bad layer, a full disk). Not a failure of the
    /// task nor of the node: the attempt is refunded, nothing is charged to
    /// the retry budget, and the gang is placed elsewhere if it can be;
    /// after [`MAX_IMAGE_PULL_FAILURES`] of them the allocation fails with
    /// `image_pull_failed` and the registry's message.
    FailImagePull {
        /// The allocation.
        alloc: AllocId,
        /// The task.
        task: TaskIndex,
        /// The reporting node.
        node: NodeId,
        /// The reservation epoch the claim was made under.
        epoch: u64,
        /// What the registry or the cache said (at most
        /// [`MAX_AGENT_REASON_BYTES`]).
        reason: String,
    },
    /// The image digests a node's cache holds (replacing those it held):
    /// admission prefers, among equally good fits, nodes that hold a gang's
    /// image. At most [`super::types::MAX_NODE_IMAGES`], each a digest as
    /// an image reference pins one.
    SetNodeImages {
        /// The node.
        node: NodeId,
        /// Its digests.
        digests: Vec<String>,
    },
    /// The reasons queued gangs wait, where an admission pass found them
    /// changed (at most [`super::types::MAX_WAIT_NOTES`]). A note about a
    /// gang no longer queued under the epoch it names is skipped.
    NoteWaits {
        /// The notes.
        notes: Vec<WaitNote>,
    },
    /// Compact finished allocations whose end is at least `detail_ms`
    /// before the entry's time, and the oldest beyond the newest
    /// `keep_whole`, oldest first (at most `max`): the live state keeps
    /// their status, whether they started, their times and their key's
    /// spec hash, and drops the rest, which their job-history records hold.
    /// Apply decides from the entry's own time and the state.
    CompactFinished {
        /// How long a finished allocation stays whole, ms.
        detail_ms: u64,
        /// The most finished allocations held whole.
        keep_whole: u64,
        /// Most allocations one entry compacts.
        max: u32,
    },
}

/// Why one queued gang waits, as an admission pass found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitNote {
    /// The allocation.
    pub alloc: AllocId,
    /// Its reservation epoch when the pass looked (the note is stale once
    /// it is placed).
    pub epoch: u64,
    /// The reason (one admission names).
    pub wait: super::types::Wait,
    /// What holds it (at most [`super::types::MAX_WAIT_HOLDERS`]).
    pub holders: Vec<super::types::WaitHolder>,
}

/// Pull failures after which an allocation fails with `image_pull_failed`
/// (each one on a node its next placement avoids).
pub const MAX_IMAGE_PULL_FAILURES: u32 = 3;

/// The longest reason from an agent a command carries (a start failure, an
/// unusable checkpoint); the agent hub cuts longer ones before proposing.
pub const MAX_AGENT_REASON_BYTES: usize = 1024;

impl Command {
    /// The (allocation, task, node, epoch) of an attempt's end report, the
    /// commands [`Command::Accounted`] may carry.
    pub fn end_report(&self) -> Option<(AllocId, TaskIndex, &NodeId, u64)> {
        match self {
            Command::FinishTask { alloc, task, node, epoch }
            | Command::FailTask { alloc, task, node, epoch, .. }
            | Command::FailTaskWithTail { alloc, task, node, epoch, .. }
            | Command::ConfirmPreempted { alloc, task, node, epoch, .. }
            | Command::TripWatchdog { alloc, task, node, epoch, .. } => Some((*alloc, *task, node, *epoch)),
            _ => None,
        }
    }

    /// Its size in the log, encoded (postcard), in bytes.
    pub fn encoded_len(&self) -> usize {
        postcard::experimental::serialized_size(self).expect("a command always encodes")
    }

    /// A short name for logs and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Command::RegisterNode { .. } => "register_node",
            Command::Submit { .. } => "submit",
            Command::SubmitWithSecrets { .. } => "submit",
            Command::ReserveGang { .. } => "reserve_gang",
            Command::RollbackGang { .. } => "rollback_gang",
            Command::StartTask { .. } => "start_task",
            Command::FinishTask { .. } => "finish_task",
            Command::FailTask { .. } | Command::FailTaskWithTail { .. } => "fail_task",
            Command::CancelAllocation { .. } => "cancel_allocation",
            Command::ConfirmPreempted { .. } => "confirm_preempted",
            Command::SaveCheckpoint { .. } => "save_checkpoint",
            Command::SaveExitCheckpoint { .. } => "save_exit_checkpoint",
            Command::FailTaskToStart { .. } => "fail_task_to_start",
            Command::DropCheckpoint { .. } => "drop_checkpoint",
            Command::ForceTeardown { .. } => "force_teardown",
            Command::Preempt { .. } => "preempt",
            Command::ExpireNomination { .. } => "expire_nomination",
            Command::TripWatchdog { .. } => "trip_watchdog",
            Command::Accounted { report, .. } => report.name(),
            Command::MarkNodeLost { .. } => "mark_node_lost",
            Command::MarkNodeReady { .. } => "mark_node_ready",
            Command::DrainNode { .. } => "drain_node",
            Command::AdmitNode { .. } => "admit_node",
            Command::LabelNode { .. } => "label_node",
            Command::CancelDrain { .. } => "cancel_drain",
            Command::ExpireDrain { .. } => "expire_drain",
            Command::StopNode { .. } => "stop_node",
            Command::RestartNode { .. } => "restart_node",
            Command::TerminateNode { .. } => "terminate_node",
            Command::CreateToken { .. } => "create_token",
            Command::RevokeToken { .. } => "revoke_token",
            Command::CreateVCluster { .. } => "create_vcluster",
            Command::UpdateVCluster { .. } => "update_vcluster",
            Command::Reclaim { .. } => "reclaim",
            Command::ForgetFinished { .. } => "forget_finished",
            Command::ForgetCheckpoints { .. } => "forget_checkpoints",
            Command::SetCheckpointSettings { .. } => "set_checkpoint_settings",
            Command::SubmitArray { .. } => "submit_array",
            Command::CancelArrayElements { .. } => "cancel_array_elements",
            Command::SetArrayThrottle { .. } => "set_array_throttle",
            Command::SubmitWorkflow { .. } => "submit_workflow",
            Command::FailImagePull { .. } => "fail_image_pull",
            Command::SetNodeImages { .. } => "set_node_images",
            Command::NoteWaits { .. } => "note_waits",
            Command::CompactFinished { .. } => "compact_finished",
        }
    }
}
