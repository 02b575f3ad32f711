//! Checkpoint stores by URL, through the `object_store` crate: `s3://` (and
//! `s3a://`), `gs://`, `az://` (`azure://`, `abfs://`) and `file://`.
//!
//! ```text
//!   s3://bucket/prefix ──▶ AmazonS3Builder::from_env() for bucket ──▶ PrefixStore(prefix)
//!   file:///dir         ──▶ LocalFileSystem rooted at /dir
//! ```
//!
//! Credentials and endpoints come from the agent's environment, as each
//! cloud's SDK reads them (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP` for an S3-compatible
//! server; `GOOGLE_SERVICE_ACCOUNT`; `AZURE_STORAGE_ACCOUNT_NAME`, …): the
//! leader never sees them. A checkpoint is written by one multipart upload
//! (parts of 16 MiB, a few in flight), which the store makes visible only
//! when it completes, and read back as a stream.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, WriteMultipart};
use tokio::sync::mpsc;

use crate::checkpoint::{self, PackFile, Packed};

/// The size of each part of a multipart upload.
const PART_BYTES: usize = 16 << 20;

/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// What a read hands the unpacker at a time. A store streams small frames
/// (`file://` reads 8 KiB at a time, HTTP bodies arrive in frames of a few
/// KiB); gathering them into pieces this large makes a 2 GiB restore a
/// couple of thousand channel hand-offs instead of a quarter of a million.
const READ_PIECE_BYTES: usize = 1 << 20;

/// The object stores an agent has opened, by URL.
#[derive(Clone, Default)]
pub struct ObjectStores {
    open: Arc<Mutex<BTreeMap<String, Arc<dyn ObjectStore>>>>,
}

impl ObjectStores {
    /// The store at `url`, opened once.
    pub fn store(&self, url: &str) -> Result<Arc<dyn ObjectStore>, String> {
        let mut open = self.open.lock().expect("object stores lock");
        if let Some(s) = open.get(url) {
            return Ok(s.clone());
        }
        let store = build(url)?;
        open.insert(url.to_string(), store.clone());
        Ok(store)
    }

    /// Packs `files` into object `key` of the store at `url`.
    pub async fn put(&self, url: &str, key: &str, files: Vec<PackFile>) -> Result<Packed, String> {
        let store = self.store(url)?;
        let path = ObjectPath::parse(key).map_err(|e| e.to_string())?;
        let upload = store.put_multipart(&path).await.map_err(|e| format!("cannot start the upload to {url}: {e}"))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
        let pack = tokio::task::spawn_blocking(move || checkpoint::pack_to(&files, ChannelWriter { tx }));
        while let Some(chunk) = rx.recv().await {
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                drop(rx);
                let _ = pack.await;
                return Err(format!("the upload to {url} failed: {e}"));
            }
            writer.write(&chunk);
        }
        match pack.await.map_err(|e| e.to_string())? {
            Ok(packed) => {
                writer.finish().await.map_err(|e| format!("the upload to {url} failed: {e}"))?;
                Ok(packed)
            }
            Err(e) => {
                let _ = writer.abort().await;
                Err(e.to_string())
            }
        }
    }

    /// Streams object `key` of the store at `url` into `tx`.
    pub async fn get(&self, url: &str, key: &str, tx: mpsc::Sender<io::Result<Vec<u8>>>) -> Result<(), String> {
        let store = self.store(url)?;
        let path = ObjectPath::parse(key).map_err(|e| e.to_string())?;
        let got = match store.get(&path).await {
            Ok(g) => g,
            Err(e) => {
                let msg = format!("cannot read {key} from {url}: {e}");
                let _ = tx.send(Err(io::Error::other(msg.clone()))).await;
                return Err(msg);
            }
        };
        let mut stream = got.into_stream();
        let mut piece = Vec::with_capacity(READ_PIECE_BYTES);
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    piece.extend_from_slice(&bytes);
                    if piece.len() >= READ_PIECE_BYTES {
                        let full = std::mem::replace(&mut piece, Vec::with_capacity(READ_PIECE_BYTES));
                        if tx.send(Ok(full)).await.is_err() {
                            return Ok(()); // the unpacker stopped: it says why
                        }
                    }
                }
                Err(e) => {
                    let msg = format!("reading {key} from {url} broke off: {e}");
                    let _ = tx.send(Err(io::Error::other(msg.clone()))).await;
                    return Err(msg);
                }
            }
        }
        if !piece.is_empty() {
            let _ = tx.send(Ok(piece)).await; // a stopped unpacker says why
        }
        Ok(())
    }

    /// Deletes object `key` (one already gone counts as deleted).
    pub async fn delete(&self, url: &str, key: &str) -> Result<(), String> {
        let store = self.store(url)?;
        let path = ObjectPath::parse(key).map_err(|e| e.to_string())?;
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(format!("cannot delete {key} from {url}: {e}")),
        }
    }
}

