//! `muster alloc`: get, cancel, watch, logs and explain (the table and the
//! filters of `alloc list` are in `alloc_list`, submitting in `submit`).

use anyhow::bail;
use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;
use serde_json::json;

use crate::client::Cluster;
use crate::output::Output;

/// Parses `90`, `90s`, `30m`, `4h`, `2d` into seconds.
pub fn parse_duration_s(s: &str) -> anyhow::Result<u64> {
    muster_scheduler::sm::parse_duration_s(s).map_err(anyhow::Error::msg)
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
        "oom_killed": f.oom_killed,
        "memory_limit_bytes": f.oom_killed.then_some(f.memory_limit_bytes),
        "peak_memory_bytes": f.oom_killed.then_some(f.peak_memory_bytes),
    })));
    v
}

fn alloc_json_fields(a: &v1::Allocation) -> serde_json::Value {
    let spec = a.spec.clone().unwrap_or_default();
    let r = spec.resources.unwrap_or_default();
    let mut v = json!({
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
    });
    v["pids_max"] = json!(spec.pids_max);
    v
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
                        let mut how = muster_scheduler::sm::how_it_ended(f.not_started, f.exit_code);
                        if f.oom_killed {
                            let oom = muster_scheduler::sm::OomKill {
                                limit_bytes: f.memory_limit_bytes,
                                peak_bytes: f.peak_memory_bytes,
                            };
                            how = format!("{}, {how}", oom.describe());
                        }
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
pub(crate) fn print_explanation(what: &str, e: &v1::Explanation, out: Output) -> anyhow::Result<()> {
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
}
