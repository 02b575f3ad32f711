//! Real-size checkpoints off the log (issue 43), end to end: real replicas,
//! real agents, a real task writing a 2 GiB checkpoint, preempted, and
//! resumed on another node from the node store (fetched from the writer's
//! agent over mutual TLS, under the leader's grant), a shared path and an
//! object store. The log holds manifests only. And the probe's pattern
//! against Raft: a follower paused through 64 MiB of valid uploads (or
//! writes) catches up without an election, and a whole-cluster restart
//! elects a leader.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_scheduler::policy::PreemptionConfig;

use crate::cluster::{WAIT, channel};
use crate::t26_e2e::{get, leader_client, submit, until};

/// [`until`] with room for a 2 GiB checkpoint to be written and read back
/// on a loaded 2-core machine.
async fn until_long(c: &LocalCluster, id: u64, what: &str, pred: impl Fn(&v1::Allocation) -> bool) -> v1::Allocation {
    let what = format!("allocation {id} to be {what}");
    muster_testkit::eventually_async(&what, Duration::from_secs(600), || async {
        if let Some(a) = leader_client(c).await.get(v1::GetRequest { id }).await.ok().map(|r| r.into_inner())
            && pred(&a)
        {
            return Ok(a);
        }
        let events: Vec<String> = c
            .leader_id()
            .and_then(|l| c.replica(l))
            .map(|r| {
                r.reader().read(|st| {
                    st.alloc(id).map_or_else(Vec::new, |a| a.history.iter().map(|e| format!("{:?}", e.event)).collect())
                })
            })
            .unwrap_or_default();
        let logs: Vec<String> = (0..2)
            .flat_map(|i| files(&c.agent_dir(i).join("logs")))
            .filter(|p| p.to_string_lossy().contains(&format!("alloc-{id}/")))
            .map(|p| format!("{}: {}", p.display(), std::fs::read_to_string(&p).unwrap_or_default()))
            .collect();
        Err(format!("\n{}\n{}", events.join("\n"), logs.join("\n")))
    })
    .await
}

/// The checkpoint's size.
const BIG: u64 = 2 << 30;

fn config() -> LocalConfig {
    LocalConfig {
        preemption: PreemptionConfig {
            min_runtime_ms: 0,
            checkpoint_timeout_ms: 60_000,
            grace_ms: 2_000,
            ..PreemptionConfig::default()
        },
        node_labels: vec![
            [("slot".to_string(), "a".to_string())].into(),
            [("slot".to_string(), "b".to_string())].into(),
        ],
        ..crate::tls::quick_cluster(2, Duration::from_secs(2))
    }
}

/// A task that writes a `BIG`-byte checkpoint (sparse, with a random MiB
/// at each end, so a copy that is torn, shifted or zeroed shows), renamed
/// into place, prints its CRC-32 and length (`cksum`: 18× faster than
/// `sha256sum` here, and any torn, shifted or zeroed copy still shows; the
/// stores verify their own SHA-256) and waits for the checkpoint hint.
/// Resumed, it prints the same of what it was given and finishes.
fn big_trainer() -> String {
    format!(
        r#"
d="$MUSTER_CHECKPOINT_DIR"
if [ "$MUSTER_RESUME" = 1 ]; then echo "resumed $(cksum < "$d/weights.bin")"; exit 0; fi
truncate -s {BIG} "$d/weights.bin.tmp"
head -c 1048576 /dev/urandom | dd of="$d/weights.bin.tmp" conv=notrunc status=none
head -c 1048576 /dev/urandom | dd of="$d/weights.bin.tmp" bs=1048576 seek={last} conv=notrunc status=none
mv "$d/weights.bin.tmp" "$d/weights.bin"
mkdir -p "$d/.muster" && echo 7 > "$d/.muster/step.tmp" && mv "$d/.muster/step.tmp" "$d/.muster/step"
trap 'touch "$d/.muster/done"' USR1
trap 'exit 143' TERM
echo "saved $(cksum < "$d/weights.bin")"
while true; do sleep 0.2; done
"#,
        last = BIG / 1_048_576 - 1
    )
}

fn whole_node(class: u32, constraint: Option<&str>, script: &str) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: class,
        command: vec!["sh".into(), "-c".into(), script.into()],
        constraints: constraint.map(|c| vec![c.to_string()]).unwrap_or_default(),
        max_retries: 3,
        checkpoint_estimate_s: 5,
        ..Default::default()
    }
}

fn status(a: &v1::Allocation) -> v1::AllocationStatus {
    v1::AllocationStatus::try_from(a.status).unwrap()
}