/// Opens the store a URL names, with credentials from the environment.
fn build(url: &str) -> Result<Arc<dyn ObjectStore>, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url:?} is not a URL"))?;
    if scheme == "file" {
        std::fs::create_dir_all(rest).map_err(|e| format!("cannot create {rest}: {e}"))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(rest).map_err(|e| e.to_string())?;
        return Ok(Arc::new(fs));
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let base = format!("{scheme}://{bucket}");
    let err = |e: object_store::Error| format!("cannot open the store {url}: {e}");
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" | "s3a" => Arc::new(object_store::aws::AmazonS3Builder::from_env().with_url(base).build().map_err(err)?),
        "gs" => Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(base).build().map_err(err)?),
        "az" | "azure" | "abfs" => {
            Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(base).build().map_err(err)?)
        }
        other => return Err(format!("{other}:// is not an object store this agent knows")),
    };
    Ok(match prefix.trim_matches('/') {
        "" => store,
        p => Arc::new(PrefixStore::new(store, p.to_string())),
    })
}

/// A blocking writer whose bytes go, in pieces, to an async task.
struct ChannelWriter {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx.blocking_send(buf.to_vec()).map_err(|_| io::Error::other("the upload stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{Naming, Stores};
    use muster_core::sm::CheckpointStore;

    /// Through the same code as S3's, against the local-file store: a
    /// checkpoint is uploaded in parts, read back checked, and deleted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_checkpoint_round_trips_through_an_object_store_url() {
        let work = tempfile::tempdir().unwrap();
        let bucket = tempfile::tempdir().unwrap();
        let stores = Stores::new(work.path(), "n0", None);
        let store = CheckpointStore::parse(&format!("file://{}", bucket.path().display())).unwrap();
        let src = tempfile::tempdir().unwrap();
        let weights: Vec<u8> = (0..40u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("weights"), &weights).unwrap();
        let naming = Naming { alloc: 9, task: 0, attempt: 1, epoch: 0 };
        let saved = stores.save(&store, src.path(), naming, 1 << 30).await.unwrap().unwrap();
        assert!(saved.key.starts_with("alloc-9/task-0/a1-e0-"), "{}", saved.key);
        assert!(bucket.path().join(&saved.key).is_file());
        let dst = tempfile::tempdir().unwrap();
        stores.restore(&saved.manifest(), "", dst.path()).await.unwrap();
        assert_eq!(std::fs::read(dst.path().join("weights")).unwrap(), weights);
        // A manifest whose digest is not the object's: nothing restored.
        let mut wrong = saved.manifest();
        wrong.sha256[0] ^= 1;
        let e = stores.restore(&wrong, "", dst.path()).await.unwrap_err();
        assert!(e.contains("SHA-256"), "{e}");
        stores.delete(&saved.manifest()).await.unwrap();
        assert!(!bucket.path().join(&saved.key).exists());
        stores.delete(&saved.manifest()).await.unwrap();
        let missing = stores.restore(&saved.manifest(), "", dst.path()).await.unwrap_err();
        assert!(missing.contains("cannot read"), "{missing}");
    }
}
