//! Regressions for the promises a real workload broke (issue 22): real
//! replicas, real agents, real task processes that behave like real ones
//! (they ignore SIGTERM, and ranks die with their peers).

use std::time::Duration;

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;

use crate::cluster::WAIT;
use crate::t26_e2e::{get, leader_client, proc_alive, status, submit, until};
use crate::tls::quick_cluster;

fn whole_node(n: u32, script: &str) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        max_retries: 3,
        ..Default::default()
    }
}

/// The pids a task wrote into its node's work dir (`pid-<alloc>-<task>`).
async fn pids(c: &LocalCluster, a: &v1::Allocation) -> Vec<i32> {
    let mut out = Vec::new();
    for t in &a.tasks {
        let agent = t.node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
        let path = c.agent_dir(agent).join(format!("pid-{}-{}", a.id, t.index));
        let pid: i32 = muster_testkit::eventually(&format!("{} to be written", path.display()), WAIT, || {
            std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok())
        })
        .await;
        out.push(pid);
    }
    out
}

/// A task that ignores SIGTERM: only the SIGKILL after the grace stops it.
const STUBBORN: &str = "trap '' TERM; echo $$ > pid-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; \
                        while true; do sleep 0.1; done";

/// Issue 22, item 1: cancelling a running gang whose tasks ignore SIGTERM
/// keeps their GPUs held until each process is gone. A job submitted right
/// after the cancel starts only once the old processes are dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t140_a_cancel_holds_the_gpus_until_the_cancelled_processes_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let grace = Duration::from_secs(3);
    let c = LocalCluster::start(dir.path(), quick_cluster(4, grace)).await.unwrap();
    let old = submit(&c, whole_node(4, STUBBORN)).await;
    let running = until(&c, old, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let old_pids = pids(&c, &running).await;
    assert!(old_pids.iter().all(|&p| proc_alive(p)));

    let cancelled =
        leader_client(&c).await.cancel(v1::CancelRequest { id: old, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(status(&cancelled), v1::AllocationStatus::TearingDown, "{cancelled:?}");
    assert_eq!(cancelled.teardown.as_ref().map(|t| t.reason.as_str()), Some("cancel"));
    let again = leader_client(&c).await.cancel(v1::CancelRequest { id: old, ..Default::default() }).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("already being cancelled"), "{again:?}");

    let new = submit(&c, whole_node(1, "echo $$ > pid-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 30")).await;
    muster_testkit::eventually_async(&format!("allocation {new} to be placed"), WAIT, || async {
        let a = get(&c, new).await;
        let placed = matches!(status(&a), v1::AllocationStatus::Reserved | v1::AllocationStatus::Running);
        if !placed {
            return Err(format!("{a:?}"));
        }
        let alive: Vec<i32> = old_pids.iter().copied().filter(|&p| proc_alive(p)).collect();
        assert!(alive.is_empty(), "allocation {new} placed while the cancelled tasks {alive:?} still run: {a:?}");
        Ok(())
    })
    .await;
    let done = until(&c, old, "cancelled", |a| status(a) == v1::AllocationStatus::Cancelled).await;
    assert!(done.tasks.iter().all(|t| t.attempts == 0), "a cancel charges nothing: {done:?}");
    until(&c, new, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    c.shutdown().await;
}

/// The events of an allocation, from the leader's state.
fn history(c: &LocalCluster, id: u64) -> Vec<muster_scheduler::sm::Event> {
    let Some(l) = c.leader_id() else { return Vec::new() };
    c.replica(l).map_or_else(Vec::new, |r| {
        r.reader()
            .read(|st| st.alloc(id).map(|a| a.history.iter().map(|e| e.event.clone()).collect()))
            .unwrap_or_default()
    })
}

/// A rank of a collective job, in the shape NCCL, gloo and MPI give it: rank
/// 0 rendezvouses with every peer over TCP, and each step is a round trip
/// with all of them (an all-reduce stand-in). When any peer dies, the others
/// see the connection drop within milliseconds and exit non-zero on their
/// own. After each step it checkpoints the step by write-then-rename, and
/// on start it resumes from the checkpoint.
const RANK: &str = r#"
import os, socket, sys, time
rank = int(os.environ["MUSTER_TASK_INDEX"]); size = int(os.environ["MUSTER_GANG_SIZE"])
ckpt = os.environ["MUSTER_CHECKPOINT_DIR"]; rdv = os.environ["RDV"]; epoch = os.environ["MUSTER_EPOCH"]
step_file = os.path.join(ckpt, "step")
step = int(open(step_file).read()) if os.path.exists(step_file) else 0
print(f"rank {rank} starts at step {step}", flush=True)
with open(os.path.join(rdv, f"pid-{rank}-{epoch}"), "w") as f:
    f.write(str(os.getpid()))
if rank == 0:
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(size)
    tmp = os.path.join(rdv, f".port-{epoch}.tmp")
    with open(tmp, "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.rename(tmp, os.path.join(rdv, f"port-{epoch}"))
    peers = [srv.accept()[0] for _ in range(size - 1)]
else:
    path = os.path.join(rdv, f"port-{epoch}")
    while not os.path.exists(path):
        time.sleep(0.02)
    peers = [socket.create_connection(("127.0.0.1", int(open(path).read())))]
def save(step):
    with open(step_file + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(step_file + ".tmp", step_file)
# Rank 0 leads the steps (ranks may resume a step apart) and ends the run.
if rank == 0:
    while step < 150:
        step += 1
        for p in peers: p.sendall(b"x")
        for p in peers:
            if p.recv(1) != b"y": print(f"rank 0: a peer died at step {step}", file=sys.stderr); sys.exit(1)
        save(step)
        time.sleep(0.03)
    for p in peers: p.sendall(b"q")
else:
    while True:
        m = peers[0].recv(1)
        if m == b"q": break
        if m != b"x": print(f"rank {rank}: rank 0 died at step {step}", file=sys.stderr); sys.exit(1)
        step += 1
        peers[0].sendall(b"y")
        save(step)
print(f"rank {rank} finished at step {step}", flush=True)
"#;

/// Issue 22, item 2: SIGKILL one rank of a running 4-rank collective gang.
/// Its peers exit non-zero on their own before the teardown reaches them;
/// every rank's last checkpoint (the killed one's too) is uploaded at its
/// exit, and the restarted gang resumes each rank from it, not from step 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t141_a_rank_killed_mid_run_loses_no_checkpoint_of_its_gang() {
    let dir = tempfile::tempdir().unwrap();
    let rdv = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), quick_cluster(4, Duration::from_secs(5))).await.unwrap();
    let spec = v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 4,
        resources: Some(v1::Resources { gpus: 2, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["python3".into(), "-c".into(), RANK.into()],
        env: [("RDV".to_string(), rdv.path().display().to_string())].into(),
        checkpoint: v1::CheckpointMode::Auto as i32,
        max_retries: 3,
        ..Default::default()
    };
    let id = submit(&c, spec).await;
    let running = until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let epoch = running.tasks[0].reservation_epoch;
    let step_of = |t: &v1::Task| {
        let agent = t.node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
        let f = c.agent_dir(agent).join(format!("checkpoints/alloc-{id}-task-{}/step", t.index));
        std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0)
    };
    muster_testkit::eventually("the ranks to make progress", WAIT, || {
        (!(running.tasks.iter().any(|t| step_of(t) < 10))).then_some(())
    })
    .await;
    let pid: i32 = std::fs::read_to_string(rdv.path().join(format!("pid-1-{epoch}"))).unwrap().trim().parse().unwrap();
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());

    let done = until(&c, id, "done after the restart", |a| status(a) == v1::AllocationStatus::Done).await;
    let events = history(&c, id);
    let saved: std::collections::BTreeSet<u32> = events
        .iter()
        .filter_map(|e| match e {
            muster_scheduler::sm::Event::CheckpointSaved { task, .. } => Some(*task),
            _ => None,
        })
        .collect();
    assert_eq!(saved, (0..4).collect(), "every rank's checkpoint was saved, the killed one's too: {events:?}");
    for t in &done.tasks {
        assert_eq!(t.runs, 2, "{done:?}");
        let agent = t.last_node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
        let out = c.agent_dir(agent).join(format!("logs/alloc-{id}/task-{}/attempt-2.out", t.index));
        let out = std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
        let resumed: u32 = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("rank {} starts at step ", t.index)))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no start line in {out}"));
        assert!(resumed >= 10, "rank {} restarted from step {resumed}, not from its checkpoint", t.index);
    }
    c.shutdown().await;
}

