//! Allocations: status, history, and the whole record.

use super::*;

/// An allocation's status, derived from its tasks after every transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AllocStatus {
    /// Every task is blocked: waiting for admission.
    Queued,
    /// Preempted for a higher class: every task is blocked, and the gang is
    /// queued again with its original submit time, to resume from its
    /// checkpoints.
    Suspended,
    /// Placed; some tasks not yet claimed.
    Reserved,
    /// Every unfinished task runs.
    Running,
    /// A gang teardown is in progress: siblings of a failed task are being
    /// stopped; the gang returns to the queue (or fails) once none runs.
    TearingDown,
    /// Every task exited successfully.
    Done,
    /// Out of retries, or could not be restarted whole.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Submitted with dependencies (`after`) not yet met: not queued, so
    /// admission does not see it. Queued when they are met; failed when
    /// they never can be (unless it keeps waiting).
    Waiting,
}

impl AllocStatus {
    /// The status's name (snake case).
    pub fn as_str(self) -> &'static str {
        match self {
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

    /// Every status, in declaration order.
    pub const ALL: [AllocStatus; 9] = [
        AllocStatus::Queued,
        AllocStatus::Suspended,
        AllocStatus::Reserved,
        AllocStatus::Running,
        AllocStatus::TearingDown,
        AllocStatus::Done,
        AllocStatus::Failed,
        AllocStatus::Cancelled,
        AllocStatus::Waiting,
    ];

    /// Parses the name [`AllocStatus::as_str`] gives.
    pub fn parse(s: &str) -> Option<AllocStatus> {
        AllocStatus::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether the allocation will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, AllocStatus::Done | AllocStatus::Failed | AllocStatus::Cancelled)
    }
}

/// How many events an allocation keeps for watchers (older ones are dropped).
pub const HISTORY_LIMIT: usize = 256;

/// One entry of an allocation's or a node's history, for `Watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocEvent {
    /// The allocation's (node's) revision after this event (1 for the first).
    pub revision: u64,
    /// Entry time.
    pub time_ms: u64,
    /// What happened.
    pub event: crate::sm::Event,
    /// The allocation's status once the command that recorded this event
    /// was applied (`None` in a node's history), so that a watch replaying
    /// history shows each event beside the status it led to.
    pub status: Option<AllocStatus>,
}

