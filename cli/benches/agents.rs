//! Agent-stream load: N simulated agents (default 2,000) hold streams to the
//! leader of three release-built `muster server` processes, heartbeating
//! every 5 s. Reports the leader's CPU use and memory per stream.
//!
//! Run: `cargo bench -p muster --bench agents` (options after `--`:
//! `--agents N`, `--seconds S` for the measuring window, default 30,
//! `--tls`, `--agents-per-connection N`).
//!
//! Without `--tls`, the simulated agents share one connection per 50 (the
//! leader's per-connection cost is spread over them; `--agents-per-connection
//! 1` gives each its own). With `--tls`, every
//! agent holds its own mutual-TLS connection with its own node certificate,
//! as real agents do, so the figure per stream includes a connection and
//! its TLS session. The servers allow that many connections from one
//! address (`--max-connections-per-peer`), since all come from loopback.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use muster_proto::v1::agent_service_client::AgentServiceClient;
use muster_tls::{Role, TlsMaterial};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use common::{Servers, free_port, usage};

async fn channel(addr: &str, tls: Option<&TlsMaterial>) -> Channel {
    muster_tls::endpoint(addr, tls).unwrap().connect().await.unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let agents = common::opt("--agents", 2000) as usize;
    let seconds = common::opt("--seconds", 30);
    let tls = args.iter().any(|a| a == "--tls");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        // With --tls: the servers', the bench's (admin) and one per agent.
        let certs = dir.path().join("tls");
        let (admin, agent_certs) = if tls {
            let issued = Instant::now();
            let roles: Vec<Role> = (1..=3)
                .map(Role::Server)
                .chain([Role::Admin("bench".into())])
                .chain((0..agents).map(|i| Role::Agent(format!("sim-{i:05}"))))
                .collect();
            let mut m = muster_local::ensure_certs(&certs, &roles).expect("issue the certificates");
            let agent_certs = m.split_off(4);
            println!("issued {} certificates in {:.1} s", roles.len(), issued.elapsed().as_secs_f64());
            (m.pop(), agent_certs)
        } else {
            (None, Vec::new())
        };
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let servers = Servers(
            (0..3)
                .map(|i| {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
                    cmd.arg("server");
                    let room = (agents + 100).to_string();
                    cmd.args(["--max-connections", &room, "--max-connections-per-peer", &room]);
                    // A thousand synthetic agents register unadmitted.
                    cmd.args(["--node-admission", "open"]);
                    if tls {
                        cmd.env("MUSTER_TLS_DIR", &certs);
                    } else {
                        cmd.arg("--insecure");
                    }
                    cmd.args(["--id", &(i + 1).to_string(), "--listen", &addrs[i], "--peers", &peers.join(",")])
                        .arg("--data-dir")
                        .arg(dir.path().join(format!("d{i}")))
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        );
        let leader = loop {
            let mut found = None;
            for (i, a) in addrs.iter().enumerate() {
                let Ok(ch) = muster_tls::endpoint(a, admin.as_ref()).unwrap().connect().await else { continue };
                if let Ok(s) = AdminServiceClient::new(ch).status(v1::StatusRequest {}).await
                    && s.get_ref().role == "leader"
                {
                    found = Some(i);
                }
            }
            if let Some(i) = found {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pid = servers.0[leader].id();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (t0, rss0) = usage(pid);
        let idle_window = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (t1, _) = usage(pid);
        let idle_cpu = (t1 - t0) as f64 / 100.0 / idle_window.elapsed().as_secs_f64();

        let started = Instant::now();
        let per_channel = if tls { 1 } else { common::opt("--agents-per-connection", 50).max(1) as usize };
        let mut channels: Vec<Channel> = Vec::new();
        for c in 0..agents.div_ceil(per_channel) {
            channels.push(channel(&addrs[leader], agent_certs.get(c)).await);
        }
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
        for i in 0..agents {
            let ch = channels[i / per_channel].clone();
            let ready = ready_tx.clone();
            tokio::spawn(async move {
                let (out, rx) = mpsc::channel(8);
                out.send(v1::AgentMessage {
                    msg: Some(v1::agent_message::Msg::Register(v1::Register {
                        node_id: format!("sim-{i:05}"),
                        resources: Some(v1::Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 }),
                        address: format!("10.0.{}.{}:29500", i / 250, i % 250),
                        ports: "29500-29999".into(),
                        ..Default::default()
                    })),
                })
                .await
                .unwrap();
                let mut inbound = AgentServiceClient::new(ch).connect(ReceiverStream::new(rx)).await.unwrap().into_inner();
                let _ = inbound.message().await; // Registered
                let _ = ready.send(());
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            let hb = v1::AgentMessage { msg: Some(v1::agent_message::Msg::Heartbeat(v1::Heartbeat { running: vec![], pulls: vec![] })) };
                            if out.send(hb).await.is_err() { return; }
                        }
                        m = inbound.message() => if !matches!(m, Ok(Some(_))) { return },
                    }
                }
            });
        }
        for _ in 0..agents {
            ready_rx.recv().await.unwrap();
        }
        let registered_in = started.elapsed();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (t2, rss2) = usage(pid);
        let window = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (t3, rss3) = usage(pid);
        let cpu = (t3 - t2) as f64 / 100.0 / window.elapsed().as_secs_f64();
        println!(
            "{agents} agent streams on the leader (3 replicas, heartbeats every 5 s), {}:",
            if tls { "mutual TLS, one connection per agent".to_string() } else { format!("insecure, {per_channel} agents per connection") }
        );
        println!("  connected and registered through Raft in {:.2} s", registered_in.as_secs_f64());
        println!("  leader CPU: idle {:.2} % of a core, with the streams {:.2} % of a core", idle_cpu * 100.0, cpu * 100.0);
        println!(
            "  leader RSS: {} MiB before, {} MiB with the streams: {:.1} KiB per stream",
            rss0 / 1024,
            rss3 / 1024,
            (rss3.max(rss2) - rss0) as f64 / agents as f64
        );
        drop(servers);
    });
}