/// The first line of an attempt's stdout that starts with `prefix`, waited for.
async fn line(c: &LocalCluster, node: &str, id: u64, attempt: u32, prefix: &str) -> String {
    let i = node.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    let path = c.agent_dir(i).join(format!("logs/alloc-{id}/task-0/attempt-{attempt}.out"));
    muster_testkit::eventually(&format!("a {prefix:?} line in {}", path.display()), Duration::from_secs(300), || {
        let text = std::fs::read_to_string(&path).ok()?;
        text.lines().find(|l| l.starts_with(prefix)).map(|l| l.trim_start_matches(prefix).trim().to_string())
    })
    .await
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() { out.extend(files(&p)) } else { out.push(p) }
        }
    }
    out
}

/// The bytes of a replica's Raft log segments on disk.
fn log_bytes(dir: &Path) -> u64 {
    files(&dir.join("log")).iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
}

async fn set_store(c: &LocalCluster, store: &str) {
    muster_testkit::eventually_async("the checkpoint store to be set", WAIT, || async {
        let leader = c.leader_id().expect("a leader");
        let ch = channel(&c.scheduler_addrs()[leader as usize - 1]).await.unwrap();
        let req = v1::CheckpointSettings { store: store.into(), keep: 2, max_bytes: 64 << 30, ..Default::default() };
        match AdminServiceClient::new(ch).set_checkpoint_settings(req).await {
            Ok(r) => {
                assert_eq!(r.into_inner().store, store);
                Ok(())
            }
            Err(e) => Err(format!("cannot set the store: {e}")),
        }
    })
    .await;
}

/// One run: a 2 GiB checkpoint through a preemption, restored on the
/// other node. Returns (the checkpoint's key, the victim's id).
async fn big_checkpoint_moves_through_a_preemption(c: &LocalCluster) -> (String, u64) {
    // A filler on node-2 keeps the victim on node-1 (and, at class 2, out
    // of the victim's reach); the preemptor wants node-1; cancelling the
    // filler lets the victim resume on node-2.
    let filler = submit(c, whole_node(2, Some("slot=b"), "sleep 600")).await;
    until(c, filler, "filler running", |a| status(a) == v1::AllocationStatus::Running).await;
    let victim = submit(c, whole_node(1, None, &big_trainer())).await;
    let a = until(c, victim, "victim running", |a| status(a) == v1::AllocationStatus::Running).await;
    assert_eq!(a.tasks[0].node_id, "node-1");
    let saved = line(c, "node-1", victim, 1, "saved ").await;
    let preemptor = submit(c, whole_node(8, Some("slot=a"), "sleep 600")).await;
    let started = Instant::now();
    let a = until_long(c, victim, "victim suspended with its checkpoint", |a| {
        status(a) == v1::AllocationStatus::Suspended && a.tasks[0].checkpoint_bytes > BIG
    })
    .await;
    let m = a.tasks[0].checkpoints[0].clone();
    println!(
        "checkpoint {} ({} bytes, store {}) saved {:.1} s after the preemption began",
        m.key,
        m.bytes,
        m.store,
        started.elapsed().as_secs_f64()
    );
    assert_eq!((m.writer.as_str(), m.step, m.attempt), ("node-1", Some(7), 1));
    until(c, preemptor, "preemptor running", |a| status(a) == v1::AllocationStatus::Running).await;
    leader_client(c).await.cancel(v1::CancelRequest { id: filler, ..Default::default() }).await.unwrap();
    let resumed_at = Instant::now();
    let a = until_long(c, victim, "victim done on node-2", |a| status(a) == v1::AllocationStatus::Done).await;
    assert_eq!(a.tasks[0].last_node_id, "node-2");
    let got = line(c, "node-2", victim, 2, "resumed ").await;
    println!("restored on node-2 and finished {:.1} s after its node came free", resumed_at.elapsed().as_secs_f64());
    assert_eq!(got, saved, "the checkpoint came back byte for byte");
    leader_client(c).await.cancel(v1::CancelRequest { id: preemptor, ..Default::default() }).await.unwrap();
    (m.key, victim)
}

