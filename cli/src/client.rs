//! Finding the cluster: try the listed replicas, follow leader hints.
//!
//! Every client command takes `--scheduler host:port[,host:port…]` (or
//! `MUSTER_SCHEDULER`). A call goes to the last known leader first, then to
//! each listed replica; a replica that answers UNAVAILABLE with the leader in
//! metadata sends the call there. Unreachable replicas are skipped; when none
//! answers, the error names them all.
//!
//! The last leader that answered is remembered between runs, per list of
//! replicas, in `$XDG_CACHE_HOME/muster/` (or `~/.cache/muster/`), so a CLI
//! call dials the leader first instead of discovering it again. A stale
//! hint costs one redirect; `MUSTER_LEADER_CACHE=off` disables it.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use muster_scheduler::server::api::convert::LEADER_ADDR_HEADER;
use muster_tls::{Role, TlsMaterial};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Parses a `host:port[,host:port…]` list.
pub fn parse_addresses(list: &str) -> anyhow::Result<Vec<String>> {
    let addrs: Vec<String> = list.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
    if addrs.is_empty() {
        crate::usage!("--scheduler needs at least one host:port (or set MUSTER_SCHEDULER)");
    }
    for a in &addrs {
        let ok = a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            crate::usage!("--scheduler: {a:?} is not host:port");
        }
    }
    Ok(addrs)
}

/// Connects to one replica (over mutual TLS with `tls`).
pub async fn connect(addr: &str, timeout: Duration, tls: Option<&TlsMaterial>) -> anyhow::Result<Channel> {
    let endpoint = muster_tls::endpoint(addr, tls)
        .with_context(|| format!("{addr:?} is not a valid address"))?
        .connect_timeout(timeout)
        .timeout(Duration::from_secs(30));
    endpoint.connect().await.map_err(|e| anyhow!("cannot connect to {addr}: {e}"))
}

/// How long a CLI call may take, leader search and retries included.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);

enum Attempt {
    /// A replica answered UNAVAILABLE without naming a leader.
    NoLeaderYet(anyhow::Error),
    Failed(anyhow::Error),
}

/// Adds `authorization: Bearer <token>` to every call when a token is set.
#[derive(Clone, Default)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    /// From `--token` / `MUSTER_TOKEN`.
    pub fn new(token: Option<&str>) -> anyhow::Result<Bearer> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Bearer(None)),
            Some(t) => Ok(Bearer(Some(
                format!("Bearer {t}").parse().map_err(|_| anyhow!("--token: a token is printable ASCII"))?,
            ))),
        }
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A connection to one replica that carries the client's token.
pub type Chan = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// A client that follows the leader.
pub struct Cluster {
    addrs: Vec<String>,
    leader: Option<String>,
    /// What the leader cache holds for these replicas.
    remembered: Option<String>,
    tls: Option<TlsMaterial>,
    bearer: Bearer,
}

/// Turns a status into one readable line.
pub fn describe(status: &Status) -> String {
    let code = match status.code() {
        Code::InvalidArgument => "invalid argument",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::FailedPrecondition => "refused",
        Code::PermissionDenied => "permission denied",
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "timed out",
        Code::Aborted => "aborted",
        Code::ResourceExhausted => "too large or too many",
        Code::Unauthenticated => "not authenticated",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "not supported by this server",
        Code::Internal => "internal error",
        Code::DataLoss => "data loss",
        Code::Cancelled => "cancelled",
        // `muster: error:` already says it is an error.
        Code::Unknown | Code::Ok => return status.message().to_string(),
    };
    format!("{code}: {}", status.message())
}

/// Where the leader of `addrs` is remembered between runs (`None`: nowhere
/// to keep it, or `MUSTER_LEADER_CACHE=off`).
fn leader_cache(addrs: &[String]) -> Option<std::path::PathBuf> {
    if std::env::var("MUSTER_LEADER_CACHE").is_ok_and(|v| v == "off") {
        return None;
    }
    let base =
        std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(std::path::PathBuf::from).or_else(|| {
            std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| std::path::PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("muster").join(leader_cache_name(addrs)))
}

/// The cache file's name for a list of replicas: the sorted list, so any
/// order of the same replicas shares it (`leader-10.0.0.1_7000+10.0.0.2_7000`).
pub fn leader_cache_name(addrs: &[String]) -> String {
    let mut sorted: Vec<String> = addrs.iter().map(|a| a.replace([':', '/'], "_")).collect();
    sorted.sort();
    format!("leader-{}", sorted.join("+"))
}

/// The remembered leader of `addrs`, if it still parses as `host:port`.
fn cached_leader(addrs: &[String]) -> Option<String> {
    let text = std::fs::read_to_string(leader_cache(addrs)?).ok()?;
    let addr = text.trim();
    parse_addresses(addr).ok().filter(|a| a.len() == 1).map(|mut a| a.remove(0))
}

/// Remembers `leader` for `addrs` (best effort: a cache that cannot be
/// written costs only a discovery next time).
fn remember_leader(addrs: &[String], leader: &str) {
    let Some(path) = leader_cache(addrs) else { return };
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, format!("{leader}\n")))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

impl Cluster {
    /// A client for these replicas, starting from the leader remembered for
    /// them.
    pub fn new(addrs: Vec<String>, tls: Option<TlsMaterial>) -> Cluster {
        let leader = cached_leader(&addrs);
        Cluster { addrs, remembered: leader.clone(), leader, tls, bearer: Bearer::default() }
    }

    /// Sends `bearer`'s token with every call.
    pub fn with_token(mut self, bearer: Bearer) -> Cluster {
        self.bearer = bearer;
        self
    }

