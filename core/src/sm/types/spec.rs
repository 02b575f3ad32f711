//! What a user submits: the allocation spec, checkpoint modes, vCluster types, watchdog kinds.

use super::*;

/// How an allocation saves and restores its progress when preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CheckpointMode {
    /// The scheduler asks for a checkpoint before preempting.
    Auto,
    /// The task checkpoints on its own schedule; the scheduler only signals.
    Manual,
    /// The task cannot checkpoint; preemption loses its progress.
    None,
}

/// The kind of a vCluster: it decides how its allocations may be preempted
/// (the preemption-policy seed's per-vCluster table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum VClusterType {
    /// Class-based, checkpoint-aware preemption.
    #[default]
    HpcBatch,
    /// Preemptible; the checkpoint term of its cost is weighted double.
    MlTraining,
    /// Preempted only where it runs on borrowed nodes (another vCluster's).
    Service,
    /// Never preempted (class 10, no exceptions).
    Sensitive,
    /// Preemptible; short-lived, so its remaining-walltime value counts half.
    Interactive,
}

impl VClusterType {
    /// The API spelling: `hpc-batch`, `ml-training`, `service`, `sensitive`,
    /// `interactive`.
    pub fn as_str(self) -> &'static str {
        match self {
            VClusterType::HpcBatch => "hpc-batch",
            VClusterType::MlTraining => "ml-training",
            VClusterType::Service => "service",
            VClusterType::Sensitive => "sensitive",
            VClusterType::Interactive => "interactive",
        }
    }

    /// Parses the API spelling.
    pub fn parse(s: &str) -> Option<VClusterType> {
        Some(match s {
            "hpc-batch" => VClusterType::HpcBatch,
            "ml-training" => VClusterType::MlTraining,
            "service" => VClusterType::Service,
            "sensitive" => VClusterType::Sensitive,
            "interactive" => VClusterType::Interactive,
            _ => return None,
        })
    }
}

/// Which watchdog stopped a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WatchdogKind {
    /// It ran for its whole walltime budget.
    Budget,
    /// It stopped beating, and its GPU was idle and its memory static.
    Stall,
    /// Its GPU was idle and its memory static for the health window.
    GpuHealth,
}

impl WatchdogKind {
    /// `budget`, `stall` or `gpu_health` (API, metric labels, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            WatchdogKind::Budget => "budget",
            WatchdogKind::Stall => "stall",
            WatchdogKind::GpuHealth => "gpu_health",
        }
    }

    /// Parses the API spelling.
    pub fn parse(s: &str) -> Option<WatchdogKind> {
        Some(match s {
            "budget" => WatchdogKind::Budget,
            "stall" => WatchdogKind::Stall,
            "gpu_health" => WatchdogKind::GpuHealth,
            _ => return None,
        })
    }
}

/// The node label naming the vCluster a node belongs to (absent: the default
/// vCluster). A task on a node of another vCluster runs on borrowed capacity.
pub const VCLUSTER_LABEL: &str = "muster.vcluster";

/// The default checkpoint-time estimate of an `Auto` allocation that gives
/// none, in seconds.
pub const DEFAULT_CHECKPOINT_ESTIMATE_S: u32 = 60;

/// What a user submits: one gang of `gang_size` identical tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSpec {
    /// Who submitted it (user or service account).
    pub owner: String,
    /// N: how many tasks must be placed together (1 for a plain job).
    pub gang_size: u32,
    /// What each task needs.
    pub resources: Resources,
    /// 0 (first to be preempted) ..= 10 (never preempted).
    pub preemption_class: u8,
    /// Tie-breaker within a class: higher goes first.
    pub priority: i32,
    /// How progress survives preemption.
    pub checkpoint: CheckpointMode,
    /// The wall-clock budget of one attempt, in seconds.
    pub walltime_s: u64,
    /// How many failed attempts a task may accumulate before its gang fails
    /// (the seed's `MaxRetries`: 3 means the third real failure is terminal).
    pub max_retries: u32,
    /// argv of each task's process.
    pub command: Vec<String>,
    /// Extra environment of each task's process.
    pub env: BTreeMap<String, String>,
    /// A retried submit with the same owner and key returns the same allocation.
    pub idempotency_key: Option<String>,
    /// The vCluster it belongs to (quotas and borrowing come with the
    /// vCluster issue; every allocation already names one).
    pub vcluster: String,
    /// Its vCluster's type (how it may be preempted).
    pub vcluster_type: VClusterType,
    /// A sensitive allocation (class 10 only) is never preempted.
    pub sensitive: bool,
    /// How long a checkpoint takes, as the user estimates it (seconds); the
    /// preemption cost of an `Auto` allocation counts it.
    pub checkpoint_estimate_s: u32,
    /// The stall watchdog's window in seconds (0: off). Opt-in: a task that
    /// beats (touches `MUSTER_PROGRESS_FILE`) and then stays silent this
    /// long, with its GPU idle and memory static, is stopped and retried.
    pub stall_timeout_s: u32,
    /// Rendezvous ports to reserve on task 0's node for the gang's
    /// launcher (`MASTER_PORT` is the first; all of them are in
    /// `MUSTER_PORTS`). No two live gangs on a node hold the same port.
    pub ports: u32,
    /// Where its tasks may run: label constraints and topology packing.
    pub placement: Placement,
    /// Where its checkpoints go, when not where its vCluster's (or the
    /// cluster's) go: `node`, or within a store an operator configured.
    pub checkpoint_store: Option<CheckpointStore>,
    /// Its name (`muster submit --name`; empty: none): shown in lists and
    /// matched by `--name` filters. Not unique.
    pub name: String,
    /// The most processes and threads one task may have on an isolating
    /// node (0: the agent's default).
    pub pids_max: u32,
    /// The allocations it waits for before it may be queued (empty: none);
    /// until then it is `waiting`.
    pub after: After,
    /// The container image its tasks run in, with its mounts and working
    /// directory (`None`: the node's own system).
    pub container: Option<ContainerSpec>,
}

