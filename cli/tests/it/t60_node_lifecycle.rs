//! Node lifecycle end to end: real replicas, real agents, real shell
//! processes. Drain a node with a running task (nothing new lands there, the
//! task finishes, the node stops); cancel a drain (scheduling resumes); time
//! a drain out (the task checkpoints and resumes elsewhere); retry a failing
//! task on its draining node; and keep a drain's deadline across a leader
//! kill.

use std::time::Duration;

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::node_service_client::NodeServiceClient;
use muster_scheduler::policy::PreemptionConfig;

use crate::cluster::{WAIT, channel};
use crate::t26_e2e::{get, leader_client, status, submit, until};

fn config(agents: u32) -> LocalConfig {
    LocalConfig {
        preemption: PreemptionConfig {
            checkpoint_timeout_ms: 10_000,
            max_deferral_ms: 4_000,
            grace_ms: 2_000,
            ..PreemptionConfig::default()
        },
        ..crate::tls::quick_cluster(agents, Duration::from_secs(2))
    }
}

async fn nodes(c: &LocalCluster) -> NodeServiceClient<tonic::transport::Channel> {
    let ch = muster_testkit::eventually_async("a leader", WAIT, || async {
        match c.leader_id() {
            Some(id) => channel(&c.scheduler_addrs()[id as usize - 1]).await,
            None => None,
        }
    })
    .await;
    NodeServiceClient::new(ch)
}

async fn node(c: &LocalCluster, id: &str) -> v1::Node {
    muster_testkit::eventually_async(&format!("node {id} to be read"), WAIT, || async {
        match nodes(c).await.get_node(v1::GetNodeRequest { id: id.into() }).await {
            Ok(r) => Ok(r.into_inner()),
            Err(e) => Err(format!("get node {id}: {e}")),
        }
    })
    .await
}

fn node_status(n: &v1::Node) -> v1::NodeStatus {
    v1::NodeStatus::try_from(n.status).unwrap()
}

async fn until_node(c: &LocalCluster, id: &str, want: v1::NodeStatus) -> v1::Node {
    muster_testkit::eventually_async(&format!("node {id} to be {want:?}"), WAIT, || async {
        let n = node(c, id).await;
        if node_status(&n) == want { Ok(n) } else { Err(format!("{n:?}")) }
    })
    .await
}

fn kinds(n: &v1::Node) -> Vec<&str> {
    n.events.iter().map(|e| e.kind.as_str()).collect()
}

/// One task of 8 GPUs (a whole node).
fn job(script: &str, max_retries: u32, checkpoint: bool) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        max_retries,
        checkpoint: if checkpoint { v1::CheckpointMode::Auto } else { v1::CheckpointMode::None } as i32,
        checkpoint_estimate_s: 10,
        ..Default::default()
    }
}

fn drain(id: &str, timeout_ms: u64) -> v1::DrainNodeRequest {
    v1::DrainNodeRequest { id: id.into(), timeout_ms: Some(timeout_ms), reason: "e2e".into(), by: "tester".into() }
}

fn action(id: &str) -> v1::NodeActionRequest {
    v1::NodeActionRequest { id: id.into(), reason: String::new(), by: "tester".into() }
}

fn index(node: &str) -> u32 {
    node.trim_start_matches("node-").parse::<u32>().unwrap() - 1
}

