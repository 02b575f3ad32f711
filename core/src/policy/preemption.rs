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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::sm::{
    AllocId, AllocStatus, Allocation, CheckpointMode, Command, NodeSlot, NodeStatus, Resources, Shape, State,
    TaskStatus, Usage, VClusterType, fits,
};

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

/// What a decision needs to know of the preemptor (an allocation, or a spec
/// not yet submitted, for a dry run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preemptor {
    /// Its id (`None` for a dry run).
    pub alloc: Option<AllocId>,
    /// Its class.
    pub class: u8,
    /// Its gang size.
    pub gang_size: u32,
    /// Per-task resources.
    pub resources: Resources,
    /// Its walltime, seconds.
    pub walltime_s: u64,
    /// The home key of its vCluster: it may take only that vCluster's home
    /// nodes and shared ones (`None`: any node).
    pub home: Option<u32>,
}

impl Preemptor {
    /// The preemptor view of an allocation.
    pub fn of(state: &State, a: &Allocation) -> Preemptor {
        Preemptor {
            alloc: Some(a.id),
            class: a.spec.preemption_class,
            gang_size: a.spec.gang_size,
            resources: a.spec.resources,
            walltime_s: a.spec.walltime_s,
            home: Some(state.home_key(&a.spec.vcluster)),
        }
    }

    /// Its value in GPU-seconds: G × W × class / 10.
    pub fn value(&self) -> u64 {
        gpu_equivalents(self.gang_size, &self.resources)
            .saturating_mul(self.walltime_s)
            .saturating_mul(u64::from(self.class))
            / 10
    }
}

/// GPUs a gang holds; a CPU-only task counts as one.
fn gpu_equivalents(gang_size: u32, r: &Resources) -> u64 {
    u64::from(gang_size) * u64::from(r.gpus.max(1))
}

/// One candidate's preemption cost, in GPU-seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimCost {
    /// The candidate.
    pub alloc: AllocId,
    /// Its class.
    pub class: u8,
    /// Its reservation epoch (the run the decision saw).
    pub epoch: u64,
    /// GPUs it holds (CPU-only tasks count one each).
    pub gpus: u64,
    /// Seconds it has run since it (re)started.
    pub elapsed_s: u64,
    /// G × checkpoint time, GPU-seconds.
    pub checkpoint_gpu_s: u64,
    /// G × elapsed, for checkpoint none, GPU-seconds.
    pub recompute_gpu_s: u64,
    /// G × elapsed × fraction of walltime done, GPU-seconds.
    pub value_gpu_s: u64,
}

impl VictimCost {
    /// The total cost.
    pub fn total(&self) -> u64 {
        self.checkpoint_gpu_s.saturating_add(self.recompute_gpu_s).saturating_add(self.value_gpu_s)
    }
}

/// Scores a running allocation (see the module docs for the formulas).
pub fn score(a: &Allocation, now_ms: u64, cfg: &PreemptionConfig) -> VictimCost {
    let g = gpu_equivalents(a.spec.gang_size, &a.spec.resources);
    let elapsed_s = now_ms.saturating_sub(a.running_since_ms().unwrap_or(now_ms)) / 1000;
    let mut checkpoint_s = match a.spec.checkpoint {
        CheckpointMode::Auto => u64::from(a.spec.checkpoint_estimate_s),
        CheckpointMode::Manual => cfg.checkpoint_timeout_ms / 1000,
        CheckpointMode::None => 0,
    };
    if a.spec.vcluster_type == VClusterType::MlTraining {
        checkpoint_s *= 2;
    }
    let recompute = if a.spec.checkpoint == CheckpointMode::None { g.saturating_mul(elapsed_s) } else { 0 };
    let walltime_s = a.spec.walltime_s.max(1);
    let mut value =
        (u128::from(g) * u128::from(elapsed_s) * u128::from(elapsed_s.min(walltime_s)) / u128::from(walltime_s)) as u64;
    if a.spec.vcluster_type == VClusterType::Interactive {
        value /= 2;
    }
    VictimCost {
        alloc: a.id,
        class: a.spec.preemption_class,
        epoch: a.reservation_epoch,
        gpus: g,
        elapsed_s,
        checkpoint_gpu_s: g.saturating_mul(checkpoint_s),
        recompute_gpu_s: recompute,
        value_gpu_s: value,
    }
}

