//! `muster alloc`: get, cancel, watch, logs, explain and list. Each
//! subcommand is one function here that makes its calls; what it prints is
//! in `render`, the table and filters of `list` in `list`, and `logs` in
//! its own module (submitting is in `crate::submit`).

pub mod list;
mod logs;
pub mod render;

use anyhow::bail;
use clap::Subcommand;
use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;

pub use self::render::{explanation as print_explanation, status_name, task_status_name};
use crate::client::Cluster;
use crate::output::Output;

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
        /// With one array id: cancel only these elements, by index (0-9,12).
        #[arg(long, value_name = "INDICES", conflicts_with_all = ["owner", "name"])]
        indices: Option<String>,
    },
    /// Change how many of an array's elements may run at once (0: no
    /// limit). Raising it starts more at once; lowering it lets running
    /// ones finish.
    Throttle {
        /// The array id.
        id: u64,
        /// The most elements running at once (0: no limit).
        throttle: u32,
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
        /// Only this status (waiting, queued, suspended, reserved, running, tearing-down, done, failed,
        /// cancelled).
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
        #[arg(long, alias = "format", default_value = list::DEFAULT_COLUMNS)]
        columns: String,
        /// Allocations per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Follow every page.
        #[arg(long)]
        all: bool,
        /// List every element of an array as an allocation (by default an
        /// array is one row, its elements counted by status).
        #[arg(long)]
        expand: bool,
    },
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
        "waiting" => v1::AllocationStatus::Waiting,
        other => {
            bail!(
                "--status {other:?} is not one of waiting, queued, suspended, reserved, running, tearing-down, done, \
                 failed, cancelled"
            )
        }
    } as i32)
}

/// Runs one `muster alloc` subcommand.
pub async fn alloc(cluster: &mut Cluster, cmd: AllocCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        AllocCmd::Get { id } => get(cluster, id, out).await,
        AllocCmd::Cancel { ids, owner, name, yes, indices } => match indices {
            Some(indices) => cancel_elements(cluster, &ids, indices, out).await,
            None => cancel(cluster, ids, owner, name, yes, out).await,
        },
        AllocCmd::Throttle { id, throttle } => {
            let a = cluster
                .call(|ch| async move {
                    AllocationServiceClient::new(ch)
                        .set_array_throttle(v1::SetArrayThrottleRequest { id, throttle })
                        .await
                })
                .await?
                .into_inner();
            render::array(&a, out)
        }
        AllocCmd::Watch { id, from } => watch(cluster, id, from, out).await,
        AllocCmd::Logs { id, task, attempt, stdout, stderr, follow } => {
            logs::logs(cluster, logs::LogsArgs { id, task, attempt, stdout, stderr, follow }).await
        }
        AllocCmd::Explain { id } => explain(cluster, id, out).await,
        AllocCmd::List { status, owner, class, name, since, sort, columns, page_size, all, expand } => {
            let filters = ListArgs { status, owner, class, name, since, sort, columns, page_size, all, expand };
            list_allocations(cluster, filters, out).await
        }
    }
}

/// `alloc get`: an allocation, or a job array.
async fn get(cluster: &mut Cluster, id: u64, out: Output) -> anyhow::Result<()> {
    let got = cluster.call(|ch| async move { AllocationServiceClient::new(ch).get(v1::GetRequest { id }).await }).await;
    match got {
        Ok(a) => render::allocation(&a.into_inner(), out),
        // Not an allocation: perhaps an array.
        Err(e) => {
            let array = cluster
                .call(|ch| async move { AllocationServiceClient::new(ch).get_array(v1::GetRequest { id }).await })
                .await;
            if let Ok(a) = array {
                return render::array(&a.into_inner(), out);
            }
            let workflow = cluster
                .call(|ch| async move { AllocationServiceClient::new(ch).get_workflow(v1::GetRequest { id }).await })
                .await;
            match workflow {
                Ok(w) => render::workflow(&w.into_inner(), out),
                Err(_) => Err(e),
            }
        }
    }
}

/// `alloc cancel ARRAY --indices …`: some elements of one array.
async fn cancel_elements(cluster: &mut Cluster, ids: &[u64], indices: String, out: Output) -> anyhow::Result<()> {
    let &[id] = ids else {
        return Err(anyhow::Error::new(crate::BadCommandLine("--indices needs exactly one array id".to_string())));
    };
    muster_scheduler::sm::ArrayIndices::parse(&indices)
        .map_err(|e| anyhow::Error::new(crate::BadCommandLine(format!("--indices {e}"))))?;
    cluster
        .call(|ch| {
            let indices = indices.clone();
            async move { AllocationServiceClient::new(ch).cancel(v1::CancelRequest { id, indices }).await }
        })
        .await
        .map_err(|e| e.context(format!("cancel {id} --indices {indices}")))?;
    let a = cluster
        .call(|ch| async move { AllocationServiceClient::new(ch).get_array(v1::GetRequest { id }).await })
        .await?
        .into_inner();
    render::array(&a, out)
}

