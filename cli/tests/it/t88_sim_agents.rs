//! Simulated tasks on the real protocol (the fleet bench's agents): real
//! replicas and real `Agent`s, whose executor runs no process
//! (`muster_agent::executor::sim`). Jobs run once each and end done; a
//! preemption's checkpoint hint is answered and the victim's checkpoint is
//! saved and restored.

use std::time::Duration;

use muster_agent::executor::sim::{Durations, SimConfig};
use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;

use crate::t26_e2e::{get, status, submit, until};

fn job(gang_size: u32, gpus: u32, class: u32, command: &[&str]) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "fleet".into(),
        gang_size,
        resources: Some(v1::Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: class,
        command: command.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t232_simulated_agents_run_jobs_once_and_answer_a_preemption_hint() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig {
        durations: Durations::Uniform(Duration::from_millis(100), Duration::from_millis(400)),
        seed: 232,
        term_delay: Duration::from_millis(50),
        hint_reply: Some(Duration::from_millis(100)),
    };
    let cfg = LocalConfig {
        agents: 4,
        sim: Some(sim),
        preemption: muster_core::policy::PreemptionConfig {
            min_runtime_ms: 0,
            ..muster_core::policy::PreemptionConfig::default()
        },
        ..crate::tls::quick_cluster(4, Duration::from_secs(5))
    };
    let cluster = LocalCluster::start(dir.path(), cfg).await.unwrap();
    // 24 one-GPU jobs with drawn run times, and 3 gangs of four whole nodes.
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(submit(&cluster, job(1, 1, 0, &["train"])).await);
    }
    for _ in 0..3 {
        ids.push(submit(&cluster, job(4, 8, 0, &["sleep", "0.2"])).await);
    }
    for &id in &ids {
        let a = until(&cluster, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
        assert!(a.tasks.iter().all(|t| t.attempts == 1 && t.exit_code == Some(0)), "ran once each: {a:?}");
    }

    // A class-1 checkpointing gang holds every node until a class-8 gang
    // preempts it: the hint is answered, the checkpoint saved, and the
    // victim resumes from it once the class-8 gang is done.
    let mut victim = job(4, 8, 1, &["sleep", "600"]);
    victim.checkpoint = v1::CheckpointMode::Auto as i32;
    let victim = submit(&cluster, victim).await;
    until(&cluster, victim, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let urgent = submit(&cluster, job(4, 8, 8, &["sleep", "0.3"])).await;
    until(&cluster, urgent, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    let resumed = until(&cluster, victim, "running again", |a| {
        status(a) == v1::AllocationStatus::Running && a.tasks.iter().all(|t| t.runs == 2)
    })
    .await;
    assert!(resumed.tasks.iter().all(|t| t.checkpoint_bytes > 0), "each task saved a checkpoint: {resumed:?}");
    let mut client = v1::allocation_service_client::AllocationServiceClient::new(cluster.leader_channel().await);
    let mut events = client.watch(v1::WatchRequest { id: victim, from_revision: 0 }).await.unwrap().into_inner();
    let mut kinds = Vec::new();
    while let Ok(Ok(Some(e))) = tokio::time::timeout(Duration::from_secs(2), events.message()).await {
        assert!(!e.detail.contains("did not checkpoint"), "{}", e.detail);
        kinds.push(e.kind);
    }
    for kind in ["preemption_started", "checkpoint_saved", "task_preempted", "preemption_completed"] {
        assert!(kinds.iter().any(|k| k == kind), "{kind}: {kinds:?}");
    }
    client.cancel(v1::CancelRequest { id: victim, ..Default::default() }).await.unwrap();
    until(&cluster, victim, "cancelled", |a| status(a) == v1::AllocationStatus::Cancelled).await;
    let _ = get(&cluster, victim).await;
    cluster.shutdown().await;
}