/// A preemption the leader should propose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The victims, in the order chosen.
    pub victims: Vec<VictimCost>,
    /// The preemptor's nodes, by task index.
    pub nodes: Vec<NodeSlot>,
    /// The victims' total cost, GPU-seconds.
    pub cost_gpu_s: u64,
    /// The preemptor's value, GPU-seconds.
    pub value_gpu_s: u64,
}

impl Decision {
    /// The command for this decision.
    pub fn command(&self, state: &State, alloc: AllocId, cfg: &PreemptionConfig) -> Command {
        Command::Preempt {
            alloc,
            victims: self.victims.iter().map(|v| (v.alloc, v.epoch)).collect(),
            nodes: self.nodes.iter().map(|&s| state.node(s).id.clone()).collect(),
            hold_ms: cfg.hold_ms(),
        }
    }
}

/// Why candidates were left out, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Excluded {
    /// Class not below the preemptor's.
    pub not_lower_class: u32,
    /// Class 10, sensitive, or checkpoint none at class ≥ 7.
    pub never_preempted: u32,
    /// Being torn down or preempted already, reserved, or partly finished.
    pub not_running_whole: u32,
    /// Services on their home nodes.
    pub service_home: u32,
    /// Within the near-completion threshold of their walltime.
    pub near_completion: u32,
    /// Within their minimum runtime since they (re)started.
    pub min_runtime: u32,
    /// Already chosen by an earlier decision of this pass.
    pub taken: u32,
}

impl fmt::Display for Excluded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            (self.not_lower_class, "not of a lower class"),
            (self.never_preempted, "never preempted (class 10, sensitive, or no checkpoint at class 7+)"),
            (self.not_running_whole, "already stopping or not running whole"),
            (self.service_home, "services on their home nodes"),
            (self.near_completion, "near completion"),
            (self.min_runtime, "within their minimum runtime"),
            (self.taken, "chosen by another decision"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if parts.is_empty() { f.write_str("none excluded") } else { write!(f, "excluded: {}", parts.join(", ")) }
    }
}

/// Why no preemption is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPreemption {
    /// Enough nodes fit now: admission places it without preempting.
    NotNeeded,
    /// Class 0 preempts nothing.
    LowestClass,
    /// Fewer nodes than the gang could ever take its tasks (ready, unheld,
    /// big enough).
    TooFewNodes {
        /// Nodes that could.
        eligible: u32,
        /// Gang size.
        need: u32,
    },
    /// No set of at most `max_victims` preemptible gangs frees enough nodes.
    NotEnough {
        /// Nodes that fit now plus those the best set frees.
        fitting: u32,
        /// Gang size.
        need: u32,
        /// Candidates considered.
        candidates: u32,
        /// The victim cap.
        max_victims: usize,
        /// What was left out.
        excluded: Excluded,
    },
    /// Waiting is enough: its planned start is within the preemption wait.
    WaitsForStart {
        /// When it is planned to start (ms).
        start_ms: u64,
        /// How far off that is (ms).
        in_ms: u64,
        /// The preemption wait (ms).
        wait_ms: u64,
    },
    /// The cheapest set found costs at least the preemptor's value.
    TooCostly {
        /// Its cost, GPU-seconds.
        cost_gpu_s: u64,
        /// The preemptor's value, GPU-seconds.
        value_gpu_s: u64,
        /// How many victims.
        victims: usize,
    },
}

