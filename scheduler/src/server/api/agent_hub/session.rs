//! One agent's stream: register, reconcile, send what `plan_sync` plans, turn agent messages into commands.

use muster_proto::bounds::Bounded;

use super::*;
use crate::server::raft::ProposeError;

pub(super) struct Session {
    s: Consensus,
    own: HubHandles,
    cfg: HubConfig,
    preemption: PreemptionConfig,
    node: NodeId,
    tx: Outbound,
    /// What this stream has told its agent.
    sent: SentMemory,
    /// With the injected bug `spare-failed-gang-peers`: the attempts this
    /// stream never stops.
    spared: std::collections::BTreeSet<TaskKey>,
    /// The agent's messages whose commands are in the log's queue, oldest
    /// first, each with what to do with its outcome (see [`Then`]).
    in_flight: InFlight,
}

/// The messages' commands waiting for their outcomes, oldest first, each
/// with what follows it. Outcomes come in the order the commands were
/// queued (entries apply in log order), so only the oldest is waited on.
type InFlight = std::collections::VecDeque<(Then, crate::server::raft::Proposed)>;

/// The most of one agent's messages whose commands wait for their outcomes
/// at once; past it the stream reads nothing more until the oldest is
/// answered (HTTP/2 flow control then holds the agent's sends).
const MAX_IN_FLIGHT: usize = 64;

