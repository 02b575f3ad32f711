//! Unit tests of the agent: records, claims deferred while GPUs are busy,
//! unusable checkpoints, the reconnection budget.

use super::*;

#[test]
fn a_task_record_round_trips_and_an_old_one_gives_its_pgid() {
    let r = Record {
        pgid: 4242,
        attempt: 2,
        gpus: vec![0, 3],
        walltime_s: 3600,
        stall_s: 120,
        gpu_health: true,
        started_ms: 1_795_000_000_000,
        checkpointing: false,
        image: Some(format!("sha256:{}", "ab".repeat(32))),
    };
    assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
    let torn = r.encode().replace("image=sha256:", "image=sha256:zz");
    assert_eq!(Record::decode(&torn), Err(Some(4242)), "a digest that is not one");
    // The longest record (64 GPUs, a sha512 digest) fits its slot.
    let long = Record {
        gpus: (0..64).collect(),
        image: Some(format!("sha512:{}", "cd".repeat(64))),
        walltime_s: u64::MAX,
        started_ms: u64::MAX,
        ..r.clone()
    };
    let key = format!("key={}-{}-{} ", u64::MAX, u32::MAX, u64::MAX);
    assert!(key.len() + long.encode().len() <= record::SLOT_BYTES, "{}", long.encode().len());
    assert_eq!(Record::decode(&long.encode()), Ok(long));
    let none = Record { gpus: vec![], gpu_health: false, checkpointing: true, image: None, ..r.clone() };
    let older = r.encode().replace(" checkpointing=0", "");
    assert!(Record::decode(&older).unwrap().checkpointing, "a record without the field assumes checkpointing");
    assert_eq!(Record::decode(&none.encode()), Ok(none));
    assert_eq!(Record::decode("4242\n"), Err(Some(4242)), "a record from before --keep-tasks");
    assert_eq!(Record::decode("pgid=7 attempt=x"), Err(Some(7)), "a torn record still names its group");
    assert_eq!(Record::decode("garbage"), Err(None));
    assert_eq!(parse_key("12-3-4"), Some((12, 3, 4)));
    assert_eq!(parse_key("12-3"), None);
    assert_eq!(parse_key("12-3-4-5"), None);
}

/// A record of attempt 1 started at 1 ms, with no budget, watchdog or
/// image.
fn plain_record(pgid: i32, gpus: Vec<u32>) -> Record {
    Record {
        pgid,
        attempt: 1,
        gpus,
        walltime_s: 0,
        stall_s: 0,
        gpu_health: false,
        started_ms: 1,
        checkpointing: false,
        image: None,
    }
}

/// Records live in reused slots: starting and ending attempts creates no
/// file once the slots exist, the next agent finds what still runs (key
/// included), and a record in the older one-file-per-key form moves into a
/// slot.
#[test]
fn records_reuse_their_slots_and_the_next_agent_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let running = dir.path().join("running");
    let r = |pgid| plain_record(pgid, vec![0]);
    let files = || fs::read_dir(&running).unwrap().count();
    let (mut records, found) = Records::open(running.clone(), None).unwrap();
    assert!(found.is_empty());
    records.put((1, 0, 1), &r(100)).unwrap();
    records.put((2, 0, 1), &r(200)).unwrap();
    assert_eq!(files(), 2);
    for n in 3..50 {
        records.clear((n - 2, 0, 1));
        records.reserve((n, 0, 1)).unwrap();
        records.put((n, 0, 1), &r(100 * n as i32)).unwrap();
    }
    assert_eq!(files(), 2, "ended attempts free their slots for the next");
    assert_eq!(records.dir(), running.as_path());
    fs::write(running.join("60-1-2"), r(600).encode()).unwrap();
    fs::write(running.join("slot-7"), "pgid=9 attempt=x").unwrap();
    let (_, mut found) = Records::open(running.clone(), None).unwrap();
    found.sort_by_key(|f| f.record.as_ref().map_or(0, |r| r.pgid));
    let seen: Vec<String> =
        found.iter().map(|f| format!("{:?} {:?}", f.key, f.record.as_ref().map(|r| r.pgid))).collect();
    assert_eq!(
        seen,
        ["None Err(Some(9))", "Some((60, 1, 2)) Ok(600)", "Some((48, 0, 1)) Ok(4800)", "Some((49, 0, 1)) Ok(4900)"]
    );
    assert!(!running.join("60-1-2").exists(), "the older form moved into a slot");
}

