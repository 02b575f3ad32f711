//! An agent whose leader goes silent while the connection stays open (a
//! frozen or cut-off leader) drops the stream and connects again, instead of
//! waiting for TCP keepalive while the new leader marks its node lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use muster_agent::agent::Agent;
use muster_proto::v1;
use muster_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

mod common;

/// Registers every agent, then never answers a heartbeat.
struct SilentLeader {
    connects: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl AgentService for SilentLeader {
    type ConnectStream = ReceiverStream<Result<v1::SchedulerMessage, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel(4);
        let registered = v1::Registered {
            node_id: "n1".into(),
            heartbeat_interval_ms: 100,
            node_lost_after_ms: 0,
            reconnect_spread_ms: 0,
        };
        let msg = v1::SchedulerMessage { msg: Some(v1::scheduler_message::Msg::Registered(registered)) };
        tx.send(Ok(msg)).await.unwrap();
        let mut inbound = req.into_inner();
        tokio::spawn(async move {
            let _open = tx; // the stream stays open, and silent
            while let Ok(Some(_)) = inbound.message().await {}
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_leaves_a_leader_that_stops_answering_heartbeats() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connects = Arc::new(AtomicU32::new(0));
    let server = tonic::transport::Server::builder()
        .add_service(AgentServiceServer::new(SilentLeader { connects: connects.clone() }))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(addr.to_string(), dir.path(), true);
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(cfg).unwrap().run(stopped));
    // Heartbeats every 100 ms, silence tolerated for three: a second connect
    // comes well within ten seconds, even on a loaded machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while connects.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the agent never left its silent leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    agent.await.unwrap();
    server.abort();
}
