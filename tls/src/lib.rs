//! Mutual TLS for Muster (docs/security.md).
//!
//! Every process proves a **role** with a certificate from the cluster's CA.
//! The role is read from the certificate's SAN URI, never from the common
//! name:
//!
//! | role | SAN URI | may call |
//! |---|---|---|
//! | server | `urn:muster:server:<id>` | Raft RPCs (and everything a client may) |
//! | agent | `urn:muster:agent:<node_id>` | the agent stream, as that node only |
//! | admin | `urn:muster:admin:<name>` | everything but Raft and the agent stream |
//! | client | `urn:muster:client:<name>` | submit, cancel and every read |
//!
//! Server certificates also carry the DNS name [`SERVER_NAME`], which every
//! client verifies, so no other role can pose as a server. Agent
//! certificates carry [`AGENT_NAME`], for the checkpoints agents serve each
//! other.
//!
//! ```text
//!   muster tls init ──▶ ca.pem, ca-key.pem
//!   muster tls issue server 1 ──▶ server-1.pem, server-1-key.pem   (signed by ca)
//!   process ── --tls-dir D ──▶ TlsMaterial (ca + its own cert/key)
//!        server: ServerTlsConfig (client certs required) + AuthLayer(policy)
//!        client: ClientTlsConfig (verifies SERVER_NAME) + its cert
//! ```

#![deny(missing_docs)]

mod auth;
mod ca;
mod identity;
mod material;

pub use auth::{AdmitHook, AuthLayer, AuthService, Caller, Policy, TokenResolver, peer_role};
pub use ca::{CaError, Validity, init_ca, issue};
pub use identity::{IdentityError, Role, cert_has_dns_name, role_of_cert};
pub use material::{HANDSHAKE_TIMEOUT, TlsError, TlsMaterial, agent_endpoint, cert_file_names, endpoint};

/// The DNS name in every server certificate; clients verify it.
pub const SERVER_NAME: &str = "server.muster";

/// The DNS name in every agent certificate: agents serve the checkpoints on
/// their disks to each other, and verify it when they fetch one (which
/// node answered does not matter: the fetcher checks the bytes against the
/// manifest's digest).
pub const AGENT_NAME: &str = "agent.muster";