fn other(node: &str) -> &'static str {
    if node == "node-1" { "node-2" } else { "node-1" }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t99_a_drained_node_finishes_its_task_takes_nothing_new_stops_and_a_cancelled_drain_resumes_scheduling() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config(2)).await.unwrap();
    let a = submit(&c, job("sleep 4; echo a done", 1, false)).await;
    let running = until(&c, a, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let x = running.tasks[0].node_id.clone();
    let y = other(&x);
    let drained = nodes(&c).await.drain_node(drain(&x, 60_000)).await.unwrap().into_inner();
    assert_eq!(node_status(&drained), v1::NodeStatus::Draining);
    // `by` is the caller's certificate identity, with the request's word appended.
    assert_eq!(drained.drain.as_ref().map(|d| d.by.as_str()), Some("admin dev for tester"));
    // Draining again is refused, naming the status (the seed's 409).
    let again = nodes(&c).await.drain_node(drain(&x, 60_000)).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert!(again.message().contains("is draining: cannot drain (allowed from ready)"), "{again:?}");

    // New whole-node work lands on the other node only, while the drained
    // node's task keeps running.
    for _ in 0..2 {
        let b = submit(&c, job("echo b", 1, false)).await;
        let done = until(&c, b, "done", |x| status(x) == v1::AllocationStatus::Done).await;
        assert_eq!(done.tasks[0].last_node_id, y, "nothing new on the draining node");
    }
    // The task finishes; the node stops, and its agent knows.
    let done = until(&c, a, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    assert_eq!((done.tasks[0].runs, done.tasks[0].last_node_id.as_str()), (1, x.as_str()));
    let stopped = until_node(&c, &x, v1::NodeStatus::Stopped).await;
    let k = kinds(&stopped);
    assert!(k.ends_with(&["drain_started", "drain_completed", "node_stopped"]), "{k:?}");
    assert!(stopped.drain.is_none());
    let status_file = c.agent_dir(index(&x)).join(muster_agent::agent::NODE_STATUS_FILE);
    muster_testkit::eventually("the agent to be told its node stopped", WAIT, || {
        (std::fs::read_to_string(&status_file).unwrap_or_default() == "stopped\n").then_some(())
    })
    .await;

    // Restart it; stop the other (empty) node; then drain and cancel.
    nodes(&c).await.restart_node(action(&x)).await.unwrap();
    until_node(&c, &x, v1::NodeStatus::Ready).await;
    nodes(&c).await.stop_node(action(y)).await.unwrap();
    let long = submit(&c, job("trap 'exit 143' TERM; sleep 600 & wait", 1, false)).await;
    let mut half = job("echo waited", 1, false);
    half.resources = Some(v1::Resources { gpus: 0, vram_mb: 0, mem_mb: 1_000, cpus: 1 });
    until(&c, long, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    nodes(&c).await.drain_node(drain(&x, 60_000)).await.unwrap();
    let waiting = submit(&c, half).await;
    // Three admission passes that began after the submit was applied have
    // run, their commands applied (one more than that: a pass may have been
    // under way as the count was read): none placed it on the draining node.
    let leader = c.leader_id().expect("a leader");
    let passes = || c.replica(leader).map_or(0, |r| r.admission_passes());
    let before = passes();
    muster_testkit::eventually("three admission passes after the submit", WAIT, || {
        (passes() >= before + 4).then_some(())
    })
    .await;
    assert_eq!(status(&get(&c, waiting).await), v1::AllocationStatus::Queued, "nothing lands on a draining node");
    let explained = leader_client(&c).await.explain(v1::GetRequest { id: waiting }).await.unwrap().into_inner();
    assert!(explained.classes.iter().any(|k| k.reason.starts_with("draining")), "{explained:?}");
    let cancelled = nodes(&c).await.cancel_drain(action(&x)).await.unwrap().into_inner();
    assert_eq!(node_status(&cancelled), v1::NodeStatus::Ready);
    assert_eq!(
        cancelled.events.last().map(|e| e.detail.as_str()),
        Some(&*format!("drain of node {x} cancelled by admin dev for tester"))
    );
    let done = until(&c, waiting, "done after the cancel", |x| status(x) == v1::AllocationStatus::Done).await;
    assert_eq!(done.tasks[0].last_node_id, x);
    leader_client(&c).await.cancel(v1::CancelRequest { id: long, ..Default::default() }).await.unwrap();
    c.shutdown().await;
}

/// A training loop that answers a checkpoint hint and resumes from its step.
const TRAINER: &str = r#"
step=0
if [ "$MUSTER_RESUME" = 1 ]; then step=$(cat "$MUSTER_CHECKPOINT_DIR/step"); echo "resumed from $step"; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; echo "checkpointed at $step"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
while [ $step -lt 150 ]; do
  step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID; sleep 0.1
done
echo "finished at $step"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t204_at_the_drain_deadline_the_task_checkpoints_and_resumes_on_another_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config(2)).await.unwrap();
    let id = submit(&c, job(TRAINER, 3, true)).await;
    let running = until(&c, id, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let x = running.tasks[0].node_id.clone();
    nodes(&c).await.drain_node(drain(&x, 5_000)).await.unwrap();
    let stopped = until_node(&c, &x, v1::NodeStatus::Stopped).await;
    let k = kinds(&stopped);
    assert!(k.ends_with(&["drain_started", "drain_timed_out", "node_stopped"]), "{k:?}");
    let done = until(&c, id, "done elsewhere", |x| status(x) == v1::AllocationStatus::Done).await;
    let t = &done.tasks[0];
    assert_eq!((done.preempted_count, t.runs, t.attempts), (1, 2, 1), "moved, not charged: {done:?}");
    assert_eq!(t.last_node_id, other(&x));
    let first =
        std::fs::read_to_string(c.agent_dir(index(&x)).join(format!("logs/alloc-{id}/task-0/attempt-1.out"))).unwrap();
    let saved: u32 = first
        .lines()
        .find_map(|l| l.strip_prefix("checkpointed at "))
        .unwrap_or_else(|| panic!("never checkpointed: {first}"))
        .parse()
        .unwrap();
    let second =
        std::fs::read_to_string(c.agent_dir(index(other(&x))).join(format!("logs/alloc-{id}/task-0/attempt-2.out")))
            .unwrap();
    assert!(second.starts_with(&format!("resumed from {saved}\n")), "{second}");
    assert!(second.ends_with("finished at 150\n"), "{second}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t205_a_failing_task_retries_on_its_draining_node_three_times() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config(2)).await.unwrap();
    // Waits for a release file in its node's work dir, then fails: the first
    // attempt fails once the node drains; the next ones fail at once; on the
    // other node (no file) it waits.
    // Each attempt exits with its own code, so the fast failures are not
    // the same failure twice (which would fail the job at once).
    let script =
        "while [ ! -f release-$MUSTER_ALLOC_ID ]; do sleep 0.1; done; echo failing; exit $((2 + MUSTER_ATTEMPT))";
    let id = submit(&c, job(script, 6, false)).await;
    let running = until(&c, id, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let x = running.tasks[0].node_id.clone();
    nodes(&c).await.drain_node(drain(&x, 600_000)).await.unwrap();
    std::fs::write(c.agent_dir(index(&x)).join(format!("release-{id}")), "").unwrap();
    let moved = until(&c, id, "running on the other node", |a| {
        status(a) == v1::AllocationStatus::Running && a.tasks[0].last_node_id == other(&x)
    })
    .await;
    assert_eq!((moved.tasks[0].runs, moved.tasks[0].attempts), (5, 5), "{moved:?}");
    for attempt in 1..=4 {
        let log = c.agent_dir(index(&x)).join(format!("logs/alloc-{id}/task-0/attempt-{attempt}.out"));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "failing\n", "attempt {attempt} ran on {x}");
    }
    let stopped = until_node(&c, &x, v1::NodeStatus::Stopped).await;
    assert!(kinds(&stopped).ends_with(&["drain_started", "drain_completed", "node_stopped"]), "{stopped:?}");
    leader_client(&c).await.cancel(v1::CancelRequest { id, ..Default::default() }).await.unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t206_a_leader_kill_during_a_drain_keeps_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(dir.path(), config(2)).await.unwrap();
    let id = submit(&c, job("trap 'exit 143' TERM; sleep 600 & wait", 3, false)).await;
    let running = until(&c, id, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let x = running.tasks[0].node_id.clone();
    let drained = nodes(&c).await.drain_node(drain(&x, 10_000)).await.unwrap().into_inner();
    let d = drained.drain.unwrap();
    assert_eq!(d.deadline_ms, d.started_at_ms + 10_000);
    // Six seconds in, the leader dies; a new one takes over the drain.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let old = c.leader_id().unwrap();
    c.stop_replica(old).await;
    muster_testkit::eventually("a new leader", WAIT, || c.leader_id().is_some_and(|l| l != old).then_some(())).await;
    let kept = node(&c, &x).await;
    if let Some(now) = &kept.drain {
        assert_eq!(now.deadline_ms, d.deadline_ms, "the deadline is replicated, not restarted");
    }
    let stopped = until_node(&c, &x, v1::NodeStatus::Stopped).await;
    let timed_out = stopped.events.iter().find(|e| e.kind == "drain_timed_out").expect("timed out");
    // At the original deadline (a deadline restarted by the new leader would
    // come ten seconds after the kill, past deadline + 5 s).
    assert!(timed_out.time_ms >= d.deadline_ms, "{timed_out:?} before {}", d.deadline_ms);
    assert!(timed_out.time_ms < d.deadline_ms + 5_000, "{timed_out:?} long after {}", d.deadline_ms);
    let moved = until(&c, id, "running elsewhere", |a| {
        status(a) == v1::AllocationStatus::Running && a.tasks[0].last_node_id == other(&x)
    })
    .await;
    assert_eq!(moved.tasks[0].runs, 2);
    leader_client(&c).await.cancel(v1::CancelRequest { id, ..Default::default() }).await.unwrap();
    c.restart_replica(old).await.unwrap();
    c.shutdown().await;
}

/// The operator's side, through the `muster` CLI against a real `muster
/// server` and real `muster agent` processes: drain (the node's label gives
/// the deadline), a refused second drain, cancel-drain, scale-down (dry run,
/// then for real: the idle node goes first and its agent exits when
/// stopped), a drain timed out from the CLI, terminate, restart, the errors,
/// and the metrics.
#[test]
fn t207_node_lifecycle_from_the_cli() {
    use crate::{Procs, muster, scrape};

    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", crate::cluster::free_port());
    let metrics = format!("127.0.0.1:{}", crate::cluster::free_port());
    let mut procs = Procs::start_with(
        dir.path(),
        &addr,
        &["--metrics", &metrics, "--agent-heartbeat-ms", "500", "--preempt-grace-ms", "1000"],
        &["a1", "a2"],
        &["--exit-when-stopped"],
    );
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        let o = muster(&all);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let (ok, out, err) = run(args);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    let refused = |args: &[&str], needle: &str| {
        let (ok, _, err) = run(args);
        assert!(!ok && err.contains(needle), "{args:?} should fail with {needle:?}: {err}");
    };
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        muster_testkit::eventually_blocking(what, WAIT, || f().then_some(()));
    };
    let node_status = |id: &str| json(&["node", "get", id])["status"].as_str().unwrap().to_string();
    // The drain-timeout label is reserved: an admin sets it (here before
    // the server may even lead, so retried), never the agent.
    wait("the drain-timeout labels set", &|| {
        ["a1", "a2"].iter().all(|n| run(&["node", "label", n, "muster.drain-timeout=20m"]).0)
    });
    wait("two ready nodes", &|| {
        let (ok, out, _) = run(&["node", "list"]);
        ok && serde_json::from_str::<serde_json::Value>(&out)
            .is_ok_and(|v| v["nodes"].as_array().unwrap().iter().filter(|n| n["status"] == "ready").count() == 2)
    });

    // A whole-node task that answers a checkpoint hint by exiting.
    let id = muster_testkit::eventually_blocking("the submit to succeed", WAIT, || {
        let o = muster(&[
            "submit",
            "--gpus",
            "2",
            "--idempotency-key",
            "t207",
            "--scheduler",
            &addr,
            "--output",
            "json",
            "--",
            "sleep",
            "600",
        ]);
        if o.status.success() {
            Ok(serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap().to_string())
        } else {
            Err(String::from_utf8_lossy(&o.stderr).into_owned())
        }
    });
    let x = muster_testkit::eventually_blocking("the task to run", WAIT, || {
        let a = json(&["alloc", "get", &id]);
        if a["status"] == "running" {
            Ok(a["tasks"][0]["node"].as_str().unwrap().to_string())
        } else {
            Err(a.to_string())
        }
    });
    let (xi, y) = if x == "a1" { (0, "a2") } else { (1, "a1") };

    let n = json(&["node", "drain", &x, "--reason", "kernel upgrade", "--by", "alice"]);
    assert_eq!(n["status"], "draining", "{n}");
    let d = &n["drain"];
    assert_eq!((d["by"].as_str(), d["reason"].as_str()), (Some("admin dev for alice"), Some("kernel upgrade")));
    assert_eq!(
        d["deadline_ms"].as_u64().unwrap() - d["started_at_ms"].as_u64().unwrap(),
        20 * 60 * 1000,
        "the label's 20m"
    );
    refused(&["node", "drain", &x], &format!("refused: node {x} is draining: cannot drain (allowed from ready)"));
    let n = json(&["node", "cancel-drain", &x, "--by", "bob"]);
    assert_eq!(n["status"], "ready");
    assert_eq!(n["events"].as_array().unwrap().last().unwrap()["kind"], "drain_cancelled");
    refused(&["node", "cancel-drain", &x], "cannot cancel a drain (allowed from draining)");

    // Scale-down: the idle node first; a dry run changes nothing.
    let plan = json(&["node", "scale-down", "--count", "2", "--dry-run"]);
    let chosen = plan["chosen"].as_array().unwrap();
    assert_eq!((chosen[0]["id"].as_str(), chosen[0]["idle"].as_bool()), (Some(y), Some(true)), "{plan}");
    assert_eq!((chosen[1]["id"].as_str(), chosen[1]["tasks"].as_u64()), (Some(x.as_str()), Some(1)), "{plan}");
    assert_eq!((node_status(&x), node_status(y)), ("ready".to_string(), "ready".to_string()));
    let done = json(&["node", "scale-down", "--count", "1", "--by", "carol"]);
    assert_eq!((done["chosen"][0]["id"].as_str(), done["chosen"][0]["drained"].as_bool()), (Some(y), Some(true)));
    assert_eq!(node_status(y), "stopped", "an idle node stops at once");
    let yi = 1 - xi;
    let exit = muster_testkit::eventually_blocking("the stopped node's agent to exit", WAIT, || procs.agent_exited(yi));
    assert!(exit.success(), "--exit-when-stopped exits 0: {exit}");

    // A drain that times out from the CLI: the task is moved (nowhere to go
    // now, so it waits queued) and the node stops.
    let n = json(&["node", "drain", &x, "--timeout", "2s"]);
    assert_eq!(n["drain"]["deadline_ms"].as_u64().unwrap() - n["drain"]["started_at_ms"].as_u64().unwrap(), 2_000);
    wait("the timed-out node to stop", &|| node_status(&x) == "stopped");
    let kinds: Vec<String> = json(&["node", "get", &x])["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.ends_with(&["drain_started".into(), "drain_timed_out".into(), "node_stopped".into()]), "{kinds:?}");
    let a = json(&["alloc", "get", &id]);
    assert!(a["status"] == "suspended" || a["status"] == "queued", "moved off the node: {a}");
    assert_eq!(a["preempted_count"], 1, "{a}");

    let text = muster(&["node", "get", &x, "--scheduler", &addr]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("stopped") && text.contains("drain_timed_out"), "{text}");
    assert_eq!(json(&["node", "terminate", &x])["status"], "terminated");
    assert_eq!(json(&["node", "restart", y])["status"], "ready");
    refused(&["node", "restart", &x], "cannot restart (allowed from stopped)");
    refused(&["node", "stop", "nosuch"], "not found: unknown node nosuch");
    refused(&["node", "drain", y, "--timeout", "5x"], "unknown unit");
    refused(&["node", "scale-down", "--count", "0"], "--count must be at least 1");

    // The node-state gauges refresh once a second: poll.
    let needles = [
        "muster_nodes{state=\"terminated\"} 1",
        "muster_nodes{state=\"ready\"} 1",
        "muster_node_drain_timeouts_total 1",
        "muster_node_drain_seconds_count 2",
    ];
    muster_testkit::eventually_blocking("the node-state gauges", Duration::from_secs(30), || {
        let m = scrape(&metrics).unwrap_or_default();
        let missing: Vec<_> = needles.iter().filter(|n| !m.contains(**n)).collect();
        if missing.is_empty() { Ok(()) } else { Err(format!("{missing:?} missing from\n{m}")) }
    });
}
