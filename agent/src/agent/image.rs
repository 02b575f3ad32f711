//! A task's image: pulled into the node's cache before the attempt starts
//! (beside its checkpoint restore), how it sees the node, and what the
//! attempt holds while it runs (docs/containers.md).

use super::*;

/// How the node runs container images (docs/containers.md).
#[derive(Clone)]
pub struct ImageRuntime {
    /// The node's image cache.
    pub cache: muster_registry::ImageCache,
    /// Host paths (and what is under them) a task's `--mount` may name.
    pub allow_mounts: Vec<PathBuf>,
}

impl std::fmt::Debug for ImageRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRuntime").field("allow_mounts", &self.allow_mounts).finish_non_exhaustive()
    }
}

/// How an attempt whose image could not be pulled reports its end (with
/// the registry's message after it).
pub const IMAGE_PULL_FAILED: &str = "image pull failed";

/// What the `muster.images` label says of a node that runs images itself.
pub const BUILTIN_RUNTIME: &str = "builtin";

/// What an attempt in a container holds until it ends: its image (kept
/// from eviction) and its directory (removed at its end).
pub(super) struct InContainer {
    pub(super) _image: Arc<muster_registry::PulledImage>,
    pub(super) dir: PathBuf,
}

/// Pulls `image` for attempt `key` through `cache`; a stop on `ctrl_rx`
/// meanwhile ends the pull. Returns the image (or why not), and whether the
/// attempt was stopped.
pub(super) async fn pull(
    cache: Option<&muster_registry::ImageCache>,
    image: &str,
    key: Key,
    ctrl_rx: &mut mpsc::UnboundedReceiver<Control>,
) -> (Result<Arc<muster_registry::PulledImage>, String>, bool) {
    let (cache, r) = match (cache, muster_core::sm::ImageRef::parse(image)) {
        (None, _) => return (Err("this node runs no container images".to_string()), false),
        (_, Err(e)) => return (Err(format!("image {image:?}: {e}")), false),
        (Some(cache), Ok(r)) => (cache, r),
    };
    let started = tokio::time::Instant::now();
    tokio::select! {
        got = cache.pull(&r) => {
            let got = got.map(Arc::new).map_err(|e| e.to_string());
            if let Ok(p) = &got {
                tracing::info!(
                    alloc_id = key.0, task = key.1, image = %r, digest = %p.digest, cache_hit = p.cache_hit,
                    bytes = p.downloaded, seconds = started.elapsed().as_secs_f64(), "image ready"
                );
            }
            (got, false)
        }
        _ = ctrl_rx.recv() => (Err("stopped while its image was being pulled".to_string()), true),
    }
}

impl Agent {
    /// How a task's image sees the node: its layers and configuration, and
    /// its mounts, each of which must lie under a path the operator allows
    /// (`--allow-mount`).
    pub(super) fn container_launch(
        &self,
        img: &muster_registry::PulledImage,
        mounts: &[String],
        workdir: &str,
    ) -> Result<executor::ContainerLaunch, String> {
        let allowed = self.cfg.images.as_ref().map(|i| i.allow_mounts.as_slice()).unwrap_or_default();
        let mut binds = Vec::new();
        for m in mounts {
            let m = muster_core::sm::Mount::parse(m).map_err(|e| format!("mount {m:?}: {e}"))?;
            // Where it really is: a symlink under an allowed path must not
            // lead out of it.
            let source =
                std::fs::canonicalize(&m.source).map_err(|e| format!("mount {}: {e} on this node", m.source))?;
            if !allowed.iter().any(|a| source.starts_with(a)) {
                return Err(format!(
                    "mount {}: this node allows mounts only under {}",
                    m.source,
                    if allowed.is_empty() {
                        "nothing (muster agent --allow-mount)".to_string()
                    } else {
                        allowed.iter().map(|a| a.display().to_string()).collect::<Vec<_>>().join(", ")
                    }
                ));
            }
            binds.push(crate::container::Bind { source, target: PathBuf::from(&m.target), read_only: m.read_only });
        }
        Ok(executor::ContainerLaunch {
            layers: img.layer_dirs.clone(),
            config: img.config.clone(),
            binds,
            workdir: Some(workdir.to_string()).filter(|w| !w.is_empty()),
        })
    }
}
