//! The read-only web dashboard (`GET /ui`) and the JSON it polls
//! (`GET /ui/api/overview`).
//!
//! The page is one self-contained HTML file (no CDN, no build step) whose
//! script fetches the overview every 2 s and redraws: the cluster (every
//! replica's role, term, applied index and state digest, asked of the peers
//! over gRPC with this replica's certificate), the nodes (status, GPUs used
//! and free, drain), the queue (per class, each pending gang with its
//! `explain` summary), running gangs, and recent preemptions and watchdog
//! trips (from the allocations' replicated event histories, so every replica
//! shows the same).
//!
//! [`overview`] reads only the applied state: a follower's dashboard is as
//! fresh as its applied index, which it shows.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::policy::PreemptionConfig;
use crate::sm::{AllocStatus, Allocation, Event, State, TaskStatus, TeardownCause};

/// Pending gangs explained (each explanation runs the preemption decision).
const EXPLAINED: usize = 10;
/// Pending and running gangs listed.
const LISTED: usize = 100;
/// Recent preemptions and watchdog trips listed.
const RECENT: usize = 30;
/// Nodes listed (in id order; the total is given too), so the view stays
/// small whatever the cluster's size.
const NODES_LISTED: usize = 500;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

fn alloc_status(s: AllocStatus) -> &'static str {
    match s {
        AllocStatus::Queued => "queued",
        AllocStatus::Suspended => "suspended",
        AllocStatus::Reserved => "reserved",
        AllocStatus::Running => "running",
        AllocStatus::TearingDown => "tearing_down",
        AllocStatus::Done => "done",
        AllocStatus::Failed => "failed",
        AllocStatus::Cancelled => "cancelled",
        AllocStatus::Waiting => "waiting",
    }
}

/// What every row about an allocation shows.
fn alloc_row(st: &State, a: &Allocation) -> Value {
    // An array element shows as ARRAY[INDEX] beside its id.
    let element = st
        .array_of(a.id)
        .and_then(|(array, position)| Some(format!("{}[{}]", array.id, array.indices.index_at(position)?)));
    json!({
        "id": a.id,
        "element": element,
        "owner": a.spec.owner,
        "class": a.spec.preemption_class,
        "gang_size": a.spec.gang_size,
        "gpus": u64::from(a.spec.gang_size) * u64::from(a.spec.resources.gpus),
        "status": alloc_status(a.status),
    })
}

