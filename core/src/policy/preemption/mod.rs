//! Priority preemption: which running gangs to stop so that a higher-class
//! queued gang can start. Pure: a read-only state, `now` and the knobs in,
//! one decision (or the reason there is none) out. The leader proposes the
//! decision as one [`Command::Preempt`]; `apply` checks it again.
//!
//! ```text
//!   1. nodes:      ready, held for nobody, big enough for one task when empty
//!                  (enough of them fit now ⇒ no preemption: admission places it)
//!   2. candidates: running whole on those nodes, class below the preemptor's,
//!                  preemptible (not class 10 / sensitive / none at class ≥ 7 /
//!                  a service on its home nodes), not near completion, not
//!                  within its minimum runtime since it (re)started (× one
//!                  more per earlier preemption, at most 8×)
//!   3. cost (GPU-seconds), per candidate gang of G GPUs (a CPU-only task
//!      counts as one), running for e of its walltime W:
//!        checkpoint = G × checkpoint time   (auto: its estimate; manual: the
//!                                            checkpoint timeout; none: 0;
//!                                            ml-training: doubled)
//!        recompute  = G × e                 (checkpoint none only: all lost)
//!        value      = G × e × e / W         (invested × fraction done;
//!                                            interactive: halved)
//!   4. choose:     one victim that frees enough nodes, the cheapest; else
//!                  greedily the lowest cost per newly fitting node (ties:
//!                  more nodes, lower checkpoint cost, lower id), at most
//!                  `max_victims`, dropping any that turn out unneeded
//!   5. accept only if the total cost < the preemptor's value
//!                  = G × W × class / 10
//! ```
//!
//! Victims are whole gangs: a gang's tasks on other nodes stop too, and what
//! they free counts. The preemptor's nodes are the newly fitting ones plus,
//! if it needs more, nodes that fit already (fewest free GPUs first); they are
//! held for it until it is reserved there.
//!
//! Cost: O(tasks on the eligible nodes × victims chosen); no hashing, every
//! tie broken by id, so every replica computes the same decision.

mod choose;
mod outcome;
mod score;

use std::cmp::Reverse;
use std::collections::BTreeSet;

pub(in crate::policy) use choose::top_sum;
use choose::{Candidate, best_reach, choose, fits_with, freed_by};
pub use outcome::{Decision, Excluded, NoPreemption};
pub use score::{Preemptor, VictimCost, score};

use crate::sm::{AllocId, AllocStatus, Allocation, NodeSlot, NodeStatus, Shape, State, TaskStatus, Usage, fits};

/// The preemption knobs (the preemption-policy seed's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionConfig {
    /// Most victims one decision may stop.
    pub max_victims: usize,
    /// A gang this close to its walltime's end is left to finish.
    pub near_completion_ms: u64,
    /// A gang is not preempted again this soon after it (re)started (once
    /// more for every earlier preemption, at most 8×).
    pub min_runtime_ms: u64,
    /// How long a hinted task has to checkpoint (one +50 % extension).
    pub checkpoint_timeout_ms: u64,
    /// Longest deferral a hinted task may ask for.
    pub max_deferral_ms: u64,
    /// SIGTERM → SIGKILL grace for a victim that cannot checkpoint, and after
    /// a checkpoint is done.
    pub grace_ms: u64,
    /// Slack on top of the agent's own deadlines before the leader forces a
    /// victim's tasks to stopped (its agent never answered).
    pub force_slack_ms: u64,
    /// A gang preempted more than this many times counts as a cycle.
    pub cycle_threshold: u32,
    /// Decisions tried per pass, and decisions made per pass.
    pub max_tries_per_pass: usize,
    /// Decisions committed per pass at most.
    pub max_decisions_per_pass: usize,
    /// Candidates are read from at least this many feasible nodes at a time…
    pub min_candidate_nodes: usize,
    /// …or this share (percent) of them, whichever is more.
    pub candidate_nodes_percent: usize,
    /// The leader runs a preemption pass at most this often (admission may
    /// run on every submit and release; preemption is the last resort).
    pub min_pass_interval_ms: u64,
    /// A queued gang whose planned start (`planned_start`: running work
    /// ends at its walltime, and backfill keeps the nodes for it) is at most
    /// this far off waits instead of preempting (0: preempt at once).
    pub wait_ms: u64,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            max_victims: 3,
            near_completion_ms: 5 * 60_000,
            min_runtime_ms: 2 * 60_000,
            checkpoint_timeout_ms: 10 * 60_000,
            max_deferral_ms: 5 * 60_000,
            grace_ms: 30_000,
            force_slack_ms: 45_000,
            cycle_threshold: 3,
            max_tries_per_pass: 8,
            max_decisions_per_pass: 2,
            min_candidate_nodes: 100,
            candidate_nodes_percent: 5,
            min_pass_interval_ms: 1_000,
            wait_ms: DEFAULT_PREEMPTION_WAIT_MS,
        }
    }
}