/// Issue 43: a 2 GiB checkpoint survives a preemption through each store
/// (the node's disk, a shared path, an object store by URL), moving between
/// nodes; the log stays small (manifests only); once the allocation is done
/// its checkpoint is deleted from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t180_a_2_gib_checkpoint_survives_a_preemption_through_each_store() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config()).await.unwrap();

    // The default store: node-1's disk, fetched by node-2's agent.
    let (key, _) = big_checkpoint_moves_through_a_preemption(&c).await;
    let on_disk = c.agent_dir(0).join("checkpoint-store").join(&key);
    muster_testkit::eventually(&format!("{} to be deleted", on_disk.display()), WAIT, || {
        (!on_disk.exists()).then_some(())
    })
    .await;
    let leftovers: Vec<_> = files(&c.agent_dir(0).join("checkpoint-store"));
    assert!(leftovers.is_empty(), "nothing left in node-1's store: {leftovers:?}");

    // A shared path (both agents see the same directory).
    let shared = dir.path().join("shared-ckpt");
    set_store(&c, &shared.display().to_string()).await;
    let (key, victim) = big_checkpoint_moves_through_a_preemption(&c).await;
    assert!(key.starts_with(&format!("alloc-{victim}/task-0/")), "{key}");
    let in_store = shared.join(&key);
    muster_testkit::eventually(&format!("{} to be deleted", in_store.display()), WAIT, || {
        (!in_store.exists()).then_some(())
    })
    .await;
    assert!(files(&c.agent_dir(0).join("checkpoint-store")).is_empty(), "the node store was not used");

    // An object store by URL (object_store's local-file backend: the same
    // multipart upload and streamed read as S3's, whose own test runs
    // against moto in agent/tests/s3.rs).
    let bucket = dir.path().join("bucket");
    set_store(&c, &format!("file://{}", bucket.display())).await;
    let (key, _) = big_checkpoint_moves_through_a_preemption(&c).await;
    let in_store = bucket.join(&key);
    muster_testkit::eventually(&format!("{} to be deleted", in_store.display()), WAIT, || {
        (!in_store.exists()).then_some(())
    })
    .await;

    // 6 GiB of checkpoints went through; the log holds manifests.
    for id in 1..=3 {
        let bytes = log_bytes(&dir.path().join(format!("replica-{id}")));
        assert!(bytes < 8 << 20, "replica {id}'s log is {bytes} bytes");
    }
    let a = get(&c, victim).await;
    assert!(a.tasks[0].checkpoints.is_empty(), "a finished allocation keeps no checkpoint");
    c.shutdown().await;
}

/// A 300 ms heartbeat (elections after about 3 s of silence, not 1 s):
/// these tests run beside the rest of the suite on 2 cores, and a leader
/// that other tests starve of CPU for a second would lose its followers
/// whatever it was sending them. The bug they catch does not depend on it:
/// an append that cannot carry its entries within its deadline is never
/// answered, whatever the deadline.
const TOLERANT: &[&str] = &["--heartbeat-ms", "300"];

/// The leader's term and every replica's role, term and applied index.
async fn roles(addrs: &[String]) -> Vec<Option<(String, u64, u64)>> {
    let mut out = Vec::new();
    for a in addrs {
        out.push(crate::cluster::status(a).await.map(|s| (s.role, s.term, s.applied_index)));
    }
    out
}

/// Waits until follower `id` has applied what the leader has, and returns
/// how long that took.
async fn caught_up(addrs: &[String], id: u64, leader: u64) -> Duration {
    let started = Instant::now();
    let what = format!("replica {id} to catch up with the leader");
    muster_testkit::eventually_async(&what, Duration::from_secs(120), || async {
        let l = crate::cluster::status(&addrs[leader as usize - 1]).await;
        let f = crate::cluster::status(&addrs[id as usize - 1]).await;
        if let (Some(l), Some(f)) = (&l, &f)
            && f.applied_index >= l.applied_index
        {
            return Ok(());
        }
        let applied = |s: &Option<v1::ReplicaStatus>| s.as_ref().map(|s| (s.role.clone(), s.term, s.applied_index));
        Err(format!("leader {:?}, replica {id} {:?}", applied(&l), applied(&f)))
    })
    .await;
    started.elapsed()
}

/// After a whole-cluster `kill -9` and restart, a leader is elected and
/// every replica converges.
async fn restart_all(c: &mut crate::cluster::Cluster) {
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.spawn(id);
    }
    crate::cluster::leader(&c.addrs, None).await;
    crate::cluster::converged(&c.addrs).await;
}

