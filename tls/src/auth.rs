//! Authorisation of every gRPC call by the caller's role: a tower layer in
//! front of all of a server's services. It reads the verified peer
//! certificate of the connection, takes the role from its SAN URI, asks the
//! server's policy whether that role may call the method (the URI path),
//! and hands the [`Caller`] to the handler in the request's extensions
//! (where, e.g., the agent stream compares the node id with the one it
//! registers). A refusal is answered with a gRPC status and never reaches a
//! handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::{Role, role_of_cert};

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A verified certificate's role.
    Role(Role),
    /// A bearer token's role (on an admin, client or reader connection).
    Token {
        /// What the token allows.
        role: Role,
        /// The token's id, to check it again during a stream.
        id: String,
    },
    /// The server runs with `--insecure`: nobody is identified, everything is allowed.
    Insecure,
}

impl Caller {
    /// The role calls are authorised by (`None` when insecure).
    pub fn role(&self) -> Option<&Role> {
        match self {
            Caller::Role(r) | Caller::Token { role: r, .. } => Some(r),
            Caller::Insecure => None,
        }
    }
}

/// Resolves a bearer token's secret to its role and id.
pub type TokenResolver = Arc<dyn Fn(&str) -> Result<(Role, String), Status> + Send + Sync>;

/// The caller of a request with `certificate` role and these headers: the
/// token's role when an `authorization: Bearer` header is present (only on
/// admin, client and reader connections), else the certificate's.
fn caller_of(cert: Role, headers: &http::HeaderMap, tokens: Option<&TokenResolver>) -> Result<Caller, Status> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else { return Ok(Caller::Role(cert)) };
    let secret = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Status::unauthenticated("the authorization header must be `Bearer <token>`"))?;
    if matches!(cert, Role::Server(_) | Role::Agent(_)) {
        return Err(Status::permission_denied(format!(
            "{cert} may not present a token: tokens are for admin, client and reader connections"
        )));
    }
    let resolve = tokens.ok_or_else(|| Status::unauthenticated("this server does not accept tokens"))?;
    let (role, id) = resolve(secret)?;
    Ok(Caller::Token { role, id })
}

impl Caller {
    /// The caller of a request that went through the [`AuthLayer`]; a
    /// request that did not (an in-process test without the layer) is
    /// treated as insecure.
    pub fn of<T>(req: &tonic::Request<T>) -> Caller {
        req.extensions().get::<Caller>().cloned().unwrap_or(Caller::Insecure)
    }
}

/// The role a request's TLS peer certificate names.
pub fn peer_role(extensions: &http::Extensions) -> Result<Role, Status> {
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .ok_or_else(|| Status::unauthenticated("a client certificate is required (mutual TLS)"))?;
    let leaf = certs.first().ok_or_else(|| Status::unauthenticated("a client certificate is required (mutual TLS)"))?;
    role_of_cert(leaf).map_err(|e| Status::unauthenticated(format!("client certificate refused: {e}")))
}

/// A server's policy: may `caller` call `path` (`/muster.v1.Service/Method`)?
pub type Policy = Arc<dyn Fn(&str, &Caller) -> Result<(), Status> + Send + Sync>;

/// Told of each admitted call's connection (its peer address), so that the
/// server can tell connections that have proved who they are from those
/// that have not.
pub type AdmitHook = Arc<dyn Fn(std::net::SocketAddr) + Send + Sync>;

/// The layer; `insecure` lets every call through as [`Caller::Insecure`].
#[derive(Clone)]
pub struct AuthLayer {
    policy: Policy,
    tokens: Option<TokenResolver>,
    insecure: bool,
    on_admit: Option<AdmitHook>,
}

impl AuthLayer {
    /// Checks every call against `policy`.
    pub fn new(policy: Policy) -> AuthLayer {
        AuthLayer { policy, tokens: None, insecure: false, on_admit: None }
    }

    /// Calls `hook` with the peer address of every admitted call.
    pub fn on_admit(mut self, hook: AdmitHook) -> AuthLayer {
        self.on_admit = Some(hook);
        self
    }

    /// Also accepts bearer tokens, resolved by `tokens`.
    pub fn with_tokens(mut self, tokens: TokenResolver) -> AuthLayer {
        self.tokens = Some(tokens);
        self
    }

    /// Identifies nobody and allows everything (`--insecure`).
    pub fn insecure() -> AuthLayer {
        AuthLayer { policy: Arc::new(|_, _| Ok(())), tokens: None, insecure: true, on_admit: None }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            policy: self.policy.clone(),
            tokens: self.tokens.clone(),
            insecure: self.insecure,
            on_admit: self.on_admit.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around a server's routes.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    policy: Policy,
    tokens: Option<TokenResolver>,
    insecure: bool,
    on_admit: Option<AdmitHook>,
}

/// The peer address of a request's connection (TLS or plain).
fn remote_addr(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| extensions.get::<TcpConnectInfo>().and_then(|i| i.remote_addr()))
}

impl<S, B, R> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let caller = if self.insecure {
            Ok(Caller::Insecure)
        } else {
            peer_role(req.extensions()).and_then(|cert| caller_of(cert, req.headers(), self.tokens.as_ref()))
        };
        let allowed = caller.and_then(|c| (self.policy)(req.uri().path(), &c).map(|()| c));
        match allowed {
            Ok(caller) => {
                if let Some(hook) = &self.on_admit
                    && let Some(addr) = remote_addr(req.extensions())
                {
                    hook(addr);
                }
                req.extensions_mut().insert(caller);
                // The clone that was made ready is the one to call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(inner.call(req))
            }
            Err(status) => {
                tracing::warn!(path = req.uri().path(), code = ?status.code(), message = status.message(), "call refused");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
