use muster_core::history::{AttemptRecord, JobRecord};
use muster_core::sm::{AllocStatus, AttemptEnd, AttemptUsage, Resources, WatchdogKind};

use super::*;

const H: u64 = 3_600_000;

fn record(seq: u64, owner: &str, vcluster: &str, status: AllocStatus, attempts: &[(u64, u64)]) -> JobRecord {
    let resources = Resources { gpus: 2, vram_mb: 1_000, mem_mb: 2_000, cpus: 4 };
    let attempts: Vec<AttemptRecord> = attempts
        .iter()
        .enumerate()
        .map(|(i, &(start_ms, end_ms))| AttemptRecord {
            task: 0,
            run: i as u32 + 1,
            node: format!("node-{i}"),
            start_ms,
            end_ms,
            end: if i + 1 == attempts.len() { AttemptEnd::Done } else { AttemptEnd::Failed },
            exit_code: if i + 1 == attempts.len() { Some(0) } else { None },
            gpu_seconds: 2 * (end_ms - start_ms) / 1000,
            preempted: i == 0 && attempts.len() > 1,
            watchdog: (i == 0 && attempts.len() > 2).then_some(WatchdogKind::Stall),
            // One core busy throughout, a GiB more each attempt; bob's
            // nodes contain no tasks, so report no usage.
            usage: (owner != "bob").then_some(AttemptUsage {
                peak_memory_bytes: (i as u64 + 1) << 30,
                cpu_ms: end_ms - start_ms,
                oom_kills: 0,
                memory_limit_bytes: 2_000 << 20,
                // Its GPUs read on every other attempt (NVML on some nodes).
                gpu_util_pct: (i % 2 == 0).then_some(40 + i as u32),
                peak_gpu_memory_bytes: if i % 2 == 0 { (i as u64 + 3) << 30 } else { 0 },
            }),
        })
        .collect();
    JobRecord {
        seq,
        id: seq + 100,
        owner: owner.into(),
        vcluster: vcluster.into(),
        class: 3,
        priority: -1,
        gang_size: 1,
        resources,
        command: vec!["python".into(), "train.py".into(), "--lr=0.1 'quoted'".into()],
        idempotency_key: seq.is_multiple_of(2).then(|| format!("key-{seq}")),
        submit_ms: attempts.first().map_or(0, |a| a.start_ms.saturating_sub(1_000)),
        start_ms: attempts.first().map(|a| a.start_ms),
        end_ms: attempts.last().map_or(1_000, |a| a.end_ms),
        status,
        reason: if status == AllocStatus::Done { String::new() } else { "out of retries".into() },
        preemptions: 1,
        watchdog_trips: 0,
        gpu_seconds: attempts.iter().map(|a| a.gpu_seconds).sum(),
        attempts,
        // Every third record is element seq of array 7.
        array: seq.is_multiple_of(3).then_some((7, seq as u32)),
        // Every other record keeps its shape, one with a constraint.
        shape: seq.is_multiple_of(2).then(|| {
            let mut spec = muster_core::sm::AllocSpec::new("a", 1, resources, vec!["true".into()]);
            spec.placement.constraints = vec![muster_core::sm::LabelExpr::parse("gpu.model=H100").unwrap()];
            spec.max_retries = 7;
            muster_core::history::RecordedShape::of(&spec)
        }),
        // Every other record keeps why it waited.
        waits: if seq.is_multiple_of(2) {
            let mut log = muster_core::sm::WaitLog::default();
            log.push(0, muster_core::sm::Wait::Quota, vec![muster_core::sm::WaitHolder::new(9, "bob", 2)]);
            log.push(500, muster_core::sm::Wait::Placed, vec![]);
            log
        } else {
            muster_core::sm::WaitLog::default()
        },
    }
}

fn open() -> (tempfile::TempDir, HistoryStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = HistoryStore::open(&dir.path().join("history.sqlite")).unwrap();
    (dir, store)
}

