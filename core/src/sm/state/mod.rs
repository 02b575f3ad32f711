//! The replicated state and its one entry point, [`State::apply`].
//!
//! ```text
//!            Submit                 ReserveGang              StartTask
//!   (none) ─────────▶ Blocked ──────────────────▶ Reserved ───────────▶ Running
//!                       ▲  ▲   RollbackGang (no task    │                 │ │
//!                       │  └──────── started yet) ◀─────┘      FinishTask │ │ FailTask
//!                       │                                                 ▼ │
//!                       │            retries left, whole gang settled   Done│
//!                       └───────────────────────────────────────────────────┘
//!                                   out of retries / a sibling Done ─▶ Failed
//!
//!   Gang teardown (a task fails, its node is lost, or its reservation goes
//!   stale while siblings run), in the same command:
//!     trigger ─▶ Blocked (keeps its attempt)   Running siblings ─▶ Preempting (refunded)
//!     Reserved siblings ─▶ Blocked             Blocked / Done stay
//!   Preempting ── ConfirmPreempted{epoch} | ForceTeardown | node lost | exit ──▶ Preempted
//!   last one stopped ─▶ Preempted ─▶ Blocked; gang Queued, or Failed when a task
//!   is out of retries or already Done
//!
//!   CancelAllocation, nothing running: reserved tasks released, every
//!   unfinished task ─▶ Cancelled. Tasks running or stopping: a teardown with
//!   cause Cancelled (a new epoch; capacity held until each stop is acked or
//!   forced), and when the last one stops, every unfinished task ─▶ Cancelled
//! ```
//!
//! Every handler checks everything before it changes anything, so a rejected
//! command leaves the state exactly as it was. Derived indexes (node lookup,
//! free-capacity index, queue, reservations) are kept in step with every
//! change and rebuilt after a snapshot is decoded; they are not part of the
//! snapshot or the digest.
//!
//! This file holds the state's types, its constructor and `apply`; the
//! handlers live beside it by concern: `reads`, `gangs` (submit, reserve,
//! start, finish, fail), `teardown` (teardowns and cancels), `checkpoints`,
//! `preempt` (priority preemption, reclamation, held nodes), `nodes`
//! (registration and lifecycle), `tokens`, `vclusters` (and quotas), `retention`,
//! `index` (shared checks and moves, derived indexes) and `invariants`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::command::{Command, MAX_IMAGE_PULL_FAILURES};
use super::event::{Event, Outcome};
use super::rejection::Rejection;
use super::types::DEFAULT_VCLUSTER;
use super::types::{
    AGENT_SET_LABELS, Admission, Failure, MAX_FAILURE_TAIL_BYTES, OomKill, agent_may_set, failure_tail,
};
use super::types::{
    ATTEMPT_LOG_LIMIT, AllocEvent, AllocId, AllocSpec, AllocStatus, Allocation, Attempt, AttemptEnd, CheckpointMode,
    CheckpointSettings, Drain, HISTORY_LIMIT, NODE_HISTORY_LIMIT, Node, NodeId, NodePolicy, NodeSlot, NodeStatus,
    Nomination, Placement, PreemptReason, Resources, RetiredCheckpoint, Secrets, Task, TaskIndex, TaskStatus, Teardown,
    TeardownCause, TeardownOutcome, Token, TokenRole, Usage, VClusterType, fits,
};
use super::validate::{
    Limits, check_name, invalid_node, validate_admission, validate_node, validate_node_request, validate_secrets,
    validate_spec,
};
use super::vcluster::{HomeNodes, OverQuota, VCluster, VClusterSpec};
use crate::history::JobRecord;
pub use arrays::{ArrayCounts, array_sha256};
pub use dependencies::{MAX_TOMBSTONES, Tombstone};
pub use retention::{
    CompactKey, Compacted, ForgottenKey, MAX_FORGET_PER_ENTRY, MAX_KEEP_WHOLE, MIN_RETENTION_MS, spec_sha256,
};

