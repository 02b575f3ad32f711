//! Who may call what (docs/security.md). Every call passes the
//! [`muster_tls::AuthLayer`] with this policy before it reaches a handler:
//!
//! | method | server | agent | admin | client | reader |
//! |---|---|---|---|---|---|
//! | RaftService/* | ✓ | | | | |
//! | AgentService/Connect | | ✓ (as its own node) | | | |
//! | AllocationService/Submit, SubmitWorkflow, Cancel, SetArrayThrottle | | | ✓ | ✓ | |
//! | AllocationService/Get, GetArray, GetWorkflow, List, Explain, Watch, Logs | | | ✓ | ✓ | ✓ |
//! | NodeService/ListNodes, GetNode, WatchNodes | | | ✓ | ✓ | ✓ |
//! | NodeService/* (lifecycle, AdmitNode, LabelNode) | | | ✓ | | |
//! | VClusterService/GetVCluster, ListVClusters | | | ✓ | ✓ | ✓ |
//! | VClusterService/CreateVCluster, UpdateVCluster | | | ✓ | | |
//! | HistoryService/ListHistory, Usage | | | ✓ | ✓ | ✓ |
//! | HistoryService/FetchRecords (a replica catching up) | ✓ | | | | |
//! | AdminService/Status | ✓ (the dashboard asks its peers) | | ✓ | ✓ | ✓ |
//! | AdminService/GetCheckpointSettings | | | ✓ | ✓ | ✓ |
//! | AdminService/* (membership, snapshot, election, backup) | | | ✓ | | |
//! | grpc.health.v1.Health/* | ✓ | ✓ | ✓ | ✓ | ✓ |
//! | grpc.reflection.{v1,v1alpha}.ServerReflection/* | | | ✓ | ✓ | ✓ |
//!
//! Anything else is refused. With `--insecure` nobody is identified and
//! every call is let through.

use muster_tls::{Caller, Role};
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::sm::{State, TokenRole};

/// Every token secret starts so: `mst_<id>_<64 hex digits>`.
pub const TOKEN_PREFIX: &str = "mst_";

/// SHA-256 of a secret.
pub fn token_sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// A new token id and secret, from the OS's random source.
pub fn new_token_secret() -> std::io::Result<(String, String)> {
    use std::io::Read;
    let mut bytes = [0u8; 40];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let id = hex(&bytes[..8]);
    let secret = format!("{TOKEN_PREFIX}{id}_{}", hex(&bytes[8..]));
    Ok((id, secret))
}

/// Equal, in time that does not depend on where they differ.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn token_role(role: TokenRole, name: &str) -> Role {
    match role {
        TokenRole::Admin => Role::Admin(name.to_string()),
        TokenRole::Client => Role::Client(name.to_string()),
        TokenRole::Reader => Role::Reader(name.to_string()),
    }
}

/// Whether token `id` still works at `now_ms` (not revoked, not expired).
pub fn token_in_force(st: &State, id: &str, now_ms: u64) -> Result<(), Status> {
    let t = st.token(id).ok_or_else(|| Status::unauthenticated("unknown token"))?;
    if let Some((_, by)) = &t.revoked {
        return Err(Status::unauthenticated(format!("token {id} was revoked by {by}")));
    }
    if now_ms >= t.expires_ms {
        return Err(Status::unauthenticated(format!("token {id} has expired")));
    }
    Ok(())
}

/// The role and id of the token whose secret is `secret`.
pub fn resolve_token(st: &State, secret: &str, now_ms: u64) -> Result<(Role, String), Status> {
    let (id, _) = secret
        .strip_prefix(TOKEN_PREFIX)
        .and_then(|rest| rest.split_once('_'))
        .ok_or_else(|| Status::unauthenticated("not a muster token (mst_<id>_<secret>)"))?;
    let t = st.token(id).ok_or_else(|| Status::unauthenticated("unknown token"))?;
    if !same_digest(&t.sha256, &token_sha256(secret)) {
        return Err(Status::unauthenticated("unknown token"));
    }
    token_in_force(st, id, now_ms)?;
    Ok((token_role(t.role, &t.name), t.id.clone()))
}

/// Checked again before each message of a long-lived stream: a caller by
/// token loses the stream once the token is revoked or expires.
pub fn still_authorised(st: &State, caller: &Caller, now_ms: u64) -> Result<(), Status> {
    match caller {
        Caller::Token { id, .. } => token_in_force(st, id, now_ms),
        Caller::Role(_) | Caller::Insecure => Ok(()),
    }
}

/// The `by` recorded for an operator's request: the caller's verified
/// identity (`admin alice`), with the name the request gave appended when it
/// differs (`admin ops-bot (token 1a2b…) for alice`); without TLS, only the
/// request's word.
pub fn bound_by(caller: &Caller, asked: &str) -> String {
    let asked = asked.trim();
    match caller {
        // No certificate to name anyone: what the caller says, else that
        // it was an unauthenticated caller (an empty `by` is refused).
        Caller::Insecure if asked.is_empty() => "an insecure caller".to_string(),
        Caller::Insecure => asked.to_string(),
        Caller::Role(r) | Caller::Token { role: r, .. } if asked.is_empty() || asked == r.name() => caller_name(caller),
        _ => format!("{} for {asked}", caller_name(caller)),
    }
}

