//! What a decision answers: the victims and the preemptor's nodes, or why
//! there is no preemption, with counts of the candidates left out.

use std::fmt;

use super::{PreemptionConfig, VictimCost};
use crate::sm::{AllocId, Command, NodeSlot, State};

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
    /// It failed before: a retry waits for free nodes and preempts nobody.
    Retry {
        /// Its failures so far.
        failures: u32,
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
            NoPreemption::Retry { failures } => write!(
                f,
                "no preemption: it failed {failures} time(s), and a retry preempts nobody: it waits for free nodes"
            ),
        }
    }
}
