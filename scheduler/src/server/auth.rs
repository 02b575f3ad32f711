//! Who may call what (docs/security.md). Every call passes the
//! [`muster_tls::AuthLayer`] with this policy before it reaches a handler:
//!
//! | method | server | agent | admin | client | reader |
//! |---|---|---|---|---|---|
//! | RaftService/* | ✓ | | | | |
//! | AgentService/Connect | | ✓ (as its own node) | | | |
//! | AllocationService/Submit, Cancel | | | ✓ | ✓ | |
//! | AllocationService/Get, List, Explain, Watch, Logs | | | ✓ | ✓ | ✓ |
//! | NodeService/ListNodes, GetNode, WatchNodes | | | ✓ | ✓ | ✓ |
//! | NodeService/* (lifecycle) | | | ✓ | | |
//! | AdminService/Status | | | ✓ | ✓ | ✓ |
//! | AdminService/* (membership, snapshot, election) | | | ✓ | | |
//!
//! Anything else is refused. With `--insecure` nobody is identified and
//! every call is let through.

use muster_tls::{Caller, Role};
use tonic::Status;

/// Which roles may call a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    Servers,
    Agents,
    Writers,
    Readers,
    Admins,
}

impl Allowed {
    fn admits(self, role: &Role) -> bool {
        match self {
            Allowed::Servers => matches!(role, Role::Server(_)),
            Allowed::Agents => matches!(role, Role::Agent(_)),
            Allowed::Admins => matches!(role, Role::Admin(_)),
            Allowed::Writers => matches!(role, Role::Admin(_) | Role::Client(_)),
            Allowed::Readers => matches!(role, Role::Admin(_) | Role::Client(_) | Role::Reader(_)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
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
        ("muster.v1.AllocationService", "Submit" | "Cancel") => Allowed::Writers,
        ("muster.v1.AllocationService", "Get" | "List" | "Explain" | "Watch" | "Logs") => Allowed::Readers,
        ("muster.v1.NodeService", "ListNodes" | "GetNode" | "WatchNodes") => Allowed::Readers,
        ("muster.v1.NodeService", _) => Allowed::Admins,
        ("muster.v1.AdminService", "Status") => Allowed::Readers,
        ("muster.v1.AdminService", _) => Allowed::Admins,
        _ => return None,
    })
}

/// The policy: `Ok` when `caller` may call `path`.
pub fn policy(path: &str, caller: &Caller) -> Result<(), Status> {
    let Caller::Role(role) = caller else { return Ok(()) };
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
        Caller::Role(other) => Err(Status::permission_denied(format!("{other} is not a node agent"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(kind: &str, name: &str) -> Caller {
        Caller::Role(Role::new(kind, name).unwrap())
    }

    #[test]
    fn each_role_reaches_exactly_its_methods() {
        let cases = [
            ("/muster.v1.RaftService/AppendEntries", ["server"].as_slice()),
            ("/muster.v1.RaftService/InstallSnapshot", &["server"]),
            ("/muster.v1.AgentService/Connect", &["agent"]),
            ("/muster.v1.AllocationService/Submit", &["admin", "client"]),
            ("/muster.v1.AllocationService/Cancel", &["admin", "client"]),
            ("/muster.v1.AllocationService/Watch", &["admin", "client", "reader"]),
            ("/muster.v1.NodeService/ListNodes", &["admin", "client", "reader"]),
            ("/muster.v1.NodeService/DrainNode", &["admin"]),
            ("/muster.v1.NodeService/ScaleDown", &["admin"]),
            ("/muster.v1.AdminService/Status", &["admin", "client", "reader"]),
            ("/muster.v1.AdminService/ChangeMembership", &["admin"]),
            ("/grpc.health.v1.Health/Check", &[]),
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
    fn an_agent_registers_only_as_its_own_node() {
        assert!(check_agent_node(&role("agent", "a"), "a").is_ok());
        let err = check_agent_node(&role("agent", "a"), "b").unwrap_err();
        assert!(err.message().contains("for node \"a\"; it cannot register as node \"b\""), "{err:?}");
        assert!(check_agent_node(&role("admin", "a"), "a").is_err());
        assert!(check_agent_node(&Caller::Insecure, "b").is_ok());
    }
}