/// An allocation and its gang of tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Its id.
    pub id: AllocId,
    /// What was submitted.
    pub spec: AllocSpec,
    /// Entry time of the submit. Never reset by a requeue.
    pub submit_time_ms: u64,
    /// Entry time it last became queued (or suspended): its submit, or the
    /// end of the teardown or rollback that sent it back. A reclamation's
    /// return grace counts from here.
    pub queued_since_ms: u64,
    /// Status, derived from the tasks (or terminal).
    pub status: AllocStatus,
    /// The epoch of the latest reservation (0: never reserved).
    pub reservation_epoch: u64,
    /// When the gang was first reserved.
    pub first_reserved_at_ms: Option<u64>,
    /// When the allocation reached a terminal status.
    pub finished_at_ms: Option<u64>,
    /// The gang's tasks, by index.
    pub tasks: Vec<Task>,
    /// Bumped by every event about this allocation.
    pub revision: u64,
    /// The latest events (at most [`HISTORY_LIMIT`]), oldest first.
    pub history: VecDeque<AllocEvent>,
    /// Bumped by every teardown (0: never torn down).
    pub preemption_epoch: u64,
    /// The teardown in progress, if any.
    pub teardown: Option<Teardown>,
    /// How many priority preemptions it went through.
    pub preempted_count: u32,
    /// Set when a preemption suspended it; cleared when it is reserved
    /// again (its next attempt resumes from its checkpoints).
    pub suspended: bool,
    /// Nodes held for it while its victims stop (it is a preemptor).
    pub nomination: Option<Nomination>,
    /// Requeued after a watchdog trip: first in its class until placed.
    pub retry_first: bool,
    /// Nodes where a task of it tripped a watchdog since it was last
    /// placed: admission places it elsewhere when it can.
    pub avoid_nodes: Vec<NodeSlot>,
    /// Its place among all allocations in the order they finished (1 for
    /// the first; 0 while live): the job history's sequence number.
    pub finish_seq: u64,
    /// The rendezvous ports it holds on task 0's node (lowest free ones of
    /// the node's range, picked when the gang is placed; released with
    /// task 0's capacity).
    pub ports: Vec<u16>,
    /// The names of its secrets (kept after the values are dropped, when
    /// it finishes).
    pub secret_names: Vec<String>,
    /// Runs of the gang that a failure ended (a task's process failed, or
    /// its node was lost): the gang's retry budget, spent once per gang
    /// restart however many of its tasks failed.
    pub failures: u32,
    /// Its latest failure of a task's own making (an exit, or a start that
    /// failed), with the error it left.
    pub last_failure: Option<Failure>,
    /// Set when it must fail rather than be restarted: the same early
    /// failure twice in a row. The reason it fails with.
    pub give_up: Option<String>,
    /// Entry time before which admission does not place it again: the
    /// back-off after a failure (0: none).
    pub retry_after_ms: u64,
    /// Runs of the gang that ended because a task's image could not be
    /// pulled (not charged to the retry budget; at
    /// [`crate::sm::MAX_IMAGE_PULL_FAILURES`] it fails).
    pub image_pull_failures: u32,
    /// Why it waited: the changes of its wait, bounded (`wait.rs`).
    pub waits: super::WaitLog,
}

/// Most bytes of a failure's stderr tail kept in the state.
pub const MAX_FAILURE_TAIL_BYTES: usize = 1024;

/// Most lines of a failure's stderr tail kept in the state.
pub const MAX_FAILURE_TAIL_LINES: usize = 8;

/// A task's failure, as its allocation remembers the latest one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The task.
    pub task: TaskIndex,
    /// Its attempt (`MUSTER_ATTEMPT`).
    pub run: u32,
    /// Its exit code (`None`: killed by a signal, or never started).
    pub exit_code: Option<i32>,
    /// Whether the process never started (then `tail` is why).
    pub not_started: bool,
    /// The last lines of its stderr (at most [`MAX_FAILURE_TAIL_BYTES`]
    /// and [`MAX_FAILURE_TAIL_LINES`]), or why it could not start; `None`
    /// when the report carried none (an agent of an older build).
    pub tail: Option<String>,
    /// Whether it failed within `Limits::early_failure_ms` of its start
    /// (or did not start at all).
    pub early: bool,
    /// Entry time of the failure.
    pub at_ms: u64,
    /// The kernel killed a process of it for going over its memory limit.
    pub oom: Option<OomKill>,
}

/// An attempt the kernel killed (in part) for going over its memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomKill {
    /// Its memory limit, bytes.
    pub limit_bytes: u64,
    /// The most it held, bytes.
    pub peak_bytes: u64,
}

impl OomKill {
    /// "out of memory at its 512 MiB limit (peak 512 MiB)".
    pub fn describe(&self) -> String {
        let mib = |b: u64| b.div_ceil(1 << 20);
        format!("out of memory at its {} MiB limit (peak {} MiB)", mib(self.limit_bytes), mib(self.peak_bytes))
    }
}

impl Failure {
    /// The line that names the error: the tail's last non-empty line.
    pub fn error_line(&self) -> Option<&str> {
        self.tail.as_deref()?.lines().rev().map(str::trim).find(|l| !l.is_empty())
    }

    /// How the process ended, in words: "exit code 2", "killed by a
    /// signal", "did not start".
    pub fn how(&self) -> String {
        match &self.oom {
            Some(oom) => format!("{}, {}", oom.describe(), how_it_ended(self.not_started, self.exit_code)),
            None => how_it_ended(self.not_started, self.exit_code),
        }
    }

