//! A process's TLS material: the CA it trusts and its own certificate and
//! key, loaded from a TLS dir, and the tonic configurations built from them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::identity::role_of;
use crate::{IdentityError, Role, SERVER_NAME};

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS material could not be loaded.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file is missing or unreadable.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The certificate is not PEM or does not parse.
    #[error("{path}: not a PEM certificate: {reason}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The certificate names another identity than the one expected.
    #[error("{path} is for {found}, not {expected}")]
    WrongRole {
        /// The file.
        path: PathBuf,
        /// Its identity.
        found: Role,
        /// The one wanted.
        expected: Role,
    },
    /// The certificate's identity is unusable.
    #[error("{path}: {source}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// Why.
        source: IdentityError,
    },
    /// The certificate has expired (or is not valid yet).
    #[error("{path} is valid from {not_before} to {not_after} (now {now}): issue a new one with `muster tls issue`")]
    NotValidNow {
        /// The file.
        path: PathBuf,
        /// Start, as RFC 2822.
        not_before: String,
        /// End.
        not_after: String,
        /// Now.
        now: String,
    },
    /// The CLI could not tell which certificate to use.
    #[error("{0}")]
    Choose(String),
}

/// The CA a process trusts and its own certificate and key.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// Whose certificate this is.
    pub role: Role,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io { path: path.to_path_buf(), source })
}

/// The identities (`<kind>-<name>` stems) whose certificate and key are in `dir`.
pub fn cert_file_names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix("-key.pem").map(str::to_string))
        .filter(|stem| stem != "ca" && dir.join(format!("{stem}.pem")).exists())
        .collect();
    out.sort();
    out
}

impl TlsMaterial {
    /// Loads `role`'s certificate from `dir` (`ca.pem`, `<kind>-<name>.pem`,
    /// `<kind>-<name>-key.pem`), checking that the certificate names that
    /// role and is valid now.
    pub fn load(dir: &Path, role: &Role) -> Result<TlsMaterial, TlsError> {
        Self::load_stem(dir, &role.file_stem(), Some(role))
    }

    /// For a client: the certificate named `identity` (a stem such as
    /// `admin-alice`) or, without one, the only admin certificate in `dir`,
    /// else the only client one.
    pub fn load_for_client(dir: &Path, identity: Option<&str>) -> Result<TlsMaterial, TlsError> {
        let stems = cert_file_names(dir);
        let stem = match identity {
            Some(id) => id.to_string(),
            None => {
                let pick = |kind: &str| -> Vec<&String> {
                    stems.iter().filter(|s| s.starts_with(&format!("{kind}-"))).collect()
                };
                let admins = pick("admin");
                let clients = pick("client");
                let readers = pick("reader");
                match (admins.as_slice(), clients.as_slice(), readers.as_slice()) {
                    ([one], _, _) | ([], [one], _) | ([], [], [one]) => (*one).clone(),
                    _ => {
                        return Err(TlsError::Choose(format!(
                            "{} holds {}: choose one with --identity (or MUSTER_IDENTITY)",
                            dir.display(),
                            if stems.is_empty() { "no certificate".to_string() } else { stems.join(", ") }
                        )));
                    }
                }
            }
        };
        Self::load_stem(dir, &stem, None)
    }

    fn load_stem(dir: &Path, stem: &str, expected: Option<&Role>) -> Result<TlsMaterial, TlsError> {
        let ca_pem = read(&dir.join("ca.pem"))?;
        let cert_path = dir.join(format!("{stem}.pem"));
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&dir.join(format!("{stem}-key.pem")))?;
        Self::check(cert_path, ca_pem, cert_pem, key_pem, expected, true)
    }

    /// Material from PEM text as is: the role is read from the certificate,
    /// its validity period is not checked (tests build refused material
    /// with this; a server checks every certificate it is shown anyway).
    pub fn from_pems(ca_pem: String, cert_pem: String, key_pem: String) -> Result<TlsMaterial, TlsError> {
        Self::check(PathBuf::from("<pem>"), ca_pem, cert_pem, key_pem, None, false)
    }

    fn check(
        cert_path: PathBuf,
        ca_pem: String,
        cert_pem: String,
        key_pem: String,
        expected: Option<&Role>,
        check_time: bool,
    ) -> Result<TlsMaterial, TlsError> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| TlsError::BadPem { path: cert_path.clone(), reason: e.to_string() })?;
        let cert = pem.parse_x509().map_err(|e| TlsError::BadPem { path: cert_path.clone(), reason: e.to_string() })?;
        let role = role_of(&cert).map_err(|source| TlsError::Identity { path: cert_path.clone(), source })?;
        if let Some(expected) = expected
            && &role != expected
        {
            return Err(TlsError::WrongRole { path: cert_path, found: role, expected: expected.clone() });
        }
        if check_time && !cert.validity().is_valid() {
            let v = cert.validity();
            return Err(TlsError::NotValidNow {
                path: cert_path,
                not_before: v.not_before.to_string(),
                not_after: v.not_after.to_string(),
                now: time::OffsetDateTime::now_utc().to_string(),
            });
        }
        Ok(TlsMaterial { role, ca_pem, cert_pem, key_pem })
    }

    /// The server side: this certificate, client certificates required and
    /// verified against the CA, handshakes bounded by [`HANDSHAKE_TIMEOUT`].
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The client side: trusts only the CA, requires the server's
    /// certificate to carry [`SERVER_NAME`], presents this certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .domain_name(SERVER_NAME)
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// A client endpoint for another node's agent at `addr` (its checkpoint
/// service): `https` verifying [`crate::AGENT_NAME`], presenting this
/// (agent) certificate, or plain `http` without TLS.
pub fn agent_endpoint(
    addr: &str,
    tls: Option<&TlsMaterial>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}")),
        Some(m) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(m.client_config().domain_name(crate::AGENT_NAME)),
    }
}

/// A client endpoint for `addr` (`host:port`): `https` with `tls`'s client
/// configuration, or plain `http` without (insecure mode).
pub fn endpoint(addr: &str, tls: Option<&TlsMaterial>) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}")),
        Some(m) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?.tls_config(m.client_config()),
    }
}