/// How close a planned start must be for a gang to wait for it instead of
/// preempting: 5 minutes.
pub const DEFAULT_PREEMPTION_WAIT_MS: u64 = 5 * 60_000;

impl PreemptionConfig {
    /// After this long a victim's still-preempting tasks are forced to
    /// stopped (and, having not checkpointed, charged): the agent's longest
    /// path (the checkpoint deadline with its +50 % extension and a full
    /// deferral on top, then the grace) plus slack.
    pub fn force_after_ms(&self, checkpointing: bool) -> u64 {
        let agent = if checkpointing {
            self.checkpoint_timeout_ms * 3 / 2 + self.max_deferral_ms + self.grace_ms
        } else {
            self.grace_ms
        };
        agent + self.force_slack_ms
    }

    /// How long a preemptor's nodes are held at most: until its slowest
    /// victim is forced, and a minute more.
    pub fn hold_ms(&self) -> u64 {
        self.force_after_ms(true) + 60_000
    }
}

/// Decides which gangs to preempt for `p` at `now_ms`. `taken` are gangs
/// chosen by earlier decisions of the same pass; `held` nodes held by them.
///
/// Nodes are first bounded without looking any allocation up: a node is
/// *feasible* if its free capacity plus the largest `max_victims` lower-class
/// holdings on it (per resource) would fit one task. Candidates are then
/// read from the feasible nodes a window at a time (at least
/// `min_candidate_nodes`, else `candidate_nodes_percent` of them, starting
/// at an offset derived from the preemptor, as kube-scheduler samples
/// nodes), and the first window whose candidates give an acceptable set
/// decides. On clusters of up to `min_candidate_nodes` feasible nodes every
/// candidate is compared.
pub fn decide(
    state: &State,
    p: &Preemptor,
    now_ms: u64,
    cfg: &PreemptionConfig,
    taken: &BTreeSet<AllocId>,
    held: &BTreeSet<NodeSlot>,
) -> Result<Decision, NoPreemption> {
    let need = p.resources;
    let n = p.gang_size as usize;
    // 1. Eligible nodes, those that fit now, and the feasible ones.
    let mut eligible: Vec<Option<Usage>> = vec![None; state.nodes().len()];
    let mut eligible_count = 0;
    let mut fitting_now: Vec<(u32, NodeSlot)> = Vec::new();
    let mut feasible: Vec<NodeSlot> = Vec::new();
    let mut higher: Vec<AllocId> = Vec::new();
    for node in state.nodes() {
        if node.status != NodeStatus::Ready || state.held_for(node.slot).is_some() || held.contains(&node.slot) {
            continue;
        }
        if p.home.is_some_and(|h| ![h, 0].contains(&state.node_home(node.slot))) {
            continue;
        }
        if !p.placement.is_any() && !p.placement.admits(&node.labels) {
            continue;
        }
        if !fits(&need, &node.resources, &Usage::of(&node.resources)) {
            continue;
        }
        let free = node.free();
        if fits(&need, &node.resources, &free) {
            fitting_now.push((free.gpus, node.slot));
            continue;
        }
        eligible_count += 1;
        eligible[node.slot.0 as usize] = Some(free);
        let holders = state.holders(node.slot);
        higher.extend(holders.iter().filter(|h| h.class >= p.class).map(|h| h.alloc));
        let lower = || holders.iter().filter(|h| h.class < p.class).map(|h| h.usage);
        let most = Usage {
            gpus: u32::try_from(top_sum(lower().map(|u| u64::from(u.gpus)), cfg.max_victims)).unwrap_or(u32::MAX),
            mem_mb: top_sum(lower().map(|u| u.mem_mb), cfg.max_victims),
            cpus: u32::try_from(top_sum(lower().map(|u| u64::from(u.cpus)), cfg.max_victims)).unwrap_or(u32::MAX),
        };
        if fits(&need, &node.resources, &free.plus(&most)) {
            feasible.push(node.slot);
        }
    }
    if fitting_now.len() >= n {
        return Err(NoPreemption::NotNeeded);
    }
    if fitting_now.len() + eligible_count < n {
        return Err(NoPreemption::TooFewNodes {
            eligible: (fitting_now.len() + eligible_count) as u32,
            need: n as u32,
        });
    }
    if p.class == 0 {
        return Err(NoPreemption::LowestClass);
    }
    fitting_now.sort_unstable();
    let deficit = n - fitting_now.len();
    let not_enough = |fitting: usize, candidates: usize, mut excluded: Excluded, higher: &mut Vec<AllocId>| {
        higher.sort_unstable();
        higher.dedup();
        excluded.not_lower_class += higher.len() as u32;
        NoPreemption::NotEnough {
            fitting: (fitting_now.len() + fitting) as u32,
            need: n as u32,
            candidates: candidates as u32,
            max_victims: cfg.max_victims,
            excluded,
        }
    };
    if feasible.len() < deficit {
        return Err(not_enough(0, 0, Excluded::default(), &mut higher));
    }

    // 2-4. Candidates window by window; choose among all read so far.
    let window = cfg.min_candidate_nodes.max(feasible.len() * cfg.candidate_nodes_percent / 100).max(1);
    let offset = p.alloc.map_or(0, |id| (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) % feasible.len() as u64) as usize);
    feasible.rotate_left(offset);
    let mut excluded = Excluded::default();
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut seen: Vec<AllocId> = Vec::new();
    let mut last = None;
    for nodes in feasible.chunks(window) {
        let mut ids: Vec<AllocId> = nodes
            .iter()
            .flat_map(|&slot| state.holders(slot).iter().filter(|h| h.class < p.class).map(|h| h.alloc))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.retain(|id| seen.binary_search(id).is_err());
        let before = seen.len();
        seen.extend(&ids);
        if before > 0 {
            seen.sort_unstable();
        }
        for id in ids {
            let a = state.alloc(id).expect("index names a known allocation");
            if let Some(why) = exclusion(state, a, p, now_ms, cfg, taken) {
                *why.counter(&mut excluded) += 1;
                continue;
            }
            let usage = Usage::of(&a.spec.resources);
            let frees = a
                .tasks
                .iter()
                .filter_map(|t| t.node)
                .filter(|slot| eligible[slot.0 as usize].is_some())
                .map(|slot| (slot, usage))
                .collect();
            candidates.push(Candidate { cost: score(a, now_ms, cfg), frees });
        }
        let Some(chosen) = choose(state, &need, &eligible, &candidates, deficit, cfg.max_victims) else {
            continue;
        };
        let victims: Vec<VictimCost> = chosen.iter().map(|&i| candidates[i].cost).collect();
        let cost = victims.iter().map(VictimCost::total).fold(0u64, u64::saturating_add);
        let value = p.value();
        if cost >= value {
            last = Some(NoPreemption::TooCostly { cost_gpu_s: cost, value_gpu_s: value, victims: victims.len() });
            continue;
        }
        // The preemptor's nodes: those the victims free, then ones that fit now.
        let freed = freed_by(&candidates, &chosen);
        let mut placed: Vec<NodeSlot> = freed
            .keys()
            .filter(|slot| eligible[slot.0 as usize].is_some_and(|free| fits_with(state, &need, **slot, &free, &freed)))
            .copied()
            .take(n)
            .collect();
        placed.extend(fitting_now.iter().map(|&(_, slot)| slot).take(n - placed.len()));
        debug_assert_eq!(placed.len(), n);
        // A gang that must be packed takes these nodes only if they share
        // one value of its label (choosing victims rack by rack is left to
        // later windows and passes).
        if let Some(pack) = p.placement.pack_by.as_ref().filter(|k| k.required) {
            let first = state.node(placed[0]).labels.get(&pack.key);
            if placed.iter().any(|&s| state.node(s).labels.get(&pack.key) != first) {
                continue;
            }
        }
        // Task 0 holds the gang's rendezvous ports: on the node with the
        // most free (the first such, so plain clusters keep their order).
        let ports = |slot: &NodeSlot| state.free_port_count(*slot);
        if let Some(best) = placed.iter().enumerate().max_by_key(|&(i, s)| (ports(s), Reverse(i))).map(|(i, _)| i) {
            placed.swap(0, best);
        }
        return Ok(Decision { victims, nodes: placed, cost_gpu_s: cost, value_gpu_s: value });
    }
    if let Some(costly) = last {
        return Err(costly);
    }
    let best = best_reach(state, &need, &eligible, &candidates, cfg.max_victims);
    Err(not_enough(best, candidates.len(), excluded, &mut higher))
}