/// Issue 43, the probe's pattern against Raft itself: a follower is paused
/// while 64 MiB of valid writes arrive (512 submits of 128 KiB each: a
/// 64 KiB command and 60 KiB of environment, both within their limits).
/// Resumed, it catches up within seconds and no election is forced: a
/// leader sends at most 2 MiB of entries per append, each entry at most
/// 1 MiB, so every append fits its deadline. (Before, an append carried up
/// to 300 entries whatever their size, timed out, and was sent again, for
/// ever: the follower campaigned in ever higher terms.) Then the whole
/// cluster is killed and restarted, and elects a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t182_a_follower_paused_through_64_mib_of_writes_catches_up_and_a_restart_elects() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = crate::cluster::Cluster::start(dir.path(), TOLERANT);
    let leader = crate::cluster::leader(&c.addrs, None).await;
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    c.pause(follower);
    let big = v1::AllocationSpec {
        owner: String::new(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 0, mem_mb: 100, cpus: 1 }),
        command: vec!["true".into(), "x".repeat(64 * 1024 - 8)],
        env: [("PAD".to_string(), "y".repeat(60 * 1024))].into(),
        ..Default::default()
    };
    let addr = c.addrs[leader as usize - 1].clone();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (addr, spec) = (addr.clone(), big.clone());
        writers.push(tokio::spawn(async move {
            let ch = channel(&addr).await.unwrap();
            let mut client = muster_proto::v1::allocation_service_client::AllocationServiceClient::new(ch)
                .max_encoding_message_size(1 << 20);
            for i in 0..64 {
                let mut spec = spec.clone();
                spec.idempotency_key = format!("big-{w}-{i}");
                let req = v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() };
                // As a real client does: a call that timed out (a loaded
                // machine, a leader syncing 128 KiB entries) is sent again
                // under its idempotency key, and counts once.
                let mut tries = 0;
                loop {
                    match client.submit(req.clone()).await {
                        Ok(_) => break,
                        Err(s)
                            if matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unavailable) && tries < 20 =>
                        {
                            tries += 1
                        }
                        Err(s) => panic!("submit {w}-{i}: {s}"),
                    }
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let before = roles(&c.addrs).await;
    let term = crate::cluster::status(&addr).await.unwrap().term;
    c.resume(follower);
    let took = caught_up(&c.addrs, follower, leader).await;
    println!("replica {follower} caught up with 64 MiB of entries in {:.2} s", took.as_secs_f64());
    assert!(took < Duration::from_secs(30), "{took:?}");
    let after = roles(&c.addrs).await;
    assert!(
        after.iter().all(|r| r.as_ref().is_some_and(|(_, t, _)| *t == term)),
        "no election was forced: before {before:?}, after {after:?}\n{}",
        c.logs()
    );
    assert_eq!(crate::cluster::status(&addr).await.unwrap().role, "leader");
    restart_all(&mut c).await;
}

/// Issue 43, the probe's own pattern: a follower is paused while 16 ranks
/// (four gangs of four) each leave a 4 MiB checkpoint (64 MiB of valid
/// uploads, for their own running tasks) as one rank of each gang dies and
/// its gang is torn down.
/// The checkpoints go to the nodes' disks; the log gets manifests. The
/// follower, resumed, catches up within seconds with no election; after a
/// whole-cluster restart a leader is elected, and the gang resumes from the
/// checkpoints and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t181_a_follower_paused_through_64_mib_of_checkpoints_catches_up_and_a_restart_elects() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = crate::cluster::Cluster::start(dir.path(), &[TOLERANT, &["--agent-heartbeat-ms", "500"]].concat());
    let leader = crate::cluster::leader(&c.addrs, None).await;
    let mut agents = Vec::new();
    for i in 1..=4 {
        let node = format!("node-{i}");
        crate::tls::material(muster_tls::Role::Agent(node.clone()));
        agents.push(
            std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
                .args(["agent", "--scheduler", &c.addrs.join(","), "--node-id", &node, "--allow-root-tasks"])
                .args(["--gpus", "4", "--vram-mb", "1000", "--mem-mb", "16000", "--cpus", "8"])
                .args(["--checkpoint-listen", "127.0.0.1:0", "--checkpoint-address", "127.0.0.1:0"])
                .arg("--work-dir")
                .arg(dir.path().join(&node))
                .env("MUSTER_TLS_DIR", crate::tls::dir())
                .stderr(std::fs::File::create(dir.path().join(format!("{node}.log"))).unwrap())
                .spawn()
                .unwrap(),
        );
    }
    let _agents = KillOnDrop(agents);
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    c.pause(follower);
    // Each rank writes 4 MiB (less the blob's framing) of random state and
    // its checksum, published together by one rename as a crash-consistent
    // job would, and reaches a barrier (a file per rank, as a collective
    // would be); rank 0 then dies, the others wait to be torn down.
    // Resumed, each checks it got its own state back and finishes. (A rank
    // whose gang was torn down before its rename finds no complete
    // checkpoint and starts over, as a real job would.)
    let barrier = dir.path().join("barrier");
    std::fs::create_dir_all(&barrier).unwrap();
    let script = format!(
        r#"
d="$MUSTER_CHECKPOINT_DIR"
b="{barrier}"
if [ "$MUSTER_RESUME" = 1 ] && [ -d "$d/ck" ]; then
  [ "$(sha256sum < "$d/ck/state")" = "$(cat "$d/ck/sum")" ] || {{ echo "wrong state"; exit 9; }}
  echo resumed; sleep 20; exit 0
fi
if [ "$MUSTER_RESUME" = 1 ]; then echo "no complete checkpoint: starting over"; sleep 20; exit 0; fi
rm -rf "$d/ck.tmp" && mkdir "$d/ck.tmp"
head -c 4190000 /dev/urandom > "$d/ck.tmp/state"
sha256sum < "$d/ck.tmp/state" > "$d/ck.tmp/sum"
mv "$d/ck.tmp" "$d/ck"
touch "$b/$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX"
if [ "$MUSTER_TASK_INDEX" = 0 ]; then
  n=0
  while [ "$(ls "$b" | grep -c "^$MUSTER_ALLOC_ID-")" -lt 4 ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done
  exit 3
fi
trap 'exit 143' TERM
while true; do sleep 0.2; done
"#,
        barrier = barrier.display()
    );
    let spec = v1::AllocationSpec {
        owner: String::new(),
        gang_size: 4,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 0, mem_mb: 100, cpus: 1 }),
        command: vec!["sh".into(), "-c".into(), script],
        max_retries: 3,
        ..Default::default()
    };
    let addr = c.addrs[leader as usize - 1].clone();
    let ch = channel(&addr).await.unwrap();
    let mut client = muster_proto::v1::allocation_service_client::AllocationServiceClient::new(ch);
    // Four gangs of four ranks (a gang places one rank per node): 16 ranks.
    let mut ids = Vec::new();
    for _ in 0..4 {
        let spec = Some(spec.clone());
        ids.push(
            client
                // The agents may still be registering: queued whatever the
                // nodes known so far could run.
                .submit(v1::SubmitRequest { spec, queue_if_unsatisfiable: true, ..Default::default() })
                .await
                .unwrap()
                .into_inner()
                .id,
        );
    }
    // Wait until all 16 ranks' checkpoints are recorded.
    muster_testkit::eventually_async("the checkpoints to be all recorded", Duration::from_secs(300), || async {
        let mut client = client.clone();
        let mut all = true;
        for &id in &ids {
            let a = client.get(v1::GetRequest { id }).await.unwrap().into_inner();
            all &= a.tasks.iter().all(|t| t.checkpoint_bytes > 4_000_000);
        }
        if all {
            return Ok(());
        }
        Err(format!("\n{}", std::fs::read_to_string(dir.path().join("node-1.log")).unwrap_or_default()))
    })
    .await;
    let term = crate::cluster::status(&addr).await.unwrap().term;
    c.resume(follower);
    let took = caught_up(&c.addrs, follower, leader).await;
    println!("replica {follower} caught up after 64 MiB of checkpoints in {:.2} s", took.as_secs_f64());
    assert!(took < Duration::from_secs(30), "{took:?}");
    let after = roles(&c.addrs).await;
    assert!(after.iter().all(|r| r.as_ref().is_some_and(|(_, t, _)| *t == term)), "no election: {after:?}");
    restart_all(&mut c).await;
    // The gangs resume from their checkpoints (on the nodes' disks, fetched
    // by whichever node each rank lands on) and finish.
    // Done is final: each check asks about every gang.
    muster_testkit::eventually_async("the gangs to finish", Duration::from_secs(300), || async {
        let leader = crate::cluster::leader(&c.addrs, None).await;
        let Some(ch) = channel(&c.addrs[leader as usize - 1]).await else {
            return Err(format!("leader {leader} unreachable"));
        };
        let mut client = muster_proto::v1::allocation_service_client::AllocationServiceClient::new(ch);
        let mut still = Vec::new();
        for &id in &ids {
            match client.get(v1::GetRequest { id }).await.map(|a| a.into_inner()) {
                Ok(a) if a.status == v1::AllocationStatus::Done as i32 => {}
                Ok(a) if a.status == v1::AllocationStatus::Failed as i32 => panic!("a gang failed: {a:?}"),
                _ => still.push(id),
            }
        }
        if still.is_empty() { Ok(()) } else { Err(format!("gangs {still:?} unfinished")) }
    })
    .await;
    for id in 1..=3 {
        let bytes = log_bytes(&dir.path().join(format!("data-{id}")));
        assert!(bytes < 8 << 20, "replica {id}'s log is {bytes} bytes");
    }
}

/// Agent processes, killed when the test ends.
struct KillOnDrop(Vec<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