    /// Connects to one replica with this client's TLS material.
    pub async fn connect(&self, addr: &str, timeout: Duration) -> anyhow::Result<Chan> {
        let ch = connect(addr, timeout, self.tls.as_ref()).await?;
        Ok(Chan::new(ch, self.bearer.clone()))
    }

    /// The listed replicas.
    pub fn addresses(&self) -> &[String] {
        &self.addrs
    }

    /// Runs `call` against the leader, following hints, trying each replica.
    /// While replicas answer but no leader does (an election is under way,
    /// or followers still name a leader that just died), it waits and tries
    /// again, backing off from 50 ms to 500 ms, until the call's deadline
    /// ([`CALL_DEADLINE`]). When no replica answers at all it fails at once.
    pub async fn call<T, F, Fut>(&mut self, mut call: F) -> anyhow::Result<T>
    where
        F: FnMut(Chan) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let deadline = tokio::time::Instant::now() + CALL_DEADLINE;
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.call_once(&mut call).await {
                Err(Attempt::NoLeaderYet(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(backoff.min(deadline - tokio::time::Instant::now())).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(Attempt::NoLeaderYet(e) | Attempt::Failed(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    async fn call_once<T, F, Fut>(&mut self, call: &mut F) -> Result<T, Attempt>
    where
        F: FnMut(Chan) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        // Some replica answered (it is up) without leading.
        let mut leaderless = false;
        let mut queue: Vec<String> = self.leader.iter().cloned().chain(self.addrs.iter().cloned()).collect();
        let mut tried: Vec<String> = Vec::new();
        let mut problems: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(addr) = (!queue.is_empty()).then(|| queue.remove(0)) {
            if tried.contains(&addr) {
                continue;
            }
            tried.push(addr.clone());
            let channel = match connect(&addr, Duration::from_secs(3), self.tls.as_ref()).await {
                Ok(c) => Chan::new(c, self.bearer.clone()),
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            match call(channel).await {
                Ok(v) => {
                    if self.remembered.as_deref() != Some(addr.as_str()) {
                        remember_leader(&self.addrs, &addr);
                        self.remembered = Some(addr.clone());
                    }
                    self.leader = Some(addr);
                    return Ok(v);
                }
                Err(status) if status.code() == Code::Unavailable => {
                    let hint =
                        status.metadata().get(LEADER_ADDR_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
                    // Alive, but not the leader: whatever it names, the
                    // cluster is up, so a failure to reach a leader now is an
                    // election (or a dead leader not yet noticed), not a
                    // wrong address.
                    leaderless = true;
                    match hint {
                        Some(leader) if hops < 5 => {
                            hops += 1;
                            tried.retain(|a| *a != leader);
                            queue.insert(0, leader);
                        }
                        _ => problems.push(format!("{addr}: {}", describe(&status))),
                    }
                }
                Err(status) => return Err(Attempt::Failed(anyhow!("{}", describe(&status)))),
            }
        }
        let e = anyhow!("cannot reach the scheduler leader through {}: {}", self.addrs.join(", "), problems.join("; "));
        Err(if leaderless { Attempt::NoLeaderYet(e) } else { Attempt::Failed(e) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked() {
        assert_eq!(parse_addresses("a:1, b:2").unwrap(), vec!["a:1", "b:2"]);
        assert!(parse_addresses("").is_err());
        assert!(parse_addresses("nohost").unwrap_err().to_string().contains("not host:port"));
        assert!(parse_addresses("h:0").is_err());
        assert!(parse_addresses("h:99999").is_err());
    }

    #[test]
    fn every_status_reads_as_one_line_without_a_second_error() {
        for code in [Code::ResourceExhausted, Code::Unknown, Code::Internal, Code::Unauthenticated, Code::OutOfRange] {
            let line = describe(&Status::new(code, "the reason"));
            assert!(!line.starts_with("error") && line.ends_with("the reason"), "{code:?}: {line}");
        }
        assert_eq!(describe(&Status::invalid_argument("bad")), "invalid argument: bad");
    }
}

/// The warning every `--insecure` process prints.
pub fn warn_insecure() {
    eprintln!("muster: warning: --insecure: no TLS and no authorisation; use only for debugging");
}

/// How a process finds its TLS material (`--tls-dir`, `--insecure`).
#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// Directory with ca.pem and this process's certificate and key
    /// (`muster tls init`, `muster tls issue`).
    #[arg(long, env = "MUSTER_TLS_DIR", global = true)]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Run without TLS or authorisation (debugging only; prints a warning).
    #[arg(long, global = true)]
    pub insecure: bool,
}

impl TlsArgs {
    /// `role`'s material from the TLS dir, or `None` with `--insecure`.
    pub fn load(&self, role: &Role) -> anyhow::Result<Option<TlsMaterial>> {
        self.load_with(&role.to_string(), |dir| TlsMaterial::load(dir, role))
    }

    /// A client's material: `identity` (e.g. `admin-alice`) or the only
    /// admin (else client, else reader) certificate in the TLS dir.
    pub fn load_client(&self, identity: Option<&str>) -> anyhow::Result<Option<TlsMaterial>> {
        self.load_with("a client", |dir| TlsMaterial::load_for_client(dir, identity))
    }

    fn load_with(
        &self,
        whose: &str,
        load: impl FnOnce(&std::path::Path) -> Result<TlsMaterial, muster_tls::TlsError>,
    ) -> anyhow::Result<Option<TlsMaterial>> {
        if self.insecure {
            warn_insecure();
            return Ok(None);
        }
        let Some(dir) = &self.tls_dir else {
            bail!(
                "no TLS material: give --tls-dir DIR (or MUSTER_TLS_DIR) holding ca.pem and the certificate of {whose}, or --insecure to run without TLS (debugging only)"
            );
        };
        Ok(Some(load(dir).with_context(|| format!("--tls-dir {}", dir.display()))?))
    }
}