fn test_config(dir: &std::path::Path) -> AgentConfig {
    AgentConfig {
        node_id: "n1".into(),
        schedulers: vec!["127.0.0.1:1".into()],
        resources: v1::Resources { gpus: 0, vram_mb: 0, mem_mb: 1_000, cpus: 1 },
        labels: BTreeMap::new(),
        address: "n1".into(),
        ports: Default::default(),
        work_dir: dir.to_path_buf(),
        backoff: (Duration::from_millis(50), Duration::from_millis(100)),
        watchdog: crate::watchdog::WatchdogConfig::default(),
        sampler: proc_sampler,
        exit_when_stopped: false,
        task_shim: None,
        tls: None,
        clock: Default::default(),
        janitor: Default::default(),
        fence: true,
        forget_leftovers: false,
        disk_fault_file: None,
        start_without_record: false,
        checkpoint_listen: None,
        checkpoint_address: String::new(),
        isolation: None,
        run_as: crate::users::RunAs::agent(),
        exe: None,
        images: None,
        executor: None,
    }
}

/// Issue 22, item 8, and issue 43: a stored checkpoint that does not
/// restore here (its bytes on disk no longer match its manifest) does not
/// fail the attempt: the next older one is restored instead, the task's
/// stderr log says which could not be, and the leader is told, so that the
/// bad one is dropped and nobody is charged for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_restored_is_reported_and_an_older_one_restored() {
    use crate::store::Naming;
    use muster_core::sm::CheckpointStore;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::new(test_config(dir.path())).unwrap();
    let src = tempfile::tempdir().unwrap();
    let save = |attempt| Naming { alloc: 7, task: 0, attempt, epoch: 1 };
    fs::write(src.path().join("step"), "older").unwrap();
    let older = agent.stores.save(&CheckpointStore::Node, src.path(), save(1), 1 << 20).await.unwrap().unwrap();
    fs::write(src.path().join("step"), "newer").unwrap();
    let newer = agent.stores.save(&CheckpointStore::Node, src.path(), save(2), 1 << 20).await.unwrap().unwrap();
    let path = agent.stores.node_path(&newer.key).unwrap();
    let mut torn = fs::read(&path).unwrap();
    torn.truncate(torn.len() - 2);
    fs::write(&path, torn).unwrap();
    let r = |s: &crate::store::Saved, seq| v1::CheckpointRef {
        manifest: Some(v1::CheckpointManifest { seq, writer: agent.cfg.node_id.clone(), ..s.manifest() }),
        source: String::new(),
    };
    let key = (7, 0, 3);
    let assign = v1::Assign {
        task: Some(task_ref(key)),
        gang_size: 1,
        command: vec![
            "sh".into(),
            "-c".into(),
            r#"echo "resume=${MUSTER_RESUME:-no} $(cat "$MUSTER_CHECKPOINT_DIR/step")""#.into(),
        ],
        restore: vec![r(&newer, 2), r(&older, 1)],
        checkpointing: true,
        ..Default::default()
    };
    agent.start(key, assign, 3);
    let (k, prepared) = tokio::time::timeout(Duration::from_secs(60), agent.prepared_rx.recv()).await.unwrap().unwrap();
    assert_eq!(k, key);
    let reports = agent.launch(k, prepared);
    let [unusable] = &reports[..] else { panic!("{reports:?}") };
    assert_eq!((unusable.task, unusable.seq), (Some(task_ref(key)), 2));
    assert!(unusable.reason.contains("truncated"), "{}", unusable.reason);
    let (ended_key, ended) =
        tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
    assert_eq!(ended_key, key);
    assert!(matches!(ended.exit, Ok(Exit::Code(0))), "the task ran");
    assert!(ended.saved.is_none(), "it finished: nothing to save");
    let (out, err) = executor::log_paths(dir.path(), 7, 0, 3);
    assert_eq!(fs::read_to_string(out).unwrap(), "resume=1 older\n", "resumed from the older checkpoint");
    let err = fs::read_to_string(err).unwrap();
    assert!(err.contains("muster: checkpoint 2 could not be restored"), "{err}");
}