/// Everything the page shows but the replicas (which [`super::http`] adds).
pub fn overview(st: &State, now_ms: u64, cfg: &PreemptionConfig) -> Value {
    let mut tasks_on: BTreeMap<usize, (u32, u32)> = BTreeMap::new();
    let mut running = Vec::new();
    let mut recent = Vec::new();
    for a in st.allocs().values() {
        for t in &a.tasks {
            if let Some(slot) = t.node {
                let e = tasks_on.entry(slot.0 as usize).or_default();
                match t.status {
                    TaskStatus::Running | TaskStatus::Preempting => e.0 += 1,
                    TaskStatus::Reserved => e.1 += 1,
                    _ => {}
                }
            }
        }
        if !a.is_queued() && !a.status.is_terminal() && running.len() < LISTED {
            let nodes: std::collections::BTreeSet<&str> =
                a.tasks.iter().filter_map(|t| t.node).map(|s| st.node(s).id.as_str()).collect();
            let mut row = alloc_row(st, a);
            row["nodes"] = json!(nodes);
            row["running_s"] = json!(a.running_since_ms().map(|t| now_ms.saturating_sub(t) / 1000));
            row["preempted_count"] = json!(a.preempted_count);
            running.push(row);
        }
        // Only allocations ever torn down, preempted or tripped have such
        // events: skip the others' histories (most of them).
        let eventful = a.preemption_epoch > 0 || a.tasks.iter().any(|t| t.watchdog_trips > 0);
        for h in a.history.iter().filter(|_| eventful) {
            let item = match &h.event {
                Event::TeardownStarted { cause: TeardownCause::Preempted { by, reason }, preempting, .. } => json!({
                    "time_ms": h.time_ms, "kind": "preemption", "alloc": a.id,
                    "detail": format!("preempted by {by} ({}), {} task(s) stopping", reason.as_str(), preempting.len()),
                }),
                Event::WatchdogTripped { task, node, kind, retried, .. } => json!({
                    "time_ms": h.time_ms, "kind": "watchdog", "alloc": a.id,
                    "detail": format!("{} watchdog stopped task {task} on {node}{}", kind.as_str(),
                        if *retried { ", retried elsewhere" } else { ", allocation failed" }),
                }),
                _ => continue,
            };
            recent.push((h.time_ms, a.id, item));
        }
    }
    let by_class = st.queued_by_class();
    // The first rows of a pending list, each with how long it has waited
    // and (the first EXPLAINED) its explain reason.
    let pending = |allocs: &mut dyn Iterator<Item = &Allocation>| -> Vec<Value> {
        allocs
            .take(LISTED)
            .enumerate()
            .map(|(i, a)| {
                let why =
                    (i < EXPLAINED).then(|| crate::policy::explain(st, a.id, now_ms, cfg).map(|e| e.summary)).flatten();
                let mut row = alloc_row(st, a);
                row["waiting_s"] = json!(now_ms.saturating_sub(a.submit_time_ms) / 1000);
                row["after"] = json!(a.spec.after.describe());
                row["reason"] = json!(why);
                row
            })
            .collect()
    };
    // In the order admission considers them.
    let queue = pending(&mut st.queue().filter_map(|k| st.alloc(k.alloc)));
    // Waiting for dependencies, oldest first, each with what it waits for.
    let waiting = pending(&mut st.waiting().filter_map(|id| st.alloc(id)));
    // Live arrays, newest first, each folded into its counts.
    let live_arrays: Vec<&crate::sm::JobArray> = st.arrays().filter(|a| a.finished_at_ms.is_none()).collect();
    let arrays: Vec<Value> = live_arrays
        .iter()
        .rev()
        .take(LISTED)
        .map(|a| {
            let counts = st.array_counts(a);
            let mut indices = a.indices.clone();
            indices.throttle = 0;
            json!({
                "id": a.id,
                "owner": a.spec.owner,
                "name": a.spec.name,
                "indices": indices.to_string(),
                "throttle": a.indices.throttle,
                "count": a.count(),
                "pending": counts.pending,
                "by_status": counts.by_status.iter().map(|(s, n)| (s.as_str(), *n)).collect::<BTreeMap<_, _>>(),
            })
        })
        .collect();
    recent.sort_by_key(|(t, id, _)| (std::cmp::Reverse(*t), std::cmp::Reverse(*id)));
    let recent: Vec<Value> = recent.into_iter().take(RECENT).map(|(_, _, v)| v).collect();
    let mut by_id: Vec<&crate::sm::Node> = st.nodes().iter().collect();
    by_id.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    let nodes_total = by_id.len();
    let nodes: Vec<Value> = by_id
        .into_iter()
        .take(NODES_LISTED)
        .map(|n| {
            let (run, res) = tasks_on.get(&(n.slot.0 as usize)).copied().unwrap_or_default();
            json!({
                "id": n.id.as_str(),
                "status": n.status.as_str(),
                "vcluster": n.vcluster(),
                "gpus": n.resources.gpus,
                "gpus_used": n.used.gpus,
                "gpus_free": n.free().gpus,
                "tasks_running": run,
                "tasks_reserved": res,
                "held_for": st.held_for(n.slot),
                "drain": n.drain.as_ref().map(|d| json!({
                    "reason": d.reason, "by": d.by, "deadline_ms": d.deadline_ms,
                    "remaining_s": d.deadline_ms.saturating_sub(now_ms) / 1000,
                })),
            })
        })
        .collect();
    let (free, reserved, running_gpus) = gpu_totals(st);
    json!({
        "now_ms": now_ms,
        "gpus": {"free": free, "reserved": reserved, "running": running_gpus},
        "nodes": nodes,
        "nodes_total": nodes_total,
        "queue": {
            "total": st.queue_len(),
            "by_class": by_class.iter().map(|(c, n)| json!({"class": c, "count": n})).collect::<Vec<_>>(),
            "items": queue,
        },
        "waiting": {"total": st.waiting_len(), "items": waiting},
        "arrays": {"total": live_arrays.len(), "items": arrays},
        "running": running,
        "recent": recent,
    })
}

/// GPUs free (on ready nodes: what admission may place on), reserved
/// (placed, not yet started) and running (running or stopping tasks): the
/// `muster_gpus` gauge and the dashboard's totals.
pub fn gpu_totals(st: &State) -> (u64, u64, u64) {
    let (reserved, running) = st.held_gpus();
    let free = st.nodes_in(crate::sm::NodeStatus::Ready).map(|s| u64::from(st.node(s).free().gpus)).sum();
    (free, reserved, running)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::sm::{ApplyCtx, Command, NodeId, Resources, State};

    #[test]
    fn the_view_lists_at_most_its_share_of_nodes_and_says_how_many_there_are() {
        let mut st = State::default();
        let resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_000, cpus: 8 };
        for i in 0..600 {
            let cmd =
                Command::RegisterNode { node: NodeId::new(format!("n{i:04}")), resources, labels: BTreeMap::new() };
            assert!(st.apply(&cmd, &ApplyCtx { time_ms: 1 }).is_accepted());
        }
        let v = super::overview(&st, 1, &Default::default());
        assert_eq!(v["nodes"].as_array().unwrap().len(), super::NODES_LISTED);
        assert_eq!(v["nodes_total"], 600);
        assert_eq!(v["nodes"][0]["id"], "n0000", "in id order");
    }
}
