//! Roles and their SAN URIs.

use std::fmt;

use thiserror::Error;
use x509_parser::extensions::GeneralName;

const PREFIX: &str = "urn:muster:";

/// What a certificate (or token) lets its holder be.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Scheduler replica `id`.
    Server(u64),
    /// The agent of this node id.
    Agent(String),
    /// An operator.
    Admin(String),
    /// A user: submits, cancels, reads.
    Client(String),
    /// Reads only (list, get, watch, status).
    Reader(String),
}

/// Why a role or certificate identity is not acceptable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum IdentityError {
    /// The URI is not `urn:muster:<role>:<name>`.
    #[error("{0:?} is not a muster identity (urn:muster:server|agent|admin|client:<name>)")]
    NotMuster(String),
    /// A name with characters outside `[A-Za-z0-9._-]`, empty, or too long.
    #[error("{what} name {name:?} must be 1-128 characters of A-Z a-z 0-9 . _ -")]
    BadName {
        /// The role.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// The certificate does not parse.
    #[error("the certificate does not parse: {0}")]
    BadCertificate(String),
    /// No `urn:muster:` SAN URI.
    #[error("the certificate has no urn:muster: SAN URI (the common name is never used)")]
    NoIdentity,
    /// More than one `urn:muster:` SAN URI.
    #[error("the certificate names {0} muster identities; exactly one is allowed")]
    Ambiguous(usize),
}

fn check_name(what: &'static str, name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(IdentityError::BadName { what, name: name.to_string() }) }
}

impl Role {
    /// Builds a role from its kind (`server`, `agent`, `admin`, `client`,
    /// `reader`) and name, validating the name.
    pub fn new(kind: &str, name: &str) -> Result<Role, IdentityError> {
        let role = match kind {
            "server" => Role::Server(
                name.parse()
                    .ok()
                    .filter(|&id| id > 0)
                    .ok_or(IdentityError::BadName { what: "server", name: name.into() })?,
            ),
            "agent" => Role::Agent(name.to_string()),
            "admin" => Role::Admin(name.to_string()),
            "client" => Role::Client(name.to_string()),
            "reader" => Role::Reader(name.to_string()),
            _ => return Err(IdentityError::NotMuster(format!("{PREFIX}{kind}:{name}"))),
        };
        check_name(role.kind(), name)?;
        Ok(role)
    }

    /// `server`, `agent`, `admin`, `client` or `reader`.
    pub fn kind(&self) -> &'static str {
        match self {
            Role::Server(_) => "server",
            Role::Agent(_) => "agent",
            Role::Admin(_) => "admin",
            Role::Client(_) => "client",
            Role::Reader(_) => "reader",
        }
    }

    /// The name (a server's id as text).
    pub fn name(&self) -> String {
        match self {
            Role::Server(id) => id.to_string(),
            Role::Agent(n) | Role::Admin(n) | Role::Client(n) | Role::Reader(n) => n.clone(),
        }
    }

    /// `urn:muster:<kind>:<name>`.
    pub fn uri(&self) -> String {
        format!("{PREFIX}{}:{}", self.kind(), self.name())
    }

    /// Parses a SAN URI.
    pub fn parse_uri(uri: &str) -> Result<Role, IdentityError> {
        let rest = uri.strip_prefix(PREFIX).ok_or_else(|| IdentityError::NotMuster(uri.to_string()))?;
        let (kind, name) = rest.split_once(':').ok_or_else(|| IdentityError::NotMuster(uri.to_string()))?;
        Role::new(kind, name)
    }

    /// The file stem of its certificate in a TLS dir: `server-1`, `agent-gpu-07`, `admin-alice`.
    pub fn file_stem(&self) -> String {
        format!("{}-{}", self.kind(), self.name())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// Whether a PEM certificate carries `name` among its SAN DNS names (an
/// agent certificate issued before agents served checkpoints lacks
/// [`crate::AGENT_NAME`]).
pub fn cert_has_dns_name(pem: &str, name: &str) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(pem.as_bytes()) else { return false };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&pem.contents) else { return false };
    let Ok(Some(san)) = cert.subject_alternative_name() else { return false };
    san.value.general_names.iter().any(|g| matches!(g, GeneralName::DNSName(n) if *n == name))
}

/// The role a DER certificate names in its SAN URIs.
pub fn role_of_cert(der: &[u8]) -> Result<Role, IdentityError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
    role_of(&cert)
}

/// The role a parsed certificate names in its SAN URIs.
pub(crate) fn role_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Result<Role, IdentityError> {
    let san = cert.subject_alternative_name().map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|g| match g {
            GeneralName::URI(u) if u.starts_with(PREFIX) => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [] => Err(IdentityError::NoIdentity),
        [one] => Role::parse_uri(one),
        many => Err(IdentityError::Ambiguous(many.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_bad_ones_are_refused() {
        for role in [
            Role::Server(3),
            Role::Agent("gpu-07".into()),
            Role::Admin("alice".into()),
            Role::Client("bob.smith".into()),
            Role::Reader("grafana".into()),
        ] {
            assert_eq!(Role::parse_uri(&role.uri()).unwrap(), role);
        }
        assert_eq!(Role::Agent("gpu-07".into()).uri(), "urn:muster:agent:gpu-07");
        assert_eq!(Role::Server(1).file_stem(), "server-1");
        assert!(matches!(Role::parse_uri("urn:other:admin:x"), Err(IdentityError::NotMuster(_))));
        assert!(matches!(Role::parse_uri("urn:muster:root:x"), Err(IdentityError::NotMuster(_))));
        assert!(matches!(Role::parse_uri("urn:muster:server:0"), Err(IdentityError::BadName { .. })));
        assert!(matches!(Role::parse_uri("urn:muster:agent:a/b"), Err(IdentityError::BadName { .. })));
        assert!(matches!(Role::parse_uri("urn:muster:admin:"), Err(IdentityError::BadName { .. })));
        assert!(role_of_cert(b"junk").is_err());
    }
}
