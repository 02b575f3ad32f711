//! Gang teardown end to end: real replicas, real agents, real processes
//! (and, for the misbehaving node, a raw agent stream that claims and then
//! never acks, as a node dying mid-teardown would).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as Up;
use muster_proto::v1::agent_service_client::AgentServiceClient;
use muster_proto::v1::scheduler_message::Msg as Down;
use muster_scheduler::sm::{AllocId, Event, TeardownOutcome};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::cluster::WAIT;
use crate::t26_e2e::{gang, get, proc_alive, status, submit, until};
use crate::tls::quick_cluster;

/// The node index of an agent's node id (`node-3` → 2).
fn agent_index(node: &str) -> u32 {
    node.trim_start_matches("node-").parse::<u32>().unwrap() - 1
}

fn log(c: &LocalCluster, node: &str, id: u64, task: u32, attempt: u32) -> String {
    let path = c.agent_dir(agent_index(node)).join(format!("logs/alloc-{id}/task-{task}/attempt-{attempt}.out"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The teardown-completed events of an allocation, from the leader's state.
fn completions(c: &LocalCluster, id: AllocId) -> Vec<(u64, TeardownOutcome, u64)> {
    let Some(l) = c.leader_id() else { return Vec::new() };
    c.replica(l).map_or_else(Vec::new, |r| {
        r.reader().read(|st| {
            st.alloc(id)
                .map(|a| {
                    a.history
                        .iter()
                        .filter_map(|e| match e.event {
                            Event::TeardownCompleted { epoch, outcome, drain_ms, .. } => {
                                Some((epoch, outcome, drain_ms))
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    })
}

/// Waits for a file a task writes into its node's work dir.
async fn read_when_written(path: PathBuf) -> String {
    muster_testkit::eventually(&format!("{} to be written", path.display()), WAIT, || {
        let s = std::fs::read_to_string(&path).ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_string())
    })
    .await
}

/// A training loop: resumes from its checkpoint, counts steps, and on
/// SIGTERM saves its step to MUSTER_CHECKPOINT_DIR and exits.
const TRAINER: &str = r#"
echo $$ > pid-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX-$MUSTER_ATTEMPT
step=0
if [ "$MUSTER_RESUME" = 1 ]; then step=$(cat "$MUSTER_CHECKPOINT_DIR/step"); echo "resumed from $step data $CHECKPOINT_DATA"; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; echo "checkpointed at $step"; exit 143' TERM
while [ $step -lt 60 ]; do
  step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 0.1
done
echo "finished at $step"
"#;

/// The issue's "done means": kill one task of a running 4-task gang; the
/// other three are torn down within the grace, checkpoint, and the whole
/// gang is placed again and completes, resuming from the checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t199_killing_one_task_tears_down_the_gang_which_resumes_from_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let grace = Duration::from_secs(5);
    let c = LocalCluster::start(dir.path(), quick_cluster(5, grace)).await.unwrap();
    let id = submit(&c, gang(4, TRAINER, 3)).await;
    let running = until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    // Let every task make some progress, then SIGKILL task 0.
    for t in &running.tasks {
        let progress = c.agent_dir(agent_index(&t.node_id)).join(format!("progress-{id}-{}", t.index));
        muster_testkit::eventually_async(&format!("task {} to make progress", t.index), WAIT, || async {
            let step = read_when_written(progress.clone()).await.parse::<u32>().unwrap();
            if step >= 5 { Ok(()) } else { Err(format!("at step {step}")) }
        })
        .await;
    }
    let victim = &running.tasks[0];
    let pid_file = c.agent_dir(agent_index(&victim.node_id)).join(format!("pid-{id}-0-1"));
    let pid: i32 = read_when_written(pid_file).await.parse().unwrap();
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());

    let done = until(&c, id, "done after the teardown", |a| status(a) == v1::AllocationStatus::Done).await;
    let attempts: Vec<u32> = done.tasks.iter().map(|t| t.attempts).collect();
    let runs: Vec<u32> = done.tasks.iter().map(|t| t.runs).collect();
    assert_eq!(attempts, vec![2, 1, 1, 1], "only the killed task is charged: {done:?}");
    assert_eq!(runs, vec![2, 2, 2, 2], "every task ran twice: {done:?}");
    let teardowns = completions(&c, id);
    assert_eq!(teardowns.len(), 1, "{teardowns:?}");
    let (epoch, outcome, drain_ms) = teardowns[0];
    assert_eq!((epoch, outcome), (1, TeardownOutcome::Blocked));
    assert!(drain_ms < grace.as_millis() as u64, "the three siblings stopped within the grace: {drain_ms} ms");

    for t in &running.tasks[1..] {
        let first = log(&c, &t.node_id, id, t.index, 1);
        let saved: u32 = first
            .lines()
            .find_map(|l| l.strip_prefix("checkpointed at "))
            .unwrap_or_else(|| panic!("task {} never checkpointed: {first}", t.index))
            .parse()
            .unwrap();
        assert!(saved >= 5, "task {} checkpointed at {saved}", t.index);
        let again = done.tasks[t.index as usize].last_node_id.clone();
        let second = log(&c, &again, id, t.index, 2);
        let encoded = muster_agent::checkpoint::base64(format!("{saved}\n").as_bytes());
        assert!(
            second.starts_with(&format!("resumed from {saved} data {encoded}\n")),
            "task {} did not resume from step {saved}: {second}",
            t.index
        );
        assert!(second.ends_with("finished at 60\n"), "{second}");
    }
    let fresh = log(&c, &done.tasks[0].last_node_id, id, 0, 2);
    assert!(!fresh.contains("resumed"), "the killed task left no checkpoint: {fresh}");
    assert!(!proc_alive(pid));
    c.shutdown().await;
}

/// A task that ignores SIGTERM is killed when the grace ends; the teardown
/// completes then, not before, and the gang runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_a_term_ignoring_task_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let grace = Duration::from_secs(1);
    let c = LocalCluster::start(dir.path(), quick_cluster(2, grace)).await.unwrap();
    let script = r#"
if [ "$MUSTER_EPOCH" = 1 ]; then
  if [ "$MUSTER_TASK_INDEX" = 0 ]; then sleep 1; exit 5; fi
  trap '' TERM; echo $$ > stubborn-$MUSTER_ALLOC_ID; while true; do sleep 1; done
fi
echo ok"#;
    let id = submit(&c, gang(2, script, 3)).await;
    let done = until(&c, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    let teardowns = completions(&c, id);
    assert_eq!(teardowns.len(), 1, "{teardowns:?}");
    let (_, outcome, drain_ms) = teardowns[0];
    assert_eq!(outcome, TeardownOutcome::Blocked);
    assert!(drain_ms >= grace.as_millis() as u64, "the teardown waited out the grace: {drain_ms} ms");
    assert!(drain_ms < 15_000, "and then SIGKILL ended it: {drain_ms} ms");
    assert_eq!(done.tasks[1].runs, 2);
    for i in 0..2 {
        if let Ok(pid) = std::fs::read_to_string(c.agent_dir(i).join(format!("stubborn-{id}"))) {
            assert!(!proc_alive(pid.trim().parse().unwrap()), "the TERM-ignoring shell is dead");
        }
    }
    c.shutdown().await;
}

/// A raw agent stream standing in for a node whose agent claims its task and
/// then never acks a preempt (it hung, or died with its stream half-open).
pub(crate) struct Ghost {
    tx: mpsc::Sender<v1::AgentMessage>,
    rx: tonic::Streaming<v1::SchedulerMessage>,
}

impl Ghost {
    pub(crate) async fn connect(c: &LocalCluster) -> Ghost {
        let resources = v1::Resources { gpus: 8, vram_mb: 80_000, mem_mb: 256_000, cpus: 32 };
        // Admitted, as an operator would admit a real node.
        let admit = v1::AdmitNodeRequest {
            id: "ghost".into(),
            admission: Some(v1::NodeAdmission { resources: Some(resources), ..Default::default() }),
            revoke: false,
        };
        muster_testkit::eventually_async("the ghost's admission", muster_testkit::WAIT, || async {
            let mut nodes = muster_proto::v1::node_service_client::NodeServiceClient::new(c.leader_channel().await);
            nodes.admit_node(admit.clone()).await.ok()
        })
        .await;
        let mut g = muster_testkit::eventually_async("the ghost to find a leader", WAIT, || async {
            let l = c.leader_id()?;
            let ch = crate::cluster::channel_as(
                &c.scheduler_addrs()[l as usize - 1],
                &crate::tls::material(muster_tls::Role::Agent("ghost".into())),
            )
            .await?;
            let (tx, out) = mpsc::channel(64);
            tx.send(up(Up::Register(v1::Register {
                node_id: "ghost".into(),
                resources: Some(resources),
                ports: "29500-29599".into(),
                ..Default::default()
            })))
            .await
            .unwrap();
            let r = AgentServiceClient::new(ch).connect(ReceiverStream::new(out)).await.ok()?;
            Some(Ghost { tx, rx: r.into_inner() })
        })
        .await;
        assert!(matches!(g.next().await, Down::Registered(_)));
        let beat = g.tx.clone();
        tokio::spawn(async move {
            // A heartbeat every 300 ms, as a live agent sends.
            let mut every = tokio::time::interval(Duration::from_millis(300));
            every.tick().await;
            loop {
                every.tick().await;
                if beat.send(up(Up::Heartbeat(v1::Heartbeat::default()))).await.is_err() {
                    return;
                }
            }
        });
        g
    }

    async fn next(&mut self) -> Down {
        let m = tokio::time::timeout(WAIT, self.rx.message()).await.expect("the leader said something");
        m.expect("stream open").expect("message").msg.expect("non-empty")
    }

    /// The next message of the kind `pick` accepts (heartbeat repeats and
    /// the like are skipped).
    pub(crate) async fn wait_for<T>(&mut self, mut pick: impl FnMut(Down) -> Option<T>) -> T {
        // Heartbeat acks keep coming: the wait as a whole has a deadline.
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < deadline, "the leader never sent the message waited for");
            if let Some(t) = pick(self.next().await) {
                return t;
            }
        }
    }

    pub(crate) async fn send(&self, m: Up) {
        self.tx.send(up(m)).await.unwrap();
    }
}

fn up(m: Up) -> v1::AgentMessage {
    v1::AgentMessage { msg: Some(m) }
}

/// The ghost never acks: the leader force-drains at the timeout and the gang
/// goes back to the queue. In the next round it acks with the old epoch and
/// uploads with it (both refused as stale), then properly; its checkpoint
/// comes back in the next assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t86_a_silent_node_is_force_drained_and_stale_acks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig { teardown_force_after: Duration::from_secs(3), ..quick_cluster(1, Duration::from_secs(1)) };
    let c = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let mut ghost = Ghost::connect(&c).await;
    // Task on node-1 fails in the first two rounds; the ghost's task "runs".
    // (A different exit code each round: the same early failure twice in a
    // row would fail the gang at once.)
    let id = submit(
        &c,
        gang(2, r#"if [ "$MUSTER_EPOCH" -le 2 ]; then sleep 1; exit $((3 + MUSTER_EPOCH)); fi; echo ok"#, 5),
    )
    .await;

    // Round 1: claim, then ignore the preempt.
    let task = ghost.wait_for(|m| if let Down::Assign(a) = m { a.task } else { None }).await;
    ghost.send(Up::Claim(v1::Claim { task: Some(task) })).await;
    let started = Instant::now();
    let p = ghost.wait_for(|m| if let Down::Preempt(p) = m { Some(p) } else { None }).await;
    assert_eq!((p.preemption_epoch, p.grace_ms), (1, 1_000));
    // Repeated with heartbeats until acked.
    let again = ghost.wait_for(|m| if let Down::Preempt(p) = m { Some(p) } else { None }).await;
    assert_eq!(again.preemption_epoch, 1);
    until(&c, id, "force-drained and re-placed", |a| a.reservation_epoch == 2).await;
    assert!(started.elapsed() >= Duration::from_secs(3), "not before the force timeout");
    let first = completions(&c, id);
    assert_eq!(first[0].1, TeardownOutcome::Blocked, "{first:?}");
    assert!(first[0].2 >= 3_000, "forced at the timeout: {first:?}");

    // Round 2: claim; node-1 fails again; teardown epoch 2.
    let task = ghost.wait_for(|m| if let Down::Assign(a) = m { a.task } else { None }).await;
    assert_eq!(task.epoch, 2);
    ghost.send(Up::Claim(v1::Claim { task: Some(task) })).await;
    let p = ghost.wait_for(|m| if let Down::Preempt(p) = m { Some(p) } else { None }).await;
    assert_eq!(p.preemption_epoch, 2);
    let upload_of = |epoch: u64, name: &str| v1::CheckpointUpload {
        task: Some(task),
        preemption_epoch: epoch,
        manifest: Some(crate::manifest(task.alloc_id, task.task_index, name, 42)),
        on_exit: false,
    };
    let stale_upload = upload_of(1, "old");
    ghost.send(Up::Checkpoint(stale_upload)).await;
    let refused = ghost.wait_for(|m| if let Down::Refused(r) = m { Some(r) } else { None }).await;
    assert_eq!(refused.code, "ABORTED", "{refused:?}");
    assert!(refused.message.contains("preemption epoch 1 is stale (current 2)"), "{refused:?}");
    ghost.send(Up::Preempted(v1::Preempted { task: Some(task), preemption_epoch: 1, ..Default::default() })).await;
    let refused = ghost.wait_for(|m| if let Down::Refused(r) = m { Some(r) } else { None }).await;
    assert_eq!(refused.code, "ABORTED", "{refused:?}");
    assert_eq!(
        v1::AllocationStatus::try_from(get(&c, id).await.status),
        Ok(v1::AllocationStatus::TearingDown),
        "stale messages changed nothing"
    );
    ghost.send(Up::Checkpoint(upload_of(2, "step-42"))).await;
    ghost.send(Up::Preempted(v1::Preempted { task: Some(task), preemption_epoch: 2, ..Default::default() })).await;

    // Round 3: the checkpoint's manifest comes back with the assignment
    // (the ghost wrote it to its own disk: no address to fetch it from);
    // both finish.
    let assign = ghost.wait_for(|m| if let Down::Assign(a) = m { Some(a) } else { None }).await;
    let [restore] = &assign.restore[..] else { panic!("{assign:?}") };
    let m = restore.manifest.clone().unwrap();
    let key = format!("alloc-{}/task-{}/step-42", task.alloc_id, task.task_index);
    assert_eq!((m.key.as_str(), m.epoch, m.bytes, m.writer.as_str()), (key.as_str(), 2, 42, "ghost"));
    assert_eq!(restore.source, "", "the ghost serves no checkpoints");
    let task = assign.task.unwrap();
    ghost.send(Up::Claim(v1::Claim { task: Some(task) })).await;
    ghost.wait_for(|m| if let Down::Granted(g) = m { Some(g) } else { None }).await;
    ghost.send(Up::Exited(v1::TaskExited { task: Some(task), exit_code: Some(0), ..Default::default() })).await;
    let done = until(&c, id, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    assert_eq!(done.preemption_epoch, 2);
    c.shutdown().await;
}

/// The leader is stopped while a teardown waits for a slow checkpoint: the
/// new leader, reading epochs and the teardown from the replicated state,
/// signals the task again, takes the ack and the checkpoint, and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t87_a_new_leader_finishes_a_teardown_the_old_one_started() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(dir.path(), quick_cluster(2, Duration::from_secs(10))).await.unwrap();
    let script = r#"
if [ "$MUSTER_TASK_INDEX" = 0 ]; then if [ "$MUSTER_EPOCH" = 1 ]; then sleep 1; exit 9; fi; exit 0; fi
if [ "$MUSTER_RESUME" = 1 ]; then echo "resumed with $(cat "$MUSTER_CHECKPOINT_DIR/state")"; exit 0; fi
trap 'sleep 3; echo slow-state > "$MUSTER_CHECKPOINT_DIR/state"; exit 0' TERM
while true; do sleep 0.1; done"#;
    let id = submit(&c, gang(2, script, 3)).await;
    until(&c, id, "tearing down", |a| status(a) == v1::AllocationStatus::TearingDown).await;
    let old = c.leader_id().unwrap();
    c.stop_replica(old).await;
    let done = until(&c, id, "done under the new leader", |a| status(a) == v1::AllocationStatus::Done).await;
    let new = c.leader_id().unwrap();
    assert_ne!(new, old);
    let teardowns = completions(&c, id);
    assert_eq!(teardowns.len(), 1, "{teardowns:?}");
    assert_eq!(teardowns[0].1, TeardownOutcome::Blocked);
    let t = &done.tasks[1];
    assert_eq!(log(&c, &t.last_node_id, id, 1, 2), "resumed with slow-state\n");
    c.restart_replica(old).await.unwrap();
    c.shutdown().await;
}
