//! Tasks: their status, attempts, checkpoints.

use super::*;

/// A task's status. (A suspended gang's tasks are blocked; suspension is the
/// allocation's status.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Waiting for its gang to be placed.
    Blocked,
    /// Placed on a node by a reservation; not yet claimed.
    Reserved,
    /// Claimed by its node's agent; its process runs.
    Running,
    /// Its gang is being torn down (a sibling failed) or preempted (a higher
    /// class needs its nodes): its agent has been told to stop the process
    /// (after a checkpoint hint, or SIGTERM, grace, SIGKILL), may upload a
    /// checkpoint, and must acknowledge with the task's preemption epoch.
    /// Still holds capacity.
    Preempting,
    /// Stopped for a teardown (acknowledged, or forced at the timeout); waits
    /// for the rest of its gang to stop. Holds nothing.
    Preempted,
    /// Exited successfully.
    Done,
    /// Out of retries, or its gang failed.
    Failed,
    /// Cancelled by a user or operator.
    Cancelled,
}

impl Task {
    /// The node its latest attempt ran on.
    pub fn last_node(&self) -> Option<NodeSlot> {
        self.run_nodes.last().copied()
    }

    /// The node attempt `run` (1 for the first) ran on.
    pub fn run_node(&self, run: u32) -> Option<NodeSlot> {
        self.run_nodes.get((run as usize).checked_sub(1)?).copied()
    }
}

impl TaskStatus {
    /// Whether the task holds capacity on a node.
    pub fn holds_capacity(self) -> bool {
        matches!(self, TaskStatus::Reserved | TaskStatus::Running | TaskStatus::Preempting)
    }

    /// Whether the task will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Done | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// One member of a gang.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Its index in the gang.
    pub index: TaskIndex,
    /// Its status.
    pub status: TaskStatus,
    /// The node it is reserved on or runs on.
    pub node: Option<NodeSlot>,
    /// Claims charged against the retry budget (refunded when the task was
    /// only a bystander of a sibling's failure).
    pub attempts: u32,
    /// Attempts started, never refunded: numbers `MUSTER_ATTEMPT` and the
    /// attempt logs (a refunded bystander's next run must not reuse a number).
    pub runs: u32,
    /// The reservation epoch it was placed under (0: never placed).
    pub reservation_epoch: u64,
    /// When its current reservation was made.
    pub reserved_at_ms: Option<u64>,
    /// When its current attempt started.
    pub started_at_ms: Option<u64>,
    /// When it last left `Running`.
    pub finished_at_ms: Option<u64>,
    /// The exit code of its last attempt, if it exited with one.
    pub exit_code: Option<i32>,
    /// The node each attempt ran on, in order (run `n` on `run_nodes[n - 1]`;
    /// kept after it ends: each attempt's logs live on its node).
    pub run_nodes: Vec<NodeSlot>,
    /// The gang teardown this task was last told to stop for (0: never).
    /// Acks and checkpoint uploads must carry it.
    pub preemption_epoch: u64,
    /// Its stored checkpoints, newest first (at most the cluster's `keep`):
    /// every later attempt restores the newest one it can reach.
    pub checkpoints: Vec<CheckpointManifest>,
    /// Times a watchdog stopped it (retried elsewhere up to the cap; not
    /// charged to the retry budget).
    pub watchdog_trips: u32,
    /// The watchdog that stopped its latest stopped attempt, if one did.
    pub last_watchdog: Option<WatchdogKind>,
    /// Failures retried in place on its draining node since it was last
    /// placed by admission (the worker-draining seed: at most 3).
    pub drain_retries: u32,
    /// Its attempts, oldest first (at most [`ATTEMPT_LOG_LIMIT`]; older
    /// ones are dropped and counted in `attempts_dropped`): what the job
    /// history records of each.
    pub attempt_log: Vec<Attempt>,
    /// Attempts dropped from the front of `attempt_log`.
    pub attempts_dropped: u32,
}

/// How many attempts a task's log keeps (a task retried more often keeps
/// its latest ones).
pub const ATTEMPT_LOG_LIMIT: usize = 32;

/// One attempt of a task: a start on a node, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its number (1 for the first; `MUSTER_ATTEMPT`).
    pub run: u32,
    /// The node it ran on.
    pub node: NodeSlot,
    /// Entry time of its start.
    pub started_ms: u64,
    /// Entry time of its end (`None`: still running or stopping).
    pub ended_ms: Option<u64>,
    /// How it ended.
    pub end: AttemptEnd,
    /// Its exit code, when it exited with one (`None` after an exit: killed
    /// by a signal).
    pub exit_code: Option<i32>,
    /// Stopped by a priority preemption or a reclamation.
    pub preempted: bool,
    /// The watchdog that stopped it, if one did.
    pub watchdog: Option<WatchdogKind>,
    /// What it used, from its cgroup, as its agent reported at its end
    /// (`None`: not reported, or its node contains no tasks).
    pub usage: Option<AttemptUsage>,
}

/// What an attempt used: memory and CPU read from its cgroup when it
/// ended, GPU utilisation and memory sampled through NVML while it ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptUsage {
    /// The most memory it held at once, bytes (0: unknown).
    pub peak_memory_bytes: u64,
    /// CPU time, user and system, ms.
    pub cpu_ms: u64,
    /// Processes of it the kernel killed for going over its memory limit.
    pub oom_kills: u32,
    /// Its memory limit, bytes (0: none).
    pub memory_limit_bytes: u64,
    /// The mean utilisation of its GPUs over its run, percent (`None`: not
    /// read: no NVML on its node, or no GPUs).
    pub gpu_util_pct: Option<u32>,
    /// The most memory its GPUs held at once, bytes (0: not read).
    pub peak_gpu_memory_bytes: u64,
}

impl AttemptUsage {
    /// Whether the kernel killed part of it for going over its memory limit.
    pub fn oom_killed(&self) -> bool {
        self.oom_kills > 0
    }
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// Still running, or being stopped.
    Running,
    /// Exited successfully.
    Done,
    /// Exited with a failure, was killed, or could not start.
    Failed,
    /// Stopped for a gang teardown, a preemption or a drain.
    Stopped,
    /// Its node was lost.
    Lost,
    /// Stopped by a cancel.
    Cancelled,
    /// Failed after the kernel killed a process of it for going over its
    /// memory limit (its usage has the limit and the peak).
    OomKilled,
    /// Never ran: its image could not be pulled on its node.
    ImagePullFailed,
}

impl AttemptEnd {
    /// The name the history and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptEnd::Running => "running",
            AttemptEnd::Done => "done",
            AttemptEnd::Failed => "failed",
            AttemptEnd::Stopped => "stopped",
            AttemptEnd::Lost => "lost",
            AttemptEnd::Cancelled => "cancelled",
            AttemptEnd::OomKilled => "oom_killed",
            AttemptEnd::ImagePullFailed => "image_pull_failed",
        }
    }

    /// Parses the name [`AttemptEnd::as_str`] gives.
    pub fn parse(s: &str) -> Option<AttemptEnd> {
        [
            AttemptEnd::Running,
            AttemptEnd::Done,
            AttemptEnd::Failed,
            AttemptEnd::Stopped,
            AttemptEnd::Lost,
            AttemptEnd::Cancelled,
            AttemptEnd::OomKilled,
            AttemptEnd::ImagePullFailed,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}
