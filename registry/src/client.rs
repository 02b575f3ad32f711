//! A registry client on `oci-client`: credentials from a docker-style
//! `config.json`, TLS verified against the system's roots plus a CA bundle
//! the operator gives, and, as Docker does by default, plain HTTP for a
//! registry on 127.0.0.0/8 or `localhost` that does not speak TLS.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use muster_core::sm::{DEFAULT_REGISTRY, ImageRef};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};

/// The largest `config.json` or CA bundle read, in bytes.
pub const MAX_AUTH_FILE_BYTES: u64 = 1 << 20;

/// Why a pull failed: each kind names the registry's own message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The image, its manifest or a layer is not in the registry.
    #[error("not found: {0}")]
    NotFound(String),
    /// The registry refused the credentials (or there were none).
    #[error("not authorised: {0}")]
    Unauthorized(String),
    /// The registry could not be reached, or TLS failed.
    #[error("registry unreachable: {0}")]
    Unreachable(String),
    /// The image's bytes are not what they claim, or a layer is refused.
    #[error("bad image: {0}")]
    BadImage(String),
    /// The node's disk is full or cannot be written.
    #[error("disk: {0}")]
    Disk(String),
}

impl PullError {
    fn from_oci(e: OciDistributionError) -> PullError {
        use OciDistributionError as E;
        match e {
            E::ImageManifestNotFoundError(m) => PullError::NotFound(m),
            E::AuthenticationFailure(m) => PullError::Unauthorized(m),
            E::UnauthorizedError { url } => PullError::Unauthorized(format!("the registry refused access to {url}")),
            E::RegistryError { envelope, url } => {
                use oci_client::errors::OciErrorCode as C;
                let text = envelope.errors.iter().map(|e| format!("{:?}: {}", e.code, e.message)).collect::<Vec<_>>();
                let text = format!("{url}: {}", text.join("; "));
                match envelope.errors.first().map(|e| &e.code) {
                    Some(
                        C::ManifestUnknown | C::BlobUnknown | C::NameUnknown | C::NotFound | C::ManifestBlobUnknown,
                    ) => PullError::NotFound(text),
                    Some(C::Unauthorized | C::Denied) => PullError::Unauthorized(text),
                    _ => PullError::BadImage(text),
                }
            }
            E::ServerError { code: 404, url, message } => PullError::NotFound(format!("{url}: {message}")),
            E::ServerError { code: code @ (401 | 403), url, message } => {
                PullError::Unauthorized(format!("{url}: {code} {message}"))
            }
            E::RequestError(r) => {
                if r.status().is_some_and(|s| s.as_u16() == 404) {
                    PullError::NotFound(r.to_string())
                } else if r.status().is_some_and(|s| s.as_u16() == 401 || s.as_u16() == 403) {
                    PullError::Unauthorized(r.to_string())
                } else {
                    PullError::Unreachable(error_chain(&r))
                }
            }
            E::DigestError(d) => PullError::BadImage(d.to_string()),
            E::IoError(io) => PullError::Unreachable(io.to_string()),
            other => PullError::BadImage(other.to_string()),
        }
    }

    /// Whether to try plain HTTP on a loopback registry after this.
    fn is_transport(&self) -> bool {
        matches!(self, PullError::Unreachable(_))
    }
}

/// An error and its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut at = e.source();
    while let Some(cause) = at {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        at = cause.source();
    }
    s
}

