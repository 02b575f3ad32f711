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
//! It runs on a runtime (thread) of its own. The dashboard's JSON comes from
//! a view built at most once per [`HttpOptions::refresh_every`]; each client
//! address is rate-limited; with a token configured, the dashboard, its API
//! and `/metrics` need it. It shows cluster state to whoever passes those:
//! bind it to a management network or loopback (docs/security.md). Every response says `nosniff`,
//! may not be framed and sends no referrer; the page's Content-Security-
//! Policy allows only its own inline script and style (by hash) and
//! same-origin fetches.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use muster_proto::v1;
use muster_proto::v1::admin_service_client::AdminServiceClient;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::health::Readiness;
use crate::server::raft::Consensus;

/// How the listener serves: how fresh the dashboard's view is, how fast one
/// client may ask, and whether the dashboard and metrics need a token.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// The dashboard's view is rebuilt at most this often; every request
    /// in between is answered from the cached bytes.
    pub refresh_every: Duration,
    /// Requests per second one client address may make (a token bucket
    /// with twice this as its burst); more are answered 429. Probes
    /// (`/healthz`, `/readyz`) are not counted.
    pub rate_per_s: u32,
    /// When set, `/ui`, `/ui/api/*` and `/metrics` need this token: as
    /// `Authorization: Bearer TOKEN`, or the cookie `/ui?token=TOKEN` sets.
    pub token: Option<Arc<str>>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions { refresh_every: Duration::from_millis(1000), rate_per_s: 20, token: None }
    }
}

/// The cookie `/ui?token=` sets.
const TOKEN_COOKIE: &str = "muster_ui";
/// Client addresses the rate limiter remembers before it forgets the idle.
const MAX_CLIENTS: usize = 4096;

/// Checks a `--http-token-file` token: 16 to 256 characters a URL and a
/// cookie carry unescaped.
pub fn check_token(token: &str) -> Result<(), String> {
    if !(16..=256).contains(&token.len()) {
        return Err(format!("the token has {} characters; it needs 16 to 256", token.len()));
    }
    if let Some(c) = token.chars().find(|c| !(c.is_ascii_alphanumeric() || "-._~".contains(*c))) {
        return Err(format!("the token may hold only letters, digits and -._~, not {c:?}"));
    }
    Ok(())
}

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    shared: Consensus,
    policies: Arc<crate::server::policies::Policies>,
    readiness: watch::Receiver<Readiness>,
    tls: Option<Arc<muster_tls::TlsMaterial>>,
    opts: HttpOptions,
    view: Arc<View>,
    limiter: Arc<RateLimiter>,
}

/// Serves until `stop` turns true, on a runtime of its own (one thread):
/// however many requests arrive, they queue there, never on the runtime
/// that runs Raft's heartbeats, elections and the gRPC services.
pub fn serve(
    listener: tokio::net::TcpListener,
    shared: Consensus,
    policies: Arc<crate::server::policies::Policies>,
    readiness: watch::Receiver<Readiness>,
    tls: Option<muster_tls::TlsMaterial>,
    opts: HttpOptions,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let limiter = Arc::new(RateLimiter::new(opts.rate_per_s));
    let state = HttpState { shared, policies, readiness, tls: tls.map(Arc::new), opts, view: Arc::default(), limiter };
    // The listener moves to the HTTP runtime's reactor.
    let listener = listener.into_std();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener?)?;
            let guarded = Router::new()
                .route("/", get(|| async { Redirect::to("/ui") }))
                .route("/metrics", get(metrics))
                .route("/ui", get(ui))
                .route("/ui/api/overview", get(overview))
                .layer(axum::middleware::from_fn_with_state(state.clone(), authorise))
                .layer(axum::middleware::from_fn_with_state(state.clone(), rate_limit));
            let app = Router::new()
                .route("/healthz", get(healthz))
                .route("/readyz", get(readyz))
                .merge(guarded)
                .layer(axum::middleware::map_response(security_headers))
                .with_state(state);
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    })
}