#[test]
fn records_round_trip_and_are_stored_at_most_once() {
    let (_dir, h) = open();
    let a = record(1, "alice", "ml", AllocStatus::Done, &[(0, H), (2 * H, 3 * H), (4 * H, 5 * H)]);
    let b = record(2, "bob", "batch", AllocStatus::Failed, &[]);
    assert_eq!(h.insert(&[a.clone(), b.clone()]).unwrap(), 2);
    // A replayed entry or a re-offered snapshot offers them again.
    assert_eq!(h.insert(&[a.clone(), b.clone()]).unwrap(), 0);
    assert_eq!(h.count().unwrap(), 2);
    let all = h.list(&Filter { limit: 10, ..Default::default() }).unwrap();
    assert_eq!(all, vec![a.clone(), b]);
    assert!(h.has_id(a.id).unwrap() && !h.has_id(999).unwrap());
}

#[test]
fn filters_select_by_owner_vcluster_status_time_and_page() {
    let (_dir, h) = open();
    let records: Vec<JobRecord> = (1..=6)
        .map(|i| {
            let owner = if i % 2 == 0 { "alice" } else { "bob" };
            let status = if i % 3 == 0 { AllocStatus::Cancelled } else { AllocStatus::Done };
            record(i, owner, if i <= 3 { "ml" } else { "batch" }, status, &[(i * H, i * H + H)])
        })
        .collect();
    h.insert(&records).unwrap();
    let ids = |f: Filter| -> Vec<u64> {
        h.list(&Filter { limit: if f.limit == 0 { 100 } else { f.limit }, ..f })
            .unwrap()
            .iter()
            .map(|r| r.seq)
            .collect()
    };
    assert_eq!(ids(Filter { owner: Some("alice".into()), ..Default::default() }), vec![2, 4, 6]);
    assert_eq!(ids(Filter { vcluster: Some("ml".into()), ..Default::default() }), vec![1, 2, 3]);
    assert_eq!(ids(Filter { status: Some(AllocStatus::Cancelled), ..Default::default() }), vec![3, 6]);
    assert_eq!(ids(Filter { since_ms: Some(4 * H), until_ms: Some(6 * H), ..Default::default() }), vec![3, 4]);
    assert_eq!(ids(Filter { id: Some(105), ..Default::default() }), vec![5]);
    assert_eq!(ids(Filter { after_seq: 2, limit: 2, ..Default::default() }), vec![3, 4]);
    assert!(ids(Filter { owner: Some("alice' OR '1'='1".into()), ..Default::default() }).is_empty());
}

#[test]
fn gaps_in_the_sequence_are_found_as_ranges() {
    let (_dir, h) = open();
    assert_eq!(h.missing(0, 10).unwrap(), vec![]);
    assert_eq!(h.missing(5, 10).unwrap(), vec![(1, 5)]);
    let recs: Vec<JobRecord> =
        [3, 4, 7, 10].iter().map(|&s| record(s, "a", "v", AllocStatus::Done, &[(0, 1_000)])).collect();
    h.insert(&recs).unwrap();
    assert_eq!(h.missing(12, 10).unwrap(), vec![(1, 2), (5, 6), (8, 9), (11, 12)]);
    assert_eq!(h.missing(10, 10).unwrap(), vec![(1, 2), (5, 6), (8, 9)]);
    assert_eq!(h.missing(12, 2).unwrap(), vec![(1, 2), (5, 6)]);
    assert_eq!(h.missing(4, 10).unwrap(), vec![(1, 2)]);
    assert_eq!(h.max_seq().unwrap(), 10);
    assert_eq!(h.by_seq(4, 9, 10).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4, 7]);
}