mod allocmap;
pub use allocmap::AllocMap;
mod compactmap;
pub use compactmap::CompactMap;
mod arrays;
mod attempts;
mod checkpoints;
mod dependencies;
mod gangs;
mod index;
mod invariants;
mod nodes;
mod preempt;
mod reads;
mod retention;
mod teardown;
mod tokens;
pub use tokens::MAX_TOKENS;
mod vclusters;
mod waits;
mod workflows;
pub use workflows::workflow_sha256;

/// What `apply` may know besides the command: the entry's leader-stamped time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyCtx {
    /// The leader's wall clock when it proposed the entry, in ms since the epoch.
    pub time_ms: u64,
}

/// The admission order of a queued gang: largest first, then higher class,
/// then a retry after a watchdog trip, then higher priority, then earlier
/// submit, then lower id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    /// Gang size, descending.
    pub gang_size: Reverse<u32>,
    /// Preemption class, descending.
    pub class: Reverse<u8>,
    /// A watchdog retry goes first in its class.
    pub retry_first: Reverse<bool>,
    /// Priority, descending.
    pub priority: Reverse<i32>,
    /// Submit time, ascending.
    pub submit_time_ms: u64,
    /// Id, ascending (the final tie-break).
    pub alloc: AllocId,
}

impl QueueKey {
    /// The key of an allocation.
    pub fn of(a: &Allocation) -> QueueKey {
        QueueKey {
            gang_size: Reverse(a.spec.gang_size),
            class: Reverse(a.spec.preemption_class),
            retry_first: Reverse(a.retry_first),
            priority: Reverse(a.spec.priority),
            submit_time_ms: a.submit_time_ms,
            alloc: a.id,
        }
    }
}

/// What admission needs to know to tell whether two gangs compete for the
/// same capacity in the same way: gang size, per-task resources and where
/// they may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    /// Gang size.
    pub gang_size: u32,
    /// Per-task resources.
    pub resources: Resources,
    /// The placement's fingerprint ([`placement_key`]; 0: anywhere).
    pub placement: u64,
}

impl Shape {
    /// The least shape (a range start).
    pub const MIN: Shape =
        Shape { gang_size: 0, resources: Resources { gpus: 0, vram_mb: 0, mem_mb: 0, cpus: 0 }, placement: 0 };

    /// The shape of an allocation.
    pub fn of(a: &Allocation) -> Shape {
        Shape { gang_size: a.spec.gang_size, resources: a.spec.resources, placement: placement_key(&a.spec.placement) }
    }
}

/// A placement's fingerprint: 0 for "anywhere", else the first 8 bytes of
/// the SHA-256 of its encoding (content-derived, so every replica and every
/// rebuild groups gangs alike).
pub fn placement_key(p: &Placement) -> u64 {
    if p.is_any() {
        return 0;
    }
    let bytes = postcard::to_stdvec(p).expect("encoding a placement into memory cannot fail");
    let digest = sha2::Sha256::digest(&bytes);
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")).max(1)
}

