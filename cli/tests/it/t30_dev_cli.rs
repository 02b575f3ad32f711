//! `muster dev` as a user runs it, driven through the CLI: nodes, a gang of
//! four on four nodes, explain, cancel, Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::muster;

fn json(args: &[&str]) -> serde_json::Value {
    let o = muster(args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// Starts `muster dev --data-dir DATA EXTRA…` (its log lines go to
/// `DATA.stderr`); returns it, the replica addresses it printed, and the
/// rest of its output.
pub(crate) fn start_dev(
    data: &std::path::Path,
    extra: &[String],
) -> (std::process::Child, String, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut dev = Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["dev", "--data-dir"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(data.with_extension("stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(dev.stdout.take().unwrap()).lines();
    let sched = loop {
        let line = lines.next().expect("muster dev printed its replicas").unwrap();
        if let Some(rest) = line.trim().strip_prefix("replicas") {
            break rest.trim().to_string();
        }
    };
    (dev, sched, lines)
}

#[test]
fn t91_a_gang_of_four_on_muster_dev_runs_on_four_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, sched, mut lines) = start_dev(&dir.path().join("dev"), &[]);
    // `muster dev` made its own CA; the CLI uses its admin certificate.
    let tls_dir = dir.path().join("dev").join("tls");
    let tls_line = lines.find(|l| l.as_ref().is_ok_and(|l| l.trim().starts_with("tls"))).unwrap().unwrap();
    assert!(tls_line.contains(tls_dir.to_str().unwrap()) && tls_line.contains("admin-dev"), "{tls_line}");
    let td = tls_dir.to_str().unwrap().to_string();
    let s = ["--scheduler", sched.as_str(), "--output", "json", "--tls-dir", td.as_str()];
    let with = |args: &[&str]| -> Vec<String> { args.iter().chain(s.iter()).map(|a| a.to_string()).collect() };
    let call = |args: &[&str]| {
        let v = with(args);
        json(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // Agents register within a moment.
    muster_testkit::eventually_blocking("the agents to register", Duration::from_secs(60), || {
        let nodes = call(&["node", "list"]);
        let ready =
            nodes["nodes"].as_array().unwrap().iter().filter(|n| n["status"] == "ready" && n["gpus"] == 8).count();
        if ready == 4 { Ok(()) } else { Err(nodes.to_string()) }
    });
    // Text tables start with a header row.
    let text = crate::stdout(&muster(&["node", "list", "--scheduler", &sched, "--tls-dir", &td]));
    let mut rows = text.lines();
    assert!(
        rows.next().is_some_and(|h| h.starts_with("NODE") && h.contains("STATUS") && h.contains("GPUS used/total")),
        "{text}"
    );
    assert_eq!(rows.filter(|l| l.contains("0/8")).count(), 4, "{text}");
    // In id order, with their labels on request.
    let text = crate::stdout(&muster(&["node", "list", "--labels", "--scheduler", &sched, "--tls-dir", &td]));
    let ids: Vec<&str> = text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(ids, ["node-1", "node-2", "node-3", "node-4"], "{text}");
    assert!(text.lines().next().unwrap().ends_with("LABELS"), "{text}");
    assert!(text.lines().skip(1).all(|l| l.contains("gpu.model=fake")), "{text}");

    let mut submit: Vec<&str> = vec!["submit", "--gang-size", "4", "--gpus", "1", "--class", "5"];
    submit.extend(s);
    submit.extend(["--", "sleep", "30"]);
    let id = json(&submit)["id"].as_u64().unwrap().to_string();
    let a = muster_testkit::eventually_blocking("the gang to run", Duration::from_secs(60), || {
        let a = call(&["alloc", "get", &id]);
        if a["status"] == "running" { Ok(a) } else { Err(a.to_string()) }
    });
    let mut nodes: Vec<String> =
        a["tasks"].as_array().unwrap().iter().map(|t| t["node"].as_str().unwrap().to_string()).collect();
    assert!(a["tasks"].as_array().unwrap().iter().all(|t| t["status"] == "running"), "{a}");
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "four tasks on four nodes: {a}");

    // What no node can ever run is refused at submit, naming what is
    // missing, and nothing is submitted.
    let refused = |extra: &[&str]| {
        let mut args: Vec<&str> = vec!["submit"];
        args.extend(extra);
        args.extend(["--scheduler", sched.as_str(), "--tls-dir", td.as_str(), "--", "true"]);
        let o = muster(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = refused(&["--gpus", "1", "--constraint", "gpu.model=H100"]);
    assert!(err.contains("no node has gpu.model=H100; known gpu.model values: fake"), "{err}");
    assert!(err.contains("--queue-if-unsatisfiable"), "{err}");
    let err = refused(&["--gpus", "9"]);
    assert!(err.contains("a task needs 9 GPUs; the most any node has is 8"), "{err}");
    let err = refused(&["--gang-size", "5", "--gpus", "8"]);
    assert!(
        err.contains("the gang of 5 needs 5 nodes that could each take a task") && err.contains("only 4 could"),
        "{err}"
    );
    // Queued anyway on request; explain and the dry run of the same
    // request say the same thing.
    let mut big: Vec<&str> = vec!["submit", "--gang-size", "5", "--gpus", "8", "--queue-if-unsatisfiable"];
    big.extend(s);
    big.extend(["--", "true"]);
    let big_id = json(&big)["id"].as_u64().unwrap().to_string();
    let e = call(&["alloc", "explain", &big_id]);
    assert!(
        e["summary"].as_str().unwrap().starts_with("it can never run on the registered nodes: the gang of 5"),
        "{e}"
    );
    assert!(e["preemption"]["reason"].as_str().unwrap().contains("preemption cannot help"), "{e}");
    big.insert(1, "--dry-run");
    let plan = json(&big);
    assert_eq!(
        (&plan["summary"], &plan["preemption"]["reason"]),
        (&e["summary"], &e["preemption"]["reason"]),
        "{plan}"
    );

    // A gang whose script does not exist fails within two runs, with
    // python's error as its reason, and preempts nobody.
    let mut broken: Vec<&str> =
        vec!["submit", "--gang-size", "2", "--gpus", "1", "--class", "5", "--max-retries", "10"];
    broken.extend(s);
    broken.extend(["--", "python3", "no_such_train.py"]);
    let broken_id = json(&broken)["id"].as_u64().unwrap().to_string();
    crate::dev_proc::wait_until("the broken gang to fail", || {
        call(&["alloc", "get", &broken_id])["status"] == "failed"
    });
    let b = call(&["alloc", "get", &broken_id]);
    assert_eq!(b["failures"], 2, "{b}");
    assert!(b["tasks"].as_array().unwrap().iter().all(|t| t["runs"].as_u64() <= Some(2)), "{b}");
    let reason = b["failed_reason"].as_str().unwrap();
    assert!(
        reason.contains("failed the same way twice")
            && reason.contains("can't open file")
            && reason.contains("no_such_train.py"),
        "{b}"
    );
    assert!(b["last_failure"]["stderr_tail"].as_str().unwrap().contains("No such file or directory"), "{b}");
    assert_eq!(call(&["alloc", "get", &id])["preempted_count"], 0, "{b}");
    let text = crate::stdout(&muster(&["alloc", "get", &broken_id, "--scheduler", &sched, "--tls-dir", &td]));
    assert!(text.contains("failed: task") && text.contains("python3: can't open file"), "{text}");

    // squeue's and scancel's habits: names, columns, filters, a sort, and a
    // cancel by name that asks first.
    let mut sweep: Vec<&str> = vec!["submit", "--gpus", "1", "--name", "sweep"];
    sweep.extend(s);
    sweep.extend(["--", "sleep", "300"]);
    let sweeps = [json(&sweep)["id"].as_u64().unwrap(), json(&sweep)["id"].as_u64().unwrap()];
    let listed = |extra: &[&str]| {
        let mut args = vec!["alloc", "list", "--scheduler", sched.as_str(), "--tls-dir", td.as_str()];
        args.extend(extra);
        crate::stdout(&muster(&args))
    };
    let text = listed(&["--name", "sweep", "--columns", "id,name,status,submitted", "--sort", "-id"]);
    let ids: Vec<u64> = text.lines().skip(1).map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect();
    assert_eq!(ids, [sweeps[1], sweeps[0]], "{text}");
    assert!(text.lines().next().unwrap().split_whitespace().eq(["ID", "NAME", "STATUS", "SUBMITTED"]), "{text}");
    let text = listed(&[]);
    let header = text.lines().next().unwrap();
    for column in ["NAME", "SUBMITTED", "STARTED", "ELAPSED", "NODES"] {
        assert!(header.contains(column), "{text}");
    }
    assert!(text.lines().any(|l| l.contains("no_such_train.py") && l.contains("python3")), "{text}");
    assert!(listed(&["--since", "2000-01-01T00:00:00Z", "--name", "sweep"]).lines().count() == 3, "header + 2");
    let cancel = |extra: &[&str]| {
        let mut args =
            vec!["alloc", "cancel", "--name", "sweep", "--scheduler", sched.as_str(), "--tls-dir", td.as_str()];
        args.extend(extra);
        muster(&args)
    };
    let o = cancel(&[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("refusing to cancel 2 allocation(s)") && err.contains("--yes"), "{err}");
    assert!(listed(&["--name", "sweep", "--columns", "status"]).lines().skip(1).all(|l| l.trim() != "cancelled"));
    let o = cancel(&["--yes"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    crate::dev_proc::wait_until("the sweep to be cancelled", || {
        listed(&["--name", "sweep", "--columns", "status"]).lines().skip(1).all(|l| l.trim() == "cancelled")
    });

    // Dry runs: a class-8 whole-node job would preempt the class-5 gang
    // once it is past muster dev's 1 s minimum runtime; a class-5 one could
    // not.
    let dry = |class: &str| {
        let mut args: Vec<&str> = vec!["submit", "--dry-run", "--gpus", "8", "--class", class];
        args.extend(s);
        args.extend(["--", "true"]);
        json(&args)
    };
    let plan = muster_testkit::eventually_blocking(
        "a class-8 dry run to find a victim (past the 1 s minimum runtime)",
        Duration::from_secs(90),
        || {
            let plan = dry("8");
            plan["preemption"]["victims"].as_array().is_some_and(|v| !v.is_empty()).then_some(plan)
        },
    );
    assert_eq!(plan["id"], 0, "{plan}");
    let victims = plan["preemption"]["victims"].as_array().unwrap();
    assert_eq!(victims.len(), 1, "{plan}");
    assert_eq!(victims[0]["id"].as_u64().unwrap().to_string(), id, "{plan}");
    assert!(victims[0]["total_cost"].as_u64().unwrap() < plan["preemption"]["value"].as_u64().unwrap());
    let plan = dry("5");
    assert!(plan["preemption"]["reason"].as_str().unwrap().contains("1 not of a lower class"), "{plan}");
    let text = muster(&[
        "submit",
        "--dry-run",
        "--gpus",
        "8",
        "--class",
        "8",
        "--scheduler",
        &sched,
        "--tls-dir",
        &td,
        "--",
        "true",
    ]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("preemption: would stop 1 allocation(s)") && text.contains(&format!("victim {id:>6}")),
        "{text}"
    );
    assert_eq!(call(&["alloc", "get", &id])["status"], "running", "a dry run changes nothing");
    // Bad classes are refused with the field named, and nothing is submitted.
    for (args, field) in [
        (vec!["submit", "--class", "11", "--scheduler", &sched, "--tls-dir", &td, "--", "true"], "preemption_class"),
        (
            vec!["submit", "--class", "5", "--sensitive", "--scheduler", &sched, "--tls-dir", &td, "--", "true"],
            "preemption_class",
        ),
        (
            vec!["submit", "--vcluster-type", "gpu", "--scheduler", &sched, "--tls-dir", &td, "--", "true"],
            "vcluster_type",
        ),
    ] {
        let o = muster(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(field), "{args:?}: {err}");
    }

    // Times in RFC 3339 beside the milliseconds.
    let a = call(&["alloc", "get", &id]);
    let started = a["started_at"].as_str().unwrap_or_default();
    assert!(a["submit_time"].as_str().unwrap().ends_with('Z') && started.len() >= 20 && started.ends_with('Z'), "{a}");
    assert!(a["started_at_ms"].as_u64() >= a["submit_time_ms"].as_u64() && a["finished_at"].is_null(), "{a}");

    // Several ids at once; one that does not exist is named, and the exit is 1.
    let o = muster(&["alloc", "cancel", "999999", &big_id, "--scheduler", &sched, "--tls-dir", &td]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains(&format!("allocation {big_id} cancelled")) && err.contains("cancel 999999"), "{out}{err}");
    // A running allocation is cancelled once its task has stopped.
    let c = call(&["alloc", "cancel", &id]);
    assert_eq!(c["status"], "tearing-down", "{c}");
    muster_testkit::eventually_blocking(&format!("allocation {id} to be cancelled"), crate::cluster::WAIT, || {
        (call(&["alloc", "get", &id])["status"] == "cancelled").then_some(())
    });

    // Watch a short gang to its end; resume from a revision.
    let mut short: Vec<&str> = vec!["submit", "--gang-size", "2", "--gpus", "1"];
    short.extend(s);
    short.extend(["--", "sleep", "1"]);
    let short_id = json(&short)["id"].as_u64().unwrap().to_string();
    let o = muster(&["alloc", "watch", &short_id, "--scheduler", &sched, "--tls-dir", &td]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    for kind in ["submitted", "gang_reserved", "task_started", "task_finished", "allocation_done"] {
        assert!(text.contains(kind), "{kind} missing from\n{text}");
    }
    let o = muster(&[
        "alloc",
        "watch",
        &short_id,
        "--from",
        "2",
        "--scheduler",
        &sched,
        "--tls-dir",
        &td,
        "--output",
        "json",
    ]);
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["revision"], 3);
    let o = muster(&["alloc", "watch", &id, "--scheduler", &sched, "--tls-dir", &td]);
    assert!(!o.status.success(), "a cancelled allocation's watch exits non-zero");
    assert!(String::from_utf8_lossy(&o.stderr).contains("ended cancelled"));

    // Logs come from the task's node through the agent stream.
    let mut talk: Vec<&str> = vec!["submit", "--gang-size", "2"];
    talk.extend(s);
    talk.extend(["--", "sh", "-c", "echo out-$MUSTER_TASK_INDEX; echo err-$MUSTER_TASK_INDEX >&2"]);
    let talk_id = json(&talk)["id"].as_u64().unwrap().to_string();
    assert!(muster(&["alloc", "watch", &talk_id, "--scheduler", &sched, "--tls-dir", &td]).status.success());
    // Watched again once done, each replayed event shows the status it led
    // to, not today's.
    let replay = crate::stdout(&muster(&["alloc", "watch", &talk_id, "--scheduler", &sched, "--tls-dir", &td]));
    // Columns: revision, time, status, event, detail (after a header).
    assert!(
        replay.lines().next().is_some_and(|h| h.split_whitespace().eq(["REV", "TIME", "STATUS", "EVENT", "DETAIL"]))
    );
    let status_beside = |kind: &str| {
        let line = replay.lines().find(|l| l.split_whitespace().nth(3) == Some(kind)).unwrap_or_default();
        let time = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(time.len() == 20 && time.ends_with('Z'), "a timestamp: {line}");
        line.split_whitespace().nth(2).unwrap_or_default().to_string()
    };
    assert_eq!(status_beside("submitted"), "queued", "{replay}");
    assert_eq!(status_beside("allocation_done"), "done", "{replay}");
    // By default both, stderr's lines marked; --stdout and --stderr pick one.
    let o = muster(&["alloc", "logs", &talk_id, "--task", "1", "--scheduler", &sched, "--tls-dir", &td]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out-1\n[stderr] err-1\n", "{}", String::from_utf8_lossy(&o.stderr));
    let o = muster(&["alloc", "logs", &talk_id, "--task", "1", "--stdout", "--scheduler", &sched, "--tls-dir", &td]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out-1\n");
    let o = muster(&["alloc", "logs", &talk_id, "--task", "0", "--stderr", "--scheduler", &sched, "--tls-dir", &td]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "err-0\n");
    // A task that failed with its reason on stderr alone: shown, and said.
    let mut quiet: Vec<&str> = vec!["submit"];
    quiet.extend(s);
    quiet.extend(["--", "sh", "-c", "echo 'no such file: train.py' >&2; exit 2"]);
    let quiet_id = json(&quiet)["id"].as_u64().unwrap().to_string();
    let _ = muster(&["alloc", "watch", &quiet_id, "--scheduler", &sched, "--tls-dir", &td]);
    let o = muster(&["alloc", "logs", &quiet_id, "--scheduler", &sched, "--tls-dir", &td]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[stderr] no such file: train.py\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("wrote to stderr only"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = muster(&["alloc", "logs", &talk_id, "--task", "7", "--scheduler", &sched, "--tls-dir", &td]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no task 7"), "{}", String::from_utf8_lossy(&o.stderr));

    // --follow streams until the attempt ends.
    let mut slow: Vec<&str> = vec!["submit"];
    slow.extend(s);
    slow.extend(["--", "sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.4; done"]);
    let slow_id = json(&slow)["id"].as_u64().unwrap().to_string();
    muster_testkit::eventually_blocking("the task to start", Duration::from_secs(60), || {
        (call(&["alloc", "get", &slow_id])["tasks"][0]["attempts"] == 1).then_some(())
    });
    let o = muster(&["alloc", "logs", &slow_id, "-f", "--scheduler", &sched, "--tls-dir", &td]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "line1\nline2\nline3\n", "{}", String::from_utf8_lossy(&o.stderr));

    // Node lifecycle on muster dev: an idle node drained stops at once (its
    // events say so); a second drain is refused; restart brings it back.
    let n = call(&["node", "drain", "node-4", "--reason", "dev test", "--by", "t91"]);
    assert_eq!(n["status"], "stopped", "{n}");
    let kinds: Vec<&str> = n["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.ends_with(&["drain_started", "drain_completed", "node_stopped"]), "{kinds:?}");
    let o = muster(&["node", "drain", "node-4", "--scheduler", &sched, "--tls-dir", &td]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("node node-4 is stopped: cannot drain (allowed from ready)"), "{err}");
    assert_eq!(call(&["node", "restart", "node-4", "--by", "t91"])["status"], "ready");

    // Ctrl-C ends muster dev cleanly, and quietly: no warnings as its
    // replicas and agents go away one by one.
    let log = dir.path().join("dev.stderr");
    let logged_before = std::fs::read_to_string(&log).unwrap().len();
    Command::new("kill").args(["-INT", &dev.id().to_string()]).status().unwrap();
    let status = muster_testkit::eventually_blocking("muster dev to exit on Ctrl-C", Duration::from_secs(60), || {
        dev.try_wait().unwrap()
    });
    assert!(status.success(), "muster dev exited {status}");
    let after = std::fs::read_to_string(&log).unwrap()[logged_before..].to_string();
    assert!(!after.contains("WARN"), "warnings after Ctrl-C:\n{after}");
}
