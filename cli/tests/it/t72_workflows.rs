//! Workflows (issue 48): dependencies between allocations, job arrays and
//! multi-step submits on real servers and agents.

use crate::cluster::{WAIT, free_port};
use crate::{Procs, muster};

/// A pipeline of four: `pre`, then `train` (which fails), then `eval`
/// after `train` succeeds and `report` after it fails. `pre` holds at a
/// gate the test opens, so the waiting is seen without timing luck. The
/// steps run in order, `eval` ends at once as failed naming its dependency
/// (and never runs), `report` runs; the command line's and the server's
/// refusals name what is wrong.
#[test]
fn t208_a_pipeline_runs_in_order_and_a_failed_step_ends_its_dependent_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _procs = Procs::start(dir.path(), &addr, &[], &["w1"]);
    // The cluster's flags go before any `--` (what follows is the task's).
    let run = |args: &[&str]| {
        let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..split].to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        all.extend(&args[split..]);
        let o = muster(&all);
        (o.status, String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let get = |id: u64| -> serde_json::Value {
        let (status, out, err) = run(&["alloc", "get", &id.to_string()]);
        assert!(status.success(), "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let log = dir.path().join("steps.log");
    let gate = dir.path().join("gate");
    let step = |name: &str, tail: &str| {
        format!("echo start-{name} >> {0}; sleep 0.2; echo end-{name} >> {0}{tail}", log.display())
    };
    let submit = |extra: &[&str], script: String| -> u64 {
        muster_testkit::eventually_blocking("the submit to succeed", WAIT, || {
            let mut args = vec!["submit", "--gpus", "0", "--cpus", "1", "--mem-mb", "64", "--max-retries", "1"];
            args.extend(extra);
            args.extend(["--", "sh", "-c", &script]);
            let (status, out, err) = run(&args);
            if status.success() {
                Ok(serde_json::from_str::<serde_json::Value>(&out).unwrap()["id"].as_u64().unwrap())
            } else {
                Err(err)
            }
        })
    };
    let wait_gate = format!("while [ ! -e {} ]; do sleep 0.1; done; ", gate.display());
    let pre = submit(&[], format!("{wait_gate}{}", step("pre", "")));
    let train = submit(&["--after", &pre.to_string()], step("train", "; exit 3"));
    let eval = submit(&["--after", &format!("{train}:ok")], step("eval", ""));
    let report = submit(&["--after", &format!("{train}:notok")], step("report", ""));
    for id in [train, eval, report] {
        assert_eq!(get(id)["status"], "waiting", "{}", get(id));
    }
    assert_eq!(get(report)["after"], serde_json::json!([{"id": train, "when": "notok"}]));
    let text = muster(&["alloc", "get", &report.to_string(), "--scheduler", &addr]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("after: {train}:notok")), "{text}");
    let (status, out, _) = run(&["alloc", "explain", &eval.to_string()]);
    assert!(status.success() && out.contains(&format!("waiting for {train} (waiting) to succeed")), "{out}");
    // A watch opened while it waits says where what it waits for stands.
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["alloc", "watch", &eval.to_string(), "--scheduler", &addr])
        .env("MUSTER_TLS_DIR", crate::tls::dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = loop {
        let line = rx.recv_timeout(WAIT).expect("the watch's submitted line");
        if line.contains("submitted") {
            break line;
        }
    };
    watch.kill().unwrap();
    watch.wait().unwrap();
    assert!(first.contains(&format!("submitted; waiting for {train} (waiting) to succeed")), "{first}");
    let listed: serde_json::Value = serde_json::from_str(&run(&["alloc", "list", "--status", "waiting"]).1).unwrap();
    let ids: Vec<u64> = listed["allocations"].as_array().unwrap().iter().map(|a| a["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [train, eval, report], "a status filter finds the waiting ones");

    std::fs::write(&gate, "").unwrap();
    let ended = |id: u64| {
        muster_testkit::eventually_blocking(&format!("allocation {id} to end"), WAIT, || {
            let a = get(id);
            if ["done", "failed", "cancelled"].contains(&a["status"].as_str().unwrap()) {
                Ok(a)
            } else {
                Err(a.to_string())
            }
        })
    };
    assert_eq!(ended(pre)["status"], "done");
    assert_eq!(ended(train)["status"], "failed");
    let e = ended(eval);
    assert_eq!(
        (e["status"].as_str(), e["failed_reason"].as_str()),
        (Some("failed"), Some(&*format!("dependency {train} failed")))
    );
    assert_eq!(ended(report)["status"], "done");
    // Its watch names what it waited for, then that it was met.
    let (status, watch, err) = run(&["alloc", "watch", &report.to_string()]);
    assert!(status.success(), "{err}");
    assert!(watch.contains(&format!("submitted; waiting for {train} to fail or be cancelled")), "{watch}");
    assert!(watch.contains("dependencies_met"), "{watch}");
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        ["start-pre", "end-pre", "start-train", "end-train", "start-report", "end-report"],
        "each step after the one it waits for, and eval never"
    );

    // Refusals: the command line's (exit 2) and the server's (exit 1).
    for (args, code, needle) in [
        (vec!["--after", "0"], 2, "--after \"0\" in \"0\" is not an allocation id"),
        (vec!["--after", "1:soon"], 2, "not one of ok, any, notok, started"),
        (vec!["--keep-if-unsatisfiable"], 2, "--keep-if-unsatisfiable needs --after or --after-any-of"),
        (vec!["--after", "1", "--after-any-of", "2"], 2, "cannot be used with"),
        (vec!["--after", "999999"], 1, "after: allocation 999999 does not exist"),
    ] {
        let mut all = vec!["submit"];
        all.extend(args.iter().copied());
        all.extend(["--", "true"]);
        let (status, _, err) = run(&all);
        assert_eq!(status.code(), Some(code), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: {err}");
    }
}

/// A job array through the CLI on a real server and agent: one submit of
/// 24 elements throttled to 3, each task told its index by Muster's and
/// Slurm's variables. Every index runs once; never more than 3 at once
/// though the node has room for 16; the list folds the array into one row
/// (`--expand` lists the elements); a second array `--after-corr` runs
/// element k only after element k of the first succeeded, and its element
/// whose partner failed ends at once as failed; a range cancel and a
/// throttle change reach a live array.
#[test]
fn t209_an_array_runs_every_index_within_its_throttle_and_after_corr_pairs_elements() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _procs = Procs::start_with(dir.path(), &addr, &[], &["w1"], &["--cpus", "16", "--mem-mb", "16384"]);
    let run = |args: &[&str]| {
        let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..split].to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        all.extend(&args[split..]);
        let o = muster(&all);
        (o.status, String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let (status, out, err) = run(args);
        assert!(status.success(), "{args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let submit = |extra: &[&str], script: String| -> serde_json::Value {
        muster_testkit::eventually_blocking("the submit to succeed", WAIT, || {
            let mut args = vec!["submit", "--gpus", "0", "--cpus", "1", "--mem-mb", "64", "--max-retries", "1"];
            args.extend(extra);
            args.extend(["--", "sh", "-c", &script]);
            let (status, out, err) = run(&args);
            if status.success() { Ok(serde_json::from_str::<serde_json::Value>(&out).unwrap()) } else { Err(err) }
        })
    };
    let finished = |id: u64| {
        muster_testkit::eventually_blocking(&format!("array {id} to finish"), WAIT * 4, || {
            let a = json(&["alloc", "get", &id.to_string()]);
            if a["finished"] == true { Ok(a) } else { Err(a.to_string()) }
        })
    };
    let running = dir.path().join("running");
    std::fs::create_dir(&running).unwrap();
    let log = dir.path().join("a.log");
    // Each element marks itself running, records how many are, and the
    // odd one out (index 5) fails.
    let script = format!(
        "k=$MUSTER_ARRAY_INDEX; touch {r}/$k; n=$(ls {r} | wc -l); echo \"$k $SLURM_ARRAY_TASK_ID $n \
         $SLURM_ARRAY_TASK_COUNT\" >> {log}; sleep 0.3; rm {r}/$k; [ $k -ne 5 ]",
        r = running.display(),
        log = log.display()
    );
    let a = submit(&["--array", "0-23%3", "--name", "sweep"], script);
    assert_eq!((a["array"].as_bool(), a["elements"].as_u64()), (Some(true), Some(24)), "{a}");
    let a = a["id"].as_u64().unwrap();
    // The list folds the array into one row; --expand lists its elements.
    let listed = json(&["alloc", "list"]);
    assert_eq!(listed["arrays"][0]["id"], a, "{listed}");
    assert!(listed["allocations"].as_array().unwrap().is_empty(), "{listed}");
    let text = muster(&["alloc", "list", "--scheduler", &addr]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("sweep") && text.contains("0-23"), "{text}");
    let expanded = json(&["alloc", "list", "--expand"]);
    let element = &expanded["allocations"][0];
    assert_eq!((element["array_id"].as_u64(), element["array_index"].as_u64()), (Some(a), Some(0)), "{expanded}");
    // A second array pairs with the first, element by element.
    let pairs = dir.path().join("b.log");
    let b = submit(
        &["--array", "3-7", "--after-corr", &a.to_string()],
        format!("echo $MUSTER_ARRAY_INDEX >> {}", pairs.display()),
    );
    let b = b["id"].as_u64().unwrap();
    let done = finished(a);
    assert_eq!(done["by_status"], serde_json::json!({"done": 23, "failed": 1}), "{done}");
    assert_eq!(done["status"], "failed");
    let lines = std::fs::read_to_string(&log).unwrap();
    let mut seen: Vec<u32> = Vec::new();
    for line in lines.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], f[1], "SLURM_ARRAY_TASK_ID is the index: {line}");
        assert_eq!(f[3], "24", "{line}");
        let at_once: u32 = f[2].parse().unwrap();
        assert!(at_once <= 3, "{at_once} ran at once, over the throttle of 3:\n{lines}");
        seen.push(f[0].parse().unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..24).collect::<Vec<_>>(), "every index once");
    let b_done = finished(b);
    assert_eq!(b_done["by_status"], serde_json::json!({"done": 4, "failed": 1}), "{b_done}");
    let element5 = json(&["alloc", "get", &(b + 1 + 2).to_string()]);
    assert_eq!(element5["failed_reason"], format!("dependency {} failed", a + 1 + 5), "{element5}");
    let mut ran: Vec<u32> =
        std::fs::read_to_string(&pairs).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    ran.sort_unstable();
    assert_eq!(ran, [3, 4, 6, 7], "5's partner failed: it never ran");
    // The job history and usage group elements by their array.
    let records = muster_testkit::eventually_blocking("the array's history records", WAIT, || {
        let h = json(&["history", "--array", &a.to_string()]);
        match h.as_array().map_or(0, Vec::len) {
            24 => Ok(h),
            n => Err(format!("{n} records")),
        }
    });
    let indices: Vec<u64> = records.as_array().unwrap().iter().map(|r| r["array_index"].as_u64().unwrap()).collect();
    assert_eq!(indices.iter().copied().collect::<std::collections::BTreeSet<u64>>().len(), 24, "{records}");
    let usage = json(&["usage", "--by", "array"]);
    let row = usage["rows"].as_array().unwrap().iter().find(|r| r["array"] == a).expect("a row for the array");
    assert_eq!((row["jobs"].as_u64(), row["done"].as_u64(), row["failed"].as_u64()), (Some(24), Some(23), Some(1)));

    // A live array: its throttle changes, a range of it is cancelled.
    let gate = dir.path().join("gate");
    let c = submit(&["--array", "0-99%2"], format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display()));
    let c = c["id"].as_u64().unwrap();
    let t = json(&["alloc", "throttle", &c.to_string(), "4"]);
    assert_eq!(t["throttle"], 4, "{t}");
    let cut = json(&["alloc", "cancel", &c.to_string(), "--indices", "50-99"]);
    assert_eq!(cut["by_status"]["cancelled"], 50, "{cut}");
    let (status, _, err) = run(&["alloc", "cancel", &c.to_string(), "--indices", "100"]);
    assert!(!status.success() && err.contains(&format!("array {c} has no element with index 100")), "{err}");
    let (status, _, err) = run(&["alloc", "throttle", &c.to_string(), "101"]);
    assert!(!status.success() && err.contains("more than array"), "{err}");
    let (status, _, err) = run(&["submit", "--array", "0-9%0", "--", "true"]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--array") && err.contains("throttle"), "{err}");
    json(&["alloc", "cancel", &c.to_string()]);
    let all = finished(c);
    assert_eq!(all["status"], "cancelled", "{all}");
}