/// Lookups derived from the replicated fields; never serialized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Indexes {
    node_by_id: BTreeMap<NodeId, NodeSlot>,
    /// Ready nodes not held for a preemptor by (home key, free GPUs,
    /// slot): the capacity index admission walks.
    free_gpus: BTreeSet<(u32, u32, NodeSlot)>,
    /// Queued allocations in admission order.
    queue: BTreeSet<QueueKey>,
    /// Queued allocations grouped by their vCluster's home key and shape,
    /// each group in admission order.
    queue_by_shape: BTreeMap<(u32, Shape), BTreeSet<QueueKey>>,
    /// Queued allocations in submit order.
    queue_fifo: BTreeSet<AllocId>,
    /// How many allocations in `queue` each preemption class has.
    queued_by_class: BTreeMap<u8, u32>,
    /// Allocations holding at least one unclaimed reservation.
    reserved: BTreeSet<AllocId>,
    /// Tasks holding capacity (reserved, running or preempting), by node.
    tasks_by_node: BTreeMap<NodeSlot, BTreeSet<(AllocId, TaskIndex)>>,
    /// Allocations with a teardown in progress.
    tearing_down: BTreeSet<AllocId>,
    /// Queued gangs backing off after a failure, by (`retry_after_ms`, id):
    /// the leader wakes admission when the first one ends.
    backoffs: BTreeSet<(u64, AllocId)>,
    /// Nodes held for a preemptor, and for which.
    held: BTreeMap<NodeSlot, AllocId>,
    /// Queued allocations (not waiting on held nodes) that may preempt
    /// (class ≥ 1): highest class first, then admission order.
    preemptors: BTreeSet<(Reverse<u8>, QueueKey)>,
    /// Per node (by slot), what each task holding capacity there holds and
    /// its class, sorted by allocation: preemption bounds a node's freeable
    /// capacity from this without looking up allocations.
    holders: Vec<Vec<Holder>>,
    /// Nodes by lifecycle status.
    by_status: BTreeMap<NodeStatus, BTreeSet<NodeSlot>>,
    /// Draining or stopping nodes whose last task left during the command
    /// being applied (always empty between commands): they stop at its end.
    emptied: Vec<NodeSlot>,
    /// What each vCluster's reserved, running and preempting tasks hold
    /// (hard quotas are checked against it).
    vc_load: BTreeMap<String, VcLoad>,
    /// Each vCluster's live (not finished) allocations and the GPUs their
    /// gangs ask for: the demand a `reject`-mode quota counts at submission.
    vc_live: BTreeMap<String, VcDemand>,
    /// The vClusters in name order: vCluster `home_names[k - 1]` has home
    /// key `k`; key 0 is "no home" (a shared node every vCluster may use).
    home_names: Vec<String>,
    /// Each vCluster's home key.
    home_key: BTreeMap<String, u32>,
    /// Each node's home key, by slot.
    node_home: Vec<u32>,
    /// Per lending vCluster (home key): the other vClusters' allocations
    /// holding capacity on its nodes, and how many tasks each.
    lent: BTreeMap<u32, BTreeMap<AllocId, u32>>,
    /// Queued gangs not holding nodes, per vCluster home key.
    vc_queued: BTreeMap<u32, u32>,
    /// Finished allocations held whole, by (end, id): what compaction
    /// takes first, and retention forgets first with `compacted_by_end`.
    detailed: BTreeSet<(u64, AllocId)>,
    /// Compacted allocations' ids in (end, id) order. Compaction takes the
    /// oldest whole ones first, so a new one nearly always goes at the back
    /// (8 bytes each, against about 35 in a B-tree of (end, id): there may
    /// be a million).
    compacted_by_end: VecDeque<AllocId>,
    /// Forgotten idempotency keys by (expiry, owner, key).
    key_expiry: BTreeSet<(u64, String, String)>,
    /// Rendezvous ports held on each node (by task 0 of a placed gang).
    ports_held: BTreeMap<NodeSlot, BTreeSet<u16>>,
    /// Tasks with a checkpoint on a node's own disk, by that node.
    checkpoints_on_node: BTreeMap<NodeId, BTreeSet<(AllocId, TaskIndex)>>,
    /// Retired checkpoints by the node whose agent deletes them.
    retired_by_deleter: BTreeMap<NodeId, BTreeSet<u64>>,
    /// Waiting allocations by each allocation they wait for.
    dependents: BTreeMap<AllocId, BTreeSet<AllocId>>,
    /// Waiting allocations, by id.
    waiting: BTreeSet<AllocId>,
    /// Each array's materialised elements that have not ended.
    array_live: BTreeMap<AllocId, BTreeSet<AllocId>>,
    /// Each array's materialised elements not yet placed (waiting, queued
    /// or suspended): the window its materialisation keeps.
    array_unplaced: BTreeMap<AllocId, BTreeSet<AllocId>>,
    /// Finished arrays by (end, id): what retention forgets first.
    finished_arrays: BTreeSet<(u64, AllocId)>,
    /// Each workflow step's id (an allocation or an array): its workflow
    /// and its place among the steps.
    workflow_steps: BTreeMap<AllocId, (AllocId, u32)>,
}

