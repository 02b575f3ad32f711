//! The size limit of every string, bytes, map and repeated field a peer can
//! send Muster: each RPC's request and everything nested in it, and each
//! message an agent sends on its stream.
//!
//! [`LIMITS`] is the table, one row per field (`Message.field`, as the
//! .proto files spell them); [`Bounded::check_bounds`] enforces it, and
//! every server calls it first, before it reads anything else of the
//! request (let alone proposes it). A field over its limit is refused with
//! INVALID_ARGUMENT naming the field, its size and the limit, and echoing
//! at most a short prefix of the value.
//!
//! These are coarse limits on the wire; the checks that follow (labels,
//! constraints, the allocation limits of the replicated state) are finer and
//! never looser. A unit test walks the compiled descriptors: a request field
//! without a row here, or a row whose field is not enforced at its limit,
//! fails CI.

use std::collections::HashMap;
use std::fmt;

use crate::v1;

/// How big one field may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A string or bytes field: at most this many bytes.
    Bytes(usize),
    /// A repeated or map field: at most `items` entries, and (for strings
    /// and maps of strings) at most `bytes` in all, keys and values
    /// together. Nested messages carry their own limits.
    Items {
        /// Most entries.
        items: usize,
        /// Most bytes of all entries together (0: not a field of strings).
        bytes: usize,
    },
}

const fn text(bytes: usize) -> Limit {
    Limit::Bytes(bytes)
}

const fn items(items: usize, bytes: usize) -> Limit {
    Limit::Items { items, bytes }
}

/// A node id, label key or value, owner, idempotency key (the replicated
/// state's `max_name_bytes`).
pub const NAME: usize = 256;
/// A free-text reason (a drain's, a stop's).
pub const REASON: usize = 1024;
/// A checkpoint store: `node`, a path or an object store URL.
pub const STORE: usize = 512;
/// A host:port (a DNS name is at most 253 bytes).
pub const ADDRESS: usize = 261;
/// A vCluster name.
pub const VCLUSTER: usize = 63;
/// An enum spelled as a string (`ml-training`, `borrow`, `hang`, …).
pub const KEYWORD: usize = 32;
/// An image reference (`muster_core`'s `MAX_IMAGE_REF_BYTES`).
pub const IMAGE_REF: usize = 512;
/// An image digest (`sha512:` and 128 hex digits at most).
pub const DIGEST: usize = 135;
/// A path inside a container (`muster_core`'s `MAX_CONTAINER_PATH_BYTES`).
pub const CONTAINER_PATH: usize = 1024;
/// A job array's indices in Slurm's form (`0-9999%64`).
pub const ARRAY_EXPR: usize = 4096;
/// A workflow's or a step's name.
pub const STEP_NAME: usize = 64;
/// Labels a node may carry.
pub const LABELS: usize = 64;
/// Tasks an agent may report at once.
pub const RUNNING: usize = 10_000;
/// What an agent may say about a failure (an exit's error, a watchdog's
/// detail, why a checkpoint could not be restored).
pub const AGENT_TEXT: usize = 4096;
/// A failed task's stderr tail (the state keeps this much).
pub const STDERR_TAIL: usize = 1024;
/// One chunk of a task's log.
pub const LOG_CHUNK: usize = 1 << 20;
/// A Raft message between replicas (snapshots travel in chunks of less).
pub const RAFT_MESSAGE: usize = 64 << 20;