impl fmt::Display for NoPreemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoPreemption::NotNeeded => f.write_str("no preemption needed: enough nodes can take a task now"),
            NoPreemption::LowestClass => f.write_str("class 0 preempts nothing"),
            NoPreemption::TooFewNodes { eligible, need } => write!(
                f,
                "preemption cannot help: only {eligible} ready, unheld nodes could ever take a task; the gang needs {need}"
            ),
            NoPreemption::NotEnough { fitting, need, candidates, max_victims, excluded } => write!(
                f,
                "no preemption: at most {max_victims} victims among {candidates} candidates free only {fitting} of the \
                 {need} nodes needed ({excluded})"
            ),
            NoPreemption::WaitsForStart { in_ms, wait_ms, .. } => write!(
                f,
                "no preemption: waiting starts it in {} s (when running work reaches its walltime), within the {} s \
                 preemption wait",
                in_ms.div_ceil(1000),
                wait_ms / 1000
            ),
            NoPreemption::TooCostly { cost_gpu_s: cost, value_gpu_s: value, victims } => write!(
                f,
                "no preemption: the cheapest set ({victims} victims) costs {cost} GPU-s, not below the gang's value of \
                 {value} GPU-s"
            ),
        }
    }
}

/// A candidate with what it would free on eligible nodes.
struct Candidate {
    cost: VictimCost,
    /// Eligible nodes it holds, with what it holds there.
    frees: Vec<(NodeSlot, Usage)>,
}

/// Free capacity of the nodes that could take a task once victims leave
/// (ready, unheld, big enough, not fitting now), by slot; `None` elsewhere.
type Eligible = [Option<Usage>];

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
        fitting_now.sort_unstable();
        placed.extend(fitting_now.iter().map(|&(_, slot)| slot).take(n - placed.len()));
        debug_assert_eq!(placed.len(), n);
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

/// What the chosen candidates free, per node.
fn freed_by(candidates: &[Candidate], chosen: &[usize]) -> BTreeMap<NodeSlot, Usage> {
    let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
    for &i in chosen {
        for (slot, u) in &candidates[i].frees {
            let f = freed.entry(*slot).or_default();
            *f = f.plus(u);
        }
    }
    freed
}

fn fits_with(state: &State, need: &Resources, slot: NodeSlot, free: &Usage, freed: &BTreeMap<NodeSlot, Usage>) -> bool {
    let extra = freed.get(&slot).copied().unwrap_or_default();
    fits(need, &state.node(slot).resources, &free.plus(&extra))
}

/// The sum of the `k` largest values.
pub(super) fn top_sum(values: impl Iterator<Item = u64>, k: usize) -> u64 {
    const SMALL: usize = 8;
    if k > SMALL {
        let mut all: Vec<u64> = values.collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        return all.iter().take(k).fold(0, |s, v| s.saturating_add(*v));
    }
    let mut top = [0u64; SMALL];
    for v in values {
        // Insert into the descending top-k.
        let mut i = k;
        while i > 0 && top[i - 1] < v {
            if i < k {
                top[i] = top[i - 1];
            }
            i -= 1;
        }
        if i < k {
            top[i] = v;
        }
    }
    top[..k].iter().fold(0, |s, v| s.saturating_add(*v))
}

/// Eligible nodes (not fitting now) that fit with `freed`.
fn count_fitting(state: &State, need: &Resources, eligible: &Eligible, freed: &BTreeMap<NodeSlot, Usage>) -> usize {
    freed
        .keys()
        .filter(|slot| eligible[slot.0 as usize].is_some_and(|free| fits_with(state, need, **slot, &free, freed)))
        .count()
}

/// (nodes newly fitting, non-fitting nodes touched) if `c` joins `freed`.
fn gain(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    freed: &BTreeMap<NodeSlot, Usage>,
    c: &Candidate,
) -> (usize, usize) {
    let mut newly = 0;
    let mut touched = 0;
    for (slot, u) in &c.frees {
        let free = &eligible[slot.0 as usize].expect("a candidate frees eligible nodes only");
        if fits_with(state, need, *slot, free, freed) {
            continue;
        }
        touched += 1;
        let extra = freed.get(slot).copied().unwrap_or_default().plus(u);
        if fits(need, &state.node(*slot).resources, &free.plus(&extra)) {
            newly += 1;
        }
    }
    (newly, touched)
}

