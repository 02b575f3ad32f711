//! Checkpoint stores: where an agent writes a packed checkpoint directory,
//! reads one back for a task's next attempt, and deletes a retired one.
//!
//! ```text
//!   node    WORK_DIR/checkpoint-store/alloc-A/task-T/NAME   this node's disk; another
//!                                                           node's agent fetches it
//!                                                           from this one (`serve`)
//!   /path   /path/alloc-A/task-T/NAME                       a shared file system
//!   s3://…  s3://bucket/prefix/alloc-A/task-T/NAME          an object store (`object`)
//! ```
//!
//! On a file system a checkpoint is written once under a temporary name,
//! synced, renamed into place and its directory synced: a crash leaves
//! either the whole checkpoint or none of it under its name (a leftover
//! temporary file is swept). In an object store the upload is one
//! multipart upload, which the store makes visible only once complete.
//! Reading back always streams through [`checkpoint::unpack_from`], which
//! checks the manifest's size and SHA-256.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use muster_core::sm::{CheckpointStore, key_prefix};
use muster_proto::v1;
use muster_proto::v1::checkpoint_service_client::CheckpointServiceClient;
use tokio::sync::mpsc;

use crate::checkpoint::{self, Expect, PackError, Packed};
use crate::object::ObjectStores;

/// The directory under an agent's work dir that holds the checkpoints
/// written to its own disk.
pub const NODE_STORE_DIR: &str = "checkpoint-store";

/// A checkpoint written to a store: what its manifest says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    /// The store.
    pub store: CheckpointStore,
    /// Its key.
    pub key: String,
    /// Its size and digest.
    pub packed: Packed,
    /// The step the task said it saved.
    pub step: Option<u64>,
}

impl Saved {
    /// Its manifest as an upload.
    pub fn manifest(&self) -> v1::CheckpointManifest {
        v1::CheckpointManifest {
            step: self.step,
            bytes: self.packed.bytes,
            sha256: self.packed.sha256.to_vec(),
            store: self.store.spec(),
            key: self.key.clone(),
            ..Default::default()
        }
    }
}

/// What names a checkpoint being written: its task, the attempt and the
/// preemption epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Naming {
    /// The allocation.
    pub alloc: u64,
    /// The task.
    pub task: u32,
    /// The attempt (`MUSTER_ATTEMPT`).
    pub attempt: u32,
    /// The reservation epoch.
    pub epoch: u64,
}

/// Every store an agent uses.
#[derive(Clone)]
pub struct Stores {
    /// This node's own store.
    node_root: PathBuf,
    /// This node's id (said to another agent when fetching without TLS).
    node_id: String,
    /// This agent's certificate, for fetching from other agents.
    tls: Option<muster_tls::TlsMaterial>,
    objects: ObjectStores,
}

/// How long a fetch from another agent keeps trying when that agent says
/// it holds no grant yet (the leader's grant and this node's assignment
/// race), and when it cannot be reached at all (a node powered off after
/// its drain: the attempt then falls back to an older checkpoint).
const FETCH_PATIENCE: Duration = Duration::from_secs(60);
const CONNECT_PATIENCE: Duration = Duration::from_secs(15);

impl Stores {
    /// The stores of an agent with this work dir.
    pub fn new(work_dir: &Path, node_id: &str, tls: Option<muster_tls::TlsMaterial>) -> Stores {
        Stores {
            node_root: work_dir.join(NODE_STORE_DIR),
            node_id: node_id.to_string(),
            tls,
            objects: ObjectStores::default(),
        }
    }

    /// The root of this node's own store.
    pub fn node_root(&self) -> &Path {
        &self.node_root
    }

    /// The file a checkpoint on this node's disk is in (the key was checked
    /// to be a plain relative path).
    pub fn node_path(&self, key: &str) -> Option<PathBuf> {
        let plain = key.split('/').all(|c| !c.is_empty() && c != "." && c != "..") && !key.starts_with('/');
        plain.then(|| self.node_root.join(key))
    }

    fn dir_root(&self, store: &CheckpointStore) -> Option<PathBuf> {
        match store {
            CheckpointStore::Node => Some(self.node_root.clone()),
            CheckpointStore::Shared { root } => Some(PathBuf::from(root)),
            CheckpointStore::Object { .. } => None,
        }
    }