/// [`still_authorised`] against a replica's applied state, now.
pub(crate) fn stream_still_authorised(s: &crate::server::raft::Consensus, caller: &Caller) -> Result<(), Status> {
    s.reader().read(|st| still_authorised(st, caller, s.now(st)))
}

/// Who a caller is, for `by` fields: `admin alice`, `client bob (token 1a2b…)`.
pub fn caller_name(caller: &Caller) -> String {
    match caller {
        Caller::Role(r) => r.to_string(),
        Caller::Token { role, id } => format!("{role} (token {id})"),
        Caller::Insecure => "anonymous (insecure)".to_string(),
    }
}

/// Which roles may call a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    Anyone,
    ReadersAndServers,
    Servers,
    Agents,
    Writers,
    Readers,
    Admins,
}

impl Allowed {
    fn admits(self, role: &Role) -> bool {
        match self {
            Allowed::Anyone => true,
            Allowed::ReadersAndServers => Allowed::Readers.admits(role) || Allowed::Servers.admits(role),
            Allowed::Servers => matches!(role, Role::Server(_)),
            Allowed::Agents => matches!(role, Role::Agent(_)),
            Allowed::Admins => matches!(role, Role::Admin(_)),
            Allowed::Writers => matches!(role, Role::Admin(_) | Role::Client(_)),
            Allowed::Readers => matches!(role, Role::Admin(_) | Role::Client(_) | Role::Reader(_)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Allowed::Anyone => "any verified caller",
            Allowed::ReadersAndServers => "admins, clients, readers and scheduler replicas only",
            Allowed::Servers => "scheduler replicas only",
            Allowed::Agents => "node agents only",
            Allowed::Admins => "admins only",
            Allowed::Writers => "admins and clients only",
            Allowed::Readers => "admins, clients and readers only",
        }
    }
}

fn allowed(path: &str) -> Option<Allowed> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(match (service, method) {
        ("muster.v1.RaftService", _) => Allowed::Servers,
        ("muster.v1.AgentService", "Connect") => Allowed::Agents,
        ("muster.v1.AllocationService", "Submit" | "SubmitWorkflow" | "Cancel" | "SetArrayThrottle") => {
            Allowed::Writers
        }
        ("muster.v1.AllocationService", "Get" | "GetArray" | "GetWorkflow" | "List" | "Explain" | "Watch" | "Logs") => {
            Allowed::Readers
        }
        ("muster.v1.NodeService", "ListNodes" | "GetNode" | "WatchNodes") => Allowed::Readers,
        ("muster.v1.NodeService", _) => Allowed::Admins,
        ("muster.v1.VClusterService", "GetVCluster" | "ListVClusters") => Allowed::Readers,
        ("muster.v1.VClusterService", _) => Allowed::Admins,
        ("muster.v1.HistoryService", "ListHistory" | "Usage") => Allowed::Readers,
        ("muster.v1.HistoryService", "FetchRecords") => Allowed::Servers,
        ("muster.v1.AdminService", "Status") => Allowed::ReadersAndServers,
        ("muster.v1.AdminService", "GetCheckpointSettings") => Allowed::Readers,
        ("muster.v1.AdminService", _) => Allowed::Admins,
        ("grpc.health.v1.Health", _) => Allowed::Anyone,
        ("grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection", _) => Allowed::Readers,
        _ => return None,
    })
}

/// The policy: `Ok` when `caller` may call `path`.
pub fn policy(path: &str, caller: &Caller) -> Result<(), Status> {
    let Some(role) = caller.role() else { return Ok(()) };
    match allowed(path) {
        Some(a) if a.admits(role) => Ok(()),
        Some(a) => Err(Status::permission_denied(format!("{role} may not call {path} ({})", a.describe()))),
        None => Err(Status::permission_denied(format!("{path} is not a muster method"))),
    }
}

