//! Real `muster server` processes on loopback, and a leader-following gRPC
//! client for the tests that drive them.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::transport::Channel;

pub const WAIT: Duration = Duration::from_secs(60);

/// A port the OS just handed out on 127.0.0.1 (bound to port 0, then freed
/// for the server to take, since every member must know every address up
/// front).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Cluster {
    pub dir: PathBuf,
    pub addrs: Vec<String>,
    children: Vec<Option<Child>>,
    extra: Vec<String>,
    /// Environment every replica starts with (besides the TLS dir).
    pub env: Vec<(String, String)>,
}

impl Cluster {
    /// Starts three replicas with these extra `muster server` flags.
    pub fn start(dir: &Path, extra: &[&str]) -> Cluster {
        let mut c = Cluster::prepare(dir, extra);
        for id in 1..=3 {
            c.spawn(id);
        }
        c
    }

    /// Three replicas' addresses and data dirs (`DIR/data-N`), none started.
    pub fn prepare(dir: &Path, extra: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        std::fs::create_dir_all(dir).unwrap();
        Cluster {
            dir: dir.to_path_buf(),
            addrs,
            children: vec![None, None, None],
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
        }
    }

    pub fn peers(&self) -> String {
        self.addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",")
    }

    /// Starts (or restarts) replica `id` on its address and data dir.
    pub fn spawn(&mut self, id: u64) {
        let i = id as usize - 1;
        let log = File::options().create(true).append(true).open(self.dir.join(format!("replica-{id}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["server", "--id", &id.to_string(), "--listen", &self.addrs[i]])
            .arg("--data-dir")
            .arg(self.dir.join(format!("data-{id}")))
            .args(["--peers", &self.peers()])
            // The tests' agents register unadmitted.
            .args(["--node-admission", "open"])
            .args(&self.extra)
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("muster server starts");
        self.children[i] = Some(child);
    }

    /// `kill -9`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.children[id as usize - 1].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Freezes replica `id` (SIGSTOP): its sockets stay open, it answers nothing.
    pub fn pause(&self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    /// Thaws a frozen replica (SIGCONT).
    pub fn resume(&self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    fn signal(&self, id: u64, sig: i32) {
        let child = self.children[id as usize - 1].as_ref().expect("replica running");
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0, "signal {sig} to replica {id}");
    }

    /// Replica `id`'s log so far.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.join(format!("replica-{id}.log"))).unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        (1..=3)
            .map(|id| {
                let text = std::fs::read_to_string(self.dir.join(format!("replica-{id}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!("--- replica {id} ---\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in 1..=3 {
            self.kill(id);
        }
    }
}

/// A channel to `addr` as the tests' admin.
pub async fn channel(addr: &str) -> Option<Channel> {
    channel_as(addr, &crate::tls::admin()).await
}

/// A channel to `addr` presenting `tls`'s certificate.
pub async fn channel_as(addr: &str, tls: &muster_tls::TlsMaterial) -> Option<Channel> {
    muster_tls::endpoint(addr, Some(tls))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .ok()
}

pub async fn status(addr: &str) -> Option<v1::ReplicaStatus> {
    let ch = channel(addr).await?;
    AdminServiceClient::new(ch).status(v1::StatusRequest {}).await.ok().map(|r| r.into_inner())
}

/// Waits for a replica that says it leads, other than `not`; returns its id.
pub async fn leader(addrs: &[String], not: Option<u64>) -> u64 {
    muster_testkit::eventually_async("a leader", WAIT, || async {
        for a in addrs {
            if let Some(s) = status(a).await
                && s.role == "leader"
                && Some(s.id) != not
            {
                return Some(s.id);
            }
        }
        None
    })
    .await
}

/// Waits until every replica reports the same applied index and digest.
pub async fn converged(addrs: &[String]) -> (u64, String) {
    muster_testkit::eventually_async("the replicas to converge", WAIT, || async {
        let mut seen = Vec::new();
        for a in addrs {
            seen.push(status(a).await.map(|s| (s.applied_index, s.state_digest)));
        }
        if seen.iter().all(|s| s.is_some() && *s == seen[0]) {
            Ok(seen[0].clone().unwrap())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await
}

/// A leader-following client, as the CLI's.
pub struct Client {
    addrs: Vec<String>,
    next: usize,
}

impl Client {
    pub fn new(addrs: &[String]) -> Client {
        Client { addrs: addrs.to_vec(), next: 0 }
    }

    /// Submits until acknowledged; returns the allocation id.
    pub async fn submit_until_acked(&mut self, key: &str) -> u64 {
        let spec = v1::AllocationSpec {
            owner: "chaos".into(),
            gang_size: 2,
            resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
            command: vec!["true".into()],
            idempotency_key: key.into(),
            ..Default::default()
        };
        // Which address to try next: a redirect names the leader, a failure
        // moves on to the next one. (Atomic, not a Cell: the future must be
        // Send, the failover test's submitter is a spawned task.)
        let next = AtomicUsize::new(self.next);
        let addrs = &self.addrs;
        let id = muster_testkit::eventually_async(&format!("the submit of {key} to be acknowledged"), WAIT, || async {
            let addr = &addrs[next.load(Relaxed) % addrs.len()];
            let Some(ch) = channel(addr).await else {
                next.fetch_add(1, Relaxed);
                return Err(format!("{addr} unreachable"));
            };
            let mut req = tonic::Request::new(v1::SubmitRequest {
                spec: Some(spec.clone()),
                dry_run: false,
                ..Default::default()
            });
            req.set_timeout(Duration::from_secs(3));
            match AllocationServiceClient::new(ch).submit(req).await {
                Ok(r) => Ok(r.into_inner().id),
                Err(status) => {
                    if let Some(leader) = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok())
                        && let Some(i) = addrs.iter().position(|a| a == leader)
                    {
                        next.store(i, Relaxed);
                    } else {
                        next.fetch_add(1, Relaxed);
                    }
                    Err(format!("{addr}: {status}"))
                }
            }
        })
        .await;
        self.next = next.into_inner();
        id
    }

    /// Every allocation, through the leader, following pages.
    pub async fn list_all(&mut self) -> Vec<v1::Allocation> {
        let l = leader(&self.addrs, None).await;
        let ch = channel(&self.addrs[l as usize - 1]).await.expect("leader reachable");
        let mut client = AllocationServiceClient::new(ch);
        let mut out = Vec::new();
        let mut token = 0;
        loop {
            let page = client
                .list(v1::ListRequest { page_size: 1000, page_token: token, ..Default::default() })
                .await
                .expect("list")
                .into_inner();
            out.extend(page.allocations);
            token = page.next_page_token;
            if token == 0 {
                return out;
            }
        }
    }
}