    /// Packs the checkpoint directory `dir` into `store` (at most `limit`
    /// bytes); `Ok(None)` when it holds nothing to save.
    pub async fn save(
        &self,
        store: &CheckpointStore,
        dir: &Path,
        name: Naming,
        limit: u64,
    ) -> Result<Option<Saved>, String> {
        let files = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || checkpoint::list(&dir, limit))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
        };
        let Some(files) = files else { return Ok(None) };
        let step = checkpoint::step(dir);
        let (key, packed) = match self.dir_root(store) {
            Some(root) => {
                let root2 = root.clone();
                tokio::task::spawn_blocking(move || write_file(&root2, name, &files))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{e} (store {})", root.display()))?
            }
            None => {
                let CheckpointStore::Object { url } = store else { unreachable!("not a directory store") };
                let key = object_key(name);
                let packed = self.objects.put(url, &key, files).await?;
                (key, packed)
            }
        };
        Ok(Some(Saved { store: store.clone(), key, packed, step }))
    }

    /// Restores `m` into `dir` (emptied first), checking its size and
    /// digest: from this node's disk, a shared file system, an object store,
    /// or (`source`) another node's agent.
    pub async fn restore(&self, m: &v1::CheckpointManifest, source: &str, dir: &Path) -> Result<(), String> {
        let store = CheckpointStore::parse(&m.store)?;
        let sha256: [u8; 32] =
            m.sha256.as_slice().try_into().map_err(|_| "a manifest without a SHA-256".to_string())?;
        let expect = Expect { bytes: m.bytes, sha256 };
        let prefix = key_prefix_of(&m.key).ok_or_else(|| format!("key {:?} names no task", m.key))?;
        if !m.key.starts_with(&prefix) || m.key.split('/').any(|c| c.is_empty() || c == "..") {
            return Err(format!("key {:?} is not a plain checkpoint key", m.key));
        }
        let on_this_node = matches!(store, CheckpointStore::Node) && (source.is_empty() || m.writer == self.node_id);
        match (&store, on_this_node) {
            (CheckpointStore::Node, true) | (CheckpointStore::Shared { .. }, _) => {
                let root = self.dir_root(&store).expect("a directory store");
                let path = root.join(&m.key);
                let dir = dir.to_path_buf();
                tokio::task::spawn_blocking(move || {
                    let file = fs::File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                    checkpoint::unpack_from(file, &dir, &expect).map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())?
            }
            (CheckpointStore::Node, false) => self.fetch(source, &m.key, dir, expect).await,
            (CheckpointStore::Object { url }, _) => {
                let (tx, rx) = mpsc::channel(8);
                let dir = dir.to_path_buf();
                let unpack = tokio::task::spawn_blocking(move || {
                    checkpoint::unpack_from(ChannelReader::new(rx), &dir, &expect).map_err(|e| e.to_string())
                });
                let got = self.objects.get(url, &m.key, tx).await;
                let unpacked = unpack.await.map_err(|e| e.to_string())?;
                got.and(unpacked)
            }
        }
    }

    /// Fetches `key` from the agent at `source`, unpacking as it comes. A
    /// refusal for want of a grant, or a peer that does not answer, is tried
    /// again for a while: the leader sends the grant to that agent as it
    /// places the task here, and the two messages race.
    async fn fetch(&self, source: &str, key: &str, dir: &Path, expect: Expect) -> Result<(), String> {
        if source.is_empty() {
            return Err("its node gave no checkpoint address".into());
        }
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match self.fetch_once(source, key, dir, expect).await {
                Ok(()) => return Ok(()),
                Err((Retry::Connect, e)) if started.elapsed() < CONNECT_PATIENCE => {
                    tracing::debug!(source, key, error = %e, "checkpoint source unreachable; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err((Retry::Yes, e)) if started.elapsed() < FETCH_PATIENCE => {
                    tracing::debug!(source, key, error = %e, "checkpoint fetch failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err((_, e)) => return Err(format!("fetching it from {source}: {e}")),
            }
        }
    }

    async fn fetch_once(&self, source: &str, key: &str, dir: &Path, expect: Expect) -> Result<(), (Retry, String)> {
        let endpoint = muster_tls::agent_endpoint(source, self.tls.as_ref())
            .map_err(|e| (Retry::No, e.to_string()))?
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect().await.map_err(|e| (Retry::Connect, format!("cannot connect: {e}")))?;
        let mut client = CheckpointServiceClient::new(channel);
        let mut req = tonic::Request::new(v1::FetchCheckpoint { key: key.to_string(), offset: 0 });
        if self.tls.is_none() {
            // Without TLS nobody is identified: say who is asking.
            if let Ok(v) = self.node_id.parse() {
                req.metadata_mut().insert(crate::serve::NODE_HEADER, v);
            }
        }
        let retryable = |s: &tonic::Status| match s.code() {
            tonic::Code::PermissionDenied | tonic::Code::ResourceExhausted => Retry::Yes,
            tonic::Code::Unavailable => Retry::Connect,
            _ => Retry::No,
        };
        let mut stream = match client.fetch(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err((retryable(&s), s.message().to_string())),
        };
        let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>(8);
        let target = dir.to_path_buf();
        let unpack = tokio::task::spawn_blocking(move || {
            checkpoint::unpack_from(ChannelReader::new(rx), &target, &expect).map_err(|e| e.to_string())
        });
        let mut failed = None;
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    if tx.send(Ok(chunk.data)).await.is_err() {
                        break; // the unpacker gave up: it says why
                    }
                }
                Ok(None) => break,
                Err(s) => {
                    failed = Some(s.message().to_string());
                    let _ = tx.send(Err(io::Error::other(s.message().to_string()))).await;
                    break;
                }
            }
        }
        drop(tx);
        let unpacked = unpack.await.map_err(|e| (Retry::No, e.to_string()))?;
        match (failed, unpacked) {
            (Some(e), _) => Err((Retry::Connect, format!("the transfer broke off: {e}"))),
            (None, r) => r.map_err(|e| (Retry::No, e)),
        }
    }

    /// Deletes a retired checkpoint's bytes (already gone counts as done).
    pub async fn delete(&self, m: &v1::CheckpointManifest) -> Result<(), String> {
        let store = CheckpointStore::parse(&m.store)?;
        match self.dir_root(&store) {
            Some(root) => {
                let path = root.join(&m.key);
                if m.key.split('/').any(|c| c.is_empty() || c == "..") {
                    return Err(format!("key {:?} is not a plain checkpoint key", m.key));
                }
                tokio::task::spawn_blocking(move || match fs::remove_file(&path) {
                    Ok(()) => {
                        // Empty task and allocation directories go too.
                        let mut dir = path.parent().map(Path::to_path_buf);
                        for _ in 0..2 {
                            let Some(d) = dir else { break };
                            if fs::remove_dir(&d).is_err() {
                                break;
                            }
                            dir = d.parent().map(Path::to_path_buf);
                        }
                        Ok(())
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(format!("cannot delete {}: {e}", path.display())),
                })
                .await
                .map_err(|e| e.to_string())?
            }
            None => {
                let CheckpointStore::Object { url } = &store else { unreachable!("not a directory store") };
                self.objects.delete(url, &m.key).await
            }
        }
    }
}

