//! Each task's attempt log, kept in step with its status after every
//! command: a start opens an attempt, leaving `running`/`preempting` closes
//! it. Events mark what the status alone cannot tell (a watchdog, a
//! preemption, a lost node, a cancel).

use super::*;
use std::sync::Arc;

impl State {
    /// Brings the attempt logs of every allocation `events` name up to date.
    pub(super) fn log_attempts(&mut self, events: &[Event]) {
        let mut ids = BTreeSet::new();
        for e in events {
            match e {
                Event::WatchdogTripped { alloc, task, kind, .. } => {
                    self.mark_open(*alloc, *task, |a| a.watchdog = Some(*kind));
                }
                Event::ImagePullFailed { alloc, task, .. } => {
                    self.mark_open(*alloc, *task, |a| a.end = AttemptEnd::ImagePullFailed);
                }
                Event::TeardownStarted { alloc, cause, preempting, .. } => {
                    for (task, _) in preempting {
                        match cause {
                            TeardownCause::Preempted { .. } => self.mark_open(*alloc, *task, |a| a.preempted = true),
                            TeardownCause::Cancelled { .. } => {
                                self.mark_open(*alloc, *task, |a| a.end = AttemptEnd::Cancelled)
                            }
                            TeardownCause::TaskFailed { .. } | TeardownCause::NodeDrain => {}
                        }
                    }
                }
                Event::TaskPreempted { alloc, task, .. } => self.mark_open(*alloc, *task, |a| {
                    if a.end == AttemptEnd::Running {
                        a.end = AttemptEnd::Stopped;
                    }
                }),
                Event::NodeLost { tasks, .. } => {
                    for (alloc, task) in tasks {
                        self.mark_open(*alloc, *task, |a| a.end = AttemptEnd::Lost);
                        ids.insert(*alloc);
                    }
                }
                _ => {}
            }
            ids.extend(e.alloc());
        }
        let now = self.now_ms;
        for id in ids {
            if let Some(a) = self.allocs.get_mut(&id).map(Arc::make_mut) {
                for t in &mut a.tasks {
                    sync_attempts(t, now);
                }
            }
        }
    }

    /// Changes the open attempt of a task, if it has one (marks from an
    /// event land before the status closes it).
    pub(super) fn mark_open(&mut self, alloc: AllocId, task: TaskIndex, f: impl FnOnce(&mut Attempt)) {
        let open = self
            .allocs
            .get_mut(&alloc)
            .and_then(|a| Arc::make_mut(a).tasks.get_mut(task as usize))
            .and_then(|t| t.attempt_log.last_mut())
            .filter(|a| a.ended_ms.is_none());
        if let Some(a) = open {
            f(a);
        }
    }
}

/// Opens an attempt for a run the log has not seen, and closes the open one
/// once the task no longer runs it.
fn sync_attempts(t: &mut Task, now: u64) {
    let logged = t.attempt_log.last().map_or(t.attempts_dropped, |a| a.run);
    if t.runs > logged {
        close(t, now);
        if let Some(node) = t.run_node(t.runs) {
            t.attempt_log.push(Attempt {
                run: t.runs,
                node,
                started_ms: t.started_at_ms.unwrap_or(now),
                ended_ms: None,
                end: AttemptEnd::Running,
                exit_code: None,
                preempted: false,
                watchdog: None,
                usage: None,
            });
            if t.attempt_log.len() > ATTEMPT_LOG_LIMIT {
                t.attempt_log.remove(0);
                t.attempts_dropped += 1;
            }
        }
    }
    let active = matches!(t.status, TaskStatus::Running | TaskStatus::Preempting);
    if !active {
        close(t, now);
    }
}

/// Closes the open attempt, if any, from the task's status.
fn close(t: &mut Task, now: u64) {
    let (status, runs, exit_code, finished) = (t.status, t.runs, t.exit_code, t.finished_at_ms);
    let Some(a) = t.attempt_log.last_mut().filter(|a| a.ended_ms.is_none()) else { return };
    let current = a.run == runs;
    a.ended_ms = Some(finished.filter(|f| current && *f >= a.started_ms).unwrap_or(now));
    if current {
        a.exit_code = exit_code;
    }
    if a.end == AttemptEnd::Running {
        a.end = match status {
            TaskStatus::Done if current => AttemptEnd::Done,
            TaskStatus::Cancelled => AttemptEnd::Cancelled,
            TaskStatus::Preempted | TaskStatus::Preempting => AttemptEnd::Stopped,
            _ if a.preempted => AttemptEnd::Stopped,
            _ if a.usage.is_some_and(|u| u.oom_killed()) => AttemptEnd::OomKilled,
            _ => AttemptEnd::Failed,
        };
    }
}
