//! Containment end to end: real replicas, real agents with this machine's
//! cgroups, real processes that escape their process group. Every stop path
//! (cancel, priority preemption, a watchdog, a gang teardown) ends them, and
//! the next job on those GPUs starts only once they are gone.

use std::path::Path;
use std::time::Duration;

use muster_proto::v1;
use muster_scheduler::policy::PreemptionConfig;
use muster_sim::local::{LocalCluster, LocalConfig};

use crate::e2e::{leader_client, status, submit, until};

/// Two nodes of 8 GPUs: a gang of two whole nodes holds every GPU, so the
/// job after it runs on exactly those GPUs.
fn config() -> LocalConfig {
    LocalConfig {
        agents: 2,
        heartbeat: Duration::from_millis(500),
        stop_grace: Duration::from_secs(1),
        preemption: PreemptionConfig { min_runtime_ms: 0, grace_ms: 1_000, ..PreemptionConfig::default() },
        ..crate::tls::local_config()
    }
}

/// Starts a daemon that leaves the task's process group and session
/// (`setsid`) and ignores SIGTERM, records its pid, then waits.
const ESCAPE: &str = r#"
f="$D/escapee-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX-$MUSTER_EPOCH"
setsid sh -c 'trap "" TERM; echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; while :; do sleep 1; done' "$f" &
while [ ! -s "$f" ]; do sleep 0.05; done
"#;

/// Says, for every escapee of allocation $VICTIM (each task's, each run's),
/// whether it still runs (a zombie has stopped running).
const CHECK: &str = r#"
for f in "$D"/escapee-$VICTIM-*; do
  case $f in *.tmp) continue;; esac
  p=$(cat "$f")
  st=$(awk '/^State:/{print $2}' /proc/$p/status 2>/dev/null)
  if [ -n "$st" ] && [ "$st" != Z ]; then echo "escapee $p alive"; else echo "escapee $p gone"; fi
done
"#;

fn spec(script: String, dir: &Path, class: u32, walltime_s: u64, max_retries: u32) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 2,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: class,
        walltime_s,
        max_retries,
        command: vec!["sh".into(), "-c".into(), script],
        env: [("D".to_string(), dir.display().to_string())].into(),
        ..Default::default()
    }
}

fn checker(dir: &Path, victim: u64, class: u32) -> v1::AllocationSpec {
    let mut s = spec(CHECK.to_string(), dir, class, 0, 0);
    s.env.insert("VICTIM".into(), victim.to_string());
    s
}

/// Waits until both of the allocation's first-run escapees have started;
/// with `running`, checks they still run.
async fn escaped(dir: &Path, id: u64, running: bool) -> Vec<i32> {
    let mut pids = Vec::new();
    for t in 0..2 {
        let prefix = format!("escapee-{id}-{t}-");
        let pid = crate::cluster::until_some(&format!("{prefix}* to be written"), Duration::from_millis(50), || {
            let found = std::fs::read_dir(dir).unwrap().flatten().find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with(&prefix) || name.ends_with(".tmp") {
                    return None;
                }
                std::fs::read_to_string(e.path()).ok()?.trim().parse::<i32>().ok()
            });
            async move { found }
        })
        .await;
        pids.push(pid);
    }
    for &p in pids.iter().filter(|_| running) {
        assert!(crate::e2e::proc_alive(p), "escapee {p} runs");
    }
    pids
}