/// What to do with the outcome of a command made from an agent's message.
enum Then {
    /// A claim: `ClaimGranted` (with the attempt) or `Refused`.
    Claim(Key),
    /// An end report (exit, watchdog, preempted ack): admission is woken or
    /// the report refused, then `Recorded`.
    Report(Key, &'static str),
    /// A checkpoint manifest: refused (the agent deletes what it wrote)
    /// when apply refuses it.
    Checkpoint(Key, u64),
    /// Nothing but a log line when apply refuses it.
    Logged(&'static str),
}

impl Session {
    /// A stream from its `Register` to its end.
    ///
    /// Each stream's task lives as long as its agent stays connected, and
    /// an async function's state is as large as its largest await: the
    /// registration, a message's handling and a sync (each with a proposal
    /// in flight) are boxed while they run, so that what every idle stream
    /// keeps is the serve loop's own small state (about 12 KB a stream
    /// before; docs/performance.md, "Agent streams").
    pub(super) async fn run(
        s: Consensus,
        own: HubHandles,
        cfg: HubConfig,
        preemption: PreemptionConfig,
        peer: super::Peer,
        mut inbound: Streaming<v1::AgentMessage>,
        tx: Outbound,
    ) -> Result<(), Status> {
        let mut session = Box::pin(Self::register(s, own, cfg, preemption, peer, &mut inbound, tx)).await?;
        session.own.work.agents().attach(&session.node, &session.tx);
        let result = match Box::pin(session.ready_if_pending()).await {
            Ok(()) => session.serve(inbound).await,
            Err(status) => Err(status),
        };
        session.own.work.agents().detach(&session.node, &session.tx);
        result
    }

    /// Takes the stream's `Register`, registers the node through Raft,
    /// answers `Registered`, reconciles what the agent runs and sends the
    /// first sync.
    async fn register(
        s: Consensus,
        own: HubHandles,
        cfg: HubConfig,
        preemption: PreemptionConfig,
        peer: super::Peer,
        inbound: &mut Streaming<v1::AgentMessage>,
        tx: Outbound,
    ) -> Result<Session, Status> {
        let first = tokio::time::timeout(cfg.register_timeout, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Register within the registration timeout"))??;
        // Every message is held to the wire's field limits before anything
        // reads it; one over them ends the stream.
        first.check_bounds()?;
        let Some(v1::AgentMessage { msg: Some(In::Register(reg)) }) = first else {
            return Err(Status::invalid_argument("invalid stream: the first message must be Register"));
        };
        // The certificate fixes the node: every later message on this stream
        // is checked against `node`, so agent A can never act on B's tasks.
        let super::Peer { caller, cert_sha256 } = peer;
        crate::server::api::auth::check_agent_node(&caller, &reg.node_id)?;
        let r = reg.resources.ok_or_else(|| Status::invalid_argument("invalid resources: is required"))?;
        let node = NodeId::new(reg.node_id);
        let mut labels: BTreeMap<String, String> = reg.labels.into_iter().collect();
        // Node restriction: what the agent may claim, judged before the log.
        if let Some(k) = labels.keys().find(|k| !crate::sm::agent_may_set(k)) {
            return Err(Status::invalid_argument(format!(
                "invalid labels: {} is reserved: only an admin sets it (muster node label)",
                muster_proto::bounds::prefix(k)
            )));
        }
        let admission = s.reader().read(|st| st.node_policy(&node).and_then(|p| p.admission.clone()));
        match &admission {
            None if cfg.admission_required => {
                return Err(Status::permission_denied(format!(
                    "node {node} is not admitted: an admin admits it first (muster node admit {node} --gpus N ...)"
                )));
            }
            Some(a) if a.cert_sha256.is_some_and(|pin| Some(pin) != cert_sha256) => {
                return Err(Status::permission_denied(format!(
                    "node {node} must present the certificate it was admitted with (sha256 {})",
                    crate::server::hex(&a.cert_sha256.unwrap_or_default())
                )));
            }
            _ => {}
        }
        if !reg.address.is_empty() {
            labels.insert(ADDRESS_LABEL.to_string(), reg.address);
        }
        if !reg.ports.is_empty() {
            let ports =
                PortRange::parse(&reg.ports).map_err(|e| Status::invalid_argument(format!("invalid ports: {e}")))?;
            labels.insert(PORTS_LABEL.to_string(), ports.to_string());
        }
        if !reg.checkpoint_address.is_empty() {
            check_address(&reg.checkpoint_address)
                .map_err(|e| Status::invalid_argument(format!("invalid checkpoint_address: {e}")))?;
            labels.insert(CHECKPOINT_ADDRESS_LABEL.to_string(), reg.checkpoint_address);
        }
        let resources = Resources { gpus: r.gpus, vram_mb: r.vram_mb, mem_mb: r.mem_mb, cpus: r.cpus };
        if let Some(why) = admission.as_ref().and_then(|a| a.refuses(&resources, &labels)) {
            return Err(Status::permission_denied(format!("node {node} is not admitted for this: {why}")));
        }
        let register = Command::RegisterNode { node: node.clone(), resources, labels };
        // A reconnect loop would cost one entry per registration: paid for
        // from the node's budget like any other command. It goes ahead of
        // the commands queued for the log (nothing queued depends on it),
        // so that a fleet re-registering with a busy successor gets its
        // streams back in one entry's time, not the queue's.
        own.budgets.pay(&node, &register).await;
        match s.proposer().propose_first(register).await.map_err(propose_error_to_status)? {
            Outcome::Accepted(_) => {}
            Outcome::Rejected(r) => return Err(rejection_to_status(&r)),
        }
        own.work.liveness().touch(&node);
        tracing::info!(node = %node, running = reg.running.len(), "agent registered");
        let mut session = Session {
            s,
            own,
            cfg,
            preemption,
            node,
            tx,
            sent: SentMemory::new(reg.running.iter().map(|t| (t.alloc_id, t.task_index, t.epoch))),
            spared: Default::default(),
            in_flight: InFlight::new(),
        };
        session
            .send(Out::Registered(v1::Registered {
                node_id: session.node.to_string(),
                heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as u32,
                node_lost_after_ms: u32::try_from(cfg.node_lost_after.as_millis()).unwrap_or(u32::MAX),
                reconnect_spread_ms: session.reconnect_spread_ms(),
            }))
            .await?;
        session.reconcile().await?;
        session.sync(false).await?;
        Ok(session)
    }

    /// The window this leader's agents spread their reconnects over, from
    /// the streams it holds now (the fleet it would hand a successor).
    fn reconnect_spread_ms(&self) -> u32 {
        let streams = self.own.work.agents().len();
        let spread = super::reconnect_spread(streams, self.cfg.reconnect_rate, self.cfg.node_lost_after);
        u32::try_from(spread.as_millis()).unwrap_or(u32::MAX)
    }

    /// Serves the stream: messages from the agent, and a sync whenever an
    /// applied entry touched this node (and only then: other nodes' entries
    /// never wake this stream). Ends when this replica stops leading.
    pub(super) async fn serve(&mut self, mut inbound: Streaming<v1::AgentMessage>) -> Result<(), Status> {
        let session = self;
        let node = session.node.clone();
        let Some(slot) = session.s.reader().read(|st| st.node_slot(&node)) else {
            return Err(Status::internal("a registered node has no slot"));
        };
        let mut touched = session.s.reader().watch_touches(slot.0);
        let mut leading = session.s.leading();
        if !*leading.borrow_and_update() {
            return Err(leader_status(&session.own.successor).await);
        }
        // Whatever applied between the first sync and the watch is not missed.
        Box::pin(session.sync(false)).await?;
        loop {
            tokio::select! {
                biased;
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() {
                        return Err(leader_status(&session.own.successor).await);
                    }
                }
                outcome = async { (&mut session.in_flight.front_mut().expect("guarded").1).await },
                    if !session.in_flight.is_empty() =>
                {
                    let (then, _) = session.in_flight.pop_front().expect("guarded");
                    Box::pin(session.complete(then, outcome)).await?
                }
                () = touched.changed() => Box::pin(session.sync(false)).await?,
                msg = inbound.message(), if session.in_flight.len() < MAX_IN_FLIGHT => match msg {
                    Ok(Some(m)) => {
                        m.check_bounds()?;
                        Box::pin(session.handle(m)).await?
                    }
                    Ok(None) | Err(_) => {
                        tracing::info!(node = %session.node, "agent stream closed");
                        return Ok(());
                    }
                },
            }
        }
    }

    /// Proposes a command made from this agent's messages, once the node's
    /// budget affords it (see `budget.rs`), and waits for its outcome.
    async fn propose(&self, cmd: Command) -> Result<Outcome, ProposeError> {
        self.own.budgets.pay(&self.node, &cmd).await;
        self.s.proposer().propose(cmd).await
    }

    /// Queues a command made from one of the agent's messages (once the
    /// node's budget affords it) and goes on to the next message: `then`
    /// runs when its outcome comes. The stream's commands reach the log in
    /// the order of its messages, so a report never overtakes the claim or
    /// the checkpoint before it; and a message that depends on an earlier
    /// one's outcome (a checkpoint of a task whose claim was granted) is
    /// sent by the agent only after that outcome's answer.
    async fn pipeline(&mut self, cmd: Command, then: Then) -> Result<(), Status> {
        self.own.budgets.pay(&self.node, &cmd).await;
        let proposed = self.s.proposer().submit(cmd).await.map_err(propose_error_to_status)?;
        self.in_flight.push_back((then, proposed));
        Ok(())
    }

    /// Acts on the outcome of a queued command, in the order the agent sent
    /// the messages.
    async fn complete(&mut self, then: Then, outcome: Result<Outcome, ProposeError>) -> Result<(), Status> {
        let outcome = outcome.map_err(propose_error_to_status)?;
        match (then, outcome) {
            (Then::Claim(key), Outcome::Accepted(events)) => {
                let attempt = events
                    .iter()
                    .find_map(|e| match e {
                        Event::TaskStarted { attempt, .. } => Some(*attempt),
                        _ => None,
                    })
                    .unwrap_or(1);
                self.sent.agent_started(key);
                self.send(Out::Granted(v1::ClaimGranted { task: Some(task_ref(key)), attempt })).await?;
                // Syncs that ran while the claim waited held back its
                // preempt, and did not know the agent runs it: if the task
                // is stopping or has left this node since, tell the agent
                // now, after the grant.
                if !self.runs_here(key) {
                    Box::pin(self.sync(false)).await?;
                }
                Ok(())
            }
            (Then::Claim(key), Outcome::Rejected(r)) => {
                self.refuse(key, &rejection_to_status(&r)).await?;
                // A preempt held back while the claim waited goes now.
                Box::pin(self.sync(false)).await
            }
            (Then::Report(key, _), Outcome::Accepted(_)) => {
                self.own.work.wake_admission();
                self.send(Out::Recorded(v1::Recorded { task: Some(task_ref(key)) })).await
            }
            (Then::Report(key, what), Outcome::Rejected(r)) => {
                tracing::info!(alloc_id = key.0, task = key.1, node = %self.node, rejection = %r, "{what} refused");
                self.refuse(key, &rejection_to_status(&r)).await?;
                self.send(Out::Recorded(v1::Recorded { task: Some(task_ref(key)) })).await
            }
            (Then::Checkpoint(key, epoch), Outcome::Rejected(r)) => {
                tracing::warn!(
                    alloc_id = key.0, task = key.1, epoch, node = %self.node, rejection = %r,
                    "checkpoint refused"
                );
                self.refuse_checkpoint(key, &rejection_to_status(&r)).await
            }
            (Then::Logged(what), Outcome::Rejected(r)) => {
                tracing::info!(node = %self.node, rejection = %r, "{what} refused");
                Ok(())
            }
            (Then::Checkpoint(..) | Then::Logged(_), Outcome::Accepted(_)) => Ok(()),
        }
    }

    /// Whether attempt `key` runs on this node in the state (started, not
    /// stopping).
    fn runs_here(&self, key: Key) -> bool {
        self.s.reader().read(|st| {
            let Some(slot) = st.node_slot(&self.node) else { return false };
            st.alloc(key.0).and_then(|a| a.tasks.get(key.1 as usize)).is_some_and(|t| {
                t.node == Some(slot) && t.reservation_epoch == key.2 && t.status == TaskStatus::Running
            })
        })
    }

    /// Whether the agent's claim of `key` waits for its outcome.
    fn claiming(&self, key: &Key) -> bool {
        self.in_flight.iter().any(|(then, _)| matches!(then, Then::Claim(k) if k == key))
    }

    pub(super) async fn send(&self, msg: Out) -> Result<(), Status> {
        self.tx
            .send(Box::new(Ok(v1::SchedulerMessage { msg: Some(msg) })))
            .await
            .map_err(|_| Status::cancelled("the agent went away"))
    }

    /// Refuses a checkpoint upload before the log, and counts it.
    async fn refuse_upload(&self, key: Key, status: Status) -> Result<(), Status> {
        metrics::counter!("muster_agent_uploads_refused_total").increment(1);
        tracing::warn!(alloc_id = key.0, task = key.1, node = %self.node, refusal = %status.message(), "checkpoint refused");
        self.refuse_checkpoint(key, &status).await
    }

    /// Refuses a checkpoint upload: the agent deletes what it wrote.
    async fn refuse_checkpoint(&self, key: Key, status: &Status) -> Result<(), Status> {
        self.send(Out::Refused(v1::Refused {
            task: Some(task_ref(key)),
            code: format!("{:?}", status.code()).to_uppercase_snake(),
            message: status.message().to_string(),
            checkpoint: true,
        }))
        .await
    }

    pub(super) async fn refuse(&self, key: Key, status: &Status) -> Result<(), Status> {
        self.send(Out::Refused(v1::Refused {
            task: Some(task_ref(key)),
            code: format!("{:?}", status.code()).to_uppercase_snake(),
            message: status.message().to_string(),
            checkpoint: false,
        }))
        .await
    }

    /// At registration the agent's list of running tasks is authoritative:
    /// a task the state has running on this node that the agent does not
    /// run any more (the agent restarted, or never got its claim granted)
    /// has failed. A preempting task it does not list is left to sync: the
    /// agent acks (re-sending its checkpoint) when told `Preempt` again.
    pub(super) async fn reconcile(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let gone: Vec<Key> = self.s.reader().read(|st| {
            let Some(slot) = st.node_slot(&node) else { return Vec::new() };
            st.tasks_on_node(slot)
                .filter_map(|(alloc, task)| {
                    let t = &st.alloc(alloc).expect("index names a known allocation").tasks[task as usize];
                    let key = (alloc, task, t.reservation_epoch);
                    (t.status == TaskStatus::Running && !self.sent.agent_running().contains(&key)).then_some(key)
                })
                .collect()
        });
        for key in gone {
            tracing::warn!(node = %self.node, alloc = key.0, task = key.1, "agent no longer runs a running task; failing it");
            let cmd =
                Command::FailTask { alloc: key.0, task: key.1, node: node.clone(), epoch: key.2, exit_code: None };
            if let Outcome::Accepted(_) = self.propose(cmd).await.map_err(propose_error_to_status)? {
                self.own.work.wake_admission();
            }
        }
        Ok(())
    }

    /// A node marked lost whose agent speaks again on a stream that stayed
    /// open (it was frozen, not disconnected) is registered again: the flag
    /// clears once, and the sync that follows stops what it ran for tasks
    /// that were re-placed meanwhile (their epochs moved on).
    pub(super) async fn revive_if_lost(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let again = self.s.reader().read(|st| {
            let slot = st.node_slot(&node)?;
            let n = st.node(slot);
            (n.status == NodeStatus::Lost).then(|| Command::RegisterNode {
                node: node.clone(),
                resources: n.resources,
                labels: n.reported_labels.clone(),
            })
        });
        if let Some(cmd) = again {
            tracing::info!(node = %self.node, "a lost node's agent is heard from again; registering it");
            if let Outcome::Accepted(_) = self.propose(cmd).await.map_err(propose_error_to_status)? {
                self.own.work.wake_admission();
            }
        }
        Ok(())
    }

    /// A new node is pending until its agent has registered and reconciled
    /// (and holds this stream): then it takes work.
    pub(super) async fn ready_if_pending(&mut self) -> Result<(), Status> {
        let node = self.node.clone();
        let pending =
            self.s.reader().read(|st| st.node_slot(&node).is_some_and(|s| st.node(s).status == NodeStatus::Pending));
        if pending {
            match self.propose(Command::MarkNodeReady { node }).await.map_err(propose_error_to_status)? {
                Outcome::Accepted(_) => self.own.work.wake_admission(),
                Outcome::Rejected(r) => tracing::debug!(node = %self.node, rejection = %r, "node ready refused"),
            }
        }
        Ok(())
    }

    /// The injected bug `spare-failed-gang-peers` (chaos-check tests only):
    /// when a gang is torn down because a task failed, its other ranks are
    /// never told to stop, neither by the teardown nor after the force
    /// deadline moves them off the node. They run on, blocked on their dead
    /// peer, while the gang is placed again.
    fn spare_failed_gang_peers(&mut self, plan: &mut muster_core::sync::SyncPlan) {
        let failed: Vec<TaskKey> = self.s.reader().read(|st| {
            plan.preempt
                .iter()
                .filter(|(k, _, _)| {
                    st.alloc(k.0)
                        .and_then(|a| a.teardown)
                        .is_some_and(|td| matches!(td.cause, muster_core::sm::TeardownCause::TaskFailed { .. }))
                })
                .map(|&(k, _, _)| k)
                .collect()
        });
        self.spared.extend(failed);
        plan.preempt.retain(|(k, _, _)| !self.spared.contains(k));
        plan.stop.retain(|k| !self.spared.contains(k));
    }

    /// Sends what [`plan_sync`] decides for this node now: the node's
    /// status when it changed, new assignments, preempts and hints, stops.
    /// On a heartbeat (`repeat`) every preempt not yet acked is sent again.
    pub(super) async fn sync(&mut self, repeat: bool) -> Result<(), Status> {
        let started = std::time::Instant::now();
        let result = self.sync_now(repeat).await;
        metrics::histogram!("muster_agent_sync_seconds").record(started.elapsed().as_secs_f64());
        result
    }

    async fn sync_now(&mut self, repeat: bool) -> Result<(), Status> {
        let cfg = SyncConfig {
            stop_grace_ms: self.cfg.stop_grace.as_millis() as u32,
            preemption_grace_ms: self.preemption.grace_ms as u32,
        };
        let mut plan = self.s.reader().read(|st| plan_sync(st, &self.node, &self.sent, repeat, &cfg));
        if self.own.bugs.has(crate::server::policies::InjectedBug::SpareFailedGangPeers) {
            self.spare_failed_gang_peers(&mut plan);
        }
        // A task whose claim waits for its outcome is not preempted yet:
        // the agent, not running it, would ack the preempt at once and then
        // start it on the grant. Its preempt goes after the answer.
        if !self.in_flight.is_empty() {
            plan.preempt.retain(|(k, _, _)| !self.claiming(k));
        }
        if plan.is_empty() {
            self.sent.sent(&plan);
            return Ok(());
        }
        if let Some((status, deadline_ms)) = plan.notice {
            tracing::info!(node = %self.node, status = status.as_str(), "telling the agent its node status");
            self.send(Out::NodeNotice(v1::NodeNotice {
                status: crate::server::api::convert::node_status_to_proto(status) as i32,
                detail: status_detail(status).to_string(),
                deadline_ms,
            }))
            .await?;
        }
        for a in &plan.assign {
            self.send(Out::Assign(v1::Assign {
                task: Some(task_ref(a.key)),
                gang_size: a.gang_size,
                command: a.command.clone(),
                env: a.env.iter().cloned().collect(),
                secret_env: a.secrets.0.clone().into_iter().collect(),
                peers: a.peers.clone(),
                gpus: a.gpus,
                mem_mb: a.mem_mb,
                cpus: a.cpus,
                owner: a.owner.clone(),
                pids_max: a.pids_max,
                image: a.container.as_ref().map(|c| c.image.to_string()).unwrap_or_default(),
                mounts: a
                    .container
                    .as_ref()
                    .map(|c| c.mounts.iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                workdir: a.container.as_ref().and_then(|c| c.workdir.clone()).unwrap_or_default(),
                restore: a
                    .restore
                    .iter()
                    .map(|r| v1::CheckpointRef {
                        manifest: Some(crate::server::api::convert::manifest_to_proto(&r.manifest)),
                        source: r.source.clone(),
                    })
                    .collect(),
                checkpoint_store: a.store.spec(),
                max_checkpoint_bytes: a.max_checkpoint_bytes,
                walltime_s: a.walltime_s,
                stall_timeout_s: a.stall_timeout_s,
                checkpointing: a.checkpointing,
                ports: a.ports.iter().map(|&p| u32::from(p)).collect(),
            }))
            .await?;
        }
        for &(key, epoch, how) in &plan.preempt {
            let msg = match how {
                StopHow::Preempt { grace_ms } => {
                    Out::Preempt(v1::Preempt { task: Some(task_ref(key)), preemption_epoch: epoch, grace_ms })
                }
                StopHow::Hint => Out::CheckpointHint(v1::CheckpointHint {
                    task: Some(task_ref(key)),
                    preemption_epoch: epoch,
                    timeout_ms: self.preemption.checkpoint_timeout_ms.min(u64::from(u32::MAX)) as u32,
                    max_deferral_ms: self.preemption.max_deferral_ms.min(u64::from(u32::MAX)) as u32,
                    grace_ms: cfg.preemption_grace_ms,
                }),
            };
            self.send(msg).await?;
        }
        if let Some(grants) = &plan.grants {
            self.send(Out::CheckpointGrants(v1::CheckpointGrants {
                grants: grants
                    .iter()
                    .map(|g| v1::CheckpointGrant { seq: g.seq, key: g.key.clone(), node: g.node.to_string() })
                    .collect(),
            }))
            .await?;
        }
        if !plan.delete.is_empty() {
            self.send(Out::DeleteCheckpoints(v1::DeleteCheckpoints {
                checkpoints: plan.delete.iter().map(crate::server::api::convert::manifest_to_proto).collect(),
            }))
            .await?;
        }
        for &key in &plan.stop {
            self.send(Out::Stop(v1::Stop {
                task: Some(task_ref(key)),
                grace_ms: cfg.stop_grace_ms,
                reason: "the task is no longer placed on this node (cancelled, re-placed or failed)".into(),
            }))
            .await?;
        }
        self.sent.sent(&plan);
        Ok(())
    }

    pub(super) async fn handle(&mut self, m: v1::AgentMessage) -> Result<(), Status> {
        self.own.work.liveness().touch(&self.node);
        match m.msg {
            None => Err(Status::invalid_argument("invalid message: empty")),
            Some(In::Register(_)) => Err(Status::invalid_argument("invalid message: Register twice on one stream")),
            Some(In::LogData(data)) => {
                if !self.own.work.agents().answer(&self.node, data) {
                    tracing::warn!(node = %self.node, "log data for a request this node was not asked; dropped");
                }
                Ok(())
            }
            Some(In::Heartbeat(h)) => {
                self.sent.agent_runs_now(h.running.iter().map(|t| (t.alloc_id, t.task_index, t.epoch)));
                self.own.work.agents().set_pulls(&self.node, h.pulls);
                self.revive_if_lost().await?;
                self.sync(true).await?;
                self.send(Out::HeartbeatAck(v1::HeartbeatAck { reconnect_spread_ms: self.reconnect_spread_ms() })).await
            }
            Some(In::Checkpoint(c)) => {
                let key = key_of(&c.task)?;
                // The manifest is checked on the leader before proposing, so
                // one that would be refused costs no log entry: its fields
                // here, then ownership, epoch, status, size, key and store as
                // apply checks them (apply checks again: the state may move).
                let manifest = match crate::server::api::convert::upload_from_proto(c.manifest) {
                    Ok(m) => m,
                    Err(status) => return self.refuse_upload(key, status).await,
                };
                let (alloc, task, node) = (key.0, key.1, self.node.clone());
                let cmd = if c.on_exit {
                    Command::SaveExitCheckpoint { alloc, task, node, epoch: key.2, manifest }
                } else {
                    Command::SaveCheckpoint { alloc, task, node, epoch: c.preemption_epoch, manifest }
                };
                if let Err(r) = self.s.reader().read(|st| st.precheck(&cmd)) {
                    return self.refuse_upload(key, rejection_to_status(&r)).await;
                }
                self.pipeline(cmd, Then::Checkpoint(key, c.preemption_epoch)).await
            }
            Some(In::ImagesHeld(held)) => {
                let cmd = Command::SetNodeImages { node: self.node.clone(), digests: held.digests.clone() };
                let checked =
                    self.s.reader().read(|st| st.precheck(&cmd).map(|()| st.holds_images(&self.node, &held.digests)));
                let unchanged = match checked {
                    Ok(unchanged) => unchanged,
                    Err(r) => {
                        tracing::warn!(node = %self.node, refusal = %r, "image digests refused");
                        return Err(rejection_to_status(&r));
                    }
                };
                if unchanged {
                    return Ok(());
                }
                self.pipeline(cmd, Then::Logged("image digests")).await
            }
            Some(In::CheckpointsDeleted(d)) => {
                if d.seqs.len() > MAX_FORGET_CHECKPOINTS {
                    return Err(Status::invalid_argument(format!(
                        "invalid seqs: {} checkpoints, over {MAX_FORGET_CHECKPOINTS}",
                        d.seqs.len()
                    )));
                }
                let cmd = Command::ForgetCheckpoints { node: self.node.clone(), seqs: d.seqs };
                if let Err(r) = self.s.reader().read(|st| st.precheck(&cmd)) {
                    tracing::warn!(node = %self.node, refusal = %r, "checkpoint deletions refused");
                    return Ok(());
                }
                self.pipeline(cmd, Then::Logged("checkpoint deletions")).await
            }
            Some(In::Preempted(p)) => {
                let key = key_of(&p.task)?;
                self.sent.agent_stopped(&key);
                let cmd = Command::ConfirmPreempted {
                    alloc: key.0,
                    task: key.1,
                    node: self.node.clone(),
                    epoch: p.preemption_epoch,
                    checkpoint_failed: p.checkpoint_failed,
                };
                let cmd = accounted(cmd, p.usage.as_ref());
                self.pipeline(cmd, Then::Report(key, "preempted ack")).await
            }
            Some(In::Claim(c)) => {
                let key = key_of(&c.task)?;
                let cmd = Command::StartTask { alloc: key.0, task: key.1, node: self.node.clone(), epoch: key.2 };
                self.pipeline(cmd, Then::Claim(key)).await
            }
            Some(In::WatchdogTripped(w)) => {
                let key = key_of(&w.task)?;
                self.sent.agent_stopped(&key);
                let kind = WatchdogKind::parse(&w.kind)
                    .ok_or_else(|| Status::invalid_argument(format!("invalid kind: {:?} is not a watchdog", w.kind)))?;
                tracing::warn!(
                    alloc_id = key.0, task = key.1, node = %self.node, kind = kind.as_str(), detail = %w.detail,
                    "watchdog tripped"
                );
                let cmd =
                    Command::TripWatchdog { alloc: key.0, task: key.1, node: self.node.clone(), epoch: key.2, kind };
                let cmd = accounted(cmd, w.usage.as_ref());
                self.pipeline(cmd, Then::Report(key, "watchdog report")).await
            }
            Some(In::CheckpointUnusable(u)) => {
                let key = key_of(&u.task)?;
                let cmd = Command::DropCheckpoint {
                    alloc: key.0,
                    task: key.1,
                    node: self.node.clone(),
                    epoch: key.2,
                    seq: u.seq,
                    reason: agent_reason(u.reason),
                };
                self.pipeline(cmd, Then::Logged("checkpoint drop")).await
            }
            Some(In::Exited(e)) => {
                let key = key_of(&e.task)?;
                self.sent.agent_stopped(&key);
                let node = self.node.clone();
                let cmd = if e.exit_code == Some(0) && e.error.is_empty() {
                    Command::FinishTask { alloc: key.0, task: key.1, node, epoch: key.2 }
                } else if !e.error.is_empty() && e.exit_code.is_none() && e.signal.is_none() {
                    let reason = agent_reason(e.error);
                    if e.image_pull_failed {
                        Command::FailImagePull { alloc: key.0, task: key.1, node, epoch: key.2, reason }
                    } else {
                        Command::FailTaskToStart { alloc: key.0, task: key.1, node, epoch: key.2, reason }
                    }
                } else {
                    let exit_code = e.exit_code.or(e.signal.map(|s| 128 + s));
                    let tail = muster_core::sm::failure_tail(&e.stderr_tail);
                    Command::FailTaskWithTail { alloc: key.0, task: key.1, node, epoch: key.2, exit_code, tail }
                };
                let cmd = accounted(cmd, e.usage.as_ref());
                self.pipeline(cmd, Then::Report(key, "exit report")).await
            }
        }
    }
}

/// An end report with the attempt's usage, when the agent sent one. A
/// usage no agent could have read is left out (and logged, naming the
/// field): the attempt's end is recorded all the same, never lost to it.
fn accounted(report: Command, usage: Option<&v1::AttemptUsage>) -> Command {
    match usage.map(crate::server::api::convert::usage_from_proto) {
        Some(Ok(usage)) if report.end_report().is_some() => Command::Accounted { usage, report: Box::new(report) },
        Some(Err(e)) => {
            metrics::counter!("muster_agent_reports_refused_total", "what" => "usage").increment(1);
            tracing::warn!(error = %e.message(), "an attempt's usage refused; its end is recorded without it");
            report
        }
        _ => report,
    }
}

/// An agent's reason cut to what a command may carry.
/// What a node notice says about a status.
pub(super) fn status_detail(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Draining => "draining: no new work; running tasks finish",
        NodeStatus::Stopping => "stopping: the drain deadline passed; remaining tasks are being moved",
        NodeStatus::Stopped => "stopped: the machine may be powered off",
        NodeStatus::Terminated => "terminated",
        NodeStatus::Pending => "pending",
        NodeStatus::Ready => "ready",
        NodeStatus::Lost => "lost",
    }
}

pub(super) fn agent_reason(mut reason: String) -> String {
    if reason.len() > MAX_AGENT_REASON_BYTES {
        let mut cut = MAX_AGENT_REASON_BYTES - 3;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str("...");
    }
    reason
}

pub(super) trait UpperSnake {
    fn to_uppercase_snake(&self) -> String;
}

impl UpperSnake for String {
    /// `PermissionDenied` → `PERMISSION_DENIED`.
    fn to_uppercase_snake(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }
}

/// A `host:port` an agent serves checkpoints at: at most 255 bytes, a port
/// that parses, and a host of plain characters (it is dialled by other
/// agents, and shown in the node's labels).
fn check_address(addr: &str) -> Result<(), String> {
    if addr.len() > 255 {
        return Err(format!("{} bytes, over 255", addr.len()));
    }
    let (host, port) = addr.rsplit_once(':').ok_or("not host:port")?;
    port.parse::<u16>().map_err(|_| format!("port {port:?} is not a number up to 65535"))?;
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':');
    if host.is_empty() || !host.chars().all(plain) {
        return Err(format!("host {host:?} is not a name or an address"));
    }
    Ok(())
}
