//! Retention against real `muster server` processes: a finished allocation
//! leaves every replica's live state after `--retention`, `alloc get` then
//! says where its record went, and a retried submit with its idempotency
//! key is still answered with the original allocation.

use std::time::{Duration, Instant};

use crate::cluster::{Cluster, WAIT, converged, leader};
use crate::{muster, stdout};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_a_finished_allocation_is_forgotten_after_the_retention_window_and_its_key_still_answers() {
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
    let deadline = Instant::now() + WAIT;
    let gone = loop {
        let o = run(&["alloc", "get", "1"]);
        if !o.status.success() {
            break o;
        }
        assert!(Instant::now() < deadline, "allocation 1 was never forgotten");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let err = stderr(&gone);
    assert!(err.contains("allocation 1") && err.contains("retention"), "{err}");
    // The live one stays; the list no longer shows the forgotten one.
    assert!(run(&["alloc", "get", "2"]).status.success());
    let list = stdout(&run(&["alloc", "list"]));
    assert!(!list.lines().any(|l| l.split_whitespace().next() == Some("1")), "{list}");

    // A retry of the submit is answered with what it made, not run again.
    let o = run(&[&submit[..1], &["--output", "json"], &submit[1..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["id"].as_u64(), v["duplicate"].as_bool()), (Some(1), Some(true)), "{v}");

    // Every replica forgot the same allocations: equal digests.
    converged(&cluster.addrs).await;
}

#[test]
fn t91_a_bad_retention_flag_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    for (flag, value) in [("--retention", "0s"), ("--retention", "soon"), ("--idempotency-window", "x")] {
        let o =
            muster(&["server", "--id", "1", "--listen", "127.0.0.1:0", "--data-dir", data, "--insecure", flag, value]);
        assert!(!o.status.success(), "{flag} {value} accepted");
        assert!(stderr(&o).contains(flag), "{flag} {value}: {}", stderr(&o));
    }
}
