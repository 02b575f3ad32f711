//! A whole cluster in one process on loopback: scheduler replicas and node
//! agents, for `muster dev` and end-to-end tests.
//!
//! Replicas bind port 0 first so every member knows every address before
//! any starts; agents advertise fake GPU devices (they run real processes,
//! but `CUDA_VISIBLE_DEVICES` names devices that do not exist) unless told
//! otherwise.

#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use muster_agent::agent::{Agent, AgentConfig};
use muster_proto::v1;
use muster_scheduler::server::{Replica, ReplicaConfig};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How to build a local cluster.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Scheduler replicas.
    pub replicas: u32,
    /// Node agents.
    pub agents: u32,
    /// GPUs each agent advertises.
    pub gpus_per_agent: u32,
    /// CPUs each agent advertises.
    pub cpus_per_agent: u32,
    /// Memory each agent advertises, MiB.
    pub mem_mb_per_agent: u64,
    /// Heartbeat from agents.
    pub heartbeat: Duration,
    /// A node silent this long while holding work is marked lost.
    pub node_lost_after: Duration,
    /// SIGTERM → SIGKILL grace when the leader stops or preempts a task.
    pub stop_grace: Duration,
    /// Teardown tasks not acked this long after the start are forced.
    pub teardown_force_after: Duration,
    /// Priority-preemption knobs.
    pub preemption: muster_core::policy::PreemptionConfig,
    /// Elastic-reclamation knobs.
    pub reclaim: muster_core::policy::ReclaimConfig,
    /// The `muster.vcluster` label of agent `i`'s node (`node-{i+1}`), for
    /// the first agents; the rest carry none.
    pub node_vclusters: Vec<String>,
    /// More labels of agent `i`'s node, for the first agents (a GPU model,
    /// a rack: what constraints and packing select on).
    pub node_labels: Vec<BTreeMap<String, String>>,
    /// The agents' watchdog knobs.
    pub watchdog: muster_agent::watchdog::WatchdogConfig,
    /// Run without TLS or authorisation.
    pub insecure: bool,
    /// The TLS dir: its CA is used (created when missing) and the
    /// certificates the cluster needs are issued into it when missing
    /// (`server-N`, `agent-node-N`, `admin-dev`). Default: `<dir>/tls`.
    pub tls_dir: Option<PathBuf>,
    /// Give each replica an HTTP listener (metrics, probes, dashboard) on
    /// loopback: replica N on `http_port + N - 1`, or any free port when 0.
    pub http_port: Option<u16>,
    /// Refuse agents no admin admitted (`muster server --node-admission
    /// required`); the cluster admits its own agents as it starts them.
    pub admission_required: bool,
    /// Requests per second one client address may make to each HTTP
    /// listener's dashboard and metrics (`muster server --http-rate`).
    pub http_rate: u32,
    /// The rendezvous ports of the whole cluster, split into equal blocks,
    /// one per agent (they share this machine, so no two may offer the
    /// same port).
    pub rendezvous_ports: muster_core::sm::PortRange,
    /// Contain each agent's tasks in cgroups (`muster_agent::cgroup`)
    /// where this machine allows it.
    pub isolation: bool,
    /// Record why gangs wait (`muster server --no-wait-notes` turns it
    /// off; the gangs bench measures its cost).
    pub note_waits: bool,
    /// Simulated tasks (`muster_agent::executor::sim`): the agents run the
    /// real protocol, but no process; `isolation` and `images` are then
    /// off. `None`: real child processes.
    pub sim: Option<muster_agent::executor::sim::SimConfig>,
    /// Who the agents run tasks as ([`muster_agent::users::RunAs::agent`]: as this process's
    /// own user, the default of `muster dev`).
    pub run_as: muster_agent::users::RunAs,
    /// The `muster` binary, for tasks that start as another user
    /// (`None`: a pre-exec step of a forked process does it), and for
    /// tasks that run in an image (`muster task-container`).
    pub exe: Option<PathBuf>,
    /// Container images (`None`: the agents run none).
    pub images: Option<LocalImages>,
}

