//! `muster history` and `muster usage`: the job history of finished
//! allocations, as text, JSON or CSV.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use muster_proto::v1;
use muster_proto::v1::history_service_client::HistoryServiceClient;
use muster_scheduler::server::api::convert::format_time_ms;
use serde_json::json;

use crate::client::Cluster;

/// How `history` and `usage` print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum TableOutput {
    /// Aligned columns with a header row.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// CSV with a header row (RFC 4180 quoting; times in RFC 3339 UTC).
    Csv,
}

/// Allocation `id`'s history record, if the history holds it.
pub async fn record(cluster: &mut Cluster, id: u64) -> anyhow::Result<Option<v1::HistoryRecord>> {
    let q = v1::HistoryQuery { id, limit: 1, ..Default::default() };
    let page = cluster
        .call(|ch| {
            let q = q.clone();
            async move { HistoryServiceClient::new(ch).list_history(q).await }
        })
        .await?
        .into_inner();
    warn_missing(page.missing);
    Ok(page.records.into_iter().next())
}

/// A record's wait timeline, back in the core's form (for its summary).
pub fn wait_log(r: &v1::HistoryRecord) -> muster_scheduler::sm::WaitLog {
    use muster_scheduler::sm::{Wait, WaitHolder, WaitSpan};
    muster_scheduler::sm::WaitLog {
        spans: r
            .waits
            .iter()
            .filter_map(|w| {
                Some(WaitSpan {
                    since_ms: w.since_ms,
                    wait: Wait::parse(&w.wait)?,
                    holders: w
                        .holders
                        .iter()
                        .map(|h| WaitHolder::new(h.id, &h.owner, h.preemption_class.min(255) as u8))
                        .collect(),
                })
            })
            .collect(),
        dropped: r.waits_dropped,
    }
}

/// `muster history`.
#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Only this allocation.
    #[arg(long)]
    id: Option<u64>,
    /// Only this owner's.
    #[arg(long)]
    owner: Option<String>,
    /// Only this vCluster's.
    #[arg(long)]
    vcluster: Option<String>,
    /// Only this job array's elements.
    #[arg(long, value_name = "ARRAY")]
    array: Option<u64>,
    /// Only those that ended so: done, failed or cancelled.
    #[arg(long)]
    status: Option<String>,
    /// Only those that ended at or after this: an RFC 3339 UTC time
    /// (2026-11-24, 2026-11-24T09:30:00Z) or a duration ago (90m, 7d).
    #[arg(long)]
    since: Option<String>,
    /// Only those that ended before this (same forms as --since).
    #[arg(long)]
    until: Option<String>,
    /// At most this many, in the order they finished.
    #[arg(long, default_value_t = 1000)]
    limit: u64,
    /// Show every attempt of every task under its allocation (text), or
    /// one row per attempt (CSV).
    #[arg(long)]
    attempts: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TableOutput::Text)]
    output: TableOutput,
}

/// Bytes as MiB (GiB from 10 GiB up), as the tables show memory.
fn mib(bytes: u64) -> String {
    let mib = bytes.div_ceil(1 << 20);
    if mib >= 10 * 1024 { format!("{:.1} GiB", mib as f64 / 1024.0) } else { format!("{mib} MiB") }
}

/// CPU time: "850 ms", "12.3 s", "1.5 h".
fn cpu_time(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..3_600_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

/// `muster usage`.
#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Start of the period (same forms as `history --since`).
    #[arg(long, default_value = "30d")]
    since: String,
    /// End of the period (default: now).
    #[arg(long)]
    until: Option<String>,
    /// Group rows by owner, vcluster, owner,vcluster, or array (one row
    /// per job array; array 0 holds each owner's allocations of no array).
    #[arg(long, default_value = "owner,vcluster")]
    by: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TableOutput::Text)]
    output: TableOutput,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Parses `--since`/`--until`: an RFC 3339 UTC date or time, or a duration