#[test]
fn usage_clips_attempts_to_the_period_and_groups() {
    let (_dir, h) = open();
    h.insert(&[
        // alice/ml: one 2-GPU attempt over hours 0-2.
        record(1, "alice", "ml", AllocStatus::Done, &[(0, 2 * H)]),
        // alice/batch: 1-2 and 3-4, failed.
        record(2, "alice", "batch", AllocStatus::Failed, &[(H, 2 * H), (3 * H, 4 * H)]),
        // bob/ml: 5-6, outside the period.
        record(3, "bob", "ml", AllocStatus::Done, &[(5 * H, 6 * H)]),
    ])
    .unwrap();
    let by_owner = h.usage(H, 5 * H, Group::Owner).unwrap();
    // Hour 1-2 of record 1 (2 GPU-h), all of record 2 (4 GPU-h); only
    // records 1 and 2 ended in [1 h, 5 h), and bob's attempt starts at 5 h.
    assert_eq!(
        by_owner,
        vec![UsageRow {
            owner: "alice".into(),
            vcluster: String::new(),
            array: 0,
            jobs: 2,
            done: 1,
            failed: 1,
            cancelled: 0,
            gpu_seconds: 6 * 3_600,
            // Hour 1-2 of record 1's CPU, all of record 2's.
            cpu_ms: 3 * H,
            peak_memory_bytes: 2 << 30,
            oom_killed: 0,
        }]
    );
    // Usage survives the round trip (bob's attempts report none).
    let stored = h.by_seq(0, 3, 10).unwrap();
    assert_eq!(stored[1].attempts[1].usage.map(|u| (u.peak_memory_bytes, u.cpu_ms)), Some((2 << 30, H)));
    assert_eq!(stored[2].attempts[0].usage, None);
    let both = h.usage(0, 10 * H, Group::OwnerAndVCluster).unwrap();
    let summary: Vec<(&str, &str, u64, u64)> =
        both.iter().map(|r| (r.owner.as_str(), r.vcluster.as_str(), r.jobs, r.gpu_seconds / 3_600)).collect();
    assert_eq!(summary, vec![("alice", "batch", 1, 4), ("alice", "ml", 1, 4), ("bob", "ml", 1, 2)]);
    let by_vc = h.usage(0, 10 * H, Group::VCluster).unwrap();
    assert_eq!(by_vc.iter().map(|r| (r.vcluster.as_str(), r.jobs)).collect::<Vec<_>>(), vec![("batch", 1), ("ml", 2)]);
}

#[test]
fn a_backup_copies_everything_and_merging_it_back_adds_only_what_is_missing() {
    let (dir, h) = open();
    let recs: Vec<JobRecord> = (1..=5).map(|s| record(s, "a", "v", AllocStatus::Done, &[(0, 1_000)])).collect();
    h.insert(&recs).unwrap();
    let copy = dir.path().join("copy.sqlite");
    h.backup_to(&copy).unwrap();
    let (_d2, other) = open();
    other.insert(&recs[..2]).unwrap();
    assert_eq!(other.merge_from(&copy).unwrap(), 3);
    assert_eq!(other.list(&Filter { limit: 10, ..Default::default() }).unwrap(), recs);
}

#[test]
fn a_reopened_store_keeps_its_records_and_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite");
    HistoryStore::open(&path).unwrap().insert(&[record(1, "a", "v", AllocStatus::Done, &[])]).unwrap();
    assert_eq!(HistoryStore::open(&path).unwrap().count().unwrap(), 1);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    drop(conn);
    let err = HistoryStore::open(&path).err().expect("refused").to_string();
    assert!(err.contains("newer"), "{err}");
}

#[test]
fn a_version_1_database_gains_the_idempotency_key_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.sqlite");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v1 = without_usage().replace("    idempotency_key TEXT,                 -- the submit's key; NULL: none\n", "");
    assert_ne!(v1, without_usage());
    conn.execute_batch(&v1).unwrap();
    conn.pragma_update(None, "user_version", 1).unwrap();
    drop(conn);
    let h = HistoryStore::open(&path).unwrap();
    let r = record(2, "a", "v", AllocStatus::Done, &[(0, 1_000)]);
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.list(&Filter { limit: 1, ..Default::default() }).unwrap(), vec![r]);
    drop(h);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

