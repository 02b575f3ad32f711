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
