//! One attempt: starting it, adopting it after a restart, and what its end reports (its waiter is in `waiter`).

use muster_proto::bounds;

use super::*;

/// How an attempt ended, from its waiter.
pub(super) struct Ended {
    pub(super) exit: Result<Exit, String>,
    /// It was hinted and did not checkpoint before the deadline.
    pub(super) checkpoint_failed: bool,
    /// A watchdog stopped it.
    pub(super) watchdog: Option<watchdog::Trip>,
    /// The checkpoint its directory was saved as, if it was saved (or why
    /// it could not be).
    pub(super) saved: Option<Result<Saved, String>>,
    /// What it used, from its cgroup.
    pub(super) usage: Option<crate::cgroup::Usage>,
    /// What its GPUs did while it ran (where NVML reads them).
    pub(super) gpu: Option<watchdog::GpuUsage>,
    /// It never ran because its image could not be pulled.
    pub(super) image_pull_failed: bool,
}

impl Ended {
    /// An attempt that never ran a process.
    pub(super) fn not_run(why: String) -> Ended {
        Ended {
            exit: Err(why),
            checkpoint_failed: false,
            watchdog: None,
            saved: None,
            usage: None,
            gpu: None,
            image_pull_failed: false,
        }
    }

    /// An attempt whose image could not be pulled.
    pub(super) fn pull_failed(why: String) -> Ended {
        Ended { image_pull_failed: true, ..Ended::not_run(why) }
    }
}

/// An attempt whose checkpoint was being restored, ready to launch (or
/// stopped first).
pub(super) struct Prepared {
    pub(super) assign: v1::Assign,
    pub(super) attempt: u32,
    pub(super) ctrl_rx: mpsc::UnboundedReceiver<Control>,
    /// The manifest restored, and the directory's fingerprint after it.
    pub(super) restored: Option<(u64, Option<u64>)>,
    /// The manifests that could not be restored, with why.
    pub(super) unusable: Vec<(u64, String)>,
    /// Told to stop (or checkpoint) before it could start.
    pub(super) stopped: bool,
    /// Its image, pulled (or why not), when it runs in one.
    pub(super) image: Option<Result<Arc<muster_registry::PulledImage>, String>>,
}

pub(super) struct Running {
    /// The waiter's control channel; `None` once told to stop.
    pub(super) ctrl: Option<mpsc::UnboundedSender<Control>>,
    pub(super) gpus: Vec<u32>,
    pub(super) attempt: u32,
    /// The preemption epoch of the first `Preempt` for this attempt.
    pub(super) preempt: Option<u64>,
}

impl Agent {
    /// Sweeps the work dir (see [`crate::janitor`]): what this agent runs,
    /// was assigned, or has not had confirmed stays.
    pub(super) async fn sweep_work_dir(&mut self) {
        let mut in_use = crate::janitor::InUse::default();
        for (k, r) in &self.running {
            in_use.tasks.insert((k.0, k.1));
            in_use.attempts.insert((k.0, k.1, r.attempt));
        }
        for k in self.assigned.keys().chain(self.deferred.keys()).chain(self.unrecorded.keys()) {
            in_use.tasks.insert((k.0, k.1));
        }
        let (dir, cfg) = (self.cfg.work_dir.clone(), self.cfg.janitor);
        let now = std::time::UNIX_EPOCH + Duration::from_millis(self.cfg.clock.wall_ms());
        let swept = tokio::task::spawn_blocking(move || crate::janitor::sweep(&dir, &in_use, now, &cfg)).await;
        match swept {
            Ok(Ok(s)) => {
                metrics::gauge!("muster_agent_work_dir_bytes").set(s.work_dir_bytes as f64);
                metrics::counter!("muster_agent_janitor_removed_total", "kind" => "checkpoint")
                    .increment(s.checkpoints_removed);
                metrics::counter!("muster_agent_janitor_removed_total", "kind" => "log").increment(s.logs_removed);
                metrics::counter!("muster_agent_janitor_removed_total", "kind" => "container")
                    .increment(s.containers_removed);
                if s.checkpoints_removed + s.logs_removed > 0 {
                    tracing::info!(
                        node = %self.cfg.node_id,
                        checkpoints = s.checkpoints_removed,
                        attempts_logs = s.logs_removed,
                        freed_bytes = s.bytes_freed,
                        work_dir_bytes = s.work_dir_bytes,
                        "work dir swept"
                    );
                }
            }
            Ok(Err(e)) => tracing::warn!(node = %self.cfg.node_id, error = %e, "cannot sweep the work dir"),
            Err(e) => tracing::warn!(node = %self.cfg.node_id, error = %e, "the work-dir sweep failed"),
        }
    }