/// A workflow through the CLI on a real server and agent: five steps in
/// one submit, given out of order (the file lists `train` before what it
/// waits for). They run in order; `evaluate` ends at once as failed naming
/// `train`, `report` (after `train:notok`) runs, and an array step runs
/// each index once, each task told its workflow and step. A retried submit
/// with the key returns the same workflow; a cycle is refused naming its
/// steps, before anything is written; cancelling a workflow's id cancels
/// every step not yet finished.
#[test]
fn t210_a_workflow_is_one_submit_runs_in_order_and_is_cancelled_whole() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _procs = Procs::start_with(dir.path(), &addr, &[], &["w1", "w2"], &["--cpus", "16", "--mem-mb", "16384"]);
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        let o = muster(&all);
        (o.status, String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let (status, out, err) = run(args);
        assert!(status.success(), "{args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let log = dir.path().join("steps.log");
    let gate = dir.path().join("gate");
    let file = dir.path().join("pipeline.toml");
    let step = |name: &str, tail: &str| {
        format!(
            "[\"sh\", \"-c\", \"echo {name} $MUSTER_WORKFLOW_STEP ${{MUSTER_ARRAY_INDEX:-}} >> {}{tail}\"]",
            log.display()
        )
    };
    let common = "max-retries = 1\nmem-mb = 64\ncpus = 1\n";
    std::fs::write(
        &file,
        format!(
            "name = \"pipeline\"\nidempotency_key = \"nightly\"\n\n\
             [[step]]\nname = \"train\"\nafter = [\"preprocess\"]\ngang-size = 2\n{common}command = {}\n\n\
             [[step]]\nname = \"preprocess\"\n{common}command = [\"sh\", \"-c\", \"while [ ! -e {} ]; do sleep 0.1; \
             done; echo preprocess preprocess >> {}\"]\n\n\
             [[step]]\nname = \"evaluate\"\nafter = [\"train\"]\n{common}command = {}\n\n\
             [[step]]\nname = \"report\"\nafter = [\"train:notok\"]\n{common}command = {}\n\n\
             [[step]]\nname = \"sweep\"\nafter = [\"preprocess\"]\narray = \"0-2\"\n{common}command = {}\n",
            step("train", "; exit 3"),
            gate.display(),
            log.display(),
            step("evaluate", ""),
            step("report", ""),
            step("sweep", ""),
        ),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let w = muster_testkit::eventually_blocking("the workflow submit", WAIT, || {
        let (status, out, err) = run(&["submit", "--workflow", path]);
        if status.success() { Ok(serde_json::from_str::<serde_json::Value>(&out).unwrap()) } else { Err(err) }
    });
    let id = |step: &str| w["steps"][step]["id"].as_u64().unwrap_or_else(|| panic!("no step {step}: {w}"));
    let wid = w["id"].as_u64().unwrap();
    assert_eq!(id("preprocess"), wid + 1, "steps are made in order, each after what it waits for: {w}");
    assert_eq!(w["steps"]["train"]["status"], "waiting", "{w}");
    assert_eq!(w["steps"]["sweep"]["array"], true, "{w}");
    let again = json(&["submit", "--workflow", path]);
    assert_eq!((again["id"].as_u64(), again["duplicate"].as_bool()), (Some(wid), Some(true)), "{again}");

    std::fs::write(&gate, "").unwrap();
    let ended = |what: &str, args: &[&str], done: &dyn Fn(&serde_json::Value) -> bool| {
        muster_testkit::eventually_blocking(what, WAIT, || {
            let v = json(args);
            if done(&v) { Ok(v) } else { Err(v.to_string()) }
        })
    };
    let all = ended("the workflow to finish", &["alloc", "get", &wid.to_string()], &|v| v["finished"] == true);
    let status = |step: &str| {
        all["steps"].as_array().unwrap().iter().find(|s| s["name"] == step).unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        ["preprocess", "train", "evaluate", "report", "sweep"].map(status),
        ["done", "failed", "failed", "done", "done"],
        "{all}"
    );
    let eval = json(&["alloc", "get", &id("evaluate").to_string()]);
    assert_eq!(eval["failed_reason"], format!("dependency {} failed", id("train")), "{eval}");
    let mut lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    assert_eq!(lines[0], "preprocess preprocess", "the first step first:\n{lines:?}");
    lines.sort();
    assert_eq!(
        lines,
        [
            "preprocess preprocess",
            "report report",
            "sweep sweep 0",
            "sweep sweep 1",
            "sweep sweep 2",
            "train train",
            "train train"
        ],
        "each step's tasks know their step; evaluate never ran"
    );

    // A cycle is refused before anything is written, naming its steps.
    let cycle = dir.path().join("cycle.toml");
    std::fs::write(
        &cycle,
        "name = \"loop\"\n[[step]]\nname = \"a\"\nafter = [\"b\"]\ncommand = [\"true\"]\n\
         [[step]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let (status, _, err) = run(&["submit", "--workflow", cycle.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("steps a, b wait for each other"), "{err}");
    let (status, _, err) = run(&["submit", "--workflow", "/nonexistent.toml"]);
    assert_eq!(status.code(), Some(2), "{err}");

    // Cancelling the workflow cancels every step left.
    let held = dir.path().join("held.toml");
    std::fs::write(
        &held,
        "name = \"held\"\n[[step]]\nname = \"wait\"\nmem-mb = 64\ncommand = [\"sh\", \"-c\", \"sleep 300\"]\n\
             [[step]]\nname = \"next\"\nafter = [\"wait\"]\nmem-mb = 64\narray = \"0-9\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let h = json(&["submit", "--workflow", held.to_str().unwrap()]);
    let hid = h["id"].as_u64().unwrap().to_string();
    json(&["alloc", "cancel", &hid]);
    let gone = ended("the held workflow to be cancelled", &["alloc", "get", &hid], &|v| v["finished"] == true);
    let statuses: Vec<&str> = gone["steps"].as_array().unwrap().iter().map(|s| s["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["cancelled", "cancelled"], "{gone}");
}

/// The README's pipeline, `examples/torch_pipeline/pipeline.toml`, as it
/// is: preprocess, a 4-rank PyTorch DDP gang (gloo on CPUs) that trains on
/// what preprocess wrote, and evaluate, which loads the model the gang
/// saved. One submit; every step succeeds, in order.
#[test]
fn t211_the_torch_pipeline_example_runs_preprocess_train_and_evaluate() {
    if !crate::dev_proc::python_imports("torch, torch.distributed", "PyTorch", "python3 -m pip install torch") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let agents = ["p1", "p2", "p3", "p4"];
    let _procs = Procs::start_with(dir.path(), &addr, &[], &agents, &["--cpus", "8", "--mem-mb", "16384"]);
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/torch_pipeline/pipeline.toml");
    let json = |args: &[&str]| -> Result<serde_json::Value, String> {
        let mut all = args.to_vec();
        all.extend(["--scheduler", &addr, "--output", "json"]);
        let o = muster(&all);
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())
    };
    // Every agent registered (the gang needs four nodes).
    let w = muster_testkit::eventually_blocking("the pipeline submit", WAIT, || {
        let nodes = json(&["node", "list"])?;
        let ready = nodes["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["status"] == "ready").count());
        if ready < agents.len() {
            return Err(format!("{ready} nodes ready"));
        }
        json(&["submit", "--workflow", file])
    });
    let wid = w["id"].as_u64().unwrap().to_string();
    let done = muster_testkit::eventually_blocking("the pipeline to finish", WAIT * 5, || {
        let v = json(&["alloc", "get", &wid])?;
        if v["finished"] == true { Ok(v) } else { Err(v.to_string()) }
    });
    let statuses: Vec<(&str, &str)> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    let eval = w["steps"]["evaluate"]["id"].as_u64().unwrap().to_string();
    let o = muster(&["alloc", "logs", &eval, "--scheduler", &addr]);
    let logs = String::from_utf8_lossy(&o.stdout);
    assert_eq!(statuses, [("preprocess", "done"), ("train", "done"), ("evaluate", "done")], "{done}\n{logs}");
    assert!(logs.contains("evaluate: mse"), "{logs}");
}

/// Three replicas and real agents run throttled and correlated arrays, a
/// range cancel and a workflow to their end; then every replica, at the
/// same applied index, has the same state digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t212_replicas_agree_on_the_digest_after_arrays_and_a_workflow() {
    use muster_proto::v1;
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::tls::quick_cluster(3, std::time::Duration::from_secs(2));
    let c = muster_local::LocalCluster::start(dir.path(), cfg).await.unwrap();
    let spec = || v1::AllocationSpec {
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 64, cpus: 1 }),
        ..crate::t26_e2e::gang(1, "test $MUSTER_ARRAY_INDEX -ne 7", 1)
    };
    let submit = |req: v1::SubmitRequest| {
        let c = &c;
        async move {
            muster_testkit::eventually_async("the submit to succeed", WAIT, || async {
                let mut client = crate::t26_e2e::leader_client(c).await;
                client.submit(req.clone()).await.map(|r| r.into_inner().id).map_err(|e| e.to_string())
            })
            .await
        }
    };
    let a = submit(v1::SubmitRequest { spec: Some(spec()), array: "0-29%4".into(), ..Default::default() }).await;
    let b = submit(v1::SubmitRequest { spec: Some(spec()), array: "0-29".into(), after_corr: a, ..Default::default() })
        .await;
    let mut client = crate::t26_e2e::leader_client(&c).await;
    client.cancel(v1::CancelRequest { id: b, indices: "20-29".into() }).await.unwrap();
    let step = |name: &str, after: &[&str]| v1::WorkflowStep {
        name: name.into(),
        spec: Some(v1::AllocationSpec { owner: String::new(), ..spec() }),
        after: after.iter().map(|s| v1::StepDependency { step: s.to_string(), when: String::new() }).collect(),
        ..Default::default()
    };
    let w = client
        .submit_workflow(v1::SubmitWorkflowRequest {
            name: "wf".into(),
            steps: vec![step("a", &[]), step("b", &["a"]), step("c", &["b"])],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    muster_testkit::eventually_async("the arrays and the workflow to finish", WAIT * 3, || async {
        let mut client = crate::t26_e2e::leader_client(&c).await;
        let mut pending = Vec::new();
        for id in [a, b] {
            let array = client.get_array(v1::GetRequest { id }).await.map_err(|e| e.to_string())?.into_inner();
            if !array.finished {
                pending.push(format!("{array:?}"));
            }
        }
        let wf = client.get_workflow(v1::GetRequest { id: w }).await.map_err(|e| e.to_string())?.into_inner();
        if !wf.finished {
            pending.push(format!("{wf:?}"));
        }
        if pending.is_empty() { Ok(()) } else { Err(pending.join("\n")) }
    })
    .await;
    let b_done = client.get_array(v1::GetRequest { id: b }).await.unwrap().into_inner();
    assert_eq!(
        b_done.by_status,
        [("cancelled".to_string(), 10), ("done".to_string(), 19), ("failed".to_string(), 1)].into(),
        "element 7 failed with its partner; 20-29 were cancelled"
    );
    let (index, digests) = muster_testkit::eventually_async("every replica at one applied index", WAIT, || async {
        let statuses: Vec<v1::ReplicaStatus> = (1..=3).filter_map(|id| c.replica(id).map(|r| r.status())).collect();
        let first = statuses[0].applied_index;
        if statuses.len() == 3 && statuses.iter().all(|s| s.applied_index == first) {
            Ok((first, statuses.iter().map(|s| s.state_digest.clone()).collect::<Vec<_>>()))
        } else {
            Err(format!("{:?}", statuses.iter().map(|s| s.applied_index).collect::<Vec<_>>()))
        }
    })
    .await;
    assert!(digests.iter().all(|d| *d == digests[0] && !d.is_empty()), "at {index}: {digests:?}");
    c.shutdown().await;
}