/// A vCluster's live allocations and the GPUs their gangs need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcDemand {
    /// GPUs the live gangs need in all.
    pub gpus: u64,
    /// The live allocations.
    pub allocs: BTreeSet<AllocId>,
}

/// Counts one fewer under `key`, dropping it at zero (so a derived index
/// equals its rebuild, which never holds zeros).
fn decrement<K: Ord>(map: &mut BTreeMap<K, u32>, key: K) {
    let n = map.get_mut(&key).expect("counted");
    *n -= 1;
    if *n == 0 {
        map.remove(&key);
    }
}

/// What one vCluster's tasks holding capacity hold: the quantities its
/// hard quotas limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcLoad {
    /// GPUs held.
    pub gpus: u64,
    /// GPUs held on other vClusters' home nodes (borrowed capacity).
    pub borrowed_gpus: u64,
    /// Tasks holding capacity, by allocation.
    pub allocs: BTreeMap<AllocId, u32>,
    /// Tasks holding capacity, by node.
    pub nodes: BTreeMap<NodeSlot, u32>,
}

impl VcLoad {
    /// Adds a gang of `a` placed on `slots` (an admission pass's own
    /// reservations, before they are applied).
    pub fn add_gang(&mut self, a: &Allocation, slots: &[NodeSlot]) {
        self.gpus += u64::from(a.spec.resources.gpus) * slots.len() as u64;
        *self.allocs.entry(a.id).or_default() += slots.len() as u32;
        for s in slots {
            *self.nodes.entry(*s).or_default() += 1;
        }
    }
}

/// A task holding capacity on a node, as the preemption policy sees it
/// before looking its allocation up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The allocation.
    pub alloc: AllocId,
    /// Its preemption class.
    pub class: u8,
    /// What the task holds.
    pub usage: Usage,
    /// When its walltime ends: its start (or, not yet started, its
    /// reservation) plus the walltime. Backfill's projection reads it.
    pub walltime_ends_ms: u64,
}

/// The whole replicated state of the scheduler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    limits: Limits,
    now_ms: u64,
    next_alloc_id: AllocId,
    nodes: Vec<Node>,
    /// Shared with any copy taken for encoding (see
    /// [`State::encoding_copy`]) until either side changes one.
    allocs: AllocMap,
    /// Finished allocations past the detail window: only what dependencies,
    /// idempotency and cancels still need (`retention.rs`); the job history
    /// holds the rest. Chunked like `allocs`, for the same reason.
    compacted: CompactMap,
    idempotency: BTreeMap<(String, String), AllocId>,
    /// Idempotency keys whose allocation was forgotten, until their window
    /// ends.
    forgotten_keys: BTreeMap<(String, String), ForgottenKey>,
    /// Allocations forgotten after their retention window, in all.
    forgotten_allocs: u64,
    /// Allocations that have finished, in all (the last `finish_seq`).
    finished_total: u64,
    /// Bearer tokens by id (hashes only).
    tokens: BTreeMap<String, Token>,
    /// vClusters by name (the built-in `default` only once changed).
    vclusters: BTreeMap<String, VCluster>,
    /// The cluster's checkpoint settings.
    checkpoint_settings: CheckpointSettings,
    /// The next checkpoint manifest's number.
    next_checkpoint_seq: u64,
    /// Manifests no task names any more, whose bytes wait to be deleted.
    retired_checkpoints: BTreeMap<u64, RetiredCheckpoint>,
    /// Retired checkpoints given up on (past the cap, or with no node left
    /// to delete them), in all.
    abandoned_checkpoints: u64,
    /// What admins decided about node names: admissions and labels.
    node_policies: BTreeMap<NodeId, NodePolicy>,
    /// Live allocations' secrets (dropped when they finish).
    secrets: BTreeMap<AllocId, Secrets>,
    /// How forgotten allocations ended, for dependencies named on them
    /// later (the newest [`dependencies::MAX_TOMBSTONES`]).
    tombstones: BTreeMap<AllocId, dependencies::Tombstone>,
    /// Job arrays by id (finished ones until retention forgets them).
    arrays: BTreeMap<AllocId, super::types::JobArray>,
    /// Workflows by id (until retention forgets every step).
    workflows: BTreeMap<AllocId, super::types::Workflow>,
    #[serde(skip)]
    index: Indexes,
    /// Nodes whose agents may have something new to hear since the last
    /// [`State::take_touched_nodes`]; never serialized, never compared.
    #[serde(skip)]
    touched: Touched,
}

