//! vClusters through the CLI against a real `muster server` and real
//! agents: create, refuse a duplicate, update some fields and keep the
//! rest, list, get with the home nodes the selector picks, and clear errors
//! for bad input.

use std::time::{Duration, Instant};

use crate::{Procs, cluster, muster};

#[test]
fn t130_vclusters_are_created_updated_listed_and_resolve_their_home_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let _procs = Procs::start_with(dir.path(), &addr, &[], &["v1", "v2"], &["--label", "muster.vcluster=ml"]);
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
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run(&["list"]).status.success() {
        assert!(Instant::now() < deadline, "the server never answered");
        std::thread::sleep(Duration::from_millis(200));
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
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = json(&["get", "ml"]);
        if v["home_node_ids"].as_array().unwrap().len() == 2 {
            assert_eq!(json(&["get", "default"])["home_node_ids"], serde_json::json!([]));
            break;
        }
        assert!(Instant::now() < deadline, "the agents never showed as ml's home: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = muster(&["node", "list", "--scheduler", &addr, "--output", "json"]);
        let ready = serde_json::from_slice::<serde_json::Value>(&nodes.stdout)
            .map(|v| v["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["status"] == "ready").count()))
            .unwrap_or(0);
        if ready == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "agents never registered");
        std::thread::sleep(Duration::from_millis(200));
    }
    json(&["vcluster", "update", "default", "--max-gpus", "2"]);
    let first = json(&["submit", "--gpus", "2", "--", "sleep", "120"])["id"].as_u64().unwrap().to_string();
    let second = json(&["submit", "--gpus", "2", "--", "sleep", "120"])["id"].as_u64().unwrap().to_string();
    let status = |id: &str| json(&["alloc", "get", id])["status"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&first) != "running" {
        assert!(Instant::now() < deadline, "the first gang never ran");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Several admission passes later the second still waits, for the quota.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(status(&second), "queued");
    let why = json(&["alloc", "explain", &second])["summary"].as_str().unwrap().to_string();
    assert!(why.contains("vCluster default's GPU quota: 2 held + 2 needed > 2"), "{why}");
    json(&["alloc", "cancel", &first]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&second) != "running" {
        assert!(Instant::now() < deadline, "the second gang never ran once the quota had room");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
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
        if o.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
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
