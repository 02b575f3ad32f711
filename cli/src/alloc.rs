//! `muster submit` and `muster alloc get|list`: the client write and read path.

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Checkpoint {
    Auto,
    Manual,
    None,
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// Tasks in the gang (all placed together).
    #[arg(short = 'n', long, alias = "gang", default_value_t = 1)]
    gang_size: u32,
    /// GPUs per task.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// Least memory per GPU, MiB.
    #[arg(long, default_value_t = 0)]
    vram_mb: u64,
    /// Host memory per task, MiB.
    #[arg(long, default_value_t = 1024)]
    mem_mb: u64,
    /// CPU cores per task.
    #[arg(long, default_value_t = 1)]
    cpus: u32,
    /// Preemption class, 0 (preempted first) to 10 (never preempted).
    #[arg(long, default_value_t = 0)]
    class: u32,
    /// Priority within the class (higher first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// How the task survives preemption.
    #[arg(long, value_enum, default_value_t = Checkpoint::Auto)]
    checkpoint: Checkpoint,
    /// Walltime per attempt (the budget watchdog stops it there): seconds,
    /// or with a unit (90s, 30m, 4h, 2d). Default: the server's for the
    /// class (`muster server --default-walltime`), else 1h.
    #[arg(long)]
    walltime: Option<String>,
    /// Runs of the gang that may end in a failure before the allocation
    /// fails: counted once per gang restart, however many of its tasks
    /// failed. Retries back off (1 s, doubling, at most 60 s) and never
    /// preempt; the same failure twice in a row within 10 s of starting
    /// (a missing command or file) fails it at once.
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
    /// Environment for each task, KEY=VALUE (repeatable). Readable by
    /// anyone who may read the allocation: use --secret for credentials.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// A secret environment variable for each task (repeatable): KEY=VALUE,
    /// or KEY alone to take the value from this shell's $KEY (kept out of
    /// the command line and shell history). Never returned by a read, never
    /// logged, sent only to the agents of the nodes its tasks run on.
    #[arg(long = "secret", value_name = "KEY[=VALUE]")]
    secrets: Vec<String>,
    /// A secret whose value is a file's contents, KEY=PATH (repeatable).
    #[arg(long = "secret-file", value_name = "KEY=PATH")]
    secret_files: Vec<String>,
    /// Owner (default: your identity, the name in your certificate or token; only admins may name another).
    #[arg(long)]
    owner: Option<String>,
    /// A retried submit with the same key returns the same allocation.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// The vCluster the allocation belongs to.
    #[arg(long, default_value = "default")]
    vcluster: String,
    /// The vCluster's type: hpc-batch, ml-training, service, sensitive or
    /// interactive (decides how it may be preempted). Left out, the
    /// allocation takes its vCluster's type; naming another is refused.
    #[arg(long)]
    vcluster_type: Option<String>,
    /// Never preempted (requires --class 10).
    #[arg(long)]
    sensitive: bool,
    /// How long a checkpoint takes (counted in its preemption cost).
    #[arg(long, default_value = "60s")]
    checkpoint_estimate: String,
    /// Where its checkpoints go, when not where its vCluster's or the
    /// cluster's go: node (each node's own disk), or a path or URL within a
    /// store an operator configured (`muster cluster checkpoints`).
    #[arg(long, value_name = "STORE")]
    checkpoint_store: Option<String>,
    /// Stop and retry a task that reported progress (muster beat, or a change
    /// to $MUSTER_PROGRESS_FILE) and then made none for this long, with its
    /// GPU idle and memory static (`--stall-timeout` alone: 120s; default: off).
    #[arg(long, num_args = 0..=1, default_missing_value = "120s", value_name = "DURATION")]
    stall_timeout: Option<String>,
    /// Run only on nodes whose labels meet EXPR (repeatable; all must hold):
    /// key=value, key!=value, "key in (a,b)", "key notin (a,b)", key
    /// (exists), !key (absent). Agents label nodes with gpu.model,
    /// gpu.memory_mb, gpu.count, driver.version, cpu.model, hostname and
    /// their --label flags (`muster node list` shows them).
    #[arg(long = "constraint", value_name = "EXPR")]
    constraints: Vec<String>,
    /// Put every task under one value of this topology label (rack, block,
    /// switch, …): KEY or KEY:required waits for one value with room for
    /// the whole gang; KEY:preferred packs when it can and spreads when not.
    #[arg(long, value_name = "KEY[:required|:preferred]")]
    pack_by: Option<String>,
    /// Rendezvous ports to reserve on task 0's node: MASTER_PORT is the
    /// first, MUSTER_PORTS lists them all (0: none).
    #[arg(long, default_value_t = 1)]
    ports: u32,
    /// Validate and show the plan (placement, or what it would preempt and
    /// why) without submitting.
    #[arg(long)]
    dry_run: bool,
    /// Queue it even if no registered node could ever run it (refused
    /// otherwise, naming what is missing): for nodes yet to join.
    #[arg(long)]
    queue_if_unsatisfiable: bool,
    /// A name for it (not unique), shown by `alloc list` and matched by
    /// `alloc list --name` and `alloc cancel --name`.
    #[arg(long, short = 'J', alias = "job-name")]
    name: Option<String>,
    /// The command each task runs.
    #[arg(required = true, last = true)]
    command: Vec<String>,
}

