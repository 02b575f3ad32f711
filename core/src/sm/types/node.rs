//! Nodes: their status, drain and history.

use super::*;

/// A node's lifecycle status (`docs/nodes.md` has the transition table).
/// Only `Ready` nodes take new reservations.
///
/// ```text
///   Pending ──▶ Ready ◀──▶ Draining ──▶ Stopping ──▶ Stopped ──▶ Terminated
///                 │  (cancel-drain: Draining ──▶ Ready)      ▲  │
///                 └──── stop (empty) from Ready, Draining, ──┘  │ restart
///                       Stopping or Lost                        ▼
///   Ready / Draining / Stopping ── silent while holding work ──▶ Lost ──▶ Ready
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Registered; its agent has not yet finished reconciling.
    Pending,
    /// Accepting reservations.
    Ready,
    /// Taking no new work; its tasks run to completion (or to the drain
    /// deadline). Stops by itself once empty.
    Draining,
    /// Its drain deadline passed: its remaining tasks are being preempted
    /// (checkpoint hint, or SIGTERM) and re-queued elsewhere. Stops once
    /// empty.
    Stopping,
    /// Empty and out of service; the agent was told, so the machine can be
    /// powered off. An operator may restart it.
    Stopped,
    /// Retired for good: its agent may not register under this name again.
    Terminated,
    /// Silent while holding work; its tasks were failed. Registering again
    /// makes it ready.
    Lost,
}

impl NodeStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [NodeStatus; 7] = [
        NodeStatus::Pending,
        NodeStatus::Ready,
        NodeStatus::Draining,
        NodeStatus::Stopping,
        NodeStatus::Stopped,
        NodeStatus::Terminated,
        NodeStatus::Lost,
    ];

    /// `pending`, `ready`, … (metric labels, CLI, errors).
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Pending => "pending",
            NodeStatus::Ready => "ready",
            NodeStatus::Draining => "draining",
            NodeStatus::Stopping => "stopping",
            NodeStatus::Stopped => "stopped",
            NodeStatus::Terminated => "terminated",
            NodeStatus::Lost => "lost",
        }
    }

    /// Whether tasks may hold capacity on a node in this status (it is
    /// watched for silence, and its tasks are failed when it is lost).
    pub fn may_hold_work(self) -> bool {
        matches!(self, NodeStatus::Ready | NodeStatus::Draining | NodeStatus::Stopping)
    }
}

/// An operator's drain of a node, kept while the node drains or stops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Entry time of the drain command.
    pub started_at_ms: u64,
    /// When the remaining tasks are preempted and the node stops (entry
    /// time; the leader compares its clock against it, so a new leader
    /// keeps the same deadline).
    pub deadline_ms: u64,
    /// Why, as the operator put it.
    pub reason: String,
    /// Who asked.
    pub by: String,
}

/// How many events a node keeps for `muster node get` and watchers.
pub const NODE_HISTORY_LIMIT: usize = 64;

/// A node as the state machine knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The operator-facing name.
    pub id: NodeId,
    /// Its position in the node table.
    pub slot: NodeSlot,
    /// What it has.
    pub resources: Resources,
    /// Labels, as placement reads them: what the agent reported (GPU model,
    /// hostname, its address and rendezvous ports), overlaid with what an
    /// admin set ([`NodePolicy::labels`], the only source of the reserved
    /// `muster.*` labels other than the agent's address and ports).
    pub labels: BTreeMap<String, String>,
    /// What the agent reported at its latest registration (before the
    /// admin's labels were laid over it).
    pub reported_labels: BTreeMap<String, String>,
    /// Lifecycle status.
    pub status: NodeStatus,
    /// Entry time of the latest status change.
    pub status_since_ms: u64,
    /// The drain in progress: set exactly while `Draining` or `Stopping`.
    pub drain: Option<Drain>,
    /// Consumables held by reserved and running tasks.
    pub used: Usage,
    /// When it first registered (entry time).
    pub registered_at_ms: u64,
    /// Bumped by every event about this node.
    pub revision: u64,
    /// The latest events (at most [`NODE_HISTORY_LIMIT`]), oldest first.
    pub history: std::sync::Arc<VecDeque<AllocEvent>>,
    /// The image digests its agent's cache holds, sorted (at most
    /// [`MAX_NODE_IMAGES`]): admission prefers, among equally good fits,
    /// nodes that hold a gang's image.
    pub images: Vec<String>,
}

impl Node {
    /// The vCluster the node belongs to (its `muster.vcluster` label).
    pub fn vcluster(&self) -> &str {
        self.labels.get(VCLUSTER_LABEL).map_or(DEFAULT_VCLUSTER, String::as_str)
    }

    /// Consumables not held by any reserved or running task.
    pub fn free(&self) -> Usage {
        Usage::of(&self.resources).minus(&self.used)
    }

    /// The rendezvous ports its agent offers (its `muster.ports` label;
    /// none without one, or with one that does not parse, which
    /// registration refuses).
    pub fn ports(&self) -> PortRange {
        self.labels.get(PORTS_LABEL).and_then(|v| PortRange::parse(v).ok()).unwrap_or_default()
    }
}

/// Most image digests a node reports holding (its cache may hold more: it
/// reports the most recently used).
pub const MAX_NODE_IMAGES: usize = 64;

/// Whether `digest` is an image digest a node may report (as an image
/// reference pins one: [`super::check_digest`]).
pub fn is_image_digest(digest: &str) -> bool {
    super::check_digest(digest).is_ok()
}

/// The node label naming the rendezvous ports its agent offers, `FIRST-LAST`
/// (inclusive): admission reserves a gang's `MASTER_PORT` from it on task
/// 0's node.
pub const PORTS_LABEL: &str = "muster.ports";

