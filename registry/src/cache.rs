//! The node's image cache: layers by digest, shared by every job on the
//! node, each unpacked once.
//!
//! ```text
//!   ROOT/layers/sha256/HEX/   one unpacked layer (an overlay lower dir)
//!   ROOT/tmp/                 layers being unpacked (moved in whole, or dropped)
//!   ROOT/index.json           images (manifest digest → layers, config, last use)
//!                             and each layer's unpacked size
//! ```
//!
//! - A pull of an image pinned by digest that the cache holds never asks
//!   the registry. A tag is resolved first (one HEAD request).
//! - Layers download in parallel, each streamed through its digest check
//!   and the decompressor into the unpacker as it arrives; concurrent pulls
//!   of one layer wait for the first.
//! - When the cache holds more than its limit, the least recently used
//!   images not in use (pinned by a running task) go, with the layers no
//!   other image shares.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::StreamExt as _;
use muster_core::sm::ImageRef;
use oci_client::manifest::OciDescriptor;
use serde::{Deserialize, Serialize};

use crate::client::{ImageConfig, PullError, Registry};
use crate::unpack::{UnpackError, UnpackPolicy, unpack};

/// One cached image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedImage {
    /// The reference it was last pulled as.
    pub reference: String,
    /// Its layers' digests, lowest first.
    pub layers: Vec<String>,
    /// Its configuration.
    pub config: ImageConfig,
    /// When it was last used (the cache's own counter: higher is later; on
    /// disk as of the last change to the cache's contents).
    pub last_used: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    /// Images by manifest digest.
    images: BTreeMap<String, CachedImage>,
    /// Each cached layer's unpacked size, by digest.
    layers: BTreeMap<String, u64>,
    /// The use counter.
    clock: u64,
}

/// An image ready to run: its layer directories and configuration. Holding
/// it keeps the image from eviction.
#[derive(Debug)]
pub struct PulledImage {
    /// The manifest digest (what every task of the allocation runs).
    pub digest: String,
    /// The unpacked layers, lowest first.
    pub layer_dirs: Vec<PathBuf>,
    /// The image's configuration.
    pub config: ImageConfig,
    /// Whether the cache held it already.
    pub cache_hit: bool,
    /// Bytes downloaded for it (0 on a hit).
    pub downloaded: u64,
    _pin: Pin,
}

/// How far a pull is: bytes of its layers in the cache (downloaded now,
/// or already there) out of all its layers' bytes, as the registry sends
/// them (0 until the manifest is read).
#[derive(Debug, Default)]
pub struct PullProgress {
    done: AtomicU64,
    total: AtomicU64,
}

impl PullProgress {
    /// Bytes so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Bytes in all (0: not known yet).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Pin {
    inner: Arc<Inner>,
    digest: String,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = self.inner.pins.lock().expect("pins lock");
        if let Some(n) = pins.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.digest);
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    max_bytes: u64,
    policy: UnpackPolicy,
    index: Mutex<Index>,
    pins: Mutex<BTreeMap<String, usize>>,
    /// One lock per layer being fetched: a second pull of it waits.
    fetching: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The node's image cache.
#[derive(Clone)]
pub struct ImageCache {
    inner: Arc<Inner>,
    registry: Arc<Registry>,
}

fn disk(what: &str, e: io::Error) -> PullError {
    PullError::Disk(format!("{what}: {e}"))
}

/// The directory name of digest `d` (`sha256:HEX` → `sha256/HEX`).
fn digest_path(d: &str) -> Result<PathBuf, PullError> {
    muster_core::sm::check_digest(d).map_err(PullError::BadImage)?;
    let (alg, hex) = d.split_once(':').expect("checked");
    Ok(Path::new(alg).join(hex))
}