/// What applied commands left for the shell: the nodes they touched, and
/// the records of allocations that finished. Not part of the replicated
/// state (two states are equal whatever they hold).
#[derive(Clone, Debug, Default)]
struct Touched {
    nodes: BTreeSet<NodeSlot>,
    /// Allocations that finished (or, after a rebuild, are held finished)
    /// and whose record is not yet built.
    finished: Vec<AllocId>,
    /// Built records, for [`State::take_finished_records`].
    records: Vec<JobRecord>,
    /// The usage of the attempt whose end report is being applied
    /// ([`Command::Accounted`]), for the failure it may record.
    usage: Option<(AllocId, TaskIndex, super::types::AttemptUsage)>,
}

impl PartialEq for Touched {
    fn eq(&self, _: &Touched) -> bool {
        true
    }
}

impl Eq for Touched {}

impl Default for State {
    fn default() -> Self {
        State::new(Limits::default())
    }
}

type Applied = Result<Vec<Event>, Rejection>;

impl State {
    /// A copy to encode (snapshot, digest) after letting go of the lock
    /// that guards this state. It is cheap: allocations are shared, and
    /// copied only when either side later changes one; the derived indexes
    /// are left out (encoding skips them). Its snapshot and digest are this
    /// state's; it is not a state to apply to.
    pub fn encoding_copy(&self) -> State {
        State {
            limits: self.limits.clone(),
            now_ms: self.now_ms,
            next_alloc_id: self.next_alloc_id,
            nodes: self.nodes.clone(),
            allocs: self.allocs.clone(),
            compacted: self.compacted.clone(),
            idempotency: self.idempotency.clone(),
            forgotten_keys: self.forgotten_keys.clone(),
            forgotten_allocs: self.forgotten_allocs,
            finished_total: self.finished_total,
            tokens: self.tokens.clone(),
            vclusters: self.vclusters.clone(),
            checkpoint_settings: self.checkpoint_settings.clone(),
            next_checkpoint_seq: self.next_checkpoint_seq,
            retired_checkpoints: self.retired_checkpoints.clone(),
            abandoned_checkpoints: self.abandoned_checkpoints,
            node_policies: self.node_policies.clone(),
            secrets: self.secrets.clone(),
            tombstones: self.tombstones.clone(),
            arrays: self.arrays.clone(),
            workflows: self.workflows.clone(),
            index: Indexes::default(),
            touched: Touched::default(),
        }
    }

    /// An empty state with these limits.
    pub fn new(limits: Limits) -> State {
        let mut s = State {
            limits,
            now_ms: 0,
            next_alloc_id: 1,
            nodes: Vec::new(),
            allocs: AllocMap::new(),
            compacted: CompactMap::default(),
            idempotency: BTreeMap::new(),
            forgotten_keys: BTreeMap::new(),
            forgotten_allocs: 0,
            finished_total: 0,
            tokens: BTreeMap::new(),
            vclusters: BTreeMap::new(),
            checkpoint_settings: CheckpointSettings::default(),
            next_checkpoint_seq: 1,
            retired_checkpoints: BTreeMap::new(),
            abandoned_checkpoints: 0,
            node_policies: BTreeMap::new(),
            secrets: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            arrays: BTreeMap::new(),
            workflows: BTreeMap::new(),
            index: Indexes::default(),
            touched: Touched::default(),
        };
        s.rebuild_indexes();
        s
    }

    // ----- the entry point -----------------------------------------------

