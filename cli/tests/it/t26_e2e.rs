//! End to end in one process: three replicas and four agents on loopback,
//! gangs of real processes.

use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;

use crate::cluster::{WAIT, channel};

pub(crate) async fn leader_client(c: &LocalCluster) -> AllocationServiceClient<tonic::transport::Channel> {
    let id = muster_testkit::eventually("a leader", WAIT, || c.leader_id()).await;
    AllocationServiceClient::new(channel(&c.scheduler_addrs()[id as usize - 1]).await.unwrap())
}

pub(crate) fn gang(n: u32, script: &str, max_retries: u32) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus: 2, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        max_retries,
        ..Default::default()
    }
}

pub(crate) async fn submit(c: &LocalCluster, spec: v1::AllocationSpec) -> u64 {
    muster_testkit::eventually_async("the submit to succeed", WAIT, || async {
        match leader_client(c)
            .await
            .submit(v1::SubmitRequest { spec: Some(spec.clone()), dry_run: false, ..Default::default() })
            .await
        {
            Ok(r) => Ok(r.into_inner().id),
            Err(e) => Err(format!("submit failed: {e}")),
        }
    })
    .await
}

pub(crate) async fn get(c: &LocalCluster, id: u64) -> v1::Allocation {
    muster_testkit::eventually_async(&format!("allocation {id} to be read"), WAIT, || async {
        match leader_client(c).await.get(v1::GetRequest { id }).await {
            Ok(r) => Ok(r.into_inner()),
            Err(e) => Err(format!("get {id}: {e}")),
        }
    })
    .await
}

/// Polls until `pred` holds for the allocation.
pub(crate) async fn until(
    c: &LocalCluster,
    id: u64,
    what: &str,
    pred: impl Fn(&v1::Allocation) -> bool,
) -> v1::Allocation {
    let what = format!("allocation {id} to be {what}");
    muster_testkit::eventually_async(&what, WAIT, || async {
        let a = get(c, id).await;
        if pred(&a) { Ok(a) } else { Err(format!("{a:?}")) }
    })
    .await
}

pub(crate) fn status(a: &v1::Allocation) -> v1::AllocationStatus {
    v1::AllocationStatus::try_from(a.status).unwrap()
}

fn fast() -> LocalConfig {
    crate::tls::quick_cluster(LocalConfig::default().agents, Duration::from_secs(1))
}

