//! Why is an allocation not running? A pure function over the state: for
//! each class of nodes (same status and resources), whether its nodes could
//! ever take one of the gang's tasks, and how many can take one now; and,
//! for a gang of class ≥ 1, what a preemption would do for it (the victims,
//! their costs and the nodes freed) or why none is possible. The same
//! answer for a spec not yet submitted is the dry run of a submit.

use std::collections::{BTreeMap, BTreeSet};

use super::admission::{AdmissionConfig, plan_admission};
use super::backfill::{PlannedStart, planned_start, planned_start_of};
use super::preemption::{Decision, NoPreemption, PreemptionConfig, Preemptor, decide, waits_for};
use crate::sm::{
    AllocId, AllocSpec, AllocStatus, Command, LabelOp, NodeStatus, Placement, Resources, State, Usage, fits,
};

/// One class of nodes and what it means for the gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassReason {
    /// The class, in words (resources and status).
    pub class: String,
    /// Nodes in the class.
    pub nodes: u32,
    /// Nodes of the class that can take one of the gang's tasks right now.
    pub can_take_now: u32,
    /// Why the rest cannot, or that they can.
    pub reason: String,
}

/// The answer to "why is it pending?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The allocation (0 for a dry run).
    pub alloc: AllocId,
    /// Its status.
    pub status: AllocStatus,
    /// One sentence.
    pub summary: String,
    /// Per node class.
    pub classes: Vec<ClassReason>,
    /// What preemption would do for it (pending gangs only): the decision,
    /// or why there is none.
    pub preemption: Option<Result<Decision, NoPreemption>>,
    /// When it is planned to start if running work ends at its walltime
    /// (pending gangs that do not fit now; `backfill::planned_start`).
    pub planned_start: Option<PlannedStart>,
    /// For each task with stored checkpoints: which one its next (or
    /// current) attempt restores, or why it starts afresh.
    pub checkpoints: Vec<String>,
}

fn describe(r: &Resources, status: NodeStatus) -> String {
    format!("{} GPU x {} MB, {} MB RAM, {} CPUs ({})", r.gpus, r.vram_mb, r.mem_mb, r.cpus, status.as_str())
}

/// Why a node in `status` takes no work, if it does not.
fn out_of_service(status: NodeStatus) -> Option<&'static str> {
    match status {
        NodeStatus::Ready => None,
        NodeStatus::Pending => Some("pending: its agent has not finished registering"),
        NodeStatus::Draining => Some("draining: its tasks finish, but it takes no new work"),
        NodeStatus::Stopping => Some("stopping: its drain deadline passed"),
        NodeStatus::Stopped => Some("stopped: an operator must restart it"),
        NodeStatus::Terminated => Some("terminated"),
        NodeStatus::Lost => Some("lost: the agent went silent; no work until it registers again"),
    }
}

/// Why a node of resources `node` can never take a task needing `need`.
fn never_fits(need: &Resources, node: &Resources) -> Option<String> {
    if need.gpus > node.gpus {
        return Some(format!("nodes have {} GPUs; a task needs {}", node.gpus, need.gpus));
    }
    if need.gpus > 0 && node.vram_mb < need.vram_mb {
        return Some(format!("GPUs have {} MB; a task needs {} MB each", node.vram_mb, need.vram_mb));
    }
    if need.mem_mb > node.mem_mb {
        return Some(format!("nodes have {} MB of memory; a task needs {}", node.mem_mb, need.mem_mb));
    }
    if need.cpus > node.cpus {
        return Some(format!("nodes have {} CPUs; a task needs {}", node.cpus, need.cpus));
    }
    None
}

/// What is short on a node that could fit the task when empty.
fn short_now(need: &Resources, free: &Usage) -> &'static str {
    if free.gpus < need.gpus {
        "not enough free GPUs"
    } else if free.mem_mb < need.mem_mb {
        "not enough free memory"
    } else {
        "not enough free CPUs"
    }
}

/// Per node class: nodes, how many can take a task now, what is short on the rest.
#[derive(Default)]
struct Tally {
    nodes: u32,
    can: u32,
    short: BTreeMap<&'static str, u32>,
}

