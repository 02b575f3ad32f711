//! One scheduler replica: storage, Raft, the gRPC server (Raft, client and
//! admin services on one port, with the standard health and reflection
//! services), the group-commit proposer, the leader-only loops, and the
//! optional plain-HTTP listener (metrics, probes, dashboard).
//!
//! ```text
//!   TcpListener ──▶ tonic: RaftService · AllocationService · NodeService · VClusterService
//!                          │                 │            AdminService · AgentService
//!                          │                 │            grpc.health.v1 · grpc.reflection
//!                          ▼                 ▼
//!                     openraft::Raft ◀── Proposer (batches) ◀── leader loops
//!                          │
//!                LogStore / StateMachineStore (log files + snapshot.bin)
//!
//!   --http ──▶ axum: /metrics · /healthz · /readyz · /ui
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_clock::SharedClock;
use muster_proto::v1;
use muster_proto::v1::admin_service_server::AdminServiceServer;
use muster_proto::v1::agent_service_server::AgentServiceServer;
use muster_proto::v1::allocation_service_server::AllocationServiceServer;
use muster_proto::v1::history_service_server::HistoryServiceServer;
use muster_proto::v1::node_service_server::NodeServiceServer;
use muster_proto::v1::raft_service_server::RaftServiceServer;
use muster_proto::v1::v_cluster_service_server::VClusterServiceServer;
use muster_raft_store::{AppReader, OpenError};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::admin_api::AdminApi;
use super::agent_hub::{AgentHub, AgentRegistry, HubConfig, Liveness, MAX_AGENT_MESSAGE_BYTES};
use super::background::Background;
use super::client_api::ClientApi;
use super::health::Readiness;
use super::leader_watch::WatchTiming;
use super::node_api::NodeApi;
use super::proposer::Proposer;
use super::raft_net::{MAX_RAFT_MESSAGE_BYTES, Network, RaftRpc};
use super::{MusterRaft, hex};
use crate::policy::AdmissionConfig;
use crate::policy::PreemptionConfig;
use crate::sm::State;
use muster_core::tick::LeaderConfig;

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
    pub limits: super::limits::ServerLimits,
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
    /// A node silent this long while holding work is marked lost.
    pub node_lost_after: Duration,
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
    pub http_options: super::http::HttpOptions,
    /// The one clock every path of this replica reads.
    pub clock: SharedClock,
}

/// Deliberate bugs the chaos harness must catch (`muster server --inject-bug`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedBug {
    /// Acknowledge a submit with the id it will get before proposing it, and
    /// propose it a second later: a leader lost in that second loses an
    /// acknowledged allocation.
    AckBeforeCommit,
    /// The log store acknowledges appended entries without fsyncing them: a
    /// power loss of a majority loses acknowledged allocations.
    AckBeforeFsync,
    /// The log store acknowledges appended entries even when their fsync
    /// failed, and keeps writing ("fsyncgate").
    AckDespiteFsyncError,
    /// The leader stamps entries, and compares deadlines, with its raw wall
    /// clock rather than the paced replicated time: a jump of its clock
    /// fires every deadline within the jump at once.
    UnpacedLeaderClock,
    /// A voter removed from the cluster stays on as a learner: the leader
    /// keeps replicating to a machine that was taken away, for ever.
    RemovedVotersLinger,
    /// The log store acknowledges appended entries even when their write
    /// failed (a full disk), leaving the torn record in the log.
    AckDespiteWriteError,
    /// When a gang is torn down because one of its tasks failed, the leader
    /// never tells the gang's other ranks to stop: they run on after the
    /// force deadline while the gang is placed again.
    SpareFailedGangPeers,
    /// A submit whose write has not committed within
    /// [`SLOW_WRITE_REFUSED_AFTER`] is answered ABORTED, a definite refusal,
    /// though the entry stays proposed and may commit: the answer must
    /// have been "did not complete" (the client cannot know).
    RefuseSlowWrites,
}

/// How long a submit waits with the injected bug `refuse-slow-writes`.
pub const SLOW_WRITE_REFUSED_AFTER: Duration = Duration::from_millis(250);