/// How a local cluster's agents run container images: each agent keeps its
/// own cache in its work dir, as separate nodes would.
#[derive(Clone, Debug, Default)]
pub struct LocalImages {
    /// Registry credentials and trust.
    pub registry: muster_registry::RegistryConfig,
    /// Host paths a task's `--mount` may name.
    pub allow_mounts: Vec<PathBuf>,
    /// Each agent's cache limit, bytes.
    pub cache_max_bytes: u64,
    /// The installed OCI runtime the agents hand images to (`None`: their
    /// built-in one).
    pub oci: Option<PathBuf>,
}

/// The admin identity a local cluster issues for its operator.
pub const DEV_ADMIN: &str = "dev";

/// Serialises CA set-up and issuance: several clusters in one process may
/// share a TLS dir.
static TLS_SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes sure `dir` holds a CA and a certificate for each role (issuing
/// only what is missing, and again an agent certificate from before agents
/// served checkpoints to each other); returns their material by role.
pub fn ensure_certs(dir: &Path, roles: &[muster_tls::Role]) -> Result<Vec<muster_tls::TlsMaterial>, String> {
    let _guard = TLS_SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if !dir.join("ca.pem").exists() {
        muster_tls::init_ca(dir, "muster dev", muster_tls::Validity::days(3650)).map_err(|e| e.to_string())?;
    }
    roles
        .iter()
        .map(|role| {
            let pem = std::fs::read_to_string(dir.join(format!("{}.pem", role.file_stem()))).ok();
            let outdated = matches!(role, muster_tls::Role::Agent(_))
                && pem.as_deref().is_some_and(|p| !muster_tls::cert_has_dns_name(p, muster_tls::AGENT_NAME));
            if pem.is_none() || outdated {
                muster_tls::issue(dir, role, muster_tls::Validity::days(365), &[]).map_err(|e| e.to_string())?;
            }
            muster_tls::TlsMaterial::load(dir, role).map_err(|e| e.to_string())
        })
        .collect()
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            replicas: 3,
            agents: 4,
            gpus_per_agent: 8,
            cpus_per_agent: 32,
            mem_mb_per_agent: 256_000,
            heartbeat: Duration::from_secs(5),
            node_lost_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(15),
            teardown_force_after: Duration::from_secs(45),
            preemption: muster_core::policy::PreemptionConfig::default(),
            reclaim: muster_core::policy::ReclaimConfig::default(),
            node_vclusters: Vec::new(),
            node_labels: Vec::new(),
            // The agents' GPUs are fake: nothing to check their health by.
            watchdog: muster_agent::watchdog::WatchdogConfig {
                gpu_health: false,
                ..muster_agent::watchdog::WatchdogConfig::default()
            },
            insecure: false,
            tls_dir: None,
            http_port: None,
            http_rate: muster_scheduler::server::observe::http::HttpOptions::default().rate_per_s,
            admission_required: true,
            rendezvous_ports: muster_core::sm::PortRange { first: 29_500, count: 500 },
            isolation: true,
            note_waits: true,
            sim: None,
            run_as: muster_agent::users::RunAs::agent(),
            exe: None,
            images: None,
        }
    }
}

impl LocalConfig {
    /// Agent `i`'s block of the cluster's rendezvous ports.
    pub fn agent_ports(&self, i: u32) -> muster_core::sm::PortRange {
        let r = self.rendezvous_ports;
        let block = r.count / (self.agents.max(1) as u16).max(1);
        match u16::try_from(i).ok().and_then(|i| i.checked_mul(block)) {
            Some(offset) if block > 0 => muster_core::sm::PortRange { first: r.first + offset, count: block },
            _ => muster_core::sm::PortRange::default(),
        }
    }
}

struct AgentHandle {
    node_id: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A running local cluster.
pub struct LocalCluster {
    dir: PathBuf,
    cfg: LocalConfig,
    replicas: Vec<Option<Replica>>,
    addrs: Vec<String>,
    agents: Vec<Option<AgentHandle>>,
    /// Material by role (servers, agents, the admin); empty when insecure.
    tls: BTreeMap<muster_tls::Role, muster_tls::TlsMaterial>,
}

fn listener(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr.parse().map_err(std::io::Error::other)?)?;
    socket.listen(1024)
}