/// The schema without the columns named (and the indexes on them).
fn schema_without(columns: &[&str]) -> String {
    let gone = |l: &str| {
        columns.iter().any(|c| l.trim_start().starts_with(&format!("{c} ")) || l.contains(&format!("({c}, ")))
    };
    let old: String = SCHEMA.lines().filter(|l| !gone(l)).map(|l| format!("{l}\n")).collect();
    assert!(SCHEMA.lines().count() >= old.lines().count() + columns.len());
    old
}

/// A database of an older `version` (its `schema`) holding job 101 and
/// the attempt `attempt` inserts, opened by this build.
fn older_database(path: &std::path::Path, schema: &str, version: i64, attempt: &str) -> HistoryStore {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(schema).unwrap();
    conn.pragma_update(None, "user_version", version).unwrap();
    conn.execute_batch(
        "INSERT INTO jobs (seq, id, owner, vcluster, class, priority, gang_size, gpus, vram_mb, mem_mb, cpus, \
         command, submit_ms, start_ms, end_ms, status, reason, preemptions, watchdog_trips, gpu_seconds) \
         VALUES (1, 101, 'a', 'v', 0, 0, 1, 1, 0, 0, 1, '[\"true\"]', 0, 0, 1000, 'done', '', 0, 0, 1)",
    )
    .unwrap();
    conn.execute_batch(attempt).unwrap();
    drop(conn);
    HistoryStore::open(path).unwrap()
}

const GPU_USAGE: [&str; 2] = ["gpu_util_pct", "peak_gpu_memory_bytes"];

/// Job arrays' columns (version 5), the shape's (version 6) and the
/// waits' (version 7).
const ARRAYS: [&str; 4] = ["array_id", "array_index", "shape", "waits"];

/// The schema before attempts kept their usage (versions 1 and 2).
fn without_usage() -> String {
    schema_without(
        &[&["peak_memory_bytes", "cpu_ms", "oom_kills", "memory_limit_bytes"][..], &GPU_USAGE[..], &ARRAYS[..]]
            .concat(),
    )
}

#[test]
fn a_version_3_database_gains_the_gpu_usage_columns_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let h = older_database(
        &dir.path().join("v3.sqlite"),
        &schema_without(&[&GPU_USAGE[..], &ARRAYS[..]].concat()),
        3,
        "INSERT INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, gpus, gpu_seconds, \
         preempted, watchdog, peak_memory_bytes, cpu_ms, oom_kills, memory_limit_bytes) \
         VALUES (101, 0, 1, 'n0', 0, 1000, 'done', 0, 1, 1, 0, NULL, 4096, 7, 0, 0);",
    );
    let old = h.by_seq(1, 1, 10).unwrap();
    let u = old[0].attempts[0].usage.expect("its memory and CPU were kept");
    assert_eq!((u.peak_memory_bytes, u.cpu_ms, u.gpu_util_pct, u.peak_gpu_memory_bytes), (4096, 7, None, 0));
    let r = record(2, "a", "v", AllocStatus::Done, &[(0, 1_000), (1_000, 2_000)]);
    assert!(r.attempts[0].usage.unwrap().gpu_util_pct.is_some(), "the record carries GPU usage");
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.by_seq(2, 2, 10).unwrap(), vec![r]);
}

#[test]
fn a_version_4_database_gains_the_array_columns_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let h = older_database(
        &dir.path().join("v4.sqlite"),
        &schema_without(&ARRAYS),
        4,
        "INSERT INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, gpus, gpu_seconds, \
         preempted) VALUES (101, 0, 1, 'n0', 0, 1000, 'done', 0, 1, 1, 0);",
    );
    assert_eq!(h.by_seq(1, 1, 10).unwrap()[0].array, None, "a record from before arrays is of none");
    let r = record(3, "a", "v", AllocStatus::Done, &[(0, 1_000)]);
    assert_eq!(r.array, Some((7, 3)));
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.by_seq(3, 3, 10).unwrap(), vec![r]);
}

