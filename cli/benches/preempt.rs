//! Preemption latency with real agents: a local cluster (three replicas,
//! four agents of 8 fake GPUs, real processes) full of class-2 work that
//! cannot checkpoint, and a class-8 whole-node job submitted into it with a
//! zero preemption grace. Measures submit → the preemptor's task running,
//! over N rounds (each round cancels the preemptor and waits for the
//! victim to run again), with and without mutual TLS.
//!
//! Run: `cargo bench -p muster --bench preempt` (options after `--`:
//! `--rounds N`, default 20). The figure to compare is Slurm's 2.65 s for
//! the same experiment on the same kind of machine (`../shared/peers/`);
//! only a peer measured in the same run on the same machine is a ratio.

mod common;

use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use tonic::transport::Channel;

fn job(class: u32, checkpoint: v1::CheckpointMode, command: &str) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "bench".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: class,
        checkpoint: checkpoint as i32,
        command: vec!["sh".into(), "-c".into(), command.into()],
        ..Default::default()
    }
}

async fn submit(c: &mut AllocationServiceClient<Channel>, spec: v1::AllocationSpec) -> u64 {
    c.submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .id
}

async fn status(c: &mut AllocationServiceClient<Channel>, id: u64) -> v1::Allocation {
    loop {
        if let Ok(r) = c.get(v1::GetRequest { id }).await {
            return r.into_inner();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls every 2 ms until task 0 runs.
async fn until_running(c: &mut AllocationServiceClient<Channel>, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let a = status(c, id).await;
        if a.tasks.first().is_some_and(|t| t.status == v1::TaskStatus::Running as i32) {
            return;
        }
        assert!(Instant::now() < deadline, "allocation {id} never ran: {a:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn run(insecure: bool, rounds: usize) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig {
        heartbeat: Duration::from_millis(500),
        preemption: muster_scheduler::policy::PreemptionConfig { min_runtime_ms: 0, grace_ms: 0, ..Default::default() },
        insecure,
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let mut c = AllocationServiceClient::new(cluster.leader_channel().await);
    // Fill every node with class-2 work that cannot checkpoint.
    let mut victims = Vec::new();
    for _ in 0..4 {
        let id = submit(&mut c, job(2, v1::CheckpointMode::None, "exec sleep 600")).await;
        victims.push(id);
    }
    for &v in &victims {
        until_running(&mut c, v).await;
    }
    let mut took = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let id = submit(&mut c, job(8, v1::CheckpointMode::None, "exec sleep 600")).await;
        until_running(&mut c, id).await;
        took.push(t.elapsed().as_secs_f64() * 1e3);
        // Give the node back; the suspended victim runs again.
        c.cancel(v1::CancelRequest { id, ..Default::default() }).await.unwrap();
        for &v in &victims {
            until_running(&mut c, v).await;
        }
    }
    cluster.shutdown().await;
    took
}

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let p = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    println!(
        "{name:<12} n={:<3} p50 {:>7.1} ms  p90 {:>7.1} ms  min {:>7.1} ms  max {:>7.1} ms",
        ms.len(),
        p(0.5),
        p(0.9),
        ms[0],
        ms[ms.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = common::opt("--rounds", 20) as usize;
    println!("class-8 job into a full cluster of class-2 checkpoint-none work, grace 0: submit -> running");
    println!("(a ratio counts only against a peer measured in the same run on the same machine)");
    summary("insecure", run(true, rounds).await);
    summary("mutual TLS", run(false, rounds).await);
}
