//! Workflows through the CLI (issue 48): dependencies between allocations
//! on a real server and agent.

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