/// Every bounded field a peer can send, `Message.field` and its limit.
pub const LIMITS: &[(&str, Limit)] = &[
    // The agent's stream (AgentMessage and what it carries).
    ("Register.node_id", text(NAME)),
    ("Register.labels", items(LABELS, LABELS * 2 * NAME)),
    ("Register.version", text(KEYWORD)),
    ("Register.running", items(RUNNING, 0)),
    ("Register.address", text(ADDRESS)),
    ("Register.ports", text(KEYWORD)),
    ("Register.checkpoint_address", text(ADDRESS)),
    ("Heartbeat.running", items(RUNNING, 0)),
    ("Heartbeat.pulls", items(RUNNING, 0)),
    ("ImagePull.image", text(IMAGE_REF)),
    ("ImagesHeld.digests", items(64, 64 * DIGEST)),
    ("TaskExited.error", text(AGENT_TEXT)),
    ("TaskExited.stderr_tail", text(STDERR_TAIL)),
    ("LogData.data", text(LOG_CHUNK)),
    ("LogData.error", text(REASON)),
    ("CheckpointManifest.sha256", text(32)),
    ("CheckpointManifest.writer", text(NAME)),
    ("CheckpointManifest.store", text(STORE)),
    ("CheckpointManifest.key", text(NAME)),
    ("WatchdogTripped.kind", text(KEYWORD)),
    ("WatchdogTripped.detail", text(AGENT_TEXT)),
    ("CheckpointUnusable.reason", text(AGENT_TEXT)),
    ("CheckpointsDeleted.seqs", items(1024, 0)),
    // Agent to agent.
    ("FetchCheckpoint.key", text(NAME)),
    // Replica to replica.
    ("RaftPayload.data", text(RAFT_MESSAGE)),
    // Allocations.
    ("AllocationSpec.owner", text(NAME)),
    ("AllocationSpec.command", items(64 * 1024, 64 * 1024)),
    ("AllocationSpec.env", items(4096, 64 * 1024)),
    ("AllocationSpec.idempotency_key", text(NAME)),
    ("AllocationSpec.vcluster", text(VCLUSTER)),
    ("AllocationSpec.vcluster_type", text(KEYWORD)),
    ("AllocationSpec.constraints", items(16, 16 * 1024)),
    ("AllocationSpec.pack_by", text(NAME + 16)),
    ("AllocationSpec.checkpoint_store", text(STORE)),
    ("AllocationSpec.name", text(NAME)),
    ("AllocationSpec.after", items(64, 0)),
    ("AllocationSpec.image", text(IMAGE_REF)),
    ("AllocationSpec.mounts", items(16, 16 * (2 * CONTAINER_PATH + 4))),
    ("AllocationSpec.workdir", text(CONTAINER_PATH)),
    ("Dependency.when", text(KEYWORD)),
    ("ListRequest.owner", text(NAME)),
    ("SubmitRequest.secrets", items(32, 128 * 1024 + 32 * 128)),
    ("SubmitRequest.array", text(ARRAY_EXPR)),
    ("CancelRequest.indices", text(ARRAY_EXPR)),
    ("SubmitWorkflowRequest.name", text(STEP_NAME)),
    ("SubmitWorkflowRequest.idempotency_key", text(NAME)),
    ("SubmitWorkflowRequest.steps", items(64, 0)),
    ("WorkflowStep.name", text(STEP_NAME)),
    ("WorkflowStep.array", text(ARRAY_EXPR)),
    ("WorkflowStep.after", items(64, 0)),
    ("WorkflowStep.after_corr", text(STEP_NAME)),
    ("StepDependency.step", text(STEP_NAME)),
    ("StepDependency.when", text(KEYWORD)),
    // Nodes.
    ("ListNodesRequest.page_token", text(NAME)),
    ("GetNodeRequest.id", text(NAME)),
    ("DrainNodeRequest.id", text(NAME)),
    ("DrainNodeRequest.reason", text(REASON)),
    ("DrainNodeRequest.by", text(NAME)),
    ("NodeActionRequest.id", text(NAME)),
    ("NodeActionRequest.reason", text(REASON)),
    ("NodeActionRequest.by", text(NAME)),
    ("ScaleDownRequest.reason", text(REASON)),
    ("ScaleDownRequest.by", text(NAME)),
    ("ScaleDownRequest.selector", items(LABELS, LABELS * 2 * NAME)),
    ("WatchNodesRequest.id", text(NAME)),
    ("AdmitNodeRequest.id", text(NAME)),
    ("NodeAdmission.labels", items(LABELS, LABELS * 2 * NAME)),
    ("NodeAdmission.cert_sha256", text(64)),
    ("NodeAdmission.by", text(NAME)),
    ("LabelNodeRequest.id", text(NAME)),
    ("LabelNodeRequest.set", items(LABELS, LABELS * 2 * NAME)),
    ("LabelNodeRequest.remove", items(LABELS, LABELS * NAME)),
    ("PrefetchImageRequest.image", text(IMAGE_REF)),
    ("PrefetchImageRequest.constraints", items(16, 16 * 1024)),
    // Administration.
    ("AddLearnerRequest.address", text(ADDRESS)),
    ("ChangeMembershipRequest.promote", items(64, 0)),
    ("ChangeMembershipRequest.remove", items(64, 0)),
    ("CreateTokenRequest.role", text(KEYWORD)),
    ("CreateTokenRequest.name", text(128)),
    ("RevokeTokenRequest.id", text(KEYWORD)),
    ("CheckpointSettings.store", text(STORE)),
    // vClusters.
    ("VClusterRequest.name", text(VCLUSTER)),
    ("VClusterSpec.type", text(KEYWORD)),
    ("VClusterSpec.home_labels", items(16, 16 * 2 * NAME)),
    ("VClusterSpec.home_nodes", items(10_000, 512 * 1024)),
    ("VClusterSpec.over_quota", text(KEYWORD)),
    ("VClusterSpec.checkpoint_store", text(STORE)),
    ("GetVClusterRequest.name", text(VCLUSTER)),
    ("ListVClustersRequest.page_token", text(VCLUSTER)),
    // History.
    ("HistoryQuery.owner", text(NAME)),
    ("HistoryQuery.vcluster", text(VCLUSTER)),
    ("UsageQuery.group_by", text(KEYWORD)),
    ("UsageQuery.page_token", text(NAME + VCLUSTER + 1)),
];