/// A local cluster without TLS (what `cargo bench --bench gangs` runs):
/// it admits its own agents (an admission by an unauthenticated caller is
/// recorded as such) and runs a gang.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t192_an_insecure_local_cluster_admits_its_agents_and_runs_a_gang() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig { agents: 2, insecure: true, ..fast() };
    let c = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let mut client = AllocationServiceClient::new(c.leader_channel().await);
    // The agents may still be registering (a loaded machine): queued
    // whatever the nodes known so far could run.
    let req = v1::SubmitRequest { spec: Some(gang(2, "true", 0)), queue_if_unsatisfiable: true, ..Default::default() };
    let submitted = client.submit(req).await;
    let id = submitted.unwrap().into_inner().id;
    muster_testkit::eventually_async("the gang to finish", WAIT, || async {
        let mut client = AllocationServiceClient::new(c.leader_channel().await);
        match client.get(v1::GetRequest { id }).await {
            Ok(a) if status(a.get_ref()) == v1::AllocationStatus::Done => Ok(()),
            Ok(a) => Err(format!("{:?}", a.into_inner())),
            Err(e) => Err(format!("get {id}: {e}")),
        }
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_a_gang_of_four_runs_real_processes_on_four_agents() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), fast()).await.unwrap();
    let script = "echo task $MUSTER_TASK_INDEX of $MUSTER_GANG_SIZE attempt $MUSTER_ATTEMPT gpus $CUDA_VISIBLE_DEVICES peers $MUSTER_GANG_PEERS";
    let id = submit(&c, gang(4, script, 3)).await;
    let running_or_done = until(&c, id, "placed on 4 nodes", |a| a.tasks.iter().all(|t| !t.node_id.is_empty())).await;
    let mut nodes: Vec<String> = running_or_done.tasks.iter().map(|t| t.node_id.clone()).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "one task per node: {running_or_done:?}");
    let done = until(&c, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    // Every task's output is in its node's attempt log.
    for t in &done.tasks {
        let i: u32 = t.node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
        let log = c.agent_dir(i).join(format!("logs/alloc-{id}/task-{}/attempt-1.out", t.index));
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert!(text.starts_with(&format!("task {} of 4 attempt 1 gpus ", t.index)), "{text}");
        assert_eq!(text.trim().split(',').count(), 2 + 3, "two GPU ids and four peers: {text}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t81_failures_follow_the_retry_rules_and_cancel_stops_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), fast()).await.unwrap();

    // A task that always fails: with max_retries 2 it fails for good after
    // its second attempt.
    let id = submit(&c, gang(1, "exit 7", 2)).await;
    let failed = until(&c, id, "failed", |a| status(a) == v1::AllocationStatus::Failed).await;
    assert_eq!((failed.tasks[0].attempts, failed.tasks[0].exit_code), (2, Some(7)), "{failed:?}");

    // A gang whose task 1 fails while task 0 finishes: a finished task
    // cannot be re-run whole, so the gang fails (the seed's completion rule).
    let id = submit(&c, gang(2, "if [ $MUSTER_TASK_INDEX = 1 ]; then sleep 1; exit 3; fi", 3)).await;
    let failed = until(&c, id, "failed", |a| status(a) == v1::AllocationStatus::Failed).await;
    assert_eq!(v1::TaskStatus::try_from(failed.tasks[0].status), Ok(v1::TaskStatus::Done));

    // Cancel a gang whose shells trap TERM: gone within grace (1 s) + 1 s.
    let id = submit(&c, gang(2, "trap '' TERM; echo $$ > pid-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 60", 3)).await;
    until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let a = get(&c, id).await;
    let pid_files: Vec<_> = a
        .tasks
        .iter()
        .map(|t| {
            let i: u32 = t.node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
            c.agent_dir(i).join(format!("pid-{id}-{}", t.index))
        })
        .collect();
    muster_testkit::eventually("the tasks to write their pids", WAIT, || {
        (pid_files.iter().all(|p| std::fs::read_to_string(p).is_ok_and(|s| !s.trim().is_empty()))).then_some(())
    })
    .await;
    let pids: Vec<i32> =
        pid_files.iter().map(|p| std::fs::read_to_string(p).unwrap().trim().parse().unwrap()).collect();
    let started = Instant::now();
    let cancelled =
        leader_client(&c).await.cancel(v1::CancelRequest { id, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(status(&cancelled), v1::AllocationStatus::TearingDown, "stopping, holding its GPUs");
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
    };
    let within = (Duration::from_secs(2) + Duration::from_millis(500)).saturating_sub(started.elapsed());
    muster_testkit::eventually("the TERM-trapping tasks to stop within grace + 1 s", within, || {
        (!pids.iter().any(|p| alive(*p))).then_some(())
    })
    .await;
    until(&c, id, "cancelled once its tasks stopped", |a| status(a) == v1::AllocationStatus::Cancelled).await;
    let again = leader_client(&c).await.cancel(v1::CancelRequest { id, ..Default::default() }).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    c.shutdown().await;
}

fn node_status(c: &LocalCluster, node: &str) -> Option<String> {
    let l = c.leader_id()?;
    c.replica(l)?.reader().read(|st| {
        let slot = st.node_slot(&muster_scheduler::sm::NodeId::new(node))?;
        Some(format!("{:?}", st.node(slot).status))
    })
}

pub(crate) fn proc_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// An agent killed mid-task: its node is marked lost, the task is failed and
/// placed again elsewhere; the agent restarting with the same id kills what
/// it left behind and registers cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t82_an_agent_killed_mid_task_loses_its_node_and_comes_back_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig { node_lost_after: Duration::from_secs(2), ..fast() };
    let mut c = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let id = submit(&c, gang(1, "echo $$ > pid-$MUSTER_ATTEMPT; sleep 60", 3)).await;
    let a = until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let node = a.tasks[0].node_id.clone();
    let i: u32 = node.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    let pid_file = c.agent_dir(i).join("pid-1");
    muster_testkit::eventually("the task to write its pid", WAIT, || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty()).then_some(())
    })
    .await;
    let orphan: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();

    c.kill_agent(i);
    let moved = until(&c, id, "re-placed on another node", |a| {
        status(a) == v1::AllocationStatus::Running && a.tasks[0].node_id != node
    })
    .await;
    assert_eq!(moved.tasks[0].attempts, 2, "the lost attempt counts: {moved:?}");
    assert_eq!(node_status(&c, &node).as_deref(), Some("Lost"));

    c.restart_agent(i);
    muster_testkit::eventually("the node to come back clean", WAIT, || {
        let (st, alive) = (node_status(&c, &node), proc_alive(orphan));
        if st.as_deref() == Some("Ready") && !alive { Ok(()) } else { Err(format!("{st:?}, orphan alive {alive}")) }
    })
    .await;
    c.shutdown().await;
}

/// A leader that restarts never resumes leading in the term it led: it
/// may have sent followers entries its own log had not synced, and leading
/// again under the same leader id it would write different ones at those
/// indexes, which the followers would take for the same (chaos caught two
/// replicas applying different entries at one index this way). It comes
/// back a follower, and whoever leads next was elected in a later term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t84_a_restarted_leader_never_leads_again_in_its_old_term() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(dir.path(), fast()).await.unwrap();
    let id = submit(&c, gang(1, "true", 0)).await;
    until(&c, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    let old = c.leader_id().unwrap();
    let term = c.replica(old).unwrap().status().term;
    c.restart_replica(old).await.unwrap();
    let (leader, now) = muster_testkit::eventually("a leader after the restart", Duration::from_secs(120), || {
        c.leader_id().map(|l| (l, c.replica(l).unwrap().status().term))
    })
    .await;
    assert!(now > term, "replica {leader} leads in term {now}; replica {old} led term {term} before its restart");
    c.shutdown().await;
}

/// The leader goes away while agents hold streams: they reconnect to the
/// new leader, running processes are not restarted, nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t83_a_leader_change_does_not_restart_running_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(dir.path(), fast()).await.unwrap();
    let id = submit(&c, gang(2, "sleep 4; echo finished", 3)).await;
    until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    let old = c.leader_id().unwrap();
    c.stop_replica(old).await;
    let done = until(&c, id, "done after the leader change", |a| status(a) == v1::AllocationStatus::Done).await;
    assert!(done.tasks.iter().all(|t| t.attempts == 1), "no task ran twice: {done:?}");
    for t in &done.tasks {
        let i: u32 = t.node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
        let dir = c.agent_dir(i).join(format!("logs/alloc-{id}/task-{}", t.index));
        let attempts: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(attempts.len(), 3, "only attempt-1's out, err and hostfile: {attempts:?}");
        assert_eq!(std::fs::read_to_string(dir.join("attempt-1.out")).unwrap(), "finished\n");
    }
    c.restart_replica(old).await.unwrap();
    c.shutdown().await;
}