    /// The nodes whose agents may have something new to hear (a task placed,
    /// stopping or gone; a status or drain change) since the last
    /// call, in slot order; clears the set. The agent hub wakes only those
    /// nodes' streams after an entry applies.
    pub fn take_touched_nodes(&mut self) -> BTreeSet<NodeSlot> {
        std::mem::take(&mut self.touched.nodes)
    }

    /// The job-history records of allocations that finished since the last
    /// call, in the order they finished; clears them. After a snapshot is
    /// decoded they also hold every finished allocation it still holds, so
    /// a replica that skipped entries stores what it can of them (the
    /// store ignores a sequence number it has).
    pub fn take_finished_records(&mut self) -> Vec<JobRecord> {
        std::mem::take(&mut self.touched.records)
    }

    /// Builds the records of the allocations that finished.
    fn flush_finished(&mut self) {
        for id in std::mem::take(&mut self.touched.finished) {
            if let Some(a) = self.allocs.get(&id) {
                let record = JobRecord::of(self, a);
                self.touched.records.push(record);
            }
        }
    }

    /// Applies one command. Never panics on bad input: a command that does not
    /// fit the state is rejected and changes nothing (the clock excepted).
    pub fn apply(&mut self, cmd: &Command, ctx: &ApplyCtx) -> Outcome {
        self.now_ms = self.now_ms.max(ctx.time_ms);
        let result = match cmd {
            Command::Accounted { usage, report } => self.accounted(usage, report),
            cmd => self.dispatch(cmd),
        };
        match result {
            Ok(mut events) => {
                events.extend(self.stop_emptied_nodes());
                // Dependents settle and arrays materialise until neither
                // has anything more to do (a dependent that fails may end
                // an array element, which may free a place for the next).
                let mut from = 0;
                loop {
                    let settled = self.settle_dependents(&events[from..]);
                    let mut arrays = self.arrays_touched(&events[from..]);
                    arrays.extend(self.arrays_touched(&settled));
                    from = events.len();
                    events.extend(settled);
                    for array in arrays {
                        let filled = self.fill_array(array);
                        events.extend(filled);
                    }
                    if events.len() == from {
                        break;
                    }
                }
                self.record_history(&events);
                self.log_attempts(&events);
                self.flush_finished();
                Outcome::Accepted(events)
            }
            Err(rejection) => Outcome::Rejected(rejection),
        }
    }

    /// An end report with the attempt's usage: the report applies as
    /// itself (its failure, if it records one, knowing of an OOM kill), then
    /// the usage goes with the attempt it ended, and an OOM kill is an
    /// event of its own.
    fn accounted(&mut self, usage: &super::types::AttemptUsage, report: &Command) -> Result<Vec<Event>, Rejection> {
        let Some((alloc, task, node, _)) = report.end_report() else {
            return Err(Rejection::NotAnEndReport { command: report.name().to_string() });
        };
        let node = node.clone();
        self.touched.usage = Some((alloc, task, *usage));
        let result = self.dispatch(report);
        self.touched.usage = None;
        let mut events = result?;
        let run = self.allocs.get(&alloc).and_then(|a| a.tasks.get(task as usize)).map_or(0, |t| t.runs);
        self.mark_open(alloc, task, |a| a.usage = Some(*usage));
        if usage.oom_killed() {
            // What happened first: the kernel's kill, then the failure.
            events.insert(
                0,
                Event::OutOfMemory {
                    alloc,
                    task,
                    node,
                    run,
                    limit_bytes: usage.memory_limit_bytes,
                    peak_bytes: usage.peak_memory_bytes,
                },
            );
        }
        Ok(events)
    }

