//! Mutual TLS and roles against a real `muster server`: every call a role
//! may not make is refused with the right status, and nothing changes in
//! the state.

use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::agent_message::Msg as Up;
use muster_proto::v1::agent_service_client::AgentServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_proto::v1::node_service_client::NodeServiceClient;
use muster_proto::v1::raft_service_client::RaftServiceClient;
use muster_proto::v1::scheduler_message::Msg as Down;
use muster_tls::{Role, TlsMaterial, Validity};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

use crate::cluster::{WAIT, channel, channel_as, free_port};
use crate::tls;

/// One `muster server` over mutual TLS.
pub(crate) struct Server {
    pub(crate) addr: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Server {
    pub(crate) async fn start() -> Server {
        Server::start_with(&[]).await
    }

    /// With these extra flags; nodes register unadmitted (`--node-admission
    /// open`) unless `extra` says otherwise.
    pub(crate) async fn start_with(extra: &[&str]) -> Server {
        let mut flags: Vec<&str> = extra.to_vec();
        if !flags.contains(&"--node-admission") {
            flags.extend(["--node-admission", "open"]);
        }
        let extra = flags.as_slice();
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["server", "--id", "1", "--listen", &addr, "--peers", &format!("1={addr}")])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(extra)
            .env("MUSTER_TLS_DIR", tls::dir())
            .env("RUST_LOG", "debug")
            .stderr(std::fs::File::create(dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap();
        let s = Server { addr, child, _dir: dir };
        muster_testkit::eventually_async("the server to lead", WAIT, || async {
            s.status().await.is_some_and(|st| st.role == "leader").then_some(())
        })
        .await;
        s
    }

    /// What it logged so far (at debug).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default()
    }

    pub(crate) async fn status(&self) -> Option<v1::ReplicaStatus> {
        let ch = channel(&self.addr).await?;
        AdminServiceClient::new(ch).status(v1::StatusRequest {}).await.ok().map(|r| r.into_inner())
    }

    /// Applied index and digest: what "nothing changed" is checked against.
    pub(crate) async fn state(&self) -> (u64, String) {
        let s = self.status().await.expect("status as admin");
        (s.applied_index, s.state_digest)
    }

    pub(crate) async fn as_role(&self, role: Role) -> Channel {
        channel_as(&self.addr, &tls::material(role)).await.expect("connects")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A one-task, one-GPU allocation of `owner` running `command`.
pub(crate) fn one_gpu(owner: &str, command: &[&str]) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: owner.into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1, mem_mb: 1, cpus: 1 }),
        command: command.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    }
}

pub(crate) fn up(m: Up) -> v1::AgentMessage {
    v1::AgentMessage { msg: Some(m) }
}

pub(crate) fn register(node: &str, gpus: u32) -> v1::AgentMessage {
    up(Up::Register(v1::Register {
        node_id: node.into(),
        resources: Some(v1::Resources { gpus, vram_mb: 80_000, mem_mb: 64_000, cpus: 8 }),
        ports: "29500-29599".into(),
        ..Default::default()
    }))
}

/// An agent stream with `tls`'s certificate that sends `first`.
pub(crate) async fn agent_stream(
    addr: &str,
    tls: &TlsMaterial,
    first: v1::AgentMessage,
) -> Result<(mpsc::Sender<v1::AgentMessage>, tonic::Streaming<v1::SchedulerMessage>), tonic::Status> {
    let ch = channel_as(addr, tls).await.expect("connects");
    let (tx, out) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let mut rx = AgentServiceClient::new(ch).connect(ReceiverStream::new(out)).await?.into_inner();
    match rx.message().await? {
        Some(v1::SchedulerMessage { msg: Some(Down::Registered(_)) }) => Ok((tx, rx)),
        other => panic!("expected Registered, got {other:?}"),
    }
}