/// A stop that comes while a checkpoint is being fetched ends the fetch:
/// the attempt never starts, and its end is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_a_checkpoint_is_fetched_ends_the_attempt_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::new(test_config(dir.path())).unwrap();
    // A node that does not answer: the fetch keeps trying.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let source = silent.local_addr().unwrap().to_string();
    drop(silent);
    let m = v1::CheckpointManifest {
        seq: 4,
        bytes: 10,
        sha256: vec![0; 32],
        writer: "elsewhere".into(),
        store: "node".into(),
        key: "alloc-8/task-0/a1-e1-x.ckpt".into(),
        ..Default::default()
    };
    let key = (8, 0, 2);
    let assign = v1::Assign {
        task: Some(task_ref(key)),
        gang_size: 1,
        command: vec!["sh".into(), "-c".into(), "touch ran".into()],
        restore: vec![v1::CheckpointRef { manifest: Some(m), source }],
        checkpointing: true,
        ..Default::default()
    };
    agent.start(key, assign, 2);
    let ctrl = agent.running[&key].ctrl.clone().unwrap();
    ctrl.send(Control::Stop(Duration::from_secs(1))).unwrap();
    let (k, prepared) = tokio::time::timeout(Duration::from_secs(60), agent.prepared_rx.recv()).await.unwrap().unwrap();
    assert!(prepared.stopped);
    assert!(agent.launch(k, prepared).is_empty());
    let (_, ended) = tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
    assert!(matches!(&ended.exit, Err(e) if e.contains("before it started")), "{:?}", ended.exit);
    assert!(!dir.path().join("ran").exists());
}

/// An agent never starts a task on GPUs a process it still runs holds
/// (one the leader no longer places here, in its stop grace): it claims
/// the assignment only once the GPUs are free.
#[tokio::test]
async fn an_assignment_waits_for_gpus_a_stopping_task_still_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(dir.path());
    cfg.resources.gpus = 4;
    let mut agent = Agent::new(cfg).unwrap();
    let assign = |key: Key, gpus: u32, cmd: &str| v1::Assign {
        task: Some(task_ref(key)),
        gang_size: 1,
        gpus,
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        ..Default::default()
    };
    let stale = (1, 0, 1);
    agent.start(stale, assign(stale, 4, "sleep 60"), 1);
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = sent.clone();
    let send = move |o: Out| {
        log.lock().unwrap().push(o);
        std::future::ready(Ok::<(), String>(()))
    };
    let next = (2, 0, 1);
    let msg = v1::SchedulerMessage { msg: Some(In::Assign(assign(next, 2, "true"))) };
    agent.handle(msg, &send).await.unwrap();
    assert!(sent.lock().unwrap().is_empty(), "no claim while the stopping task holds every GPU");
    assert!(agent.deferred.contains_key(&next));
    // The stale task is stopped; once it has exited, the claim goes out.
    let stop = v1::Stop { task: Some(task_ref(stale)), grace_ms: 1_000, reason: "re-placed".into() };
    agent.handle(v1::SchedulerMessage { msg: Some(In::Stop(stop)) }, &send).await.unwrap();
    let (key, ended) = tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
    assert_eq!(key, stale);
    agent.finished(key, ended);
    agent.claim_deferred(&send).await.unwrap();
    {
        let sent = sent.lock().unwrap();
        assert!(
            matches!(sent.as_slice(), [Out::Claim(c)] if c.task == Some(task_ref(next))),
            "claimed once its GPUs were free: {sent:?}"
        );
    }
    // The stream breaks before the grant: the next stream's leader sends
    // the assignment again, and the old claim no longer holds GPUs.
    assert_eq!(agent.spare_gpus(), 2);
    agent.forget_claims();
    assert_eq!(agent.spare_gpus(), 4, "a lost claim does not hold GPUs forever");
}

