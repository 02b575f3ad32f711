//! One stream to the leader: register, heartbeats, and each message the leader sends.

use super::*;

impl Agent {
    pub(super) async fn session(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<SessionEnd, String> {
        let addr = self.pick_address();
        self.addr = addr.clone();
        let endpoint = muster_tls::endpoint(&addr, self.cfg.tls.as_ref())
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10));
        let connect = endpoint.connect();
        // A connection that hangs must not keep the fence from firing.
        let channel = match self.fence_deadline() {
            Some(due) => tokio::time::timeout_at(due, connect)
                .await
                .map_err(|_| format!("{addr}: no connection before the fence was due"))?,
            None => connect.await,
        }
        .map_err(|e| format!("{addr}: {e}"))?;
        self.forget_claims();
        self.images_sent = None;
        let (out, out_rx) = mpsc::channel::<v1::AgentMessage>(1024);
        let send = |msg: Out| {
            let out = out.clone();
            async move { out.send(v1::AgentMessage { msg: Some(msg) }).await.map_err(|_| "stream closed".to_string()) }
        };
        send(Out::Register(v1::Register {
            node_id: self.cfg.node_id.clone(),
            resources: Some(self.cfg.resources),
            labels: self.cfg.labels.clone().into_iter().collect(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            running: self.registered_tasks(),
            address: self.cfg.address.clone(),
            ports: if self.cfg.ports.count == 0 { String::new() } else { self.cfg.ports.to_string() },
            checkpoint_address: self.cfg.checkpoint_address.clone(),
        }))
        .await?;
        let mut client = AgentServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.register_sent = tokio::time::Instant::now();
        let mut inbound = match client.connect(ReceiverStream::new(out_rx)).await {
            Ok(r) => {
                self.established = true;
                r.into_inner()
            }
            Err(status) => {
                if let Some(leader) = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok()) {
                    self.leader_hint = Some(leader.to_string());
                    return Ok(SessionEnd::Reconnect);
                }
                return Err(format!("{addr}: {}", status.message()));
            }
        };
        let mut every = Duration::from_secs(5);
        let mut heartbeat = tokio::time::interval(every);
        let mut last_heard = tokio::time::Instant::now();
        let every_sweep = self.cfg.janitor.every;
        let first_sweep = crate::janitor::first_sweep_after(&self.cfg.node_id, every_sweep);
        let mut janitor = tokio::time::interval_at(tokio::time::Instant::now() + first_sweep, every_sweep);
        janitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        last_heard = tokio::time::Instant::now();
                        if let Some(interval) = self.handle(m, &send).await? {
                            every = interval;
                            heartbeat = tokio::time::interval(every);
                        }
                        if self.exit_now {
                            return Ok(SessionEnd::Shutdown);
                        }
                    }
                    Ok(None) => return Ok(SessionEnd::Reconnect),
                    Err(status) => {
                        if let Some(leader) = status.metadata().get("x-muster-leader-addr").and_then(|v| v.to_str().ok()) {
                            self.leader_hint = Some(leader.to_string());
                            return Ok(SessionEnd::Reconnect);
                        }
                        return Err(status.message().to_string());
                    }
                },
                _ = janitor.tick() => self.sweep_work_dir().await,
                _ = super::sleep_until_some(self.fence_deadline()) => self.fence_if_due(),
                _ = heartbeat.tick() => {
                    // The leader acks every heartbeat: silence means it is
                    // frozen or cut off while the connection stays open.
                    if last_heard.elapsed() > every * LEADER_SILENT_INTERVALS {
                        tracing::warn!(node = %self.cfg.node_id, leader = %addr, "the leader stopped answering; reconnecting");
                        return Err(format!("{addr}: no answer for {LEADER_SILENT_INTERVALS} heartbeat intervals"));
                    }
                    send(Out::Heartbeat(v1::Heartbeat {
                        running: self.running.keys().map(|k| task_ref(*k)).collect(),
                        pulls: self.pulls.report(),
                    }))
                    .await?;
                    self.report_images(&send).await?;
                    self.fence.heartbeat_sent(tokio::time::Instant::now());
                    self.claim_deferred(&send).await?;
                }
                Some((key, exit)) = self.exits_rx.recv() => {
                    let report = self.finished(key, exit);
                    send_report(&report, &send).await?;
                    self.claim_deferred(&send).await?;
                }
                Some((key, prepared)) = self.prepared_rx.recv() => {
                    for unusable in self.launch(key, prepared) {
                        send(Out::CheckpointUnusable(unusable)).await?;
                    }
                }
                Some(seqs) = self.deleted_rx.recv() => {
                    for chunk in seqs.chunks(muster_core::sm::MAX_FORGET_CHECKPOINTS) {
                        send(Out::CheckpointsDeleted(v1::CheckpointsDeleted { seqs: chunk.to_vec() })).await?;
                    }
                }
                _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
            }
        }
    }

    /// Says which images the node's cache holds whole, when that changed
    /// since the last time this session said so (and once after it
    /// registers).
    async fn report_images<F, Fut>(&mut self, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let Some(images) = self.cfg.images.as_ref() else { return Ok(()) };
        let held = images.cache.held(muster_core::sm::MAX_NODE_IMAGES);
        if self.images_sent.as_ref() == Some(&held) {
            return Ok(());
        }
        send(Out::ImagesHeld(v1::ImagesHeld { digests: held.clone() })).await?;
        self.images_sent = Some(held);
        Ok(())
    }

    /// Handles one message; returns a new heartbeat interval when told one.
    pub(super) async fn handle<F, Fut>(&mut self, m: v1::SchedulerMessage, send: &F) -> Result<Option<Duration>, String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        match m.msg {
            Some(In::Registered(r)) => {
                tracing::info!(node = %self.cfg.node_id, "registered with the leader");
                self.fence.registered(self.register_sent, r.node_lost_after_ms);
                self.reconnect_spread = super::reconnect_spread(r.reconnect_spread_ms);
                for report in self.unrecorded.values() {
                    send_report(report, send).await?;
                }
                self.report_images(send).await?;
                return Ok(Some(Duration::from_millis(u64::from(r.heartbeat_interval_ms.max(100)))));
            }
            Some(In::Assign(a)) => {
                if let Some(key) = key_of(&a.task)
                    && !self.running.contains_key(&key)
                {
                    if (a.gpus as usize) <= self.spare_gpus() {
                        self.assigned.insert(key, a);
                        send(Out::Claim(v1::Claim { task: Some(task_ref(key)) })).await?;
                    } else {
                        tracing::warn!(
                            alloc_id = key.0,
                            task = key.1,
                            gpus = a.gpus,
                            spare = self.spare_gpus(),
                            "assignment waits: processes still stopping here hold its GPUs"
                        );
                        self.deferred.insert(key, a);
                    }
                }
            }
            Some(In::Granted(g)) => {
                if let Some(key) = key_of(&g.task)
                    && let Some(assign) = self.assigned.remove(&key)
                {
                    self.start(key, assign, g.attempt);
                }
            }
            Some(In::CheckpointGrants(g)) => {
                self.grants.replace(g.grants.into_iter().map(|g| (g.key, g.node)));
                tracing::debug!(node = %self.cfg.node_id, grants = self.grants.len(), "checkpoint grants");
            }
            Some(In::DeleteCheckpoints(d)) => self.delete_checkpoints(d),
            Some(In::PrefetchImage(p)) => match self.cfg.images.as_ref() {
                Some(images) => super::image::prefetch(&images.cache, &self.prefetching, &p.image),
                None => tracing::warn!(image = %p.image, "prefetch ignored: this node runs no container images"),
            },
            Some(In::Stop(s)) => {
                if let Some(key) = key_of(&s.task)
                    && let Some(ctrl) = self.running.get_mut(&key).and_then(|r| r.ctrl.take())
                {
                    tracing::info!(alloc = key.0, task = key.1, reason = %s.reason, "stopping task");
                    let _ = ctrl.send(Control::Stop(Duration::from_millis(u64::from(s.grace_ms))));
                }
            }
            Some(In::CheckpointHint(h)) => {
                if let Some(key) = key_of(&h.task) {
                    let hint = Hint {
                        epoch: h.preemption_epoch,
                        timeout: Duration::from_millis(u64::from(h.timeout_ms)),
                        max_deferral: Duration::from_millis(u64::from(h.max_deferral_ms)),
                        grace: Duration::from_millis(u64::from(h.grace_ms)),
                    };
                    self.checkpoint_hint(key, hint, send).await?;
                }
            }
            Some(In::Preempt(p)) => {
                if let Some(key) = key_of(&p.task) {
                    self.preempt(key, &p, send).await?;
                }
            }
            Some(In::Refused(r)) => {
                if let Some(key) = key_of(&r.task) {
                    tracing::info!(alloc = key.0, task = key.1, code = %r.code, message = %r.message, "leader refused");
                    if r.checkpoint {
                        // No manifest names what was written: delete it.
                        if let Some(saved) = self.uploads.remove(&key) {
                            let (stores, m) = (self.stores.clone(), saved.manifest());
                            tokio::spawn(async move {
                                if let Err(e) = stores.delete(&m).await {
                                    tracing::warn!(key = %m.key, error = %e, "cannot delete a refused checkpoint");
                                }
                            });
                        }
                        return Ok(None);
                    }
                    self.assigned.remove(&key);
                    self.deferred.remove(&key);
                    // A refused report is final (the task moved on): stop
                    // re-sending it and listing the task at registration.
                    if matches!(self.unrecorded.get(&key), Some(Report::Exited { .. } | Report::Watchdog { .. })) {
                        self.unrecorded.remove(&key);
                    }
                }
            }
            Some(In::NodeNotice(n)) => self.node_notice(&n),
            Some(In::HeartbeatAck(ack)) => {
                self.fence.heartbeat_answered();
                self.reconnect_spread = super::reconnect_spread(ack.reconnect_spread_ms);
            }
            Some(In::FetchLogs(f)) => {
                let reply = self.read_logs(&f);
                send(Out::LogData(reply)).await?;
            }
            Some(In::Recorded(r)) => {
                if let Some(key) = key_of(&r.task) {
                    self.uploads.remove(&key);
                }
                if let Some(key) = key_of(&r.task)
                    && self.unrecorded.remove(&key).is_some()
                    && !self.running.keys().any(|k| (k.0, k.1) == (key.0, key.1))
                {
                    // The attempt is over and the leader has its report: the
                    // checkpoint (if any) is in the replicated state, and a
                    // later attempt unpacks it into a fresh directory.
                    checkpoint::retire(&checkpoint::dir(&self.cfg.work_dir, key.0, key.1));
                }
            }
            None => {}
        }
        Ok(None)
    }

    /// The scheduler says what became of this node: log it, keep it in the
    /// status file, and exit when stopped if asked to.
    pub(super) fn node_notice(&mut self, n: &v1::NodeNotice) {
        let status = v1::NodeStatus::try_from(n.status)
            .map(|s| s.as_str_name().trim_start_matches("NODE_STATUS_").to_lowercase())
            .unwrap_or_else(|_| "unknown".into());
        tracing::info!(node = %self.cfg.node_id, status = %status, detail = %n.detail, deadline_ms = n.deadline_ms, "node status");
        if let Err(e) = fs::write(self.cfg.work_dir.join(NODE_STATUS_FILE), format!("{status}\n")) {
            tracing::warn!(error = %e, "cannot write the node status file");
        }
        if status == "stopped" && self.cfg.exit_when_stopped && self.running.is_empty() {
            tracing::info!(node = %self.cfg.node_id, "the node is stopped: exiting (--exit-when-stopped)");
            self.exit_now = true;
        }
    }

    /// A new stream starts with no claim in flight: claims made on an
    /// earlier one were answered there or never, and the leader of this one
    /// sends its assignments again. Kept, they would count as promised GPUs
    /// forever and hold back every later assignment.
    pub(super) fn forget_claims(&mut self) {
        self.assigned.clear();
        self.deferred.clear();
    }

    /// GPUs neither running nor promised to an assignment being claimed.
    pub(super) fn spare_gpus(&self) -> usize {
        let promised: usize = self.assigned.values().map(|a| a.gpus as usize).sum();
        self.free_gpus.len().saturating_sub(promised)
    }

    /// Claims the deferred assignments whose GPUs have come free, in key
    /// order. One the leader has since moved on from is refused, harmlessly.
    pub(super) async fn claim_deferred<F, Fut>(&mut self, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let keys: Vec<Key> = self.deferred.keys().copied().collect();
        for key in keys {
            let gpus = self.deferred[&key].gpus as usize;
            if gpus <= self.spare_gpus() {
                let a = self.deferred.remove(&key).expect("listed");
                self.assigned.insert(key, a);
                tracing::info!(alloc_id = key.0, task = key.1, "its GPUs came free; claiming the assignment");
                send(Out::Claim(v1::Claim { task: Some(task_ref(key)) })).await?;
            }
        }
        Ok(())
    }

    /// A gang teardown wants this task stopped. The first `Preempt` of an
    /// attempt stops it (SIGTERM, grace, SIGKILL); repeats change nothing.
    /// A task not running here is acked at once, unless its report is
    /// already on its way.
    pub(super) async fn preempt<F, Fut>(&mut self, key: Key, p: &v1::Preempt, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let epoch = p.preemption_epoch;
        if let Some(r) = self.running.get_mut(&key) {
            // The first stop of an attempt, or a later round (a cancel while
            // the task was asked to checkpoint): stop it now, and ack under
            // the newest epoch.
            if r.preempt.is_none_or(|e| e < epoch) {
                r.preempt = Some(epoch);
                tracing::info!(alloc_id = key.0, task = key.1, epoch, grace_ms = p.grace_ms, "preempting task");
                if let Some(ctrl) = r.ctrl.take() {
                    let _ = ctrl.send(Control::Stop(Duration::from_millis(u64::from(p.grace_ms))));
                }
            }
            return Ok(());
        }
        self.ack_not_running(key, epoch, send).await
    }

    /// A priority preemption asks this task to checkpoint, then stop. The
    /// first hint of an attempt starts the protocol; repeats change nothing.
    pub(super) async fn checkpoint_hint<F, Fut>(&mut self, key: Key, hint: Hint, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        if let Some(r) = self.running.get_mut(&key) {
            if r.preempt.is_none() {
                r.preempt = Some(hint.epoch);
                tracing::info!(
                    alloc_id = key.0,
                    task = key.1,
                    epoch = hint.epoch,
                    timeout_ms = hint.timeout.as_millis() as u64,
                    "asking task to checkpoint"
                );
                if let Some(ctrl) = &r.ctrl {
                    let _ = ctrl.send(Control::Hint(hint));
                }
            }
            return Ok(());
        }
        self.ack_not_running(key, hint.epoch, send).await
    }

    /// A stop request for a task not running here is acked at once, unless
    /// its report is already on its way.
    pub(super) async fn ack_not_running<F, Fut>(&mut self, key: Key, epoch: u64, send: &F) -> Result<(), String>
    where
        F: Fn(Out) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        if let Some(Report::Preempted { checkpoint, ack }) = self.unrecorded.get_mut(&key)
            && ack.preemption_epoch < epoch
        {
            // The task stopped for an earlier round whose ack came too late
            // (the leader moved the teardown to a new epoch): the same stop
            // answers this round.
            ack.preemption_epoch = epoch;
            if let Some(c) = checkpoint.as_mut() {
                c.preemption_epoch = epoch;
            }
            let report = self.unrecorded[&key].clone();
            return send_report(&report, send).await;
        }
        if self.unrecorded.contains_key(&key) {
            return Ok(());
        }
        tracing::info!(alloc_id = key.0, task = key.1, epoch, "preempt for a task not running here; acking");
        let report = Report::Preempted {
            checkpoint: None,
            ack: v1::Preempted {
                task: Some(task_ref(key)),
                preemption_epoch: epoch,
                exit_code: None,
                signal: None,
                checkpoint_failed: false,
                usage: None,
            },
        };
        self.unrecorded.insert(key, report.clone());
        send_report(&report, send).await
    }

    /// Reads part of an attempt's log file for the leader.
    pub(super) fn read_logs(&self, f: &v1::FetchLogs) -> v1::LogData {
        use std::io::{Read, Seek, SeekFrom};
        let (out, err) = executor::log_paths(&self.cfg.work_dir, f.alloc_id, f.task_index, f.attempt);
        let path = if f.stderr { err } else { out };
        let running = self.running.keys().any(|k| k.0 == f.alloc_id && k.1 == f.task_index);
        let mut reply = v1::LogData { request_id: f.request_id, ..Default::default() };
        let result = (|| -> std::io::Result<()> {
            let mut file = fs::File::open(&path)?;
            file.seek(SeekFrom::Start(f.offset))?;
            let mut buf = Vec::new();
            file.take(u64::from(f.max_bytes.min(1 << 20))).read_to_end(&mut buf)?;
            reply.eof = !running && (buf.len() as u64) < u64::from(f.max_bytes);
            reply.data = buf;
            Ok(())
        })();
        if let Err(e) = result {
            reply.error = format!(
                "no log for attempt {} of task {} of allocation {} on this node: {e}",
                f.attempt, f.task_index, f.alloc_id
            );
        }
        reply
    }
}
