//! Watchdogs end to end with real processes: a task that beats and then
//! hangs is stopped after the window plus the confirmation and re-runs on
//! another node; one that hangs every time fails after 3 retries with the
//! reason; one that loads longer than the window before its first beat is
//! left alone; one that outlives its walltime is stopped by the budget.

use std::time::{Duration, Instant};

use muster_agent::watchdog::WatchdogConfig;
use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;

use crate::t26_e2e::{get, submit, until};

fn config() -> LocalConfig {
    LocalConfig {
        watchdog: WatchdogConfig {
            poll: Duration::from_millis(200),
            confirm_samples: 3,
            confirm_poll: Duration::from_millis(200),
            gpu_health: false,
            ..WatchdogConfig::default()
        },
        ..crate::tls::quick_cluster(3, Duration::from_secs(1))
    }
}

fn job(script: &str, stall_timeout_s: u32, walltime_s: u64) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        stall_timeout_s,
        walltime_s,
        max_retries: 3,
        ..Default::default()
    }
}

fn status(a: &v1::Allocation) -> v1::AllocationStatus {
    v1::AllocationStatus::try_from(a.status).unwrap()
}

fn stderr_log(c: &LocalCluster, node: &str, id: u64, attempt: u32) -> String {
    let i = node.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    std::fs::read_to_string(c.agent_dir(i).join(format!("logs/alloc-{id}/task-0/attempt-{attempt}.err")))
        .unwrap_or_default()
}

/// Beats three times, then hangs (no CPU, static memory) on its first run.
const BEATS_THEN_HANGS: &str = r#"
if [ "$MUSTER_ATTEMPT" = 1 ]; then
  for i in 1 2 3; do echo . >> "$MUSTER_PROGRESS_FILE"; sleep 0.2; done
  exec sleep 600
fi
echo . >> "$MUSTER_PROGRESS_FILE"; echo "run $MUSTER_ATTEMPT ok""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t96_a_hung_task_is_stopped_after_window_and_confirmation_and_reruns_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config()).await.unwrap();
    let id = submit(&c, job(BEATS_THEN_HANGS, 2, 3600)).await;
    let first = until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let started = Instant::now();
    let done = until(&c, id, "done after a retry", |a| status(a) == v1::AllocationStatus::Done).await;
    let took = started.elapsed();
    let t = &done.tasks[0];
    assert_eq!((t.watchdog_trips, t.last_watchdog.as_str(), t.runs, t.attempts), (1, "stall", 2, 1), "{t:?}");
    assert_ne!(t.last_node_id, first.tasks[0].node_id, "retried on a different node");
    assert!(took < Duration::from_secs(30), "freed in about window + confirmation, not the walltime: {took:?}");
    let err = stderr_log(&c, &first.tasks[0].node_id, id, 1);
    assert!(err.contains("muster: stopped by the stall watchdog"), "{err}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t202_a_task_that_hangs_every_time_fails_after_three_retries_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config()).await.unwrap();
    let hangs = r#"echo . >> "$MUSTER_PROGRESS_FILE"; exec sleep 600"#;
    let id = submit(&c, job(hangs, 1, 3600)).await;
    let failed = until(&c, id, "failed", |a| status(a) == v1::AllocationStatus::Failed).await;
    let t = &failed.tasks[0];
    assert_eq!((t.watchdog_trips, t.runs), (4, 4), "{t:?}");
    let events = crate::t26_e2e::leader_client(&c)
        .await
        .watch(v1::WatchRequest { id, from_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut events = events;
    let mut reason = String::new();
    while let Ok(Some(e)) = events.message().await {
        if e.kind == "allocation_failed" {
            reason = e.detail;
            break;
        }
    }
    assert_eq!(reason, "task 0 tripped the stall watchdog after 3 retries");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t203_loading_longer_than_the_window_before_the_first_beat_is_not_policed_and_the_budget_is() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config()).await.unwrap();
    // Loads for 4 s (twice the window) before its first beat, then finishes.
    let slow_load = r#"sleep 4; echo . >> "$MUSTER_PROGRESS_FILE"; echo loaded"#;
    let id = submit(&c, job(slow_load, 2, 3600)).await;
    let done = until(&c, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    assert_eq!((done.tasks[0].watchdog_trips, done.tasks[0].runs), (0, 1), "{done:?}");
    // A task that outlives its walltime (2 s) is stopped by the budget.
    let long = submit(&c, job("exec sleep 600", 0, 2)).await;
    let a = until(&c, long, "tripped", |a| a.tasks[0].watchdog_trips >= 1).await;
    assert_eq!(a.tasks[0].last_watchdog, "budget");
    let _ = get(&c, long).await;
    c.shutdown().await;
}