/// Listens again on a stopped replica's address (its peers know it by
/// that). While it was down the kernel may have handed its port to another
/// socket as an outgoing connection's local port; that lasts only as long
/// as the connection, so a bind refused as in use is tried again for up to
/// 30 s.
async fn relisten(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match listener(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tokio::time::Instant::now() < deadline => {
                tracing::warn!(%addr, "a replica's port is still in use; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            result => return result,
        }
    }
}

/// The file in a cluster's data dir that records its replicas' addresses,
/// one per line, so that the cluster can be started again on its data.
pub const ADDRS_FILE: &str = "replica-addrs";

impl LocalCluster {
    /// Starts everything with data under `dir`.
    pub async fn start(dir: &Path, cfg: LocalConfig) -> Result<LocalCluster, String> {
        // A data dir that held a cluster before keeps its replicas'
        // addresses: the stored Raft membership names them, so new ports
        // would never elect a leader.
        let stored = dir.join(ADDRS_FILE);
        let known: Option<Vec<String>> = std::fs::read_to_string(&stored)
            .ok()
            .map(|s| s.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
            .filter(|a: &Vec<String>| a.len() == cfg.replicas as usize);
        if known.is_none() && dir.join("replica-1").exists() {
            return Err(format!(
                "{} holds a cluster whose replica addresses are not recorded in {ADDRS_FILE}; use a new data dir",
                dir.display()
            ));
        }
        let mut listeners = Vec::new();
        for i in 0..cfg.replicas as usize {
            let addr = known.as_ref().map_or("127.0.0.1:0", |a| a[i].as_str());
            listeners.push(listener(addr).map_err(|e| match &known {
                Some(_) => format!(
                    "cannot bind {addr}, where replica {} of the cluster in {} listens: {e}",
                    i + 1,
                    dir.display()
                ),
                None => format!("cannot bind a loopback port: {e}"),
            })?);
        }
        let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().expect("bound").to_string()).collect();
        if known.is_none() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            std::fs::write(&stored, addrs.join("\n") + "\n")
                .map_err(|e| format!("cannot record the replica addresses in {}: {e}", stored.display()))?;
        }
        let mut tls = BTreeMap::new();
        if !cfg.insecure {
            let tls_dir = cfg.tls_dir.clone().unwrap_or_else(|| dir.join("tls"));
            let roles: Vec<muster_tls::Role> = (1..=u64::from(cfg.replicas))
                .map(muster_tls::Role::Server)
                .chain((1..=cfg.agents).map(|i| muster_tls::Role::Agent(format!("node-{i}"))))
                .chain([muster_tls::Role::Admin(DEV_ADMIN.to_string())])
                .collect();
            let materials =
                ensure_certs(&tls_dir, &roles).map_err(|e| format!("TLS set-up in {}: {e}", tls_dir.display()))?;
            tls = roles.into_iter().zip(materials).collect();
        }
        let mut c = LocalCluster { dir: dir.to_path_buf(), cfg, replicas: Vec::new(), addrs, agents: Vec::new(), tls };
        for (i, l) in listeners.into_iter().enumerate() {
            let r = Replica::start(c.replica_config(i as u64 + 1), l).await.map_err(|e| e.to_string())?;
            c.replicas.push(Some(r));
        }
        if c.cfg.http_port.is_some() {
            // The agents share this process's recorder.
            muster_agent::describe_metrics();
        }
        c.admit_agents().await?;
        for i in 0..c.cfg.agents {
            let a = c.spawn_agent(i);
            c.agents.push(Some(a));
        }
        Ok(c)
    }

    /// What agent `i` is configured with: every label, the reserved ones
    /// (`muster.vcluster`, …) included, which an admin sets.
    fn agent_labels(&self, i: u32) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([("gpu.model".to_string(), "fake".to_string())]);
        if let Some(more) = self.cfg.node_labels.get(i as usize) {
            labels.extend(more.clone());
        }
        if let Some(vc) = self.cfg.node_vclusters.get(i as usize).filter(|v| !v.is_empty()) {
            labels.insert(muster_core::sm::VCLUSTER_LABEL.to_string(), vc.clone());
        }
        labels
    }

    fn agent_resources(&self) -> v1::Resources {
        v1::Resources {
            gpus: self.cfg.gpus_per_agent,
            vram_mb: 80_000,
            mem_mb: self.cfg.mem_mb_per_agent,
            cpus: self.cfg.cpus_per_agent,
        }
    }

    /// As an admin would: admits each agent for what it will report, and
    /// sets its reserved labels (which no agent may report) as admin labels.
    async fn admit_agents(&self) -> Result<(), String> {
        use muster_proto::v1::node_service_client::NodeServiceClient;
        for i in 0..self.cfg.agents {
            let id = format!("node-{}", i + 1);
            let (reported, admin): (BTreeMap<_, _>, BTreeMap<_, _>) =
                self.agent_labels(i).into_iter().partition(|(k, _)| muster_core::sm::agent_may_set(k));
            let admit = v1::AdmitNodeRequest {
                id: id.clone(),
                admission: Some(v1::NodeAdmission {
                    resources: Some(self.agent_resources()),
                    labels: reported.into_iter().collect(),
                    ..Default::default()
                }),
                revoke: false,
            };
            let label = v1::LabelNodeRequest { id: id.clone(), set: admin.into_iter().collect(), remove: Vec::new() };
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let mut c = NodeServiceClient::new(self.leader_channel().await);
                let done = match c.admit_node(admit.clone()).await {
                    Ok(_) if label.set.is_empty() => Ok(()),
                    Ok(_) => c.label_node(label.clone()).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                match done {
                    Ok(()) => break,
                    // A leader change midway: ask the next one.
                    Err(e) if e.code() == tonic::Code::Unavailable && std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(format!("admitting {id}: {}", e.message())),
                }
            }
        }
        Ok(())
    }

    fn replica_config(&self, id: u64) -> ReplicaConfig {
        let mut rc =
            ReplicaConfig::new(id, self.addrs[id as usize - 1].clone(), self.dir.join(format!("replica-{id}")));
        rc.initial_members = self.addrs.iter().enumerate().map(|(i, a)| (i as u64 + 1, a.clone())).collect();
        rc.hub.heartbeat_interval = self.cfg.heartbeat;
        rc.hub.stop_grace = self.cfg.stop_grace;
        rc.hub.node_lost_after = self.cfg.node_lost_after;
        rc.teardown_force_after = self.cfg.teardown_force_after;
        rc.preemption = self.cfg.preemption;
        rc.reclaim = self.cfg.reclaim;
        rc.admission_interval = Duration::from_secs(1);
        rc.admission.note_waits = self.cfg.note_waits;
        rc.tls = self.tls.get(&muster_tls::Role::Server(id)).cloned();
        rc.http = self.cfg.http_port.map(|p| {
            let port = if p == 0 { 0 } else { p.saturating_add(id as u16 - 1) };
            std::net::SocketAddr::from(([127, 0, 0, 1], port))
        });
        rc.http_options.rate_per_s = self.cfg.http_rate;
        rc.hub.admission_required = self.cfg.admission_required;
        // The replicas resolve image tags with what the agents pull with.
        if let Some(images) = &self.cfg.images {
            rc.registry = Some(images.registry.clone());
        }
        rc
    }

    /// Each running replica's HTTP listener (`http://ADDR/ui`), by id.
    pub fn http_addrs(&self) -> Vec<(u64, std::net::SocketAddr)> {
        self.replicas.iter().flatten().filter_map(|r| Some((r.id(), r.http_addr()?))).collect()
    }

    /// The TLS dir (`None` when insecure).
    pub fn tls_dir(&self) -> Option<PathBuf> {
        (!self.cfg.insecure).then(|| self.cfg.tls_dir.clone().unwrap_or_else(|| self.dir.join("tls")))
    }

    /// The operator's material (`admin-dev`), for clients of this cluster.
    pub fn admin_tls(&self) -> Option<muster_tls::TlsMaterial> {
        self.tls.get(&muster_tls::Role::Admin(DEV_ADMIN.to_string())).cloned()
    }

    /// Agent `node_id`'s cgroup subtree when the cluster contains its
    /// tasks; without cgroups here, tasks run as bare process groups (and
    /// the node says so in its `muster.isolation` label).
    fn isolation(&self, node_id: &str) -> Option<std::sync::Arc<muster_agent::cgroup::Isolation>> {
        if !self.cfg.isolation {
            return None;
        }
        let name = muster_agent::cgroup::default_name(node_id, &self.dir.join(node_id));
        // An OCI runtime names one cgroup path for every hierarchy: the
        // same absolute subtree in each (the agents' own cgroups may
        // differ between v1 controllers).
        let oci = self.cfg.images.as_ref().is_some_and(|i| i.oci.is_some());
        let opts =
            muster_agent::cgroup::Options { root: oci.then(|| format!("/muster/{name}")), name, ..Default::default() };
        match muster_agent::cgroup::Isolation::detect(&opts) {
            Ok(iso) => Some(std::sync::Arc::new(iso)),
            Err(e) => {
                tracing::warn!(node = node_id, error = %e, "tasks run without isolation");
                None
            }
        }
    }

    /// Agent `node_id`'s image runtime, its cache in its work dir.
    fn images(&self, node_id: &str) -> Option<muster_agent::agent::ImageRuntime> {
        let cfg = self.cfg.images.as_ref()?;
        let registry = match muster_registry::Registry::new(&cfg.registry) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(node = node_id, error = %e, "no registry client: the node runs no images");
                return None;
            }
        };
        let dir = self.dir.join(node_id).join("images");
        let policy = muster_registry::UnpackPolicy::default();
        match muster_registry::ImageCache::open(&dir, cfg.cache_max_bytes, policy, registry) {
            Ok(cache) => Some(muster_agent::agent::ImageRuntime {
                cache,
                allow_mounts: cfg.allow_mounts.clone(),
                oci: cfg.oci.clone(),
                nvidia: muster_agent::nvidia::find(),
            }),
            Err(e) => {
                tracing::warn!(node = node_id, error = %e, "no image cache: the node runs no images");
                None
            }
        }
    }

    fn spawn_agent(&self, i: u32) -> AgentHandle {
        let node_id = format!("node-{}", i + 1);
        let cfg = AgentConfig {
            node_id: node_id.clone(),
            schedulers: self.addrs.clone(),
            resources: self.agent_resources(),
            labels: self.agent_labels(i).into_iter().filter(|(k, _)| muster_core::sm::agent_may_set(k)).collect(),
            address: format!("127.0.0.1:{}", 29_500 + i),
            ports: self.cfg.agent_ports(i),
            work_dir: self.dir.join(&node_id),
            backoff: (Duration::from_millis(100), Duration::from_secs(2)),
            watchdog: self.cfg.watchdog,
            sampler: if self.cfg.sim.is_some() {
                muster_agent::agent::null_sampler
            } else {
                muster_agent::agent::proc_sampler
            },
            exit_when_stopped: false,
            task_shim: None,
            tls: self.tls.get(&muster_tls::Role::Agent(node_id.clone())).cloned(),
            clock: Default::default(),
            janitor: Default::default(),
            fence: true,
            forget_leftovers: false,
            disk_fault_file: None,
            start_without_record: false,
            checkpoint_listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            checkpoint_address: String::new(),
            isolation: if self.cfg.sim.is_some() { None } else { self.isolation(&node_id) },
            run_as: self.cfg.run_as.clone(),
            exe: self.cfg.exe.clone(),
            images: if self.cfg.sim.is_some() { None } else { self.images(&node_id) },
            executor: self.cfg.sim.map(|sim| {
                std::sync::Arc::new(muster_agent::executor::sim::SimExecutor::new(sim, &node_id))
                    as std::sync::Arc<dyn muster_agent::executor::Executor>
            }),
        };
        let (stop, stopped) = watch::channel(false);
        let agent = Agent::new(cfg).expect("agent work dir");
        let task = tokio::spawn(agent.run(stopped));
        AgentHandle { node_id, stop, task }
    }

    /// The replicas' addresses.
    pub fn scheduler_addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The agents' node ids.
    pub fn node_ids(&self) -> Vec<String> {
        (0..self.cfg.agents).map(|i| format!("node-{}", i + 1)).collect()
    }

    /// Where agent `i` keeps its logs.
    pub fn agent_dir(&self, i: u32) -> PathBuf {
        self.dir.join(format!("node-{}", i + 1))
    }

    /// A running replica by id.
    pub fn replica(&self, id: u64) -> Option<&Replica> {
        self.replicas.get(id as usize - 1).and_then(|r| r.as_ref())
    }

    /// The id of the replica that currently leads, if any says so.
    pub fn leader_id(&self) -> Option<u64> {
        self.replicas.iter().flatten().find(|r| r.status().role == "leader").map(|r| r.id())
    }

    /// A channel to the replica that leads, as the operator (`admin-dev`
    /// unless insecure); waits until one leads and accepts the connection.
    pub async fn leader_channel(&self) -> tonic::transport::Channel {
        loop {
            if let Some(id) = self.leader_id()
                && let Ok(ep) = muster_tls::endpoint(&self.addrs[id as usize - 1], self.admin_tls().as_ref())
                && let Ok(ch) = ep.connect().await
            {
                return ch;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills agent `i` abruptly: its stream drops, its processes keep running.
    pub fn kill_agent(&mut self, i: u32) {
        if let Some(a) = self.agents[i as usize].take() {
            a.task.abort();
        }
    }

    /// Starts agent `i` again (same node id and work dir).
    pub fn restart_agent(&mut self, i: u32) {
        self.kill_agent(i);
        let a = self.spawn_agent(i);
        self.agents[i as usize] = Some(a);
    }

    /// Stops replica `id` (its data dir stays).
    pub async fn stop_replica(&mut self, id: u64) {
        if let Some(r) = self.replicas[id as usize - 1].take() {
            r.shutdown().await;
        }
    }

    /// Starts replica `id` again from its data dir, on its old address.
    pub async fn restart_replica(&mut self, id: u64) -> Result<(), String> {
        self.stop_replica(id).await;
        let l = relisten(&self.addrs[id as usize - 1]).await.map_err(|e| e.to_string())?;
        let r = Replica::start(self.replica_config(id), l).await.map_err(|e| e.to_string())?;
        self.replicas[id as usize - 1] = Some(r);
        Ok(())
    }

    /// Stops the agents (their tasks get the grace) and the replicas.
    pub async fn shutdown(mut self) {
        for a in self.agents.iter_mut().filter_map(Option::take) {
            let _ = a.stop.send(true);
            let _ = a.task.await;
            tracing::debug!(node = %a.node_id, "agent stopped");
        }
        // They go one by one: the last ones must not warn that the first
        // went away.
        for r in self.replicas.iter().flatten() {
            r.expect_peers_to_stop();
        }
        // All at once: a replica whose server waits for its peers' streams
        // to close must not wait on a peer that has not begun to stop.
        let mut stopping = tokio::task::JoinSet::new();
        for r in self.replicas.iter_mut().filter_map(Option::take) {
            stopping.spawn(r.shutdown());
        }
        while stopping.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica restarted while its port is held by another socket gets it
    /// once that socket lets go, rather than failing on the first refusal.
    #[tokio::test]
    async fn a_replica_port_held_by_another_socket_is_listened_on_once_it_is_free() {
        let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = blocker.local_addr().unwrap().to_string();
        let refused = listener(&addr).expect_err("the port is held");
        assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
        // The first attempt happens in the first poll, while the blocker
        // still holds the port; it lets go a second later.
        let (listened, ()) = tokio::join!(relisten(&addr), async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(blocker);
        });
        assert_eq!(listened.expect("listening once the port is free").local_addr().unwrap().to_string(), addr);
    }
}
