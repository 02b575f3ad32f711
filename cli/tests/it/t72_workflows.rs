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