/// The whole log of one attempt, through the leader's Logs call.
async fn attempt_log(c: &LocalCluster, id: u64, attempt: u32, stderr: bool) -> Result<String, tonic::Status> {
    let req = v1::LogsRequest { id, task: 0, attempt, stderr, follow: false };
    let mut stream = leader_client(c).await.logs(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.data);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Issue 22, item 5: each attempt's log is fetched from the node it ran on,
/// after the task moved to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t142_an_earlier_attempt_s_log_comes_from_the_node_it_ran_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig { node_lost_after: Duration::from_secs(2), ..quick_cluster(2, Duration::from_secs(1)) };
    let mut c = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let id = submit(&c, whole_node(1, "echo run $MUSTER_ATTEMPT on $MUSTER_NODE_ID; sleep 60")).await;
    let first = until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let node = first.tasks[0].node_id.clone();
    let i = node.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    // Running in the state means its claim was granted; the process may
    // not have printed yet. Kill its agent only once it has.
    muster_testkit::eventually_async("attempt 1 to print", WAIT, || async {
        attempt_log(&c, id, 1, false).await.is_ok_and(|l| l.contains("run 1")).then_some(())
    })
    .await;
    c.kill_agent(i);
    let moved = until(&c, id, "re-placed on the other node", |a| {
        status(a) == v1::AllocationStatus::Running && a.tasks[0].node_id != node
    })
    .await;
    c.restart_agent(i);
    let other = moved.tasks[0].node_id.clone();
    muster_testkit::eventually_async("the attempt logs to be read from their nodes", WAIT, || async {
        let (one, two) = (attempt_log(&c, id, 1, false).await, attempt_log(&c, id, 2, false).await);
        if let (Ok(one), Ok(two)) = (&one, &two)
            && one.contains("run 1")
            && two.contains("run 2")
        {
            assert_eq!(one.trim(), format!("run 1 on {node}"));
            assert_eq!(two.trim(), format!("run 2 on {other}"));
            return Ok(());
        }
        Err(format!("{one:?} {two:?}"))
    })
    .await;
    c.shutdown().await;
}

