//! The flags with which `muster agent` and `muster dev` run container
//! images (docs/containers.md).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

/// How a node runs container images.
#[derive(Args, Clone, Debug, Default)]
pub struct ImageArgs {
    /// Run no container images (the node is not labelled muster.images, so
    /// no task with --image is placed on it).
    #[arg(long)]
    pub no_images: bool,
    /// Registry credentials: a docker-style config.json ({"auths": {REGISTRY:
    /// {"auth": base64(user:password)}}}).
    #[arg(long, value_name = "FILE")]
    pub registry_auth: Option<PathBuf>,
    /// CA certificates (PEM) to trust for registries, besides the system's.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// A host path whose contents a task's --mount may name (repeatable;
    /// none by default).
    #[arg(long = "allow-mount", value_name = "PATH")]
    pub allow_mounts: Vec<PathBuf>,
    /// The most the image cache holds (unpacked layers) beyond what running
    /// tasks use, e.g. 50G; the least recently used images go first.
    /// Default: --work-dir-max where given, else 20G.
    #[arg(long, value_name = "SIZE")]
    pub image_cache_max: Option<String>,
    /// Keep setuid and setgid files in image layers (refused by default).
    #[arg(long)]
    pub allow_setuid_images: bool,
    /// Who runs the containers: `builtin` (the agent's own runtime, the
    /// default), or an installed OCI runtime handed each task's image as a
    /// bundle: `runc` (found on PATH) or its path (docs/containers.md).
    #[arg(long, value_name = "RUNTIME", default_value = "builtin")]
    pub container_runtime: String,
}

impl ImageArgs {
    /// The registry configuration the flags give.
    pub fn registry(&self) -> anyhow::Result<muster_registry::RegistryConfig> {
        let mut cfg = muster_registry::RegistryConfig::default();
        if let Some(path) = &self.registry_auth {
            cfg.auth = muster_registry::DockerAuth::load(path).map_err(|e| anyhow::anyhow!("--registry-auth {e}"))?;
        }
        if let Some(path) = &self.registry_ca {
            cfg = cfg.with_ca_file(path).map_err(|e| anyhow::anyhow!("--registry-ca {e}"))?;
        }
        Ok(cfg)
    }

    /// The cache limit, bytes (`work_dir_max`: the agent's work-dir cap).
    pub fn cache_max(&self, work_dir_max: Option<u64>) -> anyhow::Result<u64> {
        match &self.image_cache_max {
            Some(s) => muster_agent::janitor::parse_size(s).map_err(|e| anyhow::anyhow!("--image-cache-max {e}")),
            None => Ok(work_dir_max.unwrap_or(20 << 30)),
        }
    }

    /// Checks each allowed mount path exists and is absolute.
    pub fn allow_mounts(&self) -> anyhow::Result<Vec<PathBuf>> {
        self.allow_mounts
            .iter()
            .map(|p| {
                anyhow::ensure!(p.is_absolute(), "--allow-mount {}: an absolute path", p.display());
                std::fs::canonicalize(p).with_context(|| format!("--allow-mount {}", p.display()))
            })
            .collect()
    }

    /// The installed OCI runtime `--container-runtime` names (`None`:
    /// the built-in one). Only runc's command line is spoken; the program
    /// must exist and be executable.
    pub fn oci_runtime(&self) -> anyhow::Result<Option<PathBuf>> {
        let given = self.container_runtime.trim();
        if given == muster_agent::agent::BUILTIN_RUNTIME {
            return Ok(None);
        }
        let path = PathBuf::from(given);
        if path.file_name().and_then(|n| n.to_str()) != Some("runc") {
            anyhow::bail!("--container-runtime {given:?}: builtin, runc, or the path of a runc binary");
        }
        match muster_agent::executor::find_on_path(given) {
            Ok(found) => Ok(Some(found)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                anyhow::bail!("--container-runtime {given}: not found (install runc, or give its path)")
            }
            Err(_) => anyhow::bail!("--container-runtime {given}: not an executable file"),
        }
    }

    /// The unpacker's policy.
    pub fn policy(&self) -> muster_registry::UnpackPolicy {
        muster_registry::UnpackPolicy { allow_setuid: self.allow_setuid_images, ..Default::default() }
    }
}
