//! Gangs end to end: a local cluster (three replicas, N agents of 8 fake
//! GPUs each, real child processes) runs four-task gangs, one whole node per
//! task, whose tasks run `true`. Two phases:
//!
//! - **idle**: one submitter, one gang at a time; submit → all four tasks
//!   running (as its `Watch` stream reports them), p50/p99;
//! - **load**: C concurrent gRPC submitters, each submitting a gang and
//!   waiting for it to finish before the next; gangs completed per second,
//!   and submit → all-running under that load (queueing included: N/4 gangs
//!   fit at once).
//!
//! After each phase it prints what the leader committed per gang (from its
//! `/metrics`): entries, commands, and admission passes.
//!
//! - **image** (where the registry tools are installed; `--no-images` skips
//!   it): the same gangs from a container image (busybox, built offline,
//!   in Debian's registry on the loopback) once every node has it cached,
//!   alternating with gangs without an image, one at a time: submit → all
//!   four running for each, in the same run (docs/containers.md).
//!
//! Run: `cargo bench -p muster --bench gangs`. Options after `--`:
//! `--agents N` (default 16), `--submitters C` (default 16), `--rounds R`
//! idle gangs (default 50), `--seconds S` of load (default 10), `--tls`
//! (mutual TLS; the default is insecure), `--no-isolation` (tasks as bare
//! process groups instead of a cgroup each: the same workload without
//! containment, for its start and stop cost; docs/isolation.md),
//! `--no-wait-notes` (the leader does not record why gangs wait: the same
//! workload without the wait timeline, for its cost; docs/replay.md).
//!
//! The cluster's data (Raft logs, agents' work dirs) goes under `TMPDIR`.
//! On a journal-less ext4 a directory that has seen heavy file churn makes
//! every file creation slow, and this bench creates several per task: run
//! it on a fresh file system to compare builds (docs/performance.md).
//!
//! Slurm's figure for the same experiment (18.9 four-node gangs/s on the
//! same kind of machine) is in `../shared/peers/`; it is a reference, not a
//! same-run ratio.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::transport::Channel;

fn gang(gpus: u32, image: &str) -> v1::AllocationSpec {
    v1::AllocationSpec {
        image: image.to_string(),
        owner: "bench".into(),
        gang_size: 4,
        resources: Some(v1::Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: 5,
        command: vec!["true".into()],
        ports: Some(0),
        ..Default::default()
    }
}

/// When one gang's events came, counted from its submit.
#[derive(Clone, Default)]
struct Timeline {
    answered: Option<Duration>,
    reserved: Option<Duration>,
    started: Vec<Duration>,
    finished: Option<Instant>,
    /// Submit → `allocation_done`.
    done: Option<Duration>,
}

impl Timeline {
    /// Submit → the fourth `task_started`.
    fn all_running(&self) -> Option<Duration> {
        (self.started.len() >= 4).then(|| self.started[3])
    }

    fn show(&self) -> String {
        let ms = |d: &Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
        format!(
            "submit answered at +{} ms, reserved at +{} ms, its tasks started at +{} ms",
            self.answered.as_ref().map_or("?".into(), ms),
            self.reserved.as_ref().map_or("?".into(), ms),
            self.started.iter().map(ms).collect::<Vec<_>>().join(", +")
        )
    }
}

/// Submits one gang and follows it to the end. Returns when its events
/// came, or `None` when it did not succeed.
async fn one(c: &mut AllocationServiceClient<Channel>, gpus: u32) -> Option<Timeline> {
    one_of(c, gpus, "").await
}

/// [`one`], its tasks in `image` (empty: none).
async fn one_of(c: &mut AllocationServiceClient<Channel>, gpus: u32, image: &str) -> Option<Timeline> {
    let t0 = Instant::now();
    let id = c
        .submit(v1::SubmitRequest { spec: Some(gang(gpus, image)), dry_run: false, ..Default::default() })
        .await
        .ok()?
        .into_inner()
        .id;
    let mut timeline = Timeline { answered: Some(t0.elapsed()), ..Timeline::default() };
    let mut events = c.watch(v1::WatchRequest { id, from_revision: 0 }).await.ok()?.into_inner();
    while let Ok(Some(e)) = events.message().await {
        match e.kind.as_str() {
            "gang_reserved" => timeline.reserved = Some(t0.elapsed()),
            "task_started" => timeline.started.push(t0.elapsed()),
            "allocation_done" => {
                timeline.finished = Some(Instant::now());
                timeline.done = Some(t0.elapsed());
                return timeline.all_running().is_some().then_some(timeline);
            }
            "allocation_failed" | "allocation_cancelled" => {
                eprintln!("gang {id} ended {}: {}", e.kind, e.detail);
                return None;
            }
            _ => {}
        }
    }
    None
}

/// Percentile `p` of sorted durations, in milliseconds.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    common::pct(sorted, p).as_secs_f64() * 1e3
}

