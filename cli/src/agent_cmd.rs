//! `muster agent`: run the node agent for this machine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use muster_agent::agent::{Agent, AgentConfig, proc_sampler};
use muster_agent::watchdog::WatchdogConfig;
use muster_proto::v1;
use tokio::sync::watch;

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Scheduler replicas, host:port[,host:port…].
    #[arg(long, env = "MUSTER_SCHEDULER")]
    scheduler: String,
    /// This node's id (stable across restarts).
    #[arg(long)]
    node_id: String,
    /// GPUs to offer (default: what NVML or the NVIDIA driver reports, 0 without one).
    #[arg(long)]
    gpus: Option<u32>,
    /// Memory per GPU, MiB (default: the smallest GPU's, from NVML).
    #[arg(long)]
    vram_mb: Option<u64>,
    /// Host memory to offer, MiB (default: all of it).
    #[arg(long)]
    mem_mb: Option<u64>,
    /// CPU cores to offer (default: all this process may use).
    #[arg(long)]
    cpus: Option<u32>,
    /// Labels, KEY=VALUE (repeatable), for placement constraints and
    /// packing (e.g. rack=r12). The agent adds hostname, cpu.model and, with
    /// NVML, gpu.model, gpu.product, gpu.memory_mb, gpu.count and
    /// driver.version itself; a --label of the same key wins.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The host (or host:port) other tasks of a gang reach this node at
    /// (MUSTER_GANG_PEERS, MASTER_ADDR). Default: this machine's IP on its
    /// route to the scheduler.
    #[arg(long)]
    address: Option<String>,
    /// TCP ports this node offers for gangs' rendezvous, FIRST-LAST (or
    /// none): a gang whose task 0 runs here gets MASTER_PORT from them,
    /// never one another live gang holds. Keep them out of the ephemeral
    /// range (/proc/sys/net/ipv4/ip_local_port_range).
    #[arg(long, default_value = "29500-29999", value_name = "FIRST-LAST")]
    rendezvous_ports: String,
    /// Where task logs and process records live (and the checkpoints
    /// written to this node's disk, under checkpoint-store/).
    #[arg(long)]
    work_dir: PathBuf,
    /// Serve the checkpoints on this node's disk to other nodes' agents on
    /// this address (port 0: any free port; "none": serve none, so a task
    /// placed elsewhere cannot resume from a checkpoint written here).
    #[arg(long, default_value = "0.0.0.0:0", value_name = "ADDR")]
    checkpoint_listen: String,
    /// host:port other agents reach that service at (default: the host of
    /// --address, else the --checkpoint-listen IP when it names one, else
    /// this node's IP on its route to the scheduler; with the bound port).
    #[arg(long, value_name = "HOST:PORT")]
    checkpoint_address: Option<String>,
    /// Reads taken to confirm a suspected stall before stopping a task.
    #[arg(long, default_value_t = 3)]
    stall_confirm_samples: u32,
    /// Spacing of those reads, ms.
    #[arg(long, default_value_t = 1_000)]
    stall_confirm_poll_ms: u64,
    /// GPU utilisation (percent) at or under which a GPU counts as idle.
    #[arg(long, default_value_t = 5.0)]
    gpu_idle_pct: f64,
    /// Memory movement (MiB) above which a task counts as working.
    #[arg(long, default_value_t = 5120)]
    ram_delta_mb: u64,
    /// GPU-health watchdog: idle and static this long stops a GPU task, s.
    #[arg(long, default_value_t = 300)]
    gpu_health_window_s: u64,
    /// GPU-health watchdog: not policed this long after a task starts, s.
    #[arg(long, default_value_t = 300)]
    gpu_health_grace_s: u64,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Exit 0 once the scheduler stops this node (drained, or stopped by an
    /// operator), so a wrapper can power the machine off.
    #[arg(long)]
    exit_when_stopped: bool,
    /// Keep tasks running across agent restarts: tasks start under this
    /// binary's task shim (which records their exit status), the agent
    /// leaves them running when it exits, and the next agent with the same
    /// --work-dir reattaches to them (run under systemd with
    /// KillMode=process; see deploy/systemd/muster-agent.service). Without
    /// it, the agent stops its tasks when it exits.
    #[arg(long)]
    keep_tasks: bool,
    /// Remove attempt logs and progress files this long after they were
    /// last written (never a running attempt's).
    #[arg(long, default_value = "7d")]
    log_retention: String,
    /// Cap the work dir (checkpoints, logs, progress files) at this size,
    /// e.g. 50G: over it, the oldest logs of attempts not running are
    /// removed first. Default: no cap.
    #[arg(long, value_name = "SIZE")]
    work_dir_max: Option<String>,
    /// How often the work dir is swept (tests shorten it).
    #[arg(long, default_value = "60s", hide = true)]
    work_dir_sweep_every: String,
    /// Keep tasks running when no leader has answered this node for half
    /// the leader's node-lost window (30 s by default). Without it the agent
    /// stops them then, before a leader may fail them over to other nodes,
    /// so that no task runs twice; with it, a partitioned node's tasks run
    /// on, and may run twice once the leader has placed them elsewhere.
    #[arg(long)]
    keep_running_when_cut_off: bool,
    /// A deliberate bug, to prove the chaos checks catch it: at start,
    /// neither adopt nor kill the tasks an earlier agent left running.
    /// Tests only.
    #[arg(long, hide = true)]
    forget_leftovers: bool,
    /// Injected disk faults: the file reading `full` makes the agent's
    /// writes that need new space (its records of started attempts) fail
    /// with ENOSPC. Tests and `muster chaos` only.
    #[arg(long, hide = true, value_name = "PATH")]
    disk_fault_file: Option<PathBuf>,
    /// A deliberate bug, to prove the chaos checks catch it: start an attempt
    /// even when its record cannot be written. Tests only.
    #[arg(long, hide = true)]
    start_without_record: bool,
    /// The agent's cgroup subtree, where each attempt gets a cgroup of
    /// its own: a path from the top of each hierarchy (/muster/gpu-01), or
    /// one relative to the agent's own cgroup. Default:
    /// muster/<node-id>-<hash of --work-dir> under the agent's own cgroup.
    #[arg(long, value_name = "PATH")]
    cgroup_root: Option<String>,
    /// Run tasks as bare process groups, without cgroups: no memory, CPU,
    /// process or GPU-device limits, and a process that leaves its group
    /// survives a stop. The node is labelled muster.isolation=none, which
    /// --constraint 'muster.isolation!=none' avoids.
    #[arg(long)]
    no_isolation: bool,
    /// The most processes and threads one task may have.
    #[arg(long, default_value_t = muster_agent::cgroup::DEFAULT_PIDS_MAX, value_name = "N")]
    pids_max: u64,
    #[command(flatten)]
    images: crate::images::ImageArgs,
    /// A GPU's device file, in GPU index order (repeat per GPU), whose
    /// access every task not holding that GPU is refused. Default:
    /// /dev/nvidiaN for each GPU offered, where present.
    #[arg(long = "gpu-device", value_name = "PATH")]
    gpu_devices: Vec<PathBuf>,
    /// The account tasks run as when the agent runs as root (a name, or
    /// UID[:GID]); owners in --user-map run as their own. Default:
    /// muster-task, the dedicated account the deploy units create.
    #[arg(long, value_name = "ACCOUNT")]
    task_user: Option<String>,
    /// A file mapping owners to accounts, one `OWNER ACCOUNT` per line
    /// (`bob bob`, `carol 60002:60002`): each owner's tasks run as its
    /// account, as Slurm runs jobs as the submitting user.
    #[arg(long, value_name = "FILE")]
    user_map: Option<PathBuf>,
    /// Let tasks of owners not in --user-map run as root, this agent's own
    /// user. Without it a root agent never runs a task as root.
    #[arg(long)]
    allow_root_tasks: bool,
    #[command(flatten)]
    tls: crate::client::TlsArgs,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let schedulers = crate::client::parse_addresses(&args.scheduler)?;
    if args.node_id.trim().is_empty() {
        bail!("--node-id must not be empty");
    }
    if args.stall_confirm_samples == 0 || !(0.0..=100.0).contains(&args.gpu_idle_pct) {
        bail!("--stall-confirm-samples must be at least 1 and --gpu-idle-pct between 0 and 100");
    }
    let log_retention = crate::args::parse_duration_s(&args.log_retention).context("--log-retention")?;
    if log_retention == 0 {
        bail!("--log-retention must be at least 1s");
    }
    let sweep_every = crate::args::parse_duration_s(&args.work_dir_sweep_every).context("--work-dir-sweep-every")?;
    if sweep_every == 0 {
        bail!("--work-dir-sweep-every must be at least 1s");
    }
    let max_bytes = args
        .work_dir_max
        .as_deref()
        .map(muster_agent::janitor::parse_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--work-dir-max {e}"))?;
    if let Some(addr) = args.metrics {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            // The per-task gauges of tasks that ended stop being updated:
            // drop them after two minutes (the work-dir gauge is set every
            // sweep, so at least twice a sweep), so the label sets stay
            // bounded by the tasks the node runs.
            .idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(Duration::from_secs((2 * sweep_every).max(120))))
            .install()
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        muster_agent::describe_metrics();
    }
    let probed = muster_agent::probe_resources().context("cannot discover this machine's resources")?;
    let gpus = args.gpus.unwrap_or(probed.gpus);
    let vram_mb = args.vram_mb.unwrap_or(probed.vram_mb);
    if gpus > 0 && vram_mb == 0 {
        bail!("--vram-mb is required when offering GPUs that NVML cannot see (memory per GPU, MiB)");
    }
    let ports = muster_scheduler::sm::PortRange::parse(&args.rendezvous_ports)
        .map_err(|e| anyhow::anyhow!("--rendezvous-ports {e}"))?;
    // What the agent finds (GPU model, driver, CPU, hostname), then the
    // operator's --label flags over it.
    let mut labels: BTreeMap<String, String> = muster_agent::probe_labels();
    for kv in &args.labels {
        let (k, v) = kv.split_once('=').with_context(|| format!("--label {kv:?} is not KEY=VALUE"))?;
        if !muster_scheduler::sm::agent_may_set(k) {
            bail!("--label {k}: muster.* labels are reserved: an admin sets them with `muster node label NODE {k}=…`");
        }
        labels.insert(k.to_string(), v.to_string());
    }
    let checkpoint_listen: Option<std::net::SocketAddr> = match args.checkpoint_listen.as_str() {
        "none" => None,
        a => Some(a.parse().with_context(|| format!("--checkpoint-listen {a:?} is not an IP:port (or none)"))?),
    };
    let checkpoint_address = match (&args.checkpoint_address, checkpoint_listen) {
        (Some(a), _) => a.clone(),
        (None, None) => String::new(),
        (None, Some(listen)) => {
            let host = args.address.as_deref().and_then(|a| a.rsplit_once(':').map(|(h, _)| h.to_string()));
            let host = host
                .or_else(|| (!listen.ip().is_unspecified()).then(|| host_of(listen.ip())))
                .or_else(|| schedulers.iter().find_map(|s| route_ip(s)).map(host_of))
                .unwrap_or_else(|| args.node_id.clone());
            if listen.port() == 0 {
                // The port is known once bound: the agent fills it in.
                format!("{host}:0")
            } else {
                format!("{host}:{}", listen.port())
            }
        }
    };
    // Left out: this machine's IP on its route to the scheduler, which its
    // gang peers most likely reach too (a bare node id seldom resolves:
    // torch's rendezvous fails on it).
    let address = args.address.clone().unwrap_or_else(|| {
        schedulers.iter().find_map(|s| route_ip(s)).map(host_of).unwrap_or_else(|| args.node_id.clone())
    });
    let isolation = isolation(&args, gpus)?;
    let run_as = run_as(&args)?;
    let cfg = AgentConfig {
        node_id: args.node_id.clone(),
        schedulers,
        resources: v1::Resources {
            gpus,
            vram_mb,
            mem_mb: args.mem_mb.unwrap_or(probed.mem_mb),
            cpus: args.cpus.unwrap_or(probed.cpus),
        },
        labels,
        address,
        ports,
        work_dir: args.work_dir.clone(),
        backoff: (Duration::from_millis(200), Duration::from_secs(5)),
        watchdog: WatchdogConfig {
            confirm_samples: args.stall_confirm_samples,
            confirm_poll: Duration::from_millis(args.stall_confirm_poll_ms),
            idle_pct: args.gpu_idle_pct,
            ram_delta_mb: args.ram_delta_mb,
            gpu_health_window: Duration::from_secs(args.gpu_health_window_s),
            gpu_health_grace: Duration::from_secs(args.gpu_health_grace_s),
            ..WatchdogConfig::default()
        },
        sampler: proc_sampler,
        exit_when_stopped: args.exit_when_stopped,
        task_shim: if args.keep_tasks {
            Some(std::env::current_exe().context("--keep-tasks: cannot find this muster binary")?)
        } else {
            None
        },
        tls: args.tls.load(&muster_tls::Role::new("agent", &args.node_id)?)?,
        clock: Default::default(),
        fence: !args.keep_running_when_cut_off,
        forget_leftovers: args.forget_leftovers,
        disk_fault_file: args.disk_fault_file.clone(),
        start_without_record: args.start_without_record,
        checkpoint_listen,
        checkpoint_address,
        isolation,
        run_as,
        exe: std::env::current_exe().ok(),
        images: if args.images.no_images {
            None
        } else {
            let registry = muster_registry::Registry::new(&args.images.registry()?)
                .map_err(|e| anyhow::anyhow!("--registry-ca: {e}"))?;
            let dir = args.work_dir.join("images");
            let cache = muster_registry::ImageCache::open(
                &dir,
                args.images.cache_max(max_bytes)?,
                args.images.policy(),
                registry,
            )
            .with_context(|| format!("cannot open the image cache in {}", dir.display()))?;
            Some(muster_agent::agent::ImageRuntime {
                cache,
                allow_mounts: args.images.allow_mounts()?,
                oci: args.images.oci_runtime()?,
                nvidia: muster_agent::nvidia::find(),
            })
        },
        janitor: muster_agent::janitor::JanitorConfig {
            log_retention: Duration::from_secs(log_retention),
            max_bytes,
            every: Duration::from_secs(sweep_every),
        },
        executor: None,
    };
    let agent = Agent::new(cfg).with_context(|| format!("cannot use work dir {}", args.work_dir.display()))?;
    let (stop, stopped) = watch::channel(false);
    let mut task = tokio::spawn(agent.run(stopped));
    eprintln!("muster agent: node {} connecting to {}", args.node_id, args.scheduler);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = &mut task => {
            eprintln!("muster agent: node {} is stopped; exiting", args.node_id);
            return Ok(());
        }
    }
    eprintln!("muster agent: stopping (running tasks get their grace)");
    let _ = stop.send(true);
    let _ = task.await;
    Ok(())
}

