//! Priority preemption end to end: real replicas, real agents, real shell
//! processes that answer checkpoint hints (SIGUSR1 + the request file), and
//! a leader killed mid-preemption.

use std::time::Duration;

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_scheduler::policy::PreemptionConfig;
use muster_scheduler::sm::{AllocId, Event, TeardownOutcome};

use crate::cluster::WAIT;
use crate::t26_e2e::{get, submit, until};

fn config(agents: u32, checkpoint_timeout_ms: u64) -> LocalConfig {
    LocalConfig {
        preemption: PreemptionConfig {
            min_runtime_ms: 0,
            checkpoint_timeout_ms,
            max_deferral_ms: 4_000,
            grace_ms: 2_000,
            ..PreemptionConfig::default()
        },
        ..crate::tls::quick_cluster(agents, Duration::from_secs(2))
    }
}

fn status(a: &v1::Allocation) -> v1::AllocationStatus {
    v1::AllocationStatus::try_from(a.status).unwrap()
}

fn node_index(node: &str) -> u32 {
    node.trim_start_matches("node-").parse::<u32>().unwrap() - 1
}

fn log(c: &LocalCluster, node: &str, id: u64, task: u32, attempt: u32) -> String {
    let path = c.agent_dir(node_index(node)).join(format!("logs/alloc-{id}/task-{task}/attempt-{attempt}.out"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A job of `n` tasks × 8 GPUs (a whole node each) running `script`.
fn job(n: u32, class: u32, script: &str, estimate_s: u32) -> v1::AllocationSpec {
    v1::AllocationSpec {
        owner: "e2e".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus: 8, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 }),
        preemption_class: class,
        checkpoint_estimate_s: estimate_s,
        command: vec!["sh".into(), "-c".into(), script.into()],
        max_retries: 3,
        ..Default::default()
    }
}

/// A training loop that answers a checkpoint hint: on SIGUSR1 it saves its
/// step and marks the checkpoint done; SIGTERM then ends it. Resumes from
/// the saved step.
const TRAINER: &str = r#"
step=0
if [ "$MUSTER_RESUME" = 1 ]; then step=$(cat "$MUSTER_CHECKPOINT_DIR/step"); echo "resumed from $step"; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; echo "checkpointed at $step"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
while [ $step -lt 50 ]; do
  step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 0.1
done
echo "finished at $step"
"#;

/// The allocation's preemption completions, from the leader's state.
fn preemptions(c: &LocalCluster, id: AllocId) -> Vec<TeardownOutcome> {
    let Some(l) = c.leader_id() else { return Vec::new() };
    c.replica(l).map_or_else(Vec::new, |r| {
        r.reader().read(|st| {
            st.alloc(id)
                .map(|a| {
                    a.history
                        .iter()
                        .filter_map(|e| match e.event {
                            Event::TeardownCompleted { outcome, cause, .. } if cause_is_preemption(&cause) => {
                                Some(outcome)
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    })
}

fn cause_is_preemption(cause: &muster_scheduler::sm::TeardownCause) -> bool {
    matches!(cause, muster_scheduler::sm::TeardownCause::Preempted { .. })
}

/// Waits until every task of `id` has made `steps` steps.
async fn progressed(c: &LocalCluster, a: &v1::Allocation, steps: u32) {
    for t in &a.tasks {
        let path = c.agent_dir(node_index(&t.node_id)).join(format!("progress-{}-{}", a.id, t.index));
        muster_testkit::eventually(&format!("{} to make progress", path.display()), WAIT, || {
            let n = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0);
            if n >= steps { Ok(()) } else { Err(format!("at step {n} of {steps}")) }
        })
        .await;
    }
}

/// The issue's "done means": a class-8 gang of 4 arrives on a cluster full
/// of class-2 checkpointing work; the cheapest victims checkpoint through
/// real hints and suspend, the gang runs, and the victims resume from their
/// checkpoints with their original submit time and preempted_count = 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t88_a_high_class_gang_preempts_the_cheapest_victims_which_resume_from_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(dir.path(), config(6, 10_000)).await.unwrap();
    // Six nodes, full: a gang of 2 and four singles, all class 2. Two of the
    // singles checkpoint slowly (expensive to preempt).
    let pair = submit(&c, job(2, 2, TRAINER, 30)).await;
    let cheap1 = submit(&c, job(1, 2, TRAINER, 30)).await;
    let cheap2 = submit(&c, job(1, 2, TRAINER, 30)).await;
    let slow1 = submit(&c, job(1, 2, TRAINER, 600)).await;
    let slow2 = submit(&c, job(1, 2, TRAINER, 600)).await;
    let mut running = Vec::new();
    for id in [pair, cheap1, cheap2, slow1, slow2] {
        running.push(until(&c, id, "running", |a| status(a) == v1::AllocationStatus::Running).await);
    }
    for a in &running {
        progressed(&c, a, 5).await;
    }
    let submitted_at: Vec<u64> = running.iter().map(|a| a.submit_time_ms).collect();

    // The dry run names the victims before anything happens.
    let preemptor_spec = job(4, 8, "sleep 1; echo preemptor done", 60);
    let plan = crate::t26_e2e::leader_client(&c)
        .await
        .submit(v1::SubmitRequest { spec: Some(preemptor_spec.clone()), dry_run: true, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap()
        .preemption
        .unwrap();
    let mut planned: Vec<u64> = plan.victims.iter().map(|v| v.id).collect();
    planned.sort_unstable();
    assert_eq!(planned, vec![pair, cheap1, cheap2], "{plan:?}");
    assert!(plan.total_cost < plan.value, "{plan:?}");

    let hi = submit(&c, preemptor_spec).await;
    let done = until(&c, hi, "done", |a| status(a) == v1::AllocationStatus::Done).await;
    assert_eq!(done.preempted_count, 0);
    for id in [slow1, slow2] {
        let a = get(&c, id).await;
        assert_eq!(a.preempted_count, 0, "the expensive victims were spared: {a:?}");
        assert_eq!(a.tasks[0].runs, 1);
    }
    for (i, id) in [pair, cheap1, cheap2].into_iter().enumerate() {
        let a = until(&c, id, "done after resuming", |a| status(a) == v1::AllocationStatus::Done).await;
        assert_eq!(preemptions(&c, id), vec![TeardownOutcome::Suspended], "allocation {id}");
        assert_eq!(a.preempted_count, 1, "{a:?}");
        assert_eq!(a.submit_time_ms, submitted_at[i], "the original submit time is kept");
        for t in &a.tasks {
            assert_eq!((t.runs, t.attempts), (2, 1), "preempted runs are refunded: {t:?}");
            let first_node = &running[i].tasks[t.index as usize].node_id;
            let first = log(&c, first_node, id, t.index, 1);
            let saved: u32 = first
                .lines()
                .find_map(|l| l.strip_prefix("checkpointed at "))
                .unwrap_or_else(|| panic!("allocation {id} task {} never checkpointed: {first}", t.index))
                .parse()
                .unwrap();
            assert!(saved >= 5, "{first}");
            let second = log(&c, &t.last_node_id, id, t.index, 2);
            assert!(second.starts_with(&format!("resumed from {saved}\n")), "{second}");
            assert!(second.ends_with("finished at 50\n"), "{second}");
        }
    }
    c.shutdown().await;
}

/// The timeout paths with real processes: a task that ignores the hint is
/// killed at the deadline and charged (requeued, not suspended); one that
/// acknowledges and is slow gets its one extension; those that ask for a
/// deferral get it, on top of the deadline in force. All but the first
/// suspend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t200_unresponsive_slow_and_deferring_victims() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(1, 3_000);
    cfg.preemption.max_deferral_ms = 6_000;
    let c = LocalCluster::start(dir.path(), cfg).await.unwrap();
    let loop_forever = |answer: &str| {
        format!(
            "trap '{answer}' USR1\ntrap 'exit 143' TERM\nwhile true; do echo 1 > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 0.1; done"
        )
    };
    let cases = [
        // Ignores the hint: killed at the 3 s deadline, no checkpoint.
        (":", false),
        // Acknowledges, then takes 3.5 s: past 3 s, within the one +50 % extension (4.5 s).
        (
            "touch \"$MUSTER_CHECKPOINT_DIR/.muster/ack\"; sleep 3.5; echo s > \"$MUSTER_CHECKPOINT_DIR/state\"; touch \"$MUSTER_CHECKPOINT_DIR/.muster/done\"",
            true,
        ),
        // Asks for 6 s (the maximum), then finishes at 4 s.
        (
            "echo 6 > \"$MUSTER_CHECKPOINT_DIR/.muster/defer\"; sleep 4; echo s > \"$MUSTER_CHECKPOINT_DIR/state\"; touch \"$MUSTER_CHECKPOINT_DIR/.muster/done\"",
            true,
        ),
        // Asks for 4 s and finishes at 5 s: a deferral adds to the deadline
        // in force (3 s + 4 s = 7 s); it used to replace it (4 s).
        (
            "echo 4 > \"$MUSTER_CHECKPOINT_DIR/.muster/defer\"; sleep 5; echo s > \"$MUSTER_CHECKPOINT_DIR/state\"; touch \"$MUSTER_CHECKPOINT_DIR/.muster/done\"",
            true,
        ),
    ];
    for (answer, checkpoints) in cases {
        let victim = submit(&c, job(1, 1, &loop_forever(answer), 30)).await;
        let a = until(&c, victim, "running", |a| status(a) == v1::AllocationStatus::Running).await;
        progressed(&c, &a, 1).await;
        let hi = submit(&c, job(1, 5, "echo hi", 60)).await;
        until(&c, hi, "done", |a| status(a) == v1::AllocationStatus::Done).await;
        let a = get(&c, victim).await;
        // Only a suspension counts as a preemption (the seed's rule).
        assert_eq!(a.preempted_count, u32::from(checkpoints), "{answer}: {a:?}");
        let outcome = preemptions(&c, victim);
        if checkpoints {
            assert_eq!(outcome, vec![TeardownOutcome::Suspended], "{answer}");
            assert_eq!(preempted_events(&c, victim), vec![false], "{answer}");
            assert!(a.tasks[0].checkpoint_bytes > 0, "{answer}: the checkpoint was uploaded: {a:?}");
        } else {
            assert_eq!(outcome, vec![TeardownOutcome::Blocked], "{answer}: requeued, not suspended");
            assert_eq!(preempted_events(&c, victim), vec![true], "{answer}: reported as a failed checkpoint");
            assert_eq!(a.tasks[0].checkpoint_bytes, 0, "{answer}: nothing uploaded");
            let err = std::fs::read_to_string(c.agent_dir(0).join(format!("logs/alloc-{victim}/task-0/attempt-1.err")))
                .unwrap();
            assert!(err.contains("no checkpoint before the deadline"), "{err}");
        }
        cancel(&c, victim).await;
    }
    c.shutdown().await;
}

/// `checkpoint_failed` of each TaskPreempted event of an allocation.
fn preempted_events(c: &LocalCluster, id: AllocId) -> Vec<bool> {
    let l = c.leader_id().unwrap();
    c.replica(l).unwrap().reader().read(|st| {
        st.alloc(id)
            .unwrap()
            .history
            .iter()
            .filter_map(|e| match e.event {
                Event::TaskPreempted { checkpoint_failed, .. } => Some(checkpoint_failed),
                _ => None,
            })
            .collect()
    })
}

async fn cancel(c: &LocalCluster, id: u64) {
    muster_testkit::eventually_async(&format!("the cancel of allocation {id} to be accepted"), WAIT, || async {
        match crate::t26_e2e::leader_client(c).await.cancel(v1::CancelRequest { id, ..Default::default() }).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == tonic::Code::FailedPrecondition => Ok(()),
            Err(e) => Err(format!("cancel failed: {e}")),
        }
    })
    .await
}

/// The leader dies while a victim is checkpointing; the new leader finds the
/// preemption in the replicated state, the agent's report reaches it, the
/// victim suspends and the preemptor runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t201_a_leader_kill_mid_preemption_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(dir.path(), config(1, 10_000)).await.unwrap();
    let slow = "trap 'sleep 3; echo $step > \"$MUSTER_CHECKPOINT_DIR/step\"; touch \"$MUSTER_CHECKPOINT_DIR/.muster/done\"' USR1\n\
                trap 'exit 143' TERM\nstep=0\n\
                if [ \"$MUSTER_RESUME\" = 1 ]; then echo \"resumed from $(cat $MUSTER_CHECKPOINT_DIR/step)\"; exit 0; fi\n\
                while true; do step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 0.1; done";
    let victim = submit(&c, job(1, 2, slow, 30)).await;
    let a = until(&c, victim, "running", |a| status(a) == v1::AllocationStatus::Running).await;
    progressed(&c, &a, 3).await;
    let hi = submit(&c, job(1, 8, "echo hi", 60)).await;
    // The hint reached the task: its request file exists.
    let request = c.agent_dir(0).join(format!("checkpoints/alloc-{victim}-task-0/.muster/request"));
    muster_testkit::eventually(&format!("a checkpoint request at {}", request.display()), WAIT, || {
        (request.exists()).then_some(())
    })
    .await;
    let old = c.leader_id().unwrap();
    c.stop_replica(old).await;
    muster_testkit::eventually("a new leader", WAIT, || c.leader_id().is_some_and(|l| l != old).then_some(())).await;
    until(&c, hi, "done under the new leader", |a| status(a) == v1::AllocationStatus::Done).await;
    let a = until(&c, victim, "resumed and done", |a| status(a) == v1::AllocationStatus::Done).await;
    assert_eq!(a.preempted_count, 1);
    let second = log(&c, "node-1", victim, 0, 2);
    assert!(second.starts_with("resumed from "), "{second}");
    c.restart_replica(old).await.unwrap();
    c.shutdown().await;
}