pub(crate) async fn next_down(rx: &mut tonic::Streaming<v1::SchedulerMessage>, pick: impl Fn(&Down) -> bool) -> Down {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = tokio::time::timeout(left, rx.message()).await.expect("in time").expect("stream open");
        let d = m.and_then(|m| m.msg).expect("a message");
        if pick(&d) {
            return d;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t110_each_role_is_held_to_its_methods() {
    let s = Server::start().await;
    let before = s.state().await;

    // An agent certificate calling a server-only Raft RPC (Nomad CVE-2021-37218).
    let agent = s.as_role(Role::Agent("gpu-01".into())).await;
    let err = RaftServiceClient::new(agent.clone())
        .append_entries(v1::RaftPayload { data: vec![1, 2, 3] })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("agent gpu-01 may not call /muster.v1.RaftService/AppendEntries"), "{err:?}");
    // Nor may it submit work or read allocations.
    let spec = one_gpu("mallory", &["true"]);
    let submit = |ch: Channel| {
        let spec = spec.clone();
        async move {
            AllocationServiceClient::new(ch)
                .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
                .await
        }
    };
    assert_eq!(submit(agent.clone()).await.unwrap_err().code(), Code::PermissionDenied);

    // A client may submit and read but not run the cluster.
    let client = s.as_role(Role::Client("bob".into())).await;
    let drain = v1::DrainNodeRequest { id: "gpu-01".into(), ..Default::default() };
    let err = NodeServiceClient::new(client.clone()).drain_node(drain.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("admins only"), "{err:?}");
    let err = AdminServiceClient::new(client.clone()).trigger_election(v1::StatusRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // A reader reads and nothing else.
    let reader = s.as_role(Role::Reader("grafana".into())).await;
    assert!(AllocationServiceClient::new(reader.clone()).list(v1::ListRequest::default()).await.is_ok());
    let err = submit(reader.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // An admin may not speak Raft either.
    let admin = s.as_role(Role::Admin("dev".into())).await;
    let err = RaftServiceClient::new(admin).vote(v1::RaftPayload { data: vec![] }).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Admins and clients are not agents.
    let err =
        agent_stream(&s.addr, &tls::material(Role::Client("bob".into())), register("gpu-01", 8)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    assert_eq!(s.state().await, before, "nothing a refused call asked for happened");
    // The client's own work goes through.
    let own = v1::SubmitRequest { spec: Some(one_gpu("", &["true"])), dry_run: false, ..Default::default() };
    let id = AllocationServiceClient::new(client).submit(own).await.unwrap().into_inner().id;
    assert!(id > 0);
}

/// Issue 22, item 9: the owner is the verified identity. A client submits
/// only as itself and cancels only its own allocations; an admin may name
/// any owner; idempotency keys are scoped per owner, so reusing one reveals
/// nothing of another owner's work. Every refusal is made before the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t115_an_owner_is_the_verified_identity() {
    let s = Server::start().await;
    let admin = AllocationServiceClient::new(channel(&s.addr).await.unwrap());
    let bob = AllocationServiceClient::new(s.as_role(Role::Client("bob".into())).await);
    let submit = |mut c: AllocationServiceClient<Channel>, spec: v1::AllocationSpec| async move {
        c.submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
            .await
            .map(|r| r.into_inner())
    };
    let owner_of = |mut c: AllocationServiceClient<Channel>, id: u64| async move {
        c.get(v1::GetRequest { id }).await.unwrap().into_inner().spec.unwrap().owner
    };

    let keyed = |owner: &str, key: &str, cmd: &str| v1::AllocationSpec {
        idempotency_key: key.into(),
        ..one_gpu(owner, &["sh", "-c", cmd])
    };
    let alices = submit(admin.clone(), keyed("alice", "job-1", "sleep 600")).await.unwrap().id;
    assert_eq!(owner_of(admin.clone(), alices).await, "alice", "an admin names any owner");
    let admins = submit(admin.clone(), one_gpu("", &["true"])).await.unwrap().id;
    assert_eq!(owner_of(admin.clone(), admins).await, "dev", "an admin naming nobody is itself");

    let before = s.state().await;
    let err = submit(bob.clone(), one_gpu("alice", &["true"])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("client bob submits as itself, not as \"alice\""), "{err:?}");
    let err = bob.clone().cancel(v1::CancelRequest { id: alices, ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains(&format!("allocation {alices} belongs to alice")), "{err:?}");
    let err = bob.clone().cancel(v1::CancelRequest { id: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = bob.clone().cancel(v1::CancelRequest { id: 999, ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(s.state().await, before, "no refusal reached the log");

    // Bob reuses alice's key: a new allocation of his own, not hers (and
    // not a conflict that would name her allocation).
    let bobs = submit(bob.clone(), keyed("", "job-1", "true")).await.unwrap();
    assert!(!bobs.duplicate && bobs.id != alices, "{bobs:?}");
    assert_eq!(owner_of(admin.clone(), bobs.id).await, "bob");
    // His retry is a duplicate; the same key with another spec is refused
    // before the log.
    let again = submit(bob.clone(), keyed("bob", "job-1", "true")).await.unwrap();
    assert_eq!((again.id, again.duplicate), (bobs.id, true));
    let before = s.state().await;
    let err = submit(bob.clone(), keyed("", "job-1", "false")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert_eq!(s.state().await, before, "refused before the log");

    // Bob cancels his own; the admin cancels anyone's.
    bob.clone().cancel(v1::CancelRequest { id: bobs.id, ..Default::default() }).await.unwrap();
    admin.clone().cancel(v1::CancelRequest { id: alices, ..Default::default() }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t111_an_agent_acts_only_as_its_own_node() {
    let s = Server::start().await;
    let a = tls::material(Role::Agent("sec-a".into()));
    let b = tls::material(Role::Agent("sec-b".into()));

    // A's certificate cannot register as B.
    let before = s.state().await;
    let err = agent_stream(&s.addr, &a, register("sec-b", 8)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("is for node \"sec-a\"; it cannot register as node \"sec-b\""), "{err:?}");
    assert_eq!(s.state().await, before);

    // B runs a task; A (no GPUs) tries to report it finished.
    let (b_tx, mut b_rx) = agent_stream(&s.addr, &b, register("sec-b", 8)).await.unwrap();
    let (a_tx, mut a_rx) = agent_stream(&s.addr, &a, register("sec-a", 0)).await.unwrap();
    let admin = channel(&s.addr).await.unwrap();
    let spec = one_gpu("alice", &["sleep", "600"]);
    let id = AllocationServiceClient::new(admin.clone())
        .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .id;
    let Down::Assign(assign) = next_down(&mut b_rx, |d| matches!(d, Down::Assign(_))).await else { unreachable!() };
    let task = assign.task.unwrap();
    assert_eq!(task.alloc_id, id);
    b_tx.send(up(Up::Claim(v1::Claim { task: Some(task) }))).await.unwrap();
    next_down(&mut b_rx, |d| matches!(d, Down::Granted(_))).await;
    let running = |admin: Channel| async move {
        let a = AllocationServiceClient::new(admin).get(v1::GetRequest { id }).await.unwrap().into_inner();
        a.tasks[0].status
    };
    let before = running(admin.clone()).await;
    let exited = v1::TaskExited { task: Some(task), exit_code: Some(0), ..Default::default() };
    a_tx.send(up(Up::Exited(exited))).await.unwrap();
    let Down::Refused(r) = next_down(&mut a_rx, |d| matches!(d, Down::Refused(_))).await else { unreachable!() };
    assert_eq!(r.task, Some(task), "{r:?}");
    assert_eq!(running(admin).await, before, "B's task still runs");
    drop((a_tx, b_tx));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t112_connections_without_a_valid_certificate_are_refused() {
    let s = Server::start().await;
    let before = s.state().await;
    let ca = std::fs::read_to_string(tls::dir().join("ca.pem")).unwrap();
    let refused = |ch: Option<Channel>| async move {
        match ch {
            None => true,
            Some(ch) => AdminServiceClient::new(ch).status(v1::StatusRequest {}).await.is_err(),
        }
    };

    // Plain HTTP/2 to a TLS port.
    let plain = muster_tls::endpoint(&s.addr, None).unwrap().connect_timeout(Duration::from_secs(5));
    assert!(refused(plain.connect().await.ok()).await, "plaintext was served");

    // TLS without a client certificate.
    let no_cert = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca))
        .domain_name(muster_tls::SERVER_NAME);
    let ep =
        tonic::transport::Endpoint::from_shared(format!("https://{}", s.addr)).unwrap().tls_config(no_cert).unwrap();
    assert!(refused(ep.connect().await.ok()).await, "a client without a certificate was served");

    // An expired admin certificate from the right CA.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(tls::dir().join("ca.pem"), other.path().join("ca.pem")).unwrap();
    std::fs::copy(tls::dir().join("ca-key.pem"), other.path().join("ca-key.pem")).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let expired = Validity { not_before: now - time::Duration::days(30), not_after: now - time::Duration::days(1) };
    muster_tls::issue(other.path(), &Role::Admin("old".into()), expired, &[]).unwrap();
    let read = |f: &str| std::fs::read_to_string(other.path().join(f)).unwrap();
    let old = TlsMaterial::from_pems(ca.clone(), read("admin-old.pem"), read("admin-old-key.pem")).unwrap();
    assert!(refused(channel_as(&s.addr, &old).await).await, "an expired certificate was accepted");

    // An admin certificate from another CA.
    let rogue = tempfile::tempdir().unwrap();
    muster_tls::init_ca(rogue.path(), "rogue", Validity::days(1)).unwrap();
    muster_tls::issue(rogue.path(), &Role::Admin("dev".into()), Validity::days(1), &[]).unwrap();
    let read = |f: &str| std::fs::read_to_string(rogue.path().join(f)).unwrap();
    let forged = TlsMaterial::from_pems(ca.clone(), read("admin-dev.pem"), read("admin-dev-key.pem")).unwrap();
    assert!(refused(channel_as(&s.addr, &forged).await).await, "another CA's certificate was accepted");

    // A server whose TLS dir has no certificate for it refuses to start
    // (it never falls back to plaintext).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut fake = std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["server", "--id", "1", "--listen", &fake_addr, "--peers", &format!("1={fake_addr}")])
        .arg("--data-dir")
        .arg(other.path().join("fake"))
        .arg("--tls-dir")
        .arg(other.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || fake.wait().unwrap()).await.unwrap();
    assert!(!status.success(), "a server started without a server certificate");

    assert_eq!(s.state().await, before, "nothing changed");
}

/// Reads until the server closes the connection (or the deadline).
async fn closed_within(mut c: tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t113_a_connection_flood_is_capped_and_idle_handshakes_are_dropped() {
    // Connections from one address are capped at 4; a handshake may take a minute.
    let s = Server::start_with(&["--max-connections-per-peer", "4", "--handshake-timeout", "60s"]).await;
    let before = s.state().await;
    let mut flood = Vec::new();
    for _ in 0..8 {
        flood.push(tokio::net::TcpStream::connect(&s.addr).await.unwrap());
    }
    // The four over the cap are closed, long before any handshake timeout
    // could close them.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watchers: Vec<_> = flood
        .into_iter()
        .map(|c| {
            let tx = tx.clone();
            tokio::spawn(async move {
                if closed_within(c, Duration::from_secs(50)).await {
                    let _ = tx.send(());
                }
            })
        })
        .collect();
    for i in 0..4 {
        let got = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
        assert!(matches!(got, Ok(Some(()))), "only {i} of 8 connections over a cap of 4 were closed");
    }
    for w in watchers {
        w.abort();
    }
    // With the flood gone, a real client is served, and nothing changed.
    muster_testkit::eventually_async("the server to serve again", WAIT, || async { s.status().await.map(|_| ()) })
        .await;
    assert_eq!(s.state().await, before);
    drop(s);

    // A connection that never completes its handshake is dropped.
    let s = Server::start_with(&["--handshake-timeout", "1s"]).await;
    let idle = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    assert!(closed_within(idle, Duration::from_secs(30)).await, "an idle connection was held");
    assert!(s.status().await.is_some());
}

/// Issue 22, item 12: requests that can be judged without the log are
/// refused with a status naming the problem, and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t117_what_can_be_judged_without_the_log_is_refused_before_it() {
    use muster_proto::v1::v_cluster_service_client::VClusterServiceClient;
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let (_agent, _down) =
        agent_stream(&s.addr, &tls::material(Role::Agent("gpu-01".into())), register("gpu-01", 8)).await.unwrap();
    muster_testkit::eventually_async("the node to register", WAIT, || async {
        let got = NodeServiceClient::new(admin.clone()).get_node(v1::GetNodeRequest { id: "gpu-01".into() }).await;
        got.map(|_| ()).map_err(|e| e.to_string())
    })
    .await;
    let before = s.state().await;
    let vc = |name: &str| v1::VClusterRequest { name: name.into(), spec: Some(v1::VClusterSpec::default()) };
    let err = VClusterServiceClient::new(admin.clone()).create_v_cluster(vc("Bad Name")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = VClusterServiceClient::new(admin.clone()).update_v_cluster(vc("nope")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = VClusterServiceClient::new(admin.clone()).create_v_cluster(vc("default")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let revoke = v1::RevokeTokenRequest { id: "no-such-token".into() };
    let err = AdminServiceClient::new(admin.clone()).revoke_token(revoke).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let drain = v1::DrainNodeRequest { id: "gpu-01".into(), timeout_ms: Some(u64::MAX), ..Default::default() };
    let err = NodeServiceClient::new(admin.clone()).drain_node(drain).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("timeout"), "{err:?}");
    let huge = v1::AllocationSpec {
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: u64::MAX, cpus: 1 }),
        ..one_gpu("", &["true"])
    };
    let err = AllocationServiceClient::new(admin.clone())
        .submit(v1::SubmitRequest { spec: Some(huge), dry_run: false, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("resources.mem_mb"), "{err:?}");
    assert_eq!(s.state().await, before, "no refused request wrote an entry");
}

/// Keeps `per_address` idle TCP connections open from `address` (they never
/// start a handshake), reopening each one 10 ms after the server closes it,
/// until `stop` turns true. Returns how many it opened.
async fn hold_idle_connections(
    server: std::net::SocketAddr,
    address: std::net::IpAddr,
    per_address: usize,
    stop: tokio::sync::watch::Receiver<bool>,
    made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..per_address {
        let (mut stop, made) = (stop.clone(), made.clone());
        tasks.push(tokio::spawn(async move {
            let mut opened = 0;
            while !*stop.borrow() {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind(std::net::SocketAddr::new(address, 0)).unwrap();
                if let Ok(c) = socket.connect(server).await {
                    opened += 1;
                    made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::select! {
                        _ = closed_within(c, Duration::from_secs(3_600)) => {}
                        _ = stop.changed() => return opened,
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            opened
        }));
    }
    let mut opened = 0;
    for t in tasks {
        opened += t.await.unwrap();
    }
    opened
}

/// Issue 22, item 10: unauthenticated idle connections from many addresses
/// fill both caps and keep coming back; legitimate calls, each on a new
/// connection, are still served: a newcomer evicts the oldest connection
/// that has not proven itself, and a proven one is never evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t116_legitimate_calls_are_served_during_an_idle_connection_flood() {
    let s = Server::start_with(&["--max-connections", "200", "--max-connections-per-peer", "50"]).await;
    let server: std::net::SocketAddr = s.addr.parse().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // 8 addresses × 50 = 400 connections against a cap of 200.
    let flood: Vec<_> = (2..10u8)
        .map(|last| {
            let address = std::net::IpAddr::from([127, 0, 0, last]);
            tokio::spawn(hold_idle_connections(server, address, 50, stop.clone(), made.clone()))
        })
        .collect();
    muster_testkit::eventually("the flood to make 300 connections (the cap is 200)", WAIT, || {
        (made.load(std::sync::atomic::Ordering::Relaxed) >= 300).then_some(())
    })
    .await;
    // 28 calls, each on a connection of its own.
    let mut served = 0;
    for _ in 0..28 {
        if let Some(ch) = channel(&s.addr).await
            && AdminServiceClient::new(ch).status(v1::StatusRequest {}).await.is_ok()
        {
            served += 1;
        }
    }
    stop_tx.send(true).unwrap();
    let mut opened = 0;
    for f in flood {
        opened += f.await.unwrap();
    }
    eprintln!("t116: {served} of 28 legitimate calls served; {opened} flood connections made");
    assert!(opened > 200, "the flood filled the server: {opened} connections opened");
    assert_eq!(served, 28, "{served} of 28 legitimate calls served during the flood ({opened} flood connections)");
}

fn bearer<T>(msg: T, secret: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {secret}").parse().unwrap());
    r
}

async fn create_token(admin: &Channel, role: &str, name: &str, ttl_s: u64) -> (String, String) {
    let r = AdminServiceClient::new(admin.clone())
        .create_token(v1::CreateTokenRequest { role: role.into(), name: name.into(), ttl_s })
        .await
        .unwrap()
        .into_inner();
    (r.token.unwrap().id, r.secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t114_tokens_grant_their_role_and_stop_working_when_revoked_or_expired() {
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let client = s.as_role(Role::Client("bob".into())).await;

    // An admin call on a client connection needs an admin token.
    let err = AdminServiceClient::new(client.clone()).list_tokens(v1::StatusRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let (admin_id, admin_secret) = create_token(&admin, "admin", "ops-bot", 3_600).await;
    let listed = AdminServiceClient::new(client.clone())
        .list_tokens(bearer(v1::StatusRequest {}, &admin_secret))
        .await
        .unwrap()
        .into_inner();
    let t = listed.tokens.iter().find(|t| t.id == admin_id).unwrap();
    assert_eq!((t.role.as_str(), t.name.as_str(), t.created_by.as_str()), ("admin", "ops-bot", "admin dev"));
    // The secret is never stored or listed.
    assert!(!format!("{listed:?}").contains(&admin_secret));

    // Garbage, a wrong secret for a real id, and a token on an agent connection.
    for bad in ["nonsense", "mst_0000_0000", &format!("mst_{admin_id}_{}", "0".repeat(64))] {
        let err =
            AdminServiceClient::new(client.clone()).list_tokens(bearer(v1::StatusRequest {}, bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{bad}: {err:?}");
    }
    let agent = s.as_role(Role::Agent("gpu-01".into())).await;
    let err =
        AdminServiceClient::new(agent).list_tokens(bearer(v1::StatusRequest {}, &admin_secret)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // A reader token on a client connection reads, but cannot submit.
    let (reader_id, reader_secret) = create_token(&admin, "reader", "dashboard", 3_600).await;
    let spec = one_gpu("bob", &["true"]);
    let req = v1::SubmitRequest { spec: Some(spec.clone()), dry_run: false, ..Default::default() };
    let err = AllocationServiceClient::new(client.clone()).submit(bearer(req, &reader_secret)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let id = AllocationServiceClient::new(client.clone())
        .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .id;

    // A token revoked mid-stream ends the stream.
    let mut watch = AllocationServiceClient::new(client.clone())
        .watch(bearer(v1::WatchRequest { id, from_revision: 0 }, &reader_secret))
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().is_some(), "the stream opened");
    AdminServiceClient::new(admin.clone())
        .revoke_token(v1::RevokeTokenRequest { id: reader_id.clone() })
        .await
        .unwrap();
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the stream ended");
    let status = ended.expect("ended with an error");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{status:?}");
    let err = AllocationServiceClient::new(client.clone())
        .list(bearer(v1::ListRequest::default(), &reader_secret))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = AdminServiceClient::new(admin.clone())
        .revoke_token(v1::RevokeTokenRequest { id: reader_id })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "revoked once: {err:?}");

    // A token past its expiry stops working.
    let (_, short) = create_token(&admin, "reader", "short", 1).await;
    let err = muster_testkit::eventually_async("the token to expire", WAIT, || async {
        AllocationServiceClient::new(client.clone()).list(bearer(v1::ListRequest::default(), &short)).await.err()
    })
    .await;
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("expired"), "{err:?}");
    // Bad requests name the field.
    let err = AdminServiceClient::new(admin.clone())
        .create_token(v1::CreateTokenRequest { role: "root".into(), name: "x".into(), ttl_s: 60 })
        .await
        .unwrap_err();
    assert!(err.code() == Code::InvalidArgument && err.message().contains("role"), "{err:?}");
    let err = AdminServiceClient::new(admin)
        .create_token(v1::CreateTokenRequest { role: "client".into(), name: "a b".into(), ttl_s: 60 })
        .await
        .unwrap_err();
    assert!(err.code() == Code::InvalidArgument && err.message().contains("name"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t196_muster_token_creates_lists_and_revokes_through_the_cli() {
    let s = Server::start().await;
    tls::material(Role::Client("bob".into()));
    let run = |args: &[&str]| crate::muster(&[args, &["--scheduler", &s.addr]].concat());
    let o = run(&["token", "create", "--role", "reader", "--name", "grafana", "--ttl", "1h", "--output", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let created: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let secret = created["secret"].as_str().unwrap().to_string();
    let id = created["token"]["id"].as_str().unwrap().to_string();
    assert_eq!(created["token"]["role"], "reader");

    // The reader token works from a client certificate, for reads only.
    let as_reader = |args: &[&str]| run(&[args, &["--identity", "client-bob", "--token", &secret]].concat());
    let o = as_reader(&["alloc", "list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = crate::muster(&[
        "submit",
        "--gpus",
        "1",
        "--scheduler",
        &s.addr,
        "--identity",
        "client-bob",
        "--token",
        &secret,
        "--",
        "true",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("permission denied"), "{}", String::from_utf8_lossy(&o.stderr));

    let o = run(&["token", "list"]);
    let text = crate::stdout(&o);
    assert!(text.contains(&id) && text.contains("grafana") && text.contains("in force"), "{text}");
    assert!(!text.contains(&secret), "a listing never shows a secret");
    let o = run(&["token", "revoke", &id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = as_reader(&["alloc", "list"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("revoked"), "{err}");
    // Only admins manage tokens.
    let o = run(&["token", "list", "--identity", "client-bob"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("admins only"));
}

/// The probe's attack: submits whose `pack_by` is megabytes long were
/// accepted and stayed queued, and from then on `alloc list` failed for
/// every identity (its response over the 4 MiB message limit). Now such a
/// field is refused before the log, naming it and echoing only a prefix,
/// and lists keep working. A drain whose reason is over its limit, and an
/// agent message over its own, are refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t118_a_megabyte_field_is_refused_before_the_log_and_lists_keep_working() {
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let before = s.state().await;
    for _ in 0..2 {
        let spec = v1::AllocationSpec { pack_by: "rack".repeat(800_000), ..one_gpu("", &["true"]) };
        let err = AllocationServiceClient::new(admin.clone())
            .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("AllocationSpec.pack_by"), "{err:?}");
        assert!(err.message().len() < 200, "the error echoes at most a prefix: {} bytes", err.message().len());
    }
    let reason = "x".repeat(5_000);
    let drain = v1::DrainNodeRequest { id: "gpu-01".into(), reason, ..Default::default() };
    let err = NodeServiceClient::new(admin.clone()).drain_node(drain).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("DrainNodeRequest.reason"), "{err:?}");
    assert_eq!(s.state().await, before, "no refused request wrote an entry");
    // A registration whose labels are over their limit ends the stream with
    // the field named; nothing is registered.
    let mut reg = register("gpu-02", 8);
    if let Some(v1::agent_message::Msg::Register(r)) = reg.msg.as_mut() {
        r.labels = (0..100).map(|i| (format!("k{i}"), "v".into())).collect();
    }
    let refused = agent_stream(&s.addr, &tls::material(Role::Agent("gpu-02".into())), reg).await;
    let err = refused.expect_err("the stream is refused");
    assert!(format!("{err:?}").contains("Register.labels"), "{err:?}");
    assert_eq!(s.state().await, before, "nothing registered");
    let list = AllocationServiceClient::new(admin.clone()).list(v1::ListRequest::default()).await;
    assert!(list.is_ok(), "alloc list works: {list:?}");
    // Valid allocations at their limits (60 KB of argv and of env each):
    // forty of them were a 4.8 MB first page, over the message limit. Pages
    // now end at a byte budget too, and following them returns every one.
    let mut client = AllocationServiceClient::new(admin.clone());
    for i in 0..40 {
        let mut spec = one_gpu("", &["true", &"a".repeat(60_000)]);
        spec.env = [("BIG".to_string(), "e".repeat(60_000))].into();
        spec.idempotency_key = format!("big-{i}");
        client.submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() }).await.unwrap();
    }
    let (mut seen, mut token, mut pages) = (0, 0, 0);
    loop {
        let q = v1::ListRequest { page_token: token, ..Default::default() };
        let page = client.list(q).await.expect("every page fits a message").into_inner();
        seen += page.allocations.len();
        pages += 1;
        token = page.next_page_token;
        if token == 0 {
            break;
        }
    }
    assert_eq!(seen, 40, "every allocation, over {pages} pages");
    assert!(pages > 1, "the pages were cut by size");
}

/// The probe's smaller finding: history times and sequence numbers are
/// SQLite integers, and 2^64-1 wrapped negative, so `since_ms` or
/// `after_seq` of 2^64-1 returned every record and a usage `until_ms` of
/// 2^64-1 returned none. Such values are refused, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t119_history_bounds_past_the_stored_range_are_refused() {
    use muster_proto::v1::history_service_client::HistoryServiceClient;
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let mut history = HistoryServiceClient::new(admin);
    for (field, q) in [
        ("since_ms", v1::HistoryQuery { since_ms: u64::MAX, ..Default::default() }),
        ("after_seq", v1::HistoryQuery { after_seq: u64::MAX, ..Default::default() }),
        ("id", v1::HistoryQuery { id: 1 << 63, ..Default::default() }),
    ] {
        let err = history.list_history(q).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {err:?}");
    }
    let q = v1::UsageQuery { since_ms: 0, until_ms: u64::MAX, ..Default::default() };
    let err = history.usage(q).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("until_ms"), "{err:?}");
    let ok = history.list_history(v1::HistoryQuery { since_ms: i64::MAX as u64 - 1, ..Default::default() }).await;
    assert!(ok.is_ok_and(|r| r.into_inner().records.is_empty()), "the largest stored time answers, with nothing");
}

/// Node lists come in pages too (they returned every node in one message):
/// ordered by id, at most page_size each, and following next_page_token
/// visits every node once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t197_node_lists_are_paged_in_id_order() {
    let s = Server::start().await;
    let admin = channel(&s.addr).await.unwrap();
    let mut streams = Vec::new();
    let ids = ["n-05", "n-01", "n-04", "n-02", "n-03"];
    for id in ids {
        streams.push(agent_stream(&s.addr, &tls::material(Role::Agent(id.into())), register(id, 8)).await.unwrap());
    }
    let mut nodes = NodeServiceClient::new(admin);
    let (seen, pages) = muster_testkit::eventually_async("every node to be listed", WAIT, || async {
        let mut nodes = nodes.clone();
        let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
        loop {
            let q = v1::ListNodesRequest { page_size: 2, page_token: token };
            let page = nodes.list_nodes(q).await.unwrap().into_inner();
            assert!(page.nodes.len() <= 2, "{page:?}");
            seen.extend(page.nodes.into_iter().map(|n| n.id));
            pages += 1;
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        if seen.len() == ids.len() { Ok((seen, pages)) } else { Err(format!("{seen:?} in {pages} pages")) }
    })
    .await;
    let mut sorted = ids.to_vec();
    sorted.sort();
    assert_eq!(seen, sorted, "every node once, in id order");
    assert_eq!(pages, 3);
    let err = nodes.list_nodes(v1::ListNodesRequest { page_size: 5_000, ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("page_size"), "{err:?}");
    drop(streams);
}
