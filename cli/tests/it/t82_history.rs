//! Retention and the job history against real `muster server` and `muster
//! agent` processes: a finished allocation leaves every replica's live
//! state after `--retention`, `alloc get` then says where its record went,
//! a retried submit with its idempotency key is still answered with the
//! original allocation, `muster history` and `muster usage` answer for
//! forgotten work, and a replica that lost its data dir gets the history
//! back from its peers.

use std::time::Instant;

use crate::cluster::{Cluster, WAIT, converged, free_port, leader};
use crate::{Procs, muster, stdout};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t147_a_finished_allocation_is_forgotten_after_the_retention_window_and_its_key_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &["--retention", "2s", "--idempotency-window", "1h"]);
    leader(&cluster.addrs, None).await;
    let sched = cluster.addrs[0].clone();
    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        let at = full.iter().position(|a| *a == "--").unwrap_or(full.len());
        full.splice(at..at, ["--scheduler", sched.as_str()]);
        muster(&full)
    };
    let submit = ["submit", "--gpus", "1", "--idempotency-key", "nightly-7", "--", "sleep", "1"];
    let o = run(&submit);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "allocation 1 submitted");
    let o = run(&["alloc", "cancel", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let kept = run(&["submit", "--gpus", "1", "--", "sleep", "1"]);
    assert_eq!(stdout(&kept).trim(), "allocation 2 submitted", "{}", stderr(&kept));

    // Within a few liveness passes the cancelled one is forgotten.
    let gone = muster_testkit::eventually("allocation 1 to be forgotten", WAIT, || {
        let o = run(&["alloc", "get", "1"]);
        (!o.status.success()).then_some(o)
    })
    .await;
    let err = stderr(&gone);
    assert!(err.contains("allocation 1") && err.contains("retention"), "{err}");
    assert!(err.contains("muster history --id 1"), "it says where the record is: {err}");
    // The live one stays; the list no longer shows the forgotten one.
    assert!(run(&["alloc", "get", "2"]).status.success());
    let list = stdout(&run(&["alloc", "list"]));
    assert!(!list.lines().any(|l| l.split_whitespace().next() == Some("1")), "{list}");

    // `alloc explain` answers from its history record: how it ended and
    // why it waited (no agent ever registered: no node could take it).
    let o = until_ok(&sched, &["alloc", "explain", "1", "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["summary"].as_str().unwrap().starts_with("cancelled; it waited "), "{v}");
    let waits: Vec<&str> = v["waits"].as_array().unwrap().iter().map(|w| w["wait"].as_str().unwrap()).collect();
    assert_eq!(waits.last(), Some(&"ended"), "{v}");
    assert!(waits.contains(&"constraint"), "no node could ever take it: {v}");
    let o = run(&["alloc", "explain", "1"]);
    assert!(stdout(&o).contains("wait timeline:"), "{}", stdout(&o));
    let o = run(&["history", "--id", "1", "--output", "json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(h[0]["waits"], v["waits"], "the record carries the same timeline");

    // A retry of the submit is answered with what it made, not run again.
    let o = run(&[&submit[..1], &["--output", "json"], &submit[1..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["id"].as_u64(), v["duplicate"].as_bool()), (Some(1), Some(true)), "{v}");

    // Every replica forgot the same allocations: equal digests.
    converged(&cluster.addrs).await;
}

/// Past `--detail-retention` a finished allocation is compacted on every
/// replica: `alloc get`, `logs`, `watch`, `cancel` and dependencies still
/// answer, from its job-history record and the outcome the live state
/// keeps.
#[test]
fn t233_a_compacted_allocation_still_answers_get_logs_watch_cancel_and_dependencies() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let server = ["--retention", "1h", "--detail-retention", "1s", "--agent-heartbeat-ms", "500"];
    let procs = Procs::start_with(dir.path(), &addr, &server, &["h1"], &[]);
    let task = "echo from-the-compacted-task; exit 3";
    let o = until_ok(&addr, &["submit", "--gpus", "1", "--max-retries", "0", "--", "sh", "-c", task]);
    assert_eq!(stdout(&o).trim(), "allocation 1 submitted");
    let got = muster_testkit::eventually_blocking("allocation 1 to be compacted", WAIT, || {
        let v = json(&until_ok(&addr, &["alloc", "get", "1", "--output", "json"]));
        if v["compacted"] == true { Ok(v) } else { Err(v.to_string()) }
    });
    assert_eq!(got["status"], "failed", "{got:#}");
    assert_eq!(got["command"], serde_json::json!(["sh", "-c", task]), "{got:#}");
    // Its task's last attempt, as the record has it (an early failure is
    // tried once more before the allocation fails).
    let record = json(&until_ok(&addr, &["history", "--id", "1", "--output", "json"]));
    let attempts = record[0]["attempts"].as_array().unwrap().len() as u64;
    let t = &got["tasks"][0];
    assert_eq!((t["last_node"].as_str(), t["exit_code"].as_i64()), (Some("h1"), Some(3)), "{got:#}");
    assert_eq!((t["runs"].as_u64(), t["attempts"].as_u64()), (Some(attempts), Some(attempts)), "{record:#}");
    assert!(!got["failed_reason"].as_str().unwrap().is_empty(), "{got:#}");
    let text = stdout(&until_ok(&addr, &["alloc", "get", "1"]));
    assert!(text.contains("compacted: from its job-history record"), "{text}");
    // `alloc explain` answers from the record too.
    let e = json(&until_ok(&addr, &["alloc", "explain", "1", "--output", "json"]));
    assert!(e["summary"].as_str().unwrap().starts_with("failed; it waited "), "{e}");
    // Its log is found through the record's node.
    let o = until_ok(&addr, &["alloc", "logs", "1"]);
    assert!(stdout(&o).contains("from-the-compacted-task"), "{}", stdout(&o));
    // A watch gets how it ended, and ends (non-zero: it failed).
    let o = muster(&["alloc", "watch", "1", "--scheduler", &addr]);
    assert!(stdout(&o).contains("compacted") && stdout(&o).contains("failed at"), "{}", stdout(&o));
    assert!(!o.status.success() && stderr(&o).contains("allocation 1 ended failed"), "{}", stderr(&o));
    // A cancel is refused as for any finished allocation.
    let o = muster(&["alloc", "cancel", "1", "--scheduler", &addr]);
    assert!(!o.status.success() && stderr(&o).contains("already"), "{}", stderr(&o));
    // A dependency on it knows it failed: `--after 1:ok` can never be met.
    let o = until_ok(&addr, &["submit", "--gpus", "1", "--after", "1:ok", "--", "true"]);
    assert_eq!(stdout(&o).trim(), "allocation 2 submitted");
    let two = json(&until_ok(&addr, &["alloc", "get", "2", "--output", "json"]));
    assert_eq!(two["status"], "failed", "{two:#}");
    // The list shows only allocations held whole.
    let list = stdout(&until_ok(&addr, &["alloc", "list"]));
    assert!(!list.lines().any(|l| l.split_whitespace().next() == Some("1")), "{list}");
    drop(procs);
}

#[test]
fn t148_a_bad_retention_flag_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    for (flag, value) in [
        ("--retention", "0s"),
        ("--retention", "soon"),
        ("--idempotency-window", "x"),
        ("--detail-retention", "0s"),
        ("--detail-retention", "4h"),
        ("--detail-max", "10000001"),
        ("--detail-max", "many"),
    ] {
        let o =
            muster(&["server", "--id", "1", "--listen", "127.0.0.1:0", "--data-dir", data, "--insecure", flag, value]);
        assert!(!o.status.success(), "{flag} {value} accepted");
        assert!(stderr(&o).contains(flag), "{flag} {value}: {}", stderr(&o));
    }
}

/// A job history written by a newer Muster stops the replica at start with
/// a message about the job history and its path (it used to read "invalid
/// raft configuration").
#[test]
fn t195_a_history_from_a_newer_build_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    let db = data.join("history.sqlite");
    let made = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA user_version = 99'); c.commit()",
        ])
        .arg(&db)
        .status()
        .unwrap();
    assert!(made.success());
    let server = std::cell::RefCell::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["server", "--id", "1", "--listen", "127.0.0.1:0", "--insecure", "--data-dir"])
            .arg(&data)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A replica that started would serve on: it must have exited.
    crate::dev_proc::wait_until("the replica to refuse to start", || server.borrow_mut().try_wait().unwrap().is_some());
    let o = server.into_inner().wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("cannot open the job history")
            && err.contains(&db.display().to_string())
            && err.contains("schema version 99 is newer than this build's"),
        "{err}"
    );
    assert!(!err.contains("raft configuration"), "{err}");
}