/// Whether a failed fetch is worth another try, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// No: the answer will not change (the bytes are wrong, the key unknown).
    No,
    /// The agent could not be reached, or the transfer broke off.
    Connect,
    /// It refused for want of a grant, or was busy.
    Yes,
}

/// The key prefix a key names (`alloc-A/task-T/`), if it is a checkpoint key.
fn key_prefix_of(key: &str) -> Option<String> {
    let mut parts = key.splitn(3, '/');
    let alloc = parts.next()?.strip_prefix("alloc-")?.parse().ok()?;
    let task = parts.next()?.strip_prefix("task-")?.parse().ok()?;
    Some(key_prefix(alloc, task))
}

/// An object store key: written once by one multipart upload, so its name
/// carries what makes it unique rather than its digest.
fn object_key(n: Naming) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}a{}-e{}-{:x}{:x}.ckpt", key_prefix(n.alloc, n.task), n.attempt, n.epoch, nanos, std::process::id())
}

/// Writes the blob of `files` under `root`: a temporary file in the task's
/// directory, synced, renamed to its final name (which carries its digest),
/// and the directory synced.
fn write_file(root: &Path, n: Naming, files: &[checkpoint::PackFile]) -> Result<(String, Packed), PackError> {
    let prefix = key_prefix(n.alloc, n.task);
    let dir = root.join(&prefix);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PackError::Io { path, source }
    };
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = dir.join(format!(".a{}-e{}-{:x}-{}.part", n.attempt, n.epoch, nanos, std::process::id()));
    let result = (|| {
        let file = fs::File::create(&tmp).map_err(io(&tmp))?;
        let mut w = io::BufWriter::with_capacity(1 << 20, &file);
        let packed = checkpoint::pack_to(files, &mut w)?;
        w.flush().map_err(io(&tmp))?;
        drop(w);
        file.sync_all().map_err(io(&tmp))?;
        let name = format!("a{}-e{}-{}.ckpt", n.attempt, n.epoch, &packed.hex()[..16]);
        let path = dir.join(&name);
        fs::rename(&tmp, &path).map_err(io(&path))?;
        fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io(&dir))?;
        Ok((format!("{prefix}{name}"), packed))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A blocking reader over chunks an async task sends (a transfer from
/// another agent or an object store), for the unpacker.
pub struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChannelReader {
    /// Reads what arrives on `rx`, until it closes.
    pub fn new(rx: mpsc::Receiver<io::Result<Vec<u8>>>) -> ChannelReader {
        ChannelReader { rx, chunk: Vec::new(), at: 0 }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(Ok(c)) => {
                    self.chunk = c;
                    self.at = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A shared handle to the stores.
pub type SharedStores = Arc<Stores>;

#[cfg(test)]
mod tests {
    use super::*;

    fn naming() -> Naming {
        Naming { alloc: 3, task: 1, attempt: 2, epoch: 5 }
    }

    #[tokio::test]
    async fn a_checkpoint_round_trips_through_the_node_store_and_a_shared_path() {
        let work = tempfile::tempdir().unwrap();
        let shared = tempfile::tempdir().unwrap();
        let stores = Stores::new(work.path(), "n0", None);
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("weights"), vec![3u8; 100_000]).unwrap();
        fs::create_dir_all(src.path().join(".muster")).unwrap();
        fs::write(src.path().join(".muster/step"), "40").unwrap();
        for store in [CheckpointStore::Node, CheckpointStore::Shared { root: shared.path().display().to_string() }] {
            let saved = stores.save(&store, src.path(), naming(), 1 << 20).await.unwrap().unwrap();
            assert!(saved.key.starts_with("alloc-3/task-1/a2-e5-"), "{}", saved.key);
            assert_eq!(saved.step, Some(40));
            let m = v1::CheckpointManifest { writer: "n0".into(), ..saved.manifest() };
            let dst = tempfile::tempdir().unwrap();
            stores.restore(&m, "", dst.path()).await.unwrap();
            assert_eq!(fs::read(dst.path().join("weights")).unwrap(), vec![3u8; 100_000]);
            // Nothing temporary is left behind, and a delete removes the
            // checkpoint and its emptied directories.
            let root = stores.dir_root(&store).unwrap();
            let left: Vec<_> =
                fs::read_dir(root.join("alloc-3/task-1")).unwrap().flatten().map(|e| e.file_name()).collect();
            assert_eq!(left.len(), 1, "{left:?}");
            stores.delete(&m).await.unwrap();
            assert!(!root.join("alloc-3").exists());
            stores.delete(&m).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_checkpoint_that_does_not_match_its_manifest_is_not_restored() {
        let work = tempfile::tempdir().unwrap();
        let stores = Stores::new(work.path(), "n0", None);
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("w"), b"the real bytes").unwrap();
        let saved = stores.save(&CheckpointStore::Node, src.path(), naming(), 1 << 20).await.unwrap().unwrap();
        let path = stores.node_path(&saved.key).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let dst = tempfile::tempdir().unwrap();
        let e = stores.restore(&saved.manifest(), "", dst.path()).await.unwrap_err();
        assert!(e.contains("SHA-256"), "{e}");
        assert!(fs::read_dir(dst.path()).unwrap().next().is_none());
        let escaping = v1::CheckpointManifest { key: "alloc-3/task-1/../../../etc/passwd".into(), ..saved.manifest() };
        assert!(stores.restore(&escaping, "", dst.path()).await.unwrap_err().contains("not a plain"));
        assert_eq!(stores.node_path("alloc-1/task-0/../x"), None);
    }

    #[tokio::test]
    async fn a_directory_over_its_cap_is_not_saved() {
        let work = tempfile::tempdir().unwrap();
        let stores = Stores::new(work.path(), "n0", None);
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("w"), vec![0u8; 5000]).unwrap();
        let e = stores.save(&CheckpointStore::Node, src.path(), naming(), 1000).await.unwrap_err();
        assert!(e.contains("over the 1000-byte cap"), "{e}");
        assert!(!work.path().join(NODE_STORE_DIR).exists(), "nothing written");
    }
}
