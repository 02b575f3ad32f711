//! Replication benchmark: three real `muster server` processes on loopback
//! (real fsync), committed submissions per second with 1, 16 and 256
//! concurrent clients, commit latency percentiles, and the time from
//! `kill -9` of the leader to the first commit by its successor.
//!
//! After each level it prints where a commit's time went on the leader and
//! a follower (means from their `/metrics`): log sync, apply, proposal to
//! applied, and commands per entry.
//!
//! Run: `cargo bench -p muster --bench cluster` (builds the release binary).
//! Options after `--`: `--seconds N` per concurrency level (default 5),
//! `--kills N` failover rounds (default 3), `--agents N` real `muster
//! agent` processes running one long gang through the kills (default 8;
//! each kill also reports when all of them stream to the new leader, and
//! the end says whether any task restarted), `--heartbeat-ms N` (the
//! servers' Raft heartbeat; their default otherwise), `--tls` (mutual TLS
//! between replicas, agents and the clients, and a bare tonic server timed
//! with TLS as well as without; the default is `--insecure`).
//! `MUSTER_BENCH_KEEP=1` keeps the servers' data dirs and logs (`err-N.log`,
//! one per replica across its restarts) and prints where.
//!
//! A figure means something only as a ratio against a peer measured in the
//! same run on the same machine: `cli/benches/vs-etcd.sh` alternates this
//! bench with etcd's and prints the ratios (`--tls-ab`: this bench with and
//! without TLS in every round, and TLS's cost pair by pair).

mod common;

use common::free_port;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_tls::{Role, TlsMaterial};
use tonic::transport::Channel;

struct Servers {
    addrs: Vec<String>,
    /// The certificates (`--tls`), or `None` for `--insecure`.
    tls: Option<std::path::PathBuf>,
    /// The bench's own client certificate (`--tls`).
    client: Option<TlsMaterial>,
    /// `--heartbeat-ms` for the servers (their default when `None`).
    heartbeat_ms: Option<u64>,
    /// Each replica's `/metrics` address.
    http: Vec<String>,
    children: Vec<Option<Child>>,
    dir: std::path::PathBuf,
}

impl Servers {
    fn start(dir: &Path, tls: bool, heartbeat_ms: Option<u64>) -> Servers {
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let http = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let certs = dir.join("tls");
        let client = tls.then(|| {
            let roles: Vec<Role> = (1..=3)
                .map(Role::Server)
                .chain((0..MAX_AGENTS).map(|i| Role::Agent(format!("bench-{i}"))))
                .chain([Role::Admin("bench".into())])
                .collect();
            muster_local::ensure_certs(&certs, &roles).expect("issue the bench's certificates").pop().unwrap()
        });
        let tls = tls.then_some(certs);
        let mut s = Servers {
            addrs,
            tls,
            client,
            heartbeat_ms,
            http,
            children: vec![None, None, None],
            dir: dir.to_path_buf(),
        };
        for id in 1..=3 {
            s.spawn(id);
        }
        s
    }

    fn spawn(&mut self, id: usize) {
        let peers: Vec<String> = self.addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
        cmd.arg("server");
        match &self.tls {
            Some(dir) => cmd.env("MUSTER_TLS_DIR", dir),
            None => cmd.arg("--insecure"),
        };
        let child = cmd
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                &self.addrs[id - 1],
                "--peers",
                &peers.join(","),
                "--http",
                &self.http[id - 1],
            ])
            .args(self.heartbeat_ms.map(|h| vec!["--heartbeat-ms".to_string(), h.to_string()]).unwrap_or_default())
            .arg("--data-dir")
            .arg(self.dir.join(format!("data-{id}")))
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join(format!("err-{id}.log")))
                    .map(Stdio::from)
                    .unwrap_or(Stdio::null()),
            )
            .spawn()
            .expect("spawn muster server");
        self.children[id - 1] = Some(child);
    }

    fn kill(&mut self, id: usize) {
        if let Some(mut c) = self.children[id - 1].take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Starts `muster agent` `bench-i` (one fake GPU) against the replicas.
    fn agent(&self, i: usize) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
        cmd.args(["agent", "--allow-root-tasks"]);
        match &self.tls {
            Some(dir) => cmd.env("MUSTER_TLS_DIR", dir),
            None => cmd.arg("--insecure"),
        };
        cmd.args(["--scheduler", &self.addrs.join(","), "--node-id", &format!("bench-{i}")])
            .args(["--gpus", "1", "--vram-mb", "1000", "--mem-mb", "1000", "--cpus", "1"])
            .arg("--work-dir")
            .arg(self.dir.join(format!("agent-{i}")))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.join(format!("agent-{i}.log")))
                    .map(Stdio::from)
                    .unwrap_or(Stdio::null()),
            )
            .spawn()
            .expect("spawn muster agent")
    }
}