    /// Applies one command that is not [`Command::Accounted`]: its events,
    /// or why it does not fit the state (then nothing changed).
    fn dispatch(&mut self, cmd: &Command) -> Result<Vec<Event>, Rejection> {
        match cmd {
            Command::Accounted { .. } => Err(Rejection::NotAnEndReport { command: "a usage report".to_string() }),
            Command::RegisterNode { node, resources, labels } => self.register_node(node, resources, labels),
            Command::Submit { spec } => self.submit(spec, &Secrets::default()),
            Command::SubmitWithSecrets { spec, secrets } => self.submit(spec, secrets),
            Command::ReserveGang { alloc, epoch, nodes } => self.reserve_gang(*alloc, *epoch, nodes),
            Command::RollbackGang { alloc, epoch } => self.rollback_gang(*alloc, *epoch),
            Command::StartTask { alloc, task, node, epoch } => self.start_task(*alloc, *task, node, *epoch),
            Command::FinishTask { alloc, task, node, epoch } => self.finish_task(*alloc, *task, node, *epoch),
            Command::FailTask { alloc, task, node, epoch, exit_code } => {
                self.fail_task(*alloc, *task, node, *epoch, *exit_code, None)
            }
            Command::FailTaskWithTail { alloc, task, node, epoch, exit_code, tail } => {
                self.fail_task_with_tail(*alloc, *task, node, *epoch, *exit_code, tail)
            }
            Command::CancelAllocation { alloc } => self.cancel(*alloc),
            Command::ConfirmPreempted { alloc, task, node, epoch, checkpoint_failed } => {
                self.task_preempted(*alloc, *task, node, *epoch, *checkpoint_failed)
            }
            Command::SaveCheckpoint { alloc, task, node, epoch, manifest } => {
                self.save_checkpoint(*alloc, *task, node, *epoch, manifest)
            }
            Command::FailTaskToStart { alloc, task, node, epoch, reason } => {
                self.fail_task_to_start(*alloc, *task, node, *epoch, reason)
            }
            Command::SaveExitCheckpoint { alloc, task, node, epoch, manifest } => {
                self.save_exit_checkpoint(*alloc, *task, node, *epoch, manifest)
            }
            Command::DropCheckpoint { alloc, task, node, epoch, seq, reason } => {
                self.drop_checkpoint(*alloc, *task, node, *epoch, *seq, reason)
            }
            Command::ForceTeardown { alloc, epoch } => self.force_teardown(*alloc, *epoch),
            Command::Preempt { alloc, victims, nodes, hold_ms } => {
                self.preempt(*alloc, victims, nodes, *hold_ms, false)
            }
            Command::Reclaim { alloc, victims, nodes, hold_ms } => self.preempt(*alloc, victims, nodes, *hold_ms, true),
            Command::ExpireNomination { alloc } => self.expire_nomination(*alloc),
            Command::TripWatchdog { alloc, task, node, epoch, kind } => {
                self.trip_watchdog(*alloc, *task, node, *epoch, *kind)
            }
            Command::MarkNodeLost { node } => self.mark_node_lost(node),
            Command::MarkNodeReady { node } => self.node_ready(node),
            Command::DrainNode { node, timeout_ms, reason, by } => self.drain_node(node, *timeout_ms, reason, by),
            Command::AdmitNode { node, admission } => self.admit_node(node, admission.as_ref()),
            Command::LabelNode { node, set, remove, by } => self.label_node(node, set, remove, by),
            Command::CancelDrain { node, by } => self.cancel_drain(node, by),
            Command::ExpireDrain { node } => self.expire_drain(node),
            Command::StopNode { node, reason, by } => self.stop_node(node, reason, by),
            Command::RestartNode { node, by } => self.restart_node(node, by),
            Command::TerminateNode { node, by } => self.terminate_node(node, by),
            Command::CreateToken { id, name, role, sha256, expires_ms, by } => {
                self.create_token(id, name, *role, *sha256, *expires_ms, by)
            }
            Command::RevokeToken { id, by } => self.revoke_token(id, by),
            Command::CreateVCluster { name, spec, by } => self.put_vcluster(name, spec, by, true),
            Command::UpdateVCluster { name, spec, by } => self.put_vcluster(name, spec, by, false),
            Command::ForgetFinished { retention_ms, key_window_ms, max } => {
                self.forget_finished(*retention_ms, *key_window_ms, *max)
            }
            Command::CompactFinished { detail_ms, keep_whole, max } => {
                self.compact_finished(*detail_ms, *keep_whole, *max)
            }
            Command::ForgetCheckpoints { node, seqs } => self.forget_checkpoints(node, seqs),
            Command::SetCheckpointSettings { settings, by } => self.set_checkpoint_settings(settings, by),
            Command::SubmitArray { spec, indices, corr, secrets } => self.submit_array(spec, indices, *corr, secrets),
            Command::CancelArrayElements { array, indices } => self.cancel_array(*array, Some(indices)),
            Command::SetArrayThrottle { array, throttle, by } => self.set_array_throttle(*array, *throttle, by),
            Command::SubmitWorkflow { workflow } => self.submit_workflow(workflow),
            Command::FailImagePull { alloc, task, node, epoch, reason } => {
                self.fail_image_pull(*alloc, *task, node, *epoch, reason)
            }
            Command::SetNodeImages { node, digests } => self.set_node_images(node, digests),
            Command::NoteWaits { notes } => self.note_waits(notes),
        }
    }

