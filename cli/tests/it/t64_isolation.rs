//! Containment end to end: real replicas, real agents with this machine's
//! cgroups, real processes that escape their process group. Every stop path
//! (cancel, priority preemption, a watchdog, a gang teardown) ends them, and
//! the next job on those GPUs starts only once they are gone.

use std::path::Path;
use std::time::Duration;

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_scheduler::policy::PreemptionConfig;

use crate::t26_e2e::{leader_client, status, submit, until};

/// Two nodes of 8 GPUs: a gang of two whole nodes holds every GPU, so the
/// job after it runs on exactly those GPUs.
fn config() -> LocalConfig {
    LocalConfig {
        preemption: PreemptionConfig { min_runtime_ms: 0, grace_ms: 1_000, ..PreemptionConfig::default() },
        ..crate::tls::quick_cluster(2, Duration::from_secs(1))
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
        let pid = muster_testkit::eventually_async(&format!("{prefix}* to be written"), muster_testkit::WAIT, || {
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
        assert!(crate::t26_e2e::proc_alive(p), "escapee {p} runs");
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
    leader_client(&c).await.cancel(v1::CancelRequest { id: a, ..Default::default() }).await.unwrap();
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
    leader_client(&c).await.cancel(v1::CancelRequest { id: a, ..Default::default() }).await.unwrap();
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
    let until_ok = |args: &[&str]| crate::t82_history::until_ok(&addr, args);
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

/// The task accounts of t193: unmapped owners run as 60000, bob and carol
/// as their own (numeric accounts need no passwd entry).
fn users_config() -> LocalConfig {
    let run_as = muster_agent::users::configure(Some("60000"), Some("bob 60001\ncarol 60002:60012\n"), false, true)
        .expect("numeric accounts");
    LocalConfig {
        agents: 2,
        heartbeat: Duration::from_millis(500),
        stop_grace: Duration::from_secs(1),
        run_as,
        // Kept tasks run under `muster task-exec`, as under `muster agent`.
        exe: Some(env!("CARGO_BIN_EXE_muster").into()),
        ..crate::tls::local_config()
    }
}

fn one_task(owner: &str, script: &str, env: &[(&str, String)], max_retries: u32) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: owner.into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        max_retries,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        ..Default::default()
    }
}

/// Where an allocation's task 0 keeps its checkpoint directory (on
/// whichever node it ran).
fn checkpoint_dir_of(c: &LocalCluster, a: &v1::Allocation) -> std::path::PathBuf {
    let i: u32 = a.tasks[0].last_node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    c.agent_dir(i).join(format!("checkpoints/alloc-{}-task-0", a.id))
}

/// Issue 46: "no task runs as root unless the agent was told to allow it;
/// a task cannot read another task's checkpoint dir, and cannot signal
/// another task's processes." Tasks run as the account their owner maps
/// to (else the agent's task account), own their checkpoint directory
/// (0700, restored files included) while they run, and the agent takes it
/// back when they end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t193_tasks_run_as_their_owners_accounts_and_cannot_reach_each_other() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    // The agents' work dirs are inside: the tasks' accounts must reach them.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let c = LocalCluster::start(dir.path(), users_config()).await.unwrap();

    // Carol keeps a secret in her checkpoint directory and runs on.
    let carol = submit(
        &c,
        one_task(
            "carol",
            "echo s3cret > \"$MUSTER_CHECKPOINT_DIR/secret\"; echo $$ > \"$MUSTER_CHECKPOINT_DIR/pid\"; exec sleep 600",
            &[],
            0,
        ),
    )
    .await;
    let a = until(&c, carol, "running", |x| status(x) == v1::AllocationStatus::Running).await;
    let carol_dir = checkpoint_dir_of(&c, &a);
    let pid: i32 = muster_testkit::eventually_async("carol's pid", muster_testkit::WAIT, || {
        let pid = std::fs::read_to_string(carol_dir.join("pid")).ok().and_then(|p| p.trim().parse().ok());
        async move { pid }
    })
    .await;
    let m = std::fs::metadata(&carol_dir).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (60002, 60012, 0o700), "carol's directory is hers alone");
    let status_of = |p: i32| std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
    assert!(status_of(pid).contains("\nUid:\t60002\t60002\t60002\t60002\n"), "{}", status_of(pid));

    // Bob tries to read her secret and to signal and kill her task.
    let probe = r#"id -u; id -g
ls "$CAROL_DIR" && echo LISTED
cat "$CAROL_DIR/secret" && echo READ
kill -0 "$CAROL_PID" && echo SIGNALLED
kill -9 "$CAROL_PID" && echo KILLED
echo mine > "$MUSTER_CHECKPOINT_DIR/mine" && echo WROTE-OWN"#;
    let env = [("CAROL_DIR", carol_dir.display().to_string()), ("CAROL_PID", pid.to_string())];
    let bob = submit(&c, one_task("bob", probe, &env, 0)).await;
    let done = until(&c, bob, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    let out = outputs(&c, &done);
    assert!(out.starts_with("60001\n60001\n") && out.contains("WROTE-OWN"), "{out}");
    for breach in ["LISTED", "READ", "SIGNALLED", "KILLED"] {
        assert!(!out.contains(breach), "bob's task got through ({breach}):\n{out}");
    }
    assert!(crate::t26_e2e::proc_alive(pid), "carol's task runs on");

    // An owner nobody mapped runs as the task account; a checkpoint it
    // left is restored into a directory it owns, and it can write there.
    let resume = r#"id -u
if [ "$MUSTER_RESUME" = 1 ]; then cat "$MUSTER_CHECKPOINT_DIR/step" && echo 2 >> "$MUSTER_CHECKPOINT_DIR/step" && exit 0; fi
echo 1 > "$MUSTER_CHECKPOINT_DIR/step"; exit 3"#;
    let dave = submit(&c, one_task("dave", resume, &[], 2)).await;
    let done = until(&c, dave, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    let out = outputs(&c, &done);
    assert_eq!(out.lines().collect::<Vec<_>>(), ["60000", "1"], "the resumed attempt read and appended:\n{out}");

    // A task's own pids limit reaches its cgroup (v1: the pids hierarchy's
    // line of /proc/self/cgroup; v2: the one line).
    let show_pids_max = r#"p=$(awk -F: '$2 ~ /(^|,)pids(,|$)/ || $2 == "" {print $3}' /proc/self/cgroup | head -1)
cat "/sys/fs/cgroup/pids$p/pids.max" 2>/dev/null || cat "/sys/fs/cgroup$p/pids.max""#;
    let mut spec = one_task("erin", show_pids_max, &[], 0);
    spec.pids_max = 64;
    let erin = submit(&c, spec).await;
    let done = until(&c, erin, "done", |x| status(x) == v1::AllocationStatus::Done).await;
    assert_eq!(outputs(&c, &done).trim(), "64");

    leader_client(&c).await.cancel(v1::CancelRequest { id: carol, ..Default::default() }).await.unwrap();
    until(&c, carol, "cancelled", |x| status(x) == v1::AllocationStatus::Cancelled).await;
    c.shutdown().await;
}

/// Issue 46: a root `muster agent` refuses to start rather than run tasks
/// as root unless told (`--allow-root-tasks`), and names what to do; a user
/// map that names root or an unknown account stops it too.
#[test]
fn t194_a_root_agent_never_runs_tasks_as_root_unless_told() {
    if unsafe { libc::geteuid() } != 0 {
        return; // the refusals are a root agent's; an unprivileged one runs tasks as itself
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = |extra: &[&str]| {
        let mut args = vec!["agent", "--insecure", "--scheduler", "127.0.0.1:9", "--node-id", "u1", "--gpus", "0"];
        args.extend_from_slice(extra);
        let work = dir.path().join("w");
        let child = std::cell::RefCell::new(
            std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
                .args(&args)
                .arg("--work-dir")
                .arg(&work)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // An agent that started would run on: it must have exited.
        crate::dev_proc::wait_until(&format!("{args:?} to exit"), || child.borrow_mut().try_wait().unwrap().is_some());
        let o = child.into_inner().wait_with_output().unwrap();
        assert!(!o.status.success(), "{args:?} started");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = agent(&["--task-user", "no-such-account-here"]);
    assert!(err.contains("--task-user: account \"no-such-account-here\" does not exist on this node"), "{err}");
    if muster_agent::users::resolve(muster_agent::users::DEFAULT_TASK_USER).is_err() {
        let err = agent(&[]);
        assert!(err.contains("muster-task") && err.contains("--allow-root-tasks") && err.contains("useradd"), "{err}");
    }
    let map = dir.path().join("users");
    std::fs::write(&map, "bob root\n").unwrap();
    let err = agent(&["--task-user", "60000", "--user-map", map.to_str().unwrap()]);
    assert!(err.contains("--user-map line 1: account \"root\" is root"), "{err}");
    let err = agent(&["--task-user", "60000", "--allow-root-tasks"]);
    assert!(err.contains("contradict"), "{err}");
}