/// Issue 22, item 5: a task whose program does not exist fails with the
/// reason in its event and in its attempt's stderr log, where its owner
/// looks, instead of "no log".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t143_a_task_that_cannot_start_says_why_in_its_event_and_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), quick_cluster(1, Duration::from_secs(1))).await.unwrap();
    let spec = v1::AllocationSpec {
        command: vec!["/nonexistent/train-model".into()],
        max_retries: 1,
        ..whole_node(1, "unused")
    };
    let id = submit(&c, spec).await;
    until(&c, id, "failed", |a| status(a) == v1::AllocationStatus::Failed).await;
    let reasons: Vec<String> = history(&c, id)
        .into_iter()
        .filter_map(|e| match e {
            muster_scheduler::sm::Event::TaskStartFailed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("/nonexistent/train-model"), "{reasons:?}");
    let err = attempt_log(&c, id, 1, true).await.unwrap();
    assert!(err.contains("muster: the task did not start") && err.contains("/nonexistent/train-model"), "{err}");
    c.shutdown().await;
}

/// The leader's last log index, to show that a refusal wrote nothing.
fn last_log_index(c: &LocalCluster) -> u64 {
    c.replica(c.leader_id().expect("a leader")).expect("the leader runs").status().last_log_index
}

/// Issue 22, items 6 and 8, and issue 43: an agent with a valid
/// certificate uploads checkpoint manifests for a task that is not its own,
/// over the cap, with a stale epoch, with a malformed digest, with a key
/// naming another job's checkpoint, in a store the allocation does not use,
/// and with no manifest at all (bytes, as before). The leader answers each
/// with the refusal and proposes nothing; the agent's own well-formed
/// manifest is then stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t144_bad_uploads_are_refused_on_the_leader_before_the_log() {
    use muster_proto::v1::agent_message::Msg as Up;
    use muster_proto::v1::scheduler_message::Msg as Down;

    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), quick_cluster(1, Duration::from_secs(1))).await.unwrap();
    let mut ghost = crate::t40_teardown::Ghost::connect(&c).await;
    // The real node's task fails in the first round; the ghost's is torn down.
    let spec = v1::AllocationSpec {
        resources: Some(v1::Resources { gpus: 2, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        ..whole_node(2, r#"if [ "$MUSTER_EPOCH" = 1 ]; then sleep 1; exit 4; fi; echo ok"#)
    };
    let id = submit(&c, spec).await;
    let mine = ghost.wait_for(|m| if let Down::Assign(a) = m { a.task } else { None }).await;
    ghost.send(Up::Claim(v1::Claim { task: Some(mine) })).await;
    let p = ghost.wait_for(|m| if let Down::Preempt(p) = m { Some(p) } else { None }).await;
    // Someone else's job, running on the real node.
    let other = submit(&c, whole_node(1, "sleep 60")).await;
    let o = until(&c, other, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let theirs = v1::TaskRef { alloc_id: other, task_index: 0, epoch: o.tasks[0].reservation_epoch };

    let before = last_log_index(&c);
    let good = crate::manifest(id, mine.task_index, "step-42", 42);
    let upload = |task: v1::TaskRef, epoch: u64, manifest: Option<v1::CheckpointManifest>| {
        Up::Checkpoint(v1::CheckpointUpload { task: Some(task), preemption_epoch: epoch, manifest, on_exit: false })
    };
    let at_exit = |task: v1::TaskRef, manifest: v1::CheckpointManifest| {
        Up::Checkpoint(v1::CheckpointUpload {
            task: Some(task),
            preemption_epoch: 0,
            manifest: Some(manifest),
            on_exit: true,
        })
    };
    let with = |f: &dyn Fn(&mut v1::CheckpointManifest)| {
        let mut m = good.clone();
        f(&mut m);
        Some(m)
    };
    let epoch = p.preemption_epoch;
    let cases = [
        (at_exit(theirs, crate::manifest(other, 0, "x", 1)), "PERMISSION_DENIED", "not placed on node ghost"),
        (upload(mine, epoch + 1, Some(good.clone())), "ABORTED", "stale"),
        (upload(mine, epoch, with(&|m| m.bytes = (64 << 30) + 1)), "RESOURCE_EXHAUSTED", "limit"),
        (upload(mine, epoch, with(&|m| m.sha256 = vec![1; 7])), "INVALID_ARGUMENT", "manifest.sha256"),
        (
            upload(mine, epoch, with(&|m| m.key = format!("alloc-{other}/task-0/their-state"))),
            "INVALID_ARGUMENT",
            "a task's checkpoints are named for it",
        ),
        (
            upload(mine, epoch, with(&|m| m.key = format!("alloc-{id}/task-{}/../../x", mine.task_index))),
            "INVALID_ARGUMENT",
            "not a plain name",
        ),
        (upload(mine, epoch, with(&|m| m.store = "/etc".into())), "INVALID_ARGUMENT", "manifest.store"),
        (upload(mine, epoch, None), "INVALID_ARGUMENT", "checkpoint bytes never travel to the leader"),
    ];
    for (msg, code, says) in cases {
        ghost.send(msg).await;
        let r = ghost.wait_for(|m| if let Down::Refused(r) = m { Some(r) } else { None }).await;
        assert_eq!(r.code, code, "{r:?}");
        assert!(r.message.contains(says), "{says:?} not in {r:?}");
        assert!(r.checkpoint, "a refused upload says so, for the agent to delete what it wrote: {r:?}");
    }
    assert_eq!(last_log_index(&c), before, "no refused upload reached the log");
    assert_eq!(get(&c, id).await.tasks[mine.task_index as usize].checkpoint_bytes, 0);

    ghost.send(upload(mine, epoch, Some(good.clone()))).await;
    ghost.send(Up::Preempted(v1::Preempted { task: Some(mine), preemption_epoch: epoch, ..Default::default() })).await;
    let a =
        until(&c, id, "holding the ghost's checkpoint", |a| a.tasks[mine.task_index as usize].checkpoint_bytes == 42)
            .await;
    let stored = &a.tasks[mine.task_index as usize].checkpoints[0];
    assert_eq!(
        (stored.writer.as_str(), stored.store.as_str(), stored.key.as_str()),
        ("ghost", "node", good.key.as_str())
    );
    assert!(a.tasks.iter().all(|t| t.attempts <= 1), "nobody was charged for the refusals: {a:?}");
    let o = get(&c, other).await;
    assert_eq!((status(&o), o.tasks[0].checkpoint_bytes), (v1::AllocationStatus::Running, 0), "{o:?}");
    c.shutdown().await;
}

/// Issue 22, item 12: `muster dev --data-dir D` started again on the same D
/// (after SIGINT) comes back on the replicas' recorded addresses, elects a
/// leader, and still holds what the first run did.
#[test]
fn t145_muster_dev_restarts_on_its_own_data() {
    use crate::dev_proc::{Dev, wait_until};
    let dev = Dev::start();
    let id = dev.ok(&["submit", "--gpus", "1", "--", "true"])["id"].as_u64().unwrap().to_string();
    wait_until("the job to finish", || dev.json(&["alloc", "get", &id])["status"] == "done");
    let sched = dev.sched.clone();
    let dir = dev.stop();
    let data = dir.path().join("dev");
    assert!(data.join(muster_local::ADDRS_FILE).exists());
    let again = Dev::start_on(dir, data, &[]);
    assert_eq!(again.sched, sched, "the same replica addresses as the stored membership");
    assert_eq!(again.ok(&["alloc", "get", &id])["status"], "done", "the first run's work is still there");
    let next = again.ok(&["submit", "--gpus", "1", "--", "true"])["id"].as_u64().unwrap();
    assert!(next > id.parse::<u64>().unwrap());
}

/// Issue 22, item 11: a burst of 1,000 concurrent `Get`s and 1,000 `Watch`
/// opens on the leader, with no leader change, all succeed: reads wait
/// together for one leadership confirmation instead of each asking a
/// quorum, and a confirmation a retry would win is retried, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t146_a_burst_of_reads_is_served_without_spurious_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), quick_cluster(1, Duration::from_secs(1))).await.unwrap();
    let id = submit(&c, whole_node(1, "sleep 600")).await;
    let term = |c: &LocalCluster| c.replica(c.leader_id().unwrap()).unwrap().status().term;
    let before = term(&c);
    // A loaded 2-core machine may take longer than the usual 5 s per call
    // to serve 8,000 debug-build reads: only a refusal fails this test,
    // never slowness.
    let leader = c.scheduler_addrs()[c.leader_id().unwrap() as usize - 1].clone();
    let channel = muster_tls::endpoint(&leader, Some(&crate::tls::admin()))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300))
        .connect()
        .await
        .unwrap();
    let client = v1::allocation_service_client::AllocationServiceClient::new(channel);
    let gets = (0..4_000).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move { client.get(v1::GetRequest { id }).await.map(drop) })
    });
    let watches = (0..4_000).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let mut stream = client.watch(v1::WatchRequest { id, from_revision: 0 }).await?.into_inner();
            stream.message().await.map(drop)
        })
    });
    let results: Vec<Result<(), tonic::Status>> =
        futures_join(gets.chain(watches).collect()).await.into_iter().map(|r| r.unwrap()).collect();
    let failed: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|s| format!("{s:?}")).collect();
    assert_eq!(term(&c), before, "no leader change during the burst");
    assert!(failed.is_empty(), "{} of 8,000 reads failed, e.g. {:?}", failed.len(), failed.first());
    c.shutdown().await;
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await);
    }
    out
}