#[test]
fn a_register_lists_tasks_whose_end_is_not_yet_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::new(test_config(dir.path())).unwrap();
    assert!(agent.registered_tasks().is_empty());
    let exited = (7, 0, 1);
    agent.unrecorded.insert(
        exited,
        Report::Exited {
            exit: v1::TaskExited { task: Some(task_ref(exited)), exit_code: Some(0), ..Default::default() },
            checkpoint: None,
        },
    );
    let preempted = (8, 1, 2);
    let ack = v1::Preempted { task: Some(task_ref(preempted)), preemption_epoch: 1, ..Default::default() };
    agent.unrecorded.insert(preempted, Report::Preempted { checkpoint: None, ack });
    // The exited task is listed until its report is recorded; a preempted
    // one is not (the leader is tearing it down, not counting it as running).
    assert_eq!(agent.registered_tasks(), vec![task_ref(exited)]);
    agent.unrecorded.remove(&exited);
    assert!(agent.registered_tasks().is_empty());
}

/// A full disk: a new slot cannot be reserved, so the attempt is not
/// started; a slot that exists takes its record in place all the same, and
/// blanked slots keep their size for the next attempt.
#[test]
fn a_full_disk_refuses_new_slots_but_existing_ones_take_records() {
    let dir = tempfile::tempdir().unwrap();
    let (running, fault) = (dir.path().join("running"), dir.path().join("fault"));
    let r = plain_record(7, vec![]);
    let (mut records, _) = Records::open(running.clone(), Some(fault.clone())).unwrap();
    records.reserve((1, 0, 1)).unwrap();
    fs::write(&fault, "full").unwrap();
    let e = records.reserve((2, 0, 1)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    records.put((1, 0, 1), &r).unwrap();
    records.clear((1, 0, 1));
    assert_eq!(fs::metadata(running.join("slot-0")).unwrap().len(), record::SLOT_BYTES as u64);
    records.reserve((3, 0, 1)).unwrap();
    records.put((3, 0, 1), &r).unwrap();
    let (_, found) = Records::open(running.clone(), None).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].key, Some((3, 0, 1)));
    assert_eq!(found[0].record.as_ref().map(|r| r.pgid), Ok(7));
}

/// A failover seen from an agent, three replicas: its stream to leader
/// L breaks; a follower that has not yet noticed names L; the agent waits
/// a moment instead of dialling L; the next follower names the successor
/// S, which the agent dials at once. A leader named a second time is
/// followed (it may be alive: only the agent's connection broke).
#[test]
fn a_follower_naming_the_lost_leader_gets_a_short_pause_not_a_backoff() {
    let mut r = Retries::default();
    r.lost("L");
    assert_eq!(r.next(true, None, 3), Next::AtOnce);
    assert_eq!(r.next(false, Some("L"), 3), Next::Notice);
    assert_eq!(r.next(false, Some("S"), 3), Next::AtOnce);
    let mut alive = Retries::default();
    alive.lost("L");
    assert_eq!(alive.next(true, None, 3), Next::AtOnce);
    assert_eq!(alive.next(false, Some("L"), 3), Next::Notice);
    assert_eq!(alive.next(false, Some("L"), 3), Next::AtOnce, "named again: followed");
}

