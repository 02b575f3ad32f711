//! `muster dev`: a whole cluster in one process: three replicas and four
//! agents on loopback (each advertising 8 fake GPUs: the processes are real,
//! the devices are not), data in a temporary directory. `--demo` also runs a
//! gang of real shell processes that checkpoint, kills one of them to show a
//! gang teardown (the rest stop, save their step, and the whole gang is
//! placed again and resumes); then fills the cluster with class-2 work that
//! answers checkpoint hints and submits a class-8 gang, to show a priority
//! preemption (the cheapest victims checkpoint and suspend, the gang runs,
//! the victims resume from their checkpoints), and exits when all is done.
//!
//! `muster dev` uses short preemption timings (1 s minimum runtime, 20 s
//! checkpoint timeout, 5 s grace) so the demo runs in seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;

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
    /// Run without TLS or authorisation (debugging only). By default the
    /// cluster gets a throwaway CA and certificates in <data>/tls.
    #[arg(long)]
    insecure: bool,
    /// Replica N serves HTTP (dashboard /ui, /metrics, /healthz, /readyz) on
    /// 127.0.0.1:PORT+N-1; 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    http_port: u16,
    /// Requests per second one client address may make to a listener's
    /// dashboard and metrics (bursts of twice that); more get 429.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    http_rate: u32,
    /// The `muster.vcluster` label of each node in turn (node-1 first),
    /// comma-separated: `ml,ml,batch,batch` makes node-1 and node-2 home to
    /// vCluster ml, and creates each vCluster named (its defaults; change
    /// them with `muster vcluster update`). Nodes past the list carry none
    /// (home to `default`).
    #[arg(long, value_delimiter = ',')]
    node_vclusters: Vec<String>,
    /// How long a vCluster's queued gang waits before borrowed work on its
    /// home nodes is preempted for it (the return grace), ms.
    #[arg(long, default_value_t = muster_scheduler::policy::DEFAULT_RETURN_GRACE_MS)]
    reclaim_grace_ms: u64,
    #[command(flatten)]
    images: crate::images::ImageArgs,
    /// A label of one node, NODE:KEY=VALUE (repeatable): `--node-label
    /// node-1:gpu.model=H100 --node-label node-1:rack=r1` gives node-1 a GPU
    /// model and a rack for `muster submit --constraint` and `--pack-by`.
    #[arg(long = "node-label", value_name = "NODE:KEY=VALUE")]
    node_labels: Vec<String>,
    /// The TCP ports the agents offer for gangs' rendezvous, FIRST-LAST:
    /// split into equal blocks, one per agent, since all share this machine.
    #[arg(long, default_value = "29500-29999", value_name = "FIRST-LAST")]
    rendezvous_ports: String,
}

