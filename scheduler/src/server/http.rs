//! The replica's plain-HTTP listener (`muster server --http ADDR`): what
//! Prometheus, Kubernetes probes and a browser reach without a client
//! certificate. Everything here is read-only.
//!
//! | path | answers |
//! |---|---|
//! | `/metrics` | Prometheus text ([`super::telemetry`]) |
//! | `/healthz` | 200 while Raft runs, else 503 (liveness) |
//! | `/readyz` | 200 when [`super::health`] says ready, else 503 with the reason |
//! | `/ui` | the dashboard page ([`super::dashboard`]) |
//! | `/ui/api/overview` | the dashboard's JSON |
//!
//! It shows cluster state to whoever reaches it: bind it to a management
//! network or loopback (docs/security.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State as AxState;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::health::Readiness;
use super::replica::{Shared, status_of};

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    shared: Shared,
    readiness: watch::Receiver<Readiness>,
    tls: Option<Arc<muster_tls::TlsMaterial>>,
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Shared,
    readiness: watch::Receiver<Readiness>,
    tls: Option<muster_tls::TlsMaterial>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let state = HttpState { shared, readiness, tls: tls.map(Arc::new) };
    let app = Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/ui", get(ui))
        .route("/ui/api/overview", get(overview))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn metrics() -> Response {
    match super::telemetry::prometheus() {
        Some(h) => (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => text(StatusCode::SERVICE_UNAVAILABLE, "no metrics recorder in this process\n".into()),
    }
}

async fn healthz(AxState(s): AxState<HttpState>) -> Response {
    let r = s.readiness.borrow().clone();
    if r.alive { text(StatusCode::OK, "ok\n".into()) } else { text(StatusCode::SERVICE_UNAVAILABLE, r.reason + "\n") }
}

async fn readyz(AxState(s): AxState<HttpState>) -> Response {
    let r = s.readiness.borrow().clone();
    let body = format!(
        "{}\nleader {}\napplied {}\ncommitted {}\n",
        r.reason,
        r.leader_id.map_or("none".to_string(), |l| l.to_string()),
        r.applied_index,
        r.committed_index
    );
    text(if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
}

async fn ui() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        super::dashboard::PAGE,
    )
        .into_response()
}

fn replica_json(r: &v1::ReplicaStatus) -> Value {
    json!({
        "id": r.id, "address": r.address, "role": r.role, "term": r.term, "leader_id": r.leader_id,
        "applied_index": r.applied_index, "state_digest": r.state_digest, "error": null,
    })
}

/// Asks a peer for its status, briefly: a dashboard must not hang on a dead
/// replica.
async fn peer_status(addr: &str, tls: Option<&muster_tls::TlsMaterial>) -> Result<v1::ReplicaStatus, String> {
    let channel =
        super::raft_net::lazy_channel(addr, Duration::from_millis(500), tls).map_err(|e| format!("address: {e}"))?;
    let mut c = AdminServiceClient::new(channel);
    match tokio::time::timeout(Duration::from_secs(1), c.status(v1::StatusRequest {})).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{}: {}", s.code(), s.message())),
        Err(_) => Err("no answer within 1 s".into()),
    }
}

async fn overview(AxState(s): AxState<HttpState>) -> Response {
    let me = status_of(&s.shared);
    let peers = me.members.iter().filter(|m| m.id != me.id).map(|m| {
        let tls = s.tls.clone();
        let (id, addr) = (m.id, m.address.clone());
        async move {
            match peer_status(&addr, tls.as_deref()).await {
                Ok(r) => replica_json(&r),
                Err(e) => json!({"id": id, "address": addr, "role": "unreachable", "error": e}),
            }
        }
    });
    let mut replicas: Vec<Value> = futures_join(peers).await;
    replicas.push(replica_json(&me));
    replicas.sort_by_key(|r| r["id"].as_u64());
    let cfg = s.shared.preemption;
    let mut body = s.shared.reader.read(|st| super::dashboard::overview(st, s.shared.now(st), &cfg));
    body["self"] = replica_json(&me);
    body["replicas"] = Value::Array(replicas);
    body["ready"] = json!(s.readiness.borrow().ready);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")],
        body.to_string(),
    )
        .into_response()
}

/// Runs the futures concurrently and collects their results in order.
async fn futures_join<F: std::future::Future<Output = Value> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<Value> {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

/// The address a listener for `--http` binds, for logs.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/ui (also /metrics, /healthz, /readyz)")
}