/// Per-client token buckets: `rate` a second, bursts of twice that.
struct RateLimiter {
    rate: f64,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl RateLimiter {
    fn new(rate_per_s: u32) -> RateLimiter {
        RateLimiter { rate: f64::from(rate_per_s.max(1)), buckets: Mutex::default() }
    }

    fn burst(&self) -> f64 {
        2.0 * self.rate
    }

    /// Takes a token from `ip`'s bucket at `now`, if it has one.
    fn allow(&self, ip: IpAddr, now: Instant) -> bool {
        let mut b = self.buckets.lock().expect("rate limiter lock");
        if b.len() >= MAX_CLIENTS && !b.contains_key(&ip) {
            // Forget the clients whose buckets have refilled (they lose
            // nothing); if all are busy, forget them all rather than grow.
            let full_after = Duration::from_secs_f64(self.burst() / self.rate);
            b.retain(|_, (_, at)| now.saturating_duration_since(*at) < full_after);
            if b.len() >= MAX_CLIENTS {
                b.clear();
            }
        }
        let (tokens, at) = b.entry(ip).or_insert((self.burst(), now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * self.rate).min(self.burst());
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

async fn rate_limit(
    AxState(s): AxState<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    if s.limiter.allow(peer.ip(), Instant::now()) {
        return next.run(req).await;
    }
    metrics::counter!("muster_http_rate_limited_total").increment(1);
    let mut r = text(StatusCode::TOO_MANY_REQUESTS, "too many requests from this address; retry in a second\n".into());
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Equal in time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token a request presents: `Authorization: Bearer`, else the cookie.
fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ").map(str::trim);
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='))
}

/// With a token configured: lets through requests that present it;
/// `/ui?token=TOKEN` sets it as a cookie (HttpOnly, SameSite=Strict) and
/// sends the browser to `/ui`, so the token leaves the address bar.
async fn authorise(AxState(s): AxState<HttpState>, req: Request, next: Next) -> Response {
    let Some(token) = s.opts.token.as_deref() else { return next.run(req).await };
    if presented(req.headers()).is_some_and(|given| same_secret(given, token)) {
        return next.run(req).await;
    }
    // A stale cookie does not stand in the way of logging in again.
    if req.uri().path() == "/ui"
        && let Some(given) =
            req.uri().query().into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix("token="))
        && same_secret(given, token)
    {
        let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
        let mut r = Redirect::to("/ui").into_response();
        r.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("a checked token"));
        return r;
    }
    let mut r = text(
        StatusCode::UNAUTHORIZED,
        "this listener needs its token: Authorization: Bearer TOKEN, or open /ui?token=TOKEN once\n".into(),
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"muster\""));
    r
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

/// The dashboard's view: the overview's bytes, rebuilt at most once per
/// `refresh_every` by whichever request finds it stale (the others wait for
/// that one and share its bytes), and the channels to the peers, kept open
/// between rebuilds.
#[derive(Default)]
struct View {
    cached: tokio::sync::Mutex<Option<(Instant, bytes::Bytes)>>,
    peers: Mutex<HashMap<String, AdminServiceClient<Channel>>>,
}

impl View {
    async fn overview(&self, s: &HttpState) -> bytes::Bytes {
        let mut cached = self.cached.lock().await;
        if let Some((at, body)) = cached.as_ref()
            && at.elapsed() < s.opts.refresh_every
        {
            return body.clone();
        }
        let body = bytes::Bytes::from(self.build(s).await.to_string());
        metrics::counter!("muster_ui_overview_builds_total").increment(1);
        *cached = Some((Instant::now(), body.clone()));
        body
    }

    /// A peer's client, on a channel kept for the next rebuild.
    fn peer(&self, addr: &str, tls: Option<&muster_tls::TlsMaterial>) -> Result<AdminServiceClient<Channel>, String> {
        let mut peers = self.peers.lock().expect("peer channel lock");
        if let Some(c) = peers.get(addr) {
            return Ok(c.clone());
        }
        let channel = crate::server::raft::network::lazy_channel(addr, Duration::from_millis(500), tls)
            .map_err(|e| format!("address: {e}"))?;
        let c = AdminServiceClient::new(channel);
        peers.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    async fn build(&self, s: &HttpState) -> Value {
        let me = s.shared.status();
        let peers: Vec<_> = me
            .members
            .iter()
            .filter(|m| m.id != me.id)
            .map(|m| {
                let client = self.peer(&m.address, s.tls.as_deref());
                let (id, addr) = (m.id, m.address.clone());
                async move {
                    let status = match client {
                        Ok(mut c) => {
                            match tokio::time::timeout(Duration::from_secs(1), c.status(v1::StatusRequest {})).await {
                                Ok(Ok(r)) => Ok(r.into_inner()),
                                Ok(Err(st)) => Err(format!("{}: {}", st.code(), st.message())),
                                Err(_) => Err("no answer within 1 s".to_string()),
                            }
                        }
                        Err(e) => Err(e),
                    };
                    match status {
                        Ok(r) => replica_json(&r),
                        Err(e) => json!({"id": id, "address": addr, "role": "unreachable", "error": e}),
                    }
                }
            })
            .collect();
        let mut replicas: Vec<Value> = futures_util::future::join_all(peers).await;
        replicas.push(replica_json(&me));
        replicas.sort_by_key(|r| r["id"].as_u64());
        let cfg = s.policies.preemption();
        let mut body = s.shared.reader().read(|st| super::dashboard::overview(st, s.shared.now(st), &cfg));
        body["self"] = replica_json(&me);
        body["replicas"] = Value::Array(replicas);
        body["ready"] = json!(s.readiness.borrow().ready);
        body
    }
}

async fn overview(AxState(s): AxState<HttpState>) -> Response {
    let body = s.view.overview(&s).await;
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body)
        .into_response()
}

/// The address a listener for `--http` binds, for logs.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/ui (also /metrics, /healthz, /readyz)")
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use axum::http::{HeaderMap, HeaderValue, header};
    use tokio::time::Instant;

    #[test]
    fn a_client_gets_its_burst_then_its_rate_and_others_are_not_charged() {
        let limiter = super::RateLimiter::new(10);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!((0..25).filter(|_| limiter.allow(a, t0)).count(), 20, "a burst of twice the rate");
        assert!(limiter.allow(b, t0), "another address has its own bucket");
        assert!(!limiter.allow(a, t0 + Duration::from_millis(50)), "half a token back: still refused");
        assert!(limiter.allow(a, t0 + Duration::from_millis(100)), "one token back after 100 ms at 10/s");
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..25).filter(|_| limiter.allow(a, later)).count(), 20, "refilled to the burst, no more");
    }

    #[test]
    fn the_limiter_forgets_idle_clients_rather_than_grow() {
        let limiter = super::RateLimiter::new(1);
        let t0 = Instant::now();
        for i in 0..super::MAX_CLIENTS as u32 {
            assert!(limiter.allow(IpAddr::from(i.to_be_bytes()), t0));
        }
        let later = t0 + Duration::from_secs(10);
        assert!(limiter.allow("192.0.2.1".parse().unwrap(), later));
        assert_eq!(limiter.buckets.lock().unwrap().len(), 1, "the refilled buckets were forgotten");
    }

    #[test]
    fn a_token_is_read_from_the_bearer_header_or_the_cookie_and_compared_whole() {
        let mut h = HeaderMap::new();
        assert_eq!(super::presented(&h), None);
        h.insert(header::COOKIE, HeaderValue::from_static("a=b; muster_ui=abc123; c=d"));
        assert_eq!(super::presented(&h), Some("abc123"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer xyz"));
        assert_eq!(super::presented(&h), Some("xyz"), "the header wins");
        assert!(
            super::same_secret("abc", "abc") && !super::same_secret("abc", "abd") && !super::same_secret("abc", "ab")
        );
        assert!(super::check_token("0123456789abcdef").is_ok());
        assert!(super::check_token("short").unwrap_err().contains("16 to 256"));
        assert!(super::check_token("0123456789abcdef;").unwrap_err().contains("';'"));
    }

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