/// Every task's output of a finished allocation.
fn outputs(c: &LocalCluster, a: &v1::Allocation) -> String {
    a.tasks
        .iter()
        .map(|t| {
            let i: u32 = t.last_node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
            let path = c.agent_dir(i).join(format!("logs/alloc-{}/task-{}/attempt-{}.out", a.id, t.index, t.runs));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// The job after the stop saw every escapee gone when it started.
fn saw_them_gone(out: &str, pids: &[i32], how: &str) {
    for p in pids {
        assert!(
            out.contains(&format!("escapee {p} gone")),
            "after {how}, a process of the stopped job still ran when the next started:\n{out}"
        );
    }
    assert!(!out.contains("alive"), "after {how}:\n{out}");
}

/// Issue 46: "a setsid escapee and a double-forked daemon die on cancel, on
/// preemption, on gang teardown and on a watchdog stop; the next job on
/// those GPUs starts only after they are gone."
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t188_no_process_of_a_stopped_job_survives_any_stop_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = LocalCluster::start(d, config()).await.unwrap();

    // Cancel.
    let a = submit(&c, spec(format!("{ESCAPE}exec sleep 600"), d, 0, 0, 0)).await;
    let pids = escaped(d, a, true).await;
    leader_client(&c).await.cancel(v1::CancelRequest { id: a }).await.unwrap();
    let b = submit(&c, checker(d, a, 0)).await;
    let done = until(&c, b, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    saw_them_gone(&outputs(&c, &done), &pids, "a cancel");

    // Priority preemption: the checker is the preemptor.
    let a = submit(&c, spec(format!("{ESCAPE}exec sleep 600"), d, 0, 0, 0)).await;
    until(&c, a, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let pids = escaped(d, a, true).await;
    let b = submit(&c, checker(d, a, 8)).await;
    let done = until(&c, b, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    saw_them_gone(&outputs(&c, &done), &pids, "a preemption");
    leader_client(&c).await.cancel(v1::CancelRequest { id: a }).await.unwrap();
    until(&c, a, "cancelled", |x| status(x) == v1::AllocationStatus::Cancelled).await;

    // The budget watchdog (walltime 3 s).
    let a = submit(&c, spec(format!("{ESCAPE}exec sleep 600"), d, 0, 3, 0)).await;
    let pids = escaped(d, a, true).await;
    let b = submit(&c, checker(d, a, 0)).await;
    let done = until(&c, b, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    saw_them_gone(&outputs(&c, &done), &pids, "a watchdog stop");

    // A gang teardown: task 0 fails once both escapees run, task 1 is torn
    // down, and the gang's second run (on the same GPUs) checks.
    let script = format!(
        r#"if [ "$MUSTER_ATTEMPT" != 1 ]; then VICTIM=$MUSTER_ALLOC_ID; {CHECK} exit 0; fi
{ESCAPE}
if [ "$MUSTER_TASK_INDEX" = 0 ]; then
  while [ ! -s "$D/escapee-$MUSTER_ALLOC_ID-1-$MUSTER_EPOCH" ]; do sleep 0.05; done; exit 1
fi
exec sleep 600"#
    );
    let a = submit(&c, spec(script, d, 0, 0, 2)).await;
    // Task 0 fails as soon as task 1's escapee starts: the teardown may
    // already have ended them.
    let pids = escaped(d, a, false).await;
    let done = until(&c, a, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    saw_them_gone(&outputs(&c, &done), &pids, "a gang teardown");
    c.shutdown().await;
}

/// Issue 46: "a memory hog is OOM-killed at its limit while its neighbour on
/// the same node keeps running; the outcome says oom_killed" — in `alloc
/// get`, the events `alloc watch` follows, `muster history --attempts` (with
/// each attempt's peak memory and CPU time) and `muster usage`. The same OOM
/// twice in a row fails the job; its node is not charged.
#[test]
fn t191_a_memory_hog_is_oom_killed_at_its_limit_and_reads_as_oom_killed_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", crate::cluster::free_port());
    let _procs = crate::Procs::start(dir.path(), &addr, &["--agent-heartbeat-ms", "500"], &["m1"]);
    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        let at = full.iter().position(|a| *a == "--").unwrap_or(full.len());
        full.splice(at..at, ["--scheduler", addr.as_str()]);
        crate::muster(&full)
    };
    let until_ok = |args: &[&str]| crate::history::until_ok(&addr, args);
    let json = |o: std::process::Output| -> serde_json::Value { serde_json::from_slice(&o.stdout).unwrap() };
    // The first value of `get` that `done` accepts.
    let until = |what: &str, get: &dyn Fn() -> serde_json::Value, done: &dyn Fn(&serde_json::Value) -> bool| {
        let seen = std::cell::RefCell::new(serde_json::Value::Null);
        crate::dev_proc::wait_until(what, || {
            *seen.borrow_mut() = get();
            done(&seen.borrow())
        });
        seen.into_inner()
    };
    until_ok(&["submit", "--gpus", "1", "--mem-mb", "64", "--name", "neighbour", "--", "sleep", "600"]);
    let hog = "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n";
    until_ok(&["submit", "--gpus", "1", "--mem-mb", "64", "--name", "hog", "--", "python3", "-c", hog]);
    let failed = until("the hog to fail", &|| json(until_ok(&["alloc", "get", "2", "--output", "json"])), &|a| {
        a["status"] == "failed"
    });
    let reason = failed["failed_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("task 0 ran out of memory at its 64 MiB limit (peak ")
            && reason.ends_with("twice in a row: raise --mem-mb"),
        "{failed:#}"
    );
    let last = &failed["last_failure"];
    assert_eq!(
        (last["oom_killed"].as_bool(), last["memory_limit_bytes"].as_u64()),
        (Some(true), Some(64 << 20)),
        "{failed:#}"
    );
    assert!(last["peak_memory_bytes"].as_u64().unwrap() <= 64 << 20, "{failed:#}");
    assert!(last["stderr_tail"].as_str().unwrap().contains("muster: out of memory"), "{failed:#}");
    let text = String::from_utf8_lossy(&until_ok(&["alloc", "get", "2"]).stdout).into_owned();
    assert!(text.contains("last failure: task 0 attempt 2, out of memory at its 64 MiB limit"), "{text}");
    let watched = run(&["alloc", "watch", "2"]);
    let events = String::from_utf8_lossy(&watched.stdout).into_owned();
    assert_eq!(events.matches("oom_killed").count(), 2, "{events}");
    assert!(events.contains("task 0 attempt 1 on m1: out of memory at its 64 MiB limit"), "{events}");
    // The neighbour on the same node runs on, and the node is ready.
    let neighbour = json(until_ok(&["alloc", "get", "1", "--output", "json"]));
    assert_eq!(neighbour["status"], "running", "{neighbour:#}");
    let node = json(until_ok(&["node", "get", "m1", "--output", "json"]));
    assert_eq!(node["status"], "ready", "{node:#}");

    // The job history keeps each attempt's outcome, peak memory and CPU.
    let history =
        until("the hog's history record", &|| json(until_ok(&["history", "--id", "2", "--output", "json"])), &|h| {
            h.as_array().is_some_and(|l| !l.is_empty())
        });
    let attempts = history[0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{history:#}");
    for a in attempts {
        assert_eq!(a["outcome"], "oom_killed", "{history:#}");
        let u = &a["usage"];
        assert!(u["oom_kills"].as_u64().unwrap() >= 1 && u["memory_limit_bytes"] == 64 << 20, "{history:#}");
        assert!(u["peak_memory_bytes"].as_u64().unwrap() > 32 << 20, "{history:#}");
        assert!(u["cpu_ms"].as_u64().is_some(), "{history:#}");
    }
    let text = String::from_utf8_lossy(&until_ok(&["history", "--id", "2", "--attempts"]).stdout).into_owned();
    assert!(text.contains("oom_killed") && text.contains("out of memory at its 64 MiB limit, peak "), "{text}");
    assert!(text.contains(", cpu "), "{text}");
    let usage = json(until_ok(&["usage", "--by", "owner", "--output", "json"]));
    let row = &usage["rows"][0];
    assert_eq!(row["oom_killed"], 2, "{usage:#}");
    assert!(row["peak_memory_bytes"].as_u64().unwrap() > 32 << 20, "{usage:#}");
    until_ok(&["alloc", "cancel", "1"]);
}