impl ImageCache {
    /// Opens (or makes) the cache at `root`, holding at most `max_bytes` of
    /// unpacked layers beyond what running tasks use. Layers left half-way
    /// and layers no image names are removed.
    pub fn open(root: &Path, max_bytes: u64, policy: UnpackPolicy, registry: Registry) -> io::Result<ImageCache> {
        std::fs::create_dir_all(root.join("layers"))?;
        let tmp = root.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let index: Index = match std::fs::read(root.join("index.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the image cache's index is unreadable: starting empty");
                Index::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Index::default(),
            Err(e) => return Err(e),
        };
        let cache = ImageCache {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                max_bytes,
                policy,
                index: Mutex::new(index),
                pins: Mutex::new(BTreeMap::new()),
                fetching: Mutex::new(BTreeMap::new()),
            }),
            registry: Arc::new(registry),
        };
        cache.sweep()?;
        Ok(cache)
    }

    /// The registry client it pulls with.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn layer_dir(&self, digest: &str) -> Result<PathBuf, PullError> {
        Ok(self.inner.root.join("layers").join(digest_path(digest)?))
    }

    /// Drops layers on disk that the index does not know (a crash between
    /// unpacking and recording), and index entries whose layers are gone.
    fn sweep(&self) -> io::Result<()> {
        let mut index = self.inner.index.lock().expect("index lock");
        let known: BTreeSet<PathBuf> =
            index.layers.keys().filter_map(|d| self.layer_dir(d).ok()).collect::<BTreeSet<_>>();
        for alg in std::fs::read_dir(self.inner.root.join("layers"))? {
            let alg = alg?.path();
            for layer in std::fs::read_dir(&alg)? {
                let layer = layer?.path();
                if !known.contains(&layer) {
                    std::fs::remove_dir_all(&layer)?;
                }
            }
        }
        let present: BTreeSet<String> =
            index.layers.keys().filter(|d| self.layer_dir(d).is_ok_and(|p| p.is_dir())).cloned().collect();
        index.layers.retain(|d, _| present.contains(d));
        index.images.retain(|_, img| img.layers.iter().all(|l| present.contains(l)));
        self.save(&index)
    }

    fn save(&self, index: &Index) -> io::Result<()> {
        let tmp = self.inner.root.join("index.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(index).map_err(io::Error::other)?)?;
        std::fs::rename(&tmp, self.inner.root.join("index.json"))
    }

    /// Bytes of unpacked layers it holds.
    pub fn bytes(&self) -> u64 {
        self.inner.index.lock().expect("index lock").layers.values().sum()
    }

    /// The manifest digests of the images it holds whole (every layer
    /// unpacked), most recently used first, at most `max`: what the node
    /// reports to the leader.
    pub fn held(&self, max: usize) -> Vec<String> {
        let index = self.inner.index.lock().expect("index lock");
        let mut v: Vec<(&String, u64)> = index
            .images
            .iter()
            .filter(|(_, i)| i.layers.iter().all(|l| index.layers.contains_key(l)))
            .map(|(d, i)| (d, i.last_used))
            .collect();
        v.sort_by_key(|&(d, t)| (std::cmp::Reverse(t), d.clone()));
        v.into_iter().take(max).map(|(d, _)| d.clone()).collect()
    }

    /// The manifest digests of the images it holds, most recently used first.
    pub fn images(&self) -> Vec<String> {
        let index = self.inner.index.lock().expect("index lock");
        let mut v: Vec<(&String, u64)> = index.images.iter().map(|(d, i)| (d, i.last_used)).collect();
        v.sort_by_key(|&(d, t)| (std::cmp::Reverse(t), d.clone()));
        v.into_iter().map(|(d, _)| d.clone()).collect()
    }

    fn pin(&self, digest: &str) -> Pin {
        *self.inner.pins.lock().expect("pins lock").entry(digest.to_string()).or_default() += 1;
        Pin { inner: self.inner.clone(), digest: digest.to_string() }
    }

    /// The cached image `digest` names, pinned and marked used, if the
    /// cache holds every layer of it (never asking a registry): what a
    /// task adopted after an agent restart keeps from eviction.
    pub fn cached(&self, digest: &str) -> Option<PulledImage> {
        self.hit(digest)
    }

    /// The cached image `digest` names, pinned and marked used, if the
    /// cache holds every layer of it.
    fn hit(&self, digest: &str) -> Option<PulledImage> {
        let mut index = self.inner.index.lock().expect("index lock");
        index.clock += 1;
        let clock = index.clock;
        let img = index.images.get_mut(digest)?;
        img.last_used = clock;
        let img = img.clone();
        let dirs: Vec<PathBuf> = img.layers.iter().filter_map(|l| self.layer_dir(l).ok()).collect();
        if dirs.len() != img.layers.len() || !dirs.iter().all(|d| d.is_dir()) {
            return None;
        }
        // A hit is a task's start: its use is kept in memory and written
        // with the next change to what the cache holds, not each time.
        drop(index);
        Some(PulledImage {
            digest: digest.to_string(),
            layer_dirs: dirs,
            config: img.config,
            cache_hit: true,
            downloaded: 0,
            _pin: self.pin(digest),
        })
    }

    /// Pulls `image` (or finds it cached) and pins it until the returned
    /// value is dropped.
    pub async fn pull(&self, image: &ImageRef) -> Result<PulledImage, PullError> {
        self.pull_tracked(image, &PullProgress::default()).await
    }

    /// [`ImageCache::pull`], saying how far along it is in `progress`.
    pub async fn pull_tracked(&self, image: &ImageRef, progress: &PullProgress) -> Result<PulledImage, PullError> {
        let started = Instant::now();
        if let Some(d) = &image.digest
            && let Some(hit) = self.hit(d)
        {
            metrics::counter!("muster_image_cache_hits_total").increment(1);
            return Ok(hit);
        }
        let m = self.registry.manifest(image).await?;
        if let Some(hit) = self.hit(&m.digest) {
            metrics::counter!("muster_image_cache_hits_total").increment(1);
            return Ok(hit);
        }
        metrics::counter!("muster_image_cache_misses_total").increment(1);
        // Pinned and recorded before its layers land, so a concurrent
        // eviction spares them.
        let pin = self.pin(&m.digest);
        let layers: Vec<String> = m.manifest.layers.iter().map(|l| l.digest.clone()).collect();
        let dirs = layers.iter().map(|l| self.layer_dir(l)).collect::<Result<Vec<_>, _>>()?;
        {
            let mut index = self.inner.index.lock().expect("index lock");
            index.clock += 1;
            let clock = index.clock;
            let record =
                CachedImage { reference: image.to_string(), layers, config: m.config.clone(), last_used: clock };
            index.images.insert(m.digest.clone(), record);
            self.save(&index).map_err(|e| disk("the image cache's index", e))?;
        }
        let total = m.manifest.layers.iter().map(|l| u64::try_from(l.size).unwrap_or(0)).sum();
        progress.total.store(total, Ordering::Relaxed);
        let fetches = m.manifest.layers.iter().map(|layer| self.layer(image, layer, progress));
        let results = futures_util::future::join_all(fetches).await;
        let mut downloaded = 0;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(n) => downloaded += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            let mut index = self.inner.index.lock().expect("index lock");
            if !dirs.iter().all(|d| d.is_dir()) {
                index.images.remove(&m.digest);
                let _ = self.save(&index);
            }
            return Err(e);
        }
        self.evict().map_err(|e| disk("evicting images", e))?;
        metrics::histogram!("muster_image_pull_seconds").record(started.elapsed().as_secs_f64());
        Ok(PulledImage {
            digest: m.digest,
            layer_dirs: dirs,
            config: m.config,
            cache_hit: false,
            downloaded,
            _pin: pin,
        })
    }

    /// Fetches and unpacks one layer unless it is cached; the bytes it
    /// downloaded.
    async fn layer(&self, image: &ImageRef, layer: &OciDescriptor, progress: &PullProgress) -> Result<u64, PullError> {
        let dir = self.layer_dir(&layer.digest)?;
        let lock = {
            let mut f = self.inner.fetching.lock().expect("fetching lock");
            f.entry(layer.digest.clone()).or_default().clone()
        };
        let _guard = lock.lock().await;
        let cached = self.inner.index.lock().expect("index lock").layers.contains_key(&layer.digest);
        if cached && dir.is_dir() {
            progress.add(u64::try_from(layer.size).unwrap_or(0));
            return Ok(0);
        }
        let decompress = match layer.media_type.as_str() {
            t if t.ends_with("tar+gzip") || t.ends_with("tar.gzip") || t.ends_with(".tar.gz") => Decompress::Gzip,
            t if t.ends_with(".tar") || t.ends_with("tar") => Decompress::None,
            t => return Err(PullError::BadImage(format!("layer {}: media type {t} is not supported", layer.digest))),
        };
        let tmp = self.inner.root.join("tmp").join(layer.digest.replace(':', "-"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| disk("a stale layer", e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| disk("the image cache", e))?;
        let mut stream = self.registry.layer_stream(image, layer).await?;
        // The network side feeds a bounded channel; a blocking thread
        // decompresses and unpacks as the bytes arrive.
        let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<bytes::Bytes>>(32);
        let policy = self.inner.policy;
        let unpack_dir = tmp.clone();
        let unpacker = tokio::task::spawn_blocking(move || {
            let reader = ChannelReader { rx, buf: bytes::Bytes::new() };
            match decompress {
                Decompress::Gzip => unpack(flate2::read::MultiGzDecoder::new(reader), &unpack_dir, &policy),
                Decompress::None => unpack(reader, &unpack_dir, &policy),
            }
        });
        let mut downloaded = 0u64;
        let mut failed = None;
        while let Some(chunk) = stream.stream.next().await {
            match chunk {
                Ok(b) => {
                    downloaded += b.len() as u64;
                    progress.add(b.len() as u64);
                    metrics::counter!("muster_image_pull_bytes_total").increment(b.len() as u64);
                    if tx.send(Ok(b)).is_err() {
                        break; // the unpacker stopped: its error says why
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    let _ = tx.send(Err(io::Error::other(msg.clone())));
                    failed = Some(msg);
                    break;
                }
            }
        }
        drop(tx);
        let unpacked = unpacker.await.map_err(|e| PullError::Disk(format!("the unpacker: {e}")))?;
        let cleanup = || {
            let _ = std::fs::remove_dir_all(&tmp);
        };
        if let Some(msg) = failed {
            cleanup();
            return Err(if msg.contains("igest") {
                PullError::BadImage(format!("layer {}: {msg}", layer.digest))
            } else {
                PullError::Unreachable(format!("layer {}: {msg}", layer.digest))
            });
        }
        let unpacked = match unpacked {
            Ok(u) => u,
            Err(UnpackError::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC) => {
                cleanup();
                return Err(disk("unpacking a layer", e));
            }
            Err(e) => {
                cleanup();
                return Err(PullError::BadImage(format!("layer {}: {e}", layer.digest)));
            }
        };
        std::fs::create_dir_all(dir.parent().expect("a layer dir has a parent")).map_err(|e| disk("the cache", e))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| disk("a stale layer", e))?;
        }
        std::fs::rename(&tmp, &dir).map_err(|e| disk("the cache", e))?;
        let mut index = self.inner.index.lock().expect("index lock");
        index.layers.insert(layer.digest.clone(), unpacked.bytes);
        self.save(&index).map_err(|e| disk("the image cache's index", e))?;
        Ok(downloaded)
    }

    /// Removes the least recently used images nobody pins, and the layers
    /// only they held, until the cache is within its limit.
    pub fn evict(&self) -> io::Result<()> {
        let pins = self.inner.pins.lock().expect("pins lock").clone();
        let mut index = self.inner.index.lock().expect("index lock");
        let mut order: Vec<(u64, String)> = index.images.iter().map(|(d, i)| (i.last_used, d.clone())).collect();
        order.sort();
        let mut removed = false;
        for (_, digest) in order {
            if index.layers.values().sum::<u64>() <= self.inner.max_bytes {
                break;
            }
            if pins.contains_key(&digest) {
                continue;
            }
            index.images.remove(&digest);
            removed = true;
            let used: BTreeSet<String> = index.images.values().flat_map(|i| i.layers.iter().cloned()).collect();
            let gone: Vec<String> = index.layers.keys().filter(|l| !used.contains(*l)).cloned().collect();
            for l in gone {
                if let Ok(dir) = self.layer_dir(&l) {
                    // A layer being fetched for a pull in flight is not yet
                    // in the index, so it is never removed here.
                    if dir.exists() {
                        std::fs::remove_dir_all(&dir)?;
                    }
                }
                index.layers.remove(&l);
                metrics::counter!("muster_image_layers_evicted_total").increment(1);
            }
        }
        metrics::gauge!("muster_image_cache_bytes").set(index.layers.values().sum::<u64>() as f64);
        if removed {
            self.save(&index)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Decompress {
    Gzip,
    None,
}

/// Reads the chunks a channel delivers; an error chunk ends the read.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<io::Result<bytes::Bytes>>,
    buf: bytes::Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            match self.rx.recv() {
                Ok(Ok(b)) => self.buf = b,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}