#[derive(Clone, Copy)]
enum Why {
    NotLower,
    Never,
    NotRunning,
    ServiceHome,
    NearCompletion,
    MinRuntime,
    Taken,
}

impl Why {
    fn counter(self, e: &mut Excluded) -> &mut u32 {
        match self {
            Why::NotLower => &mut e.not_lower_class,
            Why::Never => &mut e.never_preempted,
            Why::NotRunning => &mut e.not_running_whole,
            Why::ServiceHome => &mut e.service_home,
            Why::NearCompletion => &mut e.near_completion,
            Why::MinRuntime => &mut e.min_runtime,
            Why::Taken => &mut e.taken,
        }
    }
}

fn exclusion(
    state: &State,
    a: &Allocation,
    p: &Preemptor,
    now_ms: u64,
    cfg: &PreemptionConfig,
    taken: &BTreeSet<AllocId>,
) -> Option<Why> {
    if a.spec.preemption_class >= p.class {
        return Some(Why::NotLower);
    }
    if a.spec.never_preempted().is_some() {
        return Some(Why::Never);
    }
    if a.status != AllocStatus::Running || a.tasks.iter().any(|t| t.status != TaskStatus::Running) {
        return Some(Why::NotRunning);
    }
    if taken.contains(&a.id) {
        return Some(Why::Taken);
    }
    if state.service_at_home(a) {
        return Some(Why::ServiceHome);
    }
    let since = a.running_since_ms().unwrap_or(now_ms);
    let ends = since.saturating_add(a.spec.walltime_s.saturating_mul(1000));
    if ends.saturating_sub(now_ms) <= cfg.near_completion_ms {
        return Some(Why::NearCompletion);
    }
    if now_ms.saturating_sub(since) < min_runtime_ms(a, cfg) {
        return Some(Why::MinRuntime);
    }
    None
}