/// The limit of `field` (`Message.field`). A field missing from the table
/// gets none at all: 0 bytes, 0 items (the descriptor test keeps the table
/// whole, so this never refuses a real field).
pub fn limit_of(field: &str) -> Limit {
    LIMITS.iter().find(|(f, _)| *f == field).map_or(Limit::Bytes(0), |(_, l)| *l)
}

/// A field over its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfBounds {
    /// `Message.field`.
    pub field: &'static str,
    /// What was sent, and the limit.
    pub detail: String,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

impl std::error::Error for OutOfBounds {}

impl From<OutOfBounds> for tonic::Status {
    fn from(e: OutOfBounds) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// At most 32 characters of `s`, quoted, with an ellipsis when cut: what an
/// error may echo of bad input.
pub fn prefix(s: &str) -> String {
    const ECHO: usize = 32;
    let cut: String = s.chars().take(ECHO).collect();
    if cut.len() < s.len() { format!("{cut:?}…") } else { format!("{cut:?}") }
}

/// `s` cut to at most `max` bytes on a character boundary: for what an
/// agent reports (an error, a detail), which must fit its field's limit.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn check_text(field: &'static str, value: &str) -> Result<(), OutOfBounds> {
    let Limit::Bytes(max) = limit_of(field) else { unreachable!("{field} is a text field") };
    if value.len() > max {
        return Err(OutOfBounds {
            field,
            detail: format!("{} bytes, over the limit of {max} (starts {})", value.len(), prefix(value)),
        });
    }
    Ok(())
}

fn check_bytes(field: &'static str, value: &[u8]) -> Result<(), OutOfBounds> {
    let Limit::Bytes(max) = limit_of(field) else { unreachable!("{field} is a bytes field") };
    if value.len() > max {
        return Err(OutOfBounds { field, detail: format!("{} bytes, over the limit of {max}", value.len()) });
    }
    Ok(())
}

fn check_items(field: &'static str, count: usize, bytes: usize) -> Result<(), OutOfBounds> {
    let Limit::Items { items, bytes: max_bytes } = limit_of(field) else { unreachable!("{field} is repeated") };
    if count > items {
        return Err(OutOfBounds { field, detail: format!("{count} entries, over the limit of {items}") });
    }
    if bytes > max_bytes {
        return Err(OutOfBounds { field, detail: format!("{bytes} bytes in all, over the limit of {max_bytes}") });
    }
    Ok(())
}

fn check_strings(field: &'static str, values: &[String]) -> Result<(), OutOfBounds> {
    check_items(field, values.len(), values.iter().map(String::len).sum())
}

fn check_map(field: &'static str, map: &HashMap<String, String>) -> Result<(), OutOfBounds> {
    check_items(field, map.len(), map.iter().map(|(k, v)| k.len() + v.len()).sum())
}

fn check_list<T>(field: &'static str, values: &[T]) -> Result<(), OutOfBounds> {
    check_items(field, values.len(), 0)
}

/// A message whose fields are checked against [`LIMITS`].
pub trait Bounded {
    /// The first field over its limit, if any (nested messages included).
    fn check_bounds(&self) -> Result<(), OutOfBounds>;
}

impl<T: Bounded> Bounded for Option<T> {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        self.as_ref().map_or(Ok(()), Bounded::check_bounds)
    }
}

/// Messages with no string, bytes, map or repeated field of their own.
macro_rules! unbounded {
    ($($t:ty),* $(,)?) => {
        $(impl Bounded for $t {
            fn check_bounds(&self) -> Result<(), OutOfBounds> {
                Ok(())
            }
        })*
    };
}

