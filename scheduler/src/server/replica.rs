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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::admin_service_server::AdminServiceServer;
use muster_proto::v1::agent_service_server::AgentServiceServer;
use muster_proto::v1::allocation_service_server::AllocationServiceServer;
use muster_proto::v1::history_service_server::HistoryServiceServer;
use muster_proto::v1::node_service_server::NodeServiceServer;
use muster_proto::v1::raft_service_server::RaftServiceServer;
use muster_proto::v1::v_cluster_service_server::VClusterServiceServer;
use muster_raft_store::AppReader;
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::MusterRaft;
use super::api::admin::AdminApi;
use super::api::agent_hub::{AgentHub, MAX_AGENT_MESSAGE_BYTES};
use super::api::client::ClientApi;
use super::api::node::NodeApi;
use super::background::Background;
use super::config::{ReplicaConfig, StartError};
use super::leader::LeaderWork;
use super::observe::health::Readiness;
use super::policies::InjectedBug;
use super::raft::leader_watch::WatchTiming;
use super::raft::network::{MAX_RAFT_MESSAGE_BYTES, Network, RaftRpc};
use super::raft::{Consensus, ConsensusParts, Proposer};
use crate::sm::State;
use muster_core::tick::LeaderConfig;

/// How long a replica's shutdown waits for its background tasks.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A running replica.
pub struct Replica {
    consensus: Consensus,
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
    peers: super::raft::network::Reachability,
}