    /// What two failures must share to count as the same failure: how the
    /// process ended, and its tail with whatever differs between nodes and
    /// attempts masked (words holding a `/` — paths — and runs of digits).
    /// `None` when the report carried no tail.
    pub fn signature(&self) -> Option<(bool, Option<i32>, String)> {
        let tail = self.tail.as_deref()?;
        let mut masked = String::with_capacity(tail.len());
        for line in tail.lines().map(str::trim).filter(|l| !l.is_empty()) {
            for (i, word) in line.split_whitespace().enumerate() {
                if i > 0 {
                    masked.push(' ');
                }
                if word.contains('/') {
                    masked.push_str("<path>");
                    continue;
                }
                let mut digits = false;
                for c in word.chars() {
                    if c.is_ascii_digit() {
                        if !digits {
                            masked.push('#');
                        }
                        digits = true;
                    } else {
                        masked.push(c);
                        digits = false;
                    }
                }
            }
            masked.push('\n');
        }
        Some((self.not_started, self.exit_code, masked))
    }
}

/// How a failed attempt ended, in words: "did not start", "exit code 2",
/// "killed by a signal" (reasons and `alloc get` say it the same way).
pub fn how_it_ended(not_started: bool, exit_code: Option<i32>) -> String {
    match (not_started, exit_code) {
        (true, _) => "did not start".to_string(),
        (false, Some(code)) => format!("exit code {code}"),
        (false, None) => "killed by a signal".to_string(),
    }
}

/// Cuts a stderr tail to what the state keeps: its last
/// [`MAX_FAILURE_TAIL_LINES`] lines within [`MAX_FAILURE_TAIL_BYTES`]
/// (a last line longer than that keeps its end, cut at a character).
pub fn failure_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut kept: Vec<&str> = Vec::new();
    let mut bytes = 0;
    for line in lines.iter().rev().take(MAX_FAILURE_TAIL_LINES) {
        let cost = line.len() + usize::from(!kept.is_empty());
        if bytes + cost > MAX_FAILURE_TAIL_BYTES {
            if kept.is_empty() {
                let mut start = line.len() - MAX_FAILURE_TAIL_BYTES;
                while !line.is_char_boundary(start) {
                    start += 1;
                }
                kept.push(&line[start..]);
            }
            break;
        }
        bytes += cost;
        kept.push(line);
    }
    kept.reverse();
    kept.join("\n")
}

impl Allocation {
    /// Whether every task is blocked and the allocation is not terminal
    /// (queued or suspended): the only shape admission may place.
    pub fn is_queued(&self) -> bool {
        matches!(self.status, AllocStatus::Queued | AllocStatus::Suspended)
    }

    /// Whether a task of it ever started running (a `started` dependency
    /// is met).
    pub fn ever_started(&self) -> bool {
        self.tasks.iter().any(|t| t.runs > 0)
    }

    /// When the gang last (re)started: its latest running task's start.
    pub fn running_since_ms(&self) -> Option<u64> {
        self.tasks.iter().filter(|t| t.status == TaskStatus::Running).filter_map(|t| t.started_at_ms).max()
    }

    /// Whether any task is reserved but not yet claimed.
    pub fn has_reserved(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Reserved)
    }

    /// Whether any task has started in the current reservation.
    pub fn has_running(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Running)
    }

    /// Whether a task of it failed of its own making before (an exit or a
    /// start that failed; a lost node does not count): such a gang's retry
    /// preempts nobody.
    pub fn failed_before(&self) -> bool {
        self.last_failure.is_some()
    }

    /// Whether any task is still being stopped for a teardown.
    pub fn has_preempting(&self) -> bool {
        self.tasks.iter().any(|t| t.status == TaskStatus::Preempting)
    }
}