unbounded!(
    v1::GetRequest,
    v1::SetArrayThrottleRequest,
    v1::WatchRequest,
    v1::LogsRequest,
    v1::StatusRequest,
    v1::BackupRequest,
    v1::FetchRecordsRequest,
    v1::FollowRequest,
    v1::PreVoteRequest,
    v1::Claim,
    v1::Preempted,
);

impl Bounded for v1::AgentMessage {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        use v1::agent_message::Msg;
        match &self.msg {
            None | Some(Msg::Claim(_)) | Some(Msg::Preempted(_)) => Ok(()),
            Some(Msg::Register(r)) => {
                check_text("Register.node_id", &r.node_id)?;
                check_map("Register.labels", &r.labels)?;
                check_text("Register.version", &r.version)?;
                check_list("Register.running", &r.running)?;
                check_text("Register.address", &r.address)?;
                check_text("Register.ports", &r.ports)?;
                check_text("Register.checkpoint_address", &r.checkpoint_address)
            }
            Some(Msg::Heartbeat(h)) => {
                check_list("Heartbeat.running", &h.running)?;
                check_list("Heartbeat.pulls", &h.pulls)?;
                h.pulls.iter().try_for_each(|p| check_text("ImagePull.image", &p.image))
            }
            Some(Msg::ImagesHeld(i)) => check_strings("ImagesHeld.digests", &i.digests),
            Some(Msg::Exited(e)) => {
                check_text("TaskExited.error", &e.error)?;
                check_text("TaskExited.stderr_tail", &e.stderr_tail)
            }
            Some(Msg::LogData(l)) => {
                check_bytes("LogData.data", &l.data)?;
                check_text("LogData.error", &l.error)
            }
            Some(Msg::Checkpoint(c)) => c.manifest.check_bounds(),
            Some(Msg::WatchdogTripped(w)) => {
                check_text("WatchdogTripped.kind", &w.kind)?;
                check_text("WatchdogTripped.detail", &w.detail)
            }
            Some(Msg::CheckpointUnusable(u)) => check_text("CheckpointUnusable.reason", &u.reason),
            Some(Msg::CheckpointsDeleted(d)) => check_list("CheckpointsDeleted.seqs", &d.seqs),
        }
    }
}

impl Bounded for v1::CheckpointManifest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_bytes("CheckpointManifest.sha256", &self.sha256)?;
        check_text("CheckpointManifest.writer", &self.writer)?;
        check_text("CheckpointManifest.store", &self.store)?;
        check_text("CheckpointManifest.key", &self.key)
    }
}

impl Bounded for v1::FetchCheckpoint {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("FetchCheckpoint.key", &self.key)
    }
}

impl Bounded for v1::RaftPayload {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_bytes("RaftPayload.data", &self.data)
    }
}

impl Bounded for v1::AllocationSpec {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("AllocationSpec.owner", &self.owner)?;
        check_strings("AllocationSpec.command", &self.command)?;
        check_map("AllocationSpec.env", &self.env)?;
        check_text("AllocationSpec.idempotency_key", &self.idempotency_key)?;
        check_text("AllocationSpec.vcluster", &self.vcluster)?;
        check_text("AllocationSpec.vcluster_type", &self.vcluster_type)?;
        check_strings("AllocationSpec.constraints", &self.constraints)?;
        check_text("AllocationSpec.pack_by", &self.pack_by)?;
        check_text("AllocationSpec.checkpoint_store", &self.checkpoint_store)?;
        check_text("AllocationSpec.name", &self.name)?;
        check_items("AllocationSpec.after", self.after.len(), 0)?;
        check_text("AllocationSpec.image", &self.image)?;
        check_strings("AllocationSpec.mounts", &self.mounts)?;
        check_text("AllocationSpec.workdir", &self.workdir)?;
        for d in &self.after {
            check_text("Dependency.when", &d.when)?;
        }
        Ok(())
    }
}

impl Bounded for v1::SubmitWorkflowRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("SubmitWorkflowRequest.name", &self.name)?;
        check_text("SubmitWorkflowRequest.idempotency_key", &self.idempotency_key)?;
        check_items("SubmitWorkflowRequest.steps", self.steps.len(), 0)?;
        for step in &self.steps {
            check_text("WorkflowStep.name", &step.name)?;
            check_text("WorkflowStep.array", &step.array)?;
            check_text("WorkflowStep.after_corr", &step.after_corr)?;
            check_items("WorkflowStep.after", step.after.len(), 0)?;
            for d in &step.after {
                check_text("StepDependency.step", &d.step)?;
                check_text("StepDependency.when", &d.when)?;
            }
            step.spec.check_bounds()?;
        }
        Ok(())
    }
}

