//! The deterministic state machine.
//!
//! `sm` owns the replicated state and the one function that changes it:
//! [`State::apply`]`(&Command, &ApplyCtx) -> Outcome`. It is pure: no clock
//! (time is the entry's `time_ms`, and never goes back), no randomness, no
//! I/O, no async, and no hash-ordered iteration (every map is a `BTreeMap`).
//! Replicas that apply the same commands in the same order hold the same
//! state and report the same [`StateDigest`].
//!
//! ```text
//!   leader loops ── policy::plan(&State, now) ──▶ Vec<Command>
//!   API edge ─────── validate ─────────────────▶ Command
//!                                                  │ Raft log entry (time_ms, batch)
//!                                                  ▼
//!                             State::apply ──▶ Outcome { Accepted(events) | Rejected }
//! ```

mod command;
mod event;
mod rejection;
mod snapshot;
mod state;
mod types;
mod validate;
mod vcluster;

#[cfg(test)]
mod state_test;

pub use command::{Command, MAX_AGENT_REASON_BYTES, MAX_IMAGE_PULL_FAILURES, WaitNote};
pub use event::{Event, Outcome};
pub use rejection::Rejection;
pub use snapshot::{SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC, SnapshotError, StateDigest};
pub use state::{
    AllocMap, ApplyCtx, ArrayCounts, CompactKey, CompactMap, Compacted, ForgottenKey, Holder, MAX_FORGET_PER_ENTRY,
    MAX_KEEP_WHOLE, MAX_TOKENS, MAX_TOMBSTONES, MIN_RETENTION_MS, QueueKey, Shape, State, Tombstone, VcLoad,
    array_sha256, spec_sha256, workflow_sha256,
};
pub use types::{
    AGENT_SET_LABELS, ANY_LABEL_VALUE, ARRAY_WINDOW, ATTEMPT_LOG_LIMIT, Admission, After, AfterWhen, AllocEvent,
    AllocId, AllocSpec, AllocStatus, Allocation, ArrayIndices, ArrayRange, Attempt, AttemptEnd, AttemptUsage,
    CHECKPOINT_CAP_RANGE, CheckpointManifest, CheckpointMode, CheckpointSettings, CheckpointStore, ContainerSpec,
    DEFAULT_CHECKPOINT_ESTIMATE_S, DEFAULT_MAX_CHECKPOINT_BYTES, DEFAULT_MAX_RETRIES, DEFAULT_REGISTRY,
    DEFAULT_RENDEZVOUS_PORTS, DEFAULT_VCLUSTER, DEFAULT_WALLTIME_S, Dependency, Drain, Failure, HISTORY_LIMIT,
    IMAGES_LABEL, ISOLATION_LABEL, ImageRef, JobArray, LabelExpr, LabelOp, MAX_AFTER_EXPR_BYTES, MAX_ARRAY_ELEMENTS,
    MAX_ARRAY_EXPR_BYTES, MAX_ARRAY_INDEX, MAX_ARRAY_RANGES, MAX_CHECKPOINT_KEEP, MAX_CHECKPOINT_KEY_BYTES,
    MAX_CONSTRAINTS, MAX_CONTAINER_PATH_BYTES, MAX_DEPENDENCIES, MAX_FAILURE_TAIL_BYTES, MAX_FORGET_CHECKPOINTS,
    MAX_IMAGE_NAME_BYTES, MAX_IMAGE_REF_BYTES, MAX_MOUNTS, MAX_NODE_IMAGES, MAX_PIDS_MAX, MAX_RENDEZVOUS_PORTS,
    MAX_RETIRED_CHECKPOINTS, MAX_SECRET_VALUE_BYTES, MAX_SECRETS, MAX_SECRETS_BYTES, MAX_STEP_NAME_BYTES,
    MAX_STORE_SPEC_BYTES, MAX_WAIT_HOLDERS, MAX_WAIT_NOTES, MAX_WAIT_OWNER_BYTES, MAX_WAIT_SPANS, MAX_WORKFLOW_STEPS,
    MIN_WAIT_NOTE_GAP_MS, ManifestUpload, Mount, NODE_HISTORY_LIMIT, Node, NodeId, NodePolicy, NodeSlot, NodeStatus,
    Nomination, OBJECT_SCHEMES, OomKill, PORTS_LABEL, Packing, Placement, PortRange, PreemptReason,
    RESERVED_LABEL_PREFIX, Resources, RetiredCheckpoint, Secrets, Standing, Task, TaskIndex, TaskStatus, Teardown,
    TeardownCause, TeardownOutcome, Token, TokenRole, Usage, VCLUSTER_LABEL, VClusterType, Wait, WaitHolder, WaitLog,
    WaitSpan, WatchdogKind, Workflow, WorkflowSpec, WorkflowStep, agent_may_set, check_cap, check_container_path,
    check_digest, check_key, combined_standing, failure_tail, fits, holders_words, how_it_ended, is_image_digest,
    key_prefix, parse_after, valid_step_name, wait_words, waits_summary,
};
pub use validate::{
    DRAIN_TIMEOUT_LABEL, Limits, MAX_PREEMPTION_CLASS, MAX_REASON_BYTES, parse_duration_s, validate_admission,
    validate_node, validate_node_request, validate_secrets, validate_spec,
};
pub use vcluster::{
    HomeNodes, OverQuota, Quota, VCluster, VClusterSpec, VcCheckpoints, validate_name as validate_vcluster_name,
    validate_spec as validate_vcluster_spec,
};
