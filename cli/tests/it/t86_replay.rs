//! `muster replay`: a workload recorded on a real `muster dev`, backed up,
//! and replayed offline as recorded and under a what-if.

use std::time::Duration;

use crate::dev_proc::Dev;
use crate::{muster, stdout};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The flags that describe how `muster dev`'s leader preempts (its short
/// timings), so that the replay as recorded runs under the same.
const DEV_PREEMPTION: [&str; 8] = [
    "--preemption-min-runtime-ms",
    "1000",
    "--checkpoint-timeout-ms",
    "20000",
    "--max-deferral-ms",
    "20000",
    "--preemption-grace-ms",
    "5000",
];

#[test]
fn t227_a_recorded_workload_replays_with_bounded_error_and_its_log_audits() {
    // node-1 is home to vCluster ml, limited to 8 GPUs at once.
    let dev = Dev::start_with(&["--node-vclusters", "ml"]);
    dev.ok(&["vcluster", "update", "ml", "--max-gpus", "8"]);
    let submit = |args: &[&str]| -> u64 {
        let v = dev.ok(&[&["submit"], args].concat());
        v["id"].as_u64().or_else(|| v["array"].as_u64()).unwrap_or_else(|| panic!("{args:?}: {v}"))
    };
    // A class-1 gang holds default's three nodes until a class-8 gang
    // preempts it.
    // (Checkpointed, it resumes near its end: its second run is short.)
    let low = submit(&[
        "--gang-size",
        "3",
        "--gpus",
        "8",
        "--class",
        "1",
        "--",
        "sh",
        "-c",
        "if [ \"$MUSTER_ATTEMPT\" = 1 ]; then exec sleep 30; fi; sleep 0.5",
    ]);
    crate::dev_proc::wait_until("the class-1 gang to run", || {
        dev.json(&["alloc", "get", &low.to_string()])["status"] == "running"
    });
    // (Submitted within its 1 s minimum runtime, the preemptor waits it out.)
    submit(&["--gang-size", "3", "--gpus", "8", "--class", "8", "--", "sleep", "2"]);
    // 160 one-GPU jobs of 2 s; the first 16 fail once (their own failure).
    submit(&[
        "--array",
        "0-159",
        "--gpus",
        "1",
        "--class",
        "4",
        "--",
        "sh",
        "-c",
        "if [ \"$MUSTER_ARRAY_INDEX\" -lt 16 ] && [ \"$MUSTER_ATTEMPT\" = 1 ]; then exit 3; fi; sleep 2",
    ]);
    // 100 two-GPU jobs in ml, under its quota.
    submit(&["--array", "0-99", "--gpus", "2", "--vcluster", "ml", "--class", "3", "--", "sleep", "1.5"]);
    let total = 2 + 160 + 100;
    muster_testkit::eventually_blocking("every job to finish into the history", Duration::from_secs(600), || {
        let h = dev.json(&["history", "--limit", "1000"]);
        let n = h.as_array().map_or(0, Vec::len);
        if n == total { Ok(()) } else { Err(format!("{n} of {total} finished")) }
    });
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("muster.backup");
    dev.ok(&["cluster", "backup", "--out", backup.to_str().unwrap()]);
    let dev_dir = dev.stop();
    // A replica's data dir replays the same workload as the backup.
    let replica = dev_dir.path().join("dev").join("replica-1");
    let mut args = vec!["replay", "--data-dir", replica.to_str().unwrap(), "--format", "json"];
    args.extend(DEV_PREEMPTION);
    let o = muster(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_dir: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(from_dir["jobs"], total);
    audit_passes_and_catches_damage(&dev_dir.path().join("dev"));

    let replay = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["replay", "--backup", backup.to_str().unwrap(), "--format", "json"];
        args.extend(DEV_PREEMPTION);
        args.extend(extra);
        let o = muster(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let mut args = vec!["replay", "--backup", backup.to_str().unwrap()];
    args.extend(DEV_PREEMPTION);
    let text = muster(&args);
    assert!(text.status.success(), "{}", stderr(&text));
    println!("{}", stdout(&text));
    let recorded = replay(&[]);
    assert_eq!(recorded["jobs"], total);
    assert!(recorded["overall"]["actual"]["preemptions"].as_u64().unwrap() >= 1, "{recorded}");
    let f = &recorded["fidelity"];
    let (p50, p95, within) = (
        f["abs_error_s"]["p50"].as_f64().unwrap(),
        f["abs_error_s"]["p95"].as_f64().unwrap(),
        f["within_10pct"].as_f64().unwrap(),
    );
    println!("fidelity: {f}");
    assert_eq!(f["compared"], total);
    // Real claims, starts and reports take longer on a loaded machine than
    // the replay's agents do; the error stays bounded all the same.
    assert!(p50 < 5.0 && p95 < 20.0 && within > 0.5, "{f}");
    let vclusters: Vec<&str> =
        recorded["by_vcluster"].as_array().unwrap().iter().map(|g| g["group"].as_str().unwrap()).collect();
    assert_eq!(vclusters, ["default", "ml"]);
    assert_eq!(replay(&[])["digest_as_recorded"], recorded["digest_as_recorded"], "a replay is deterministic");

    // Two more nodes like the others: lower waits.
    let csv = dir.path().join("two.csv");
    std::fs::write(&csv, "count,gpus,mem_mb,cpus\n2,8,1024000,96\n").unwrap();
    let more = replay(&["--add-nodes", csv.to_str().unwrap()]);
    let mean = |group: &serde_json::Value, col: &str| group[col]["wait_s"]["mean"].as_f64().unwrap();
    let overall = &more["overall"];
    assert!(mean(overall, "what_if") < mean(overall, "as_recorded"), "{overall}");
    // The added nodes are home to default: its jobs gain most.
    let default = &more["by_vcluster"][0];
    assert_eq!(default["group"], "default");
    assert!(mean(default, "what_if") < 0.8 * mean(default, "as_recorded"), "{default}");
    assert!(!more["gainers"].as_array().unwrap().is_empty());

    // The text and CSV forms, and a what-if the recording cannot take.
    let mut args = vec!["replay", "--backup", backup.to_str().unwrap(), "--format", "csv", "--no-preemption"];
    args.extend(DEV_PREEMPTION);
    let o = muster(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), total + 1);
    let o = muster(&["replay", "--backup", backup.to_str().unwrap(), "--vcluster-max-gpus", "nosuch=4"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no vCluster \"nosuch\""), "{}", stderr(&o));
    let o = muster(&["replay", "--backup", backup.to_str().unwrap(), "--vcluster-borrow", "ml=150"]);
    assert!(!o.status.success() && stderr(&o).contains("0 to 100"), "{}", stderr(&o));
    let o = muster(&["replay", "--backup", csv.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("not a muster backup"), "{}", stderr(&o));
    let o = muster(&["replay", "--backup", backup.to_str().unwrap(), "--vcluster-max-gpus", "ml=none"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("simulated hours per second"), "{}", stdout(&o));
}

/// `muster audit` over the three replicas' data dirs of a stopped `muster
/// dev`: it passes and compares their digests; a damaged record in one
/// replica's log loses entries it had committed, and the audit names them.
fn audit_passes_and_catches_damage(data: &std::path::Path) {
    let dirs: Vec<String> = (1..=3).map(|i| data.join(format!("replica-{i}")).display().to_string()).collect();
    let mut args = vec!["audit"];
    for d in &dirs {
        args.extend(["--data-dir", d.as_str()]);
    }
    let o = muster(&[&args[..], &["--json"]].concat());
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let replicas = report["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3);
    for r in replicas {
        assert!(r["entries"].as_u64().unwrap() > 100, "{r}");
        assert!(r["violation"].is_null(), "{r}");
        println!("audit {}: {} entries in {:.3} s", r["dir"], r["entries"], r["seconds"].as_f64().unwrap());
    }
    assert!(!report["digests_compared"].as_array().unwrap().is_empty(), "{report}");

    // A byte flipped inside an early record of replica 2's last segment.
    let log = data.join("replica-2").join("log");
    let seg = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let o = muster(&args);
    assert!(!o.status.success(), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.contains(&seg.display().to_string()) && text.contains("at offset"), "{text}");
    assert!(text.contains("audit FAILED") && text.contains("log_continuous"), "{text}");
    assert!(stderr(&o).contains("replica-2"), "{}", stderr(&o));
}

#[test]
fn t229_a_simulated_run_saved_as_a_backup_replays_and_audits() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("sim.backup");
    let b = backup.to_str().unwrap();
    let o = muster(&["simulate", "--nodes", "8", "--allocations", "300", "--seed", "4", "--save-backup", b]);
    assert!(o.status.success(), "{}", stderr(&o));
    let digest = stdout(&o).lines().find_map(|l| l.strip_prefix("state digest")).unwrap().trim().to_string();
    let o = muster(&["audit", "--backup", b]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("restores to its recorded digest {digest}")), "{}", stdout(&o));
    let o = muster(&["replay", "--backup", b, "--format", "json", "--policy", "fifo"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["jobs"], 300, "every allocation, finished into the history or not");
    assert!(report["fidelity"]["compared"].as_u64().unwrap() > 250, "{}", report["fidelity"]);
    assert!(report["overall"]["what_if"].is_object());
    // A damaged backup is refused by name.
    let mut bytes = std::fs::read(&backup).unwrap();
    let n = bytes.len();
    bytes.truncate(n / 2);
    std::fs::write(&backup, &bytes).unwrap();
    for cmd in [&["audit", "--backup", b][..], &["replay", "--backup", b][..]] {
        let o = muster(cmd);
        assert!(!o.status.success(), "{cmd:?}");
        assert!(stderr(&o).contains("sim.backup"), "{cmd:?}: {}", stderr(&o));
    }
}

/// A replica that snapshots every 20 entries, and `muster audit` of its dir:
/// from entry 1 when `--keep-applied-log` kept everything before the
/// snapshot, from the snapshot when the log was purged behind it.
#[test]
fn t230_audit_starts_from_entry_one_or_the_snapshot_and_passes() {
    for keep in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", crate::cluster::free_port());
        let mut server = vec!["--snapshot-every", "20", "--keep-log-behind-snapshot", "5"];
        if keep {
            server.push("--keep-applied-log");
        }
        let procs = crate::Procs::start(dir.path(), &addr, &server, &["a1"]);
        for _ in 0..12 {
            crate::t82_history::until_ok(&addr, &["submit", "--gpus", "1", "--", "true"]);
        }
        muster_testkit::eventually_blocking("the twelve to finish", Duration::from_secs(120), || {
            let o = muster(&["history", "--output", "json", "--scheduler", &addr]);
            let n = serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .ok()
                .and_then(|v| v.as_array().map(Vec::len))
                .unwrap_or(0);
            if n == 12 { Ok(()) } else { Err(format!("{n} of 12")) }
        });
        drop(procs);
        let data = dir.path().join("server");
        assert!(data.join("snapshot.bin").exists(), "it snapshotted");
        let o = muster(&["audit", "--data-dir", data.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "keep {keep}: {}\n{}", stdout(&o), stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let replica = &r["replicas"][0];
        let from = replica["from_index"].as_u64().unwrap();
        if keep {
            assert_eq!(from, 0, "{replica}");
            assert!(replica["entries"].as_u64().unwrap() > 40, "{replica}");
        } else {
            assert!(from >= 20, "{replica}");
        }
        // The replay of the same dir holds every job.
        let o = muster(&["replay", "--data-dir", data.to_str().unwrap(), "--format", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["jobs"], 12);
    }
}