    /// Takes over the attempts an earlier agent left: a live one is watched
    /// again (its watchdogs' budget counted from its real start); one that
    /// ended meanwhile is reported with the status its shim wrote. Either
    /// way it is listed at the next `Register`.
    pub(super) fn adopt_leftovers(&mut self) {
        for (key, r) in std::mem::take(&mut self.leftovers) {
            for g in &r.gpus {
                self.free_gpus.remove(g);
            }
            let (ctrl_tx, ctrl_rx) = mpsc::unbounded_channel::<Control>();
            self.running
                .insert(key, Running { ctrl: Some(ctrl_tx), gpus: r.gpus.clone(), attempt: r.attempt, preempt: None });
            let status = executor::status_path(&self.cfg.work_dir, key.0, key.1, key.2);
            if executor::alive(r.pgid) && executor::is_shim(r.pgid) {
                let ran = Duration::from_millis(self.cfg.clock.wall_ms().saturating_sub(r.started_ms));
                let limits = watchdog::Limits {
                    budget: (r.walltime_s > 0).then(|| Duration::from_secs(r.walltime_s).saturating_sub(ran)),
                    stall: (r.stall_s > 0).then(|| Duration::from_secs(u64::from(r.stall_s))),
                    gpu_health: r.gpu_health,
                };
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    attempt = r.attempt,
                    pgid = r.pgid,
                    "adopted a task the previous agent left running"
                );
                // Its record does not say where its allocation's checkpoints
                // go: an adopted attempt saves to this node's own disk,
                // which the leader always takes.
                let save = SaveSpec {
                    stores: self.stores.clone(),
                    checkpointing: r.checkpointing,
                    store: CheckpointStore::Node,
                    limit: muster_core::sm::DEFAULT_MAX_CHECKPOINT_BYTES,
                    restored: None,
                    naming: Naming { alloc: key.0, task: key.1, attempt: r.attempt, epoch: key.2 },
                };
                let cgroup = self.cfg.isolation.as_ref().map(|iso| iso.attempt(key));
                let container = r.image.as_ref().map(|digest| self.readopt_image(key, r.attempt, digest));
                self.watch(
                    key,
                    r.attempt,
                    Box::new(executor::adopt(r.pgid, status, cgroup)),
                    limits,
                    ctrl_rx,
                    save,
                    container,
                );
            } else {
                let exit = executor::read_status(&status)
                    .ok_or_else(|| "the task ended while its agent was down, and its exit status was lost".to_string());
                tracing::info!(alloc_id = key.0, task = key.1, exit = ?exit, "a task the previous agent left ended meanwhile");
                // What it left running (a child that escaped its process
                // group) dies before its GPUs are free.
                let cgroup = self.cfg.isolation.as_ref().map(|iso| iso.attempt(key));
                let exits = self.exits_tx.clone();
                let container = crate::container::attempt_dir(&self.cfg.work_dir, key.0, key.1, r.attempt);
                tokio::spawn(async move {
                    let mut usage = None;
                    if let Some(cg) = cgroup {
                        cg.kill_all().await;
                        usage = Some(cg.usage());
                        cg.remove();
                    }
                    if let Err(e) = crate::container::remove_attempt_dirs(&container) {
                        tracing::warn!(dir = %container.display(), error = %e, "cannot remove a container's directories");
                    }
                    let ended = Ended {
                        exit,
                        checkpoint_failed: false,
                        watchdog: None,
                        saved: None,
                        usage,
                        gpu: None,
                        image_pull_failed: false,
                    };
                    let _ = exits.send((key, ended));
                });
            }
        }
    }

    /// What an adopted attempt in a container holds: its image, pinned in
    /// the cache again so no pull evicts the layers it runs on, and its
    /// directory, removed when it ends.
    fn readopt_image(&self, key: Key, attempt: u32, digest: &str) -> InContainer {
        let image = self.cfg.images.as_ref().and_then(|i| i.cache.cached(digest)).map(Arc::new);
        if image.is_none() {
            tracing::warn!(alloc_id = key.0, task = key.1, digest, "an adopted task's image is no longer cached here");
        }
        InContainer { _image: image, dir: crate::container::attempt_dir(&self.cfg.work_dir, key.0, key.1, attempt) }
    }

    /// Watches a started (or adopted) attempt until it ends, then tells the
    /// session through `exits`.
    #[allow(clippy::too_many_arguments)] // each is one part of the attempt the waiter owns
    pub(super) fn watch(
        &self,
        key: Key,
        attempt: u32,
        mut task: Box<dyn executor::Attempt>,
        limits: watchdog::Limits,
        ctrl_rx: mpsc::UnboundedReceiver<Control>,
        save: SaveSpec,
        container: Option<InContainer>,
    ) {
        let dogs = Watchdogs::new(self.cfg.watchdog, limits, tokio::time::Instant::now());
        let progress = watchdog::progress_path(&self.cfg.work_dir, key.0, key.1, attempt);
        let guard = Guard {
            labels: [("alloc_id", key.0.to_string()), ("task", key.1.to_string())],
            dogs,
            progress: ProgressFile::new(progress),
            sampler: (self.cfg.sampler)(),
            poll: self.cfg.watchdog.poll,
            gpus: self.running.get(&key).map(|r| r.gpus.clone()).unwrap_or_default(),
            gpu: Default::default(),
        };
        let checkpoint_dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let exits = self.exits_tx.clone();
        let clock = self.cfg.clock.clone();
        let seal = self.cfg.run_as.switches();
        tokio::spawn(async move {
            let (mut ended, stopped) = watch_task(task.as_mut(), ctrl_rx, &checkpoint_dir, guard, &clock).await;
            // Its writable layer goes with it (its mounts went with its
            // namespace); its image may be evicted from now on.
            if let Some(c) = container
                && let Err(e) = crate::container::remove_attempt_dirs(&c.dir)
            {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "cannot remove the attempt's container directory");
            }
            // Nothing of the attempt runs now; the directory is the
            // agent's again before it is read (only needed where tasks run
            // as other accounts).
            if seal
                && let Err(e) = checkpoint::seal(&checkpoint_dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "cannot take the checkpoint directory back");
            }
            ended.saved = save_on_exit(&save, &checkpoint_dir, &ended, stopped).await;
            let _ = exits.send((key, ended));
        });
    }

    /// Starts a granted attempt: at once when it has no checkpoint to
    /// restore; otherwise its checkpoint is restored first (fetched from
    /// its store, checked against its manifest), off this loop, and the
    /// attempt launches when [`Prepared`] comes back. A stop meanwhile ends
    /// the restore, and the attempt never runs.
    pub(super) fn start(&mut self, key: Key, a: v1::Assign, attempt: u32) {
        let gpus: Vec<u32> = self.free_gpus.iter().take(a.gpus as usize).copied().collect();
        for g in &gpus {
            self.free_gpus.remove(g);
        }
        let (ctrl_tx, mut ctrl_rx) = mpsc::unbounded_channel::<Control>();
        self.running.insert(key, Running { ctrl: Some(ctrl_tx), gpus, attempt, preempt: None });
        let dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        if a.restore.is_empty() && a.image.is_empty() {
            let prepared = match checkpoint::reset(&dir) {
                Ok(()) => Prepared {
                    assign: a,
                    attempt,
                    ctrl_rx,
                    restored: None,
                    unusable: Vec::new(),
                    stopped: false,
                    image: None,
                },
                Err(e) => {
                    let why = format!("cannot create {}: {e}", dir.display());
                    let _ = self.exits_tx.send((key, Ended::not_run(why)));
                    return;
                }
            };
            self.launch(key, prepared);
            return;
        }
        let stores = self.stores.clone();
        let prepared_tx = self.prepared_tx.clone();
        let images = self.cfg.images.as_ref().map(|i| i.cache.clone());
        let pulls = self.pulls.clone();
        tokio::spawn(async move {
            let mut unusable = Vec::new();
            let mut restored = None;
            let mut stopped = false;
            for r in &a.restore {
                let Some(m) = r.manifest.as_ref() else { continue };
                let started = tokio::time::Instant::now();
                tokio::select! {
                    got = stores.restore(m, &r.source, &dir) => match got {
                        Ok(()) => {
                            let elapsed = started.elapsed();
                            tracing::info!(
                                alloc_id = key.0, task = key.1, attempt, seq = m.seq, bytes = m.bytes, store = %m.store,
                                seconds = elapsed.as_secs_f64(), "checkpoint restored"
                            );
                            metrics::histogram!("muster_agent_checkpoint_restore_seconds").record(elapsed.as_secs_f64());
                            let d = dir.clone();
                            let print = tokio::task::spawn_blocking(move || checkpoint::fingerprint(&d)).await.ok().flatten();
                            restored = Some((m.seq, print));
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(alloc_id = key.0, task = key.1, seq = m.seq, error = %e, "checkpoint not restored");
                            unusable.push((m.seq, e));
                        }
                    },
                    _ = ctrl_rx.recv() => {
                        stopped = true;
                        break;
                    }
                }
            }
            if restored.is_none() && !stopped {
                let _ = checkpoint::reset(&dir);
            }
            let image = if a.image.is_empty() || stopped {
                None
            } else {
                let (pulled, stopped_now) = pull(images.as_ref(), &pulls, &a.image, key, &mut ctrl_rx).await;
                stopped = stopped_now;
                Some(pulled)
            };
            let _ =
                prepared_tx.send((key, Prepared { assign: a, attempt, ctrl_rx, restored, unusable, stopped, image }));
        });
    }

    /// Launches an attempt whose checkpoint (if any) is in place. Returns
    /// the reports of the checkpoints it could not restore.
    pub(super) fn launch(&mut self, key: Key, p: Prepared) -> Vec<v1::CheckpointUnusable> {
        let Prepared { assign: a, attempt, ctrl_rx, restored, unusable, stopped, image } = p;
        if !self.running.contains_key(&key) {
            return Vec::new(); // dropped meanwhile (the agent is shutting down)
        }
        let reports: Vec<v1::CheckpointUnusable> = unusable
            .iter()
            .map(|(seq, why)| v1::CheckpointUnusable {
                task: Some(task_ref(key)),
                checkpoint_epoch: 0,
                reason: bounds::truncate(&format!("checkpoint {seq} could not be restored: {why}"), bounds::AGENT_TEXT),
                seq: *seq,
            })
            .collect();
        if stopped {
            tracing::info!(alloc_id = key.0, task = key.1, attempt, "stopped while it was being prepared");
            let _ = self.exits_tx.send((
                key,
                Ended::not_run("stopped before it started (its checkpoint or image was being fetched)".into()),
            ));
            return reports;
        }
        let image = match image {
            None => None,
            Some(Ok(img)) => Some(img),
            Some(Err(e)) => {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "image pull failed");
                let _ = self.exits_tx.send((key, Ended::pull_failed(format!("{IMAGE_PULL_FAILED}: {e}"))));
                return reports;
            }
        };
        let container = match image.as_ref().map(|img| self.container_launch(img, &a.mounts, &a.workdir)).transpose() {
            Ok(c) => c,
            Err(e) => {
                let _ = self.exits_tx.send((key, Ended::not_run(e)));
                return reports;
            }
        };
        let gpus = self.running[&key].gpus.clone();
        let checkpoint_dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let user = self.cfg.run_as.for_owner(&a.owner).cloned();
        let mut env: BTreeMap<String, String> = a.env.into_iter().collect();
        // Secrets reach the task's environment and nothing else (no log
        // line, no file of the agent's).
        env.extend(a.secret_env);
        let progress = watchdog::progress_path(&self.cfg.work_dir, key.0, key.1, attempt);
        // An earlier attempt's progress file may be there, unless the
        // directory is new.
        if !progress.parent().is_some_and(make_new_dir) {
            let _ = fs::remove_file(&progress);
        }
        env.insert("MUSTER_PROGRESS_FILE".into(), progress.display().to_string());
        env.insert("MUSTER_NODE_ID".into(), self.cfg.node_id.clone());
        let limits = watchdog::Limits {
            budget: (a.walltime_s > 0).then(|| Duration::from_secs(a.walltime_s)),
            stall: (a.stall_timeout_s > 0).then(|| Duration::from_secs(u64::from(a.stall_timeout_s))),
            gpu_health: a.gpus > 0 && self.cfg.watchdog.gpu_health,
        };
        let (walltime_s, stall_s, checkpointing) = (a.walltime_s, a.stall_timeout_s, a.checkpointing);
        if restored.is_some() {
            env.insert("MUSTER_RESUME".into(), "1".into());
            if let Some(data) = checkpoint::inline_data(&checkpoint_dir) {
                env.insert("CHECKPOINT_DATA".into(), data);
            }
        }
        let store = CheckpointStore::parse(&a.checkpoint_store).unwrap_or(CheckpointStore::Node);
        let save = SaveSpec {
            stores: self.stores.clone(),
            checkpointing,
            store,
            limit: if a.max_checkpoint_bytes == 0 {
                muster_core::sm::DEFAULT_MAX_CHECKPOINT_BYTES
            } else {
                a.max_checkpoint_bytes
            },
            restored: restored.and_then(|(_, print)| print),
            naming: Naming { alloc: key.0, task: key.1, attempt, epoch: key.2 },
        };
        let launch = TaskLaunch {
            alloc: key.0,
            task: key.1,
            gang_size: a.gang_size,
            epoch: key.2,
            attempt,
            command: a.command,
            env,
            peers: a.peers,
            ports: a.ports.iter().filter_map(|&p| u16::try_from(p).ok()).collect(),
            gpu_ids: gpus.clone(),
            checkpoint_dir: checkpoint_dir.clone(),
            user: user.clone(),
            container,
        };
        let image_digest = image.as_ref().map(|img| img.digest.clone());
        let in_container = image.map(|img| InContainer {
            _image: Some(img),
            dir: crate::container::attempt_dir(&self.cfg.work_dir, key.0, key.1, attempt),
        });
        // Its record's slot first: an attempt the next agent could not find
        // is never started (see `Records`).
        let reserved = match self.records.reserve(key) {
            Err(e) if !self.cfg.start_without_record => Err(format!(
                "cannot record the attempt in {}: {e}; not started",
                self.cfg.work_dir.join("running").display()
            )),
            Err(e) => {
                // The deliberate bug: started all the same.
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "starting an attempt without its record");
                Ok(())
            }
            Ok(()) => Ok(()),
        };
        let cgroup_limits =
            crate::cgroup::Limits { mem_mb: a.mem_mb, cpus: a.cpus, pids: u64::from(a.pids_max), gpus: gpus.clone() };
        let muster = executor::Muster {
            exe: self.cfg.task_shim.as_deref().or(self.cfg.exe.as_deref()),
            shim: self.cfg.task_shim.is_some(),
        };
        let spawned = reserved
            .and_then(|()| match &user {
                // The task's own directory becomes its account's.
                Some(u) => checkpoint::hand_over(&checkpoint_dir, u).map_err(|e| {
                    format!("cannot give {} to {} (uid {}): {e}; not started", checkpoint_dir.display(), u.name, u.uid)
                }),
                None => Ok(()),
            })
            .and_then(|()| match &self.cfg.isolation {
                Some(iso) => iso.create(key, &cgroup_limits).map(Some),
                None => Ok(None),
            })
            .and_then(|cgroup| {
                self.executor.spawn(&launch, &self.cfg.work_dir, muster, cgroup.clone()).map_err(|e| {
                    if let Some(cg) = cgroup {
                        cg.remove();
                    }
                    e.to_string()
                })
            });
        match spawned {
            Ok(mut task) => {
                let record = Record {
                    pgid: task.pgid(),
                    attempt,
                    gpus: gpus.clone(),
                    walltime_s,
                    stall_s,
                    gpu_health: limits.gpu_health,
                    started_ms: self.cfg.clock.wall_ms(),
                    checkpointing,
                    image: image_digest,
                };
                if let Err(e) = self.records.put(key, &record)
                    && !self.cfg.start_without_record
                {
                    // Its reserved slot would not take it: stop it now
                    // rather than leave it where no agent can find it.
                    tracing::error!(alloc_id = key.0, task = key.1, error = %e, "cannot record a started attempt; killing it");
                    task.signal(executor::TaskSignal::Kill);
                }
                // After the spawn, which creates the attempt's log files.
                for r in &reports {
                    self.note_in_log(key, attempt, &format!("muster: {}", r.reason));
                }
                if !reports.is_empty() && restored.is_none() {
                    self.note_in_log(
                        key,
                        attempt,
                        "muster: no stored checkpoint could be restored; the task starts afresh",
                    );
                }
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    attempt,
                    pgid = task.pgid(),
                    resumed = restored.is_some(),
                    "task started"
                );
                self.watch(key, attempt, task, limits, ctrl_rx, save, in_container);
            }
            Err(e) => {
                if user.is_some() {
                    let _ = checkpoint::seal(&checkpoint_dir);
                }
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "task did not start");
                let _ = self.exits_tx.send((key, Ended::not_run(e)));
            }
        }
        reports
    }

    /// What an attempt's end reports. Whenever a process of a checkpointing
    /// allocation ends (on its own, killed by a peer's failure or by
    /// SIGKILL, stopped by a watchdog, or preempted), what it left in its
    /// checkpoint directory goes with the report if it changed since the
    /// checkpoint the attempt was given: the next attempt resumes from it.
    /// A successful exit uploads nothing: a finished task never runs again.
    pub(super) fn finished(&mut self, key: Key, ended: Ended) -> Report {
        let Ended { exit, checkpoint_failed, watchdog, saved, usage, gpu, image_pull_failed } = ended;
        let running = self.running.remove(&key);
        let (attempt, preempt) = running.as_ref().map_or((0, None), |r| (r.attempt, r.preempt));
        if let Some(r) = running {
            self.free_gpus.extend(r.gpus);
        }
        self.records.clear(key);
        let _ = fs::remove_file(executor::status_path(&self.cfg.work_dir, key.0, key.1, key.2));
        let (exit_code, signal, error) = match exit {
            Ok(Exit::Code(c)) => (Some(c), None, String::new()),
            Ok(Exit::Signal(s)) => (None, Some(s), String::new()),
            Err(e) => (None, None, e),
        };
        if let Some(u) = usage {
            self.account(key, attempt, &u);
        }
        let usage = usage_to_proto(usage.as_ref(), gpu.as_ref());
        let dir = checkpoint::dir(&self.cfg.work_dir, key.0, key.1);
        let upload = match saved {
            Some(Ok(saved)) => {
                let upload = v1::CheckpointUpload {
                    task: Some(task_ref(key)),
                    preemption_epoch: preempt.unwrap_or(0),
                    manifest: Some(saved.manifest()),
                    on_exit: preempt.is_none(),
                };
                self.uploads.insert(key, saved);
                Some(upload)
            }
            Some(Err(e)) => {
                tracing::warn!(alloc_id = key.0, task = key.1, error = %e, "checkpoint not saved");
                self.note_in_log(key, attempt, &format!("muster: checkpoint not saved: {e}"));
                None
            }
            None => None,
        };
        let bytes = upload.as_ref().and_then(|c| c.manifest.as_ref()).map_or(0, |m| m.bytes);
        let report = match preempt {
            None if watchdog.is_some() => {
                let trip = watchdog.expect("guarded");
                checkpoint::retire(&dir);
                tracing::warn!(alloc_id = key.0, task = key.1, kind = trip.kind, detail = %trip.detail, checkpoint_bytes = bytes, "watchdog tripped; task stopped");
                self.note_in_log(
                    key,
                    attempt,
                    &format!("muster: stopped by the {} watchdog: {}", trip.kind, trip.detail),
                );
                Report::Watchdog {
                    trip: v1::WatchdogTripped {
                        task: Some(task_ref(key)),
                        kind: trip.kind.to_string(),
                        detail: bounds::truncate(&trip.detail, bounds::AGENT_TEXT),
                        usage,
                    },
                    checkpoint: upload,
                }
            }
            Some(epoch) => {
                if checkpoint_failed {
                    tracing::warn!(
                        alloc_id = key.0,
                        task = key.1,
                        epoch,
                        "no checkpoint before the deadline; task killed"
                    );
                    self.note_in_log(key, attempt, "muster: no checkpoint before the deadline; the task was killed");
                }
                tracing::info!(
                    alloc_id = key.0, task = key.1, epoch, exit_code = ?exit_code, signal = ?signal,
                    checkpoint_bytes = bytes, "task preempted"
                );
                Report::Preempted {
                    checkpoint: upload,
                    ack: v1::Preempted {
                        task: Some(task_ref(key)),
                        preemption_epoch: epoch,
                        exit_code,
                        signal,
                        checkpoint_failed,
                        usage,
                    },
                }
            }
            None => {
                checkpoint::retire(&dir);
                tracing::info!(alloc_id = key.0, task = key.1, exit_code = ?exit_code, signal = ?signal, checkpoint_bytes = bytes, "task exited");
                if !error.is_empty() {
                    self.note_in_log(key, attempt, &format!("muster: the task did not start: {error}"));
                }
                let failed = error.is_empty() && exit_code != Some(0);
                let stderr_tail = if failed {
                    let (_, err) = executor::log_paths(&self.cfg.work_dir, key.0, key.1, attempt);
                    executor::stderr_tail(&err)
                } else {
                    String::new()
                };
                Report::Exited {
                    exit: v1::TaskExited {
                        task: Some(task_ref(key)),
                        exit_code,
                        signal,
                        error: bounds::truncate(&error, bounds::AGENT_TEXT),
                        stderr_tail,
                        usage,
                        image_pull_failed: image_pull_failed && !error.is_empty(),
                    },
                    checkpoint: upload,
                }
            }
        };
        self.unrecorded.insert(key, report.clone());
        report
    }

    /// Logs what an attempt used, and says in its log when the kernel
    /// killed part of it for going over its memory limit.
    fn account(&self, key: Key, attempt: u32, u: &crate::cgroup::Usage) {
        let mib = |b: u64| b.div_ceil(1024 * 1024);
        tracing::info!(
            alloc_id = key.0,
            task = key.1,
            attempt,
            peak_memory_mb = mib(u.peak_memory_bytes),
            cpu_s = u.cpu_ns as f64 / 1e9,
            oom_kills = u.oom_kills,
            "attempt accounted"
        );
        if u.oom_kills > 0 {
            metrics::counter!("muster_agent_oom_kills_total").increment(1);
            self.note_in_log(
                key,
                attempt,
                &format!(
                    "muster: out of memory: the kernel killed {} process(es) of this task at its {} MiB limit (peak {} MiB)",
                    u.oom_kills,
                    mib(u.memory_limit_bytes),
                    mib(u.peak_memory_bytes)
                ),
            );
        }
    }

    /// Appends a line to an attempt's stderr log, where its owner looks.
    pub(super) fn note_in_log(&self, key: Key, attempt: u32, line: &str) {
        use std::io::Write;
        let (_, err) = executor::log_paths(&self.cfg.work_dir, key.0, key.1, attempt);
        if let Some(parent) = err.parent() {
            let _ = fs::create_dir_all(parent);
        }
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(err) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// What an attempt used, as its end report carries it (`None`: nothing
/// was read: no cgroup, no NVML).
pub(super) fn usage_to_proto(
    u: Option<&crate::cgroup::Usage>,
    gpu: Option<&watchdog::GpuUsage>,
) -> Option<v1::AttemptUsage> {
    if u.is_none() && gpu.is_none() {
        return None;
    }
    let u = u.copied().unwrap_or_default();
    Some(v1::AttemptUsage {
        peak_memory_bytes: u.peak_memory_bytes,
        cpu_ms: u.cpu_ns / 1_000_000,
        oom_kills: u32::try_from(u.oom_kills).unwrap_or(u32::MAX),
        memory_limit_bytes: u.memory_limit_bytes,
        gpu_util_pct: gpu.and_then(watchdog::GpuUsage::mean_util_pct),
        peak_gpu_memory_bytes: gpu.map_or(0, |g| g.peak_memory_bytes),
    })
}

/// Makes `dir` (`logs/alloc-A/task-T`) and its parent when missing; true
/// when `dir` is new, so holds nothing. The parent first: a task's
/// allocation is usually new on its node, so this is two `mkdir`s, not
/// `create_dir_all`'s three (the child's failing first) and a removal.
pub(super) fn make_new_dir(dir: &std::path::Path) -> bool {
    if let Some(parent) = dir.parent()
        && let Err(e) = fs::create_dir(parent)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        let _ = fs::create_dir_all(parent);
    }
    match fs::create_dir(dir) {
        Ok(()) => true,
        // The parent went meanwhile (a sweep prunes empty ones).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::create_dir_all(dir).is_ok(),
        Err(_) => false,
    }
}
