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
/// heartbeats until `silent` turns true; then answers nothing, ever.
struct VanishingLeader {
    command: Vec<String>,
    silent: Arc<AtomicBool>,
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
        if self.silent.load(Ordering::SeqCst) {
            return Err(Status::unavailable("gone"));
        }
        let (tx, rx) = mpsc::channel(16);
        let task = v1::TaskRef { alloc_id: 1, task_index: 0, epoch: 1 };
        tx.send(msg(In::Registered(v1::Registered {
            node_id: "n1".into(),
            heartbeat_interval_ms: 100,
            node_lost_after_ms: 2_000,
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
        let silent = self.silent.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if silent.load(Ordering::SeqCst) {
                    // Cut off: the connection stays, nothing is answered.
                    continue;
                }
                let answer = match m.msg {
                    Some(Out::Claim(c)) => In::Granted(v1::ClaimGranted { task: c.task, attempt: 1 }),
                    Some(Out::Heartbeat(_)) => In::HeartbeatAck(v1::HeartbeatAck {}),
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(pid) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()) {
            return pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the task never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Runs an agent against a leader that vanishes once the task runs;
/// returns the task's pid, the agent's stop switch and the agent.
async fn cut_off_agent(
    fence: bool,
    dir: &Path,
) -> (i32, watch::Sender<bool>, tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pid_file = dir.join("pid");
    let command = vec!["sh".into(), "-c".into(), format!("echo $$ > {}; exec sleep 600", pid_file.display())];
    let silent = Arc::new(AtomicBool::new(false));
    let leader = VanishingLeader { command, silent: silent.clone() };
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    silent.store(true, Ordering::SeqCst);
    (pid, stop, agent, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_from_every_leader_stops_its_tasks_before_they_can_be_placed_again() {
    let dir = tempfile::tempdir().unwrap();
    let (pid, stop, agent, server) = cut_off_agent(true, dir.path()).await;
    assert!(alive(pid), "running while the leader answers");
    // Fenced 1 s after the last answered heartbeat, SIGKILLed 0.5 s later:
    // ten seconds is far past that on any machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "the task still runs long after the fence was due");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fencing_off_the_task_of_a_cut_off_agent_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let (pid, stop, agent, server) = cut_off_agent(false, dir.path()).await;
    // Twice the node-lost window: fenced, it would have been dead for a while.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(alive(pid), "the task was stopped although fencing is off");
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
    // The agent stops its tasks when it exits.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "the task outlived its agent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
