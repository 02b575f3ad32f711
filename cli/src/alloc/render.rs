//! Everything `muster alloc` prints, text and JSON, in one place: the
//! subcommands fetch, this module shows.

use muster_proto::v1;
use serde_json::json;

use crate::output::Output;

/// An allocation status's name, as the CLI prints and filters it.
pub fn status_name(raw: i32) -> &'static str {
    match v1::AllocationStatus::try_from(raw) {
        Ok(v1::AllocationStatus::Queued) => "queued",
        Ok(v1::AllocationStatus::Suspended) => "suspended",
        Ok(v1::AllocationStatus::Reserved) => "reserved",
        Ok(v1::AllocationStatus::Running) => "running",
        Ok(v1::AllocationStatus::TearingDown) => "tearing-down",
        Ok(v1::AllocationStatus::Done) => "done",
        Ok(v1::AllocationStatus::Failed) => "failed",
        Ok(v1::AllocationStatus::Cancelled) => "cancelled",
        Ok(v1::AllocationStatus::Waiting) => "waiting",
        _ => "unknown",
    }
}

/// A task status's name: `running`, `preempting`, ….
pub fn task_status_name(raw: i32) -> String {
    v1::TaskStatus::try_from(raw)
        .map(|s| s.as_str_name().trim_start_matches("TASK_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

/// An allocation as JSON: its fields, its spec's, and times in RFC 3339.
pub fn alloc_json(a: &v1::Allocation) -> serde_json::Value {
    let mut v = alloc_json_fields(a);
    let spec = a.spec.clone().unwrap_or_default();
    // Plain environment is readable by whoever reads the allocation;
    // secrets show only their names.
    v["env"] = json!(spec.env);
    v["name"] = json!(spec.name);
    v["secrets"] = json!(a.secret_names);
    v["array_id"] = json!((a.array_id != 0).then_some(a.array_id));
    v["array_index"] = json!((a.array_id != 0).then_some(a.array_index));
    // Times beside their milliseconds, in RFC 3339 (UTC): submitted, the
    // first task's start, the end.
    let rfc3339 = |ms: Option<u64>| ms.map(muster_scheduler::server::api::convert::format_time_ms);
    let started_ms = crate::alloc::list::started_ms(a);
    v["submit_time"] = json!(rfc3339(Some(a.submit_time_ms)));
    v["started_at_ms"] = json!(started_ms);
    v["started_at"] = json!(rfc3339(started_ms));
    v["finished_at_ms"] = json!(a.finished_at_ms);
    v["finished_at"] = json!(rfc3339(a.finished_at_ms));
    v["retry_after"] = json!(rfc3339(Some(a.retry_after_ms).filter(|&ms| ms > 0)));
    v["retry_after_ms"] = json!(a.retry_after_ms);
    v["teardowns"] = json!(a.preemption_epoch);
    v["failures"] = json!(a.failures);
    v["image_pull_failures"] = json!(a.image_pull_failures);
    v["failed_reason"] = json!(a.failed_reason);
    v["compacted"] = json!(a.compacted);
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

/// The allocation's fields and its spec's, without times or env.
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
    v["after"] = json!(spec.after.iter().map(|d| json!({"id": d.id, "when": d.when})).collect::<Vec<_>>());
    v["after_any_of"] = json!(spec.after_any_of);
    v["keep_if_unsatisfiable"] = json!(spec.keep_if_unsatisfiable);
    v["image"] = json!(spec.image);
    v["mounts"] = json!(spec.mounts);
    v["workdir"] = json!(spec.workdir);
    v
}

/// What an allocation waits for, as `--after` spells it: "12:ok, 13:notok"
/// (prefixed "the first of " for --after-any-of); `None` without any.
fn after_line(spec: &v1::AllocationSpec) -> Option<String> {
    if spec.after.is_empty() {
        return None;
    }
    let list = spec.after.iter().map(|d| format!("{}:{}", d.id, d.when)).collect::<Vec<_>>().join(", ");
    let keep = if spec.keep_if_unsatisfiable { "; kept waiting if they can never be met" } else { "" };
    Some(if spec.after_any_of { format!("the first of {list}{keep}") } else { format!("{list}{keep}") })
}

/// `alloc get`: the allocation's row, then its history, teardown, ports,
/// nomination and one line per task.
pub fn allocation(a: &v1::Allocation, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        out!("{}", serde_json::to_string_pretty(&alloc_json(a))?);
        return Ok(());
    }
    let columns = super::list::parse_columns(super::list::DEFAULT_COLUMNS)?;
    for line in super::list::table(&columns, std::slice::from_ref(a), crate::output::now_ms()) {
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
    if a.array_id != 0 {
        out!("          element {} of array {}", a.array_index, a.array_id);
    }
    if a.compacted {
        out!(
            "          compacted: from its job-history record (no environment, events or checkpoints; each task's \
             last attempt; muster history --id {})",
            a.id
        );
    }
    if let Some(after) = a.spec.as_ref().and_then(after_line) {
        out!("          after: {after}");
    }
    if let Some(spec) = a.spec.as_ref().filter(|s| !s.image.is_empty()) {
        out!("          image: {}", spec.image);
        for m in &spec.mounts {
            out!("          mount: {m}");
        }
        if !spec.workdir.is_empty() {
            out!("          workdir: {}", spec.workdir);
        }
    }
    if !a.failed_reason.is_empty() {
        out!("          failed: {}", a.failed_reason);
    }
    if a.retry_after_ms > now && a.finished_at_ms.is_none() {
        out!("          backing off: placed again {}", crate::output::when(a.retry_after_ms, now));
    }
    if let Some(f) = &a.last_failure {
        let mut how = muster_scheduler::sm::how_it_ended(f.not_started, f.exit_code);
        if f.oom_killed {
            let oom =
                muster_scheduler::sm::OomKill { limit_bytes: f.memory_limit_bytes, peak_bytes: f.peak_memory_bytes };
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
    Ok(())
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

/// `alloc cancel`'s outcome: each allocation cancelled (or stopping) and
/// each refusal (JSON names both; text prints refusals on stderr later).
pub fn cancelled(done: &[v1::Allocation], refused: &[(u64, anyhow::Error)], out: Output) -> anyhow::Result<()> {
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
            for a in done {
                let id = a.id;
                if a.status == v1::AllocationStatus::TearingDown as i32 {
                    let stopping = a.tasks.iter().filter(|t| t.status == v1::TaskStatus::Preempting as i32).count();
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
    Ok(())
}

/// One event of `alloc watch`; text output prints the header before the
/// first one (`header_shown` remembers it).
pub fn event(e: &v1::AllocationEvent, header_shown: &mut bool, out: Output) {
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
            if !*header_shown {
                *header_shown = true;
                out!("{:>5}  {:<20}  {:<13}  {:<22}  DETAIL", "REV", "TIME", "STATUS", "EVENT");
            }
            out!(
                "{:>5}  {:<20}  {:<13}  {:<22}  {}",
                e.revision,
                muster_scheduler::server::api::convert::format_time_ms(e.time_ms),
                status_name(e.status),
                e.kind,
                e.detail
            )
        }
    }
}

/// `alloc list`: the rows in the chosen columns, or JSON with the token
/// of the next page.
pub fn list(
    rows: &[v1::Allocation],
    arrays: &[v1::JobArray],
    columns: &[&str],
    token: u64,
    now_ms: u64,
    out: Output,
) -> anyhow::Result<()> {
    match out {
        Output::Json => {
            let list: Vec<_> = rows.iter().map(alloc_json).collect();
            let arrays: Vec<_> = arrays.iter().map(array_json).collect();
            out!(
                "{}",
                serde_json::to_string_pretty(
                    &json!({ "allocations": list, "arrays": arrays, "next_page_token": token })
                )?
            );
        }
        Output::Text if rows.is_empty() && arrays.is_empty() => out!("no allocations"),
        Output::Text => {
            if !rows.is_empty() {
                for line in super::list::table(columns, rows, now_ms) {
                    out!("{line}");
                }
            }
            if !arrays.is_empty() {
                if !rows.is_empty() {
                    out!("");
                }
                for line in super::list::array_table(arrays) {
                    out!("{line}");
                }
            }
            if token != 0 {
                out!("(more: --all, or continue after allocation {token})");
            }
        }
    }
    Ok(())
}

/// A job array as JSON.
pub fn array_json(a: &v1::JobArray) -> serde_json::Value {
    json!({
        "id": a.id,
        "name": a.name,
        "owner": a.owner,
        "indices": a.indices,
        "throttle": a.throttle,
        "count": a.count,
        "first_element": a.id + 1,
        "last_element": a.id + a.count,
        "pending": a.pending,
        "by_status": a.by_status,
        "status": a.status,
        "finished": a.finished,
        "submit_time_ms": a.submit_time_ms,
        "after_corr": (a.after_corr != 0).then_some(a.after_corr),
        "command": a.spec.as_ref().map(|s| s.command.clone()).unwrap_or_default(),
    })
}

/// Prints one workflow and where each step stands.
pub fn workflow(w: &v1::WorkflowInfo, out: Output) -> anyhow::Result<()> {
    let steps: Vec<serde_json::Value> =
        w.steps.iter().map(|s| json!({ "name": s.name, "id": s.id, "array": s.array, "status": s.status })).collect();
    if out == Output::Json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "id": w.id, "workflow": true, "name": w.name, "owner": w.owner, "finished": w.finished,
                "submit_time_ms": w.submit_time_ms, "steps": steps,
            }))?
        );
        return Ok(());
    }
    let state = if w.finished { "finished" } else { "running" };
    out!("workflow {} {} of {}: {state}", w.id, w.name, w.owner);
    let width = w.steps.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in &w.steps {
        let kind = if s.array { "array" } else { "allocation" };
        out!("  {:<width$}  {kind} {}  {}", s.name, s.id, s.status);
    }
    Ok(())
}

/// Prints one job array.
pub fn array(a: &v1::JobArray, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        out!("{}", serde_json::to_string_pretty(&array_json(a))?);
        return Ok(());
    }
    for line in super::list::array_table(std::slice::from_ref(a)) {
        out!("{line}");
    }
    out!("elements: allocations {} to {} (element k is allocation {} + k)", a.id + 1, a.id + a.count, a.id + 1);
    if a.after_corr != 0 {
        out!("after-corr: element k waits for element k of array {}", a.after_corr);
    }
    if let Some(s) = &a.spec {
        out!("command: {}", s.command.join(" "));
    }
    Ok(())
}

