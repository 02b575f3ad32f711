//! `muster submit`: its flags, the spec and secrets they make, and the call.

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use serde_json::json;

use crate::alloc::print_explanation;
use crate::args::parse_duration_s;
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
    /// The most processes and threads one task may have on a node that
    /// contains tasks (0: the node agent's --pids-max, 4096 by default).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pids_max: u32,
    /// Wait for these allocations before being queued: ID (it must
    /// succeed), ID:any (end), ID:notok (fail or be cancelled) or
    /// ID:started; repeated or comma-joined, all must be met. Until then it
    /// is `waiting`; a dependency that can never be met fails it at once.
    #[arg(long, value_name = "ID[:ok|any|notok|started]")]
    after: Vec<String>,
    /// Like --after, but the first dependency met is enough.
    #[arg(long, value_name = "ID[:ok|any|notok|started]", conflicts_with = "after")]
    after_any_of: Vec<String>,
    /// When a dependency can never be met, stay waiting (until cancelled)
    /// instead of failing.
    #[arg(long)]
    keep_if_unsatisfiable: bool,
    /// Submit a job array: one element per index, in Slurm's form (0-9999,
    /// 1,3,5-11:2), with an optional %N throttle on how many run at once
    /// (0-9999%64). One submit; elements get MUSTER_ARRAY_INDEX and
    /// SLURM_ARRAY_TASK_ID.
    #[arg(long, short = 'a', value_name = "INDICES[%N]")]
    array: Option<String>,
    /// With --array: element k waits for element k of this array to
    /// succeed (and fails if it fails).
    #[arg(long, value_name = "ARRAY", requires = "array")]
    after_corr: Option<u64>,
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
    /// Submit a workflow instead: the steps in this TOML file (each an
    /// allocation or an array, with `after` naming other steps), accepted
    /// or refused whole, in one submit (docs/workflows.md).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["array", "after", "after_any_of", "name", "dry_run"])]
    workflow: Option<std::path::PathBuf>,
    /// Run each task in this container image (a reference by tag or
    /// digest, as `docker pull` takes it: busybox, ghcr.io/acme/train:v3,
    /// 127.0.0.1:5000/t/bb@sha256:…). Without a command after --, the
    /// image's ENTRYPOINT and CMD run (docs/containers.md).
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// With --image: a host path the task sees inside the image, SRC:DST,
    /// SRC:DST:ro or SRC:DST:rw (repeatable; the node's agent mounts only
    /// paths its operator allows).
    #[arg(long = "mount", value_name = "SRC:DST[:ro]", requires = "image")]
    mounts: Vec<String>,
    /// With --image: where the command starts (default: the image's
    /// WORKDIR, else /).
    #[arg(long, value_name = "DIR", requires = "image")]
    workdir: Option<String>,
    /// The command each task runs.
    #[arg(required_unless_present_any = ["workflow", "image"], last = true)]
    command: Vec<String>,
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

pub fn spec_of(args: &SubmitArgs) -> anyhow::Result<v1::AllocationSpec> {
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
    let (flag, lists) =
        if args.after_any_of.is_empty() { ("--after", &args.after) } else { ("--after-any-of", &args.after_any_of) };
    let after = if lists.is_empty() {
        Vec::new()
    } else {
        muster_scheduler::sm::parse_after(&lists.join(",")).map_err(|e| anyhow::anyhow!("{flag} {e}"))?
    };
    if args.keep_if_unsatisfiable && after.is_empty() {
        bail!("--keep-if-unsatisfiable needs --after or --after-any-of");
    }
    if let Some(image) = &args.image {
        muster_scheduler::sm::ImageRef::parse(image).map_err(|e| anyhow::anyhow!("--image {image:?}: {e}"))?;
    }
    for m in &args.mounts {
        muster_scheduler::sm::Mount::parse(m).map_err(|e| anyhow::anyhow!("--mount {e}"))?;
    }
    if let Some(w) = &args.workdir {
        muster_scheduler::sm::check_container_path("--workdir", w).map_err(|e| anyhow::anyhow!("{e}"))?;
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
        pids_max: args.pids_max,
        after: after.iter().map(|d| v1::Dependency { id: d.on, when: d.when.as_str().to_string() }).collect(),
        after_any_of: !args.after_any_of.is_empty(),
        keep_if_unsatisfiable: args.keep_if_unsatisfiable,
        image: args.image.clone().unwrap_or_default(),
        mounts: args.mounts.clone(),
        workdir: args.workdir.clone().unwrap_or_default(),
    })
}

