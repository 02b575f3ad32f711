//! A small certificate authority for development and small clusters
//! (`muster tls init`, `muster tls issue`). Production can bring its own CA:
//! only the file names and the SAN URIs matter.
//!
//! A TLS dir holds `ca.pem` (the CA certificate, shared by everyone),
//! `ca-key.pem` (the CA key: keep it where certificates are issued, not on
//! nodes) and, per role, `<kind>-<name>.pem` + `<kind>-<name>-key.pem`.
//! Keys are ECDSA P-256, written mode 0600, atomically.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use thiserror::Error;
use time::{Duration, OffsetDateTime};

use crate::{Role, SERVER_NAME};

/// Why a CA or certificate could not be made.
#[derive(Debug, Error)]
pub enum CaError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `init` would overwrite an existing CA.
    #[error("{0} already exists: a cluster keeps its CA (remove it yourself to start over)")]
    CaExists(PathBuf),
    /// `issue` found no CA.
    #[error("no CA in {0}: run `muster tls init --dir {0}` first")]
    NoCa(PathBuf),
    /// rcgen refused.
    #[error("cannot make the certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A SAN that is neither a DNS name nor an IP address.
    #[error("extra name {0:?} is not a DNS name or an IP address")]
    BadName(String),
}

/// When a certificate is valid.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// Not before.
    pub not_before: OffsetDateTime,
    /// Not after.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (clock skew) for `days` days.
    pub fn days(days: i64) -> Validity {
        Validity::seconds(days.saturating_mul(86_400))
    }

    /// From an hour ago (clock skew) for `seconds` seconds.
    pub fn seconds(seconds: i64) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity { not_before: now - Duration::hours(1), not_after: now + Duration::seconds(seconds) }
    }
}

fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<(), CaError> {
    let err = |source| CaError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    {
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if secret {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(err)?;
        f.write_all(bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
    }
    fs::rename(&tmp, path).map_err(err)
}

fn read(path: &Path) -> Result<String, CaError> {
    fs::read_to_string(path).map_err(|source| CaError::Io { path: path.to_path_buf(), source })
}

/// Creates a CA in `dir` (`ca.pem`, `ca-key.pem`); refuses to overwrite one.
pub fn init_ca(dir: &Path, name: &str, validity: Validity) -> Result<PathBuf, CaError> {
    fs::create_dir_all(dir).map_err(|source| CaError::Io { path: dir.to_path_buf(), source })?;
    let cert_path = dir.join("ca.pem");
    if cert_path.exists() || dir.join("ca-key.pem").exists() {
        return Err(CaError::CaExists(cert_path));
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("muster CA {name}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    write_file(&dir.join("ca-key.pem"), key.serialize_pem().as_bytes(), true)?;
    write_file(&cert_path, cert.pem().as_bytes(), false)?;
    Ok(cert_path)
}

/// Issues `role` a certificate signed by the CA in `dir`, valid for
/// `validity`, with `extra` DNS names or IP addresses; writes
/// `<kind>-<name>.pem` and `<kind>-<name>-key.pem` (replacing an older pair:
/// that is how a certificate is rotated). Returns the certificate's path.
pub fn issue(dir: &Path, role: &Role, validity: Validity, extra: &[String]) -> Result<PathBuf, CaError> {
    let ca_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca-key.pem");
    if !ca_path.exists() || !ca_key_path.exists() {
        return Err(CaError::NoCa(dir.to_path_buf()));
    }
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?)?;
    let issuer = Issuer::from_ca_cert_pem(&read(&ca_path)?, ca_key)?;

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, role.file_stem());
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::URI(role.uri().try_into()?)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if matches!(role, Role::Server(_)) {
        params.subject_alt_names.push(SanType::DnsName(SERVER_NAME.try_into()?));
        params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    if matches!(role, Role::Agent(_)) {
        // Agents serve the checkpoints on their disks to each other.
        params.subject_alt_names.push(SanType::DnsName(crate::AGENT_NAME.try_into()?));
        params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    for name in extra {
        let san = match name.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                let dns_like = !name.is_empty()
                    && name.len() <= 253
                    && name
                        .split('.')
                        .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                if !dns_like {
                    return Err(CaError::BadName(name.clone()));
                }
                SanType::DnsName(name.clone().try_into().map_err(|_| CaError::BadName(name.clone()))?)
            }
        };
        params.subject_alt_names.push(san);
    }
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let stem = role.file_stem();
    write_file(&dir.join(format!("{stem}-key.pem")), key.serialize_pem().as_bytes(), true)?;
    let path = dir.join(format!("{stem}.pem"));
    write_file(&path, cert.pem().as_bytes(), false)?;
    Ok(path)
}