/// A node's stream does not wait for one command's commit before it reads
/// the agent's next message: with every replica's disk stalled (nothing
/// commits), a claim waits in the log's queue, and the heartbeat the agent
/// sends after it is answered all the same. Once the disks are back, the
/// claim is granted. (A stream that waited on each commit answered no
/// heartbeat until its claims were in: 10,000 agents that claimed while
/// the log was slow fenced themselves.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t235_a_nodes_heartbeat_is_answered_while_its_claim_waits_for_the_log() {
    use muster_proto::v1::agent_message::Msg as Up;
    use muster_proto::v1::agent_service_client::AgentServiceClient;
    use muster_proto::v1::scheduler_message::Msg as Down;
    use muster_raft_store::{DiskFault, set_disk_fault};

    use crate::cluster::{Cluster, channel_as, leader};
    use crate::t80_security::{register, up};

    let dir = tempfile::tempdir().unwrap();
    let fault = dir.path().join("disk-fault");
    let fault_arg = fault.to_str().unwrap().to_string();
    // Elections only after 8-10 s of silence: a leader whose disk stalls
    // sends no Raft heartbeats, and this one must still lead when it heals.
    let cluster = Cluster::start(dir.path(), &["--disk-fault-file", &fault_arg, "--heartbeat-ms", "2000"]);
    let l = leader(&cluster.addrs, None).await;
    let addr = cluster.addrs[l as usize - 1].clone();
    let tls = crate::tls::material(muster_tls::Role::Agent("piper".into()));
    let ch = muster_testkit::eventually_async("an agent channel to the leader", WAIT, || channel_as(&addr, &tls)).await;
    let (tx, out) = tokio::sync::mpsc::channel(64);
    tx.send(register("piper", 8)).await.unwrap();
    let mut rx = AgentServiceClient::new(ch)
        .connect(tokio_stream::wrappers::ReceiverStream::new(out))
        .await
        .expect("the leader takes the stream")
        .into_inner();
    let mut next = async || -> Down {
        let m = tokio::time::timeout(WAIT, rx.message()).await.expect("the leader said something in time");
        m.expect("the stream stays open").expect("a message").msg.expect("not empty")
    };
    assert!(matches!(next().await, Down::Registered(_)));

    let spec = v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: 1,
        resources: Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["true".into()],
        idempotency_key: "t235".into(),
        ..Default::default()
    };
    muster_testkit::eventually_async("the submit to be acknowledged", WAIT, || async {
        let ch = crate::cluster::channel(&addr).await?;
        let req = v1::SubmitRequest { spec: Some(spec.clone()), ..Default::default() };
        v1::allocation_service_client::AllocationServiceClient::new(ch).submit(req).await.ok()
    })
    .await;
    let task = loop {
        if let Down::Assign(a) = next().await {
            break a.task.expect("an assignment names its task");
        }
    };

    // Nothing commits from here on: the claim's entry waits at every sync.
    set_disk_fault(&fault, Some(DiskFault::StalledSync)).unwrap();
    tx.send(up(Up::Claim(v1::Claim { task: Some(task) }))).await.unwrap();
    tx.send(up(Up::Heartbeat(v1::Heartbeat::default()))).await.unwrap();
    loop {
        match next().await {
            Down::HeartbeatAck(_) => break,
            Down::Granted(_) | Down::Refused(_) => panic!("the claim was answered while nothing could commit"),
            _ => {}
        }
    }

    set_disk_fault(&fault, None).unwrap();
    loop {
        match next().await {
            Down::Granted(g) => {
                assert_eq!(g.task, Some(task));
                break;
            }
            Down::Refused(r) => panic!("the claim was refused: {r:?}"),
            _ => {}
        }
    }
}

