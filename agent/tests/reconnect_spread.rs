//! Reconnects spread over the leader's window: a leader registers the agent
//! (saying nothing of a spread), answers one heartbeat with a window, then
//! ends the stream as a dying leader's would. The agent dials again no
//! sooner than its own point of that window.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use muster_agent::agent::{Agent, reconnect_after};
use muster_proto::v1;
use muster_proto::v1::agent_message::Msg as Out;
use muster_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use muster_proto::v1::scheduler_message::Msg as In;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

mod common;

/// Answers the first stream's first heartbeat with `spread_ms`, then ends
/// that stream; later streams it registers and keeps. It notes when each
/// stream came and when the first one ended.
struct BreakingLeader {
    spread_ms: u32,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    connects: Vec<tokio::time::Instant>,
    broke: Option<tokio::time::Instant>,
}

fn msg(m: In) -> Result<v1::SchedulerMessage, Status> {
    Ok(v1::SchedulerMessage { msg: Some(m) })
}

#[tonic::async_trait]
impl AgentService for BreakingLeader {
    type ConnectStream = ReceiverStream<Result<v1::SchedulerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let first = {
            let mut seen = self.seen.lock().unwrap();
            seen.connects.push(tokio::time::Instant::now());
            seen.connects.len() == 1
        };
        let (tx, rx) = mpsc::channel(16);
        let registered = v1::Registered {
            node_id: "n1".into(),
            heartbeat_interval_ms: 100,
            node_lost_after_ms: 60_000,
            reconnect_spread_ms: 0,
        };
        tx.send(msg(In::Registered(registered))).await.unwrap();
        let mut inbound = req.into_inner();
        let (spread_ms, seen) = (self.spread_ms, self.seen.clone());
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(Out::Heartbeat(_)) = m.msg {
                    let ack = v1::HeartbeatAck { reconnect_spread_ms: spread_ms };
                    if tx.send(msg(In::HeartbeatAck(ack))).await.is_err() || first {
                        break;
                    }
                }
            }
            if first {
                // The stream ends as a dead leader's, after the answer (a
                // stream's messages arrive in order).
                seen.lock().unwrap().broke = Some(tokio::time::Instant::now());
                let _ = tx.send(Err(Status::unavailable("the leader is gone"))).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// How long after the first stream broke the agent (node `node`) dialled
/// again, against a leader that said `spread_ms`.
async fn redial_gap(node: &str, spread_ms: u32) -> Duration {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = tonic::transport::Server::builder()
        .add_service(AgentServiceServer::new(BreakingLeader { spread_ms, seen: seen.clone() }))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(addr.to_string(), dir.path(), true);
    cfg.node_id = node.into();
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(cfg).unwrap().run(stopped));
    let gap = muster_testkit::eventually("the agent to dial again", Duration::from_secs(60), || {
        let seen = seen.lock().unwrap();
        Some(*seen.connects.get(1)? - seen.broke?)
    })
    .await;
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
    gap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_waits_its_point_of_the_leaders_window_before_it_dials_again() {
    let spread = Duration::from_secs(4);
    // A node whose point lies in the window's second half, so that the
    // wait is one no quick redial could pass for.
    let node = (0..100)
        .map(|i| format!("spread-{i}"))
        .find(|n| reconnect_after(n, spread) >= spread / 2)
        .expect("some node's point lies in the second half");
    let offset = reconnect_after(&node, spread);
    let gap = redial_gap(&node, spread.as_millis() as u32).await;
    assert!(gap >= offset, "dialled again after {gap:?}, before its point {offset:?} of the window");
}

/// Ten thousand nodes' points fall evenly over the window, each inside it,
/// the same every time.
#[test]
fn a_fleets_reconnects_fall_evenly_over_the_window() {
    let spread = Duration::from_secs(5);
    let mut tenths = [0u32; 10];
    for i in 0..10_000 {
        let id = format!("node-{i:05}");
        let at = reconnect_after(&id, spread);
        assert!(at < spread, "{id}: {at:?}");
        assert_eq!(at, reconnect_after(&id, spread), "{id}: the same point each time");
        tenths[(at.as_millis() / 500) as usize] += 1;
    }
    assert!(tenths.iter().all(|&n| (800..=1_200).contains(&n)), "{tenths:?}");
    assert_eq!(reconnect_after("n", Duration::ZERO), Duration::ZERO);
}