/// Parses `90`, `90s`, `30m`, `4h`, `2d` into seconds.
pub fn parse_duration_s(s: &str) -> anyhow::Result<u64> {
    muster_scheduler::sm::parse_duration_s(s).map_err(anyhow::Error::msg)
}

/// `--secret` and `--secret-file` as a map (errors name the key, never the
/// value).
fn secrets_of(args: &SubmitArgs) -> anyhow::Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for s in &args.secrets {
        let (k, v) = match s.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => {
                let v = std::env::var(s).with_context(|| format!("--secret {s}: ${s} is not set in this shell"))?;
                (s.clone(), v)
            }
        };
        if out.insert(k.clone(), v).is_some() {
            bail!("--secret {k} is given twice");
        }
    }
    for kv in &args.secret_files {
        let (k, path) = kv.split_once('=').with_context(|| format!("--secret-file {kv:?} is not KEY=PATH"))?;
        let v = std::fs::read_to_string(path).with_context(|| format!("--secret-file {k}: cannot read {path}"))?;
        if out.insert(k.to_string(), v).is_some() {
            bail!("--secret-file {k}: {k} is given twice");
        }
    }
    Ok(out)
}

fn spec_of(args: &SubmitArgs) -> anyhow::Result<v1::AllocationSpec> {
    let mut env = HashMap::new();
    for kv in &args.env {
        let (k, v) = kv.split_once('=').with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    // Left out: the server's default for the class (1 h unless configured).
    let walltime_s = match &args.walltime {
        None => 0,
        Some(w) => {
            let s = parse_duration_s(w).context("--walltime")?;
            if s == 0 {
                bail!("--walltime must be at least 1 second");
            }
            s
        }
    };
    let stall_timeout_s = match &args.stall_timeout {
        None => 0,
        Some(s) => parse_duration_s(s).context("--stall-timeout").and_then(|v| {
            u32::try_from(v).ok().filter(|v| *v > 0).context("--stall-timeout must be 1 s to 136 years")
        })?,
    };
    // Checked here for a clear message; the server checks again.
    for c in &args.constraints {
        muster_scheduler::sm::LabelExpr::parse_list(c).map_err(|e| anyhow::anyhow!("--constraint {e}"))?;
    }
    if let Some(p) = &args.pack_by {
        muster_scheduler::sm::Packing::parse(p).map_err(|e| anyhow::anyhow!("--pack-by {e}"))?;
    }
    if let Some(store) = &args.checkpoint_store {
        muster_scheduler::sm::CheckpointStore::parse(store).map_err(|e| anyhow::anyhow!("--checkpoint-store {e}"))?;
    }
    let estimate = parse_duration_s(&args.checkpoint_estimate).context("--checkpoint-estimate")?;
    let checkpoint_estimate_s = u32::try_from(estimate).ok().filter(|s| *s > 0).with_context(|| {
        format!("--checkpoint-estimate {:?} must be between 1 s and 136 years", args.checkpoint_estimate)
    })?;
    Ok(v1::AllocationSpec {
        // The server records the verified identity; only admins name another.
        owner: args.owner.clone().unwrap_or_default(),
        gang_size: args.gang_size,
        resources: Some(v1::Resources { gpus: args.gpus, vram_mb: args.vram_mb, mem_mb: args.mem_mb, cpus: args.cpus }),
        preemption_class: args.class,
        priority: args.priority,
        checkpoint: match args.checkpoint {
            Checkpoint::Auto => v1::CheckpointMode::Auto,
            Checkpoint::Manual => v1::CheckpointMode::Manual,
            Checkpoint::None => v1::CheckpointMode::None,
        } as i32,
        walltime_s,
        max_retries: args.max_retries,
        command: args.command.clone(),
        env,
        idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
        vcluster: args.vcluster.clone(),
        vcluster_type: args.vcluster_type.clone().unwrap_or_default(),
        sensitive: args.sensitive,
        checkpoint_estimate_s,
        stall_timeout_s,
        ports: Some(args.ports),
        constraints: args.constraints.clone(),
        pack_by: args.pack_by.clone().unwrap_or_default(),
        checkpoint_store: args.checkpoint_store.clone().unwrap_or_default(),
        name: args.name.clone().unwrap_or_default(),
    })
}

pub async fn submit(cluster: &mut Cluster, args: SubmitArgs, out: Output) -> anyhow::Result<()> {
    // Whatever spec_of and secrets_of refuse is the command line's fault
    // (exit 2); what the server refuses is the request's (exit 1).
    let bad = |e: anyhow::Error| anyhow::Error::new(crate::BadCommandLine(format!("{e:#}")));
    let spec = spec_of(&args).map_err(bad)?;
    let secrets = secrets_of(&args).map_err(bad)?;
    let (dry_run, queue_if_unsatisfiable) = (args.dry_run, args.queue_if_unsatisfiable);
    let resp = cluster
        .call(|ch| {
            let req = v1::SubmitRequest {
                spec: Some(spec.clone()),
                dry_run,
                secrets: secrets.clone(),
                queue_if_unsatisfiable,
            };
            async move { AllocationServiceClient::new(ch).submit(req).await }
        })
        .await?
        .into_inner();
    if let Some(plan) = resp.plan {
        print_explanation("dry run", &plan, out)?;
        return Ok(());
    }
    match out {
        Output::Json => out!("{}", json!({ "id": resp.id, "duplicate": resp.duplicate })),
        Output::Text if resp.duplicate => {
            out!("allocation {} (already submitted with this idempotency key)", resp.id)
        }
        Output::Text => out!("allocation {} submitted", resp.id),
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum AllocCmd {
    /// Show one allocation.
    Get {
        /// The allocation id.
        id: u64,
    },
    /// Cancel allocations; their running tasks are stopped (SIGTERM, grace,
    /// SIGKILL). Each id is cancelled in turn; the exit is 1 if any was
    /// refused (each refusal is printed).
    Cancel {
        /// The allocation ids.
        #[arg(num_args = 0..=1000, required_unless_present_any = ["owner", "name"])]
        ids: Vec<u64>,
        /// Every unfinished allocation of this owner (with --name: both
        /// must match). Lists them and asks first; --yes does not ask.
        #[arg(long, conflicts_with = "ids")]
        owner: Option<String>,
        /// Every unfinished allocation with this name (see --owner).
        #[arg(long, conflicts_with = "ids")]
        name: Option<String>,
        /// Cancel what --owner/--name select without asking (required when
        /// stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Follow an allocation's events until it ends (exit 0 when done, 1 when it failed or was cancelled).
    Watch {
        /// The allocation id.
        id: u64,
        /// Start after this revision (0: from the beginning).
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Print a task's output (stdout, or --stderr), fetched from its node.
    Logs {
        /// The allocation id.
        id: u64,
        /// The task index.
        #[arg(long, default_value_t = 0)]
        task: u32,
        /// The attempt (0, the default: the latest).
        #[arg(long, default_value_t = 0)]
        attempt: u32,
        /// Only stdout, unmarked (by default both, stderr lines marked `[stderr] `).
        #[arg(long, conflicts_with = "stderr")]
        stdout: bool,
        /// Only stderr, unmarked.
        #[arg(long)]
        stderr: bool,
        /// Keep printing until the attempt ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Why is it pending? Per class of nodes: could they ever take a task, how many can now.
    Explain {
        /// The allocation id.
        id: u64,
    },
    /// List allocations.
    List {
        /// Only this status (queued, suspended, reserved, running, tearing-down, done, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only this owner.
        #[arg(long)]
        owner: Option<String>,
        /// Only this preemption class.
        #[arg(long)]
        class: Option<u32>,
        /// Only allocations with this name (`submit --name`); follows every page.
        #[arg(long)]
        name: Option<String>,
        /// Only allocations submitted since: a duration back from now (90s,
        /// 30m, 4h, 2d) or a UTC time (2026-11-27T07:00:00Z); follows every page.
        #[arg(long)]
        since: Option<String>,
        /// Order by id, name, status, owner, class, submitted, started or
        /// elapsed; a leading - sorts descending (default: id).
        #[arg(long, default_value = "id", allow_hyphen_values = true)]
        sort: String,
        /// The columns, comma-separated, of: id, name, status, owner, tasks,
        /// class, submitted, started, elapsed, nodes, command, vcluster,
        /// priority, failures, reason.
        #[arg(long, alias = "format", default_value = crate::alloc_list::DEFAULT_COLUMNS)]
        columns: String,
        /// Allocations per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Follow every page.
        #[arg(long)]
        all: bool,
    },
}

pub(crate) fn status_name(raw: i32) -> &'static str {
    match v1::AllocationStatus::try_from(raw) {
        Ok(v1::AllocationStatus::Queued) => "queued",
        Ok(v1::AllocationStatus::Suspended) => "suspended",
        Ok(v1::AllocationStatus::Reserved) => "reserved",
        Ok(v1::AllocationStatus::Running) => "running",
        Ok(v1::AllocationStatus::TearingDown) => "tearing-down",
        Ok(v1::AllocationStatus::Done) => "done",
        Ok(v1::AllocationStatus::Failed) => "failed",
        Ok(v1::AllocationStatus::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

pub(crate) fn task_status_name(raw: i32) -> String {
    v1::TaskStatus::try_from(raw)
        .map(|s| s.as_str_name().trim_start_matches("TASK_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

fn status_filter(name: &str) -> anyhow::Result<i32> {
    Ok(match name {
        "queued" => v1::AllocationStatus::Queued,
        "suspended" => v1::AllocationStatus::Suspended,
        "reserved" => v1::AllocationStatus::Reserved,
        "running" => v1::AllocationStatus::Running,
        "tearing-down" => v1::AllocationStatus::TearingDown,
        "done" => v1::AllocationStatus::Done,
        "failed" => v1::AllocationStatus::Failed,
        "cancelled" => v1::AllocationStatus::Cancelled,
        other => {
            bail!(
                "--status {other:?} is not one of queued, suspended, reserved, running, tearing-down, done, failed, \
                 cancelled"
            )
        }
    } as i32)
}

fn alloc_json(a: &v1::Allocation) -> serde_json::Value {
    let mut v = alloc_json_fields(a);
    let spec = a.spec.clone().unwrap_or_default();
    // Plain environment is readable by whoever reads the allocation;
    // secrets show only their names.
    v["env"] = json!(spec.env);
    v["name"] = json!(spec.name);
    v["secrets"] = json!(a.secret_names);
    // Times beside their milliseconds, in RFC 3339 (UTC): submitted, the
    // first task's start, the end.
    let rfc3339 = |ms: Option<u64>| ms.map(muster_scheduler::server::convert::format_time_ms);
    let started_ms = crate::alloc_list::started_ms(a);
    v["submit_time"] = json!(rfc3339(Some(a.submit_time_ms)));
    v["started_at_ms"] = json!(started_ms);
    v["started_at"] = json!(rfc3339(started_ms));
    v["finished_at_ms"] = json!(a.finished_at_ms);
    v["finished_at"] = json!(rfc3339(a.finished_at_ms));
    v["retry_after"] = json!(rfc3339(Some(a.retry_after_ms).filter(|&ms| ms > 0)));
    v["retry_after_ms"] = json!(a.retry_after_ms);
    v["teardowns"] = json!(a.preemption_epoch);
    v["failures"] = json!(a.failures);
    v["failed_reason"] = json!(a.failed_reason);
    v["last_failure"] = json!(a.last_failure.as_ref().map(|f| json!({
        "task": f.task,
        "attempt": f.attempt,
        "exit_code": f.exit_code,
        "not_started": f.not_started,
        "early": f.early,
        "at_ms": f.at_ms,
        "stderr_tail": f.stderr_tail,
    })));
    v
}

fn alloc_json_fields(a: &v1::Allocation) -> serde_json::Value {
    let spec = a.spec.clone().unwrap_or_default();
    let r = spec.resources.unwrap_or_default();
    json!({
        "id": a.id,
        "status": status_name(a.status),
        "owner": spec.owner,
        "gang_size": spec.gang_size,
        "resources": { "gpus": r.gpus, "vram_mb": r.vram_mb, "mem_mb": r.mem_mb, "cpus": r.cpus },
        "preemption_class": spec.preemption_class,
        "priority": spec.priority,
        "walltime_s": spec.walltime_s,
        "max_retries": spec.max_retries,
        "command": spec.command,
        "idempotency_key": spec.idempotency_key,
        "vcluster": spec.vcluster,
        "submit_time_ms": a.submit_time_ms,
        "reservation_epoch": a.reservation_epoch,
        "preemption_epoch": a.preemption_epoch,
        "vcluster_type": spec.vcluster_type,
        "sensitive": spec.sensitive,
        "checkpoint_estimate_s": spec.checkpoint_estimate_s,
        "stall_timeout_s": spec.stall_timeout_s,
        "rendezvous_ports": a.ports,
        "constraints": spec.constraints,
        "pack_by": spec.pack_by,
        "preempted_count": a.preempted_count,
        "teardown": a.teardown.as_ref().map(|td| json!({
            "epoch": td.epoch,
            "trigger": td.trigger,
            "preempted_by": td.preempted_by,
            "reason": td.reason,
            "failed_checkpoints": td.failed_checkpoints,
            "started_at_ms": td.started_at_ms,
        })),
        "nomination": a.nomination.as_ref().map(|n| json!({
            "nodes": n.node_ids,
            "waiting_for": n.waiting_for,
            "decided_at_ms": n.decided_at_ms,
            "expires_at_ms": n.expires_at_ms,
        })),
        "tasks": a.tasks.iter().map(|t| json!({
            "index": t.index,
            "status": task_status_name(t.status),
            "node": t.node_id,
            "last_node": t.last_node_id,
            "attempts": t.attempts,
            "runs": t.runs,
            "reservation_epoch": t.reservation_epoch,
            "preemption_epoch": t.preemption_epoch,
            "checkpoint_bytes": t.checkpoint_bytes,
            "checkpoint_epoch": t.checkpoint_epoch,
            "exit_code": t.exit_code,
            "watchdog_trips": t.watchdog_trips,
            "last_watchdog": t.last_watchdog,
            "borrowed_from": t.borrowed_from,
        })).collect::<Vec<_>>(),
    })
}

/// One task of `alloc get`: status, node, attempts, epochs, checkpoint.
fn task_line(t: &v1::Task) -> String {
    let node = if !t.node_id.is_empty() {
        t.node_id.as_str()
    } else if !t.last_node_id.is_empty() {
        t.last_node_id.as_str()
    } else {
        "-"
    };
    let mut checkpoint = match t.checkpoint_epoch {
        Some(epoch) => format!("  checkpoint {} B (epoch {epoch})", t.checkpoint_bytes),
        None => String::new(),
    };
    if !t.borrowed_from.is_empty() {
        checkpoint.push_str(&format!("  borrowed from {}", t.borrowed_from));
    }
    if t.watchdog_trips > 0 {
        checkpoint.push_str(&format!("  watchdog {} ({} trips)", t.last_watchdog, t.watchdog_trips));
    }
    format!(
        "          task {:>3}  {:<12}  node {:<16}  attempts {:>2}  runs {:>2}  epoch {:>2}  teardown {:>2}{checkpoint}",
        t.index,
        task_status_name(t.status),
        node,
        t.attempts,
        t.runs,
        t.reservation_epoch,
        t.preemption_epoch,
    )
}

/// One of an attempt's logs, as a stream of chunks.
async fn open_logs(cluster: &mut Cluster, req: v1::LogsRequest) -> anyhow::Result<tonic::Streaming<v1::LogChunk>> {
    Ok(cluster.call(|ch| async move { AllocationServiceClient::new(ch).logs(req).await }).await?.into_inner())
}

/// Writes log bytes to stdout; `false` once the reader went away.
fn emit(data: &[u8]) -> anyhow::Result<bool> {
    use std::io::Write as _;
    if data.is_empty() {
        return Ok(true);
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(data).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// stderr's lines, each marked `[stderr] ` (chunks need not end at a line).
#[derive(Default)]
struct Marked {
    partial: Vec<u8>,
}

impl Marked {
    const MARK: &[u8] = b"[stderr] ";

    /// The complete lines so far, marked; the rest waits for its newline.
    fn push(&mut self, data: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(data);
        let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        let rest = self.partial.split_off(last + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        let mut out = Vec::with_capacity(lines.len() + 16);
        for line in lines.split_inclusive(|&b| b == b'\n') {
            out.extend_from_slice(Self::MARK);
            out.extend_from_slice(line);
        }
        out
    }

    /// A last line without its newline, marked and ended.
    fn finish(&mut self) -> Vec<u8> {
        if self.partial.is_empty() {
            return Vec::new();
        }
        let mut out = Self::MARK.to_vec();
        out.append(&mut self.partial);
        out.push(b'\n');
        out
    }
}

/// Runs one `muster alloc` subcommand.
pub async fn alloc(cluster: &mut Cluster, cmd: AllocCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        AllocCmd::Get { id } => {
            let a = cluster
                .call(|ch| async move { AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await })
                .await?
                .into_inner();
            match out {
                Output::Json => out!("{}", serde_json::to_string_pretty(&alloc_json(&a))?),
                Output::Text => {
                    let columns = crate::alloc_list::parse_columns(crate::alloc_list::DEFAULT_COLUMNS)?;
                    for line in crate::alloc_list::table(&columns, std::slice::from_ref(&a), crate::output::now_ms()) {
                        out!("{line}");
                    }
                    let now = crate::output::now_ms();
                    let max = a.spec.as_ref().map_or(0, |s| s.max_retries);
                    out!(
                        "          submitted {}; {}; torn down {}; failed runs {} of {max}{}",
                        crate::output::when(a.submit_time_ms, now),
                        crate::output::preempted(u64::from(a.preempted_count)),
                        crate::output::times(a.preemption_epoch),
                        a.failures,
                        if a.status == v1::AllocationStatus::Suspended as i32 {
                            "; suspended: resumes from its checkpoints when placed"
                        } else {
                            ""
                        }
                    );
                    if !a.failed_reason.is_empty() {
                        out!("          failed: {}", a.failed_reason);
                    }
                    if a.retry_after_ms > now && a.finished_at_ms.is_none() {
                        out!("          backing off: placed again {}", crate::output::when(a.retry_after_ms, now));
                    }
                    if let Some(f) = &a.last_failure {
                        let how = match (f.not_started, f.exit_code) {
                            (true, _) => "did not start".to_string(),
                            (false, Some(code)) => format!("exit code {code}"),
                            (false, None) => "killed by a signal".to_string(),
                        };
                        out!(
                            "          last failure: task {} attempt {}, {how}, {}{}",
                            f.task,
                            f.attempt,
                            crate::output::when(f.at_ms, now),
                            if f.early { " (early: soon after its start)" } else { "" }
                        );
                        for line in f.stderr_tail.lines() {
                            out!("            | {line}");
                        }
                    }
                    if let Some(td) = &a.teardown {
                        match td.trigger {
                            Some(trigger) => {
                                out!("          teardown epoch {} (task {trigger} failed) in progress", td.epoch)
                            }
                            None => out!(
                                "          preemption epoch {} ({}) for allocation {} in progress",
                                td.epoch,
                                td.reason,
                                td.preempted_by
                            ),
                        }
                    }
                    if let Some(&port) = a.ports.first() {
                        let node = a.tasks.first().map_or("", |t| t.node_id.as_str());
                        let all: Vec<String> = a.ports.iter().map(u32::to_string).collect();
                        out!("          rendezvous: MASTER_PORT {port} on {node} (ports {})", all.join(","));
                    }
                    if let Some(n) = &a.nomination {
                        out!(
                            "          nodes {} held for it; waiting for preempted allocation(s) {:?}",
                            n.node_ids.join(", "),
                            n.waiting_for
                        );
                    }
                    for t in &a.tasks {
                        out!("{}", task_line(t));
                    }
                }
            }
        }
        AllocCmd::Cancel { ids, owner, name, yes } => {
            let ids = if owner.is_some() || name.is_some() {
                match crate::alloc_list::select_to_cancel(cluster, owner, name, yes).await? {
                    Some(ids) => ids,
                    None => return Ok(()),
                }
            } else {
                ids
            };
            let (mut done, mut refused) = (Vec::new(), Vec::new());
            for id in ids {
                match cluster
                    .call(|ch| async move { AllocationServiceClient::new(ch).cancel(v1::CancelRequest { id }).await })
                    .await
                {
                    Ok(a) => done.push(a.into_inner()),
                    Err(e) => refused.push((id, e)),
                }
            }
            match out {
                Output::Json if done.len() == 1 && refused.is_empty() => {
                    out!("{}", serde_json::to_string_pretty(&alloc_json(&done[0]))?)
                }
                Output::Json => out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "cancelled": done.iter().map(alloc_json).collect::<Vec<_>>(),
                        "refused": refused.iter().map(|(id, e)| json!({"id": id, "error": format!("{e:#}")})).collect::<Vec<_>>(),
                    }))?
                ),
                Output::Text => {
                    for a in &done {
                        let id = a.id;
                        if a.status == v1::AllocationStatus::TearingDown as i32 {
                            let stopping =
                                a.tasks.iter().filter(|t| t.status == v1::TaskStatus::Preempting as i32).count();
                            out!(
                                "allocation {id} cancelling: {stopping} task(s) stopping (SIGTERM, grace, SIGKILL); \
                                 their capacity is freed as each one stops"
                            )
                        } else {
                            out!("allocation {id} cancelled")
                        }
                    }
                }
            }
            match refused.as_slice() {
                [] => {}
                [(id, e)] if done.is_empty() => return Err(anyhow::anyhow!("{e:#}").context(format!("cancel {id}"))),
                _ => {
                    for (id, e) in &refused {
                        eprintln!("muster: cancel {id}: {e:#}");
                    }
                    bail!("{} of {} allocation(s) not cancelled", refused.len(), refused.len() + done.len());
                }
            }
        }
        AllocCmd::Watch { id, from } => {
            let mut cursor = from;
            let mut last_status = 0;
            let mut retries = 0;
            let mut header_shown = false;
            loop {
                let stream = cluster
                    .call(|ch| async move {
                        AllocationServiceClient::new(ch).watch(v1::WatchRequest { id, from_revision: cursor }).await
                    })
                    .await;
                let mut stream = match stream {
                    Ok(s) => s.into_inner(),
                    Err(e) if retries < 20 && e.to_string().contains("unavailable") => {
                        retries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(e)) => {
                            retries = 0;
                            cursor = e.revision;
                            last_status = e.status;
                            match out {
                                Output::Json => out!(
                                    "{}",
                                    json!({ "id": e.id, "revision": e.revision, "time_ms": e.time_ms, "kind": e.kind,
                                            "detail": e.detail, "status": status_name(e.status), "truncated": e.truncated })
                                ),
                                Output::Text => {
                                    if e.truncated {
                                        out!("(older events were dropped)");
                                    }
                                    if !header_shown {
                                        header_shown = true;
                                        out!("{:>5}  {:<20}  {:<13}  {:<22}  DETAIL", "REV", "TIME", "STATUS", "EVENT");
                                    }
                                    out!(
                                        "{:>5}  {:<20}  {:<13}  {:<22}  {}",
                                        e.revision,
                                        muster_scheduler::server::convert::format_time_ms(e.time_ms),
                                        status_name(e.status),
                                        e.kind,
                                        e.detail
                                    )
                                }
                            }
                        }
                        Ok(None) => break true,
                        // The replica went away: reconnect from the last revision seen.
                        Err(_) => break false,
                    }
                };
                if ended {
                    break;
                }
                retries += 1;
                if retries > 20 {
                    bail!("lost the watch on allocation {id} and could not resume it");
                }
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            match status_name(last_status) {
                "done" => {}
                other => bail!("allocation {id} ended {other}"),
            }
        }
        AllocCmd::Logs { id, task, attempt, stdout, stderr, follow } => {
            let req = |stderr: bool| v1::LogsRequest { id, task, attempt, stderr, follow };
            let fail = |s: tonic::Status| anyhow::anyhow!(crate::client::describe(&s));
            if stdout || stderr {
                let mut stream = open_logs(cluster, req(stderr)).await?;
                while let Some(chunk) = stream.message().await.map_err(fail)? {
                    if !emit(&chunk.data)? {
                        return Ok(());
                    }
                }
                return Ok(());
            }
            // Both: stdout as it is, stderr's lines marked. Following, they
            // interleave as they come; otherwise stdout first.
            let mut out_stream = open_logs(cluster, req(false)).await?;
            let mut err_stream = open_logs(cluster, req(true)).await?;
            let mut marked = Marked::default();
            let (mut wrote_out, mut wrote_err) = (false, false);
            let (mut out_done, mut err_done) = (false, false);
            while !(out_done && err_done) {
                let (data, is_err) = tokio::select! {
                    m = out_stream.message(), if !out_done => match m.map_err(fail)? {
                        Some(c) => (c.data, false),
                        None => { out_done = true; continue }
                    },
                    m = err_stream.message(), if !err_done && (follow || out_done) => match m.map_err(fail)? {
                        Some(c) => (c.data, true),
                        None => { err_done = true; continue }
                    },
                };
                wrote_out |= !is_err && !data.is_empty();
                wrote_err |= is_err && !data.is_empty();
                let text = if is_err { marked.push(&data) } else { data };
                if !emit(&text)? {
                    return Ok(());
                }
            }
            if !emit(&marked.finish())? {
                return Ok(());
            }
            if wrote_err && !wrote_out {
                eprintln!("muster: task {task}'s attempt wrote to stderr only (marked [stderr] above)");
            }
        }
        AllocCmd::Explain { id } => {
            let e = cluster
                .call(|ch| async move { AllocationServiceClient::new(ch).explain(v1::GetRequest { id }).await })
                .await?
                .into_inner();
            print_explanation(&format!("allocation {id}"), &e, out)?;
        }
        AllocCmd::List { status, owner, class, name, since, sort, columns, page_size, all } => {
            let now = crate::output::now_ms();
            let columns = crate::alloc_list::parse_columns(&columns)?;
            let (sort_key, descending) = crate::alloc_list::parse_sort(&sort)?;
            let since_ms = since.as_deref().map(|s| crate::alloc_list::parse_since(s, now)).transpose()?;
            let status = status.as_deref().map(status_filter).transpose()?.unwrap_or(0);
            // Filters the server does not apply need every page.
            let all = all || name.is_some() || since_ms.is_some();
            let (mut rows, token) =
                crate::alloc_list::list_pages(cluster, status, owner, class, page_size, all).await?;
            crate::alloc_list::filter(&mut rows, name.as_deref(), since_ms);
            crate::alloc_list::sort(&mut rows, sort_key, descending, now);
            match out {
                Output::Json => {
                    let list: Vec<_> = rows.iter().map(alloc_json).collect();
                    out!(
                        "{}",
                        serde_json::to_string_pretty(&json!({ "allocations": list, "next_page_token": token }))?
                    );
                }
                Output::Text if rows.is_empty() => out!("no allocations"),
                Output::Text => {
                    for line in crate::alloc_list::table(&columns, &rows, now) {
                        out!("{line}");
                    }
                    if token != 0 {
                        out!("(more: --all, or continue after allocation {token})");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Prints an explanation (of a pending allocation, or a dry run): the
/// summary, the node classes, and what preemption would do.
fn print_explanation(what: &str, e: &v1::Explanation, out: Output) -> anyhow::Result<()> {
    match out {
        Output::Json => out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "id": e.id,
                "status": status_name(e.status),
                "summary": e.summary,
                "classes": e.classes.iter().map(|c| json!({
                    "class": c.class, "nodes": c.nodes, "can_take_now": c.can_take_now, "reason": c.reason,
                })).collect::<Vec<_>>(),
                "preemption": e.preemption.as_ref().map(|p| json!({
                    "victims": p.victims.iter().map(|v| json!({
                        "id": v.id,
                        "preemption_class": v.preemption_class,
                        "gpus": v.gpus,
                        "elapsed_s": v.elapsed_s,
                        "checkpoint_cost": v.checkpoint_cost,
                        "recompute_cost": v.recompute_cost,
                        "value_cost": v.value_cost,
                        "total_cost": v.total_cost,
                    })).collect::<Vec<_>>(),
                    "nodes": p.node_ids,
                    "total_cost": p.total_cost,
                    "value": p.value,
                    "reason": p.reason,
                })),
                "planned_start": e.planned_start.as_ref().map(|p| json!({
                    "start_ms": p.start_ms, "in_ms": p.in_ms, "nodes": p.node_ids,
                })),
                "checkpoints": e.checkpoints,
            }))?
        ),
        Output::Text => {
            out!("{what}: {}", e.summary);
            for c in &e.classes {
                out!("  {:>4} x {:<52}  {}", c.nodes, c.class, c.reason);
            }
            for note in &e.checkpoints {
                out!("checkpoint: {note}");
            }
            if let Some(p) = &e.preemption {
                if p.victims.is_empty() {
                    out!("preemption: {}", p.reason);
                } else {
                    out!(
                        "preemption: would stop {} allocation(s), cost {} GPU-s (below the gang's value of {} GPU-s), \
                         freeing nodes {}",
                        p.victims.len(),
                        p.total_cost,
                        p.value,
                        p.node_ids.join(", ")
                    );
                    for v in &p.victims {
                        out!(
                            "  victim {:>6}  class {:>2}  {:>4} GPU(s)  running {:>11}  cost {:>8} = checkpoint {} + recompute {} + value {}",
                            v.id,
                            v.preemption_class,
                            v.gpus,
                            crate::output::duration(v.elapsed_s * 1000),
                            v.total_cost,
                            v.checkpoint_cost,
                            v.recompute_cost,
                            v.value_cost
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_lines_are_marked_even_when_chunks_split_them() {
        let mut m = Marked::default();
        let mut all = m.push(b"fir");
        all.extend(m.push(b"st\nsec"));
        all.extend(m.push(b"ond\nthird\nla"));
        all.extend(m.finish());
        assert_eq!(String::from_utf8(all).unwrap(), "[stderr] first\n[stderr] second\n[stderr] third\n[stderr] la\n");
        assert!(m.finish().is_empty());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_s("90").unwrap(), 90);
        assert_eq!(parse_duration_s("30m").unwrap(), 1800);
        assert_eq!(parse_duration_s("4h").unwrap(), 14_400);
        assert_eq!(parse_duration_s("2d").unwrap(), 172_800);
        assert!(parse_duration_s("4w").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_duration_s("h").is_err());
    }

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn spec(argv: &[&str]) -> anyhow::Result<v1::AllocationSpec> {
        use clap::Parser;
        let mut all = vec!["submit"];
        all.extend(argv);
        all.extend(["--", "true"]);
        spec_of(&Wrap::try_parse_from(all)?.args)
    }

    #[test]
    fn stall_timeout_and_walltime_flags() {
        assert_eq!(spec(&[]).unwrap().stall_timeout_s, 0, "off unless asked");
        assert_eq!(spec(&["--stall-timeout"]).unwrap().stall_timeout_s, 120, "alone: the seed's 120 s");
        assert_eq!(spec(&["--stall-timeout", "5m"]).unwrap().stall_timeout_s, 300);
        assert!(spec(&["--stall-timeout", "0s"]).unwrap_err().to_string().contains("--stall-timeout"));
        assert_eq!(spec(&[]).unwrap().walltime_s, 0, "left to the server's class default");
        assert_eq!(spec(&["--walltime", "2h"]).unwrap().walltime_s, 7200);
    }
}
