//! Replication benchmark: three real `muster server` processes on loopback
//! (real fsync), committed submissions per second with 1, 16 and 256
//! concurrent clients, commit latency percentiles, and the time from
//! `kill -9` of the leader to the first commit by its successor.
//!
//! Run: `cargo bench -p muster --bench cluster` (builds the release binary).
//! Options after `--`: `--seconds N` per concurrency level (default 5),
//! `--kills N` failover rounds (default 3).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::transport::{Channel, Endpoint};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Servers {
    addrs: Vec<String>,
    children: Vec<Option<Child>>,
    dir: std::path::PathBuf,
}

impl Servers {
    fn start(dir: &Path) -> Servers {
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let mut s = Servers { addrs, children: vec![None, None, None], dir: dir.to_path_buf() };
        for id in 1..=3 {
            s.spawn(id);
        }
        s
    }

    fn spawn(&mut self, id: usize) {
        let peers: Vec<String> = self.addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let child = Command::new(env!("CARGO_BIN_EXE_muster"))
            .args([
                "server",
                "--insecure",
                "--id",
                &id.to_string(),
                "--listen",
                &self.addrs[id - 1],
                "--peers",
                &peers.join(","),
            ])
            .arg("--data-dir")
            .arg(self.dir.join(format!("data-{id}")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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
}

impl Drop for Servers {
    fn drop(&mut self) {
        for id in 1..=3 {
            self.kill(id);
        }
    }
}

async fn channel(addr: &str) -> Option<Channel> {
    Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect()
        .await
        .ok()
}

async fn leader(addrs: &[String], not: Option<usize>) -> usize {
    loop {
        for (i, a) in addrs.iter().enumerate() {
            if Some(i + 1) == not {
                continue;
            }
            if let Some(ch) = channel(a).await
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

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

async fn load(addr: &str, clients: usize, seconds: u64, seq: Arc<AtomicU64>) {
    // A few connections, many streams each (HTTP/2), like real clients.
    let mut channels = Vec::new();
    for _ in 0..clients.clamp(1, 8) {
        channels.push(channel(addr).await.expect("leader reachable"));
    }
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let end = start + warmup + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = AllocationServiceClient::new(channels[c % channels.len()].clone());
        let seq = seq.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < end {
                let key = format!("b{}", seq.fetch_add(1, Ordering::Relaxed));
                let t = Instant::now();
                client.submit(v1::SubmitRequest { spec: Some(spec(key)), dry_run: false }).await.expect("submit");
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
    println!(
        "{clients:>4} clients: {:>8.0} committed submits/s   p50 {:>7.2} ms   p99 {:>7.2} ms   ({} submits)",
        all.len() as f64 / seconds as f64,
        pct(&all, 0.50).as_secs_f64() * 1e3,
        pct(&all, 0.99).as_secs_f64() * 1e3,
        all.len()
    );
}

async fn failover(servers: &mut Servers, seq: Arc<AtomicU64>) -> Duration {
    let old = leader(&servers.addrs, None).await;
    // Keep the cluster busy up to the kill.
    let kill_at = Instant::now();
    servers.kill(old);
    loop {
        for (i, a) in servers.addrs.iter().enumerate() {
            if i + 1 == old {
                continue;
            }
            if let Some(ch) = channel(a).await {
                let mut req = tonic::Request::new(v1::SubmitRequest {
                    spec: Some(spec(format!("f{}", seq.fetch_add(1, Ordering::Relaxed)))),
                    dry_run: false,
                });
                req.set_timeout(Duration::from_millis(500));
                if AllocationServiceClient::new(ch).submit(req).await.is_ok() {
                    let took = kill_at.elapsed();
                    servers.spawn(old);
                    return took;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seconds = opt("--seconds", 5);
    let kills = opt("--kills", 3);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut servers = Servers::start(dir.path());
        let l = leader(&servers.addrs, None).await;
        println!("3 replicas on loopback, fsync on every append; leader is replica {l}");
        let seq = Arc::new(AtomicU64::new(0));
        for clients in [1, 16, 256] {
            let l = leader(&servers.addrs, None).await;
            load(&servers.addrs[l - 1], clients, seconds, seq.clone()).await;
        }
        let mut times = Vec::new();
        for _ in 0..kills {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let t = failover(&mut servers, seq.clone()).await;
            println!("kill -9 leader -> first commit by the new leader: {:>6.0} ms", t.as_secs_f64() * 1e3);
            times.push(t);
        }
        times.sort();
        if !times.is_empty() {
            println!(
                "failover: median {:.0} ms, worst {:.0} ms",
                pct(&times, 0.5).as_secs_f64() * 1e3,
                times.last().unwrap().as_secs_f64() * 1e3
            );
        }
    });
}