impl Bounded for v1::CancelRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("CancelRequest.indices", &self.indices)
    }
}

impl Bounded for v1::SubmitRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        self.spec.check_bounds()?;
        check_text("SubmitRequest.array", &self.array)?;
        // Never echo a secret: only its size.
        check_items(
            "SubmitRequest.secrets",
            self.secrets.len(),
            self.secrets.iter().map(|(k, v)| k.len() + v.len()).sum(),
        )
    }
}

impl Bounded for v1::ListVClustersRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("ListVClustersRequest.page_token", &self.page_token)
    }
}

impl Bounded for v1::NodeAdmission {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_map("NodeAdmission.labels", &self.labels)?;
        check_text("NodeAdmission.cert_sha256", &self.cert_sha256)?;
        check_text("NodeAdmission.by", &self.by)
    }
}

impl Bounded for v1::AdmitNodeRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("AdmitNodeRequest.id", &self.id)?;
        self.admission.check_bounds()
    }
}

impl Bounded for v1::LabelNodeRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("LabelNodeRequest.id", &self.id)?;
        check_map("LabelNodeRequest.set", &self.set)?;
        check_strings("LabelNodeRequest.remove", &self.remove)
    }
}

impl Bounded for v1::PrefetchImageRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("PrefetchImageRequest.image", &self.image)?;
        check_strings("PrefetchImageRequest.constraints", &self.constraints)
    }
}

impl Bounded for v1::ListRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("ListRequest.owner", &self.owner)
    }
}

impl Bounded for v1::ListNodesRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("ListNodesRequest.page_token", &self.page_token)
    }
}

impl Bounded for v1::GetNodeRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("GetNodeRequest.id", &self.id)
    }
}

impl Bounded for v1::DrainNodeRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("DrainNodeRequest.id", &self.id)?;
        check_text("DrainNodeRequest.reason", &self.reason)?;
        check_text("DrainNodeRequest.by", &self.by)
    }
}

impl Bounded for v1::NodeActionRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("NodeActionRequest.id", &self.id)?;
        check_text("NodeActionRequest.reason", &self.reason)?;
        check_text("NodeActionRequest.by", &self.by)
    }
}

impl Bounded for v1::ScaleDownRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("ScaleDownRequest.reason", &self.reason)?;
        check_text("ScaleDownRequest.by", &self.by)?;
        check_map("ScaleDownRequest.selector", &self.selector)
    }
}

impl Bounded for v1::WatchNodesRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("WatchNodesRequest.id", &self.id)
    }
}

impl Bounded for v1::AddLearnerRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("AddLearnerRequest.address", &self.address)
    }
}

impl Bounded for v1::ChangeMembershipRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_list("ChangeMembershipRequest.promote", &self.promote)?;
        check_list("ChangeMembershipRequest.remove", &self.remove)
    }
}

impl Bounded for v1::CreateTokenRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("CreateTokenRequest.role", &self.role)?;
        check_text("CreateTokenRequest.name", &self.name)
    }
}

impl Bounded for v1::RevokeTokenRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("RevokeTokenRequest.id", &self.id)
    }
}

impl Bounded for v1::CheckpointSettings {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("CheckpointSettings.store", &self.store)
    }
}

impl Bounded for v1::VClusterSpec {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("VClusterSpec.type", &self.r#type)?;
        check_map("VClusterSpec.home_labels", &self.home_labels)?;
        check_strings("VClusterSpec.home_nodes", &self.home_nodes)?;
        check_text("VClusterSpec.over_quota", &self.over_quota)?;
        check_text("VClusterSpec.checkpoint_store", &self.checkpoint_store)
    }
}

impl Bounded for v1::VClusterRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("VClusterRequest.name", &self.name)?;
        self.spec.check_bounds()
    }
}

impl Bounded for v1::GetVClusterRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("GetVClusterRequest.name", &self.name)
    }
}

impl Bounded for v1::HistoryQuery {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("HistoryQuery.owner", &self.owner)?;
        check_text("HistoryQuery.vcluster", &self.vcluster)
    }
}

impl Bounded for v1::UsageQuery {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_text("UsageQuery.group_by", &self.group_by)?;
        check_text("UsageQuery.page_token", &self.page_token)
    }
}