fn latencies(name: &str, gangs: &[Timeline]) {
    let mut d: Vec<Duration> = gangs.iter().filter_map(Timeline::all_running).collect();
    d.sort();
    if d.is_empty() {
        println!("{name:<6} no gang completed");
        return;
    }
    println!(
        "{name:<6} submit -> all 4 running: n={} p50 {:.1} ms  p99 {:.1} ms  min {:.1} ms  max {:.1} ms",
        d.len(),
        pct(&d, 0.5),
        pct(&d, 0.99),
        pct(&d, 0.0),
        pct(&d, 1.0)
    );
    if let Some(slowest) = gangs.iter().max_by_key(|t| t.all_running()) {
        println!("       the slowest: {}", slowest.show());
    }
}

/// The longest time in which no gang finished, and when it began (from
/// `start`): a stall of the whole pipeline shows here.
fn longest_gap(start: Instant, gangs: &[Timeline]) -> Option<(Duration, Duration)> {
    let mut done: Vec<Instant> = gangs.iter().filter_map(|t| t.finished).collect();
    done.sort();
    done.windows(2).map(|w| (w[1] - w[0], w[0] - start)).max()
}

/// Counters from the leader's `/metrics` that say what a gang cost, and
/// how many slow steps there were (in this bench the replicas share one
/// process, so those count all three): where a stall can come from.
#[derive(Clone, Copy, Default)]
struct Costs {
    entries: f64,
    commands: f64,
    passes: f64,
    slow_syncs: f64,
    slow_commits: f64,
    slow_passes: f64,
}