#[test]
fn a_version_5_database_gains_the_shape_column_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let h = older_database(
        &dir.path().join("v5.sqlite"),
        &schema_without(&["shape", "waits"]),
        5,
        "INSERT INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, gpus, gpu_seconds, \
         preempted) VALUES (101, 0, 1, 'n0', 0, 1000, 'done', 0, 1, 1, 0);",
    );
    assert_eq!(h.by_seq(1, 1, 10).unwrap()[0].shape, None, "a record from before shapes has none");
    let r = record(4, "a", "v", AllocStatus::Done, &[(0, 1_000)]);
    let shape = r.shape.clone().expect("record 4 keeps its shape");
    assert_eq!((shape.max_retries, shape.placement.constraints.len()), (7, 1));
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.by_seq(4, 4, 10).unwrap(), vec![r], "the shape round-trips through its JSON column");
}

#[test]
fn a_version_6_database_gains_the_waits_column_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let h = older_database(
        &dir.path().join("v6.sqlite"),
        &schema_without(&["waits"]),
        6,
        "INSERT INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, gpus, gpu_seconds, \
         preempted) VALUES (101, 0, 1, 'n0', 0, 1000, 'done', 0, 1, 1, 0);",
    );
    assert!(h.by_seq(1, 1, 10).unwrap()[0].waits.spans.is_empty(), "a record from before waits has none");
    let r = record(4, "a", "v", AllocStatus::Done, &[(0, 1_000)]);
    assert_eq!(r.waits.spans.len(), 2);
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.by_seq(4, 4, 10).unwrap(), vec![r], "the timeline round-trips through its JSON column");
}

#[test]
fn history_lists_and_usage_groups_by_job_array() {
    let (_dir, h) = open();
    let recs: Vec<JobRecord> = (1..=6).map(|s| record(s, "a", "v", AllocStatus::Done, &[(0, H)])).collect();
    h.insert(&recs).unwrap();
    let elements = h.list(&Filter { array: Some(7), limit: 10, ..Default::default() }).unwrap();
    assert_eq!(elements.iter().map(|r| (r.seq, r.array)).collect::<Vec<_>>(), [(3, Some((7, 3))), (6, Some((7, 6)))]);
    assert!(h.list(&Filter { array: Some(8), limit: 10, ..Default::default() }).unwrap().is_empty());
    let rows = h.usage(0, 10 * H, Group::Array).unwrap();
    let summary: Vec<(&str, u64, u64, u64)> =
        rows.iter().map(|r| (r.owner.as_str(), r.array, r.jobs, r.gpu_seconds / 3_600)).collect();
    assert_eq!(summary, [("a", 0, 4, 8), ("a", 7, 2, 4)], "array 0: the allocations of no array");
}

#[test]
fn a_version_2_database_gains_the_usage_columns_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let h = older_database(
        &dir.path().join("v2.sqlite"),
        &without_usage(),
        2,
        "INSERT INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, gpus, gpu_seconds, \
         preempted, watchdog) VALUES (101, 0, 1, 'n0', 0, 1000, 'done', 0, 1, 1, 0, NULL);",
    );
    let old = h.by_seq(1, 1, 10).unwrap();
    assert_eq!(old[0].attempts[0].usage, None, "an attempt from before usage was kept has none");
    let r = record(2, "a", "v", AllocStatus::Done, &[(0, 1_000)]);
    h.insert(std::slice::from_ref(&r)).unwrap();
    assert_eq!(h.by_seq(2, 2, 10).unwrap(), vec![r]);
}
