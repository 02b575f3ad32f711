//! Self-fencing with a real process: a leader registers the agent (saying
//! its node-lost window is 2 s), hands it a task, answers its heartbeats for
//! a while, then vanishes. The agent stops the task half a window after the
//! last answered heartbeat, before any leader could place it elsewhere;
//! with `fence: false` (`--keep-running-when-cut-off`) the task runs on.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use muster_agent::agent::Agent;
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as Out;
use muster_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use muster_proto::v1::scheduler_message::Msg as In;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

mod common;

/// Registers the agent, assigns one task, grants its claim, and answers
/// heartbeats until `silent` turns true; then answers nothing, ever. It
/// notes what it hears, so a test waits on the agent's own doing.
struct VanishingLeader {
    command: Vec<String>,
    silent: Arc<AtomicBool>,
    heard: Arc<Heard>,
}

/// What the leader heard from the agent.
#[derive(Default)]
struct Heard {
    /// Heartbeats it answered.
    answered: std::sync::atomic::AtomicU32,
    /// When the agent last sent anything or tried to connect.
    last: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Heard {
    fn now(&self) {
        *self.last.lock().unwrap() = Some(tokio::time::Instant::now());
    }
}

fn msg(m: In) -> Result<v1::SchedulerMessage, Status> {
    Ok(v1::SchedulerMessage { msg: Some(m) })
}

#[tonic::async_trait]
impl AgentService for VanishingLeader {
    type ConnectStream = ReceiverStream<Result<v1::SchedulerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.heard.now();
        if self.silent.load(Ordering::SeqCst) {
            return Err(Status::unavailable("gone"));
        }
        let (tx, rx) = mpsc::channel(16);
        let task = v1::TaskRef { alloc_id: 1, task_index: 0, epoch: 1 };
        tx.send(msg(In::Registered(v1::Registered {
            node_id: "n1".into(),
            heartbeat_interval_ms: 100,
            node_lost_after_ms: 2_000,
            reconnect_spread_ms: 0,
        })))
        .await
        .unwrap();
        tx.send(msg(In::Assign(v1::Assign {
            task: Some(task),
            gang_size: 1,
            command: self.command.clone(),
            ..Default::default()
        })))
        .await
        .unwrap();
        let mut inbound = req.into_inner();
        let (silent, heard) = (self.silent.clone(), self.heard.clone());
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                heard.now();
                if silent.load(Ordering::SeqCst) {
                    // Cut off: the connection stays, nothing is answered.
                    continue;
                }
                let answer = match m.msg {
                    Some(Out::Claim(c)) => In::Granted(v1::ClaimGranted { task: c.task, attempt: 1 }),
                    Some(Out::Heartbeat(_)) => {
                        heard.answered.fetch_add(1, Ordering::SeqCst);
                        In::HeartbeatAck(v1::HeartbeatAck::default())
                    }
                    _ => continue,
                };
                if tx.send(msg(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The pid the task wrote, once it has.
async fn pid_of(file: &Path) -> i32 {
    muster_testkit::eventually("the task to start", Duration::from_secs(30), || {
        std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok())
    })
    .await
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// An agent against a leader that vanished once the task ran.
struct CutOff {
    pid: i32,
    stop: watch::Sender<bool>,
    agent: tokio::task::JoinHandle<()>,
    server: tokio::task::JoinHandle<()>,
    heard: Arc<Heard>,
    /// When the leader stopped answering.
    at: tokio::time::Instant,
}

/// Runs an agent against a leader that vanishes once the task runs and a
/// few heartbeats were answered.
async fn cut_off_agent(fence: bool, dir: &Path) -> CutOff {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pid_file = dir.join("pid");
    let command = vec!["sh".into(), "-c".into(), format!("echo $$ > {}; exec sleep 600", pid_file.display())];
    let silent = Arc::new(AtomicBool::new(false));
    let heard = Arc::new(Heard::default());
    let leader = VanishingLeader { command, silent: silent.clone(), heard: heard.clone() };
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(leader))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    let cfg = common::config(addr.to_string(), &dir.join("work"), fence);
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(cfg).unwrap().run(stopped));
    let pid = pid_of(&pid_file).await;
    // Answered heartbeats for a while, then nothing.
    muster_testkit::eventually("five answered heartbeats", Duration::from_secs(30), || {
        (heard.answered.load(Ordering::SeqCst) >= 5).then_some(())
    })
    .await;
    silent.store(true, Ordering::SeqCst);
    CutOff { pid, stop, agent, server, heard, at: tokio::time::Instant::now() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_from_every_leader_stops_its_tasks_before_they_can_be_placed_again() {
    let dir = tempfile::tempdir().unwrap();
    let CutOff { pid, stop, agent, server, .. } = cut_off_agent(true, dir.path()).await;
    assert!(alive(pid), "running while the leader answers");
    // Fenced 1 s after the last answered heartbeat, SIGKILLed 0.5 s later:
    // ten seconds is far past that on any machine.
    muster_testkit::eventually(
        "the task to be stopped (long after the fence was due)",
        Duration::from_secs(10),
        || (!alive(pid)).then_some(()),
    )
    .await;
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fencing_off_the_task_of_a_cut_off_agent_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let CutOff { pid, stop, agent, server, heard, at } = cut_off_agent(false, dir.path()).await;
    // The agent still at work 3 s after the cut (heartbeats or reconnects):
    // past the fence (1 s) and its kill grace (0.5 s) twice over, so a
    // fenced task would be dead by now.
    muster_testkit::eventually("the agent to act 3 s after the cut", Duration::from_secs(60), || {
        heard.last.lock().unwrap().filter(|&t| t >= at + Duration::from_secs(3))
    })
    .await;
    assert!(alive(pid), "the task was stopped although fencing is off");
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
    // The agent stops its tasks when it exits.
    muster_testkit::eventually("the task to stop with its agent", Duration::from_secs(20), || {
        (!alive(pid)).then_some(())
    })
    .await;
}