/// `node-2:rack=r1` flags as each agent's extra labels, node-1 first.
fn parse_node_labels(flags: &[String], agents: u32) -> anyhow::Result<Vec<BTreeMap<String, String>>> {
    let mut out = vec![BTreeMap::new(); agents as usize];
    for flag in flags {
        let parsed = flag.split_once(':').and_then(|(node, kv)| {
            let i: usize = node.strip_prefix("node-")?.parse().ok()?;
            let (k, v) = kv.split_once('=')?;
            Some((i, k, v))
        });
        let Some((i, k, v)) = parsed else {
            bail!("--node-label {flag:?} is not NODE:KEY=VALUE (e.g. node-1:rack=r1)");
        };
        if i == 0 || i > agents as usize {
            bail!("--node-label {flag:?}: there is no such node (node-1 to node-{agents})");
        }
        if k.is_empty() || v.is_empty() {
            bail!("--node-label {flag:?}: the key and the value must not be empty");
        }
        out[i - 1].insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    crate::server::publish_allocator_figures();
    if args.agents == 0 {
        bail!("--agents must be at least 1");
    }
    let node_labels = parse_node_labels(&args.node_labels, args.agents)?;
    let rendezvous_ports = muster_scheduler::sm::PortRange::parse(&args.rendezvous_ports)
        .map_err(|e| anyhow::anyhow!("--rendezvous-ports {e}"))?;
    if u32::from(rendezvous_ports.count) < args.agents {
        bail!("--rendezvous-ports {rendezvous_ports} holds fewer ports than the {} agents", args.agents);
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
    let preemption = muster_scheduler::policy::PreemptionConfig {
        min_runtime_ms: 1_000,
        checkpoint_timeout_ms: 20_000,
        max_deferral_ms: 20_000,
        grace_ms: 5_000,
        ..Default::default()
    };
    if args.insecure {
        crate::client::warn_insecure();
    }
    let cfg = LocalConfig {
        agents: args.agents,
        gpus_per_agent: args.gpus,
        preemption,
        insecure: args.insecure,
        http_port: Some(args.http_port),
        http_rate: args.http_rate,
        node_vclusters: args.node_vclusters.clone(),
        rendezvous_ports,
        node_labels,
        reclaim: muster_scheduler::policy::ReclaimConfig {
            return_grace_ms: args.reclaim_grace_ms,
            ..Default::default()
        },
        exe: std::env::current_exe().ok(),
        images: if args.images.no_images {
            None
        } else {
            Some(muster_local::LocalImages {
                registry: args.images.registry()?,
                allow_mounts: args.images.allow_mounts()?,
                cache_max_bytes: args.images.cache_max(None)?,
                oci: args.images.oci_runtime()?,
            })
        },
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(&dir, cfg).await.map_err(|e| anyhow::anyhow!(e))?;
    let addrs = cluster.scheduler_addrs().join(",");
    let tls = cluster.admin_tls();
    // The vClusters the nodes were labelled for exist, each home to its
    // nodes, before anything is printed: whoever reads the addresses finds
    // them.
    let mut named: Vec<&str> =
        args.node_vclusters.iter().map(String::as_str).filter(|n| !n.is_empty() && *n != "default").collect();
    named.sort_unstable();
    named.dedup();
    let mut client = Cluster::new(crate::client::parse_addresses(&addrs)?, tls);
    for name in &named {
        crate::vcluster::ensure(&mut client, name).await?;
    }
    out!("muster dev: 3 scheduler replicas and {} agents ({} fake GPUs each) on loopback", args.agents, args.gpus);
    out!("  replicas  {addrs}");
    out!("  agents    {}", cluster.node_ids().join(" "));
    out!("  data      {}", dir.display());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        out!("  tasks     run as root, as you are (a `muster agent` runs them so only with --allow-root-tasks)");
    }
    for (id, http) in cluster.http_addrs() {
        out!("  http      replica {id}: http://{http}/ui  (/metrics /healthz /readyz)");
    }
    match cluster.tls_dir() {
        Some(t) => out!("  tls       {} (mutual TLS; you are admin-{})", t.display(), muster_local::DEV_ADMIN),
        None => out!("  tls       none (--insecure)"),
    }
    for name in named {
        let homes: Vec<String> = args
            .node_vclusters
            .iter()
            .enumerate()
            .filter(|(_, vc)| *vc == name)
            .map(|(i, _)| format!("node-{}", i + 1))
            .collect();
        out!("  vcluster  {name}: home to {}", homes.join(" "));
    }
    let result = if args.demo {
        let clock = Instant::now();
        match demo(&mut client, &dir, args.agents.min(4), clock).await {
            Ok(()) if args.agents >= 4 => preemption_demo(&mut client, &dir, args.agents, args.gpus, clock).await,
            Ok(()) => {
                out!("(the preemption demo needs at least 4 agents)");
                Ok(())
            }
            Err(e) => Err(e),
        }
    } else {
        out!();
        out!("try:");
        out!("  export MUSTER_SCHEDULER={addrs}");
        match cluster.tls_dir() {
            Some(t) => out!("  export MUSTER_TLS_DIR={}", t.display()),
            None => out!("  (add --insecure to every command: this cluster runs without TLS)"),
        }
        out!(
            "  muster submit --gang-size {} --gpus 1 --class 5 -- sh -c 'echo hello from task $MUSTER_TASK_INDEX; sleep 5'",
            args.agents.min(4)
        );
        out!("  muster alloc list");
        out!("  muster node drain node-1 --timeout 30s     (then: muster node get node-1, muster node restart node-1)");
        out!("  muster cluster status");
        out!("Ctrl-C stops everything.");
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        Ok(())
    };
    out!("muster dev: shutting down");
    crate::logging::quiet();
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
/// `started` is the demo's clock: both parts print times from it.
async fn demo(cluster: &mut Cluster, dir: &std::path::Path, n: u32, started: Instant) -> anyhow::Result<()> {
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
    let id = loop {
        let spec = spec.clone();
        match cluster
            .call(|ch| {
                let spec = spec.clone();
                async move {
                    AllocationServiceClient::new(ch)
                        .submit(v1::SubmitRequest { spec: Some(spec), dry_run: false, ..Default::default() })
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
                    out!("after the teardown (teardown {}):", a.preemption_epoch);
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

/// The preemption demo's low-class work: counts steps, and on a checkpoint
/// hint (SIGUSR1) saves its step and marks the checkpoint done; resumes from
/// the saved step. It ends after 40 steps once the demo has created
/// `demo-release` in the node's work dir (when the class-8 gang runs), so
/// that on a slow machine it is still running when the preemption comes;
/// after two minutes regardless.
const HINTED: &str = r#"step=0
if [ "$MUSTER_RESUME" = 1 ]; then step=$(cat "$MUSTER_CHECKPOINT_DIR/step"); echo "resumed from step $step"; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; echo "checkpointed at step $step"; touch "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
while [ $step -lt 40 ] || { [ ! -e demo-release ] && [ $step -lt 1200 ]; }; do
  step=$((step+1)); echo $step > progress-$MUSTER_ALLOC_ID-$MUSTER_TASK_INDEX; sleep 0.1
done
echo "finished at step $step""#;

async fn submit_spec(
    cluster: &mut Cluster,
    spec: v1::AllocationSpec,
    dry_run: bool,
) -> anyhow::Result<v1::SubmitResponse> {
    Ok(cluster
        .call(|ch| {
            let spec = spec.clone();
            async move {
                AllocationServiceClient::new(ch)
                    .submit(v1::SubmitRequest { spec: Some(spec), dry_run, ..Default::default() })
                    .await
            }
        })
        .await?
        .into_inner())
}

async fn get_alloc(cluster: &mut Cluster, id: u64) -> anyhow::Result<v1::Allocation> {
    Ok(cluster
        .call(|ch| async move { AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await })
        .await?
        .into_inner())
}

/// Fills the cluster with class-2 work (a gang of 2, cheap singles, one
/// single that checkpoints slowly), submits a class-8 gang of `agents - 1`
/// whole nodes, and follows the preemption to the end.
async fn preemption_demo(
    cluster: &mut Cluster,
    dir: &std::path::Path,
    agents: u32,
    gpus: u32,
    started: Instant,
) -> anyhow::Result<()> {
    let job = |name: &str, n: u32, class: u32, estimate_s: u32, command: &str| v1::AllocationSpec {
        owner: "demo".into(),
        gang_size: n,
        resources: Some(v1::Resources { gpus, vram_mb: 16_000, mem_mb: 1_024, cpus: 1 }),
        preemption_class: class,
        checkpoint_estimate_s: estimate_s,
        command: vec!["sh".into(), "-c".into(), command.into()],
        idempotency_key: format!("muster-dev-demo-{name}"),
        ..Default::default()
    };
    let release = |on: bool| {
        for i in 1..=agents {
            let path = dir.join(format!("node-{i}")).join("demo-release");
            let _ = if on { std::fs::write(&path, "") } else { std::fs::remove_file(&path) };
        }
    };
    release(false);
    out!("\npriority preemption: filling the cluster with class-2 work that answers checkpoint hints");
    let mut low = Vec::new();
    let mut specs = vec![("pair", job("pair", 2, 2, 30, HINTED))];
    for i in 0..agents - 3 {
        specs.push(("cheap", job(&format!("cheap-{i}"), 1, 2, 30, HINTED)));
    }
    specs.push(("slow", job("slow", 1, 2, 900, HINTED)));
    for (kind, spec) in specs {
        let id = submit_spec(cluster, spec.clone(), false).await?.id;
        out!(
            "  allocation {id}: {} x {gpus} GPUs, class 2, checkpoint estimate {} ({kind})",
            spec.gang_size,
            crate::output::duration(u64::from(spec.checkpoint_estimate_s) * 1000)
        );
        low.push(id);
    }
    // Wait until all of it runs and has made progress.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut submitted_at = BTreeMap::new();
    for &id in &low {
        loop {
            let a = get_alloc(cluster, id).await?;
            let progressed = status_name(a.status) == "running"
                && a.tasks.iter().all(|t| {
                    read_number(&dir.join(&t.node_id).join(format!("progress-{id}-{}", t.index))).unwrap_or(0) >= 5
                });
            if progressed {
                submitted_at.insert(id, a.submit_time_ms);
                break;
            }
            if Instant::now() > deadline {
                bail!("allocation {id} did not start within a minute");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Past the minimum runtime, so that the work may be preempted.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let n = agents - 1;
    let gang = job("preemptor", n, 8, 60, "echo preemptor task $MUSTER_TASK_INDEX running; sleep 2");
    let plan = submit_spec(cluster, gang.clone(), true).await?.plan.context("a dry run returns a plan")?;
    out!("{:>6.1}s  dry run of a class-8 gang of {n} x {gpus} GPUs: {}", started.elapsed().as_secs_f64(), plan.summary);
    if let Some(p) = &plan.preemption {
        for v in &p.victims {
            out!(
                "          would preempt allocation {} (class {}): cost {} GPU-s = checkpoint {} + recompute {} + value {}",
                v.id,
                v.preemption_class,
                v.total_cost,
                v.checkpoint_cost,
                v.recompute_cost,
                v.value_cost
            );
        }
        if p.victims.is_empty() {
            out!("          preemption: {}", p.reason);
        } else {
            out!("          total {} GPU-s, below the gang's value of {} GPU-s", p.total_cost, p.value);
        }
    }
    let hi = submit_spec(cluster, gang, false).await?.id;
    let since_ms = get_alloc(cluster, hi).await?.submit_time_ms;
    out!("{:>6.1}s  submitted allocation {hi}: the class-8 gang", started.elapsed().as_secs_f64());
    let mut watchers = Vec::new();
    for id in std::iter::once(hi).chain(low.iter().copied()) {
        let watch = cluster
            .call(|ch| async move {
                AllocationServiceClient::new(ch).watch(v1::WatchRequest { id, from_revision: 0 }).await
            })
            .await?;
        watchers.push(tokio::spawn(async move {
            let mut stream = watch.into_inner();
            while let Ok(Some(e)) = stream.message().await {
                if e.kind != "submitted" && e.time_ms >= since_ms {
                    out!("{:>6.1}s  [{id}] {:<20}  {}", started.elapsed().as_secs_f64(), e.kind, e.detail);
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let all: Vec<u64> = std::iter::once(hi).chain(low.iter().copied()).collect();
    let mut finals = BTreeMap::new();
    let mut released = false;
    while finals.len() < all.len() {
        if !released && matches!(status_name(get_alloc(cluster, hi).await?.status), "running" | "done") {
            release(true);
            released = true;
        }
        for &id in &all {
            if finals.contains_key(&id) {
                continue;
            }
            let a = get_alloc(cluster, id).await?;
            match status_name(a.status) {
                "done" => {
                    finals.insert(id, a);
                }
                "failed" | "cancelled" => bail!("allocation {id} ended {}", status_name(a.status)),
                _ => {}
            }
        }
        if Instant::now() > deadline {
            bail!("the preemption demo did not finish within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for w in watchers {
        w.abort();
    }
    out!("all done. the low-class work afterwards:");
    for &id in &low {
        let a = &finals[&id];
        let kept = if submitted_at.get(&id) == Some(&a.submit_time_ms) { "kept" } else { "CHANGED" };
        out!(
            "  allocation {id}: {}; original submit time {kept}",
            crate::output::preempted(u64::from(a.preempted_count))
        );
        for t in &a.tasks {
            let log =
                dir.join(&t.last_node_id).join(format!("logs/alloc-{id}/task-{}/attempt-{}.out", t.index, t.runs));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            out!(
                "    task {} attempt {} on {}: {}",
                t.index,
                t.runs,
                t.last_node_id,
                text.lines().next().unwrap_or("(no output)")
            );
        }
    }
    Ok(())
}
