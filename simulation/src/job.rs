//! A job the simulator will submit: when, what, and how long it runs.

use muster_core::sm::{AllocSpec, ArrayIndices, WorkflowSpec};

/// One simulated submission: an allocation, a job array of it, or a
/// workflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Submit time, ms of simulated time.
    pub submit_ms: u64,
    /// What is submitted (unused for a workflow).
    pub spec: AllocSpec,
    /// How long each task runs when nothing fails, ms (each element's,
    /// for an array).
    pub duration_ms: u64,
    /// Submit it as a job array of these indices.
    pub array: Option<ArrayIndices>,
    /// Submit a workflow instead, and how long each step's tasks run, ms.
    pub workflow: Option<(WorkflowSpec, Vec<u64>)>,
    /// What the job really did, for a replay of a recorded workload: its
    /// runs replace `duration_ms` and the configured failure chance.
    pub script: Option<Script>,
}

impl Job {
    /// A plain allocation.
    pub fn plain(submit_ms: u64, spec: AllocSpec, duration_ms: u64) -> Job {
        Job { submit_ms, spec, duration_ms, array: None, workflow: None, script: None }
    }
}

/// What a recorded job did of its own accord (`muster replay`): how long
/// each of its tasks' runs lasted and how each ended, when its owner
/// cancelled it, and which jobs it waited for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// Per task, in order: the runs that the job itself ended (it exited,
    /// well or not, was OOM-killed, or tripped a watchdog). Runs the
    /// scheduler or the fleet ended (preemptions, gang teardowns, lost
    /// nodes, drains) are not here: the replay decides those again. A task
    /// whose runs are used up runs its last one again; a task with none
    /// runs until the cancel, or for 1 ms without one.
    pub runs: Vec<Vec<Run>>,
    /// When its owner cancelled it, ms of simulated time.
    pub cancel_ms: Option<u64>,
    /// For each of `spec.after`'s dependencies, in order, the index of the
    /// job it names in the replayed list (`None`: a job outside the replay,
    /// and the dependency is dropped).
    pub after_jobs: Vec<Option<usize>>,
}

/// One run of a task that the job itself ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// How long it ran, ms.
    pub ms: u64,
    /// It succeeded.
    pub ok: bool,
}

/// How one job fared in a simulation (`Simulation::run_jobs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobOutcome {
    /// The submit was accepted.
    pub submitted: bool,
    /// Its first task start, ms (`None`: it never ran).
    pub start_ms: Option<u64>,
    /// When it ended, ms (`None`: unfinished at the end).
    pub end_ms: Option<u64>,
    /// How it ended (`None`: unfinished).
    pub status: Option<muster_core::sm::AllocStatus>,
    /// Times it was preempted.
    pub preemptions: u32,
    /// GPU-seconds over its attempts.
    pub gpu_seconds: u64,
}
