//! `muster alloc list` and `alloc cancel --owner/--name`: squeue's and
//! scancel's habits. Columns to choose (`--columns`), filters the server
//! does not know (`--name`, `--since`), a sort, and a cancel by filter that
//! lists what it selects and asks first.

use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;

use super::render::status_name;
use crate::client::Cluster;

/// Every column `--columns` may name, in the default order.
pub const COLUMNS: &[&str] = &[
    "id",
    "name",
    "status",
    "owner",
    "tasks",
    "class",
    "submitted",
    "started",
    "elapsed",
    "nodes",
    "command",
    "vcluster",
    "priority",
    "failures",
    "reason",
];

/// The columns shown when `--columns` is left out.
pub const DEFAULT_COLUMNS: &str = "id,name,status,owner,tasks,class,submitted,started,elapsed,nodes,command";

/// Keys `--sort` takes (a leading `-` sorts descending).
pub const SORT_KEYS: &[&str] = &["id", "name", "status", "owner", "class", "submitted", "started", "elapsed"];

/// Most characters of a NODES or COMMAND cell.
const CELL_CHARS: usize = 40;

/// Parses `--columns`: known names, each once.
pub fn parse_columns(list: &str) -> anyhow::Result<Vec<&'static str>> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let name = name.to_ascii_lowercase();
        let Some(&known) = COLUMNS.iter().find(|&&c| c == name) else {
            crate::usage!("--columns: unknown column {name:?}; known: {}", COLUMNS.join(","));
        };
        if out.contains(&known) {
            crate::usage!("--columns: {known} named twice");
        }
        out.push(known);
    }
    if out.is_empty() {
        crate::usage!("--columns: name at least one of {}", COLUMNS.join(","));
    }
    Ok(out)
}

/// Parses `--sort`: a key, descending with a leading `-`.
pub fn parse_sort(key: &str) -> anyhow::Result<(&'static str, bool)> {
    let (name, descending) = match key.strip_prefix('-') {
        Some(rest) => (rest, true),
        None => (key, false),
    };
    let Some(&known) = SORT_KEYS.iter().find(|&&k| k == name) else {
        crate::usage!("--sort: unknown key {name:?}; known: {} (prefix - to sort descending)", SORT_KEYS.join(","));
    };
    Ok((known, descending))
}

/// Parses `--since` as `muster history` does: an RFC 3339 UTC date or time
/// (`2026-11-27`, `2026-11-27T07:00:00Z`) or a duration back from now
/// (`90s`, `30m`, `4h`, `2d`). Milliseconds since the epoch.
pub fn parse_since(s: &str, now_ms: u64) -> anyhow::Result<u64> {
    match crate::history::parse_when("--since", s, now_ms) {
        Ok(ms) => Ok(ms),
        Err(e) => crate::usage!("{e:#}"),
    }
}

/// When its current (or last) run started: the earliest start among tasks
/// that run or ran to an end; none while it waits (queued, suspended or
/// reserved: a blocked task keeps its last attempt's start).
pub fn started_ms(a: &v1::Allocation) -> Option<u64> {
    let waiting = |t: &v1::Task| {
        matches!(v1::TaskStatus::try_from(t.status), Ok(v1::TaskStatus::Blocked | v1::TaskStatus::Reserved))
    };
    a.tasks.iter().filter(|t| !waiting(t)).filter_map(|t| t.started_at_ms).min()
}

/// How long it has run: to its end, or to now while it runs.
fn elapsed_ms(a: &v1::Allocation, now_ms: u64) -> Option<u64> {
    let start = started_ms(a)?;
    let end = a.finished_at_ms.unwrap_or(now_ms);
    Some(end.saturating_sub(start))
}

/// Its name, or the command's program when it has none (Slurm's habit).
pub fn display_name(a: &v1::Allocation) -> String {
    let spec = a.spec.as_ref();
    match spec.map(|s| s.name.as_str()).filter(|n| !n.is_empty()) {
        Some(name) => name.to_string(),
        None => spec
            .and_then(|s| s.command.first())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .unwrap_or_default(),
    }
}