/// A range of TCP ports a node offers for gangs' rendezvous, `first ..=
/// last`; empty when `count` is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortRange {
    /// The lowest port.
    pub first: u16,
    /// How many ports, from `first` up.
    pub count: u16,
}

impl PortRange {
    /// Parses `29500-29599` (inclusive), or `none` for no ports.
    pub fn parse(s: &str) -> Result<PortRange, String> {
        let s = s.trim();
        if s == "none" {
            return Ok(PortRange::default());
        }
        let (a, b) =
            s.split_once('-').ok_or_else(|| format!("{s:?} is not a port range FIRST-LAST (e.g. 29500-29599)"))?;
        let port = |p: &str| p.trim().parse::<u16>().map_err(|_| format!("{p:?} is not a port (1-65535)"));
        let (first, last) = (port(a)?, port(b)?);
        if first == 0 || last < first {
            return Err(format!("{s:?}: the range must run from a port ≥ 1 up to one no lower"));
        }
        let count = u16::try_from(u32::from(last) - u32::from(first) + 1)
            .map_err(|_| format!("{s:?} holds more than {} ports", u16::MAX))?;
        Ok(PortRange { first, count })
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        port >= self.first && u32::from(port) < u32::from(self.first) + u32::from(self.count)
    }

    /// The ports, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.count).map(|i| self.first + i)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            f.write_str("none")
        } else {
            write!(f, "{}-{}", self.first, u32::from(self.first) + u32::from(self.count) - 1)
        }
    }
}

/// The label prefix only admins set (`muster node label`), never an agent,
/// except the reachability labels the scheduler derives from the agent's
/// own fields ([`AGENT_SET_LABELS`]).
pub const RESERVED_LABEL_PREFIX: &str = "muster.";

/// Reserved labels the scheduler sets from a registration's dedicated
/// fields (address, rendezvous ports, checkpoint address), and the one the
/// agent reports itself: how it contains tasks ([`ISOLATION_LABEL`]).
pub const AGENT_SET_LABELS: [&str; 5] =
    ["muster.address", PORTS_LABEL, "muster.checkpoints", ISOLATION_LABEL, IMAGES_LABEL];

/// How a node's agent runs container images (`builtin`, or the runtime it
/// hands them to), set by the agent when it can. A spec with an image gets
/// the constraint that its nodes have it.
pub const IMAGES_LABEL: &str = "muster.images";

/// How a node's agent contains its tasks: `cgroup-v1`, `cgroup-v2`, or
/// `none` (`muster agent --no-isolation`), so `--constraint` can avoid it.
pub const ISOLATION_LABEL: &str = "muster.isolation";

/// Whether an agent's registration may carry label `key`.
pub fn agent_may_set(key: &str) -> bool {
    !key.starts_with(RESERVED_LABEL_PREFIX) || AGENT_SET_LABELS.contains(&key)
}

/// What an admin admitted a node for (`muster node admit`): the most it
/// may claim and the labels it may report. A registration that claims more
/// is refused.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// The most it may report, per resource.
    pub resources: Resources,
    /// The labels it may report (each with this exact value); the
    /// reachability labels are always allowed.
    pub labels: BTreeMap<String, String>,
    /// The SHA-256 of the certificate its agent must present, if pinned.
    pub cert_sha256: Option<[u8; 32]>,
    /// Who admitted it.
    pub by: String,
    /// Entry time of the admission.
    pub at_ms: u64,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("resources", &self.resources)
            .field("labels", &self.labels)
            .field("cert_sha256", &self.cert_sha256.map(|d| d.iter().map(|b| format!("{b:02x}")).collect::<String>()))
            .field("by", &self.by)
            .finish()
    }
}

impl Admission {
    /// Why a registration of `resources` and `labels` is more than this
    /// admits, if it is.
    pub fn refuses(&self, resources: &Resources, labels: &BTreeMap<String, String>) -> Option<String> {
        let (have, may) = (resources, &self.resources);
        for (what, claimed, admitted) in [
            ("GPUs", u64::from(have.gpus), u64::from(may.gpus)),
            ("MB of GPU memory", have.vram_mb, may.vram_mb),
            ("MB of memory", have.mem_mb, may.mem_mb),
            ("CPUs", u64::from(have.cpus), u64::from(may.cpus)),
        ] {
            if claimed > admitted {
                return Some(format!("it claims {claimed} {what}; it was admitted for {admitted}"));
            }
        }
        for (k, v) in labels.iter().filter(|(k, _)| !AGENT_SET_LABELS.contains(&k.as_str())) {
            match self.labels.get(k) {
                Some(a) if a == v || a == ANY_LABEL_VALUE => {}
                Some(a) => return Some(format!("it claims label {k}={v}; it was admitted with {k}={a}")),
                None => return Some(format!("it claims label {k}={v}, which it was not admitted for")),
            }
        }
        None
    }
}

/// An admitted label value that admits any value of its key (`muster node
/// admit --label hostname=*`): for what an agent discovers and no
/// constraint should trust (hostname, cpu.model), never for what jobs are
/// placed by (gpu.model).
pub const ANY_LABEL_VALUE: &str = "*";

/// What admins decided about a node name, kept whether or not a node of
/// that name is registered (so a node can be admitted and labelled before
/// its agent first connects).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePolicy {
    /// Its admission, if an admin admitted it.
    pub admission: Option<Admission>,
    /// Labels an admin set (`muster node label`): laid over what the agent
    /// reports.
    pub labels: BTreeMap<String, String>,
}

impl NodePolicy {
    /// Whether it records nothing (and can be dropped).
    pub fn is_empty(&self) -> bool {
        self.admission.is_none() && self.labels.is_empty()
    }
}
