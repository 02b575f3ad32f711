//! "Why did my job wait?" on a real `muster dev`: a finished job that
//! waited for its vCluster's quota and then for the capacity a higher-class
//! gang took is explained with both reasons, their holders and durations.

use crate::dev_proc::{Dev, wait_until};
use crate::{muster, stdout};

#[test]
fn t231_a_finished_job_that_waited_for_quota_then_a_higher_class_gang_names_both() {
    let dev = Dev::start();
    // Every node is labelled home to no vCluster (there is no vCluster
    // "shared"): default and ml both run on them.
    let nodes = dev.ok(&["node", "list"]);
    let ids: Vec<String> =
        nodes["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 4, "{nodes}");
    for id in &ids {
        dev.ok(&["node", "label", id, "muster.vcluster=shared"]);
    }
    dev.ok(&["vcluster", "create", "ml", "--max-gpus", "8", "--over-quota", "queue"]);
    let submit = |args: &[&str]| -> u64 {
        let v = dev.ok(&[&["submit"], args].concat());
        v["id"].as_u64().unwrap_or_else(|| panic!("{args:?}: {v}"))
    };
    // ml's whole quota, for a few seconds.
    let first = submit(&["--vcluster", "ml", "--gpus", "8", "--class", "5", "--", "sleep", "6"]);
    wait_until("the first ml job to run", || dev.json(&["alloc", "get", &first.to_string()])["status"] == "running");
    let job = submit(&["--vcluster", "ml", "--gpus", "8", "--", "sleep", "0.2"]);
    wait_until("the job to be named as waiting for its quota", || {
        let e = dev.json(&["alloc", "explain", &job.to_string()]);
        e["waits"].as_array().is_some_and(|w| w.iter().any(|s| s["wait"] == "quota"))
    });
    // A class-5 gang of the whole fleet: it starts when the first job ends,
    // ahead of the job (larger and of a higher class), which then waits
    // for the capacity it holds.
    let big = submit(&["--gang-size", "4", "--gpus", "8", "--class", "5", "--", "sleep", "4"]);
    wait_until("the job to finish", || dev.json(&["alloc", "get", &job.to_string()])["status"] == "done");

    let e = dev.ok(&["alloc", "explain", &job.to_string()]);
    let waits = e["waits"].as_array().unwrap();
    let waited: Vec<(&str, u64, Vec<u64>)> = waits
        .iter()
        .filter(|w| w["wait"] != "queued")
        .map(|w| {
            let holders = w["holders"].as_array().unwrap().iter().map(|h| h["id"].as_u64().unwrap()).collect();
            (w["wait"].as_str().unwrap(), w["duration_ms"].as_u64().unwrap(), holders)
        })
        .collect();
    let names: Vec<&str> = waited.iter().map(|w| w.0).collect();
    assert_eq!(names, ["quota", "capacity", "placed", "ended"], "{e}");
    assert_eq!(waited[0].2, [first], "the quota was held by the first job: {e}");
    assert_eq!(waited[1].2, [big], "the capacity was held by the class-5 gang: {e}");
    // The first job ran 6 s, the gang 4 s: each wait lasted most of that.
    assert!((2_000..60_000).contains(&waited[0].1), "{e}");
    assert!((2_000..60_000).contains(&waited[1].1), "{e}");
    let quota = waits.iter().find(|w| w["wait"] == "quota").unwrap();
    assert_eq!((&quota["holders"][0]["preemption_class"], &quota["holders"][0]["owner"]), (&5.into(), &"dev".into()));
    let summary = e["summary"].as_str().unwrap();
    assert!(summary.starts_with("done; it waited "), "{summary}");
    assert!(
        summary.contains(&format!("for its vCluster's quota, held by {first} ("))
            && summary.contains("; then ")
            && summary.contains(&format!("for capacity, held by {big} (")),
        "{summary}"
    );
    assert_eq!(
        e["waited_ms"].as_u64().unwrap(),
        waits
            .iter()
            .filter(|w| !["placed", "ended"].contains(&w["wait"].as_str().unwrap()))
            .map(|w| w["duration_ms"].as_u64().unwrap())
            .sum::<u64>()
    );

    // The text form: a timeline, one line per change.
    let tls = dev.data_dir().join("tls");
    let o =
        muster(&["alloc", "explain", &job.to_string(), "--scheduler", &dev.sched, "--tls-dir", tls.to_str().unwrap()]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains("wait timeline:"), "{text}");
    for name in ["quota", "capacity", "placed", "ended"] {
        assert!(text.lines().any(|l| l.split_whitespace().any(|w| w == name)), "{name}: {text}");
    }
    // Watchers saw each reason as it changed.
    let events = dev.json_lines(&["alloc", "watch", &job.to_string()]);
    assert!(events.iter().any(|ev| ev["kind"] == "wait_changed"), "{events:?}");
}
