//! The client and admin CLI against a real three-replica cluster: status with
//! equal digests, submit / get / list in text and JSON, and one readable line
//! with a non-zero exit for every kind of failure.

use crate::cluster::{Cluster, converged, free_port, leader};
use crate::{muster, stdout};

/// Puts `--scheduler ADDR` before any `--` (after it, it would be part of the command).
fn with_scheduler<'a>(args: &[&'a str], addr: &'a str) -> Vec<&'a str> {
    let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut full = args[..at].to_vec();
    full.extend(["--scheduler", addr]);
    full.extend(&args[at..]);
    full
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_cli_drives_a_real_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]);
    leader(&cluster.addrs, None).await;
    // One listed replica is enough: the CLI finds the leader from there.
    let sched = cluster.addrs[2].clone();
    let run = |args: &[&str]| muster(&with_scheduler(args, &sched));

    let o =
        run(&["submit", "-n", "2", "--gpus", "1", "--class", "4", "--idempotency-key", "job-1", "--", "sleep", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "allocation 1 submitted");
    let o = run(&[
        "submit",
        "-n",
        "2",
        "--gpus",
        "1",
        "--class",
        "4",
        "--idempotency-key",
        "job-1",
        "--output",
        "json",
        "--",
        "sleep",
        "1",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["id"].as_u64(), v["duplicate"].as_bool()), (Some(1), Some(true)));

    let o = run(&["alloc", "get", "1", "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["gang_size"], 2);
    assert_eq!(v["preemption_class"], 4);
    assert_eq!(v["status"], "queued");
    assert_eq!(v["tasks"].as_array().unwrap().len(), 2);

    let o = run(&["alloc", "list", "--status", "queued"]);
    assert!(stdout(&o).contains("sleep 1"), "{}", stdout(&o));
    let header = stdout(&o).lines().next().unwrap_or_default().to_string();
    assert!(header.contains("ID") && header.contains("OWNER") && header.contains("COMMAND"), "{header}");
    let o = run(&["alloc", "list", "--status", "done"]);
    assert_eq!(stdout(&o).trim(), "no allocations");

    let (index, digest) = converged(&cluster.addrs).await;
    let o = run(&["cluster", "status", "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["leader_id"].as_u64().is_some());
    let replicas = v["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3);
    for r in replicas {
        for field in ["id", "address", "role", "term", "applied_index", "state_digest"] {
            assert!(!r[field].is_null(), "{field} missing in {r}");
        }
        assert_eq!(r["state_digest"], digest.as_str());
        assert_eq!(r["applied_index"], index);
    }

    // Refused commands: one line, the field named, non-zero exit.
    let o = run(&["submit", "--class", "11", "--", "x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid spec.preemption_class"), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    let o = run(&["submit", "-n", "0", "--", "x"]);
    assert!(stderr(&o).contains("invalid spec.gang_size"), "{}", stderr(&o));
    let o = run(&["alloc", "get", "999"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not found: allocation 999 does not exist"), "{}", stderr(&o));
    let o = run(&["cluster", "add-learner", "--id", "2", "--address", "127.0.0.1:1"]);
    assert!(stderr(&o).contains("already a member"), "{}", stderr(&o));
    let o = run(&["cluster", "promote", "9"]);
    assert!(stderr(&o).contains("replica 9 is not a member"), "{}", stderr(&o));
}

#[test]
fn t71_an_unreachable_or_malformed_scheduler_is_one_clear_line() {
    let dead = format!("127.0.0.1:{}", free_port());
    for args in [vec!["cluster", "status"], vec!["alloc", "get", "1"], vec!["submit", "--", "true"]] {
        let o = muster(&with_scheduler(&args, &dead));
        assert!(!o.status.success(), "{args:?}");
        let err = stderr(&o);
        assert!(err.contains(&dead) && err.contains("cannot"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // A value no parser takes is a bad command line too: exit 2, as for
    // clap's own errors; a refused request is 1.
    let o = muster(&["cluster", "status", "--scheduler", "no-port-here"]);
    assert!(stderr(&o).contains("is not host:port"), "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("none.backup");
    let data = dir.path().join("data");
    let o = muster(&[
        "restore",
        "--backup",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--peers",
        "1=…",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--peers: \"…\" is not host:port"), "{}", stderr(&o));
    let o = muster(&["alloc", "list", "--columns", "id,jobid", "--scheduler", &dead]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = muster(&["submit", "--env", "NOEQUALS", "--scheduler", &dead, "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--env \"NOEQUALS\" is not KEY=VALUE"), "{}", stderr(&o));
    let o =
        muster(&["server", "--id", "1", "--listen", "127.0.0.1:0", "--data-dir", "/tmp/x", "--peers", "2=127.0.0.1:5"]);
    assert!(stderr(&o).contains("--peers must include this replica"), "{}", stderr(&o));
    // A command not put after `--` is a bad command line (exit 2), with a hint.
    let o = muster(&["submit", "python3", "train.py"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("hint: put the task's command after `--`"), "{}", stderr(&o));
}

/// Issue 27: `cluster status` without a leader still prints what every
/// replica sees, and exits non-zero so that scripts and probes notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t72_cluster_status_without_a_leader_prints_the_replicas_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), &[]);
    let first = leader(&cluster.addrs, None).await;
    let o = muster(&with_scheduler(&["cluster", "status"], &cluster.addrs[0]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("leader: replica {first}")), "{}", stdout(&o));

    // Leave one follower alone: it can never win an election.
    let survivor = (1..=3).find(|&id| id != first).unwrap();
    for id in (1..=3).filter(|&id| id != survivor) {
        cluster.kill(id);
    }
    let addr = cluster.addrs[survivor as usize - 1].clone();
    let o = muster_testkit::eventually("status to stop naming a leader", crate::cluster::WAIT, || {
        let o = muster(&with_scheduler(&["cluster", "status"], &addr));
        if o.status.success() { Err(stdout(&o)) } else { Ok(o) }
    })
    .await;
    assert!(stdout(&o).contains("leader: none"), "{}", stdout(&o));
    assert!(stdout(&o).contains("unreachable"), "the table still lists every replica: {}", stdout(&o));
    assert!(stderr(&o).contains("no leader: 1 of 3 replicas answer"), "{}", stderr(&o));
    let json = muster(&with_scheduler(&["cluster", "status", "--output", "json"], &addr));
    assert!(!json.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["leader_id"].is_null(), "{v}");
}