/// before `now_ms`.
pub fn parse_when(flag: &str, s: &str, now_ms: u64) -> anyhow::Result<u64> {
    let bad = || {
        anyhow::anyhow!(
            "{flag} {s:?}: give an RFC 3339 UTC time (2026-11-24 or 2026-11-24T09:30:00Z) or a duration ago (90m, 7d)"
        )
    };
    if s.as_bytes().first().is_some_and(|b| b.is_ascii_digit()) && s.len() >= 10 && s.as_bytes()[4] == b'-' {
        let (date, time) = match s.split_once(['T', ' ']) {
            Some((d, t)) => (d, t.trim_end_matches('Z')),
            None => (s, "00:00:00"),
        };
        let num = |v: &str| v.parse::<i64>().map_err(|_| bad());
        let parts: Vec<&str> = date.split('-').collect();
        let [y, m, d] = parts[..] else { return Err(bad()) };
        let (y, m, d) = (num(y)?, num(m)?, num(d)?);
        if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(bad());
        }
        let hms: Vec<&str> = time.split(':').collect();
        let (h, mi, sec) = match hms[..] {
            [h, mi] => (num(h)?, num(mi)?, 0),
            [h, mi, sec] => (num(h)?, num(mi)?, num(sec.split('.').next().unwrap_or(sec))?),
            _ => return Err(bad()),
        };
        if h > 23 || mi > 59 || sec > 60 {
            return Err(bad());
        }
        let secs = muster_scheduler::words::days_from_civil(y, m, d) * 86_400 + h * 3_600 + mi * 60 + sec;
        return Ok(secs as u64 * 1000);
    }
    let ago = crate::args::parse_duration_s(s).map_err(|_| bad())?;
    Ok(now_ms.saturating_sub(ago.saturating_mul(1000)))
}

fn status_arg(s: &str) -> anyhow::Result<v1::AllocationStatus> {
    Ok(match s {
        "done" => v1::AllocationStatus::Done,
        "failed" => v1::AllocationStatus::Failed,
        "cancelled" => v1::AllocationStatus::Cancelled,
        other => bail!("--status {other:?}: the history holds done, failed and cancelled allocations"),
    })
}

