//! Fleet scale: three release-built `muster server` processes, and N node
//! agents in this process holding N agent streams over the real protocol.
//! Each agent is the real `muster_agent::Agent` (registration, the stream,
//! assignments, claims, heartbeats, hints, end reports); only its executor
//! is simulated (`muster_agent::executor::sim`): a task "runs" for a drawn
//! duration and exits 0.
//!
//! The workload: job arrays of one-GPU elements (`--array-size`, default
//! 10,000), each followed by `--gangs-per-array` four-task gangs of whole
//! nodes, until `--tasks` tasks are submitted; and a probe that submits a
//! one-GPU job every 500 ms, at a higher priority than the backlog, and
//! times submit → running through its `Watch` stream. It runs until every task has started (or `--max-seconds`).
//!
//! It reports: registration time; tasks started per second (overall, and
//! sustained between the 10th and the 90th percent of starts); the probe's
//! submit → running p50/p99/max; the leader's CPU and resident memory; the
//! replicas' applied entries per second and the followers' largest lag.
//!
//! Run: `cargo bench -p muster --bench fleet -- --nodes 10000 --tasks 1000000`.
//! Options after `--`: `--nodes N` (default 1,000), `--tasks T` (default
//! 100,000), `--array-size A`, `--gangs-per-array G` (default 10),
//! `--mean-ms M` (a task's run time, uniform on [M/2, 3M/2], default 10,000),
//! `--max-seconds S` (default 600). Put `TMPDIR` on a tmpfs: every agent
//! keeps a work dir.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_agent::agent::{Agent, AgentConfig};
use muster_agent::executor::sim::{Durations, SimConfig, SimExecutor};
use muster_agent::executor::{Attempt, Executor, Muster, SpawnError, TaskLaunch};
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_proto::v1::node_service_client::NodeServiceClient;
use tokio::sync::watch;
use tonic::transport::Channel;

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// (utime + stime in clock ticks, VmRSS in KiB) of a process.
fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks = fields.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}

/// Every task start, by second since the origin.
#[derive(Debug)]
struct Starts {
    origin: Instant,
    count: AtomicU64,
    per_second: Mutex<Vec<u64>>,
}

impl Starts {
    fn note(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let s = self.origin.elapsed().as_secs() as usize;
        let mut v = self.per_second.lock().unwrap();
        if v.len() <= s {
            v.resize(s + 1, 0);
        }
        v[s] += 1;
    }
}

/// The simulated executor, counting starts.
#[derive(Debug)]
struct Counting {
    sim: SimExecutor,
    starts: Arc<Starts>,
}

impl Executor for Counting {
    fn spawn(
        &self,
        launch: &TaskLaunch,
        work_dir: &std::path::Path,
        muster: Muster<'_>,
        cgroup: Option<muster_agent::cgroup::TaskCgroup>,
    ) -> Result<Box<dyn Attempt>, SpawnError> {
        self.starts.note();
        self.sim.spawn(launch, work_dir, muster, cgroup)
    }

    fn real(&self) -> bool {
        false
    }
}