/// Issue 51, failover at scale: the leader tells its agents over how long
/// to spread their reconnects (its streams at `--agent-reconnect-rate` a
/// second), at registration and with every heartbeat's answer, so that a
/// fleet whose leader dies does not dial the successor all at once. (The
/// agent's side, waiting its own point of that window, is
/// `muster-agent`'s `reconnect_spread` test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t236_agents_are_told_how_to_spread_their_reconnects() {
    use muster_proto::v1::agent_message::Msg as Up;
    use muster_proto::v1::agent_service_client::AgentServiceClient;
    use muster_proto::v1::scheduler_message::Msg as Down;

    use crate::cluster::{Cluster, channel_as, leader};
    use crate::t80_security::{register, up};

    let o = crate::muster(&["server", "--agent-reconnect-rate", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--agent-reconnect-rate"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    // One stream a second: each stream the leader holds adds a second.
    let cluster = Cluster::start(dir.path(), &["--agent-reconnect-rate", "1"]);
    let l = leader(&cluster.addrs, None).await;
    let addr = cluster.addrs[l as usize - 1].clone();
    let open = async |node: &str| {
        let tls = crate::tls::material(muster_tls::Role::Agent(node.into()));
        let ch =
            muster_testkit::eventually_async("an agent channel to the leader", WAIT, || channel_as(&addr, &tls)).await;
        let (tx, out) = tokio::sync::mpsc::channel(16);
        tx.send(register(node, 1)).await.unwrap();
        let mut rx = AgentServiceClient::new(ch)
            .connect(tokio_stream::wrappers::ReceiverStream::new(out))
            .await
            .expect("the leader takes the stream")
            .into_inner();
        let first = tokio::time::timeout(WAIT, rx.message()).await.expect("in time").expect("open").expect("a message");
        let Some(Down::Registered(r)) = first.msg else { panic!("expected Registered, got {first:?}") };
        (tx, rx, r)
    };
    let (tx_a, rx_a, _) = open("spread-a").await;
    let (_tx_b, _rx_b, _) = open("spread-b").await;
    // Both streams held (the second attaches just after its Registered):
    // a heartbeat's answer names two seconds.
    let a = std::sync::Arc::new(tokio::sync::Mutex::new((tx_a, rx_a)));
    let spread = muster_testkit::eventually_async("an answer naming both streams", WAIT, || {
        let a = a.clone();
        async move {
            let mut a = a.lock().await;
            let (tx, rx) = &mut *a;
            tx.send(up(Up::Heartbeat(v1::Heartbeat::default()))).await.unwrap();
            let spread = loop {
                let m =
                    tokio::time::timeout(WAIT, rx.message()).await.expect("in time").expect("open").expect("a message");
                if let Some(Down::HeartbeatAck(ack)) = m.msg {
                    break ack.reconnect_spread_ms;
                }
            };
            assert!(spread <= 2_000, "a heartbeat's answer said {spread} ms");
            (spread == 2_000).then_some(spread)
        }
    })
    .await;
    assert_eq!(spread, 2_000);
    // A third registration is told the same window.
    let (_tx_c, _rx_c, registered) = open("spread-c").await;
    assert_eq!(registered.reconnect_spread_ms, 2_000, "{registered:?}");
}
