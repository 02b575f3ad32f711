//! A replica's background tasks, each with a name, stopped together and
//! awaited: nothing a replica spawned outlives its shutdown unnoticed.
//!
//! Tasks watch the replica's stop signal (a `watch` broadcast) and return
//! when it is raised, or end once Raft is shut down and its metrics close.
//! [`Background::join`] then waits for each; one still running after the
//! grace period is aborted, warned about by name, and reported.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The tasks a replica spawned.
#[derive(Default)]
pub(crate) struct Background {
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Background {
    /// Spawns `task` under `name`.
    pub(crate) fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push((name, tokio::spawn(task)));
    }

    /// Spawns `task` under `name`, dropped where it waits once `stop` is
    /// raised (for loops that hold no state worth finishing).
    pub(crate) fn spawn_until(
        &mut self,
        name: &'static str,
        mut stop: watch::Receiver<bool>,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(name, async move {
            tokio::select! {
                () = task => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }

    /// Waits for every task to end, at most `grace` in all; aborts those
    /// still running then and returns their names.
    pub(crate) async fn join(self, grace: Duration) -> Vec<&'static str> {
        let deadline = tokio::time::Instant::now() + grace;
        let mut aborted = Vec::new();
        for (name, mut task) in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::warn!(task = name, "a background task did not stop in time; aborting it");
                task.abort();
                let _ = task.await;
                aborted.push(name);
            }
        }
        aborted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tasks_that_watch_the_stop_end_and_one_that_does_not_is_aborted_and_named() {
        let (stop, watching) = watch::channel(false);
        let (dropped_tx, mut dropped) = tokio::sync::mpsc::channel::<()>(1);
        let mut bg = Background::default();
        let mut rx = watching.clone();
        bg.spawn("watcher", async move {
            let _ = rx.wait_for(|s| *s).await;
        });
        bg.spawn_until("looper", watching, async move {
            let _guard = dropped_tx;
            std::future::pending::<()>().await
        });
        bg.spawn("stuck", std::future::pending());
        stop.send(true).unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(bg.join(Duration::from_secs(10)).await, ["stuck"]);
        assert_eq!(started.elapsed(), Duration::from_secs(10), "only the stuck task waited out the grace");
        assert!(dropped.recv().await.is_none(), "the loop was dropped, its state with it");
    }
}
