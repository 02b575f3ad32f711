//! `muster dev`: a whole cluster in one process: three replicas and four
//! agents on loopback (each advertising 8 fake GPUs: the processes are real,
//! the devices are not), data in a temporary directory. `--demo` also runs a
//! gang of real shell processes that checkpoint, kills one of them to show a
//! gang teardown (the rest stop, save their step, and the whole gang is
//! placed again and resumes), and exits when it completes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use muster_sim::local::{LocalCluster, LocalConfig};

use crate::alloc::{status_name, task_status_name};
use crate::client::Cluster;

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Submit a demo gang, show its progress, and exit when it completes.
    #[arg(long)]
    demo: bool,
    /// Node agents to start.
    #[arg(long, default_value_t = 4)]
    agents: u32,
    /// Fake GPUs each agent advertises.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Keep data here instead of a temporary directory.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.agents == 0 {
        bail!("--agents must be at least 1");
    }
    let tmp;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            tmp = std::env::temp_dir().join(format!("muster-dev-{}", std::process::id()));
            tmp
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cfg = LocalConfig { agents: args.agents, gpus_per_agent: args.gpus, ..LocalConfig::default() };
    let cluster = LocalCluster::start(&dir, cfg).await.map_err(|e| anyhow::anyhow!(e))?;
    let addrs = cluster.scheduler_addrs().join(",");
    out!("muster dev: 3 scheduler replicas and {} agents ({} fake GPUs each) on loopback", args.agents, args.gpus);
    out!("  replicas  {addrs}");
    out!("  agents    {}", cluster.node_ids().join(" "));
    out!("  data      {}", dir.display());
    let result = if args.demo {
        demo(&addrs, &dir, args.agents.min(4)).await
    } else {
        out!();
        out!("try:");
        out!("  export MUSTER_SCHEDULER={addrs}");
        out!(
            "  muster submit --gang-size {} --gpus 1 --class 5 -- sh -c 'echo hello from task $MUSTER_TASK_INDEX; sleep 5'",
            args.agents.min(4)
        );
        out!("  muster alloc list");
        out!("  muster cluster status");
        out!("Ctrl-C stops everything.");
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        Ok(())
    };
    out!("muster dev: shutting down");
    cluster.shutdown().await;
    if args.data_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The demo's task: a training loop that resumes from its checkpoint and
/// saves its step to `MUSTER_CHECKPOINT_DIR` when told to stop.
const TRAINER: &str = r#"echo $$ > pid-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX-$MUSTER_ATTEMPT
step=0
if [ "$MUSTER_RESUME" = 1 ]; then step=$(cat "$MUSTER_CHECKPOINT_DIR/step"); echo "resumed from step $step"; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; echo "checkpointed at step $step"; exit 143' TERM
while [ $step -lt 24 ]; do
  step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX
  echo "task $MUSTER_TASK_INDEX/$MUSTER_GANG_SIZE step $step on GPUs $CUDA_VISIBLE_DEVICES"; sleep 0.25
done
echo "finished at step $step""#;

fn read_number(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Submits a gang of `n` checkpointing shell processes, kills task 0 once
/// every task has made progress, and follows the teardown and the resumed
/// gang to the end.
async fn demo(addrs: &str, dir: &std::path::Path, n: u32) -> anyhow::Result<()> {
    let mut cluster = Cluster::new(crate::client::parse_addresses(addrs)?);
    let spec = v1::AllocationSpec {
        owner: "demo".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus: 2, vram_mb: 16_000, mem_mb: 1_024, cpus: 1 }),
        preemption_class: 5,
        command: vec!["sh".into(), "-c".into(), TRAINER.into()],
        env: BTreeMap::from([("DEMO".to_string(), "1".to_string())]).into_iter().collect(),
        idempotency_key: "muster-dev-demo".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let id = loop {
        let spec = spec.clone();
        match cluster
            .call(|ch| {
                let spec = spec.clone();
                async move {
                    AllocationServiceClient::new(ch)
                        .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false })
                        .await
                }
            })
            .await
        {
            Ok(r) => break r.into_inner().id,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                tracing::debug!(error = %e, "cluster not ready yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    out!("\nsubmitted allocation {id}: a gang of {n} checkpointing tasks x 2 GPUs, class 5");
    // Print the allocation's events as they commit (the teardown's too).
    let watch = cluster
        .call(
            |ch| async move { AllocationServiceClient::new(ch).watch(v1::WatchRequest { id, from_revision: 0 }).await },
        )
        .await?;
    let events = tokio::spawn(async move {
        let mut stream = watch.into_inner();
        while let Ok(Some(e)) = stream.message().await {
            out!("{:>6.1}s    {:<18}  {}", started.elapsed().as_secs_f64(), e.kind, e.detail);
        }
    });
    let mut last = String::new();
    let mut killed = false;
    loop {
        let a = cluster
            .call(|ch| async move { AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await })
            .await?
            .into_inner();
        let tasks: Vec<String> = a
            .tasks
            .iter()
            .map(|t| {
                let s = task_status_name(t.status);
                if t.node_id.is_empty() { s } else { format!("{s}@{}", t.node_id) }
            })
            .collect();
        let line = format!("{:<12} [{}]", status_name(a.status), tasks.join(", "));
        if line != last {
            out!("{:>6.1}s  {line}", started.elapsed().as_secs_f64());
            last = line;
        }
        let all_running = status_name(a.status) == "running";
        if !killed && all_running {
            let progress: Option<Vec<u32>> = a
                .tasks
                .iter()
                .map(|t| read_number(&dir.join(&t.node_id).join(format!("progress-{id}-{}", t.index))))
                .collect();
            if progress.is_some_and(|p| p.iter().all(|&s| s >= 4)) {
                let victim = &a.tasks[0];
                let pid_file = dir.join(&victim.node_id).join(format!("pid-{id}-0-{}", victim.runs));
                let pid = read_number(&pid_file).with_context(|| format!("no pid in {}", pid_file.display()))?;
                out!(
                    "{:>6.1}s  killing task 0 (pid {pid} on {}) with SIGKILL",
                    started.elapsed().as_secs_f64(),
                    victim.node_id
                );
                // SAFETY: kill has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
                killed = true;
            }
        }
        match status_name(a.status) {
            "done" => {
                // Let the watcher print the last events before the summary.
                tokio::time::sleep(Duration::from_millis(300)).await;
                events.abort();
                out!("allocation {id} completed: every task ran on its own node");
                if killed {
                    out!("after the teardown (preemption epoch {}):", a.preemption_epoch);
                    for t in &a.tasks {
                        let log = dir
                            .join(&t.last_node_id)
                            .join(format!("logs/alloc-{id}/task-{}/attempt-{}.out", t.index, t.runs));
                        let text = std::fs::read_to_string(&log).unwrap_or_default();
                        let first = text.lines().next().unwrap_or("(no output)");
                        out!("  task {} attempt {} on {}: {first}", t.index, t.runs, t.last_node_id);
                    }
                }
                return Ok(());
            }
            "failed" | "cancelled" => {
                events.abort();
                bail!("allocation {id} ended {}", status_name(a.status))
            }
            _ => {}
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("allocation {id} did not finish within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