/// The seed's greedy choice; indexes into `candidates`, or `None` if no set
/// of at most `max_victims` frees `deficit` nodes.
fn choose(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    candidates: &[Candidate],
    deficit: usize,
    max_victims: usize,
) -> Option<Vec<usize>> {
    if max_victims == 0 {
        return None;
    }
    let empty = BTreeMap::new();
    // Fewest victims first: one that frees enough alone, the cheapest.
    let single =
        candidates.iter().enumerate().filter(|(_, c)| gain(state, need, eligible, &empty, c).0 >= deficit).min_by_key(
            |(_, c)| (c.cost.total(), c.cost.checkpoint_gpu_s, std::cmp::Reverse(c.cost.gpus), c.cost.alloc),
        );
    if let Some((i, _)) = single {
        return Some(vec![i]);
    }
    // Greedy: the lowest cost per newly fitting node; when none makes a node
    // fit alone, the cheapest that makes progress on a node.
    let mut chosen: Vec<usize> = Vec::new();
    let mut freed: BTreeMap<NodeSlot, Usage> = BTreeMap::new();
    while count_fitting(state, need, eligible, &freed) < deficit {
        if chosen.len() == max_victims {
            return None;
        }
        let mut best: Option<(usize, (usize, usize))> = None;
        for (i, c) in candidates.iter().enumerate() {
            if chosen.contains(&i) {
                continue;
            }
            let g = gain(state, need, eligible, &freed, c);
            if g.1 == 0 {
                continue;
            }
            best = match best {
                None => Some((i, g)),
                Some((j, h)) => Some(if better(c, g, &candidates[j], h) { (i, g) } else { (j, h) }),
            };
        }
        let (i, _) = best?;
        chosen.push(i);
        for (slot, u) in &candidates[i].frees {
            let f = freed.entry(*slot).or_default();
            *f = f.plus(u);
        }
    }
    // Drop victims the rest make unneeded, the latest chosen first.
    let mut k = chosen.len();
    while k > 0 {
        k -= 1;
        let without: Vec<usize> = chosen.iter().copied().filter(|&j| j != chosen[k]).collect();
        if count_fitting(state, need, eligible, &freed_by(candidates, &without)) >= deficit {
            chosen = without;
        }
    }
    Some(chosen)
}

/// Whether candidate `a` (gain `ga`) beats `b` (gain `gb`) in a greedy step.
fn better(a: &Candidate, ga: (usize, usize), b: &Candidate, gb: (usize, usize)) -> bool {
    let key = |c: &Candidate, g: (usize, usize)| (g.0 > 0, c.cost.total(), g.0, c.cost.checkpoint_gpu_s, c.cost.alloc);
    let (ka, kb) = (key(a, ga), key(b, gb));
    if ka.0 != kb.0 {
        return ka.0;
    }
    if ka.0 {
        // Cost per newly fitting node, compared without division.
        let lhs = u128::from(ka.1) * gb.0 as u128;
        let rhs = u128::from(kb.1) * ga.0 as u128;
        if lhs != rhs {
            return lhs < rhs;
        }
        if ka.2 != kb.2 {
            return ka.2 > kb.2;
        }
    } else if ka.1 != kb.1 {
        return ka.1 < kb.1;
    }
    (ka.3, ka.4) < (kb.3, kb.4)
}

/// How many nodes the greedy reaches with `max_victims` (for explanations).
fn best_reach(
    state: &State,
    need: &Resources,
    eligible: &Eligible,
    candidates: &[Candidate],
    max_victims: usize,
) -> usize {
    let mut chosen: Vec<usize> = Vec::new();
    let mut freed = BTreeMap::new();
    while chosen.len() < max_victims {
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| !chosen.contains(i))
            .map(|(i, c)| (i, gain(state, need, eligible, &freed, c)))
            .filter(|(_, g)| g.1 > 0)
            .reduce(|(j, h), (i, g)| if better(&candidates[i], g, &candidates[j], h) { (i, g) } else { (j, h) });
        let Some((i, _)) = best else { break };
        chosen.push(i);
        freed = freed_by(candidates, &chosen);
    }
    count_fitting(state, need, eligible, &freed)
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
        if hopeless.contains(&Shape::of(a)) || state.quota_excess(a, &[], None, &[]).is_some() {
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
