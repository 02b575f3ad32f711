//! `muster dev`: a whole cluster in one process: three replicas and four
//! agents on loopback (each advertising 8 fake GPUs: the processes are real,
//! the devices are not), data in a temporary directory. `--demo` also runs a
//! gang of real shell processes and exits when it completes.

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
        demo(&addrs, args.agents.min(4)).await
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

/// Submits a gang of `n` real shell processes and follows it to the end.
async fn demo(addrs: &str, n: u32) -> anyhow::Result<()> {
    let mut cluster = Cluster::new(crate::client::parse_addresses(addrs)?);
    let script = "for step in 1 2 3; do echo \"task $MUSTER_TASK_INDEX/$MUSTER_GANG_SIZE step $step on GPUs $CUDA_VISIBLE_DEVICES\"; sleep 1; done";
    let spec = v1::AllocationSpec {
        owner: "demo".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus: 2, vram_mb: 16_000, mem_mb: 1_024, cpus: 1 }),
        preemption_class: 5,
        command: vec!["sh".into(), "-c".into(), script.into()],
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
                async move { AllocationServiceClient::new(ch).submit(v1::SubmitRequest { spec: Some(spec) }).await }
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
    out!("\nsubmitted allocation {id}: a gang of {n} tasks x 2 GPUs, class 5");
    let mut last = String::new();
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
        let line = format!("{:<9} [{}]", status_name(a.status), tasks.join(", "));
        if line != last {
            out!("{:>6.1}s  {line}", started.elapsed().as_secs_f64());
            last = line;
        }
        match status_name(a.status) {
            "done" => {
                out!("allocation {id} completed: every task ran on its own node");
                return Ok(());
            }
            "failed" | "cancelled" => bail!("allocation {id} ended {}", status_name(a.status)),
            _ => {}
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("allocation {id} did not finish within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
