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
//! network or loopback (docs/security.md). Every response says `nosniff`,
//! may not be framed and sends no referrer; the page's Content-Security-
//! Policy allows only its own inline script and style (by hash) and
//! same-origin fetches.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State as AxState;
use axum::http::{HeaderValue, StatusCode, header};
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
        .layer(axum::middleware::map_response(security_headers))
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
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, page_csp()),
        ],
        super::dashboard::PAGE,
    )
        .into_response()
}

/// What no response of this listener may be taken for or embedded as.
const NO_CONTENT_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// Headers on every response: not sniffed as another type, never framed,
/// no referrer; a Content-Security-Policy that allows nothing unless the
/// handler set its own (the page's).
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(NO_CONTENT_POLICY));
    r
}

/// The dashboard's Content-Security-Policy: its one inline `<script>` and
/// `<style>`, by SHA-256, fetches to this origin, nothing else.
fn page_csp() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let page = super::dashboard::PAGE;
        let hash = |open: &str, close: &str| {
            let start = page.find(open).map(|i| i + open.len()).expect("the page has the tag");
            let end = start + page[start..].find(close).expect("the tag closes");
            let digest = <sha2::Sha256 as sha2::Digest>::digest(&page.as_bytes()[start..end]);
            format!("'sha256-{}'", base64(&digest))
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            hash("<script>", "</script>"),
            hash("<style>", "</style>")
        )
    })
}

/// Standard base64 with padding (RFC 4648), for CSP hashes.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc_4648() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(super::base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn the_page_policy_hashes_its_script_and_style() {
        let csp = super::page_csp();
        assert_eq!(csp.matches("'sha256-").count(), 2, "{csp}");
        assert!(csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe"), "{csp}");
    }
}