/// Credentials per registry, as `docker login` writes them.
#[derive(Clone, Debug, Default)]
pub struct DockerAuth {
    by_registry: BTreeMap<String, (String, String)>,
}

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl DockerAuth {
    /// Parses a docker `config.json`: `{"auths": {"REGISTRY": {"auth":
    /// base64("user:password")}}}` (or `username` and `password`). Keys may
    /// be URLs (`https://index.docker.io/v1/` is Docker Hub).
    pub fn parse(json: &str) -> Result<DockerAuth, String> {
        let file: AuthFile = serde_json::from_str(json).map_err(|e| format!("not a docker config.json: {e}"))?;
        let mut by_registry = BTreeMap::new();
        for (key, entry) in file.auths {
            let host = registry_of_key(&key);
            let pair = match (entry.auth, entry.username, entry.password) {
                (Some(a), _, _) if !a.is_empty() => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(a.trim())
                        .map_err(|_| format!("auths.{key}.auth is not base64"))?;
                    let text = String::from_utf8(raw).map_err(|_| format!("auths.{key}.auth is not UTF-8"))?;
                    let (u, p) =
                        text.split_once(':').ok_or_else(|| format!("auths.{key}.auth is not user:password"))?;
                    (u.to_string(), p.to_string())
                }
                (_, Some(u), Some(p)) => (u, p),
                _ => continue, // a credential helper's entry: nothing here to use
            };
            by_registry.insert(host, pair);
        }
        Ok(DockerAuth { by_registry })
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<DockerAuth, String> {
        DockerAuth::parse(&read_small(path)?).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The registries it has credentials for.
    pub fn registries(&self) -> impl Iterator<Item = &str> {
        self.by_registry.keys().map(String::as_str)
    }

    fn for_registry(&self, registry: &str) -> RegistryAuth {
        match self.by_registry.get(registry) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// `https://index.docker.io/v1/` → `docker.io`; `127.0.0.1:5000` stays.
fn registry_of_key(key: &str) -> String {
    let host = key.trim_start_matches("https://").trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => DEFAULT_REGISTRY.to_string(),
        h => h.to_string(),
    }
}

fn read_small(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > MAX_AUTH_FILE_BYTES {
        return Err(format!("{}: {} bytes; at most {MAX_AUTH_FILE_BYTES}", path.display(), meta.len()));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// Credentials.
    pub auth: DockerAuth,
    /// Extra trusted CA certificates (PEM), besides the system's.
    pub ca_pem: Option<Vec<u8>>,
    /// How long a connection attempt may take.
    pub connect_timeout: Option<Duration>,
}

impl RegistryConfig {
    /// Reads a PEM CA bundle to trust besides the system's roots.
    pub fn with_ca_file(mut self, path: &Path) -> Result<RegistryConfig, String> {
        let pem = read_small(path)?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!("{}: no PEM certificate in it", path.display()));
        }
        self.ca_pem = Some(pem.into_bytes());
        Ok(self)
    }
}

/// An image's configuration: what `docker run` honours.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `ENV`, as `KEY=VALUE`.
    pub env: Vec<String>,
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `WORKDIR` (empty: none).
    pub working_dir: String,
    /// `USER` (empty: none).
    pub user: String,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<ConfigInner>,
}

#[derive(Deserialize)]
struct ConfigInner {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
}

impl ImageConfig {
    /// Parses an image configuration blob (the OCI image config JSON).
    pub fn parse(json: &str) -> Result<ImageConfig, PullError> {
        let f: ConfigFile =
            serde_json::from_str(json).map_err(|e| PullError::BadImage(format!("its config is not valid: {e}")))?;
        let c =
            f.config.unwrap_or(ConfigInner { env: None, entrypoint: None, cmd: None, working_dir: None, user: None });
        Ok(ImageConfig {
            env: c.env.unwrap_or_default(),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            working_dir: c.working_dir.unwrap_or_default(),
            user: c.user.unwrap_or_default(),
        })
    }
}

/// A manifest, its digest and its image's configuration.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The manifest.
    pub manifest: OciImageManifest,
    /// Its digest (`sha256:…`).
    pub digest: String,
    /// The image's configuration.
    pub config: ImageConfig,
}

/// A client for every registry a node pulls from.
#[derive(Clone)]
pub struct Registry {
    https: Client,
    http: Client,
    auth: DockerAuth,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("registries_with_credentials", &self.auth.registries().count()).finish()
    }
}