/// What a waiting allocation waits for, and where each dependency stands:
/// "waiting for 12 (running 40 min of its 2 h walltime) to succeed".
pub fn waiting_summary(state: &State, after: &crate::sm::After, now_ms: u64) -> String {
    let each: Vec<String> = after
        .deps
        .iter()
        .map(|d| {
            let stands = match state.alloc(d.on) {
                Some(dep) if dep.status == AllocStatus::Running => format!(
                    "running {} of its {} walltime",
                    crate::words::duration(now_ms.saturating_sub(dep.running_since_ms().unwrap_or(now_ms))),
                    crate::words::duration(dep.spec.walltime_s.saturating_mul(1000))
                ),
                Some(dep) => dep.status.as_str().replace('_', " "),
                None => match (state.array(d.on), state.array_of(d.on)) {
                    (Some(array), _) => {
                        let c = state.array_counts(array);
                        let ended = array.done + array.failed + array.cancelled;
                        format!("an array, {ended} of {} elements ended, {} to come", array.count(), c.pending)
                    }
                    (None, Some((array, position))) if position >= array.next => {
                        format!("element of array {}, not started yet", array.id)
                    }
                    _ => "forgotten".to_string(),
                },
            };
            format!("{} ({stands}) {}", d.on, d.when.waits_for())
        })
        .collect();
    let list = if after.any_of { format!("the first of {}", each.join(", ")) } else { each.join(" and ") };
    match state.after_standing(after) {
        crate::sm::Standing::Never(why) => format!("kept waiting for {list}, which can never happen: {why}"),
        _ => match super::backfill::dependencies_release_ms(state, after, now_ms) {
            Some(at) => format!(
                "waiting for {list}; planned to be queued in {}, if they run to their walltime",
                crate::words::duration(at - now_ms)
            ),
            None => format!("waiting for {list}"),
        },
    }
}

/// Explains allocation `id` at `now_ms`, or `None` if it does not exist.
pub fn explain(state: &State, id: AllocId, now_ms: u64, cfg: &PreemptionConfig) -> Option<Explanation> {
    let a = state.alloc(id)?;
    let mut e = explain_gang(state, &a.spec, a.status, a.is_queued());
    e.alloc = id;
    e.checkpoints = restore_notes(state, a);
    if a.status.is_terminal() {
        let end = a.finished_at_ms.unwrap_or(now_ms);
        e.summary = format!("{}; it {}", a.status.as_str(), crate::sm::waits_summary(&a.waits, end));
    } else if a.status == AllocStatus::Waiting {
        e.summary = waiting_summary(state, &a.spec.after, now_ms);
        // Backfill keeps nodes for it from its dependencies' release.
        e.planned_start = planned_start(state, a, now_ms).filter(|p| p.start_ms > now_ms);
        if let Some(p) = &e.planned_start {
            let nodes: Vec<String> = p.nodes.iter().map(|&s| state.node(s).id.to_string()).collect();
            e.summary = format!(
                "{}; planned start in {} on {}",
                e.summary,
                crate::words::duration(p.start_ms.saturating_sub(now_ms).div_ceil(1000) * 1000),
                nodes.join(", ")
            );
        }
    } else if let Some(n) = &a.nomination {
        e.summary = format!(
            "waiting for {} preempted allocation(s) ({}) to stop; {} node(s) are held for it until their release",
            n.waiting_for.len(),
            n.waiting_for.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
            n.nodes.len()
        );
    } else if let Some(quota) = a.is_queued().then(|| state.quota_excess(a, &[], None, &[])).flatten() {
        // Held back by its own vCluster's quota: no preemption can help.
        e.summary = format!("waiting for {quota}");
    } else if a.is_queued() {
        pending(state, &mut e, &a.spec, planned_start(state, a, now_ms), &Preemptor::of(state, a), now_ms, cfg);
        if a.failed_before() && matches!(e.preemption, Some(Ok(_))) {
            e.preemption = Some(Err(NoPreemption::Retry { failures: a.failures }));
        }
        if a.retry_after_ms > now_ms {
            e.summary = format!(
                "backing off after its failure {} of {}: admission places it again in {}; {}",
                a.failures,
                a.spec.max_retries,
                crate::words::duration((a.retry_after_ms - now_ms).div_ceil(1000) * 1000),
                e.summary
            );
        }
    }
    Some(e)
}

