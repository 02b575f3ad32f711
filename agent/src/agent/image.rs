//! A task's image: pulled into the node's cache before the attempt starts
//! (beside its checkpoint restore), how it sees the node, and what the
//! attempt holds while it runs (docs/containers.md).

use muster_proto::bounds;

use super::*;

/// How the node runs container images (docs/containers.md).
#[derive(Clone)]
pub struct ImageRuntime {
    /// The node's image cache.
    pub cache: muster_registry::ImageCache,
    /// Host paths (and what is under them) a task's `--mount` may name.
    pub allow_mounts: Vec<PathBuf>,
    /// The installed OCI runtime images are handed to (`runc`; `None`: the
    /// built-in runtime).
    pub oci: Option<PathBuf>,
    /// The node's `nvidia-container-cli` ([`crate::nvidia::find`]), if any.
    pub nvidia: Option<PathBuf>,
}

impl std::fmt::Debug for ImageRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRuntime")
            .field("allow_mounts", &self.allow_mounts)
            .field("oci", &self.oci)
            .field("nvidia", &self.nvidia)
            .finish_non_exhaustive()
    }
}

/// How an attempt whose image could not be pulled reports its end (with
/// the registry's message after it).
pub const IMAGE_PULL_FAILED: &str = "image pull failed";

/// What the `muster.images` label says of a node that runs images itself.
pub const BUILTIN_RUNTIME: &str = "builtin";

/// What the `muster.images` label says of a node that hands images to an
/// installed OCI runtime: the runtime's name (`runc`).
pub fn runtime_label(images: &ImageRuntime) -> String {
    images
        .oci
        .as_ref()
        .and_then(|p| p.file_name())
        .map_or_else(|| BUILTIN_RUNTIME.to_string(), |n| n.to_string_lossy().into_owned())
}

/// What an attempt in a container holds until it ends: its image (kept
/// from eviction) and its directory (removed at its end).
pub(super) struct InContainer {
    /// `None` for an adopted attempt whose image the cache no longer held.
    pub(super) _image: Option<Arc<muster_registry::PulledImage>>,
    pub(super) dir: PathBuf,
}

/// Most prefetches (`muster image prefetch`) an agent runs or queues at
/// once; more are dropped (and logged).
pub const MAX_PREFETCHES: usize = 4;

/// One attempt's image being pulled, for the heartbeat (and so explain).
pub(super) struct Pulling {
    image: String,
    progress: Arc<muster_registry::PullProgress>,
    started: tokio::time::Instant,
}

/// The attempts whose image is being pulled now, by attempt.
#[derive(Clone, Default)]
pub(super) struct Pulls(Arc<std::sync::Mutex<BTreeMap<Key, Pulling>>>);

impl Pulls {
    /// What the heartbeat says of them.
    pub(super) fn report(&self) -> Vec<v1::ImagePull> {
        let pulls = self.0.lock().expect("pulls lock");
        pulls
            .iter()
            .map(|(key, p)| v1::ImagePull {
                task: Some(task_ref(*key)),
                image: bounds::truncate(&p.image, bounds::IMAGE_REF),
                done_bytes: p.progress.done(),
                total_bytes: p.progress.total(),
                elapsed_ms: u64::try_from(p.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            })
            .collect()
    }
}

/// Takes an attempt off [`Pulls`] when its pull ends, however it ends.
struct PullingGuard(Pulls, Key);

impl Drop for PullingGuard {
    fn drop(&mut self) {
        self.0.0.lock().expect("pulls lock").remove(&self.1);
    }
}

/// Pulls `image` for attempt `key` through `cache`, listed in `pulls`
/// meanwhile; a stop on `ctrl_rx` ends the pull. Returns the image (or why
/// not), and whether the attempt was stopped.
pub(super) async fn pull(
    cache: Option<&muster_registry::ImageCache>,
    pulls: &Pulls,
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
    let progress = Arc::new(muster_registry::PullProgress::default());
    pulls
        .0
        .lock()
        .expect("pulls lock")
        .insert(key, Pulling { image: image.to_string(), progress: progress.clone(), started });
    let _listed = PullingGuard(pulls.clone(), key);
    tokio::select! {
        got = cache.pull_tracked(&r, &progress) => {
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

/// Pulls `image` into the node's cache for no task (`muster image
/// prefetch`), unless [`MAX_PREFETCHES`] are under way already.
pub(super) fn prefetch(
    cache: &muster_registry::ImageCache,
    under_way: &Arc<std::sync::atomic::AtomicUsize>,
    image: &str,
) {
    use std::sync::atomic::Ordering;
    let r = match muster_core::sm::ImageRef::parse(image) {
        Ok(r) if r.digest.is_some() => r,
        Ok(_) => return tracing::warn!(image, "prefetch refused: the leader sends references pinned to a digest"),
        Err(e) => return tracing::warn!(image, error = %e, "prefetch refused"),
    };
    if under_way.fetch_add(1, Ordering::SeqCst) >= MAX_PREFETCHES {
        under_way.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!(image, max = MAX_PREFETCHES, "prefetch dropped: too many under way");
        return;
    }
    let (cache, under_way) = (cache.clone(), under_way.clone());
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        match cache.pull(&r).await {
            Ok(p) => tracing::info!(
                image = %r, digest = %p.digest, cache_hit = p.cache_hit, bytes = p.downloaded,
                seconds = started.elapsed().as_secs_f64(), "image prefetched"
            ),
            Err(e) => tracing::warn!(image = %r, error = %e, "prefetch failed"),
        }
        under_way.fetch_sub(1, Ordering::SeqCst);
    });
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
            runtime: self.cfg.images.as_ref().and_then(|i| i.oci.clone()),
            nvidia: self.cfg.images.as_ref().and_then(|i| i.nvidia.clone()),
        })
    }
}