impl Costs {
    fn scrape(addr: std::net::SocketAddr) -> Costs {
        let body = common::metrics(addr);
        // The values of the samples whose line starts with `name` and holds
        // `labels`, summed over every label set.
        let sum = |name: &str, labels: &str| {
            body.lines()
                .filter(|l| l.starts_with(name) && l.contains(labels))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        let over_100ms = |histogram: &str| {
            sum(&format!("{histogram}_count"), "") - sum(&format!("{histogram}_bucket"), "le=\"0.1\"")
        };
        Costs {
            entries: sum("muster_raft_batch_commands_count", ""),
            commands: sum("muster_raft_batch_commands_sum", ""),
            passes: sum("muster_admission_pass_seconds_count", ""),
            slow_syncs: over_100ms("muster_raft_log_sync_seconds"),
            slow_commits: over_100ms("muster_raft_commit_seconds"),
            slow_passes: over_100ms("muster_admission_pass_seconds"),
        }
    }

    fn per_gang(self, before: Costs, gangs: usize) -> String {
        let g = gangs.max(1) as f64;
        format!(
            "per gang on the leader: {:.1} entries, {:.1} commands, {:.1} admission passes",
            (self.entries - before.entries) / g,
            (self.commands - before.commands) / g,
            (self.passes - before.passes) / g
        )
    }

    fn slow_since(self, before: Costs) -> String {
        format!(
            "over 100 ms in the load (all replicas): {} log syncs, {} commits, {} admission passes",
            self.slow_syncs - before.slow_syncs,
            self.slow_commits - before.slow_commits,
            self.slow_passes - before.slow_passes
        )
    }
}

/// The leader's id and its term (0 and 0 while none leads).
fn leadership(c: &LocalCluster) -> (u64, u64) {
    let id = c.leader_id().unwrap_or(0);
    (id, c.replica(id).map_or(0, |r| r.status().term))
}

fn leader_http(c: &LocalCluster) -> Option<std::net::SocketAddr> {
    let id = c.leader_id()?;
    c.http_addrs().into_iter().find(|(r, _)| *r == id).map(|(_, a)| a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let agents = common::opt("--agents", 16) as u32;
    let submitters = common::opt("--submitters", 16) as usize;
    let rounds = common::opt("--rounds", 50) as usize;
    let seconds = common::opt("--seconds", 10);
    let tls = args.iter().any(|a| a == "--tls");
    let isolation = !args.iter().any(|a| a == "--no-isolation");
    let note_waits = !args.iter().any(|a| a == "--no-wait-notes");
    let gpus = 8;
    // The image phase's registry and image, where the tools are here.
    let registry = (isolation && !args.iter().any(|a| a == "--no-images") && muster_testkit::registry::tools())
        .then(|| muster_testkit::registry::TestRegistry::start(false));
    let image = registry.as_ref().map(|r| {
        let digest = r.push("busybox", "1", false);
        format!("{}/test/busybox:1@{digest}", r.host())
    });

    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig {
        agents,
        gpus_per_agent: gpus,
        insecure: !tls,
        http_port: Some(0),
        isolation,
        note_waits,
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_muster"))),
        images: image.as_ref().map(|_| muster_local::LocalImages { cache_max_bytes: 1 << 30, ..Default::default() }),
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let mut c = AllocationServiceClient::new(cluster.leader_channel().await);
    // Every agent registered before the clock starts.
    let nodes = muster_proto::v1::node_service_client::NodeServiceClient::new(cluster.leader_channel().await);
    loop {
        let n = nodes
            .clone()
            .list_nodes(v1::ListNodesRequest { page_size: 1000, ..Default::default() })
            .await
            .map(|r| r.into_inner().nodes.len());
        if n.is_ok_and(|n| n == agents as usize) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Whether the agents really contain their tasks (they fall back to
    // none, labelled so, where this machine has no cgroups for them).
    let contained = cluster.leader_channel().await.clone();
    let labels = muster_proto::v1::node_service_client::NodeServiceClient::new(contained)
        .list_nodes(v1::ListNodesRequest { page_size: 1000, ..Default::default() })
        .await
        .map(|r| {
            r.into_inner().nodes.iter().filter_map(|n| n.labels.get("muster.isolation").cloned()).collect::<Vec<_>>()
        })
        .unwrap_or_default();
    println!(
        "four-task gangs of `true`, one 8-GPU node per task, {agents} agents, {}, tasks contained: {}, wait notes: {}",
        if tls { "mutual TLS" } else { "insecure" },
        labels.first().map_or("unknown", String::as_str),
        if note_waits { "on" } else { "off" }
    );
    println!("(Slurm's 18.9 gangs/s is another machine's reference; only a peer in the same run is a ratio)");
    // Warm up: connections, the first spawn.
    for _ in 0..3 {
        one(&mut c, gpus).await;
    }

    let http = leader_http(&cluster);
    let before = http.map(Costs::scrape).unwrap_or_default();
    let mut idle = Vec::new();
    for _ in 0..rounds {
        if let Some(d) = one(&mut c, gpus).await {
            idle.push(d);
        }
    }
    latencies("idle", &idle);
    if let Some(h) = http {
        println!("       {}", Costs::scrape(h).per_gang(before, idle.len()));
    }

    let before = http.map(Costs::scrape).unwrap_or_default();
    let leading = leadership(&cluster);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let probe = common::DiskProbe::start(dir.path(), started);
    let mut workers = Vec::new();
    for _ in 0..submitters {
        let mut c = c.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(d) = one(&mut c, gpus).await {
                    done.push(d);
                }
            }
            done
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut loaded = Vec::new();
    for w in workers {
        loaded.extend(w.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let disk = probe.finish();
    println!(
        "load   {submitters} submitters: {} gangs completed in {elapsed:.1} s = {:.1} gangs/s",
        loaded.len(),
        loaded.len() as f64 / elapsed
    );
    let n = loaded.len();
    latencies("load", &loaded);
    if let Some((gap, at)) = longest_gap(started, &loaded) {
        println!(
            "       longest time with no gang finishing: {:.1} ms, from +{:.2} s",
            gap.as_secs_f64() * 1e3,
            at.as_secs_f64()
        );
    }
    let after = http.map(Costs::scrape);
    if let Some(after) = after {
        println!("       {}", after.slow_since(before));
    }
    println!("       {disk}");
    match leadership(&cluster) {
        now if now == leading => {
            if let Some(after) = after {
                println!("       {}", after.per_gang(before, n));
            }
            println!("       one leader throughout (replica {}, term {})", leading.0, leading.1);
        }
        // An election under load: the old leader's counters tell only part.
        now => println!(
            "       leadership moved during the load: replica {} in term {} -> replica {} in term {}",
            leading.0, leading.1, now.0, now.1
        ),
    }
    if let Some(image) = &image {
        image_phase(&mut c, gpus, agents, rounds, image).await;
    }
    cluster.shutdown().await;
}

/// Gangs from a cached image against the same gangs without one, one at a
/// time, alternating, in the same run.
async fn image_phase(c: &mut AllocationServiceClient<Channel>, gpus: u32, agents: u32, rounds: usize, image: &str) {
    // Every node pulls it: as many gangs at once as fill the nodes, twice.
    for _ in 0..2 {
        let warm: Vec<_> = (0..agents / 4)
            .map(|_| {
                let (mut c, image) = (c.clone(), image.to_string());
                tokio::spawn(async move { one_of(&mut c, gpus, &image).await })
            })
            .collect();
        for w in warm {
            if w.await.unwrap().is_none() {
                println!("image  a warm-up gang from the image did not succeed");
                return;
            }
        }
    }
    let (mut plain, mut in_image) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        plain.extend(one_of(c, gpus, "").await);
        in_image.extend(one_of(c, gpus, image).await);
    }
    println!("image  {image}, cached on every node; alternating with the same gangs without an image:");
    latencies("plain", &plain);
    latencies("image", &in_image);
    let p50 = |v: &[Timeline]| {
        let mut d: Vec<Duration> = v.iter().filter_map(Timeline::all_running).collect();
        d.sort();
        (!d.is_empty()).then(|| pct(&d, 0.5))
    };
    // `task_started` comes when the agent has started what runs the task:
    // for an image, the container's helper, before its mounts. Its end
    // includes the whole container (set-up, the command, tear-down).
    let done = |v: &[Timeline]| {
        let mut d: Vec<Duration> = v.iter().filter_map(|t| t.done).collect();
        d.sort();
        (!d.is_empty()).then(|| (pct(&d, 0.5), pct(&d, 0.99)))
    };
    if let (Some(a), Some(b)) = (p50(&plain), p50(&in_image)) {
        println!("       the image adds {:.1} ms at p50 (submit -> all 4 running)", b - a);
    }
    if let (Some(a), Some(b)) = (done(&plain), done(&in_image)) {
        println!(
            "       submit -> done: plain p50 {:.1} ms p99 {:.1} ms; image p50 {:.1} ms p99 {:.1} ms; the image adds \
             {:.1} ms at p50",
            a.0,
            a.1,
            b.0,
            b.1,
            b.0 - a.0
        );
    }
}
