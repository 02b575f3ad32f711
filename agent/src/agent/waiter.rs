//! An attempt's waiter: what runs beside its process until it ends (the
//! agent's stops and checkpoint hints, the watchdogs, the usage it reports)
//! and the save of its checkpoint directory once it has.

use super::*;

/// What the agent tells a running task's waiter.
pub(super) enum Control {
    /// SIGTERM, this grace, SIGKILL.
    Stop(Duration),
    /// Ask it to checkpoint first.
    Hint(Hint),
}

/// Where and how an attempt's checkpoint directory is saved when its
/// process ends.
#[derive(Clone)]
pub(super) struct SaveSpec {
    pub(super) stores: Arc<Stores>,
    /// The allocation checkpoints at all.
    pub(super) checkpointing: bool,
    pub(super) store: CheckpointStore,
    pub(super) limit: u64,
    /// The fingerprint of the directory as restored: unchanged, it is not
    /// saved again.
    pub(super) restored: Option<u64>,
    pub(super) naming: Naming,
}

/// An attempt's watchdogs and what feeds them.
pub(super) struct Guard {
    /// The attempt's `alloc_id` and `task` metric labels.
    pub(super) labels: [(&'static str, String); 2],
    pub(super) dogs: Watchdogs,
    pub(super) progress: ProgressFile,
    pub(super) sampler: Box<dyn Sampler>,
    pub(super) poll: Duration,
    /// The GPUs the attempt holds, read for its accounting each poll.
    pub(super) gpus: Vec<u32>,
    pub(super) gpu: watchdog::GpuUsage,
}

/// How long a tripped task gets between SIGTERM and SIGKILL: it is hung.
pub(super) const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

/// Waits for an attempt to end, obeying the agent: a stop stops it; a hint
/// starts the checkpoint protocol, polled every 200 ms, which stops it once
/// the task is done or out of time. Until a stop or hint, the watchdogs are
/// polled (beats from the progress file), and a trip stops it.
pub(super) async fn watch_task(
    task: &mut dyn executor::Attempt,
    mut ctrl: mpsc::UnboundedReceiver<Control>,
    checkpoint_dir: &std::path::Path,
    mut guard: Guard,
    clock: &SharedClock,
) -> (Ended, bool) {
    let mut stopped = false;
    let mut hint: Option<HintWatch> = None;
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    let mut dog_tick = tokio::time::interval(guard.poll);
    let pgid = task.pgid();
    let mut trip = None;
    let (exit, checkpoint_failed) = loop {
        tokio::select! {
            exit = task.wait() => break (exit, false),
            _ = dog_tick.tick(), if hint.is_none() => {
                report_usage(task, &guard.labels);
                if !guard.gpus.is_empty()
                    && let Some(r) = guard.sampler.gpus(&guard.gpus)
                {
                    guard.gpu.add(r);
                    metrics::gauge!("muster_task_gpu_utilisation_pct", &guard.labels).set(r.util_pct);
                    metrics::gauge!("muster_task_gpu_memory_bytes", &guard.labels).set(r.memory_bytes as f64);
                }
                let now = tokio::time::Instant::now();
                if guard.dogs.wants_beats() && guard.progress.changed() {
                    guard.dogs.beat(now);
                }
                let sampler = &mut guard.sampler;
                match guard.dogs.poll(now, || sampler.sample(pgid)) {
                    watchdog::Verdict::Fine => {}
                    watchdog::Verdict::Busy(why) => {
                        metrics::counter!("muster_watchdog_suspected_stalls_total").increment(1);
                        tracing::info!(pgid, why = %why, "suspected stall, but the task is busy");
                    }
                    watchdog::Verdict::Trip(t) => {
                        metrics::counter!("muster_agent_watchdog_trips_total", "kind" => t.kind).increment(1);
                        trip = Some(t);
                        break (task.stop(WATCHDOG_GRACE).await, false);
                    }
                }
            }
            Some(c) = ctrl.recv() => match c {
                Control::Stop(grace) => {
                    stopped = true;
                    break (task.stop(grace).await, false);
                }
                Control::Hint(h) if hint.is_none() => match HintWatch::start(h, checkpoint_dir, tokio::time::Instant::now(), clock.wall_ms()) {
                    Ok(w) => {
                        stopped = true;
                        task.signal(executor::TaskSignal::Checkpoint);
                        hint = Some(w);
                    }
                    Err(e) => {
                        stopped = true;
                        tracing::warn!(error = %e, "cannot write the checkpoint request; stopping the task");
                        break (task.stop(h.grace).await, false);
                    }
                },
                Control::Hint(_) => {}
            },
            _ = poll.tick(), if hint.is_some() => {
                let w = hint.as_mut().expect("guarded");
                match w.check(tokio::time::Instant::now()) {
                    Verdict::Wait => {}
                    Verdict::Done => break (task.stop(w.hint().grace).await, false),
                    Verdict::TimedOut => break (task.stop(w.hint().grace).await, true),
                }
            }
        }
    };
    let ended = Ended {
        exit: exit.map_err(|e| e.to_string()),
        checkpoint_failed,
        watchdog: trip,
        saved: None,
        usage: task.usage(),
        gpu: guard.gpu.mean_util_pct().map(|_| guard.gpu),
        image_pull_failed: false,
    };
    (ended, stopped)
}

/// Saves an attempt's checkpoint directory when its process has ended,
/// unless it finished on its own (exit 0, never told to stop, no watchdog:
/// it never runs again), the allocation does not checkpoint, it never
/// started, or the directory is what it was restored as.
pub(super) async fn save_on_exit(
    save: &SaveSpec,
    dir: &std::path::Path,
    ended: &Ended,
    stopped: bool,
) -> Option<Result<Saved, String>> {
    let finished = matches!(ended.exit, Ok(Exit::Code(0))) && !stopped && ended.watchdog.is_none();
    if !save.checkpointing || finished || ended.exit.is_err() {
        return None;
    }
    let d = dir.to_path_buf();
    let print = tokio::task::spawn_blocking(move || checkpoint::fingerprint(&d)).await.ok().flatten();
    if print.is_none() || print == save.restored {
        if print.is_some() {
            tracing::info!(
                alloc_id = save.naming.alloc,
                task = save.naming.task,
                "checkpoint unchanged since the attempt began; not saved again"
            );
        }
        return None;
    }
    let started = tokio::time::Instant::now();
    let mut saved = save.stores.save(&save.store, dir, save.naming, save.limit).await;
    if let Err(e) = &saved
        && save.store != CheckpointStore::Node
        && !e.contains("-byte cap")
        && !e.contains("changed while")
    {
        // The allocation's store cannot be written from here (a mount
        // missing, the object store unreachable): keep the checkpoint on
        // this node's own disk rather than lose it.
        tracing::warn!(
            alloc_id = save.naming.alloc, task = save.naming.task, store = %save.store, error = %e,
            "cannot write to the checkpoint store; saving to this node's disk instead"
        );
        saved = save.stores.save(&CheckpointStore::Node, dir, save.naming, save.limit).await;
    }
    if let Ok(Some(s)) = &saved {
        let elapsed = started.elapsed().as_secs_f64();
        metrics::histogram!("muster_agent_checkpoint_save_seconds").record(elapsed);
        tracing::info!(
            alloc_id = save.naming.alloc, task = save.naming.task, key = %s.key, bytes = s.packed.bytes,
            store = %s.store, seconds = elapsed, "checkpoint saved"
        );
    }
    saved.transpose()
}

/// Exports what a running attempt uses now, from its cgroup, per task
/// (`alloc_id`, `task`): one series per task running on the node, which the
/// exporter drops once the task has ended and no longer updates it.
fn report_usage(task: &dyn executor::Attempt, labels: &[(&'static str, String); 2]) {
    let Some(u) = task.usage_now() else { return };
    metrics::gauge!("muster_task_memory_bytes", labels).set(u.memory_bytes as f64);
    metrics::gauge!("muster_task_memory_peak_bytes", labels).set(u.peak_memory_bytes as f64);
    metrics::gauge!("muster_task_cpu_seconds", labels).set(u.cpu_ns as f64 / 1e9);
}
