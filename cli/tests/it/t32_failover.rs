//! Process-level failover: three `muster server` processes, continuous
//! submits with idempotency keys, the leader killed with SIGKILL and
//! restarted three times. Nothing acknowledged is lost or duplicated, and
//! every replica ends at the same applied index and digest.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use crate::cluster::{Client, Cluster, converged, leader, status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_killing_the_leader_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshot often so restarts also exercise snapshot + log replay.
    let mut cluster = Cluster::start(dir.path(), &["--snapshot-every", "40"]);
    leader(&cluster.addrs, None).await;

    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let submitter = {
        let (acked, stop, addrs) = (acked.clone(), stop.clone(), cluster.addrs.clone());
        tokio::spawn(async move {
            let mut client = Client::new(&addrs);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{i:05}");
                let id = client.submit_until_acked(&key).await;
                acked.lock().await.insert(key, id);
                i += 1;
            }
        })
    };

    // Each kill comes after the submitter made progress since the last.
    let progress = || async {
        let floor = acked.lock().await.len() + 6;
        muster_testkit::eventually_async("the submitter to get six more acks", Duration::from_secs(60), || async {
            (acked.lock().await.len() >= floor).then_some(())
        })
        .await
    };
    for round in 0..3 {
        progress().await;
        let old = leader(&cluster.addrs, None).await;
        let before = acked.lock().await.len();
        cluster.kill(old);
        let new = leader(&cluster.addrs, Some(old)).await;
        eprintln!("round {round}: killed leader {old} after {before} acks; replica {new} leads");
        cluster.spawn(old);
    }
    progress().await;
    stop.store(true, Ordering::Relaxed);
    submitter.await.unwrap();

    let acked = acked.lock().await.clone();
    assert!(acked.len() > 20, "the submitter made progress through the kills: {} acks", acked.len());
    let (index, digest) = converged(&cluster.addrs).await;
    eprintln!("converged at index {index}, digest {digest}");

    let all = Client::new(&cluster.addrs).list_all().await;
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for a in &all {
        by_key.entry(a.spec.clone().unwrap().idempotency_key).or_default().push(a.id);
    }
    for (key, id) in &acked {
        assert_eq!(
            by_key.get(key),
            Some(&vec![*id]),
            "acknowledged {key} -> {id} lost or duplicated\n{}",
            cluster.logs()
        );
    }
    assert_eq!(all.len(), acked.len(), "no allocation that was never acknowledged");
}

/// The runbook's backup and restore (docs/operations.md): a backup taken
/// through the leader holds everything committed before it; the cluster is
/// then lost whole, and a new one restored from the backup on new addresses
/// and empty data dirs comes up at the backup's index and digest, with the
/// same allocations and idempotency keys, and takes new work. Restoring
/// into a used data dir, or from a file that is not a backup, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_a_cluster_restored_from_a_backup_has_its_state_and_takes_work() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshot often, so the backup's state is also past a compaction.
    // No wait notes: with no agent, the leaders would note why each queued
    // allocation waits, and the new cluster's first admission pass would
    // change the state the test compares with the backup's.
    let mut old = Cluster::start(&dir.path().join("old"), &["--snapshot-every", "5", "--no-wait-notes"]);
    leader(&old.addrs, None).await;
    let mut client = Client::new(&old.addrs);
    let mut ids = BTreeMap::new();
    for i in 0..10 {
        let key = format!("before-{i}");
        ids.insert(key.clone(), client.submit_until_acked(&key).await);
    }
    let file = dir.path().join("muster.backup");
    let sched = old.addrs.join(",");
    let o = crate::muster(&[
        "cluster",
        "backup",
        "--out",
        file.to_str().unwrap(),
        "--scheduler",
        &sched,
        "--output",
        "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let taken: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (index, digest) = (taken["index"].as_u64().unwrap(), taken["state_digest"].as_str().unwrap().to_string());
    for i in 0..5 {
        client.submit_until_acked(&format!("after-{i}")).await;
    }
    for id in 1..=3 {
        old.kill(id);
    }

    // A new cluster from the backup, on new addresses.
    let mut new = Cluster::prepare(&dir.path().join("new"), &["--snapshot-every", "5", "--no-wait-notes"]);
    let restore = |data: &std::path::Path, backup: &std::path::Path| {
        crate::muster(&[
            "restore",
            "--backup",
            backup.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--peers",
            &new.peers(),
        ])
    };
    for id in 1..=3 {
        let o = restore(&new.dir.join(format!("data-{id}")), &file);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let again = restore(&new.dir.join("data-1"), &file);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("restore only into an empty data dir"));
    let not_backup = dir.path().join("not-a-backup");
    std::fs::write(&not_backup, b"hello").unwrap();
    let bad = restore(&dir.path().join("empty"), &not_backup);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a muster backup"), "{bad:?}");
    for id in 1..=3 {
        new.spawn(id);
    }
    leader(&new.addrs, None).await;
    // The first leader's own entry follows the backup's index; replicas may
    // agree at the backup's index for a moment before it commits.
    let what = "the new cluster's first leader to append after the backup's index";
    let (applied, now) = muster_testkit::eventually_async(what, Duration::from_secs(60), || async {
        let (applied, now) = converged(&new.addrs).await;
        if applied > index { Ok((applied, now)) } else { Err(format!("replicas agree at index {applied}")) }
    })
    .await;
    assert!(applied > index, "the new cluster's first leader appended after the backup's index");
    assert_eq!(now, digest, "the restored state is the backup's: {}", new.logs());
    let mut client = Client::new(&new.addrs);
    let all = client.list_all().await;
    assert_eq!(all.len(), 10, "exactly what was committed before the backup");
    // Idempotency keys survive: a retried submit gets its original id.
    assert_eq!(client.submit_until_acked("before-3").await, ids["before-3"]);
    assert_eq!(client.submit_until_acked("brand-new").await, 11);
    converged(&new.addrs).await;
}

/// A CLI call made right after the leader's `kill -9`, while the followers
/// still name the dead leader, waits for the new leader instead of failing
/// (it retries within its deadline while some replica answers); with no
/// replica up at all it fails, naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t62_a_cli_call_during_an_election_waits_for_the_new_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), &[]);
    let old = leader(&cluster.addrs, None).await;
    // The dead leader first, as a client that last talked to it would.
    let mut order = cluster.addrs.clone();
    order.swap(0, old as usize - 1);
    let scheduler = order.join(",");
    let submit = |key: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["submit", "--scheduler", &scheduler, "--idempotency-key", key, "--output", "json", "--", "true"])
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .output()
            .unwrap()
    };
    for round in 0..2 {
        let old = leader(&cluster.addrs, None).await;
        cluster.kill(old);
        let o = submit(&format!("during-election-{round}"));
        assert!(
            o.status.success(),
            "round {round}: the call failed instead of waiting: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            cluster.logs()
        );
        cluster.spawn(old);
    }
    for id in 1..=3 {
        cluster.kill(id);
    }
    let o = submit("nobody-home");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot reach the scheduler leader"), "{o:?}");
}