/// The vCluster of an allocation that names none.
pub const DEFAULT_VCLUSTER: &str = "default";

/// Walltime when a submit leaves it out (0), s: the budget watchdog's limit.
pub const DEFAULT_WALLTIME_S: u64 = 3600;

/// Retry budget when a submit leaves it out (0).
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// Rendezvous ports a submit gets when it does not say (`MASTER_PORT`).
pub const DEFAULT_RENDEZVOUS_PORTS: u32 = 1;

/// The most rendezvous ports one allocation may ask for.
pub const MAX_RENDEZVOUS_PORTS: u32 = 16;

/// The highest per-task pids limit (Linux's own ceiling on pid numbers).
pub const MAX_PIDS_MAX: u32 = 4_194_304;

impl AllocSpec {
    /// A spec with the defaults users get when they leave fields out: class 0,
    /// priority 0, checkpoint `Auto` taking about a minute, one hour of
    /// walltime, 3 retries, no env, no idempotency key, the default vCluster
    /// of type hpc-batch, not sensitive, and no rendezvous ports (the API
    /// edge asks for [`DEFAULT_RENDEZVOUS_PORTS`] when a submit leaves the
    /// field out), placed wherever it fits.
    pub fn new(owner: impl Into<String>, gang_size: u32, resources: Resources, command: Vec<String>) -> AllocSpec {
        AllocSpec {
            owner: owner.into(),
            gang_size,
            resources,
            preemption_class: 0,
            priority: 0,
            checkpoint: CheckpointMode::Auto,
            walltime_s: DEFAULT_WALLTIME_S,
            max_retries: DEFAULT_MAX_RETRIES,
            command,
            env: BTreeMap::new(),
            idempotency_key: None,
            vcluster: DEFAULT_VCLUSTER.to_string(),
            vcluster_type: VClusterType::HpcBatch,
            sensitive: false,
            checkpoint_estimate_s: DEFAULT_CHECKPOINT_ESTIMATE_S,
            stall_timeout_s: 0,
            ports: 0,
            placement: Placement::default(),
            checkpoint_store: None,
            name: String::new(),
            pids_max: 0,
            after: After::default(),
            container: None,
        }
    }

    /// Marked sensitive, or in a sensitive vCluster (class 10 only).
    pub fn is_sensitive(&self) -> bool {
        self.sensitive || self.vcluster_type == VClusterType::Sensitive
    }

    /// Whether no preemption may ever choose it, whatever its state: class
    /// 10, sensitive, a sensitive vCluster, or checkpoint `none` at class 7
    /// or above (all progress lost, high priority).
    pub fn never_preempted(&self) -> Option<&'static str> {
        if self.preemption_class >= crate::sm::MAX_PREEMPTION_CLASS {
            Some("class 10 is never preempted")
        } else if self.is_sensitive() {
            Some("sensitive allocations are never preempted")
        } else if self.checkpoint == CheckpointMode::None && self.preemption_class >= 7 {
            Some("checkpoint none at class 7 or above is non-preemptible")
        } else {
            None
        }
    }
}

/// Most secrets one allocation carries.
pub const MAX_SECRETS: usize = 32;
/// Most bytes of one secret's value.
pub const MAX_SECRET_VALUE_BYTES: usize = 32 * 1024;
/// Most bytes of one allocation's secrets, names and values together.
pub const MAX_SECRETS_BYTES: usize = 128 * 1024;

/// An allocation's secret environment variables (`muster submit --secret`):
/// kept apart from its spec, never returned by a read, set in the
/// environment of its tasks by the agents of the nodes they are placed on
/// only, and dropped when the allocation finishes. `Debug` shows the names
/// only, so no log line can carry a value.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secrets(pub BTreeMap<String, String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.keys().map(|k| (k, "<redacted>"))).finish()
    }
}

impl Secrets {
    /// Their names, in order.
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