/// Whether `registry` (host[:port]) is on the loopback: it may speak plain
/// HTTP, as Docker allows by default.
pub fn is_loopback(registry: &str) -> bool {
    let host = registry
        .rsplit_once(':')
        .map_or(registry, |(h, p)| if p.bytes().all(|b| b.is_ascii_digit()) { h } else { registry });
    host == "localhost" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

impl Registry {
    /// A client with `cfg`'s credentials and trust, or why it cannot be
    /// built (a CA bundle that does not parse).
    pub fn new(cfg: &RegistryConfig) -> Result<Registry, String> {
        let make = |protocol: ClientProtocol| {
            let mut c = ClientConfig {
                protocol,
                connect_timeout: cfg.connect_timeout.or(Some(Duration::from_secs(10))),
                read_timeout: Some(Duration::from_secs(60)),
                platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
                max_concurrent_download: 8,
                ..ClientConfig::default()
            };
            if let Some(pem) = &cfg.ca_pem {
                c.extra_root_certificates.push(Certificate { encoding: CertificateEncoding::Pem, data: pem.clone() });
            }
            // Not Client::new: it would fall back to a default client,
            // silently dropping the CA, on a configuration it cannot build.
            Client::try_from(c).map_err(|e| format!("cannot build a registry client: {e}"))
        };
        Ok(Registry { https: make(ClientProtocol::Https)?, http: make(ClientProtocol::Http)?, auth: cfg.auth.clone() })
    }

    fn reference(r: &ImageRef) -> Reference {
        match (&r.tag, &r.digest) {
            (_, Some(d)) => Reference::with_digest(r.registry.clone(), r.repository.clone(), d.clone()),
            (Some(t), None) => Reference::with_tag(r.registry.clone(), r.repository.clone(), t.clone()),
            (None, None) => Reference::with_tag(r.registry.clone(), r.repository.clone(), "latest".into()),
        }
    }

    /// Runs `f` over HTTPS, then, for a loopback registry that could not
    /// be reached that way, over plain HTTP.
    async fn call<T, F, Fut>(&self, r: &ImageRef, f: F) -> Result<T, PullError>
    where
        F: Fn(Client, Reference, RegistryAuth) -> Fut,
        Fut: std::future::Future<Output = Result<T, OciDistributionError>>,
    {
        let reference = Registry::reference(r);
        let auth = self.auth.for_registry(&r.registry);
        match f(self.https.clone(), reference.clone(), auth.clone()).await.map_err(PullError::from_oci) {
            Err(e) if e.is_transport() && is_loopback(&r.registry) => {
                // A registry that speaks neither keeps the HTTPS error.
                f(self.http.clone(), reference, auth).await.map_err(PullError::from_oci).map_err(|plain| match plain {
                    PullError::NotFound(_) | PullError::Unauthorized(_) => plain,
                    other => PullError::Unreachable(format!("{e}; over plain HTTP: {other}")),
                })
            }
            other => other,
        }
    }

    /// The manifest digest `r` names now (a tag resolved; a digest as is).
    pub async fn resolve(&self, r: &ImageRef) -> Result<String, PullError> {
        if let Some(d) = &r.digest {
            return Ok(d.clone());
        }
        self.call(r, |c, reference, auth| async move { c.fetch_manifest_digest(&reference, &auth).await }).await
    }

    /// The image's manifest (for linux/amd64 when `r` names an index), its
    /// digest and its configuration.
    pub async fn manifest(&self, r: &ImageRef) -> Result<Manifest, PullError> {
        let (manifest, digest, config) = self
            .call(r, |c, reference, auth| async move { c.pull_manifest_and_config(&reference, &auth).await })
            .await?;
        Ok(Manifest { manifest, digest, config: ImageConfig::parse(&config)? })
    }

    /// A stream of `layer`'s bytes, checked against its digest as it ends.
    pub async fn layer_stream(
        &self,
        r: &ImageRef,
        layer: &OciDescriptor,
    ) -> Result<oci_client::client::SizedStream, PullError> {
        self.call(r, |c, reference, _auth| {
            let layer = layer.clone();
            async move { c.pull_blob_stream(&reference, &layer).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_json_gives_credentials_per_registry() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("muster:secret");
        let json = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{b64}"}},
                "https://index.docker.io/v1/": {{"username": "u", "password": "p"}},
                "ghcr.io": {{}}}}, "credsStore": "desktop"}}"#
        );
        let a = DockerAuth::parse(&json).unwrap();
        assert_eq!(a.registries().collect::<Vec<_>>(), ["127.0.0.1:5000", "docker.io"]);
        assert_eq!(a.for_registry("127.0.0.1:5000"), RegistryAuth::Basic("muster".into(), "secret".into()));
        assert_eq!(a.for_registry("docker.io"), RegistryAuth::Basic("u".into(), "p".into()));
        assert_eq!(a.for_registry("quay.io"), RegistryAuth::Anonymous);
        for (bad, needle) in [
            ("[", "not a docker config.json"),
            (r#"{"auths": {"r": {"auth": "%%%"}}}"#, "auths.r.auth is not base64"),
            (r#"{"auths": {"r": {"auth": "bm9jb2xvbg=="}}}"#, "is not user:password"),
        ] {
            let e = DockerAuth::parse(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn only_loopback_registries_may_speak_plain_http() {
        for (r, loopback) in [
            ("127.0.0.1:5000", true),
            ("127.9.9.9", true),
            ("localhost:5000", true),
            ("10.0.0.1:5000", false),
            ("registry.example:5000", false),
            ("docker.io", false),
        ] {
            assert_eq!(is_loopback(r), loopback, "{r}");
        }
    }

    #[test]
    fn an_image_config_gives_what_docker_run_honours() {
        let c = ImageConfig::parse(
            r#"{"architecture":"amd64","config":{"Env":["PATH=/bin","A=1"],"Entrypoint":["/bin/sh","-c"],
                "Cmd":["echo hi"],"WorkingDir":"/work","User":"1000:1000"},"rootfs":{"type":"layers","diff_ids":[]}}"#,
        )
        .unwrap();
        assert_eq!(c.env, ["PATH=/bin", "A=1"]);
        assert_eq!((c.entrypoint.len(), c.cmd[0].as_str(), c.working_dir.as_str()), (2, "echo hi", "/work"));
        assert_eq!(ImageConfig::parse(r#"{"architecture":"amd64"}"#).unwrap(), ImageConfig::default());
        assert!(matches!(ImageConfig::parse("nope"), Err(PullError::BadImage(_))));
    }
}