/// The CLI remembers the leader between runs, per list of replicas: the
/// next call dials it first, a stale hint costs one redirect and is
/// corrected, and `MUSTER_LEADER_CACHE=off` keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_the_cli_remembers_the_leader_between_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]);
    let l = leader(&cluster.addrs, None).await;
    let leader_addr = cluster.addrs[l as usize - 1].clone();
    let follower_addr = cluster.addrs[if l == 1 { 1 } else { 0 }].clone();
    let submit = |scheduler: &str, key: &str, extra_env: &[(&str, &str)]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["submit", "--scheduler", scheduler, "--idempotency-key", key, "--output", "json", "--", "true"])
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .env("XDG_CACHE_HOME", cache.path())
            .envs(extra_env.iter().copied())
            .output()
            .unwrap()
    };
    let remembered = || -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(cache.path().join("muster")) else { return Vec::new() };
        entries.map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().trim().to_string()).collect()
    };
    let all = cluster.addrs.join(",");
    let o = submit(&all, "first", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(remembered(), vec![leader_addr.clone()], "the leader that answered is remembered");

    // A stale hint (a follower) costs one redirect and is corrected.
    let file = std::fs::read_dir(cache.path().join("muster")).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&file, format!("{follower_addr}\n")).unwrap();
    let o = submit(&all, "stale", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(remembered(), vec![leader_addr.clone()]);

    // The hint is dialled first: a list whose only replica is dead still
    // reaches the leader remembered for it.
    let dead =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let o = submit(&dead, "dead-list", &[]);
    assert!(!o.status.success(), "nothing remembered for this list yet: the dead replica is all it has");
    std::fs::write(cache.path().join("muster").join(format!("leader-{}", dead.replace(':', "_"))), &leader_addr)
        .unwrap();
    let o = submit(&dead, "dead-list", &[]);
    assert!(o.status.success(), "the remembered leader was not dialled: {}", String::from_utf8_lossy(&o.stderr));

    std::fs::remove_dir_all(cache.path().join("muster")).unwrap();
    let o = submit(&all, "off", &[("MUSTER_LEADER_CACHE", "off")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(remembered().is_empty(), "MUSTER_LEADER_CACHE=off keeps nothing");
}

/// Issue 27: a routine failover is a few readable lines in the survivors'
/// logs, not chains of ERRORs. Each survivor says once that the dead
/// replica is unreachable, however long it stays down, and writes no ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_a_failover_logs_no_errors_and_a_down_peer_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::prepare(dir.path(), &[]);
    // The server's own filter (`SERVER_LOG_FILTER` in cli/src/main.rs: keep
    // the two alike), plus one DEBUG line per failed retry to a peer already
    // known to be down: what the wait below counts.
    let filter = "info,openraft=warn,openraft::replication=off,openraft::engine::handler::replication_handler=off,\
                  openraft::core::raft_core=off,muster_scheduler::server::raft::network=debug";
    cluster.env.push(("RUST_LOG".into(), filter.into()));
    for id in 1..=3 {
        cluster.spawn(id);
    }
    let old = leader(&cluster.addrs, None).await;
    let log = |id: u64| std::fs::read_to_string(dir.path().join(format!("replica-{id}.log"))).unwrap_or_default();
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
    let before: Vec<usize> = survivors.iter().map(|&id| log(id).len()).collect();
    cluster.kill(old);
    let new = leader(&cluster.addrs, Some(old)).await;
    // openraft retries the dead peer twice a second: wait until the new
    // leader has retried it many times, each a chance to say it again.
    let from = before[survivors.iter().position(|&id| id == new).expect("a survivor leads")];
    let retried = |text: &str| {
        text.lines()
            .filter(|l| l.contains("known unreachable failed again") && l.contains(&format!("peer={old}")))
            .count()
    };
    muster_testkit::eventually("the new leader retries the dead replica 8 times", Duration::from_secs(60), || {
        (retried(&log(new)[from..]) >= 8).then_some(())
    })
    .await;
    let mut leads = 0;
    for (&id, &from) in survivors.iter().zip(&before) {
        let text = log(id);
        let since = &text[from..];
        leads += since.lines().filter(|l| l.contains("this replica leads")).count();
        assert!(!since.contains(" ERROR "), "replica {id} logged errors for a routine failover:\n{since}");
        let down =
            since.lines().filter(|l| l.contains("replica unreachable") && l.contains(&format!("peer={old}"))).count();
        assert!(down <= 1, "replica {id} said {down} times that replica {old} is down:\n{since}");
        let warnings = since.lines().filter(|l| l.contains(" WARN ")).count();
        assert!(warnings <= 3, "replica {id}: {warnings} warnings for one failover:\n{since}");
    }
    assert!(leads >= 1, "the new leader says so in its log");
}

/// Issue 26: a leader whose process dies is noticed through its closed
/// connections, and the lowest-numbered survivor replaces it in a single
/// election as soon as the leader lease allows; a leader that is only
/// frozen (SIGSTOP: its sockets stay open) is not taken for gone, and is
/// replaced by openraft's election timer instead. A 500 ms heartbeat puts
/// the two paths 2 s apart, far more than a loaded machine's delays: the
/// lease is 2.5 s, and no follower's timer fires before 4.5 s of silence,
/// so a successor sooner than that was elected by the fast path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t65_a_dead_leader_is_noticed_at_once_and_a_frozen_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), &["--heartbeat-ms", "500"]);
    let timer_floor = Duration::from_millis(500 * 5 + 500 * 4);
    let addrs = cluster.addrs.clone();
    let addr = |id: u64| addrs[id as usize - 1].clone();
    let old = leader(&cluster.addrs, None).await;
    let term = status(&addr(old)).await.unwrap().term;
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
    let before: Vec<usize> = survivors.iter().map(|&id| cluster.log(id).len()).collect();
    let gone = |text: &str| {
        text.lines().filter(|l| l.contains("process is gone") && l.contains(&format!("leader={old}"))).count()
    };

    let killed = std::time::Instant::now();
    cluster.kill(old);
    let new = leader(&cluster.addrs, Some(old)).await;
    let took = killed.elapsed();
    let now = status(&addr(new)).await.unwrap();
    assert!(took < timer_floor, "replaced after {took:?}: by the timer, not the fast path\n{}", cluster.logs());
    for (&id, &from) in survivors.iter().zip(&before) {
        let since = cluster.log(id)[from..].to_string();
        assert_eq!(gone(&since), 1, "replica {id} saw leader {old} go once:\n{since}");
    }
    assert_eq!(new, survivors[0], "the lowest-numbered survivor campaigns first\n{}", cluster.logs());
    assert_eq!(now.term, term + 1, "one election, no split vote\n{}", cluster.logs());

    // Frozen, not dead: nothing closes, so only the timer replaces it.
    cluster.spawn(old);
    crate::cluster::converged(&cluster.addrs).await;
    let frozen = new;
    let others: Vec<u64> = (1..=3).filter(|&id| id != frozen).collect();
    let before: Vec<usize> = others.iter().map(|&id| cluster.log(id).len()).collect();
    cluster.pause(frozen);
    let next = leader(&[addr(others[0]), addr(others[1])], None).await;
    cluster.resume(frozen);
    for (&id, &from) in others.iter().zip(&before) {
        let since = cluster.log(id)[from..].to_string();
        assert!(!since.contains("process is gone"), "replica {id} took frozen leader {frozen} for gone:\n{since}");
    }
    eprintln!("killed {old}: {new} led at term {} after {took:?}; froze {frozen}: {next} leads", now.term);
}