/// `alloc cancel`: the ids given, or those `--owner`/`--name` select; each
/// in turn, every refusal reported.
async fn cancel(
    cluster: &mut Cluster,
    ids: Vec<u64>,
    owner: Option<String>,
    name: Option<String>,
    yes: bool,
    out: Output,
) -> anyhow::Result<()> {
    let ids = if owner.is_some() || name.is_some() {
        match list::select_to_cancel(cluster, owner, name, yes).await? {
            Some(ids) => ids,
            None => return Ok(()),
        }
    } else {
        ids
    };
    let (mut done, mut refused) = (Vec::new(), Vec::new());
    for id in ids {
        match cluster
            .call(|ch| async move {
                AllocationServiceClient::new(ch).cancel(v1::CancelRequest { id, indices: String::new() }).await
            })
            .await
        {
            Ok(a) => done.push(a.into_inner()),
            Err(e) => refused.push((id, e)),
        }
    }
    render::cancelled(&done, &refused, out)?;
    match refused.as_slice() {
        [] => Ok(()),
        [(id, e)] if done.is_empty() => Err(anyhow::anyhow!("{e:#}").context(format!("cancel {id}"))),
        _ => {
            for (id, e) in &refused {
                eprintln!("muster: cancel {id}: {e:#}");
            }
            bail!("{} of {} allocation(s) not cancelled", refused.len(), refused.len() + done.len());
        }
    }
}

/// `alloc watch`: the events from revision `from` until the allocation
/// ends, resuming after a lost stream; fails unless it ended done.
async fn watch(cluster: &mut Cluster, id: u64, from: u64, out: Output) -> anyhow::Result<()> {
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
                    render::event(&e, &mut header_shown, out);
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
        "done" => Ok(()),
        other => bail!("allocation {id} ended {other}"),
    }
}

/// `alloc explain`.
/// An allocation retention has forgotten, or compaction has reduced to its
/// outcome, is explained from its job history record: its end and its wait
/// timeline.
async fn explain(cluster: &mut Cluster, id: u64, out: Output) -> anyhow::Result<()> {
    let live =
        cluster.call(|ch| async move { AllocationServiceClient::new(ch).explain(v1::GetRequest { id }).await }).await;
    let e = match live {
        Ok(e) => e.into_inner(),
        Err(err) if ["left the live state", "was compacted"].iter().any(|m| format!("{err:#}").contains(m)) => {
            let record = crate::history::record(cluster, id).await?.ok_or(err)?;
            let log = crate::history::wait_log(&record);
            let summary = format!(
                "{}; it {}",
                render::status_name(record.status),
                muster_scheduler::sm::waits_summary(&log, record.end_time_ms)
            );
            v1::Explanation {
                id,
                status: record.status,
                summary,
                waited_ms: log.waited_ms(record.end_time_ms),
                waits: record.waits,
                waits_dropped: record.waits_dropped,
                ..Default::default()
            }
        }
        Err(err) => return Err(err),
    };
    render::explanation(&format!("allocation {id}"), &e, out)
}

/// `alloc list`'s filters, sort and columns.
struct ListArgs {
    status: Option<String>,
    owner: Option<String>,
    class: Option<u32>,
    name: Option<String>,
    since: Option<String>,
    sort: String,
    columns: String,
    page_size: u32,
    all: bool,
    expand: bool,
}

/// `alloc list`: the server's pages, filtered and sorted here where the
/// server does not.
async fn list_allocations(cluster: &mut Cluster, args: ListArgs, out: Output) -> anyhow::Result<()> {
    let ListArgs { status, owner, class, name, since, sort, columns, page_size, all, expand } = args;
    let now = crate::output::now_ms();
    let columns = list::parse_columns(&columns)?;
    let (sort_key, descending) = list::parse_sort(&sort)?;
    let since_ms = since.as_deref().map(|s| list::parse_since(s, now)).transpose()?;
    let status = status.as_deref().map(status_filter).transpose()?.unwrap_or(0);
    // Filters the server does not apply need every page.
    let all = all || name.is_some() || since_ms.is_some();
    let (mut rows, mut arrays, token) =
        list::list_pages_with_arrays(cluster, status, owner, class, page_size, all, expand).await?;
    list::filter(&mut rows, name.as_deref(), since_ms);
    arrays.retain(|a| {
        name.as_deref().is_none_or(|n| a.name == n) && since_ms.is_none_or(|since| a.submit_time_ms >= since)
    });
    list::sort(&mut rows, sort_key, descending, now);
    render::list(&rows, &arrays, &columns, token, now, out)
}
