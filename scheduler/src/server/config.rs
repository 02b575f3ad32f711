//! How a replica is started: its identity, storage, Raft timing, policy
//! settings and listeners ([`ReplicaConfig`]), and why a start can fail
//! ([`StartError`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use muster_clock::SharedClock;
use muster_raft_store::OpenError;

use super::api::agent_hub::HubConfig;
use super::policies::InjectedBug;
use crate::policy::{AdmissionConfig, PreemptionConfig};

/// Raft timing and compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftTuning {
    /// Leader heartbeat, ms.
    pub heartbeat_ms: u64,
    /// Election timeout range, ms (randomised in between by openraft).
    pub election_timeout_ms: (u64, u64),
    /// Build a snapshot every this many applied entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind the latest snapshot (for slow followers).
    pub keep_behind_snapshot: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            heartbeat_ms: 100,
            election_timeout_ms: (400, 500),
            snapshot_every: 10_000,
            keep_behind_snapshot: 1_000,
        }
    }
}

/// How to run one replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's id (≥ 1).
    pub id: u64,
    /// The address peers and clients reach this replica at (`host:port`).
    pub advertise: String,
    /// Where the log and snapshots live.
    pub data_dir: PathBuf,
    /// This replica's certificate and the CA it trusts; `None` runs without
    /// TLS and without authorisation (`--insecure`: debugging only).
    pub tls: Option<muster_tls::TlsMaterial>,
    /// Connection, handshake, stream and request limits.
    pub limits: super::api::limits::ServerLimits,
    /// Storage options: the applied log (replay, audit) and the crash shim
    /// (tests).
    pub store: muster_raft_store::StoreOptions,
    /// The initial members (id → address), this replica included; used only
    /// the first time the data dir is opened, by the lowest-numbered member,
    /// which bootstraps the cluster (the others learn the membership from
    /// it). Empty: join later as a learner.
    pub initial_members: BTreeMap<u64, String>,
    /// Raft timing and compaction.
    pub raft: RaftTuning,
    /// Admission policy knobs.
    pub admission: AdmissionConfig,
    /// How often the leader runs admission when nothing wakes it sooner.
    pub admission_interval: Duration,
    /// Most commands in one log entry.
    pub max_batch: usize,
    /// Agent-stream settings.
    pub hub: HubConfig,
    /// A teardown's tasks that have not acked this long after it started are
    /// forced to preempted.
    pub teardown_force_after: Duration,
    /// When finished allocations leave the live state (`None`: never).
    pub retention: Option<crate::policy::RetentionConfig>,
    /// Priority-preemption knobs (the leader decides; agents are told the
    /// checkpoint deadlines).
    pub preemption: PreemptionConfig,
    /// Elastic-reclamation knobs (the return grace).
    pub reclaim: crate::policy::ReclaimConfig,
    /// Default walltime in seconds by preemption class (submits without one).
    pub walltime_defaults: BTreeMap<u8, u64>,
    /// A drain's timeout when neither the request nor the node's
    /// `muster.drain-timeout` label gives one.
    pub drain_timeout: Duration,
    /// A deliberate bug, for proving that the chaos checks catch one. Never
    /// set outside tests.
    pub inject_bug: Option<InjectedBug>,
    /// Serve plain HTTP here: `/metrics`, `/healthz`, `/readyz`, `/ui`
    /// (port 0 picks one: see [`Replica::http_addr`]).
    pub http: Option<SocketAddr>,
    /// How the HTTP listener serves: the dashboard's refresh, the
    /// per-client rate, the optional token.
    pub http_options: super::observe::http::HttpOptions,
    /// The one clock every path of this replica reads.
    pub clock: SharedClock,
    /// How a submit's image tag is resolved to the digest every task runs
    /// (`None`: never; the agents resolve it at their pulls).
    pub registry: Option<muster_registry::RegistryConfig>,
}

impl ReplicaConfig {
    /// A config with the defaults for everything but identity and storage.
    pub fn new(id: u64, advertise: impl Into<String>, data_dir: impl Into<PathBuf>) -> ReplicaConfig {
        ReplicaConfig {
            id,
            advertise: advertise.into(),
            data_dir: data_dir.into(),
            tls: None,
            limits: super::api::limits::ServerLimits::default(),
            store: muster_raft_store::StoreOptions::default(),
            initial_members: BTreeMap::new(),
            raft: RaftTuning::default(),
            admission: AdmissionConfig::default(),
            admission_interval: Duration::from_secs(5),
            max_batch: 4096,
            hub: HubConfig::default(),
            teardown_force_after: Duration::from_millis(crate::policy::DEFAULT_FORCE_AFTER_MS),
            retention: Some(crate::policy::RetentionConfig::default()),
            preemption: PreemptionConfig::default(),
            reclaim: crate::policy::ReclaimConfig::default(),
            walltime_defaults: BTreeMap::new(),
            drain_timeout: Duration::from_millis(crate::policy::DEFAULT_DRAIN_TIMEOUT_MS),
            inject_bug: None,
            http: None,
            http_options: Default::default(),
            clock: SharedClock::system(),
            registry: Some(muster_registry::RegistryConfig::default()),
        }
    }
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory could not be opened.
    #[error(transparent)]
    Storage(#[from] OpenError),
    /// The Raft configuration is invalid.
    #[error("invalid raft configuration: {0}")]
    Config(String),
    /// Raft failed to start.
    #[error("raft failed to start: {0}")]
    Raft(String),
    /// The listener's address is unusable.
    #[error("listener: {0}")]
    Listener(std::io::Error),
    /// The HTTP listener's address is unusable.
    #[error("cannot serve HTTP on {0}: {1}")]
    Http(SocketAddr, std::io::Error),
    /// The job-history database could not be opened (it names its path).
    #[error("cannot open the job history: {0}")]
    History(#[from] muster_history::HistoryError),
    /// The server's TLS settings were refused.
    #[error("cannot serve mutual TLS: {0}")]
    Tls(String),
    /// gRPC reflection could not be built from the descriptors.
    #[error("cannot serve gRPC reflection: {0}")]
    Reflection(String),
}