    /// Appends each event to its allocation's or node's history (a
    /// duplicate submit changed nothing and is not recorded).
    fn record_history(&mut self, events: &[Event]) {
        for e in events {
            if matches!(e, Event::Submitted { duplicate: true, .. }) {
                continue;
            }
            let phase = e.alloc().and_then(|id| self.wait_phase_change(id));
            // A start tells no agent anything new: the claiming agent hears
            // of it on its own stream, the node's assignments, stops and
            // preempts are as they were, and so are the grants (a task is
            // granted its checkpoints while reserved and while running).
            // Not waking the streams of its nodes saves one sync a task.
            let quiet = matches!(e, Event::TaskStarted { .. });
            if let Some(a) = e.alloc().and_then(|id| self.allocs.get_mut(&id).map(Arc::make_mut)) {
                if !quiet {
                    self.touched.nodes.extend(a.tasks.iter().filter_map(|t| t.node));
                    // The nodes holding its checkpoints on their disks: a
                    // task placed elsewhere may fetch from them now (their
                    // grants).
                    for m in a.tasks.iter().flat_map(|t| &t.checkpoints) {
                        if m.store == super::types::CheckpointStore::Node
                            && let Some(&slot) = self.index.node_by_id.get(&m.writer)
                        {
                            self.touched.nodes.insert(slot);
                        }
                    }
                }
                a.revision += 1;
                let status = Some(a.status);
                if let Some((wait, holders)) = phase {
                    a.waits.push(self.now_ms, wait, holders);
                }
                a.history.push_back(AllocEvent {
                    revision: a.revision,
                    time_ms: self.now_ms,
                    event: e.clone(),
                    status,
                });
                if a.history.len() > HISTORY_LIMIT {
                    a.history.pop_front();
                }
            }
            if let Some(slot) = e.node().and_then(|id| self.index.node_by_id.get(id).copied()) {
                if !quiet {
                    self.touched.nodes.insert(slot);
                }
                let n = &mut self.nodes[slot.0 as usize];
                n.revision += 1;
                // Shared with a snapshot's encoding copy until then: the
                // first event after a copy copies the history once.
                let history = Arc::make_mut(&mut n.history);
                history.push_back(AllocEvent {
                    revision: n.revision,
                    time_ms: self.now_ms,
                    event: e.clone(),
                    status: None,
                });
                if history.len() > NODE_HISTORY_LIMIT {
                    history.pop_front();
                }
            }
        }
    }
}

/// A reason an agent gives (a start failure, an unusable checkpoint) is at
/// most [`super::command::MAX_AGENT_REASON_BYTES`].
pub(super) fn check_agent_reason(reason: &str) -> Result<(), Rejection> {
    if reason.len() > super::command::MAX_AGENT_REASON_BYTES {
        return Err(Rejection::InvalidNode {
            field: "reason".into(),
            reason: format!("{} bytes, over {}", reason.len(), super::command::MAX_AGENT_REASON_BYTES),
        });
    }
    Ok(())
}