/// The nodes its tasks run (or last ran) on, distinct, in task order.
fn nodes(a: &v1::Allocation) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for t in &a.tasks {
        let n = if !t.node_id.is_empty() { t.node_id.as_str() } else { t.last_node_id.as_str() };
        if !n.is_empty() && !seen.contains(&n) {
            seen.push(n);
        }
    }
    if seen.is_empty() { "-".into() } else { clip(&seen.join(",")) }
}

/// `D-HH:MM:SS` or `H:MM:SS` (squeue's TIME).
pub fn clock(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 { format!("{d}-{h:02}:{m:02}:{s:02}") } else { format!("{h}:{m:02}:{s:02}") }
}

fn clip(s: &str) -> String {
    if s.chars().count() <= CELL_CHARS {
        return s.to_string();
    }
    let mut out: String = s.chars().take(CELL_CHARS - 1).collect();
    out.push('…');
    out
}

fn time_cell(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".into(), muster_scheduler::server::api::convert::format_time_ms)
}

/// One cell of `column` for `a` at `now_ms`.
pub fn cell(column: &str, a: &v1::Allocation, now_ms: u64) -> String {
    let spec = a.spec.clone().unwrap_or_default();
    let r = spec.resources.unwrap_or_default();
    match column {
        "id" => a.id.to_string(),
        "name" => clip(&display_name(a)),
        "status" => status_name(a.status).to_string(),
        "owner" => spec.owner,
        "tasks" => format!("{} x {} GPU", spec.gang_size, r.gpus),
        "class" => spec.preemption_class.to_string(),
        "submitted" => time_cell(Some(a.submit_time_ms)),
        "started" => time_cell(started_ms(a)),
        "elapsed" => elapsed_ms(a, now_ms).map_or_else(|| "-".into(), clock),
        "nodes" => nodes(a),
        "command" => clip(&spec.command.join(" ")),
        "vcluster" => spec.vcluster,
        "priority" => spec.priority.to_string(),
        "failures" => format!("{}/{}", a.failures, spec.max_retries),
        "reason" => clip(&a.failed_reason),
        other => unreachable!("unknown column {other}"),
    }
}

/// The table: a header of the columns' names, then one row per allocation,
/// each column as wide as its widest cell (the last one unpadded).
pub fn table(columns: &[&str], rows: &[v1::Allocation], now_ms: u64) -> Vec<String> {
    let cells: Vec<Vec<String>> = rows.iter().map(|a| columns.iter().map(|c| cell(c, a, now_ms)).collect()).collect();
    let header: Vec<String> = columns.iter().map(|c| c.to_ascii_uppercase()).collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| cells.iter().map(|r| r[i].chars().count()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let right = |c: &str| matches!(c, "id" | "class" | "priority");
    let line = |row: &[String]| {
        let mut out = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right(columns[i]) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else if i + 1 < row.len() {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(cell);
            }
        }
        out
    };
    let mut out = vec![line(&header)];
    out.extend(cells.iter().map(|r| line(r)));
    out
}

/// An array's elements by status, in words: "64 running, 9000 pending,
/// 936 done" (statuses in lifecycle order; pending last before the ended).
pub fn array_counts(a: &v1::JobArray) -> String {
    let order = ["waiting", "queued", "suspended", "reserved", "running", "tearing_down"];
    let mut parts: Vec<String> =
        order.iter().filter_map(|s| a.by_status.get(*s).map(|n| format!("{n} {}", s.replace('_', "-")))).collect();
    if a.pending > 0 {
        parts.push(format!("{} pending", a.pending));
    }
    for s in ["done", "failed", "cancelled"] {
        if let Some(n) = a.by_status.get(s) {
            parts.push(format!("{n} {s}"));
        }
    }
    parts.join(", ")
}

