//! vClusters through the CLI against a real `muster server` and real
//! agents: create, refuse a duplicate, update some fields and keep the
//! rest, list, get with the home nodes the selector picks, and clear errors
//! for bad input.

use std::time::Duration;

use crate::dev_proc::wait_until;
use crate::{Procs, cluster, muster};

#[test]
fn t130_vclusters_are_created_updated_listed_and_resolve_their_home_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let _procs = Procs::start_with(dir.path(), &addr, &[], &["v1", "v2"], &[]);
    let run = |args: &[&str]| {
        let mut all = vec!["vcluster"];
        all.extend_from_slice(args);
        all.extend(["--scheduler", &addr, "--output", "json"]);
        muster(&all)
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let o = run(args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let refused = |args: &[&str], needle: &str| {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{args:?}: {needle:?} not in {err}");
    };
    // The server may still be electing itself.
    muster_testkit::eventually_blocking("the server to answer", Duration::from_secs(60), || {
        (run(&["list"]).status.success()).then_some(())
    });
    // The vCluster label is reserved: an admin sets it, not the agent.
    for node in ["v1", "v2"] {
        let o = muster(&["node", "label", node, "muster.vcluster=ml", "--scheduler", &addr]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    let v = json(&[
        "create",
        "ml",
        "--type",
        "ml-training",
        "--max-gpus",
        "16",
        "--borrow-limit",
        "20%",
        "--over-quota",
        "reject",
    ]);
    assert_eq!(
        (&v["name"], &v["type"], &v["max_gpus"], &v["borrow_limit_pct"], &v["over_quota"], &v["revision"]),
        (&"ml".into(), &"ml-training".into(), &16.into(), &20.into(), &"reject".into(), &1.into()),
        "{v}"
    );
    assert_eq!(v["home_labels"]["muster.vcluster"], "ml", "{v}");
    refused(&["create", "ml"], "vcluster ml already exists");

    let v = json(&["update", "ml", "--max-gpus", "none", "--max-allocations", "5"]);
    assert_eq!(
        (&v["max_gpus"], &v["max_allocations"], &v["revision"]),
        (&serde_json::Value::Null, &5.into(), &2.into())
    );
    assert_eq!(v["type"], "ml-training", "fields not given keep their value: {v}");
    assert!(v["updated_by"].as_str().unwrap().starts_with("admin "), "{v}");
    refused(&["update", "nosuch", "--max-gpus", "4"], "no vcluster nosuch");

    refused(&["create", "Bad_Name"], "invalid name");
    refused(&["create", "x", "--type", "gpu"], "invalid spec.type");
    refused(&["create", "x", "--over-quota", "maybe"], "invalid spec.over_quota");
    refused(&["create", "x", "--borrow-limit", "150"], "--borrow-limit \"150\"");
    refused(&["create", "x", "--max-nodes", "0"], "--max-nodes \"0\"");
    refused(&["create", "x", "--home-label", "a=b", "--home-node", "v1"], "one or the other");

    let names: Vec<String> = json(&["list"])["vclusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["default", "ml"]);

    // Both agents carry muster.vcluster=ml: ml's home, not default's.
    muster_testkit::eventually_blocking("the agents to show as ml's home", Duration::from_secs(60), || {
        let v = json(&["get", "ml"]);
        if v["home_node_ids"].as_array().unwrap().len() != 2 {
            return Err(v.to_string());
        }
        assert_eq!(json(&["get", "default"])["home_node_ids"], serde_json::json!([]));
        Ok(())
    });
    let v = json(&["update", "ml", "--home-node", "v2"]);
    assert_eq!(v["home_node_ids"], serde_json::json!(["v2"]), "{v}");

    // The text table.
    let o = muster(&["vcluster", "list", "--scheduler", &addr]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.lines().any(|l| l.starts_with("ml ") && l.contains("ml-training") && l.contains("20%")), "{text}");
}

/// A hard quota through real processes: with the default vCluster capped
/// at 2 GPUs, of two 2-GPU gangs one runs and the other waits, `explain`
/// saying it is the quota (not capacity: a node is free); cancelling the
/// first lets the second run.
#[test]
fn t131_a_hard_quota_holds_back_a_gang_until_the_vcluster_has_room() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let _procs = Procs::start(dir.path(), &addr, &[], &["q1", "q2"]);
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = args.to_vec();
        let split = all.iter().position(|a| *a == "--").unwrap_or(all.len());
        all.splice(split..split, ["--scheduler", addr.as_str(), "--output", "json"]);
        let o = muster(&all);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    muster_testkit::eventually_blocking("the agents to register", Duration::from_secs(60), || {
        let nodes = muster(&["node", "list", "--scheduler", &addr, "--output", "json"]);
        let ready = serde_json::from_slice::<serde_json::Value>(&nodes.stdout)
            .map(|v| v["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["status"] == "ready").count()))
            .unwrap_or(0);
        (ready == 2).then_some(())
    });
    json(&["vcluster", "update", "default", "--max-gpus", "2"]);
    let first = json(&["submit", "--gpus", "2", "--", "sleep", "120"])["id"].as_u64().unwrap().to_string();
    let second = json(&["submit", "--gpus", "2", "--", "sleep", "120"])["id"].as_u64().unwrap().to_string();
    let status = |id: &str| json(&["alloc", "get", id])["status"].as_str().unwrap().to_string();
    muster_testkit::eventually_blocking("the first gang to run", Duration::from_secs(60), || {
        (status(&first) == "running").then_some(())
    });
    // A CPU-only job submitted after the second is placed and done: the
    // admission pass that placed it had the second ahead of it in the
    // queue, and still left it waiting, for the quota.
    let probe = json(&["submit", "--gpus", "0", "--", "true"])["id"].as_u64().unwrap().to_string();
    muster_testkit::eventually_blocking("the CPU-only job after it to finish", Duration::from_secs(60), || {
        (status(&probe) == "done").then_some(())
    });
    assert_eq!(status(&second), "queued");
    let why = json(&["alloc", "explain", &second])["summary"].as_str().unwrap().to_string();
    assert!(why.contains("vCluster default's GPU quota: 2 held + 2 needed > 2"), "{why}");
    json(&["alloc", "cancel", &first]);
    muster_testkit::eventually_blocking(
        "the second gang to run once the quota has room",
        Duration::from_secs(60),
        || (status(&second) == "running").then_some(()),
    );
}

/// Racing submissions against a `reject`-mode quota, through real
/// processes: with room for one more allocation, two `muster submit`
/// processes started together; the log decides, exactly one is accepted
/// and the other refused with the quota named, and a third is refused too.
#[test]
fn t132_racing_submissions_against_a_reject_quota_admit_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let _procs = Procs::start(dir.path(), &addr, &[], &[]);
    muster_testkit::eventually_blocking("the vCluster team to be created", Duration::from_secs(60), || {
        let o = muster(&[
            "vcluster",
            "create",
            "team",
            "--max-allocations",
            "2",
            "--over-quota",
            "reject",
            "--scheduler",
            &addr,
        ]);
        if o.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&o.stderr).into_owned()) }
    });
    let submit = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["submit", "--vcluster", "team", "--scheduler", &addr, "--", "sleep", "60"])
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .output()
            .unwrap()
    };
    assert!(submit().status.success(), "the first of two fits");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(submit);
        let b = s.spawn(submit);
        (a.join().unwrap(), b.join().unwrap())
    });
    let accepted = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(accepted, 1, "exactly one of the racing submissions:\n{a:?}\n{b:?}");
    let refused = if a.status.success() { &b } else { &a };
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("over quota: vCluster team's allocation quota: 2 live, at most 2"), "{err}");
    assert!(!submit().status.success(), "still full");
    // An allocation names a vCluster that exists.
    let o = muster(&["submit", "--vcluster", "nosuch", "--scheduler", &addr, "--", "true"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no vcluster nosuch"), "{o:?}");
}

/// The issue's "done means" on `muster dev` with two vClusters: ml's home
/// is node-1 and node-2, batch's node-3 and node-4. ml (borrowing up to all
/// of its demand) runs a 4-node gang: two tasks at home, two on batch's
/// idle nodes, marked borrowed. Then batch submits a 2-node gang: after the
/// return grace (3 s here) ml's gang gets a checkpoint hint, saves, stops,
/// and batch's gang runs on its own nodes; ml's gang is suspended (it
/// resumes from its checkpoint once there is room) and the preemption is
/// counted as `reason="reclaim"`.
#[test]
fn t133_a_vcluster_borrows_idle_nodes_and_gives_them_back_when_reclaimed() {
    let dev =
        crate::dev_proc::Dev::start_with(&["--node-vclusters", "ml,ml,batch,batch", "--reclaim-grace-ms", "3000"]);
    let ok = |args: &[&str]| dev.ok(args);
    // `muster dev --node-vclusters` made the vClusters it labelled nodes for.
    let names: Vec<String> = ok(&["vcluster", "list"])["vclusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"ml".to_string()) && names.contains(&"batch".to_string()), "{names:?}");
    ok(&["vcluster", "update", "ml", "--type", "ml-training", "--borrow-limit", "100%"]);
    let homes = ok(&["vcluster", "get", "batch"]);
    let mut ids: Vec<&str> = homes["home_node_ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["node-3", "node-4"], "{homes}");

    let trainer = r#"step=0
if [ "$MUSTER_RESUME" = 1 ]; then echo "resumed from $(cat "$MUSTER_CHECKPOINT_DIR/step")"; exit 0; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
while true; do step=$((step+1)); sleep 0.1; done"#;
    let ml = ok(&["submit", "--vcluster", "ml", "-n", "4", "--gpus", "8", "--class", "5", "--", "sh", "-c", trainer]);
    let ml = ml["id"].as_u64().unwrap().to_string();
    let get = |id: &str| ok(&["alloc", "get", id]);
    wait_until("ml's gang to run", || get(&ml)["status"] == "running");
    let a = get(&ml);
    assert_eq!(a["vcluster_type"], "ml-training", "an allocation takes its vCluster's type: {a}");
    let other = dev.json(&["submit", "--vcluster", "ml", "--vcluster-type", "service", "--", "true"]);
    let err = other["error"].as_str().unwrap_or_default();
    assert!(err.contains("invalid spec.vcluster_type: vCluster ml is of type ml-training, not service"), "{other}");
    let borrowed: Vec<(String, String)> = a["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["node"].as_str().unwrap().to_string(), t["borrowed_from"].as_str().unwrap().to_string()))
        .collect();
    let mut on_batch: Vec<&str> =
        borrowed.iter().filter(|(_, from)| from == "batch").map(|(node, _)| node.as_str()).collect();
    on_batch.sort();
    assert_eq!(on_batch, ["node-3", "node-4"], "two tasks borrow batch's nodes: {borrowed:?}");

    // batch takes its nodes back.
    let b = ok(&["submit", "--vcluster", "batch", "-n", "2", "--gpus", "8", "--", "sleep", "600"]);
    let b = b["id"].as_u64().unwrap().to_string();
    wait_until("batch's gang to run on its own nodes", || get(&b)["status"] == "running");
    let mut nodes: Vec<String> =
        get(&b)["tasks"].as_array().unwrap().iter().map(|t| t["node"].as_str().unwrap().to_string()).collect();
    nodes.sort();
    assert_eq!(nodes, ["node-3", "node-4"]);
    // ml's gang checkpointed (not killed): suspended, to resume later.
    wait_until("ml's gang to be suspended", || get(&ml)["status"] == "suspended");
    let a = get(&ml);
    assert!(a["tasks"].as_array().unwrap().iter().all(|t| t["checkpoint_bytes"].as_u64().unwrap() > 0), "{a}");
    // Counted as a reclamation on the leader's metrics.
    let counted = (0..3).any(|i| {
        dev.get(i, "/metrics").is_some_and(|(_, body)| {
            body.lines().any(|l| {
                l.starts_with("muster_preemptions_total")
                    && l.contains("reason=\"reclaim\"")
                    && l.contains("vcluster=\"ml\"")
                    && l.ends_with(" 1")
            })
        })
    });
    assert!(counted, "muster_preemptions_total{{reason=\"reclaim\",vcluster=\"ml\"}} 1 on the leader");
    let why = ok(&["alloc", "explain", &ml]);
    assert!(why["summary"].is_string(), "{why}");
}

/// Backfill on a real `muster dev`: a gang that does not fit gets a planned
/// start (shown by `muster alloc explain`); a job that ends before it runs
/// ahead, one that would run past it waits and says why.
#[test]
fn t134_backfill_plans_a_start_and_runs_only_work_that_ends_in_time() {
    let dev = crate::dev_proc::Dev::start();
    let ok = |args: &[&str]| dev.ok(args);
    let id = |v: serde_json::Value| v["id"].as_u64().unwrap().to_string();
    let get = |id: &str| ok(&["alloc", "get", id]);
    let running = id(ok(&["submit", "-n", "2", "--gpus", "8", "--walltime", "1h", "--", "sleep", "600"]));
    wait_until("the first gang to run", || get(&running)["status"] == "running");
    let big = id(ok(&["submit", "-n", "4", "--gpus", "8", "--", "sleep", "1"]));
    let planned = |id: &str| ok(&["alloc", "explain", id]);
    wait_until("the big gang's planned start", || !planned(&big)["planned_start"].is_null());
    let e = planned(&big);
    let in_ms = e["planned_start"]["in_ms"].as_u64().unwrap();
    assert!((3_500_000..=3_600_000).contains(&in_ms), "about an hour off: {e}");
    assert_eq!(e["planned_start"]["nodes"].as_array().unwrap().len(), 4, "{e}");
    assert!(e["summary"].as_str().unwrap().contains("planned start in"), "{e}");

    let long = id(ok(&["submit", "-n", "1", "--gpus", "8", "--walltime", "2h", "--", "sleep", "600"]));
    let short = id(ok(&["submit", "-n", "1", "--gpus", "8", "--walltime", "10m", "--", "sleep", "600"]));
    wait_until("the short job to run ahead", || get(&short)["status"] == "running");
    let why = planned(&long);
    assert_eq!(get(&long)["status"], "queued");
    assert!(why["summary"].as_str().unwrap().contains(&format!("held for allocation {big}'s planned start")), "{why}");
    assert_eq!(get(&big)["status"], "queued");
}

/// Backfill plans a waiting dependent's start at its dependency's walltime
/// end: a 4-node gang after a 10-minute job gets the cluster's planned start
/// for then, an hour-long job is held off its nodes, a 5-minute one runs.
#[test]
fn t135_backfill_plans_a_dependents_start_at_its_dependencys_walltime_end() {
    let dev = crate::dev_proc::Dev::start();
    let ok = |args: &[&str]| dev.ok(args);
    let id = |v: serde_json::Value| v["id"].as_u64().unwrap().to_string();
    let get = |id: &str| ok(&["alloc", "get", id]);
    let explain = |id: &str| ok(&["alloc", "explain", id]);
    let pre = id(ok(&["submit", "-n", "1", "--gpus", "8", "--walltime", "10m", "--", "sleep", "600"]));
    wait_until("preprocess to run", || get(&pre)["status"] == "running");
    let train = id(ok(&["submit", "-n", "4", "--gpus", "8", "--after", &pre, "--", "sleep", "1"]));
    assert_eq!(get(&train)["status"], "waiting");
    let e = explain(&train);
    let in_ms = e["planned_start"]["in_ms"].as_u64().unwrap();
    assert!((500_000..=600_000).contains(&in_ms), "about 10 min off: {e}");
    assert_eq!(e["planned_start"]["nodes"].as_array().unwrap().len(), 4, "{e}");
    let summary = e["summary"].as_str().unwrap();
    assert!(summary.contains("planned to be queued in") && summary.contains("planned start in"), "{e}");

    let long = id(ok(&["submit", "-n", "1", "--gpus", "8", "--walltime", "1h", "--", "sleep", "600"]));
    let short = id(ok(&["submit", "-n", "1", "--gpus", "8", "--walltime", "5m", "--", "sleep", "600"]));
    wait_until("the short job to run ahead", || get(&short)["status"] == "running");
    let why = explain(&long);
    assert_eq!(get(&long)["status"], "queued");
    assert!(
        why["summary"].as_str().unwrap().contains(&format!("held for allocation {train}'s planned start")),
        "{why}"
    );
}