/// How long a gang is protected after it (re)started: the minimum runtime,
/// once more for every time it was already preempted (capped at 8×), so an
/// allocation that keeps losing its nodes gets longer to make progress.
pub fn min_runtime_ms(a: &Allocation, cfg: &PreemptionConfig) -> u64 {
    cfg.min_runtime_ms.saturating_mul(u64::from(a.preempted_count.min(7)) + 1)
}

/// `Some` when queued gang `a` should wait rather than preempt: its planned
/// start is within `cfg.wait_ms` of now.
pub fn waits_for_start(state: &State, a: &Allocation, now_ms: u64, cfg: &PreemptionConfig) -> Option<NoPreemption> {
    if cfg.wait_ms == 0 {
        return None;
    }
    waits_for(super::backfill::planned_start(state, a, now_ms).as_ref(), now_ms, cfg)
}

/// [`waits_for_start`] with the gang's planned start already projected.
pub(crate) fn waits_for(
    planned: Option<&super::backfill::PlannedStart>,
    now_ms: u64,
    cfg: &PreemptionConfig,
) -> Option<NoPreemption> {
    let p = planned.filter(|_| cfg.wait_ms > 0)?;
    let in_ms = p.start_ms.saturating_sub(now_ms);
    (in_ms <= cfg.wait_ms).then_some(NoPreemption::WaitsForStart { start_ms: p.start_ms, in_ms, wait_ms: cfg.wait_ms })
}

/// One pass: for queued gangs of class ≥ 1 that admission could not place,
/// highest class first (then admission order), the decisions to propose.
/// A gang that waiting starts within `cfg.wait_ms` is passed over.
/// Later decisions of a pass do not reuse an earlier one's victims or nodes.
pub fn plan_preemptions(state: &State, now_ms: u64, cfg: &PreemptionConfig) -> Vec<(AllocId, Decision)> {
    let mut out = Vec::new();
    let mut taken = BTreeSet::new();
    let mut held = BTreeSet::new();
    let mut tries = 0;
    // Shapes that found too few nodes or victims: the same shape at the same
    // or a lower class (the queue goes down by class) can only find fewer.
    let mut hopeless: BTreeSet<Shape> = BTreeSet::new();
    for (_, key) in state.preemptor_queue() {
        if tries == cfg.max_tries_per_pass || out.len() == cfg.max_decisions_per_pass {
            break;
        }
        let a = state.alloc(key.alloc).expect("queue names a known allocation");
        // Past its vCluster's quota it waits; preempting others would not
        // let it run (apply refuses the decision too).
        // A retry never preempts: a gang that failed before waits for free
        // nodes (its failure may well be its own).
        if a.failed_before() || hopeless.contains(&Shape::of(a)) || state.quota_excess(a, &[], None, &[]).is_some() {
            continue;
        }
        match decide(state, &Preemptor::of(state, a), now_ms, cfg, &taken, &held) {
            // Waiting (with backfill keeping its nodes) comes before
            // preempting; checked only when a preemption was found, as it
            // reads every holder of the gang's nodes.
            Ok(_) if waits_for_start(state, a, now_ms, cfg).is_some() => tries += 1,
            Ok(d) => {
                taken.extend(d.victims.iter().map(|v| v.alloc));
                held.extend(d.nodes.iter().copied());
                out.push((a.id, d));
                tries += 1;
            }
            Err(NoPreemption::NotNeeded) => {}
            Err(NoPreemption::TooFewNodes { .. } | NoPreemption::NotEnough { .. }) => {
                hopeless.insert(Shape::of(a));
                tries += 1;
            }
            Err(_) => tries += 1,
        }
    }
    out
}