/// Runs `muster` with `--scheduler addr` before any `--`, until it succeeds.
pub(crate) fn until_ok(addr: &str, args: &[&str]) -> std::process::Output {
    muster_testkit::eventually_blocking(&format!("{args:?} to succeed"), WAIT, || {
        let mut full = args.to_vec();
        let at = full.iter().position(|a| *a == "--").unwrap_or(full.len());
        full.splice(at..at, ["--scheduler", addr]);
        let o = muster(&full);
        if o.status.success() { Ok(o) } else { Err(stderr(&o)) }
    })
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[test]
fn t149_history_and_usage_answer_for_real_work_after_it_is_forgotten_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let server = ["--retention", "1s", "--agent-heartbeat-ms", "500", "--preempt-grace-ms", "1000"];
    let agent = ["--log-retention", "3s", "--work-dir-sweep-every", "1s"];
    let mut procs = Procs::start_with(dir.path(), &addr, &server, &["h1", "h2"], &agent);
    // 1: task 0 fails its first attempt (exit 3), then both succeed.
    let flaky = r#"if [ "$MUSTER_ATTEMPT" = 1 ] && [ "$MUSTER_TASK_INDEX" = 0 ]; then exit 3; fi; sleep 1"#;
    let o = until_ok(&addr, &["submit", "-n", "2", "--gpus", "1", "--", "sh", "-c", flaky]);
    assert_eq!(stdout(&o).trim(), "allocation 1 submitted");
    // 2: fails for good (no retries).
    until_ok(&addr, &["submit", "--gpus", "1", "--max-retries", "0", "--", "sh", "-c", "exit 7"]);
    // 3: cancelled while queued (it asks for more GPUs than a node has).
    until_ok(&addr, &["submit", "--gpus", "2", "-n", "3", "--queue-if-unsatisfiable", "--", "true"]);
    until_ok(&addr, &["alloc", "cancel", "3"]);
    // All three end and leave the live state.
    let deadline = Instant::now() + WAIT;
    for id in ["1", "2", "3"] {
        let what = format!("allocation {id} to end and leave");
        muster_testkit::eventually_blocking(&what, deadline.saturating_duration_since(Instant::now()), || {
            let o = muster(&["alloc", "get", id, "--scheduler", &addr]);
            if !o.status.success() && stderr(&o).contains("retention") {
                return Ok(());
            }
            Err(format!("{} {}", stdout(&o), stderr(&o)))
        });
    }

    let all = json(&until_ok(&addr, &["history", "--output", "json"]));
    let records = all.as_array().unwrap();
    let summary: Vec<(u64, &str)> =
        records.iter().map(|r| (r["id"].as_u64().unwrap(), r["status"].as_str().unwrap())).collect();
    let mut by_id = summary.clone();
    by_id.sort();
    assert_eq!(by_id, vec![(1, "done"), (2, "failed"), (3, "cancelled")], "{all:#}");
    let one = records.iter().find(|r| r["id"] == 1).unwrap();
    let attempts: Vec<(u64, u64, &str, Option<i64>)> = one["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["task"].as_u64().unwrap(),
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["exit_code"].as_i64(),
            )
        })
        .collect();
    assert_eq!(attempts[0], (0, 1, "failed", Some(3)), "{one:#}");
    // Whether task 1's first attempt was stopped with task 0's failure or
    // had already finished depends on timing; each task's last one is done.
    for task in [0, 1] {
        let last = attempts.iter().rev().find(|a| a.0 == task).unwrap();
        assert_eq!((last.2, last.3), ("done", Some(0)), "{one:#}");
    }
    assert!(one["gpu_seconds"].as_u64().unwrap() >= 2, "two 1-GPU tasks slept a second: {one:#}");
    let two = records.iter().find(|r| r["id"] == 2).unwrap();
    assert_eq!(two["attempts"][0]["exit_code"], 7, "{two:#}");
    assert!(!two["reason"].as_str().unwrap().is_empty(), "{two:#}");
    let three = records.iter().find(|r| r["id"] == 3).unwrap();
    assert!(three["attempts"].as_array().unwrap().is_empty() && three["start_time_ms"].is_null(), "{three:#}");

    // Filters, CSV and the text table.
    let failed = json(&until_ok(&addr, &["history", "--status", "failed", "--output", "json"]));
    assert_eq!(failed.as_array().unwrap().len(), 1);
    let csv = stdout(&until_ok(&addr, &["history", "--output", "csv"]));
    let mut lines = csv.lines();
    assert!(lines.next().unwrap().starts_with("id,owner,vcluster,status,"), "{csv}");
    assert_eq!(lines.count(), 3, "{csv}");
    let rows = stdout(&until_ok(&addr, &["history", "--attempts", "--output", "csv"]));
    let all_attempts: usize = records.iter().map(|r| r["attempts"].as_array().unwrap().len()).sum();
    assert_eq!(rows.lines().count(), 1 + all_attempts, "a header and one row per attempt: {rows}");
    let text = stdout(&until_ok(&addr, &["history", "--id", "1", "--attempts"]));
    assert!(text.starts_with("ID") && text.contains("task 0 attempt 1") && text.contains("exit 3"), "{text}");
    let o = muster(&["history", "--id", "99", "--scheduler", &addr]);
    assert!(!o.status.success() && stderr(&o).contains("allocation 99"), "{}", stderr(&o));
    let o = muster(&["history", "--since", "yesterday", "--scheduler", &addr]);
    assert!(!o.status.success() && stderr(&o).contains("--since"), "{}", stderr(&o));

    let usage = json(&until_ok(&addr, &["usage", "--since", "1h", "--by", "owner", "--output", "json"]));
    let row = &usage["rows"][0];
    assert_eq!(
        (row["jobs"].as_u64(), row["done"].as_u64(), row["failed"].as_u64()),
        (Some(3), Some(1), Some(1)),
        "{usage:#}"
    );
    assert!(row["gpu_seconds"].as_u64().unwrap() >= 2, "{usage:#}");
    let text = stdout(&until_ok(&addr, &["usage", "--since", "1h"]));
    assert!(text.lines().nth(1).unwrap().starts_with("OWNER"), "{text}");

    // The agents cleaned up after the work: no checkpoint directory is left
    // once each attempt's report was recorded (emptied ones wait in
    // `spare/` for the next task), and the logs go after the log retention.
    let subdirs = |p: std::path::PathBuf| {
        std::fs::read_dir(p).map_or(0, |d| d.flatten().filter(|e| e.file_name() != "spare").count())
    };
    muster_testkit::eventually_blocking("the checkpoint and log directories to be removed", WAIT, || {
        let left: usize = ["h1", "h2"]
            .iter()
            .map(|n| subdirs(dir.path().join(n).join("checkpoints")) + subdirs(dir.path().join(n).join("logs")))
            .sum();
        if left == 0 { Ok(()) } else { Err(format!("{left} checkpoint or log directories left")) }
    });

    // The history is on disk: a restarted replica still answers.
    drop(procs);
    procs = Procs::start(dir.path(), &addr, &server, &[]);
    let again = json(&until_ok(&addr, &["history", "--output", "json"]));
    assert_eq!(again, all);
    drop(procs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t150_a_replica_replaced_with_an_empty_data_dir_gets_the_same_history_from_its_peers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster =
        Cluster::start(dir.path(), &["--retention", "1s", "--snapshot-every", "20", "--keep-log-behind-snapshot", "1"]);
    leader(&cluster.addrs, None).await;
    let run = |addr: &str, args: &[&str]| until_ok(addr, args);
    let any = cluster.addrs.join(",");
    let cancel_some = |from: u64, to: u64| {
        for id in from..=to {
            run(&any, &["submit", "--gpus", "1", "--", "true"]);
            run(&any, &["alloc", "cancel", &id.to_string()]);
        }
    };
    cancel_some(1, 6);
    cluster.kill(3);
    std::fs::remove_dir_all(dir.path().join("data-3")).unwrap();
    cancel_some(7, 12);
    // Everything is forgotten; a snapshot leaves no log to replay them from.
    muster_testkit::eventually_blocking("the allocation to be forgotten", WAIT, || {
        (!(muster(&["alloc", "get", "12", "--scheduler", &any]).status.success())).then_some(())
    });
    // Replica 3 is down, so the command reports that one of three did not.
    let o = muster(&["cluster", "snapshot", "--scheduler", &any]);
    assert!(stderr(&o).contains("1 of 3") || o.status.success(), "{}", stderr(&o));
    cluster.spawn(3);
    let expected = json(&run(&cluster.addrs[0], &["history", "--output", "json"]));
    assert_eq!(expected.as_array().unwrap().len(), 12, "{expected:#}");
    // Replica 3 (asked alone) installs the snapshot, which holds none of
    // them, and fetches all twelve from its peers.
    muster_testkit::eventually("replica 3 to catch up", WAIT, || {
        let o = muster(&["history", "--output", "json", "--scheduler", &cluster.addrs[2]]);
        if o.status.success() && json(&o) == expected && !stderr(&o).contains("lacks") {
            return Ok(());
        }
        Err(format!("{} {}\n{}", stdout(&o), stderr(&o), cluster.logs()))
    })
    .await;
    // It got them from a peer, not from replaying a log it was sent.
    let log = std::fs::read_to_string(dir.path().join("replica-3.log")).unwrap();
    assert!(log.contains("job history: fetched records this replica skipped"), "{log}");
    converged(&cluster.addrs).await;
}