impl InjectedBug {
    /// Parses the flag's value.
    pub fn parse(s: &str) -> Option<InjectedBug> {
        match s {
            "ack-before-commit" => Some(InjectedBug::AckBeforeCommit),
            "ack-before-fsync" => Some(InjectedBug::AckBeforeFsync),
            "ack-despite-fsync-error" => Some(InjectedBug::AckDespiteFsyncError),
            "unpaced-leader-clock" => Some(InjectedBug::UnpacedLeaderClock),
            "removed-voters-linger" => Some(InjectedBug::RemovedVotersLinger),
            "ack-despite-write-error" => Some(InjectedBug::AckDespiteWriteError),
            "spare-failed-gang-peers" => Some(InjectedBug::SpareFailedGangPeers),
            "refuse-slow-writes" => Some(InjectedBug::RefuseSlowWrites),
            _ => None,
        }
    }

    /// Every bug's flag value.
    pub const NAMES: &'static [&'static str] = &[
        "ack-before-commit",
        "ack-before-fsync",
        "ack-despite-fsync-error",
        "ack-despite-write-error",
        "unpaced-leader-clock",
        "removed-voters-linger",
        "spare-failed-gang-peers",
        "refuse-slow-writes",
    ];
}

impl ReplicaConfig {
    /// A config with the defaults for everything but identity and storage.
    pub fn new(id: u64, advertise: impl Into<String>, data_dir: impl Into<PathBuf>) -> ReplicaConfig {
        ReplicaConfig {
            id,
            advertise: advertise.into(),
            data_dir: data_dir.into(),
            tls: None,
            limits: super::limits::ServerLimits::default(),
            store: muster_raft_store::StoreOptions::default(),
            initial_members: BTreeMap::new(),
            raft: RaftTuning::default(),
            admission: AdmissionConfig::default(),
            admission_interval: Duration::from_secs(5),
            max_batch: 4096,
            hub: HubConfig::default(),
            node_lost_after: Duration::from_secs(30),
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

/// What every service of a replica shares.
#[derive(Clone)]
pub struct Shared {
    /// This replica's id.
    pub id: u64,
    /// Its advertised address.
    pub advertise: String,
    /// The Raft handle.
    pub raft: MusterRaft,
    /// The applied state.
    pub reader: AppReader<State>,
    /// Group-commit proposals.
    pub proposer: Proposer,
    /// Wakes the leader's admission loop (a submit or a release happened).
    pub admission_wake: Arc<Notify>,
    /// When each agent was last heard from (leader only, memory only).
    pub liveness: Liveness,
    /// The one clock every path of this replica reads.
    pub clock: SharedClock,
    /// Replicated time as this replica stamps it while it leads.
    pub time: super::leader_time::LeaderTime,
    /// Whether this replica leads now (one watcher of Raft's metrics feeds
    /// it, so that agent streams need not each wake on every entry).
    pub leading: watch::Receiver<bool>,
    /// The agent streams this replica holds.
    pub agents: AgentRegistry,
    /// Linearizable reads waiting to share a leadership confirmation.
    pub reads: super::read_index::ReadBatcher,
    /// This replica's job history (`<data-dir>/history.sqlite`).
    pub history: Arc<muster_history::HistoryStore>,
}

impl Shared {
    /// Now, for any decision this replica makes: while it leads, the
    /// replicated time it stamps on entries ([`LeaderTime`]); otherwise the
    /// clock's wall time. Never behind the time of the last applied entry
    /// (so a replica whose clock lags the leader's never sees a replicated
    /// deadline as still ahead).
    ///
    /// [`LeaderTime`]: super::leader_time::LeaderTime
    pub fn now(&self, st: &State) -> u64 {
        if *self.leading.borrow() { self.time.at_least(st.now_ms()) } else { self.clock.wall_ms().max(st.now_ms()) }
    }
}

/// How long a replica's shutdown waits for its background tasks.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A running replica.
pub struct Replica {
    shared: Shared,
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    http: Option<JoinHandle<std::io::Result<()>>>,
    readiness: watch::Receiver<Readiness>,
    /// Every other task it spawned, awaited on shutdown.
    background: Background,
    /// Admission passes run while leading, their commands applied.
    admission_passes: Arc<AtomicU64>,
    /// Its Raft network's view of which peers answer.
    peers: super::raft_net::Reachability,
}

impl Replica {
    /// Opens storage, starts Raft and serves on `listener`. On a fresh data
    /// dir with initial members, bootstraps the cluster.
    pub async fn start(cfg: ReplicaConfig, listener: TcpListener) -> Result<Replica, StartError> {
        let addr = listener.local_addr().map_err(StartError::Listener)?;
        let http_listener = match cfg.http {
            Some(a) => {
                // Install the recorder before anything records.
                super::telemetry::prometheus();
                Some(tokio::net::TcpListener::bind(a).await.map_err(|e| StartError::Http(a, e))?)
            }
            None => None,
        };
        super::telemetry::describe();
        let mut store = cfg.store.clone();
        match cfg.inject_bug {
            Some(InjectedBug::AckBeforeFsync) => store.fault = Some(muster_raft_store::StoreFault::AckBeforeFsync),
            Some(InjectedBug::AckDespiteFsyncError) => {
                store.fault = Some(muster_raft_store::StoreFault::AckDespiteSyncError);
            }
            Some(InjectedBug::AckDespiteWriteError) => {
                store.fault = Some(muster_raft_store::StoreFault::AckDespiteWriteError);
            }
            _ => {}
        }
        let (log, sm) = muster_raft_store::open_with::<State>(&cfg.data_dir, &store)?;
        let last_log: super::elector::LastLogReader = {
            let log = log.clone();
            std::sync::Arc::new(move || log.last_log_id().map_or((0, 0), |id| (id.leader_id.term, id.index)))
        };
        let reader = sm.reader();
        let history = Arc::new(muster_history::HistoryStore::open(&cfg.data_dir.join("history.sqlite"))?);
        let raft_cfg = Config {
            cluster_name: "muster".into(),
            heartbeat_interval: cfg.raft.heartbeat_ms,
            election_timeout_min: cfg.raft.election_timeout_ms.0,
            election_timeout_max: cfg.raft.election_timeout_ms.1,
            install_snapshot_timeout: 10_000,
            snapshot_max_chunk_size: 1 << 20,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.raft.snapshot_every),
            max_in_snapshot_log_to_keep: cfg.raft.keep_behind_snapshot,
            // Elections are the elector's, after a pre-vote (elector.rs).
            enable_elect: false,
            ..Config::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        let network = Network::new(cfg.tls.clone());
        let peers = network.reachability();
        let raft = MusterRaft::new(cfg.id, Arc::new(raft_cfg), network, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let time = super::leader_time::LeaderTime::new(
            cfg.clock.clone(),
            reader.clone(),
            raft.metrics(),
            cfg.inject_bug == Some(InjectedBug::UnpacedLeaderClock),
        );
        let proposer = Proposer::start(raft.clone(), cfg.max_batch, time.clone());
        let (leader_gone_tx, leader_gone) = watch::channel(None);
        let watch_timing = WatchTiming::new(cfg.raft.heartbeat_ms, cfg.raft.election_timeout_ms);
        let election_timing = super::elector::ElectionTiming::new(cfg.raft.heartbeat_ms, cfg.raft.election_timeout_ms);
        let heard = super::elector::LastHeard::new(cfg.clock.clone());
        let mut background = Background::default();
        let leading = {
            let (tx, rx) = watch::channel(false);
            let mut metrics = raft.metrics();
            background.spawn("leadership watch", async move {
                loop {
                    let now = metrics.borrow_and_update().state == ServerState::Leader;
                    tx.send_if_modified(|v| std::mem::replace(v, now) != now);
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            });
            rx
        };
        let shared = Shared {
            id: cfg.id,
            advertise: cfg.advertise.clone(),
            raft: raft.clone(),
            reader,
            proposer,
            admission_wake: Arc::new(Notify::new()),
            liveness: Liveness::new(cfg.clock.clone()),
            clock: cfg.clock.clone(),
            time,
            leading,
            agents: AgentRegistry::default(),
            reads: Default::default(),
            history: history.clone(),
        };
        let policies = Arc::new(super::policies::Policies::new(
            cfg.preemption,
            cfg.admission,
            cfg.walltime_defaults.clone(),
            cfg.drain_timeout,
        ));
        let bugs = Arc::new(super::policies::BugInjector::new(cfg.inject_bug));
        let successor = super::leader_watch::SuccessorHint::new(
            raft.clone(),
            leader_gone,
            2 * watch_timing.lease + watch_timing.stagger,
        );
        if let Some(bug) = cfg.inject_bug {
            tracing::warn!(bug = ?bug, "running with a deliberately injected bug (chaos-check tests only)");
        }

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        fn reflection() -> tonic_reflection::server::Builder<'static> {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(muster_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        }
        let reflection_v1 = reflection().build_v1().map_err(|e| StartError::Reflection(e.to_string()))?;
        let reflection_v1alpha = reflection().build_v1alpha().map_err(|e| StartError::Reflection(e.to_string()))?;
        let (stop, mut stopped) = watch::channel(false);
        let mut builder = tonic::transport::Server::builder()
            .max_concurrent_streams(cfg.limits.max_streams_per_connection)
            .timeout(cfg.limits.request_timeout);
        let connections = super::limits::Connections::new(cfg.limits);
        let prove = {
            let c = connections.clone();
            Arc::new(move |addr| c.admitted(addr)) as muster_tls::AdmitHook
        };
        let auth = match &cfg.tls {
            Some(tls) => {
                let tls_cfg = tls.server_config().timeout(cfg.limits.handshake_timeout);
                builder = builder.tls_config(tls_cfg).map_err(|e| StartError::Tls(e.to_string()))?;
                let tokens = shared.clone();
                muster_tls::AuthLayer::new(Arc::new(super::auth::policy))
                    .with_tokens(Arc::new(move |secret: &str| {
                        tokens.reader.read(|st| super::auth::resolve_token(st, secret, tokens.now(st)))
                    }))
                    .on_admit(prove)
            }
            None => {
                tracing::warn!(
                    "running without TLS or authorisation (--insecure): anyone who reaches this port owns the cluster"
                );
                muster_tls::AuthLayer::insecure().on_admit(prove)
            }
        };
        let server = builder
            .layer(auth)
            .add_service(
                RaftServiceServer::new(RaftRpc::new(
                    raft.clone(),
                    cfg.id,
                    stop.subscribe(),
                    heard.clone(),
                    election_timing.lease,
                    last_log.clone(),
                ))
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
            )
            .add_service(AllocationServiceServer::new(ClientApi::new(shared.clone(), policies.clone(), bugs.clone())))
            .add_service(NodeServiceServer::new(NodeApi::new(shared.clone(), policies.clone())))
            .add_service(VClusterServiceServer::new(super::vcluster_api::VClusterApi::new(shared.clone())))
            .add_service(AdminServiceServer::new(AdminApi::new(shared.clone(), bugs.clone())))
            .add_service(HistoryServiceServer::new(super::history::HistoryApi::new(shared.clone())))
            .add_service(
                AgentServiceServer::new(AgentHub::new(
                    shared.clone(),
                    HubConfig { node_lost_after: cfg.node_lost_after, ..cfg.hub },
                    cfg.preemption,
                    successor,
                    bugs.clone(),
                ))
                .max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_AGENT_MESSAGE_BYTES),
            )
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .serve_with_incoming_shutdown(connections.incoming(listener), async move {
                let _ = stopped.wait_for(|s| *s).await;
            });
        let server = tokio::spawn(server);

        // The lowest-numbered initial member bootstraps the cluster; the
        // others learn the membership from it (initialising every member at
        // once races their first elections).
        let bootstraps = cfg.initial_members.keys().next() == Some(&cfg.id);
        if bootstraps && !raft.is_initialized().await.map_err(|e| StartError::Raft(e.to_string()))? {
            let members: BTreeMap<u64, BasicNode> =
                cfg.initial_members.iter().map(|(id, a)| (*id, BasicNode::new(a.clone()))).collect();
            if let Err(e) = raft.initialize(members).await {
                tracing::info!(error = %e, "cluster already initialised");
            }
        }
        let admission_passes = Arc::new(AtomicU64::new(0));
        let leader_loop = super::leader::run(
            shared.clone(),
            LeaderConfig {
                admission: cfg.admission,
                preemption: cfg.preemption,
                reclaim: cfg.reclaim,
                preempt: true,
                node_lost_after_ms: cfg.node_lost_after.as_millis() as u64,
                teardown_force_after_ms: cfg.teardown_force_after.as_millis() as u64,
                liveness_every_ms: muster_core::tick::DEFAULT_LIVENESS_EVERY_MS,
                retention: cfg.retention,
            },
            cfg.admission_interval,
            admission_passes.clone(),
        );
        background.spawn_until("leader loop", stop.subscribe(), leader_loop);
        super::observe::set_cycle_threshold(cfg.preemption.cycle_threshold);
        background.spawn("raft metrics", export_metrics(shared.clone()));
        background.spawn(
            "leader watch",
            super::leader_watch::run(
                raft.clone(),
                cfg.id,
                Network::new(cfg.tls.clone()),
                watch_timing,
                leader_gone_tx,
                stop.subscribe(),
            ),
        );
        background.spawn(
            "elector",
            super::elector::run(
                raft.clone(),
                cfg.id,
                Network::new(cfg.tls.clone()),
                heard.clone(),
                last_log,
                election_timing,
                stop.subscribe(),
            ),
        );
        background.spawn("state metrics", export_state_metrics(shared.clone(), stop.subscribe()));
        background
            .spawn("history writer", super::history::run_writer(shared.clone(), history.clone(), stop.subscribe()));
        background.spawn(
            "history catch-up",
            super::history::run_catch_up(
                shared.clone(),
                history.clone(),
                Network::new(cfg.tls.clone()),
                stop.subscribe(),
            ),
        );
        let (readiness_tx, readiness) = watch::channel(Readiness::starting());
        background.spawn_until(
            "health",
            stop.subscribe(),
            super::health::run(shared.clone(), health_reporter, readiness_tx),
        );
        let (http_addr, http) = match http_listener {
            Some(l) => {
                let a = l.local_addr().map_err(|e| StartError::Http(cfg.http.expect("set"), e))?;
                tracing::info!(id = cfg.id, http = %super::http::describe(a), "serving HTTP");
                let task = super::http::serve(
                    l,
                    shared.clone(),
                    policies.clone(),
                    readiness.clone(),
                    cfg.tls.clone(),
                    cfg.http_options.clone(),
                    stop.subscribe(),
                );
                (Some(a), Some(task))
            }
            None => (None, None),
        };
        tracing::info!(id = cfg.id, %addr, advertise = %cfg.advertise, "replica started");
        Ok(Replica { shared, addr, http_addr, stop, server, http, readiness, background, admission_passes, peers })
    }

    /// How many admission passes it has run while leading, each with its
    /// commands applied: a pass after a change has looked at the queue as
    /// the change left it (tests wait on this, not on time, to see that
    /// something was not placed).
    pub fn admission_passes(&self) -> u64 {
        self.admission_passes.load(Ordering::Relaxed)
    }

    /// The socket address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where its HTTP listener serves, if it has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The latest readiness reading (what `/readyz` and gRPC health say).
    pub fn readiness(&self) -> Readiness {
        self.readiness.borrow().clone()
    }

    /// Its id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The Raft handle.
    pub fn raft(&self) -> &MusterRaft {
        &self.shared.raft
    }

    /// The applied state.
    pub fn reader(&self) -> &AppReader<State> {
        &self.shared.reader
    }

    /// The group-commit proposer.
    pub fn proposer(&self) -> &Proposer {
        &self.shared.proposer
    }

    /// The peers whose last Raft call from this replica found nobody
    /// answering (connection refused, unavailable, cancelled).
    pub fn unreachable_peers(&self) -> Vec<u64> {
        self.peers.unreachable()
    }

    /// This replica's view of the cluster.
    pub fn status(&self) -> v1::ReplicaStatus {
        status_of(&self.shared)
    }

    /// Resolves, with the reason, once Raft has stopped on its own (its log
    /// failed to write or sync): the replica then serves nothing, and its
    /// process should exit so that a supervisor restarts it.
    pub async fn stopped(&self) -> String {
        let mut metrics = self.shared.raft.metrics();
        loop {
            if let Err(e) = &metrics.borrow_and_update().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "Raft stopped".into();
            }
        }
    }

    /// Every replica is about to stop (a local cluster shutting down): a
    /// peer that stops answering from now on is expected, not warned about.
    pub fn expect_peers_to_stop(&self) {
        self.peers.hush();
    }

    /// Stops serving, stops Raft and releases the data dir: one stop
    /// signal to every task, then each is awaited. Returns the names of
    /// background tasks that had not stopped within [`SHUTDOWN_GRACE`] and
    /// were aborted (none, when all is well).
    pub async fn shutdown(self) -> Vec<&'static str> {
        let _ = self.stop.send(true);
        let _ = self.shared.raft.shutdown().await;
        let _ = self.server.await;
        if let Some(http) = self.http {
            let _ = http.await;
        }
        self.background.join(SHUTDOWN_GRACE).await
    }
}

/// A replica's view of itself and the cluster.
pub fn status_of(shared: &Shared) -> v1::ReplicaStatus {
    let m = shared.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: Vec<u64> = membership.voter_ids().collect();
    let members: Vec<v1::Member> = membership
        .nodes()
        .map(|(id, node)| v1::Member { id: *id, address: node.addr.clone(), voter: voters.contains(id) })
        .collect();
    let role = match m.state {
        ServerState::Leader => "leader",
        ServerState::Candidate => "candidate",
        ServerState::Follower => "follower",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    };
    let leader_address = m
        .current_leader
        .and_then(|l| membership.nodes().find(|(id, _)| **id == l).map(|(_, n)| n.addr.clone()))
        .unwrap_or_default();
    let (applied, digest) = shared.reader.applied_and_digest();
    v1::ReplicaStatus {
        id: shared.id,
        address: shared.advertise.clone(),
        role: role.to_string(),
        term: m.current_term,
        leader_id: m.current_leader.unwrap_or(0),
        leader_address,
        applied_index: applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        state_digest: hex(&digest),
        snapshot_index: m.snapshot.map_or(0, |l| l.index),
        members,
    }
}

/// Keeps the replica's Raft gauges current (labelled `replica`, so the
/// replicas of one process stay apart): `muster_raft_term`,
/// `muster_raft_leader_id`, `muster_raft_is_leader`,
/// `muster_raft_applied_index`, `muster_raft_last_log_index`,
/// `muster_raft_snapshot_index`. Ends when Raft shuts down.
async fn export_metrics(shared: Shared) {
    let mut metrics = shared.raft.metrics();
    let replica = shared.id.to_string();
    loop {
        {
            let m = metrics.borrow_and_update();
            let r = replica.clone();
            metrics::gauge!("muster_raft_term", "replica" => r.clone()).set(m.current_term as f64);
            metrics::gauge!("muster_raft_leader_id", "replica" => r.clone()).set(m.current_leader.unwrap_or(0) as f64);
            metrics::gauge!("muster_raft_is_leader", "replica" => r.clone()).set(if m.state == ServerState::Leader {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("muster_raft_applied_index", "replica" => r.clone())
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            metrics::gauge!("muster_raft_last_log_index", "replica" => r.clone())
                .set(m.last_log_index.unwrap_or(0) as f64);
            metrics::gauge!("muster_raft_snapshot_index", "replica" => r).set(m.snapshot.map_or(0, |l| l.index) as f64);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// How often the gauges read from the applied state are refreshed. A
/// refresh reads the state's indexes (counts per class and per node), so
/// its cost does not grow with the queue.
const STATE_METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the gauges read from the applied state current, once a second:
/// `muster_sm_queue_depth`, `muster_queue_depth{class}`,
/// `muster_sm_allocations`, `muster_sm_forgotten_allocations`, `muster_sm_nodes`, `muster_nodes{state}`,
/// `muster_nodes_flagged_dead` (nodes marked lost), `muster_gpus{state}`.
/// Ends when the replica stops.
async fn export_state_metrics(shared: Shared, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(STATE_METRICS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (queued, by_class, allocs, nodes, by_status, gpus, forgotten) = shared.reader.read(|st| {
            let by_status = crate::sm::NodeStatus::ALL.map(|s| (s, st.node_count(s)));
            let by_class = st.queued_by_class().clone();
            let gpus = super::dashboard::gpu_totals(st);
            (st.queue_len(), by_class, st.allocs().len(), st.nodes().len(), by_status, gpus, st.forgotten_allocs())
        });
        metrics::gauge!("muster_sm_forgotten_allocations").set(forgotten as f64);
        for (status, count) in by_status {
            if status == crate::sm::NodeStatus::Lost {
                metrics::gauge!("muster_nodes_flagged_dead").set(count as f64);
            }
            metrics::gauge!("muster_nodes", "state" => status.as_str()).set(count as f64);
        }
        for class in super::telemetry::CLASSES {
            let n = class.parse::<u8>().ok().and_then(|c| by_class.get(&c)).copied().unwrap_or(0);
            metrics::gauge!("muster_queue_depth", "class" => class).set(f64::from(n));
        }
        let (free, reserved, running) = gpus;
        metrics::gauge!("muster_gpus", "state" => "free").set(free as f64);
        metrics::gauge!("muster_gpus", "state" => "reserved").set(reserved as f64);
        metrics::gauge!("muster_gpus", "state" => "running").set(running as f64);
        metrics::gauge!("muster_sm_queue_depth").set(queued as f64);
        metrics::gauge!("muster_sm_allocations").set(allocs as f64);
        metrics::gauge!("muster_sm_nodes").set(nodes as f64);
    }
}