/// Replicas that keep failing, or keep naming each other, make the agent
/// back off after one attempt per replica, longer each round it fails.
#[test]
fn an_agent_backs_off_after_one_quick_attempt_per_replica() {
    let mut r = Retries::default();
    for _ in 0..3 {
        assert_eq!(r.next(true, None, 3), Next::AtOnce);
    }
    assert_eq!(r.next(true, None, 3), Next::BackOff(1));
    for _ in 0..3 {
        assert_eq!(r.next(true, None, 3), Next::AtOnce);
    }
    assert_eq!(r.next(true, None, 3), Next::BackOff(2));
    let mut named = Retries::default();
    for _ in 0..3 {
        assert_eq!(named.next(false, Some("X"), 3), Next::AtOnce);
    }
    assert_eq!(named.next(false, Some("X"), 3), Next::BackOff(0), "named, not failed: the shortest pause");
}

/// A sampler whose GPUs read 60 % busy holding 1, then 3, then 2 GiB:
/// what NVML would say of a task's GPUs.
struct FakeGpus(u32);

static FAKE_GPU_READINGS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl crate::watchdog::Sampler for FakeGpus {
    fn sample(&mut self, _pgid: i32) -> crate::watchdog::Sample {
        crate::watchdog::Sample::default()
    }

    fn gpus(&mut self, indices: &[u32]) -> Option<crate::watchdog::GpuReading> {
        assert_eq!(indices.len(), 2, "the task's own two GPUs");
        self.0 += 1;
        FAKE_GPU_READINGS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let gib = [1u64, 3, 2][(self.0 as usize - 1).min(2)];
        Some(crate::watchdog::GpuReading { util_pct: 60.0, memory_bytes: gib << 30 })
    }
}

fn fake_gpus() -> Box<dyn crate::watchdog::Sampler> {
    Box::new(FakeGpus(0))
}

/// Issue 46: "where NVML is present, GPU utilisation and peak GPU memory"
/// are read while the attempt runs and go with its end report.
#[tokio::test]
async fn an_attempts_gpu_utilisation_and_peak_gpu_memory_go_with_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(dir.path());
    cfg.resources.gpus = 2;
    cfg.sampler = fake_gpus;
    cfg.watchdog.poll = Duration::from_millis(20);
    let mut agent = Agent::new(cfg).unwrap();
    let key = (5, 0, 1);
    let assign = v1::Assign {
        task: Some(task_ref(key)),
        gang_size: 1,
        gpus: 2,
        command: vec!["sleep".into(), "60".into()],
        ..Default::default()
    };
    agent.start(key, assign, 1);
    muster_testkit::eventually("the GPUs to be read four times", muster_testkit::WAIT, || {
        (FAKE_GPU_READINGS.load(std::sync::atomic::Ordering::SeqCst) >= 4).then_some(())
    })
    .await;
    let ctrl = agent.running[&key].ctrl.clone().unwrap();
    ctrl.send(Control::Stop(Duration::from_millis(100))).unwrap();
    let (k, ended) = tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
    assert_eq!(k, key);
    let report = agent.finished(k, ended);
    let Report::Exited { exit, .. } = report else { panic!("{report:?}") };
    let usage = exit.usage.expect("usage without a cgroup: the GPUs' alone");
    assert_eq!((usage.gpu_util_pct, usage.peak_gpu_memory_bytes), (Some(60), 3 << 30));
    assert_eq!(usage.peak_memory_bytes, 0, "no cgroup here: no memory reading");
}

/// Issue 46: a task running as an unprivileged account answers a
/// checkpoint hint in the directory it owns: the agent (root) writes the
/// request into it, the task's `done` ends the protocol, and once the
/// attempt has ended the directory is the agent's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_running_as_its_account_answers_a_hint_in_its_own_directory() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(dir.path());
    let user = crate::users::TaskUser { name: "t".into(), uid: 60401, gid: 60401, groups: vec![60401] };
    cfg.run_as = crate::users::RunAs { default: Some(user), map: BTreeMap::new() };
    let mut agent = Agent::new(cfg).unwrap();
    let key = (9, 0, 1);
    let script = r#"trap 'id -u > "$MUSTER_CHECKPOINT_DIR/state"; cat "$MUSTER_CHECKPOINT_DIR/.muster/request" > "$MUSTER_CHECKPOINT_DIR/seen"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