#[test]
fn t151_a_backup_carries_the_history_into_the_restored_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let procs = Procs::start(&dir.path().join("old"), &addr, &["--retention", "1s"], &[]);
    for id in 1..=3 {
        until_ok(&addr, &["submit", "--gpus", "1", "--", "true"]);
        until_ok(&addr, &["alloc", "cancel", &id.to_string()]);
    }
    muster_testkit::eventually_blocking("the allocation to be forgotten", WAIT, || {
        (!(muster(&["alloc", "get", "3", "--scheduler", &addr]).status.success())).then_some(())
    });
    let before = json(&until_ok(&addr, &["history", "--output", "json"]));
    assert_eq!(before.as_array().unwrap().len(), 3);
    let file = dir.path().join("muster.backup");
    until_ok(&addr, &["cluster", "backup", "--out", file.to_str().unwrap()]);
    drop(procs);

    // A new one-member cluster from the backup: the state holds none of the
    // three (forgotten before the backup), the history all of them.
    let new_addr = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("new").join("server");
    let peers = format!("1={new_addr}");
    let o = muster(&[
        "restore",
        "--backup",
        file.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--peers",
        &peers,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("3 job-history records"), "{}", stdout(&o));
    let _new = Procs::start(&dir.path().join("new"), &new_addr, &["--retention", "1s"], &[]);
    let after = json(&until_ok(&new_addr, &["history", "--output", "json"]));
    assert_eq!(after, before);
    let o = muster(&["alloc", "get", "2", "--scheduler", &new_addr]);
    assert!(!o.status.success() && stderr(&o).contains("retention"), "{}", stderr(&o));
}