impl Replica {
    /// Opens storage, starts Raft and serves on `listener`. On a fresh data
    /// dir with initial members, bootstraps the cluster.
    pub async fn start(cfg: ReplicaConfig, listener: TcpListener) -> Result<Replica, StartError> {
        let addr = listener.local_addr().map_err(StartError::Listener)?;
        let http_listener = match cfg.http {
            Some(a) => {
                // Install the recorder before anything records.
                super::observe::telemetry::prometheus();
                Some(tokio::net::TcpListener::bind(a).await.map_err(|e| StartError::Http(a, e))?)
            }
            None => None,
        };
        super::observe::telemetry::describe();
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
        let last_log: super::raft::elector::LastLogReader = {
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
        let time = super::raft::leader_time::LeaderTime::new(
            cfg.clock.clone(),
            reader.clone(),
            raft.metrics(),
            cfg.inject_bug == Some(InjectedBug::UnpacedLeaderClock),
        );
        let proposer = Proposer::start(raft.clone(), cfg.max_batch, time.clone(), super::observe::observe);
        let (leader_gone_tx, leader_gone) = watch::channel(None);
        let watch_timing = WatchTiming::new(cfg.raft.heartbeat_ms, cfg.raft.election_timeout_ms);
        let election_timing =
            super::raft::elector::ElectionTiming::new(cfg.raft.heartbeat_ms, cfg.raft.election_timeout_ms);
        let heard = super::raft::elector::LastHeard::new(cfg.clock.clone());
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
        let consensus = Consensus::new(ConsensusParts {
            id: cfg.id,
            advertise: cfg.advertise.clone(),
            raft: raft.clone(),
            reader,
            proposer,
            clock: cfg.clock.clone(),
            time,
            leading,
        });
        let work = LeaderWork::new(cfg.clock.clone());
        let policies = Arc::new(
            super::policies::Policies::new(
                cfg.preemption,
                cfg.admission,
                cfg.walltime_defaults.clone(),
                cfg.drain_timeout,
            )
            // Pinning tags is a convenience at submit: a machine whose TLS
            // roots cannot be loaded runs without it (the agents resolve).
            .with_registry(cfg.registry.as_ref().and_then(|r| match muster_registry::Registry::new(r) {
                Ok(r) => Some(Arc::new(r)),
                Err(e) => {
                    tracing::warn!(error = %e, "image tags are not resolved at submit");
                    None
                }
            })),
        );
        let bugs = Arc::new(super::policies::BugInjector::new(cfg.inject_bug));
        let successor = super::raft::leader_watch::SuccessorHint::new(
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
        let connections = super::api::limits::Connections::new(cfg.limits);
        let prove = {
            let c = connections.clone();
            Arc::new(move |addr| c.admitted(addr)) as muster_tls::AdmitHook
        };
        let auth = match &cfg.tls {
            Some(tls) => {
                let tls_cfg = tls.server_config().timeout(cfg.limits.handshake_timeout);
                builder = builder.tls_config(tls_cfg).map_err(|e| StartError::Tls(e.to_string()))?;
                let tokens = consensus.clone();
                muster_tls::AuthLayer::new(Arc::new(super::api::auth::policy))
                    .with_tokens(Arc::new(move |secret: &str| {
                        tokens.reader().read(|st| super::api::auth::resolve_token(st, secret, tokens.now(st)))
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
            .add_service(AllocationServiceServer::new(ClientApi::new(
                consensus.clone(),
                work.clone(),
                policies.clone(),
                history.clone(),
                bugs.clone(),
            )))
            .add_service(NodeServiceServer::new(NodeApi::new(consensus.clone(), work.clone(), policies.clone())))
            .add_service(VClusterServiceServer::new(super::api::vcluster::VClusterApi::new(consensus.clone())))
            .add_service(AdminServiceServer::new(AdminApi::new(consensus.clone(), history.clone(), bugs.clone())))
            .add_service(HistoryServiceServer::new(super::api::history::HistoryApi::new(
                consensus.clone(),
                history.clone(),
            )))
            .add_service(
                AgentServiceServer::new(AgentHub::new(
                    consensus.clone(),
                    work.clone(),
                    cfg.hub,
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
            consensus.clone(),
            work,
            LeaderConfig {
                admission: cfg.admission,
                preemption: cfg.preemption,
                reclaim: cfg.reclaim,
                preempt: true,
                node_lost_after_ms: cfg.hub.node_lost_after.as_millis() as u64,
                teardown_force_after_ms: cfg.teardown_force_after.as_millis() as u64,
                liveness_every_ms: muster_core::tick::DEFAULT_LIVENESS_EVERY_MS,
                retention: cfg.retention,
            },
            cfg.admission_interval,
            admission_passes.clone(),
        );
        background.spawn_until("leader loop", stop.subscribe(), leader_loop);
        super::observe::set_cycle_threshold(cfg.preemption.cycle_threshold);
        background.spawn("raft metrics", super::observe::gauges::export_raft(consensus.clone()));
        background.spawn(
            "leader watch",
            super::raft::leader_watch::run(
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
            super::raft::elector::run(
                raft.clone(),
                cfg.id,
                Network::new(cfg.tls.clone()),
                heard.clone(),
                last_log,
                election_timing,
                stop.subscribe(),
            ),
        );
        background.spawn("state metrics", super::observe::gauges::export_state(consensus.clone(), stop.subscribe()));
        background
            .spawn("history writer", super::history::run_writer(consensus.clone(), history.clone(), stop.subscribe()));
        background.spawn(
            "history catch-up",
            super::history::run_catch_up(
                consensus.clone(),
                history.clone(),
                Network::new(cfg.tls.clone()),
                stop.subscribe(),
            ),
        );
        let (readiness_tx, readiness) = watch::channel(Readiness::starting());
        background.spawn_until(
            "health",
            stop.subscribe(),
            super::observe::health::run(consensus.clone(), health_reporter, readiness_tx),
        );
        let (http_addr, http) = match http_listener {
            Some(l) => {
                let a = l.local_addr().map_err(|e| StartError::Http(cfg.http.expect("set"), e))?;
                tracing::info!(id = cfg.id, http = %super::observe::http::describe(a), "serving HTTP");
                let task = super::observe::http::serve(
                    l,
                    consensus.clone(),
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
        Ok(Replica { consensus, addr, http_addr, stop, server, http, readiness, background, admission_passes, peers })
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
        self.consensus.id()
    }

    /// The Raft handle.
    pub fn raft(&self) -> &MusterRaft {
        self.consensus.raft()
    }

    /// The applied state.
    pub fn reader(&self) -> &AppReader<State> {
        self.consensus.reader()
    }

    /// The group-commit proposer.
    pub fn proposer(&self) -> &Proposer {
        self.consensus.proposer()
    }

    /// The peers whose last Raft call from this replica found nobody
    /// answering (connection refused, unavailable, cancelled).
    pub fn unreachable_peers(&self) -> Vec<u64> {
        self.peers.unreachable()
    }

    /// This replica's view of the cluster.
    pub fn status(&self) -> v1::ReplicaStatus {
        self.consensus.status()
    }

    /// Resolves, with the reason, once Raft has stopped on its own (its log
    /// failed to write or sync): the replica then serves nothing, and its
    /// process should exit so that a supervisor restarts it.
    pub async fn stopped(&self) -> String {
        let mut metrics = self.consensus.raft().metrics();
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
        let _ = self.consensus.raft().shutdown().await;
        let _ = self.server.await;
        if let Some(http) = self.http {
            let _ = http.await;
        }
        self.background.join(SHUTDOWN_GRACE).await
    }
}