/// For each task with checkpoints: what its attempt restores from. A
/// checkpoint on the disk of a node that is lost or terminated cannot be
/// fetched; the newest reachable one is used, else the task starts afresh.
fn restore_notes(state: &State, a: &crate::sm::Allocation) -> Vec<String> {
    let mut notes = Vec::new();
    for t in &a.tasks {
        let Some(newest) = t.checkpoints.first() else { continue };
        let place = |m: &crate::sm::CheckpointManifest| match &m.store {
            crate::sm::CheckpointStore::Node => format!("on {}'s disk", m.writer),
            other => format!("in {other}"),
        };
        let describe = |m: &crate::sm::CheckpointManifest| {
            let step = m.step.map(|s| format!(", step {s}")).unwrap_or_default();
            format!(
                "checkpoint {} ({}, attempt {}{step}, {})",
                m.seq,
                crate::words::bytes(m.bytes),
                m.attempt,
                place(m)
            )
        };
        let note = match t.checkpoints.iter().find(|m| state.checkpoint_reachable(m)) {
            Some(m) if m.seq == newest.seq => format!("task {} resumes from {}", t.index, describe(m)),
            Some(m) => format!(
                "task {}'s newest checkpoint {} is on {}, which is gone: it resumes from {}",
                t.index,
                newest.seq,
                newest.writer,
                describe(m)
            ),
            None => format!(
                "task {}'s checkpoints are on {}, which is gone: it starts afresh",
                t.index,
                t.checkpoints
                    .iter()
                    .map(|m| m.writer.to_string())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        notes.push(note);
    }
    notes
}

/// [`explain`] with what an admission pass would do now (the RPC's answer;
/// the dashboard uses the cheaper `explain`): a gang with the pass's planned
/// start says so, and a gang that fits now but is kept off the nodes another
/// gang's planned start needs names that gang.
pub fn explain_with_admission(
    state: &State,
    id: AllocId,
    now_ms: u64,
    cfg: &PreemptionConfig,
    admission: &AdmissionConfig,
) -> Option<Explanation> {
    let mut e = explain(state, id, now_ms, cfg)?;
    let a = state.alloc(id)?;
    if !a.is_queued() || a.nomination.is_some() || !admission.backfill {
        return Some(e);
    }
    let plan = plan_admission(state, now_ms, admission);
    let placed = plan.commands.iter().any(|c| matches!(c, Command::ReserveGang { alloc, .. } if *alloc == id));
    if placed || plan.planned.iter().any(|p| p.alloc == id) {
        return Some(e);
    }
    let fits_now = e.classes.iter().map(|c| c.can_take_now).sum::<u32>() >= a.spec.gang_size;
    let home = state.home_key(&a.spec.vcluster);
    let ahead = plan.planned.iter().find(|p| p.nodes.iter().any(|&s| [home, 0].contains(&state.node_home(s))));
    if let (true, Some(p)) = (fits_now, ahead) {
        e.summary = format!(
            "held for allocation {}'s planned start in {}: the nodes this gang could take now are kept for it, and \
             this gang's walltime of {} would run past that; it runs when other nodes free up, or after {} starts",
            p.alloc,
            crate::words::duration(p.start_ms.saturating_sub(now_ms).div_ceil(1000) * 1000),
            crate::words::duration(a.spec.walltime_s * 1000),
            p.alloc
        );
    }
    Some(e)
}

/// The dry run of submitting `spec` at `now_ms`: where it stands against
/// the cluster now, and what it would preempt. The same path as
/// [`explain`]'s for a queued gang, so both say the same of the same request.
pub fn explain_spec(state: &State, spec: &AllocSpec, now_ms: u64, cfg: &PreemptionConfig) -> Explanation {
    let mut e = explain_gang(state, spec, AllocStatus::Queued, true);
    let p = Preemptor {
        alloc: None,
        class: spec.preemption_class,
        gang_size: spec.gang_size,
        resources: spec.resources,
        walltime_s: spec.walltime_s,
        home: Some(state.home_key(&spec.vcluster)),
        placement: spec.placement.clone(),
    };
    pending(state, &mut e, spec, planned_start_of(state, spec, 0, now_ms), &p, now_ms, cfg);
    e
}

/// The pending part of an answer, for a queued gang and a dry run alike: a
/// request no registered node can ever satisfy says what is missing; else
/// its planned start (when running work ends at its walltime), and whether
/// waiting comes before preempting or what a preemption would do.
fn pending(
    state: &State,
    e: &mut Explanation,
    spec: &AllocSpec,
    planned: Option<PlannedStart>,
    p: &Preemptor,
    now_ms: u64,
    cfg: &PreemptionConfig,
) {
    if let Some(why) = unsatisfiable(state, spec) {
        e.summary = format!("it can never run on the registered nodes: {why}");
    }
    let waits = waits_for(planned.as_ref(), now_ms, cfg);
    e.planned_start = planned.filter(|p| p.start_ms > now_ms);
    if let Some(p) = &e.planned_start {
        let nodes: Vec<String> = p.nodes.iter().map(|&s| state.node(s).id.to_string()).collect();
        e.summary = format!(
            "{}; planned start in {} on {} (when running work reaches its walltime: smaller gangs run \
             first only if they end by then)",
            e.summary,
            crate::words::duration((p.start_ms - now_ms).div_ceil(1000) * 1000),
            nodes.join(", ")
        );
    }
    e.preemption = Some(match waits {
        Some(why) => Err(why),
        None => decide(state, p, now_ms, cfg, &BTreeSet::new(), &BTreeSet::new()),
    });
}

/// Most label values an answer lists.
const MAX_VALUES_LISTED: usize = 10;

/// What no registered node (terminated ones aside) can ever give a gang of
/// `spec`, in words, when no `gang_size` of them could each take a task with
/// every resource, constraint and port it asks for; `None` when enough
/// could (busy or not; only task 0 takes rendezvous ports, so one node with
/// enough will do), or when no node is registered at all (nothing to
/// judge by yet). The submit edge refuses such a request unless told to
/// queue it anyway.
pub fn unsatisfiable(state: &State, spec: &AllocSpec) -> Option<String> {
    // The submit path runs this: a satisfiable request stops at the first
    // gang_size nodes that could take a task (and one with the ports task 0
    // asks for); only a refusal reads every node to say what is missing.
    let could_take = |node: &crate::sm::Node| {
        node.status != NodeStatus::Terminated
            && spec.placement.admits(&node.labels)
            && never_fits(&spec.resources, &node.resources).is_none()
    };
    let (mut enough, mut ported, mut any) = (0u32, spec.ports == 0, false);
    for node in state.nodes() {
        any |= node.status != NodeStatus::Terminated;
        if could_take(node) {
            enough += 1;
            ported |= u32::from(node.ports().count) >= spec.ports;
            if enough >= spec.gang_size && ported {
                return None;
            }
        }
    }
    if !any {
        return None;
    }
    let live: Vec<&crate::sm::Node> = state.nodes().iter().filter(|n| n.status != NodeStatus::Terminated).collect();
    let n = spec.gang_size;
    let need = &spec.resources;
    let placed: Vec<&crate::sm::Node> =
        live.iter().copied().filter(|node| spec.placement.admits(&node.labels)).collect();
    let sized: Vec<&crate::sm::Node> =
        placed.iter().copied().filter(|node| never_fits(need, &node.resources).is_none()).collect();
    if placed.is_empty() {
        return Some(unmet_constraints(&live, &spec.placement));
    }
    if sized.is_empty() {
        let most = |f: fn(&Resources) -> u64| placed.iter().map(|node| f(&node.resources)).max().unwrap_or(0);
        let vram = |r: &Resources| if r.gpus > 0 { r.vram_mb } else { 0 };
        return Some(if need.gpus > 0 && u64::from(need.gpus) > most(|r| u64::from(r.gpus)) {
            format!("a task needs {} GPUs; the most any node has is {}", need.gpus, most(|r| u64::from(r.gpus)))
        } else if need.gpus > 0 && need.vram_mb > most(vram) {
            format!(
                "a task needs {} MB of memory on each GPU; the most any node's GPUs have is {} MB",
                need.vram_mb,
                most(vram)
            )
        } else if need.mem_mb > most(|r| r.mem_mb) {
            format!("a task needs {} MB of memory; the most any node has is {} MB", need.mem_mb, most(|r| r.mem_mb))
        } else if u64::from(need.cpus) > most(|r| u64::from(r.cpus)) {
            format!("a task needs {} CPUs; the most any node has is {}", need.cpus, most(|r| u64::from(r.cpus)))
        } else {
            format!("no node has every resource a task needs ({})", describe_need(need))
        });
    }
    if sized.len() < n as usize {
        return Some(format!(
            "the gang of {n} needs {n} nodes that could each take a task ({}), and only {} could{}",
            describe_need(need),
            sized.len(),
            if placed.len() < live.len() { " of those that meet its constraints" } else { "" }
        ));
    }
    let most = sized.iter().map(|node| node.ports().count).max().unwrap_or(0);
    Some(format!(
        "task 0 needs {} rendezvous ports; the most any node that could take it offers is {most} (its muster.ports \
         label)",
        spec.ports
    ))
}

/// `8 GPUs of 40000 MB, 16000 MB of memory, 4 CPUs`.
fn describe_need(need: &Resources) -> String {
    let gpus = if need.gpus > 0 { format!("{} GPUs of {} MB, ", need.gpus, need.vram_mb) } else { String::new() };
    format!("{gpus}{} MB of memory, {} CPUs", need.mem_mb, need.cpus)
}

/// Why no node of `live` meets `placement`: the first constraint none
/// meets (with the values the nodes do have), or that none meets them all.
fn unmet_constraints(live: &[&crate::sm::Node], placement: &Placement) -> String {
    let known = |key: &str| {
        let values: BTreeSet<&str> = live.iter().filter_map(|node| node.labels.get(key).map(String::as_str)).collect();
        if values.is_empty() {
            return format!("no node has a {key} label");
        }
        let mut listed: Vec<&str> = values.iter().copied().take(MAX_VALUES_LISTED).collect();
        if values.len() > MAX_VALUES_LISTED {
            listed.push("…");
        }
        format!("known {key} values: {}", listed.join(", "))
    };
    for c in &placement.constraints {
        if live.iter().any(|node| c.matches(&node.labels)) {
            continue;
        }
        return match &c.op {
            LabelOp::Eq(_) | LabelOp::In(_) => format!("no node has {c}; {}", known(&c.key)),
            LabelOp::Exists => format!("no node has a {} label", c.key),
            _ => format!("no node meets {c}"),
        };
    }
    if let Some(p) = placement.pack_by.as_ref().filter(|p| p.required)
        && !live.iter().any(|node| node.labels.contains_key(&p.key))
    {
        return format!("no node has the {} label the gang packs by", p.key);
    }
    let all: Vec<String> = placement.constraints.iter().map(|c| c.to_string()).collect();
    format!("no node meets all of its constraints together: {}", all.join(", "))
}

/// Why a node with `labels` is not a place for a gang with `placement`.
fn misplaced(placement: &Placement, labels: &BTreeMap<String, String>) -> Option<String> {
    if let Some(c) = placement.unmet(labels) {
        return Some(match c.op {
            LabelOp::Eq(_) => format!("has no {c}"),
            _ => format!("does not meet {c}"),
        });
    }
    match &placement.pack_by {
        Some(p) if p.required && !labels.contains_key(&p.key) => Some(format!("lacks the {} label it packs by", p.key)),
        _ => None,
    }
}

/// `2 nodes: has no gpu.model=H100; 1 node: does not meet rack`.
fn tally(whys: &BTreeMap<String, u32>) -> String {
    let each: Vec<String> =
        whys.iter().map(|(why, &k)| format!("{k} node{}: {why}", if k == 1 { "" } else { "s" })).collect();
    each.join("; ")
}

fn explain_gang(state: &State, spec: &AllocSpec, status: AllocStatus, pending: bool) -> Explanation {
    let (need, n) = (spec.resources, spec.gang_size);
    let id = 0;
    let mut classes: BTreeMap<(NodeStatus, Resources, Option<String>), Tally> = BTreeMap::new();
    let mut held = 0;
    // Nodes that can take a task now with the rendezvous ports task 0 asks
    // for free (other live gangs may hold them all).
    let mut port_nodes = 0u32;
    // Ready nodes left out by the placement, by why; and, for a gang that
    // packs, the ready nodes that could ever take a task, by label value.
    let mut left_out: BTreeMap<String, u32> = BTreeMap::new();
    let mut per_value: BTreeMap<&str, u32> = BTreeMap::new();
    for node in state.nodes() {
        let why = misplaced(&spec.placement, &node.labels);
        if let (Some(w), NodeStatus::Ready) = (&why, node.status) {
            *left_out.entry(w.clone()).or_default() += 1;
        }
        let placeable = why.is_none();
        let entry = classes.entry((node.status, node.resources, why)).or_default();
        entry.nodes += 1;
        if !placeable {
            continue;
        }
        if let Some(p) = &spec.placement.pack_by
            && node.status == NodeStatus::Ready
            && never_fits(&need, &node.resources).is_none()
            && let Some(v) = node.labels.get(&p.key)
        {
            *per_value.entry(v.as_str()).or_default() += 1;
        }
        if node.status == NodeStatus::Ready && state.held_for(node.slot).is_some() {
            held += 1;
            *entry.short.entry("held for a preemptor").or_default() += 1;
        } else if node.status == NodeStatus::Ready {
            if fits(&need, &node.resources, &node.free()) {
                entry.can += 1;
                if spec.ports > 0 && state.free_port_count(node.slot) >= spec.ports {
                    port_nodes += 1;
                }
            } else if never_fits(&need, &node.resources).is_none() {
                *entry.short.entry(short_now(&need, &node.free())).or_default() += 1;
            }
        }
    }
    let mut feasible_ever = 0;
    let mut free_now = 0;
    let reasons = classes
        .into_iter()
        .map(|((status, res, misplaced), Tally { nodes, can, short })| {
            let reason = if let Some(why) = misplaced {
                format!("not a place for this gang: {why}")
            } else if let Some(why) = out_of_service(status) {
                why.to_string()
            } else if let Some(why) = never_fits(&need, &res) {
                format!("can never take a task: {why}")
            } else {
                feasible_ever += nodes;
                free_now += can;
                let busy: Vec<String> = short.iter().map(|(what, k)| format!("{k} with {what}")).collect();
                match (can, busy.is_empty()) {
                    (_, true) => format!("{can} can take a task now"),
                    (0, false) => format!("busy: {} (reserved and running tasks hold it)", busy.join(", ")),
                    (_, false) => format!("{can} can take a task now; {}", busy.join(", ")),
                }
            };
            ClassReason { class: describe(&res, status), nodes, can_take_now: can, reason }
        })
        .collect();
    let summary = if !pending {
        format!("allocation is not pending: it is {status:?}").to_lowercase()
    } else if state.nodes().is_empty() {
        "no nodes are registered".to_string()
    } else if feasible_ever == 0 && !left_out.is_empty() {
        match left_out.keys().next().and_then(|w| w.strip_prefix("has no ")) {
            Some(what) if left_out.len() == 1 => format!("no ready node has {what}"),
            _ => format!("no ready node is a place for this gang: {}", tally(&left_out)),
        }
    } else if feasible_ever < n && !left_out.is_empty() {
        format!(
            "only {feasible_ever} ready nodes could ever take one of the gang's {n} tasks; the others are left out by \
             its placement ({})",
            tally(&left_out)
        )
    } else if let Some(p) = spec.placement.pack_by.as_ref().filter(|p| p.required && per_value.values().all(|&k| k < n))
    {
        let best = per_value.iter().max_by_key(|(_, k)| **k);
        format!(
            "the gang of {n} must run under one value of {}, and none has {n} nodes that could take a task ({})",
            p.key,
            best.map_or_else(
                || format!("no ready node has {}", p.key),
                |(v, k)| format!("the most is {k}, {}={v}", p.key)
            )
        )
    } else if feasible_ever < n {
        format!(
            "the gang of {n} is larger than any feasible set: only {feasible_ever} ready nodes could ever take one of its tasks"
        )
    } else if free_now >= n && spec.ports > 0 && port_nodes == 0 {
        format!(
            "waiting for rendezvous ports: {free_now} nodes can take a task now, but none has the {} free ports the \
             gang's task 0 needs (other live gangs hold them); it is placed when one frees them",
            spec.ports
        )
    } else if free_now >= n {
        format!(
            "{free_now} nodes can take a task now, enough for the gang of {n}: the next admission pass places it unless larger or higher-class gangs go first"
        )
    } else if held > 0 {
        format!(
            "waiting for capacity: the gang needs {n} nodes at once; {free_now} can take a task now ({held} held for \
             preemptors)"
        )
    } else {
        format!("waiting for capacity: the gang needs {n} nodes at once; {free_now} can take a task now")
    };
    Explanation {
        alloc: id,
        status,
        summary,
        classes: reasons,
        preemption: None,
        planned_start: None,
        checkpoints: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sm::{AllocSpec, ApplyCtx, Command, NodeId};

    fn cluster(nodes: &[(u32, u64)]) -> State {
        let mut s = State::default();
        for (i, &(gpus, vram_mb)) in nodes.iter().enumerate() {
            let resources = Resources { gpus, vram_mb, mem_mb: 100_000, cpus: 16 };
            let cmd = Command::RegisterNode { node: NodeId::new(format!("n{i}")), resources, labels: BTreeMap::new() };
            assert!(s.apply(&cmd, &ApplyCtx { time_ms: 1 }).is_accepted());
            let ready = Command::MarkNodeReady { node: NodeId::new(format!("n{i}")) };
            assert!(s.apply(&ready, &ApplyCtx { time_ms: 1 }).is_accepted());
        }
        s
    }

    fn submit(s: &mut State, gang: u32, gpus: u32, vram_mb: u64) -> AllocId {
        let res = Resources { gpus, vram_mb, mem_mb: 1_000, cpus: 1 };
        let out = s.apply(
            &Command::Submit { spec: AllocSpec::new("u", gang, res, vec!["x".into()]) },
            &ApplyCtx { time_ms: 2 },
        );
        match out.events() {
            [crate::sm::Event::Submitted { alloc, .. }, ..] => *alloc,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_gang_larger_than_any_feasible_set_says_so() {
        let mut s = cluster(&[(8, 80_000), (8, 80_000), (8, 40_000)]);
        let id = submit(&mut s, 3, 4, 60_000);
        let e = explain(&s, id, 10, &PreemptionConfig::default()).unwrap();
        assert!(
            e.summary.starts_with("it can never run on the registered nodes: the gang of 3 needs 3 nodes")
                && e.summary.ends_with("and only 2 could"),
            "{}",
            e.summary
        );
        let small = e.classes.iter().find(|c| c.class.starts_with("8 GPU x 40000")).unwrap();
        assert!(small.reason.contains("GPUs have 40000 MB; a task needs 60000 MB each"), "{small:?}");
    }

    #[test]
    fn busy_nodes_are_told_apart_from_unfit_and_lost_ones() {
        let mut s = cluster(&[(8, 80_000), (8, 80_000), (2, 80_000)]);
        let filler = submit(&mut s, 2, 6, 1_000);
        let reserve =
            Command::ReserveGang { alloc: filler, epoch: 1, nodes: vec![NodeId::new("n0"), NodeId::new("n1")] };
        assert!(s.apply(&reserve, &ApplyCtx { time_ms: 3 }).is_accepted());
        let id = submit(&mut s, 2, 4, 1_000);
        let e = explain(&s, id, 10, &PreemptionConfig::default()).unwrap();
        assert!(
            e.summary.contains("waiting for capacity: the gang needs 2 nodes at once; 0 can take"),
            "{}",
            e.summary
        );
        let big = e.classes.iter().find(|c| c.class.starts_with("8 GPU")).unwrap();
        assert_eq!((big.nodes, big.can_take_now), (2, 0));
        assert!(big.reason.contains("busy: 2 with not enough free GPUs"), "{big:?}");
        let tiny = e.classes.iter().find(|c| c.class.starts_with("2 GPU")).unwrap();
        assert!(tiny.reason.contains("nodes have 2 GPUs; a task needs 4"), "{tiny:?}");
        assert!(s.apply(&Command::MarkNodeLost { node: NodeId::new("n2") }, &ApplyCtx { time_ms: 4 }).is_accepted());
        let e = explain(&s, id, 10, &PreemptionConfig::default()).unwrap();
        assert!(e.classes.iter().any(|c| c.class.ends_with("(lost)") && c.reason.starts_with("lost")), "{e:?}");
    }

    #[test]
    fn free_capacity_and_non_pending_allocations() {
        let mut s = cluster(&[(8, 80_000), (8, 80_000)]);
        let id = submit(&mut s, 2, 1, 1_000);
        assert!(
            explain(&s, id, 10, &PreemptionConfig::default())
                .unwrap()
                .summary
                .contains("2 nodes can take a task now, enough for the gang of 2")
        );
        assert!(s.apply(&Command::CancelAllocation { alloc: id }, &ApplyCtx { time_ms: 5 }).is_accepted());
        // A finished one: how it ended, and its wait.
        let e = explain(&s, id, 10, &PreemptionConfig::default()).unwrap();
        assert_eq!(e.summary, "cancelled; it waited 3 ms in all: 3 ms for its turn in the queue", "{e:?}");
        assert_eq!(explain(&s, 99, 10, &PreemptionConfig::default()), None);
        assert_eq!(explain(&State::default(), 1, 10, &PreemptionConfig::default()), None);
    }
}