/// "pulling its image IMAGE: 120 MiB of 210 MiB (57 %), 3 s so far".
fn pull_progress(p: &v1::ImagePullProgress) -> String {
    let bytes = muster_scheduler::words::bytes;
    let so_far = if p.total_bytes == 0 {
        "reading its manifest".to_string()
    } else {
        format!(
            "{} of {} ({} %)",
            bytes(p.done_bytes),
            bytes(p.total_bytes),
            p.done_bytes.saturating_mul(100) / p.total_bytes.max(1)
        )
    };
    format!("pulling its image {}: {so_far}, {} so far", p.image, crate::output::duration(p.elapsed_ms))
}

/// Prints an explanation (of a pending allocation, or a dry run): the
/// summary, the node classes, and what preemption would do.
/// A wait timeline as JSON.
pub fn waits_json(waits: &[v1::WaitSpan]) -> serde_json::Value {
    json!(
        waits
            .iter()
            .map(|w| json!({
                "since_ms": w.since_ms,
                "duration_ms": w.duration_ms,
                "wait": w.wait,
                "detail": w.detail,
                "holders": w.holders.iter().map(|h| json!({
                    "id": h.id, "owner": h.owner, "preemption_class": h.preemption_class,
                })).collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>()
    )
}

/// A wait timeline as text: one line per change, with how long it lasted.
pub fn wait_timeline(waits: &[v1::WaitSpan], dropped: u32) {
    if waits.is_empty() {
        return;
    }
    out!("wait timeline:");
    if dropped > 0 {
        out!("  ({dropped} older changes not kept)");
    }
    for w in waits {
        out!(
            "  {}  {:>11}  {:<13}  {}",
            muster_scheduler::server::api::convert::format_time_ms(w.since_ms),
            crate::output::duration(w.duration_ms),
            w.wait,
            w.detail
        );
    }
}

pub fn explanation(what: &str, e: &v1::Explanation, out: Output) -> anyhow::Result<()> {
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
                "pulls": e.pulls.iter().map(|p| json!({
                    "task": p.task, "node": p.node_id, "image": p.image, "done_bytes": p.done_bytes,
                    "total_bytes": p.total_bytes, "elapsed_ms": p.elapsed_ms,
                })).collect::<Vec<_>>(),
                "waited_ms": e.waited_ms,
                "waits": waits_json(&e.waits),
                "waits_dropped": e.waits_dropped,
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
            for p in &e.pulls {
                out!("task {} on {}: {}", p.task, p.node_id, pull_progress(p));
            }
            wait_timeline(&e.waits, e.waits_dropped);
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