/// The most agents `--agents` may start (certificates are issued for them).
const MAX_AGENTS: usize = 64;

/// How many agent streams the replica whose `/metrics` is at `http` holds.
fn agent_streams(http: &str) -> usize {
    common::metrics(http)
        .lines()
        .find_map(|l| l.strip_prefix("muster_agent_streams "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}

/// Each task of allocation `id`: whether it runs, and how many attempts it
/// has started.
async fn runs(servers: &Servers, id: u64) -> Vec<(bool, u32)> {
    let l = leader(&servers.addrs, servers.client.as_ref(), None).await;
    let ch = channel(&servers.addrs[l - 1], servers.client.as_ref()).await.expect("the leader answers");
    let a = AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await.expect("get the gang").into_inner();
    a.tasks.iter().map(|t| (t.status == v1::TaskStatus::Running as i32, t.runs)).collect()
}

/// Starts `n` agents and runs a gang of `n` long tasks on them, one per
/// node; returns the agents and the gang's id once every task runs.
async fn agents_with_a_gang(servers: &Servers, n: usize) -> (Vec<Child>, u64) {
    let agents: Vec<Child> = (0..n).map(|i| servers.agent(i)).collect();
    let l = leader(&servers.addrs, servers.client.as_ref(), None).await;
    while agent_streams(&servers.http[l - 1]) < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ch = channel(&servers.addrs[l - 1], servers.client.as_ref()).await.expect("the leader answers");
    let gang = v1::AllocationSpec {
        gang_size: n as u32,
        command: vec!["sleep".into(), "3600".into()],
        ..spec("agents-gang".into())
    };
    let id = AllocationServiceClient::new(ch)
        .submit(v1::SubmitRequest { spec: Some(gang), dry_run: false, ..Default::default() })
        .await
        .expect("submit the agents' gang")
        .into_inner()
        .id;
    while !runs(servers, id).await.iter().all(|(running, _)| *running) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (agents, id)
}

impl Drop for Servers {
    fn drop(&mut self) {
        for id in 1..=3 {
            self.kill(id);
        }
    }
}

async fn channel(addr: &str, tls: Option<&TlsMaterial>) -> Option<Channel> {
    muster_tls::endpoint(addr, tls)
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect()
        .await
        .ok()
}

async fn leader(addrs: &[String], tls: Option<&TlsMaterial>, not: Option<usize>) -> usize {
    loop {
        for (i, a) in addrs.iter().enumerate() {
            if Some(i + 1) == not {
                continue;
            }
            if let Some(ch) = channel(a, tls).await
                && let Ok(s) = AdminServiceClient::new(ch).status(v1::StatusRequest {}).await
                && s.get_ref().role == "leader"
            {
                return i + 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spec(key: String) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "bench".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["true".into()],
        idempotency_key: key,
        ..Default::default()
    }
}

/// Sums and counts of the commit path's histograms on one replica.
#[derive(Clone, Copy, Default)]
struct CommitPath {
    sync: (f64, f64),
    commit: (f64, f64),
    apply: (f64, f64),
    batch: (f64, f64),
    admission: (f64, f64),
    /// An AppendEntries call with entries, as its sender timed it.
    append_rpc: (f64, f64),
    /// The same call, as the follower serving it timed it.
    append_serve: (f64, f64),
}

impl CommitPath {
    /// Scrapes `/metrics` at `addr` (plain HTTP/1.0).
    fn scrape(addr: &str) -> CommitPath {
        let text = common::metrics(addr);
        let get = |name: &str| -> (f64, f64) {
            let value = |suffix: &str| {
                text.lines()
                    .find(|l| l.starts_with(&format!("{name}{suffix} ")) || l.starts_with(&format!("{name}{suffix}{{")))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            (value("_sum"), value("_count"))
        };
        CommitPath {
            sync: get("muster_raft_log_sync_seconds"),
            commit: get("muster_raft_commit_seconds"),
            apply: get("muster_raft_apply_seconds"),
            batch: get("muster_raft_batch_commands"),
            admission: get("muster_admission_pass_seconds"),
            append_rpc: get("muster_raft_append_rpc_seconds"),
            append_serve: get("muster_raft_append_serve_seconds"),
        }
    }

    /// Mean per sample between two scrapes, in ms (or commands for `batch`).
    fn mean(after: (f64, f64), before: (f64, f64), scale: f64) -> f64 {
        let n = after.1 - before.1;
        if n <= 0.0 { 0.0 } else { (after.0 - before.0) / n * scale }
    }
}

/// The leader's and one follower's mean commit-path times between two
/// scrapes: where a commit's time goes.
fn breakdown(leader: (CommitPath, CommitPath), follower: (CommitPath, CommitPath)) -> String {
    let (la, lb) = leader;
    let (fa, fb) = follower;
    format!(
        "        commit path (means): leader log sync {:.3} ms, follower log sync {:.3} ms, \
         append to a follower {:.3} ms (of which the follower's handling {:.3} ms), apply {:.3} ms, \
         proposal->applied {:.3} ms, {:.1} commands/entry; {:.0} admission passes of {:.1} ms",
        CommitPath::mean(la.sync, lb.sync, 1e3),
        CommitPath::mean(fa.sync, fb.sync, 1e3),
        CommitPath::mean(la.append_rpc, lb.append_rpc, 1e3),
        CommitPath::mean(fa.append_serve, fb.append_serve, 1e3),
        CommitPath::mean(la.apply, lb.apply, 1e3),
        CommitPath::mean(la.commit, lb.commit, 1e3),
        CommitPath::mean(la.batch, lb.batch, 1.0),
        la.admission.1 - lb.admission.1,
        CommitPath::mean(la.admission, lb.admission, 1e3),
    )
}

/// The connections a level's clients share: a few, many streams each
/// (HTTP/2), like real clients.
async fn channels(addr: &str, tls: Option<&TlsMaterial>, clients: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..clients.clamp(1, 8) {
        channels.push(channel(addr, tls).await.expect("server reachable"));
    }
    channels
}

/// A level's clock: calls started before `start + warmup` are not counted,
/// and none starts after `end`.
struct Level {
    start: Instant,
    warmup: Duration,
    end: Instant,
}

impl Level {
    fn new(seconds: u64) -> Level {
        let (start, warmup) = (Instant::now(), Duration::from_millis(500));
        Level { start, warmup, end: start + warmup + Duration::from_secs(seconds) }
    }
}

async fn load(addr: &str, tls: Option<&TlsMaterial>, clients: usize, seconds: u64, seq: Arc<AtomicU64>) {
    let channels = channels(addr, tls, clients).await;
    let Level { start, warmup, end } = Level::new(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = AllocationServiceClient::new(channels[c % channels.len()].clone());
        let seq = seq.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < end {
                let key = format!("b{}", seq.fetch_add(1, Ordering::Relaxed));
                let t = Instant::now();
                client
                    .submit(v1::SubmitRequest { spec: Some(spec(key)), dry_run: false, ..Default::default() })
                    .await
                    .expect("submit");
                if t > start + warmup {
                    lat.push(t.elapsed());
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    if all.is_empty() {
        println!("{clients:>4} clients: no submit started after the warm-up was answered within the level");
        return;
    }
    println!(
        "{clients:>4} clients: {:>8.0} committed submits/s   p50 {:>7.2} ms   p99 {:>7.2} ms   ({} submits)",
        all.len() as f64 / seconds as f64,
        common::pct(&all, 0.50).as_secs_f64() * 1e3,
        common::pct(&all, 0.99).as_secs_f64() * 1e3,
        all.len()
    );
}

/// The client's share of a commit: `n` sequential resubmits of one
/// idempotency key to the leader, each answered from its state as a
/// duplicate (the same call and handler as a commit, without Raft); p50
/// and p99.
async fn bare_calls(addr: &str, tls: Option<&TlsMaterial>, n: usize) -> (Duration, Duration) {
    let mut client = AllocationServiceClient::new(channel(addr, tls).await.expect("leader reachable"));
    let submit = || v1::SubmitRequest { spec: Some(spec("bare-call".into())), dry_run: false, ..Default::default() };
    client.submit(submit()).await.expect("submit");
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let reply = client.submit(submit()).await.expect("resubmit");
        lat.push(t.elapsed());
        assert!(reply.get_ref().duplicate, "a resubmit is answered as a duplicate");
    }
    lat.sort();
    (common::pct(&lat, 0.50), common::pct(&lat, 0.99))
}

/// The transport's and the server layers' share: `n` sequential gRPC
/// health checks of the leader (the same connection, TLS, auth and
/// timeout layers as a submit; a handler that only reads a map). p50 and
/// p99.
async fn health_calls(addr: &str, tls: Option<&TlsMaterial>, n: usize) -> (Duration, Duration) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let mut client = HealthClient::new(channel(addr, tls).await.expect("leader reachable"));
    let check = || HealthCheckRequest { service: String::new() };
    client.check(check()).await.expect("health check");
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.check(check()).await.expect("health check");
        lat.push(t.elapsed());
    }
    lat.sort();
    (common::pct(&lat, 0.50), common::pct(&lat, 0.99))
}

/// One line of a level's report: what was timed, and its p50 and p99.
fn print_p50_p99(what: &str, (p50, p99): (Duration, Duration)) {
    println!("        {what}: p50 {:.3} ms, p99 {:.3} ms", p50.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3);
}

/// `--bare-health-server [--tls-dir DIR]`: tonic's own floor on this
/// machine. Serves only gRPC health, over HTTP/2 with `TCP_NODELAY` and
/// none of a replica's layers (auth, timeouts, connection limits), on a
/// loopback port it prints, until it is killed. With `--tls-dir` it
/// speaks mutual TLS with replica 1's certificate from DIR, as a replica
/// does: what TLS costs a call without anything of Muster's.
fn bare_health_server(tls_dir: Option<String>) {
    let tls = tls_dir.map(|d| TlsMaterial::load(Path::new(&d), &Role::Server(1)).expect("replica 1's certificate"));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let incoming = tonic::transport::server::TcpIncoming::bind(([127, 0, 0, 1], 0).into())
            .expect("bind a loopback port")
            .with_nodelay(Some(true));
        println!("{}", incoming.local_addr().expect("bound").port());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let mut builder = tonic::transport::Server::builder();
        if let Some(m) = &tls {
            builder = builder.tls_config(m.server_config()).expect("a server TLS configuration");
        }
        builder.add_service(health).serve_with_incoming(incoming).await.expect("serve");
    });
}

/// [`bare_health_server`] in a process of its own, killed when dropped:
/// what a gRPC call costs here without anything of Muster's.
struct BareTonic {
    child: Child,
    addr: String,
}

impl BareTonic {
    /// Plain HTTP/2, or mutual TLS with the certificates in `tls_dir`.
    fn start(tls_dir: Option<&Path>) -> BareTonic {
        use std::io::BufRead;
        let mut cmd = Command::new(std::env::current_exe().expect("this bench's path"));
        cmd.arg("--bare-health-server");
        if let Some(d) = tls_dir {
            cmd.arg("--tls-dir").arg(d);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start the bare tonic server");
        let mut port = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut port).expect("its port");
        BareTonic { child, addr: format!("127.0.0.1:{}", port.trim()) }
    }
}

impl Drop for BareTonic {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Health checks per second from `clients` concurrent callers for
/// `seconds`, over the same channels as [`load`]'s submits.
async fn health_load(addr: &str, tls: Option<&TlsMaterial>, clients: usize, seconds: u64) -> f64 {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channels = channels(addr, tls, clients).await;
    let Level { start, warmup, end } = Level::new(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = HealthClient::new(channels[c % channels.len()].clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let t = Instant::now();
                client.check(HealthCheckRequest { service: String::new() }).await.expect("health check");
                n += u64::from(t > start + warmup);
            }
            n
        }));
    }
    let mut calls = 0;
    for t in tasks {
        calls += t.await.unwrap();
    }
    calls as f64 / seconds as f64
}

/// Kills the leader; returns when the kill happened, how long until its
/// successor committed a submit, and the successor.
async fn failover(servers: &mut Servers, seq: Arc<AtomicU64>) -> (Instant, Duration, usize) {
    let old = leader(&servers.addrs, servers.client.as_ref(), None).await;
    // Keep the cluster busy up to the kill.
    let kill_at = Instant::now();
    servers.kill(old);
    loop {
        for (i, a) in servers.addrs.iter().enumerate() {
            if i + 1 == old {
                continue;
            }
            if let Some(ch) = channel(a, servers.client.as_ref()).await {
                let mut req = tonic::Request::new(v1::SubmitRequest {
                    spec: Some(spec(format!("f{}", seq.fetch_add(1, Ordering::Relaxed)))),
                    dry_run: false,
                    ..Default::default()
                });
                req.set_timeout(Duration::from_millis(500));
                if AllocationServiceClient::new(ch).submit(req).await.is_ok() {
                    let took = kill_at.elapsed();
                    servers.spawn(old);
                    return (kill_at, took, i + 1);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bare-health-server") {
        let tls_dir = args.iter().position(|a| a == "--tls-dir").and_then(|i| args.get(i + 1)).cloned();
        return bare_health_server(tls_dir);
    }
    let seconds = common::opt("--seconds", 5);
    let kills = common::opt("--kills", 3);
    let n_agents = (common::opt("--agents", 8) as usize).min(MAX_AGENTS);
    let tls = args.iter().any(|a| a == "--tls");
    let heartbeat_ms = args.iter().any(|a| a == "--heartbeat-ms").then(|| common::opt("--heartbeat-ms", 50));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // MUSTER_BENCH_KEEP=1 keeps the servers' data dirs and logs.
        let keep = std::env::var_os("MUSTER_BENCH_KEEP").is_some();
        let dir = tempfile::Builder::new().disable_cleanup(keep).tempdir().unwrap();
        if keep {
            println!("the servers' data and logs stay in {}", dir.path().display());
        }
        let (floor50, floor99) = common::sync_floor(dir.path(), 1_000);
        let mut servers = Servers::start(dir.path(), tls, heartbeat_ms);
        let l = leader(&servers.addrs, servers.client.as_ref(), None).await;
        println!(
            "3 replicas on loopback, fsync on every append, {}; leader is replica {l}",
            if tls { "mutual TLS" } else { "--insecure" }
        );
        println!(
            "this disk: fdatasync of an appended 400-byte block p50 {:.3} ms, p99 {:.3} ms (1,000 before the servers \
             start)",
            floor50.as_secs_f64() * 1e3,
            floor99.as_secs_f64() * 1e3
        );
        println!("(a figure counts only as a ratio against a peer measured in the same run on this machine)");
        let seq = Arc::new(AtomicU64::new(0));
        for clients in [1, 16, 256] {
            let l = leader(&servers.addrs, servers.client.as_ref(), None).await;
            let f = if l == 1 { 2 } else { 1 };
            let before = (CommitPath::scrape(&servers.http[l - 1]), CommitPath::scrape(&servers.http[f - 1]));
            load(&servers.addrs[l - 1], servers.client.as_ref(), clients, seconds, seq.clone()).await;
            let after = (CommitPath::scrape(&servers.http[l - 1]), CommitPath::scrape(&servers.http[f - 1]));
            println!("{}", breakdown((after.0, before.0), (after.1, before.1)));
            if clients == 1 {
                let (leader, client) = (&servers.addrs[l - 1], servers.client.as_ref());
                print_p50_p99(
                    "the same call answered without Raft (a resubmit)",
                    bare_calls(leader, client, 2_000).await,
                );
                print_p50_p99(
                    "a gRPC health check of the leader (transport and server layers)",
                    health_calls(leader, client, 2_000).await,
                );
                let mut bares = vec![(None, None, "(plain HTTP/2, no layers, its own process)")];
                if let Some(dir) = &servers.tls {
                    bares.push((Some(dir.as_path()), client, "with mutual TLS (no layers, its own process)"));
                }
                for (dir, client, how) in bares {
                    let bare = BareTonic::start(dir);
                    print_p50_p99(
                        &format!("the same check of a bare tonic server {how}"),
                        health_calls(&bare.addr, client, 2_000).await,
                    );
                }
            }
            if clients == 256 {
                // The ceiling the transport sets: calls that do no work.
                let on_leader = health_load(&servers.addrs[l - 1], servers.client.as_ref(), clients, seconds).await;
                let bare = BareTonic::start(None);
                let on_bare = health_load(&bare.addr, None, clients, seconds).await;
                drop(bare);
                println!(
                    "        {clients} clients of gRPC health checks instead, no Raft: {on_leader:.0}/s from the leader, \
                     {on_bare:.0}/s from a bare tonic server (the transport's ceiling on this machine)"
                );
                if let Some(dir) = &servers.tls {
                    let bare = BareTonic::start(Some(dir));
                    let on_bare = health_load(&bare.addr, servers.client.as_ref(), clients, seconds).await;
                    println!("        the same from a bare tonic server with mutual TLS: {on_bare:.0}/s");
                }
            }
        }
        if kills == 0 {
            return;
        }
        let (mut agents, gang) =
            if n_agents > 0 { agents_with_a_gang(&servers, n_agents).await } else { (Vec::new(), 0) };
        let (mut times, mut back) = (Vec::new(), Vec::new());
        for _ in 0..kills {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (kill_at, t, new) = failover(&mut servers, seq.clone()).await;
            while agent_streams(&servers.http[new - 1]) < n_agents {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let all_back = kill_at.elapsed();
            println!(
                "kill -9 leader -> first commit by the new leader: {:>6.0} ms; all {n_agents} agents on it: {:>6.0} ms",
                t.as_secs_f64() * 1e3,
                all_back.as_secs_f64() * 1e3
            );
            times.push(t);
            back.push(all_back);
        }
        times.sort();
        back.sort();
        println!(
            "failover: median {:.0} ms, worst {:.0} ms; agents back: median {:.0} ms, worst {:.0} ms",
            common::pct(&times, 0.5).as_secs_f64() * 1e3,
            times.last().unwrap().as_secs_f64() * 1e3,
            common::pct(&back, 0.5).as_secs_f64() * 1e3,
            back.last().unwrap().as_secs_f64() * 1e3
        );
        if n_agents > 0 {
            let tasks = runs(&servers, gang).await;
            let restarted = tasks.iter().filter(|(running, runs)| !running || *runs != 1).count();
            println!("the agents' gang after {kills} kills: {restarted} of {n_agents} tasks restarted or stopped");
            for a in &mut agents {
                let _ = a.kill();
                let _ = a.wait();
            }
        }
    });
}