pub async fn submit(cluster: &mut Cluster, args: SubmitArgs, out: Output) -> anyhow::Result<()> {
    // Whatever spec_of and secrets_of refuse is the command line's fault
    // (exit 2); what the server refuses is the request's (exit 1).
    let bad = |e: anyhow::Error| anyhow::Error::new(crate::BadCommandLine(format!("{e:#}")));
    if let Some(path) = &args.workflow {
        if !args.command.is_empty() {
            return Err(bad(anyhow::anyhow!("--workflow takes its commands from the file, not after --")));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(anyhow::anyhow!("--workflow {}: {e}", path.display())))?;
        let dir = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_default();
        let req = crate::workflow::request_of(&text, &dir, args.queue_if_unsatisfiable)
            .map_err(|e| bad(e.context(format!("--workflow {}", path.display()))))?;
        let resp = cluster
            .call(|ch| {
                let req = req.clone();
                async move { AllocationServiceClient::new(ch).submit_workflow(req).await }
            })
            .await?
            .into_inner();
        crate::workflow::print(&resp, out);
        return Ok(());
    }
    let spec = spec_of(&args).map_err(bad)?;
    let secrets = secrets_of(&args).map_err(bad)?;
    let (dry_run, queue_if_unsatisfiable) = (args.dry_run, args.queue_if_unsatisfiable);
    // Checked here for a clear message; the server checks again.
    let array = match &args.array {
        Some(expr) => {
            muster_scheduler::sm::ArrayIndices::parse(expr).map_err(|e| bad(anyhow::anyhow!("--array {e}")))?;
            expr.clone()
        }
        None => String::new(),
    };
    let after_corr = args.after_corr.unwrap_or_default();
    let resp = cluster
        .call(|ch| {
            let req = v1::SubmitRequest {
                spec: Some(spec.clone()),
                dry_run,
                secrets: secrets.clone(),
                queue_if_unsatisfiable,
                array: array.clone(),
                after_corr,
            };
            async move { AllocationServiceClient::new(ch).submit(req).await }
        })
        .await?
        .into_inner();
    if let Some(plan) = resp.plan {
        print_explanation("dry run", &plan, out)?;
        return Ok(());
    }
    let n = resp.array_count;
    match out {
        Output::Json if n > 0 => out!(
            "{}",
            json!({ "id": resp.id, "duplicate": resp.duplicate, "array": true, "elements": n,
                    "first_element": resp.id + 1, "last_element": resp.id + n })
        ),
        Output::Json => out!("{}", json!({ "id": resp.id, "duplicate": resp.duplicate })),
        Output::Text if resp.duplicate && n > 0 => {
            out!("array {} (already submitted with this idempotency key)", resp.id)
        }
        Output::Text if resp.duplicate => {
            out!("allocation {} (already submitted with this idempotency key)", resp.id)
        }
        Output::Text if n > 0 => {
            out!("array {} submitted: {n} elements, allocations {} to {}", resp.id, resp.id + 1, resp.id + n)
        }
        Output::Text => out!("allocation {} submitted", resp.id),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_tasks_own_pids_limit() {
        assert_eq!(spec(&[]).unwrap().pids_max, 0, "the agent's default unless asked");
        assert_eq!(spec(&["--pids-max", "64"]).unwrap().pids_max, 64);
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