/// Who tasks run as: `--task-user`, `--user-map`, `--allow-root-tasks`.
fn run_as(args: &AgentArgs) -> anyhow::Result<muster_agent::users::RunAs> {
    use muster_agent::users::{MAX_MAP_BYTES, configure};
    let map = match &args.user_map {
        Some(path) => {
            let len = std::fs::metadata(path).with_context(|| format!("--user-map {}", path.display()))?.len();
            if len > MAX_MAP_BYTES {
                crate::usage!("--user-map {}: {len} bytes, more than the {MAX_MAP_BYTES} allowed", path.display());
            }
            Some(std::fs::read_to_string(path).with_context(|| format!("--user-map {}", path.display()))?)
        }
        None => None,
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let run_as = configure(args.task_user.as_deref(), map.as_deref(), args.allow_root_tasks, root)
        .map_err(|e| anyhow::Error::new(crate::BadCommandLine(e)))?;
    match &run_as.default {
        None if !root && args.task_user.is_some() => tracing::warn!(
            node = %args.node_id,
            "--task-user is for an agent running as root: tasks run as this agent's own user"
        ),
        None if root => tracing::warn!(
            node = %args.node_id,
            mapped = run_as.map.len(),
            "--allow-root-tasks: tasks of owners not in --user-map run as root"
        ),
        None => {}
        Some(u) => {
            tracing::info!(node = %args.node_id, account = %u.name, uid = u.uid, mapped = run_as.map.len(), "tasks run as unprivileged accounts")
        }
    }
    Ok(run_as)
}

/// The agent's cgroup subtree, or `None` with `--no-isolation`. Without
/// usable cgroups the agent refuses to start, naming why.
fn isolation(args: &AgentArgs, gpus: u32) -> anyhow::Result<Option<std::sync::Arc<muster_agent::cgroup::Isolation>>> {
    use muster_agent::cgroup::{GpuDevice, Isolation, Options, default_name};
    if args.no_isolation {
        if args.cgroup_root.is_some() {
            crate::usage!("--cgroup-root and --no-isolation contradict each other");
        }
        tracing::warn!(
            node = %args.node_id,
            "--no-isolation: tasks run as bare process groups, without limits; a process that leaves its group survives a stop (node labelled muster.isolation=none)"
        );
        return Ok(None);
    }
    if args.pids_max == 0 {
        crate::usage!("--pids-max must be at least 1");
    }
    if !args.gpu_devices.is_empty() && args.gpu_devices.len() != gpus as usize {
        crate::usage!(
            "--gpu-device was given {} time(s), but the node offers {gpus} GPU(s): name one device per GPU",
            args.gpu_devices.len()
        );
    }
    let gpu_devices = if args.gpu_devices.is_empty() {
        (0..gpus)
            .map(|i| std::path::PathBuf::from(format!("/dev/nvidia{i}")))
            .filter(|p| p.exists())
            .map(|p| GpuDevice::of(&p))
            .collect::<Result<Vec<_>, _>>()
    } else {
        args.gpu_devices.iter().map(|p| GpuDevice::of(p)).collect()
    }
    .map_err(|e| anyhow::anyhow!("--gpu-device {e}"))?;
    let opts = Options {
        root: args.cgroup_root.clone(),
        name: default_name(&args.node_id, &args.work_dir),
        gpu_devices,
        pids_default: args.pids_max,
    };
    let iso = Isolation::detect(&opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!(
        node = %args.node_id,
        layout = iso.version().label(),
        subtree = ?iso.roots(),
        gpu_devices = iso.gpu_devices().len(),
        "tasks are contained in cgroups"
    );
    Ok(Some(std::sync::Arc::new(iso)))
}

/// The local IP this node uses on its route to `addr` (host:port): the
/// address its peers most likely reach it at. Found by connecting a UDP
/// socket, which sends nothing.
fn route_ip(addr: &str) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let target = addr.to_socket_addrs().ok()?.next()?;
    let bind: std::net::SocketAddr = if target.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// `ip` as the host part of host:port (IPv6 in brackets).
fn host_of(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    }
}