/// A replica's `muster_raft_applied_index`.
fn applied(http: &str) -> u64 {
    common::metrics(http)
        .lines()
        .find(|l| l.starts_with("muster_raft_applied_index"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn ready_nodes(ch: &Channel) -> usize {
    let mut client = NodeServiceClient::new(ch.clone());
    let (mut token, mut ready) = (String::new(), 0);
    loop {
        let Ok(page) = client.list_nodes(v1::ListNodesRequest { page_size: 1000, page_token: token.clone() }).await
        else {
            return ready;
        };
        let page = page.into_inner();
        ready += page.nodes.iter().filter(|n| n.status == v1::NodeStatus::Ready as i32).count();
        if page.next_page_token.is_empty() {
            return ready;
        }
        token = page.next_page_token;
    }
}

fn spec(gang_size: u32, gpus: u32, command: &[&str]) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "fleet".into(),
        gang_size,
        resources: Some(v1::Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: command.iter().map(|s| s.to_string()).collect(),
        checkpoint: v1::CheckpointMode::None as i32,
        ports: Some(0),
        ..Default::default()
    }
}

fn main() {
    let nodes = common::opt("--nodes", 1_000) as usize;
    let tasks = common::opt("--tasks", 100_000);
    let array_size = common::opt("--array-size", 10_000).clamp(1, 1_000_000);
    let gangs_per_array = common::opt("--gangs-per-array", 10);
    let mean_ms = common::opt("--mean-ms", 10_000);
    let max_seconds = common::opt("--max-seconds", 600);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let https: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let room = (nodes + 200).to_string();
        let servers = Servers(
            (0..3)
                .map(|i| {
                    Command::new(env!("CARGO_BIN_EXE_muster"))
                        .arg("server")
                        .args(["--insecure", "--node-admission", "open"])
                        .args(["--max-connections", &room, "--max-connections-per-peer", &room])
                        .args(["--id", &(i + 1).to_string(), "--listen", &addrs[i], "--peers", &peers.join(",")])
                        .args(["--http", &https[i]])
                        .arg("--data-dir")
                        .arg(dir.path().join(format!("d{i}")))
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        );
        let leader = loop {
            let mut found = None;
            for (i, a) in addrs.iter().enumerate() {
                let Ok(ch) = muster_tls::endpoint(a, None).unwrap().connect().await else { continue };
                if let Ok(s) = AdminServiceClient::new(ch).status(v1::StatusRequest {}).await
                    && s.get_ref().role == "leader"
                {
                    found = Some(i);
                }
            }
            if let Some(i) = found {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pid = servers.0[leader].id();
        let ch = muster_tls::endpoint(&addrs[leader], None).unwrap().connect().await.unwrap();

        // The fleet: real agents, simulated tasks.
        let starts =
            Arc::new(Starts { origin: Instant::now(), count: AtomicU64::new(0), per_second: Mutex::default() });
        let mean = Duration::from_millis(mean_ms);
        let sim = SimConfig {
            durations: Durations::Uniform(mean / 2, mean * 3 / 2),
            seed: 51,
            term_delay: Duration::from_millis(100),
            hint_reply: Some(Duration::from_millis(500)),
        };
        let registering = Instant::now();
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::new();
        for i in 0..nodes {
            let node_id = format!("node-{:05}", i + 1);
            let cfg = AgentConfig {
                node_id: node_id.clone(),
                schedulers: addrs.clone(),
                resources: v1::Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 },
                labels: Default::default(),
                address: format!("10.{}.{}.{}:29500", i / 65_536, i / 256 % 256, i % 256),
                ports: muster_core::sm::PortRange { first: 29_500, count: 500 },
                work_dir: dir.path().join("agents").join(&node_id),
                backoff: (Duration::from_millis(200), Duration::from_secs(5)),
                watchdog: muster_agent::watchdog::WatchdogConfig {
                    gpu_health: false,
                    poll: Duration::from_secs(5),
                    ..Default::default()
                },
                sampler: muster_agent::agent::null_sampler,
                exit_when_stopped: false,
                task_shim: None,
                tls: None,
                clock: Default::default(),
                janitor: Default::default(),
                fence: true,
                forget_leftovers: false,
                disk_fault_file: None,
                start_without_record: false,
                checkpoint_listen: None,
                checkpoint_address: String::new(),
                isolation: None,
                run_as: muster_agent::users::RunAs::agent(),
                exe: None,
                images: None,
                executor: Some(Arc::new(Counting { sim: SimExecutor::new(sim, &node_id), starts: starts.clone() })),
            };
            let agent = Agent::new(cfg).expect("an agent's work dir");
            handles.push(tokio::spawn(agent.run(stopped.clone())));
        }
        loop {
            let ready = ready_nodes(&ch).await;
            if ready >= nodes {
                break;
            }
            if registering.elapsed() > Duration::from_secs(max_seconds) {
                println!("only {ready} of {nodes} nodes registered in {max_seconds} s");
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let registered_in = registering.elapsed();

        // Load: arrays and gangs, and the probe.
        let (cpu0, rss0) = usage(pid);
        let followers: Vec<u32> = (0..3).filter(|&i| i != leader).map(|i| servers.0[i].id()).collect();
        let followers_cpu0: Vec<u64> = followers.iter().map(|&p| usage(p).0).collect();
        let (fleet_cpu0, _) = usage(std::process::id());
        let applied0: Vec<u64> = https.iter().map(|h| applied(h)).collect();
        let load = Instant::now();
        let started_before = starts.count.load(Ordering::Relaxed);
        let done = Arc::new(AtomicBool::new(false));
        let client = AllocationServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20);
        let submitter = {
            let mut c = client.clone();
            tokio::spawn(async move {
                let mut submitted = 0u64;
                while submitted < tasks {
                    let n = array_size.min(tasks - submitted);
                    let req = v1::SubmitRequest {
                        spec: Some(spec(1, 1, &["train"])),
                        array: format!("0-{}", n - 1),
                        ..Default::default()
                    };
                    if c.submit(req).await.is_ok() {
                        submitted += n;
                    }
                    for _ in 0..gangs_per_array {
                        if submitted >= tasks {
                            break;
                        }
                        let req = v1::SubmitRequest { spec: Some(spec(4, 8, &["train"])), ..Default::default() };
                        if c.submit(req).await.is_ok() {
                            submitted += 4;
                        }
                    }
                }
                submitted
            })
        };
        let probe = {
            let mut c = client.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    // Ahead of the backlog (a higher priority, the same
                    // class): the control plane's latency, not the queue's.
                    let mut probe = spec(1, 1, &["sleep", "1"]);
                    probe.priority = 100;
                    let req = v1::SubmitRequest { spec: Some(probe), ..Default::default() };
                    if let Ok(r) = c.submit(req).await {
                        let id = r.into_inner().id;
                        if let Ok(w) = c.watch(v1::WatchRequest { id, from_revision: 0 }).await {
                            let mut events = w.into_inner();
                            while let Ok(Some(e)) = events.message().await {
                                if e.kind == "task_started" {
                                    lat.push(t0.elapsed());
                                    break;
                                }
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                lat
            })
        };
        let rss_peak = {
            let done = done.clone();
            tokio::spawn(async move {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(usage(pid).1);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                peak
            })
        };
        let mut lag_max = 0u64;
        let submitted = loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now: Vec<u64> = https.iter().map(|h| applied(h)).collect();
            let top = now.iter().copied().max().unwrap_or(0);
            lag_max = lag_max.max(top - now.iter().copied().min().unwrap_or(0));
            let started = starts.count.load(Ordering::Relaxed) - started_before;
            if submitter.is_finished() && started >= tasks {
                break tasks;
            }
            if load.elapsed() > Duration::from_secs(max_seconds) {
                println!("stopped after {max_seconds} s with {started} of {tasks} tasks started");
                break started;
            }
        };
        let elapsed = load.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let (cpu1, rss1) = usage(pid);
        let applied1: Vec<u64> = https.iter().map(|h| applied(h)).collect();
        let rss_peak = rss_peak.await.unwrap_or(0).max(rss1);
        let mut lat = probe.await.unwrap_or_default();
        lat.sort();
        let per_second = starts.per_second.lock().unwrap().clone();
        // Sustained: the 10th to the 90th percent of starts.
        let total: u64 = per_second.iter().sum();
        let (mut acc, mut from, mut to) = (0u64, None, None);
        for (s, n) in per_second.iter().enumerate() {
            acc += n;
            if from.is_none() && acc * 10 >= total {
                from = Some(s);
            }
            if to.is_none() && acc * 10 >= total * 9 {
                to = Some(s);
            }
        }
        let (from, to) = (from.unwrap_or(0), to.unwrap_or(0).max(from.unwrap_or(0) + 1));
        let sustained = per_second[from..to.min(per_second.len())].iter().sum::<u64>() as f64 / (to - from) as f64;

        println!(
            "fleet: {nodes} real agents (simulated tasks, 8 GPUs each), 3 release muster servers, insecure; \
             {submitted} tasks in arrays of {array_size} one-GPU elements and four-node gangs; run time uniform \
             {:.1}-{:.1} s",
            mean.as_secs_f64() / 2.0,
            mean.as_secs_f64() * 1.5
        );
        println!("  registered {nodes} nodes in {:.1} s", registered_in.as_secs_f64());
        println!(
            "  tasks started: {:.0}/s over the run ({submitted} in {elapsed:.1} s); sustained {sustained:.0}/s \
             (the 10th to the 90th percent of starts, seconds {from}-{to})",
            submitted as f64 / elapsed
        );
        if !lat.is_empty() {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "  probe submit -> running: n={} p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms",
                lat.len(),
                ms(common::pct(&lat, 0.5)),
                ms(common::pct(&lat, 0.99)),
                ms(*lat.last().unwrap())
            );
        }
        println!(
            "  leader: {:.0} % of a core; resident {} MiB before the load, peak {} MiB",
            (cpu1 - cpu0) as f64 / 100.0 / elapsed * 100.0,
            rss0 / 1024,
            rss_peak / 1024
        );
        let entries = applied1[leader].saturating_sub(applied0[leader]);
        println!(
            "  log: {entries} entries applied, {:.0}/s; followers' largest lag {lag_max} entries",
            entries as f64 / elapsed
        );
        let (fleet_cpu1, fleet_rss) = usage(std::process::id());
        let followers_cpu: Vec<String> = followers
            .iter()
            .zip(&followers_cpu0)
            .map(|(&p, &c0)| format!("{:.0} %", (usage(p).0 - c0) as f64 / elapsed))
            .collect();
        println!("  followers: {} of a core each", followers_cpu.join(", "));
        println!(
            "  this process (the {nodes} agents and the submitters): {:.0} % of a core, resident {} MiB",
            (fleet_cpu1 - fleet_cpu0) as f64 / elapsed,
            fleet_rss / 1024
        );
        let _ = stop.send(true);
        for h in handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        drop(servers);
    });
}