fn status_name(raw: i32) -> &'static str {
    match v1::AllocationStatus::try_from(raw) {
        Ok(v1::AllocationStatus::Done) => "done",
        Ok(v1::AllocationStatus::Failed) => "failed",
        Ok(v1::AllocationStatus::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

fn time_or_dash(ms: u64) -> String {
    if ms == 0 { "-".into() } else { format_time_ms(ms) }
}

fn elapsed(r: &v1::HistoryRecord) -> String {
    if r.start_time_ms == 0 {
        return "-".into();
    }
    let s = r.end_time_ms.saturating_sub(r.start_time_ms) / 1000;
    format!("{}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

fn gpu_hours(gpu_s: u64) -> String {
    format!("{:.2}", gpu_s as f64 / 3600.0)
}

/// One CSV field, quoted when it must be.
fn csv(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

fn csv_row(fields: &[String]) -> String {
    fields.iter().map(|f| csv(f)).collect::<Vec<_>>().join(",")
}

/// The header and each row as lines of columns padded to a common width.
fn aligned(header: &[&str], rows: &[Vec<String>]) -> (String, Vec<String>) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([header[i].chars().count()]).max().unwrap_or(0))
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        cells.zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let head = line(&mut header.iter().copied());
    (head, rows.iter().map(|r| line(&mut r.iter().map(String::as_str))).collect())
}

fn warn_missing(missing: u64) {
    if missing > 0 {
        eprintln!(
            "muster: note: the replica that answered still lacks {missing} record(s) (it is fetching them from its \
             peers); the answer may be incomplete"
        );
    }
}

/// `muster history`.
pub async fn history(cluster: &mut Cluster, args: HistoryArgs) -> anyhow::Result<()> {
    let now = now_ms();
    let since_ms = args.since.as_deref().map(|s| parse_when("--since", s, now)).transpose()?.unwrap_or(0);
    let until_ms = args.until.as_deref().map(|s| parse_when("--until", s, now)).transpose()?.unwrap_or(0);
    if until_ms != 0 && until_ms <= since_ms {
        bail!("--until must be after --since");
    }
    if args.limit == 0 {
        bail!("--limit must be at least 1");
    }
    let status = args.status.as_deref().map(status_arg).transpose()?;
    let mut records: Vec<v1::HistoryRecord> = Vec::new();
    let mut after_seq = 0;
    let mut missing;
    loop {
        let want = (args.limit - records.len() as u64).min(10_000) as u32;
        let q = v1::HistoryQuery {
            id: args.id.unwrap_or(0),
            owner: args.owner.clone().unwrap_or_default(),
            vcluster: args.vcluster.clone().unwrap_or_default(),
            array_id: args.array.unwrap_or(0),
            status: status.map_or(0, |s| s as i32),
            since_ms,
            until_ms,
            after_seq,
            limit: want,
        };
        let page = cluster
            .call(|ch| {
                let q = q.clone();
                async move { HistoryServiceClient::new(ch).max_decoding_message_size(64 << 20).list_history(q).await }
            })
            .await?
            .into_inner();
        missing = page.missing;
        records.extend(page.records);
        if page.next_after_seq == 0 || records.len() as u64 >= args.limit {
            break;
        }
        after_seq = page.next_after_seq;
    }
    warn_missing(missing);
    if args.id.is_some() && records.is_empty() {
        bail!("allocation {} has no history record (it has not finished, or never existed)", args.id.unwrap_or(0));
    }
    print_history(&records, args.attempts, args.output)
}

fn print_history(records: &[v1::HistoryRecord], attempts: bool, output: TableOutput) -> anyhow::Result<()> {
    match output {
        TableOutput::Json => {
            let list: Vec<serde_json::Value> = records.iter().map(record_json).collect();
            out!("{}", serde_json::to_string_pretty(&list)?);
        }
        TableOutput::Csv if attempts => {
            out!(
                "{}",
                "id,task,attempt,node,start,end,outcome,exit_code,gpu_seconds,preempted,watchdog,owner,vcluster,status,\
                 peak_memory_bytes,cpu_ms,oom_kills,memory_limit_bytes,gpu_util_pct,peak_gpu_memory_bytes"
            );
            for r in records {
                for a in &r.attempts {
                    out!(
                        "{}",
                        csv_row(&[
                            r.id.to_string(),
                            a.task.to_string(),
                            a.attempt.to_string(),
                            a.node_id.clone(),
                            format_time_ms(a.start_ms),
                            format_time_ms(a.end_ms),
                            a.outcome.clone(),
                            a.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                            a.gpu_seconds.to_string(),
                            a.preempted.to_string(),
                            a.watchdog.clone(),
                            r.owner.clone(),
                            r.vcluster.clone(),
                            status_name(r.status).to_string(),
                            a.usage.map(|u| u.peak_memory_bytes.to_string()).unwrap_or_default(),
                            a.usage.map(|u| u.cpu_ms.to_string()).unwrap_or_default(),
                            a.usage.map(|u| u.oom_kills.to_string()).unwrap_or_default(),
                            a.usage.map(|u| u.memory_limit_bytes.to_string()).unwrap_or_default(),
                            a.usage.and_then(|u| u.gpu_util_pct).map(|p| p.to_string()).unwrap_or_default(),
                            a.usage.map(|u| u.peak_gpu_memory_bytes.to_string()).unwrap_or_default(),
                        ])
                    );
                }
            }
        }
        TableOutput::Csv => {
            out!(
                "{}",
                "id,owner,vcluster,status,class,gang_size,gpus_per_task,submitted,started,ended,gpu_seconds,\
                 preemptions,watchdog_trips,attempts,reason,command"
            );
            for r in records {
                out!(
                    "{}",
                    csv_row(&[
                        r.id.to_string(),
                        r.owner.clone(),
                        r.vcluster.clone(),
                        status_name(r.status).to_string(),
                        r.preemption_class.to_string(),
                        r.gang_size.to_string(),
                        r.resources.as_ref().map_or(0, |x| x.gpus).to_string(),
                        format_time_ms(r.submit_time_ms),
                        if r.start_time_ms == 0 { String::new() } else { format_time_ms(r.start_time_ms) },
                        format_time_ms(r.end_time_ms),
                        r.gpu_seconds.to_string(),
                        r.preemptions.to_string(),
                        r.watchdog_trips.to_string(),
                        r.attempts.len().to_string(),
                        r.reason.clone(),
                        r.command.join(" "),
                    ])
                );
            }
        }
        TableOutput::Text => {
            let header =
                ["ID", "OWNER", "VCLUSTER", "STATUS", "CLASS", "GANG", "SUBMITTED", "ENDED", "ELAPSED", "GPU-H"];
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    vec![
                        r.id.to_string(),
                        r.owner.clone(),
                        r.vcluster.clone(),
                        status_name(r.status).to_string(),
                        r.preemption_class.to_string(),
                        format!("{}×{}", r.gang_size, r.resources.as_ref().map_or(0, |x| x.gpus)),
                        format_time_ms(r.submit_time_ms),
                        format_time_ms(r.end_time_ms),
                        elapsed(r),
                        gpu_hours(r.gpu_seconds),
                    ]
                })
                .collect();
            let (head, lines) = aligned(&header, &rows);
            out!("{head}");
            for (r, line) in records.iter().zip(lines) {
                out!("{line}");
                if !r.reason.is_empty() && r.status != v1::AllocationStatus::Done as i32 {
                    out!("    reason: {}", r.reason);
                }
                if attempts {
                    for a in &r.attempts {
                        let exit = match a.exit_code {
                            Some(c) => format!("exit {c}"),
                            None => "no exit code".into(),
                        };
                        let mut notes = Vec::new();
                        if a.preempted {
                            notes.push("preempted".to_string());
                        }
                        if !a.watchdog.is_empty() {
                            notes.push(format!("{} watchdog", a.watchdog));
                        }
                        if let Some(u) = a.usage {
                            if u.oom_kills > 0 {
                                notes.push(format!("out of memory at its {} limit", mib(u.memory_limit_bytes)));
                            }
                            notes.push(format!("peak {}", mib(u.peak_memory_bytes)));
                            notes.push(format!("cpu {}", cpu_time(u.cpu_ms)));
                            if let Some(pct) = u.gpu_util_pct {
                                notes.push(format!("gpu {pct}%, gpu peak {}", mib(u.peak_gpu_memory_bytes)));
                            }
                        }
                        out!(
                            "    task {} attempt {} on {}: {} → {} {} ({exit}{}{})",
                            a.task,
                            a.attempt,
                            a.node_id,
                            time_or_dash(a.start_ms),
                            time_or_dash(a.end_ms),
                            a.outcome,
                            if notes.is_empty() { "" } else { "; " },
                            notes.join(", ")
                        );
                    }
                }
            }
            if records.is_empty() {
                eprintln!("muster: no finished allocation matches");
            }
        }
    }
    Ok(())
}

fn record_json(r: &v1::HistoryRecord) -> serde_json::Value {
    let mut v = json!({
        "id": r.id,
        "seq": r.seq,
        "owner": r.owner,
        "vcluster": r.vcluster,
        "preemption_class": r.preemption_class,
        "priority": r.priority,
        "gang_size": r.gang_size,
        "resources": r.resources.as_ref().map(|x| json!({
            "gpus": x.gpus, "vram_mb": x.vram_mb, "mem_mb": x.mem_mb, "cpus": x.cpus
        })),
        "command": r.command,
        "idempotency_key": (!r.idempotency_key.is_empty()).then_some(&r.idempotency_key),
        "submit_time": format_time_ms(r.submit_time_ms),
        "start_time": (r.start_time_ms != 0).then(|| format_time_ms(r.start_time_ms)),
        "end_time": format_time_ms(r.end_time_ms),
        "submit_time_ms": r.submit_time_ms,
        "start_time_ms": (r.start_time_ms != 0).then_some(r.start_time_ms),
        "end_time_ms": r.end_time_ms,
        "status": status_name(r.status),
        "reason": r.reason,
        "preemptions": r.preemptions,
        "watchdog_trips": r.watchdog_trips,
        "gpu_seconds": r.gpu_seconds,
        "attempts": r.attempts.iter().map(|a| json!({
            "task": a.task,
            "attempt": a.attempt,
            "node": a.node_id,
            "start_time_ms": a.start_ms,
            "end_time_ms": a.end_ms,
            "outcome": a.outcome,
            "exit_code": a.exit_code,
            "gpu_seconds": a.gpu_seconds,
            "preempted": a.preempted,
            "watchdog": (!a.watchdog.is_empty()).then_some(&a.watchdog),
            "usage": a.usage.map(|u| json!({
                "peak_memory_bytes": u.peak_memory_bytes,
                "cpu_ms": u.cpu_ms,
                "oom_kills": u.oom_kills,
                "memory_limit_bytes": u.memory_limit_bytes,
                "gpu_util_pct": u.gpu_util_pct,
                "peak_gpu_memory_bytes": u.peak_gpu_memory_bytes,
            })),
        })).collect::<Vec<_>>(),
    });
    v["array_id"] = json!((r.array_id != 0).then_some(r.array_id));
    v["array_index"] = json!((r.array_id != 0).then_some(r.array_index));
    v["waits"] = crate::alloc::render::waits_json(&r.waits);
    v["waits_dropped"] = json!(r.waits_dropped);
    v
}

/// `muster usage`.
pub async fn usage(cluster: &mut Cluster, args: UsageArgs) -> anyhow::Result<()> {
    let now = now_ms();
    let since_ms = parse_when("--since", &args.since, now)?;
    let until_ms = args.until.as_deref().map(|s| parse_when("--until", s, now)).transpose()?.unwrap_or(now);
    if until_ms <= since_ms {
        bail!("--until must be after --since");
    }
    let group_by = match args.by.as_str() {
        "owner" | "vcluster" | "owner,vcluster" | "array" => args.by.clone(),
        "vcluster,owner" => "owner,vcluster".into(),
        other => bail!("--by {other:?}: owner, vcluster, owner,vcluster or array"),
    };
    // Every page, in (owner, vcluster) order.
    let mut report = v1::UsageReport::default();
    let mut token = String::new();
    loop {
        let q = v1::UsageQuery { since_ms, until_ms, group_by: group_by.clone(), page_size: 10_000, page_token: token };
        let page = cluster
            .call(|ch| {
                let q = q.clone();
                async move { HistoryServiceClient::new(ch).usage(q).await }
            })
            .await
            .context("usage")?
            .into_inner();
        report.rows.extend(page.rows);
        report.missing = page.missing;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    warn_missing(report.missing);
    let by_array = group_by == "array";
    let (with_owner, with_vc) = (group_by != "vcluster", group_by != "owner" && !by_array);
    match args.output {
        TableOutput::Json => {
            let rows: Vec<serde_json::Value> = report
                .rows
                .iter()
                .map(|r| {
                    let mut v = json!({
                        "jobs": r.jobs, "done": r.done, "failed": r.failed, "cancelled": r.cancelled,
                        "gpu_seconds": r.gpu_seconds, "gpu_hours": r.gpu_seconds as f64 / 3600.0,
                        "cpu_ms": r.cpu_ms, "cpu_hours": r.cpu_ms as f64 / 3_600_000.0,
                        "peak_memory_bytes": r.peak_memory_bytes, "oom_killed": r.oom_killed,
                    });
                    if with_owner {
                        v["owner"] = json!(r.owner);
                    }
                    if with_vc {
                        v["vcluster"] = json!(r.vcluster);
                    }
                    if by_array {
                        v["array"] = json!((r.array_id != 0).then_some(r.array_id));
                    }
                    v
                })
                .collect();
            out!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "since": format_time_ms(since_ms),
                    "until": format_time_ms(until_ms),
                    "rows": rows,
                }))?
            );
        }
        TableOutput::Csv | TableOutput::Text => {
            let mut header: Vec<&str> = Vec::new();
            if with_owner {
                header.push("OWNER");
            }
            if with_vc {
                header.push("VCLUSTER");
            }
            if by_array {
                header.push("ARRAY");
            }
            header.extend(["JOBS", "DONE", "FAILED", "CANCELLED", "GPU-HOURS", "CPU-HOURS", "PEAK-MEM", "OOM"]);
            let rows: Vec<Vec<String>> = report
                .rows
                .iter()
                .map(|r| {
                    let mut cells = Vec::new();
                    if with_owner {
                        cells.push(r.owner.clone());
                    }
                    if with_vc {
                        cells.push(r.vcluster.clone());
                    }
                    if by_array {
                        cells.push(if r.array_id == 0 { "-".to_string() } else { r.array_id.to_string() });
                    }
                    cells.extend([
                        r.jobs.to_string(),
                        r.done.to_string(),
                        r.failed.to_string(),
                        r.cancelled.to_string(),
                        gpu_hours(r.gpu_seconds),
                        format!("{:.2}", r.cpu_ms as f64 / 3_600_000.0),
                        if args.output == TableOutput::Csv {
                            r.peak_memory_bytes.to_string()
                        } else {
                            mib(r.peak_memory_bytes)
                        },
                        r.oom_killed.to_string(),
                    ]);
                    cells
                })
                .collect();
            if args.output == TableOutput::Csv {
                out!("{}", header.iter().map(|h| h.to_lowercase().replace('-', "_")).collect::<Vec<_>>().join(","));
                for r in &rows {
                    out!("{}", csv_row(r));
                }
                return Ok(());
            }
            out!("usage from {} to {}", format_time_ms(since_ms), format_time_ms(until_ms));
            let (head, lines) = aligned(&header, &rows);
            out!("{head}");
            for line in lines {
                out!("{line}");
            }
            if report.rows.is_empty() {
                eprintln!("muster: nothing finished in that period");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_rfc3339_or_a_duration_ago() {
        let now = 1_795_000_000_000;
        assert_eq!(parse_when("--since", "1970-01-02", now).unwrap(), 86_400_000);
        assert_eq!(format_time_ms(parse_when("--since", "2026-11-24T09:30:00Z", now).unwrap()), "2026-11-24T09:30:00Z");
        assert_eq!(format_time_ms(parse_when("--since", "2024-02-29T23:59:59Z", now).unwrap()), "2024-02-29T23:59:59Z");
        assert_eq!(parse_when("--since", "2026-11-24 09:30", now).unwrap(), 1_795_512_600_000);
        assert_eq!(parse_when("--since", "90m", now).unwrap(), now - 90 * 60_000);
        assert_eq!(parse_when("--since", "7d", now).unwrap(), now - 7 * 86_400_000);
        for bad in ["yesterday", "2026-13-01", "2026-11-24T25:00", "2026-11", ""] {
            let e = parse_when("--since", bad, now).unwrap_err().to_string();
            assert!(e.contains("--since"), "{bad}: {e}");
        }
    }

    #[test]
    fn csv_fields_are_quoted_only_when_they_must_be() {
        assert_eq!(csv("plain"), "plain");
        assert_eq!(csv("a,b"), "\"a,b\"");
        assert_eq!(csv("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_row(&["1".into(), "x\ny".into()]), "1,\"x\ny\"");
    }
}
