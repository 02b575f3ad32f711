//! Reports the leader has not confirmed yet (exits, preempt acks, watchdog trips), and what a `Register` lists as running.

use super::*;

/// A report the leader has not confirmed yet.
#[derive(Clone, Debug)]
pub(super) enum Report {
    /// Sent after the exit checkpoint, if any.
    Exited {
        exit: v1::TaskExited,
        checkpoint: Option<v1::CheckpointUpload>,
    },
    Preempted {
        checkpoint: Option<v1::CheckpointUpload>,
        ack: v1::Preempted,
    },
    Watchdog {
        trip: v1::WatchdogTripped,
        checkpoint: Option<v1::CheckpointUpload>,
    },
}

impl Agent {
    /// The tasks a `Register` lists as running: those whose process runs,
    /// and those that ended while their report (exit, watchdog) is not yet
    /// recorded. The leader fails a running task its agent does not list, so
    /// a task that finished while the agent was reconnecting must be listed
    /// until its re-sent exit report is recorded — else a success would be
    /// recorded as a failure with no exit code.
    pub(super) fn registered_tasks(&self) -> Vec<v1::TaskRef> {
        let ended_unreported = self
            .unrecorded
            .iter()
            .filter(|(_, r)| matches!(r, Report::Exited { .. } | Report::Watchdog { .. }))
            .map(|(k, _)| k);
        let keys: BTreeSet<&Key> = self.running.keys().chain(ended_unreported).collect();
        keys.into_iter().map(|k| task_ref(*k)).collect()
    }
}

pub(super) async fn send_report<F, Fut>(report: &Report, send: &F) -> Result<(), String>
where
    F: Fn(Out) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    match report {
        Report::Exited { exit, checkpoint } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::Exited(exit.clone())).await
        }
        Report::Watchdog { trip, checkpoint } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::WatchdogTripped(trip.clone())).await
        }
        Report::Preempted { checkpoint, ack } => {
            if let Some(c) = checkpoint {
                send(Out::Checkpoint(c.clone())).await?;
            }
            send(Out::Preempted(*ack)).await
        }
    }
}
