//! The binary's own commands run as a user would: `simulate`, `probe`,
//! bad input, `completions`, `beat`, the `dev --demo` tour, and the
//! metrics a server exports while real processes run.

use super::*;

#[test]
fn t10_simulate_prints_a_summary_and_the_same_digest_twice() {
    let args = ["simulate", "--nodes", "20", "--allocations", "300", "--seed", "7"];
    let a = muster(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let text = stdout(&a);
    for needle in ["queueing delay", "utilisation", "state digest", "300 submitted"] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let digest = |t: &str| t.lines().find(|l| l.starts_with("state digest")).map(str::to_string);
    assert_eq!(digest(&text), digest(&stdout(&muster(&args))));
}

/// With `--retention` the simulated replica compacts and forgets finished
/// allocations as a server does (compaction and forget due in one pass,
/// as the simulator's clock jumps, were once refused), and the report
/// reads the same as without it.
#[test]
fn t234_simulate_with_retention_compacts_and_forgets_and_reports_the_same() {
    let run = |extra: &[&str]| {
        let args = [&["simulate", "--nodes", "20", "--allocations", "1000", "--seed", "7", "--json"], extra].concat();
        let o = muster(&args);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("valid JSON")
    };
    let (kept, retained) = (run(&[]), run(&["--retention", "2m"]));
    for field in ["completed", "failed", "utilisation", "queue_delay_s", "tasks_started"] {
        assert_eq!(kept[field], retained[field], "{field}");
    }
    assert!(retained["commands"].as_u64() > kept["commands"].as_u64(), "no compaction or forget: {retained}");
}

#[test]
fn t20_simulate_json_has_the_reported_fields() {
    let o = muster(&["simulate", "--nodes", "10", "--allocations", "100", "--seed", "2", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    for field in ["utilisation", "queue_delay_s", "queue_delay_large_s", "completed", "failed", "state_digest"] {
        assert!(v.get(field).is_some(), "{field} missing from {v}");
    }
    for p in ["p50", "p95", "p99", "mean"] {
        assert!(v["queue_delay_s"][p].is_number());
    }
    assert_eq!(v["allocations"], 100);
}

#[test]
fn t30_simulate_replays_the_shipped_trace() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../simulation/traces/philly.csv.gz");
    for (extra, policy) in [(None, "Fifo+backfill"), (Some("--no-backfill"), "Fifo")] {
        let mut args =
            vec!["simulate", "--trace", trace, "--limit", "2000", "--nodes", "12", "--policy", "fifo", "--json"];
        args.extend(extra);
        let o = muster(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["completed"], 2000);
        assert_eq!(v["policy"], policy);
        assert_eq!(v["backfilled"].as_u64().unwrap() > 0, extra.is_none(), "{v}");
    }
}

#[test]
fn t31_simulate_replays_a_trace_on_a_mixed_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.csv");
    std::fs::write(
        &fleet,
        "count,gpus,gpu_model,vram_mb,mem_mb,cpus,labels\n4,8,H100,81920,1024000,96,rack=r1\n\
         4,4,A100,40960,512000,48,rack=r2\n",
    )
    .unwrap();
    // A jobs asking for H100s, for A100s, and for anything: 8-GPU jobs fit
    // only the H100 nodes whole, the rest split into gangs.
    let mut trace = String::from("timestamp,duration,num_gpus,gpu_model\n");
    for i in 0..60 {
        let model = ["H100", "A100", ""][i % 3];
        trace.push_str(&format!("2017-10-09 07:{:02}:00,{},{},{model}\n", i % 60, 600 + 60 * i, [1, 4, 8][i % 3]));
    }
    let tr = dir.path().join("trace.csv");
    std::fs::write(&tr, trace).unwrap();
    let args = ["simulate", "--node-list", fleet.to_str().unwrap(), "--trace", tr.to_str().unwrap()];
    let o = muster(&[&args[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["nodes"].as_u64(), v["gpus_total"].as_u64(), v["completed"].as_u64()), (Some(8), Some(48), Some(60)));
    let models: Vec<&str> = v["per_model"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap()).collect();
    assert_eq!(models, ["A100", "H100"], "{v}");
    for m in v["per_model"].as_array().unwrap() {
        assert_eq!(m["queue_delay_s"]["count"].as_u64(), Some(20), "each model's jobs ran: {m}");
        assert!(m["utilisation"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert_eq!(v["queue_delay_any_model_s"]["count"].as_u64(), Some(20));
    let text = stdout(&muster(&args));
    assert!(text.contains("H100         4 nodes, 32 GPUs: utilisation"), "{text}");
    // Flags that describe another fleet are refused, and so is a bad list.
    let o = muster(&[&args[..], &["--nodes", "5"]].concat());
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("cannot be used with"));
    std::fs::write(&fleet, "count,gpus\n0,8\n").unwrap();
    let o = muster(&args);
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 2: count must be at least 1"), "{o:?}");
}

#[test]
fn t32_simulate_packs_gangs_by_rack() {
    let racks = concat!(env!("CARGO_MANIFEST_DIR"), "/../simulation/fleets/racks.csv");
    let run = |choice: &str| {
        let args = [
            "simulate",
            "--node-list",
            racks,
            "--allocations",
            "300",
            "--seed",
            "3",
            "--pack-by",
            "rack",
            "--pack-choice",
            choice,
            "--json",
        ];
        let o = muster(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (tight, first) = (run("tightest"), run("first-fit"));
    for v in [&tight, &first] {
        assert_eq!(v["unfinished"].as_u64(), Some(0), "every packed gang ran: {v}");
    }
    assert_ne!(tight["state_digest"], first["state_digest"], "the choice changes placements");
    let o = muster(&["simulate", "--pack-choice", "first-fit"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pack-by"), "{o:?}");
}

#[test]
fn t40_bad_input_is_a_clear_error_and_a_non_zero_exit() {
    let cases: [(&[&str], &str); 5] = [
        (&["simulate", "--nodes", "0"], "--nodes must be at least 1"),
        (&["simulate", "--failure-prob", "1.5"], "--failure-prob must be between 0 and 1"),
        (&["simulate", "--gpus-per-node", "0"], "--gpus-per-node"),
        (&["simulate", "--trace", "/nonexistent/trace.csv"], "cannot read trace /nonexistent/trace.csv"),
        (&["simulate", "--policy", "random"], "invalid value 'random'"),
    ];
    for (args, message) in cases {
        let o = muster(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(message), "{args:?}: {message:?} not in {err}");
    }
}

#[test]
fn t50_probe_reports_this_machines_resources() {
    let o = muster(&["probe"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    let value = |key: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} missing: {text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(value("cpus") >= 1);
    assert!(value("mem_mb") >= 256);
    let _ = value("gpus");
    // The labels `muster agent` puts on its node by itself.
    assert!(text.lines().any(|l| l.starts_with("label    hostname=")), "{text}");
}

#[test]
fn t90_dev_demo_shows_a_teardown_and_a_priority_preemption() {
    // The README's main command, as it gives the arguments.
    let args = t16_readme::demo_args();
    assert_eq!(args, ["dev", "--demo"]);
    let o = muster(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("completed: every task ran on its own node"), "{text}");
    for needle in ["killing task 0", "teardown_started", "checkpoint_saved", "gang blocked", "gang_requeued"] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(text.lines().any(|l| l.matches("running@node-").count() == 4), "all four ran at once:\n{text}");
    // The priority preemption part: a dry run names the victims, the cheap
    // class-2 work checkpoints through hints and suspends, the slow one is
    // spared, and the suspended work resumes with its submit time kept.
    assert_eq!(text.matches("would preempt allocation").count(), 2, "{text}");
    for needle in ["preemption_decided", "preemption_started", "gang suspended", "[5] allocation_done"] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert_eq!(text.matches("preempted once; original submit time kept").count(), 2, "{text}");
    assert_eq!(text.matches("never preempted; original submit time kept").count(), 1, "{text}");
    assert_eq!(text.matches(": resumed from step ").count(), 6, "three teardown and three preemption resumes:\n{text}");
    // One clock from start to end: the second part does not start it again.
    let times: Vec<f64> = text.lines().filter_map(|l| l.trim_start().split_once("s ")?.0.parse::<f64>().ok()).collect();
    assert!(times.len() > 10 && times.windows(2).all(|w| w[0] <= w[1]), "the demo's clock went back: {times:?}");
}

#[test]
fn t92_completions_and_help() {
    let o = muster(&["completions", "bash"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("muster"), "a bash completion script");
    let o = muster(&["--help"]);
    assert!(stdout(&o).contains("Exit codes"), "{}", stdout(&o));
    let o = muster(&["completions", "klingon"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn t93_server_serves_prometheus_metrics() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let metrics = format!("127.0.0.1:{}", cluster::free_port());
    let mut server = Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["server", "--id", "1", "--listen", &addr, "--peers", &format!("1={addr}"), "--metrics", &metrics])
        .arg("--data-dir")
        .arg(dir.path())
        .env("MUSTER_TLS_DIR", tls::dir())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let body = muster_testkit::eventually_blocking("leader metrics", std::time::Duration::from_secs(60), || {
        let text = std::net::TcpStream::connect(&metrics).ok().and_then(|mut s| {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            Some(out)
        });
        text.filter(|t| t.contains("muster_raft_is_leader{replica=\"1\"} 1"))
    });
    server.kill().unwrap();
    let _ = server.wait();
    for m in ["muster_raft_term", "muster_raft_applied_index", "muster_sm_queue_depth", "muster_sm_nodes"] {
        assert!(body.contains(m), "{m} missing:\n{body}");
    }
}

/// A real server and two real agent processes: a gang whose task 0 fails
/// once is torn down and re-run; the teardown metrics count it and
/// `alloc get` shows the epochs.
#[test]
fn t94_teardown_metrics_and_alloc_get_with_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let metrics = format!("127.0.0.1:{}", cluster::free_port());
    let children = Procs::start(
        dir.path(),
        &addr,
        &["--metrics", &metrics, "--agent-heartbeat-ms", "500", "--preempt-grace-ms", "2000"],
        &["a1", "a2"],
    );
    let scrape = || scrape(&metrics);
    // Task 0 fails once; task 1 would run for a minute unless torn down.
    let script = r#"if [ "$MUSTER_EPOCH" = 1 ]; then if [ "$MUSTER_TASK_INDEX" = 0 ]; then sleep 1; exit 3; fi; sleep 60; fi; echo ok"#;
    // One budget for the three waits below.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let left = || deadline.saturating_duration_since(std::time::Instant::now());
    submit_retried(
        left(),
        &["-n", "2", "--gpus", "1", "--idempotency-key", "t94", "--scheduler", &addr, "--", "sh", "-c", script],
    );
    let body = muster_testkit::eventually_blocking("a teardown in the metrics", left(), || match scrape() {
        Some(t) if t.contains("muster_gang_teardown_completed_total{outcome=\"blocked\"} 1") => Ok(t),
        other => Err(format!("{other:?}")),
    });
    let get = muster_testkit::eventually_blocking("the gang to finish", left(), || {
        let o = muster(&["alloc", "get", "1", "--scheduler", &addr]);
        let text = stdout(&o);
        // Under the header row, the allocation's own line.
        if text.lines().nth(1).is_some_and(|allocation| allocation.contains(" done ")) { Ok(text) } else { Err(text) }
    });
    drop(children);
    assert!(body.contains("muster_gang_teardowns_total 1"), "{body}");
    assert!(body.contains("muster_gang_teardown_seconds"), "{body}");
    assert!(!body.contains("muster_gang_teardown_force_drained_total 1"), "nothing was forced: {body}");
    // Task 0 was charged and ran twice; task 1 was refunded and ran twice.
    assert!(get.contains("attempts  2  runs  2  epoch  2  teardown  0"), "{get}");
    assert!(get.contains("attempts  1  runs  2  epoch  2  teardown  1"), "{get}");
    // Its counters agree: one teardown, one failed run, no preemption.
    assert!(get.contains("never preempted; torn down once; failed runs 1 of 3"), "{get}");
}

/// Priority preemption through real `muster server` and `muster agent`
/// processes: one victim answers its checkpoint hint and suspends, the other
/// ignores it and is killed at the deadline; every preemption metric moves.
#[test]
fn t95_preemption_metrics_with_real_processes() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let metrics = format!("127.0.0.1:{}", cluster::free_port());
    let children = Procs::start(
        dir.path(),
        &addr,
        &[
            "--metrics",
            &metrics,
            "--agent-heartbeat-ms",
            "500",
            "--preemption-min-runtime-ms",
            "0",
            "--checkpoint-timeout-ms",
            "1500",
            "--preemption-grace-ms",
            "1000",
            "--preemption-cycle-threshold",
            "0",
            "--default-walltime",
            "1=2h",
        ],
        &["a1", "a2"],
    );
    let scrape = || scrape(&metrics);
    // One budget for all the waits below.
    let deadline = Instant::now() + Duration::from_secs(90);
    let left = || deadline.saturating_duration_since(Instant::now());
    let submit = |key: &str, class: &str, gang: &str, script: &str| {
        let args = ["-n", gang, "--gpus", "2", "--class", class, "--idempotency-key", key, "--scheduler", &addr];
        submit_retried(left(), &[&args[..], &["--output", "json", "--", "sh", "-c", script]].concat())
    };
    let status = |id: &str| {
        let o = muster(&["alloc", "get", id, "--scheduler", &addr, "--output", "json"]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).map(|v| v["status"].as_str().unwrap().to_string())
    };
    // Each says when its traps are set: a hint sent before that would kill
    // a shell still starting (SIGUSR1's default), not test the protocol.
    let ready = dir.path().join("ready");
    std::fs::create_dir(&ready).unwrap();
    let answers = format!(
        r#"trap 'echo saved > "$MUSTER_CHECKPOINT_DIR/state"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
if [ "$MUSTER_RESUME" = 1 ]; then echo resumed; exit 0; fi
touch {}/$MUSTER_ALLOC_ID
while true; do sleep 0.1; done"#,
        ready.display()
    );
    let ignores = format!(
        r#"trap '' USR1
trap 'exit 143' TERM
if [ "$MUSTER_ATTEMPT" != 1 ]; then exit 0; fi
touch {}/$MUSTER_ALLOC_ID
while true; do sleep 0.1; done"#,
        ready.display()
    );
    let a = submit("t95-a", "1", "1", &answers);
    let b = submit("t95-b", "1", "1", &ignores);
    for id in [&a, &b] {
        muster_testkit::eventually_blocking(&format!("{id} to run with its traps set"), left(), || {
            (status(id).ok().as_deref() == Some("running") && ready.join(id).exists()).then_some(())
        });
    }
    // The victims may resume on the other node, so each agent must advertise
    // a checkpoint address other agents can reach (an IP on the route to the
    // scheduler by default), not its bare node id.
    for node in ["a1", "a2"] {
        let o = muster(&["node", "get", node, "--scheduler", &addr, "--output", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let advertised = v.pointer("/labels/muster.checkpoints").and_then(|a| a.as_str()).unwrap_or_default();
        assert!(advertised.starts_with("127.0.0.1:"), "{node} advertises checkpoints at {advertised:?}: {v}");
    }
    let p = submit("t95-p", "5", "2", "echo hi");
    for id in [&p, &a, &b] {
        muster_testkit::eventually_blocking(&format!("{id} to finish"), left(), || match status(id) {
            Ok(s) if s == "done" => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }
    let body = muster_testkit::eventually_blocking("requeues in the metrics", left(), || match scrape() {
        Some(t) if t.contains("muster_preemption_victim_requeue_total 2") => Ok(t),
        other => Err(format!("{other:?}")),
    });
    let get_a = stdout(&muster(&["alloc", "get", &a, "--scheduler", &addr]));
    let json_p = stdout(&muster(&["alloc", "get", &p, "--scheduler", &addr, "--output", "json"]));
    let json_a = stdout(&muster(&["alloc", "get", &a, "--scheduler", &addr, "--output", "json"]));
    drop(children);
    for needle in [
        "muster_preemptions_total{vcluster=\"default\",reason=\"priority\"} 2",
        "muster_preemption_failed_checkpoint_total 1",
        // Only a suspension counts a preemption: b missed its checkpoint
        // and was requeued, so only a crossed the threshold.
        "muster_preemption_cycles_total 1",
        "muster_preemption_checkpoint_duration_seconds_count 1",
        "muster_preemption_decision_seconds_count",
    ] {
        assert!(body.contains(needle), "{needle} missing:\n{body}");
    }
    assert!(get_a.contains("preempted once"), "{get_a}");
    // Times for people: RFC 3339 and how long ago, never raw milliseconds.
    assert!(get_a.contains("submitted 20") && get_a.contains(" ago)"), "{get_a}");
    assert!(!get_a.contains(" ms;"), "{get_a}");
    // Submitted without --walltime: class 1 took the server's class default
    // (2 h), class 5 the general one (1 h).
    assert!(json_a.contains("\"walltime_s\": 7200"), "{json_a}");
    assert!(json_p.contains("\"walltime_s\": 3600"), "{json_p}");
}

#[test]
fn t97_muster_beat_appends_to_the_progress_file_and_explains_itself_outside_a_task() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("progress");
    let o = Command::new(env!("CARGO_BIN_EXE_muster")).arg("beat").env_remove("MUSTER_PROGRESS_FILE").output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("MUSTER_PROGRESS_FILE is not set"));
    for n in 1..=2 {
        let o =
            Command::new(env!("CARGO_BIN_EXE_muster")).arg("beat").env("MUSTER_PROGRESS_FILE", &path).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(std::fs::read(&path).unwrap().len(), n, "each beat changes the file");
    }
}

/// The last-resort layer: `kill -STOP` an agent holding a running gang task.
/// Its node is flagged dead (lost) within the window, the gang is torn down
/// and re-placed on the other nodes and completes; after `kill -CONT` the
/// agent's stale task is stopped and the flag clears.
#[test]
fn t98_a_frozen_agent_is_flagged_dead_its_gang_re_placed_and_its_stale_task_stopped_on_return() {
    use std::time::{Duration, Instant};

    use crate::t26_e2e::proc_alive;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let nodes = ["a1", "a2", "a3"];
    let children = Procs::start(
        dir.path(),
        &addr,
        &["--agent-heartbeat-ms", "500", "--node-lost-after-ms", "3000", "--preempt-grace-ms", "1000"],
        &nodes,
    );
    // One budget for the waits below that have no bound of their own.
    let deadline = Instant::now() + Duration::from_secs(90);
    let left = || deadline.saturating_duration_since(Instant::now());
    let json = |args: &[&str]| -> Option<serde_json::Value> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        let o = muster(&all);
        serde_json::from_slice(&o.stdout).ok()
    };
    let node_status = |id: &str| -> Option<String> {
        let v = json(&["node", "list"])?;
        v["nodes"].as_array()?.iter().find(|n| n["id"] == id).map(|n| n["status"].as_str().unwrap_or("").to_string())
    };
    muster_testkit::eventually_blocking("the agents to register", left(), || {
        nodes.iter().all(|n| node_status(n).as_deref() == Some("ready")).then_some(())
    });
    let script = r#"if [ "$MUSTER_EPOCH" = 1 ]; then echo $$ > pid-$MUSTER_TASK_INDEX; exec sleep 600; fi; echo ok"#;
    let id = submit_retried(
        left(),
        &["-n", "2", "--gpus", "2", "--scheduler", &addr, "--output", "json", "--", "sh", "-c", script],
    );
    let a = muster_testkit::eventually_blocking("the gang to run", left(), || {
        json(&["alloc", "get", &id]).filter(|a| a["status"] == "running")
    });
    let frozen = a["tasks"][0]["node"].as_str().unwrap().to_string();
    let pid_file = dir.path().join(&frozen).join("pid-0");
    let pid = muster_testkit::eventually_blocking("the pid file", left(), || {
        std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok())
    });
    let agent = children.agent(nodes.iter().position(|n| *n == frozen).unwrap());
    assert!(Command::new("kill").args(["-STOP", &agent.id().to_string()]).status().unwrap().success());
    let stopped_at = Instant::now();
    let within_35_s = Duration::from_secs(35).saturating_sub(stopped_at.elapsed());
    muster_testkit::eventually_blocking("the frozen node to be flagged lost (within 35 s)", within_35_s, || {
        match node_status(&frozen) {
            Some(s) if s == "lost" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let done = muster_testkit::eventually_blocking("the gang to be re-placed and finish", left(), || {
        json(&["alloc", "get", &id]).filter(|a| a["status"] == "done")
    });
    for t in done["tasks"].as_array().unwrap() {
        assert_ne!(t["last_node"].as_str().unwrap(), frozen, "re-placed away from the frozen node: {done}");
    }
    assert!(proc_alive(pid), "the frozen agent's task still runs until the agent returns");
    assert!(Command::new("kill").args(["-CONT", &agent.id().to_string()]).status().unwrap().success());
    let back = Instant::now();
    let within_30_s = Duration::from_secs(30).saturating_sub(back.elapsed());
    muster_testkit::eventually_blocking(
        "the stale task to stop and the flag to clear (within 30 s)",
        within_30_s,
        || {
            let (alive, node) = (proc_alive(pid), node_status(&frozen));
            if !alive && node.as_deref() == Some("ready") {
                Ok(())
            } else {
                Err(format!("task alive {alive}, node {node:?}"))
            }
        },
    );
}

/// `muster submit ARGS`, retried within `budget` until the cluster takes it
/// (a leader elected, the agents registered). With `--output json`, the
/// new allocation's id; otherwise its stdout.
fn submit_retried(budget: std::time::Duration, args: &[&str]) -> String {
    let json = args.windows(2).any(|w| w == ["--output", "json"]);
    muster_testkit::eventually_blocking("the submit to succeed", budget, || {
        let o = muster(&[&["submit"], args].concat());
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        Ok(if json {
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap().to_string()
        } else {
            String::from_utf8_lossy(&o.stdout).into_owned()
        })
    })
}