/// The agent stream's binding: a certificate for node X may register only
/// as node X.
pub fn check_agent_node(caller: &Caller, node_id: &str) -> Result<(), Status> {
    match caller {
        Caller::Role(Role::Agent(n)) if n != node_id => Err(Status::permission_denied(format!(
            "the agent certificate is for node {n:?}; it cannot register as node {node_id:?}"
        ))),
        Caller::Role(Role::Agent(_)) | Caller::Insecure => Ok(()),
        Caller::Role(other) | Caller::Token { role: other, .. } => {
            Err(Status::permission_denied(format!("{other} is not a node agent")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(kind: &str, name: &str) -> Caller {
        Caller::Role(Role::new(kind, name).unwrap())
    }

    #[test]
    fn an_insecure_caller_is_named_by_its_word_or_as_insecure() {
        assert_eq!(bound_by(&Caller::Insecure, " ops "), "ops");
        assert_eq!(bound_by(&Caller::Insecure, ""), "an insecure caller");
        assert_eq!(bound_by(&role("admin", "alice"), ""), caller_name(&role("admin", "alice")));
    }

    #[test]
    fn each_role_reaches_exactly_its_methods() {
        let cases = [
            ("/muster.v1.RaftService/AppendEntries", ["server"].as_slice()),
            ("/muster.v1.RaftService/AppendStream", &["server"]),
            ("/muster.v1.RaftService/InstallSnapshot", &["server"]),
            ("/muster.v1.AgentService/Connect", &["agent"]),
            ("/muster.v1.AllocationService/Submit", &["admin", "client"]),
            ("/muster.v1.AllocationService/Cancel", &["admin", "client"]),
            ("/muster.v1.AllocationService/SetArrayThrottle", &["admin", "client"]),
            ("/muster.v1.AllocationService/GetArray", &["admin", "client", "reader"]),
            ("/muster.v1.AllocationService/SubmitWorkflow", &["admin", "client"]),
            ("/muster.v1.AllocationService/GetWorkflow", &["admin", "client", "reader"]),
            ("/muster.v1.AllocationService/Watch", &["admin", "client", "reader"]),
            ("/muster.v1.NodeService/ListNodes", &["admin", "client", "reader"]),
            ("/muster.v1.NodeService/DrainNode", &["admin"]),
            ("/muster.v1.NodeService/ScaleDown", &["admin"]),
            ("/muster.v1.NodeService/AdmitNode", &["admin"]),
            ("/muster.v1.NodeService/LabelNode", &["admin"]),
            ("/muster.v1.VClusterService/CreateVCluster", &["admin"]),
            ("/muster.v1.VClusterService/UpdateVCluster", &["admin"]),
            ("/muster.v1.VClusterService/ListVClusters", &["admin", "client", "reader"]),
            ("/muster.v1.AdminService/Status", &["server", "admin", "client", "reader"]),
            ("/muster.v1.HistoryService/ListHistory", &["admin", "client", "reader"]),
            ("/muster.v1.HistoryService/Usage", &["admin", "client", "reader"]),
            ("/muster.v1.HistoryService/FetchRecords", &["server"]),
            ("/muster.v1.AdminService/ChangeMembership", &["admin"]),
            ("/muster.v1.AdminService/Backup", &["admin"]),
            ("/muster.v1.AdminService/GetCheckpointSettings", &["admin", "client", "reader"]),
            ("/muster.v1.AdminService/SetCheckpointSettings", &["admin"]),
            ("/grpc.health.v1.Health/Check", &["server", "agent", "admin", "client", "reader"]),
            ("/grpc.health.v1.Health/Watch", &["server", "agent", "admin", "client", "reader"]),
            ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", &["admin", "client", "reader"]),
            ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &["admin", "client", "reader"]),
            ("/grpc.health.v2.Health/Check", &[]),
            ("garbage", &[]),
        ];
        for (path, allowed) in cases {
            for kind in ["server", "agent", "admin", "client", "reader"] {
                let caller = role(kind, if kind == "server" { "1" } else { "x" });
                let got = policy(path, &caller);
                assert_eq!(got.is_ok(), allowed.contains(&kind), "{kind} calling {path}: {got:?}");
                if let Err(s) = got {
                    assert_eq!(s.code(), tonic::Code::PermissionDenied);
                }
            }
            assert!(policy(path, &Caller::Insecure).is_ok());
        }
        let err = policy("/muster.v1.RaftService/AppendEntries", &role("agent", "gpu-07")).unwrap_err();
        assert_eq!(
            err.message(),
            "agent gpu-07 may not call /muster.v1.RaftService/AppendEntries (scheduler replicas only)"
        );
    }

    #[test]
    fn by_is_the_callers_identity_with_the_requests_word_appended() {
        let alice = role("admin", "alice");
        assert_eq!(bound_by(&alice, "alice"), "admin alice");
        assert_eq!(bound_by(&alice, ""), "admin alice");
        assert_eq!(bound_by(&alice, "bob"), "admin alice for bob");
        let token = Caller::Token { role: Role::Admin("ops".into()), id: "1a".into() };
        assert_eq!(bound_by(&token, "carol"), "admin ops (token 1a) for carol");
        assert_eq!(bound_by(&Caller::Insecure, "dave"), "dave");
    }

    #[test]
    fn an_agent_registers_only_as_its_own_node() {
        assert!(check_agent_node(&role("agent", "a"), "a").is_ok());
        let err = check_agent_node(&role("agent", "a"), "b").unwrap_err();
        assert!(err.message().contains("for node \"a\"; it cannot register as node \"b\""), "{err:?}");
        assert!(check_agent_node(&role("admin", "a"), "a").is_err());
        assert!(check_agent_node(&Caller::Insecure, "b").is_ok());
    }
}