/// The arrays' table: one row per array, its elements counted by status.
pub fn array_table(arrays: &[v1::JobArray]) -> Vec<String> {
    let header = ["ARRAY", "NAME", "OWNER", "INDICES", "RUNNING AT ONCE", "STATUS", "ELEMENTS"];
    let rows: Vec<[String; 7]> = arrays
        .iter()
        .map(|a| {
            let name = match a.name.as_str() {
                "" => a
                    .spec
                    .as_ref()
                    .and_then(|s| s.command.first())
                    .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
                    .unwrap_or_default(),
                n => n.to_string(),
            };
            [
                a.id.to_string(),
                clip(&name),
                a.owner.clone(),
                clip(&a.indices),
                if a.throttle == 0 { "any".to_string() } else { a.throttle.to_string() },
                a.status.clone(),
                array_counts(a),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i].saturating_sub(c.chars().count());
            if i == 0 {
                out.push_str(&" ".repeat(pad));
                out.push_str(c);
            } else if i + 1 < cells.len() {
                out.push_str(c);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(c);
            }
        }
        out
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(rows.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out
}

/// Keeps the rows `--name` and `--since` select.
pub fn filter(rows: &mut Vec<v1::Allocation>, name: Option<&str>, since_ms: Option<u64>) {
    rows.retain(|a| {
        name.is_none_or(|n| a.spec.as_ref().is_some_and(|s| s.name == n))
            && since_ms.is_none_or(|since| a.submit_time_ms >= since)
    });
}

/// Sorts the rows by `key` (ties by id).
pub fn sort(rows: &mut [v1::Allocation], key: &str, descending: bool, now_ms: u64) {
    rows.sort_by(|a, b| {
        let order = match key {
            "name" => display_name(a).cmp(&display_name(b)),
            "status" => status_name(a.status).cmp(status_name(b.status)),
            "owner" => a.spec.as_ref().map(|s| &s.owner).cmp(&b.spec.as_ref().map(|s| &s.owner)),
            "class" => a.spec.as_ref().map(|s| s.preemption_class).cmp(&b.spec.as_ref().map(|s| s.preemption_class)),
            "submitted" => a.submit_time_ms.cmp(&b.submit_time_ms),
            "started" => started_ms(a).cmp(&started_ms(b)),
            "elapsed" => elapsed_ms(a, now_ms).cmp(&elapsed_ms(b, now_ms)),
            _ => std::cmp::Ordering::Equal,
        }
        .then(a.id.cmp(&b.id));
        if descending { order.reverse() } else { order }
    });
}

/// Lists allocations a page at a time (every page with `all`); the rows and
/// the token of the page after the last one read (0: none).
pub async fn list_pages(
    cluster: &mut Cluster,
    status: i32,
    owner: Option<String>,
    preemption_class: Option<u32>,
    page_size: u32,
    all: bool,
) -> anyhow::Result<(Vec<v1::Allocation>, u64)> {
    let (rows, _, token) =
        list_pages_with_arrays(cluster, status, owner, preemption_class, page_size, all, true).await?;
    Ok((rows, token))
}

/// [`list_pages`], with array elements folded into their arrays unless
/// `expand`: the rows, the arrays, and the next page's token.
pub async fn list_pages_with_arrays(
    cluster: &mut Cluster,
    status: i32,
    owner: Option<String>,
    preemption_class: Option<u32>,
    page_size: u32,
    all: bool,
    expand: bool,
) -> anyhow::Result<(Vec<v1::Allocation>, Vec<v1::JobArray>, u64)> {
    let mut token = 0;
    let mut rows = Vec::new();
    let mut arrays = Vec::new();
    loop {
        let req = v1::ListRequest {
            status,
            owner: owner.clone().unwrap_or_default(),
            preemption_class,
            page_size,
            page_token: token,
            expand,
        };
        let page = cluster
            .call(|ch| {
                let req = req.clone();
                async move { AllocationServiceClient::new(ch).list(req).await }
            })
            .await?
            .into_inner();
        rows.extend(page.allocations);
        arrays.extend(page.arrays);
        token = page.next_page_token;
        if token == 0 || !all {
            return Ok((rows, arrays, token));
        }
    }
}

/// The unfinished allocations `--owner` and `--name` select for a cancel,
/// listed, and confirmed: on a terminal by answering y, otherwise by
/// `--yes`. `None` when there is nothing to cancel or the answer was no.
pub async fn select_to_cancel(
    cluster: &mut Cluster,
    owner: Option<String>,
    name: Option<String>,
    yes: bool,
) -> anyhow::Result<Option<Vec<u64>>> {
    use std::io::IsTerminal as _;
    let (mut rows, _) = list_pages(cluster, 0, owner.clone(), None, 1000, true).await?;
    filter(&mut rows, name.as_deref(), None);
    rows.retain(|a| a.finished_at_ms.is_none());
    let what = match (&owner, &name) {
        (Some(o), Some(n)) => format!("owner {o} named {n}"),
        (Some(o), None) => format!("owner {o}"),
        (None, Some(n)) => format!("named {n}"),
        (None, None) => unreachable!("a filter is given"),
    };
    if rows.is_empty() {
        eprintln!("no unfinished allocations of {what}");
        return Ok(None);
    }
    let columns = parse_columns("id,name,status,owner,tasks,elapsed")?;
    for line in table(&columns, &rows, crate::output::now_ms()) {
        eprintln!("{line}");
    }
    if !yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "refusing to cancel {} allocation(s) of {what} without confirmation: stdin is not a terminal; add --yes",
                rows.len()
            );
        }
        eprint!("cancel these {} allocation(s)? [y/N] ", rows.len());
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing cancelled");
            return Ok(None);
        }
    }
    Ok(Some(rows.iter().map(|a| a.id).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, name: &str, submitted: u64, started: Option<u64>, finished: Option<u64>) -> v1::Allocation {
        let running = v1::TaskStatus::Running as i32;
        v1::Allocation {
            id,
            submit_time_ms: submitted,
            finished_at_ms: finished,
            spec: Some(v1::AllocationSpec {
                name: name.into(),
                owner: "alice".into(),
                gang_size: 2,
                command: vec!["/usr/bin/python3".into(), "train.py".into()],
                ..Default::default()
            }),
            tasks: vec![
                v1::Task { started_at_ms: started, status: running, node_id: "n2".into(), ..Default::default() },
                v1::Task { started_at_ms: started, status: running, node_id: "n1".into(), ..Default::default() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn columns_sorts_and_times_parse_and_refuse_what_they_do_not_know() {
        assert_eq!(parse_columns("ID,name, elapsed").unwrap(), ["id", "name", "elapsed"]);
        assert!(parse_columns("id,jobid").unwrap_err().to_string().contains("unknown column \"jobid\""));
        assert!(parse_columns("id,id").is_err() && parse_columns("").is_err());
        assert_eq!(parse_sort("-submitted").unwrap(), ("submitted", true));
        assert!(parse_sort("size").is_err());
        let now = 1_795_482_045_152; // 2026-11-24T01:00:45.152Z
        assert_eq!(parse_since("2026-11-24T01:00:45Z", 0).unwrap(), now - 152);
        assert_eq!(parse_since("2m", now).unwrap(), now - 120_000);
        let bad = parse_since("yesterday", now).unwrap_err();
        assert!(bad.downcast_ref::<crate::BadCommandLine>().is_some(), "a bad command line: {bad}");
        assert_eq!([clock(59_000), clock(3_723_000), clock(90_061_000)], ["0:00:59", "1:02:03", "1-01:01:01"]);
    }

    #[test]
    fn the_table_names_times_nodes_and_falls_back_to_the_program() {
        let now = 10_000_000;
        let rows = [alloc(7, "resnet", 1_000, Some(61_000), None), alloc(8, "", 2_000, None, None)];
        let t = table(&parse_columns(DEFAULT_COLUMNS).unwrap(), &rows, now);
        assert!(t[0].starts_with("ID  NAME     STATUS") && t[0].ends_with("NODES  COMMAND"), "{t:?}");
        assert!(t[1].contains("resnet") && t[1].contains("2:45:39") && t[1].contains("n2,n1"), "{t:?}");
        assert!(t[1].contains("1970-01-01T00:00:01Z") && t[1].contains("1970-01-01T00:01:01Z"), "{t:?}");
        assert!(t[2].contains("python3") && t[2].contains("  -  "), "{t:?}");
        // A gang queued again after a failure shows no start.
        let mut requeued = rows[0].clone();
        requeued.tasks.iter_mut().for_each(|t| t.status = v1::TaskStatus::Blocked as i32);
        assert_eq!((cell("started", &requeued, now), cell("elapsed", &requeued, now)), ("-".into(), "-".into()));
        let mut rows = rows.to_vec();
        sort(&mut rows, "submitted", true, now);
        assert_eq!(rows.iter().map(|a| a.id).collect::<Vec<_>>(), [8, 7]);
        filter(&mut rows, Some("resnet"), None);
        assert_eq!(rows.iter().map(|a| a.id).collect::<Vec<_>>(), [7]);
        filter(&mut rows, None, Some(5_000));
        assert!(rows.is_empty());
    }
}