touch "$MUSTER_CHECKPOINT_DIR/ready"
while :; do sleep 0.05; done"#;
    let assign = v1::Assign {
        task: Some(task_ref(key)),
        gang_size: 1,
        command: vec!["sh".into(), "-c".into(), script.into()],
        owner: "anyone".into(),
        ..Default::default()
    };
    agent.start(key, assign, 1);
    let ckpt = checkpoint::dir(dir.path(), 9, 0);
    muster_testkit::eventually("the task to start", muster_testkit::WAIT, || ckpt.join("ready").exists().then_some(()))
        .await;
    let m = fs::metadata(&ckpt).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (60401, 0o700), "its directory is its account's while it runs");
    let hint = Hint {
        epoch: 4,
        timeout: Duration::from_secs(60),
        max_deferral: Duration::ZERO,
        grace: Duration::from_millis(500),
    };
    agent.running[&key].ctrl.clone().unwrap().send(Control::Hint(hint)).unwrap();
    let (k, ended) = tokio::time::timeout(Duration::from_secs(60), agent.exits_rx.recv()).await.unwrap().unwrap();
    assert_eq!(k, key);
    assert!(!ended.checkpoint_failed, "the task's done ended the protocol in time");
    assert_eq!(fs::read_to_string(ckpt.join("state")).unwrap().trim(), "60401");
    assert!(fs::read_to_string(ckpt.join("seen")).unwrap().contains("\"epoch\":4"), "it read the agent's request");
    let m = fs::metadata(&ckpt).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700), "taken back once the attempt ended");
}

/// A task's log directory: made with its allocation's when missing, and
/// said to be new only when it was made now (so an earlier attempt's
/// progress file cannot be in it).
#[test]
fn a_new_log_directory_is_told_from_one_already_there() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("logs").join("alloc-1").join("task-0");
    assert!(task::make_new_dir(&task), "logs/ missing: made whole");
    assert!(task.is_dir());
    assert!(!task::make_new_dir(&task), "already there");
    let sibling = dir.path().join("logs").join("alloc-1").join("task-1");
    assert!(task::make_new_dir(&sibling), "its allocation's directory there");
    let other = dir.path().join("logs").join("alloc-2").join("task-0");
    assert!(task::make_new_dir(&other));
    fs::write(dir.path().join("logs").join("alloc-3"), "").unwrap();
    assert!(!task::make_new_dir(&dir.path().join("logs").join("alloc-3").join("task-0")), "a file in the way");
}

/// Reserving takes new space only once: a new slot is written (`starting`)
/// so that its record later needs none; a slot already whole is only
/// taken, not written, and holds its attempt's record once it started.
#[test]
fn reserving_a_whole_slot_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let running = dir.path().join("running");
    let r = plain_record(7, vec![]);
    let slot0 = || fs::read_to_string(running.join("slot-0")).unwrap();
    let (mut records, _) = Records::open(running.clone(), None).unwrap();
    records.reserve((1, 0, 1)).unwrap();
    assert_eq!(slot0().trim(), "key=1-0-1 starting", "a new slot is written whole");
    assert_eq!(slot0().len(), record::SLOT_BYTES);
    records.put((1, 0, 1), &r).unwrap();
    records.clear((1, 0, 1));
    records.reserve((2, 0, 1)).unwrap();
    assert_eq!(slot0().trim(), "", "the whole slot was taken, not written");
    records.put((2, 0, 1), &r).unwrap();
    assert!(slot0().starts_with("key=2-0-1 pgid=7 "), "{}", slot0());
    // The next agent finds slots whole and writes none to reserve them.
    records.clear((2, 0, 1));
    drop(records);
    let (mut records, found) = Records::open(running.clone(), None).unwrap();
    assert!(found.is_empty());
    records.reserve((3, 0, 1)).unwrap();
    assert_eq!(slot0().trim(), "");
}
