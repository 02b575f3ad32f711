//! Job arrays end to end: a local cluster (three replicas, N agents of 8
//! fake GPUs each, real child processes) runs one-GPU elements of `true`.
//!
//! - **throughput**: E elements as one array (one submit call), against
//!   the same E jobs submitted one by one by 16 concurrent gRPC
//!   submitters, in the same run and on the same cluster, alternating
//!   which goes first. Each is timed from the first submit to the last
//!   element ending (read from the leader's applied state); elements per
//!   second.
//! - **size**: on a cluster with no agents (nothing runs, so elements stay
//!   pending), one array of B elements: the submit call's latency, the
//!   snapshot's growth and the process's resident memory before and after
//!   (three replicas share this process), against an array of
//!   `ARRAY_WINDOW + 1` elements, which materialises the same window: the
//!   difference is what the pending elements cost.
//!
//! Run: `cargo bench -p muster --bench arrays`. Options after `--`:
//! `--agents N` (16), `--elements E` (10000), `--runs R` (2), `--big B`
//! (100000), `--no-isolation`.
//!
//! Slurm's high-throughput guide states about 500 simple jobs/s on its
//! machine: a reference, not a same-run ratio.

mod common;

use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::transport::Channel;

fn element() -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "bench".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 100, cpus: 1 }),
        command: vec!["true".into()],
        ports: Some(0),
        ..Default::default()
    }
}

/// The resident memory of this process, bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether every id in `ids` has ended, on the leader's applied state.
fn all_ended(cluster: &LocalCluster, check: &dyn Fn(&muster_scheduler::sm::State) -> bool) -> bool {
    let Some(id) = cluster.leader_id() else { return false };
    cluster.replica(id).is_some_and(|r| r.reader().read(check))
}

async fn wait_until(cluster: &LocalCluster, check: &dyn Fn(&muster_scheduler::sm::State) -> bool) {
    while !all_ended(cluster, check) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One array of `n` elements: elements per second, first submit to last end.
async fn as_array(cluster: &LocalCluster, c: &mut AllocationServiceClient<Channel>, n: u64) -> f64 {
    let t0 = Instant::now();
    let resp = c
        .submit(v1::SubmitRequest { spec: Some(element()), array: format!("0-{}", n - 1), ..Default::default() })
        .await
        .expect("the array is accepted")
        .into_inner();
    let array = resp.id;
    wait_until(cluster, &|st| st.array(array).is_some_and(|a| a.finished_at_ms.is_some())).await;
    let s = t0.elapsed().as_secs_f64();
    let a = cluster.replica(cluster.leader_id().unwrap()).unwrap().reader().read(|st| st.array(array).cloned());
    let a = a.unwrap();
    assert_eq!(a.done, n, "every element done: {a:?}");
    n as f64 / s
}

/// The same `n` jobs submitted one by one by `submitters` concurrent
/// callers: jobs per second, first submit to last end.
async fn one_by_one(
    cluster: &LocalCluster,
    c: &AllocationServiceClient<Channel>,
    n: u64,
    submitters: u64,
) -> (f64, f64) {
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for w in 0..submitters {
        let mut c = c.clone();
        let share = n / submitters + u64::from(w < n % submitters);
        workers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                let id = c
                    .submit(v1::SubmitRequest { spec: Some(element()), ..Default::default() })
                    .await
                    .expect("the submit is accepted")
                    .into_inner()
                    .id;
                ids.push(id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for w in workers {
        ids.extend(w.await.unwrap());
    }
    let submitted = t0.elapsed().as_secs_f64();
    ids.sort_unstable();
    let (first, last) = (ids[0], *ids.last().unwrap());
    wait_until(cluster, &|st| {
        st.allocs().range(first..=last).all(|(_, a)| a.status.is_terminal())
            && (first..=last).all(|id| st.alloc(id).is_some() || st.was_forgotten(id))
    })
    .await;
    (n as f64 / t0.elapsed().as_secs_f64(), n as f64 / submitted)
}

/// The submit latency, snapshot bytes and RSS growth of one `n`-element
/// array on a cluster where nothing runs.
async fn size_of(dir: &std::path::Path, n: u64) -> (Duration, u64, i64) {
    let cfg = LocalConfig { agents: 0, insecure: true, ..LocalConfig::default() };
    let cluster = LocalCluster::start(dir, cfg).await.unwrap();
    let mut c = AllocationServiceClient::new(cluster.leader_channel().await);
    let leader = || cluster.replica(cluster.leader_id().unwrap()).unwrap();
    // Queue it even though no node is registered.
    let req = |array: String| v1::SubmitRequest {
        spec: Some(element()),
        array,
        queue_if_unsatisfiable: true,
        ..Default::default()
    };
    // Warm the connection and the leader with a one-element array.
    c.submit(req("0".into())).await.unwrap();
    let snapshot_before = leader().reader().read(|st| st.to_snapshot().len() as u64);
    let rss_before = rss_bytes();
    let t0 = Instant::now();
    c.submit(req(format!("0-{}", n - 1))).await.unwrap();
    let latency = t0.elapsed();
    // Every replica applied it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let snapshot = leader().reader().read(|st| st.to_snapshot().len() as u64) - snapshot_before;
    let rss = rss_bytes() as i64 - rss_before as i64;
    cluster.shutdown().await;
    (latency, snapshot, rss)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let agents = common::opt("--agents", 16) as u32;
    let elements = common::opt("--elements", 10_000);
    let runs = common::opt("--runs", 2);
    let big = common::opt("--big", 100_000);
    let isolation = !args.iter().any(|a| a == "--no-isolation");
    let window = muster_scheduler::sm::ARRAY_WINDOW;

    // Size first, on clusters with no agents.
    for n in [window + 1, big, window + 1, big] {
        let dir = tempfile::tempdir().unwrap();
        let (latency, snapshot, rss) = size_of(dir.path(), n).await;
        println!(
            "array of {n:>7} elements, nothing running: submit {:.1} ms, snapshot +{snapshot} bytes, process RSS \
             {rss:+} bytes (three replicas)",
            latency.as_secs_f64() * 1e3
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig { agents, gpus_per_agent: 8, insecure: true, isolation, ..LocalConfig::default() };
    let cluster = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let mut c = AllocationServiceClient::new(cluster.leader_channel().await);
    while !all_ended(&cluster, &|st| {
        st.nodes().iter().filter(|n| n.status.as_str() == "ready").count() == agents as usize
    }) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{elements} one-GPU elements of `true` through {agents} agents x 8 GPUs, tasks contained: {isolation}; \
         16 submitters for one by one"
    );
    println!("(Slurm's ~500 jobs/s is another machine's reference; only a peer in the same run is a ratio)");
    // Warm up: connections, the first spawns.
    as_array(&cluster, &mut c, 64).await;
    for run in 0..runs {
        let mut line = Vec::new();
        for first_array in [run % 2 == 0, run % 2 != 0] {
            if first_array {
                let rate = as_array(&cluster, &mut c, elements).await;
                line.push(format!("array {rate:.0} elements/s"));
            } else {
                let (rate, submits) = one_by_one(&cluster, &c, elements, 16).await;
                line.push(format!("one by one {rate:.0} jobs/s (submits {submits:.0}/s)"));
            }
        }
        println!("run {}: {}", run + 1, line.join("; "));
    }
    cluster.shutdown().await;
}
