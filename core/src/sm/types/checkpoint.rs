//! Checkpoints as the log knows them: manifests naming where the bytes are,
//! the stores that hold them, the cluster's checkpoint settings, and the
//! retired manifests whose bytes wait to be deleted.
//!
//! ```text
//!   agent: pack MUSTER_CHECKPOINT_DIR ──▶ store (node disk | shared path | object URL)
//!          ──▶ CheckpointUpload{manifest: size, sha256, store, key} ──▶ SaveCheckpoint (log)
//!   task.checkpoints: the newest `keep` manifests, newest first
//!          older ones, and all of a finished allocation's ──▶ retired ──▶ deleted by
//!          the node that wrote them ──▶ ForgetCheckpoints (log)
//! ```
//!
//! The log never carries checkpoint bytes: a manifest is a few hundred
//! bytes whatever the checkpoint's size.

use super::*;

/// Where checkpoint bytes are kept: a cluster setting, overridable per
/// vCluster and per allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CheckpointStore {
    /// On the disk of the node that wrote it, under its agent's work dir;
    /// another node's agent fetches it from that agent, under a grant the
    /// leader issues for the attempt that restores it.
    #[default]
    Node,
    /// Under this absolute directory of a file system every node mounts at
    /// the same place (NFS, Lustre, GPFS): written once, then renamed into
    /// place.
    Shared {
        /// The directory.
        root: String,
    },
    /// Under this object-store URL (`s3://bucket/prefix`, `gs://…`,
    /// `az://…`, `file:///…`); credentials come from each node's
    /// environment.
    Object {
        /// The URL.
        url: String,
    },
}

/// The longest store spec (a path or a URL).
pub const MAX_STORE_SPEC_BYTES: usize = 512;

/// The object-store URL schemes a store may use.
pub const OBJECT_SCHEMES: [&str; 7] = ["s3", "s3a", "gs", "az", "azure", "abfs", "file"];

impl CheckpointStore {
    /// Parses the spelling the API and CLI use: `node`, an absolute path
    /// (a shared file system), or a URL with an object-store scheme.
    pub fn parse(s: &str) -> Result<CheckpointStore, String> {
        if s.len() > MAX_STORE_SPEC_BYTES {
            return Err(format!("{} bytes, over {MAX_STORE_SPEC_BYTES}", s.len()));
        }
        if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err("holds whitespace or control characters".into());
        }
        if s == "node" {
            return Ok(CheckpointStore::Node);
        }
        if s.starts_with('/') {
            check_path(s)?;
            return Ok(CheckpointStore::Shared { root: s.to_string() });
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err(format!(
                "{s:?} is not a store: say node, an absolute path on a shared file system, or a URL ({})",
                OBJECT_SCHEMES.join("://, ") + "://"
            ));
        };
        if !OBJECT_SCHEMES.contains(&scheme) {
            return Err(format!("scheme {scheme:?} is not an object store ({})", OBJECT_SCHEMES.join(", ")));
        }
        if rest.is_empty() || rest.contains(['?', '#']) {
            return Err("a store URL names a bucket (and prefix), with no query or fragment".into());
        }
        if rest.split('/').any(|seg| seg == "." || seg == "..") {
            return Err("a store URL may not hold . or .. segments".into());
        }
        if scheme == "file" {
            check_path(rest)?;
        }
        Ok(CheckpointStore::Object { url: s.trim_end_matches('/').to_string() })
    }

    /// The spelling [`CheckpointStore::parse`] reads.
    pub fn spec(&self) -> String {
        match self {
            CheckpointStore::Node => "node".into(),
            CheckpointStore::Shared { root } => root.clone(),
            CheckpointStore::Object { url } => url.clone(),
        }
    }

    /// Whether this store lies within `outer`: the same store, or a
    /// directory or prefix under it. A job may choose a store only within
    /// one an operator configured (or `node`): a path of its choosing would
    /// let it have a root-run agent write where it likes.
    pub fn within(&self, outer: &CheckpointStore) -> bool {
        let under = |inner: &str, outer: &str| {
            inner == outer || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'/'))
        };
        match (self, outer) {
            (CheckpointStore::Node, CheckpointStore::Node) => true,
            (CheckpointStore::Shared { root: a }, CheckpointStore::Shared { root: b }) => under(a, b),
            (CheckpointStore::Object { url: a }, CheckpointStore::Object { url: b }) => under(a, b),
            _ => false,
        }
    }
}

/// An absolute, normal path: no `.` or `..` component, no empty one, not
/// the root itself.
fn check_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') || p == "/" {
        return Err(format!("{p:?} is not an absolute directory below /"));
    }
    let inner = p.trim_end_matches('/');
    if inner[1..].split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("{p:?} is not a normal path (empty, . or .. components)"));
    }
    Ok(())
}

impl fmt::Display for CheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec())
    }
}

/// What an agent reports of a checkpoint it has written to a store; the
/// state numbers it and stamps its time, epoch and attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestUpload {
    /// The training step the task said it saved (`.muster/step`), if it did.
    pub step: Option<u64>,
    /// The checkpoint's size (the packed directory), bytes.
    pub bytes: u64,
    /// SHA-256 of those bytes; checked on restore.
    pub sha256: [u8; 32],
    /// The store it was written to.
    pub store: CheckpointStore,
    /// Its name in that store: `alloc-A/task-T/NAME`.
    pub key: String,
}

/// The longest checkpoint key.
pub const MAX_CHECKPOINT_KEY_BYTES: usize = 256;

impl ManifestUpload {
    /// Checks the key: it must name this allocation's task (so no upload
    /// can point a task at another job's checkpoint), in a plain
    /// character set. The store is checked against the allocation by the
    /// state.
    pub fn check_key(&self, alloc: AllocId, task: TaskIndex) -> Result<(), String> {
        check_key(&self.key, alloc, task)
    }
}

/// See [`ManifestUpload::check_key`].
pub fn check_key(key: &str, alloc: AllocId, task: TaskIndex) -> Result<(), String> {
    if key.len() > MAX_CHECKPOINT_KEY_BYTES {
        return Err(format!("{} bytes, over {MAX_CHECKPOINT_KEY_BYTES}", key.len()));
    }
    let prefix = key_prefix(alloc, task);
    let Some(name) = key.strip_prefix(&prefix) else {
        return Err(format!("{key:?} does not begin with {prefix:?}: a task's checkpoints are named for it"));
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if name.is_empty() || name.starts_with('.') || !name.chars().all(plain) {
        return Err(format!("{name:?} is not a plain name (letters, digits, . - _, not starting with .)"));
    }
    Ok(())
}

/// The directory every checkpoint key of a task starts with.
pub fn key_prefix(alloc: AllocId, task: TaskIndex) -> String {
    format!("alloc-{alloc}/task-{task}/")
}

/// A stored checkpoint: what the log records of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    /// Its number, unique in the cluster (the state counts them).
    pub seq: u64,
    /// The preemption epoch it was saved under.
    pub epoch: u64,
    /// The attempt that wrote it (`MUSTER_ATTEMPT`).
    pub attempt: u32,
    /// Entry time of the save.
    pub saved_at_ms: u64,
    /// The training step the task said it saved, if it did.
    pub step: Option<u64>,
    /// Its size, bytes.
    pub bytes: u64,
    /// SHA-256 of its bytes.
    pub sha256: [u8; 32],
    /// The node whose agent wrote it.
    pub writer: NodeId,
    /// Where it is: with [`CheckpointStore::Node`], on `writer`'s disk.
    pub store: CheckpointStore,
    /// Its name in that store.
    pub key: String,
}

impl CheckpointManifest {
    /// The digest in hex.
    pub fn sha256_hex(&self) -> String {
        self.sha256.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The cluster's checkpoint settings (`muster cluster checkpoints`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSettings {
    /// Where checkpoints go unless a vCluster or a job says otherwise.
    pub store: CheckpointStore,
    /// How many checkpoints each task keeps (the newest; older ones are
    /// deleted). More than one lets a task fall back when its newest one is
    /// on a node that is gone or turns out corrupt.
    pub keep: u32,
    /// The largest checkpoint a task may save unless its vCluster says
    /// otherwise, bytes.
    pub max_bytes: u64,
}

/// The default checkpoint cap: 64 GiB (a 1B-parameter model with its
/// optimizer state is about 12 GB).
pub const DEFAULT_MAX_CHECKPOINT_BYTES: u64 = 64 << 30;

/// The most checkpoints a task may keep.
pub const MAX_CHECKPOINT_KEEP: u32 = 16;

/// The least and most a checkpoint cap may be: 1 MiB and 16 TiB.
pub const CHECKPOINT_CAP_RANGE: (u64, u64) = (1 << 20, 16 << 40);

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings { store: CheckpointStore::Node, keep: 2, max_bytes: DEFAULT_MAX_CHECKPOINT_BYTES }
    }
}

impl CheckpointSettings {
    /// Checks the numbers.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_CHECKPOINT_KEEP).contains(&self.keep) {
            return Err(format!("keep is {}, not 1 to {MAX_CHECKPOINT_KEEP}", self.keep));
        }
        check_cap(self.max_bytes)
    }
}

/// A checkpoint cap within [`CHECKPOINT_CAP_RANGE`].
pub fn check_cap(bytes: u64) -> Result<(), String> {
    let (lo, hi) = CHECKPOINT_CAP_RANGE;
    if !(lo..=hi).contains(&bytes) {
        return Err(format!("{bytes} bytes, not between {lo} (1 MiB) and {hi} (16 TiB)"));
    }
    Ok(())
}

/// A manifest no task will restore any more, whose bytes wait to be
/// deleted by `deleter`'s agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredCheckpoint {
    /// The manifest.
    pub manifest: CheckpointManifest,
    /// The node whose agent deletes it: the writer, or for a shared or
    /// object store, another ready node once the writer is terminated.
    pub deleter: NodeId,
}

/// The most retired manifests waiting for deletion; past it the oldest are
/// abandoned (their bytes left in place, counted), so agents that never
/// confirm cannot grow the state without bound.
pub const MAX_RETIRED_CHECKPOINTS: usize = 100_000;

/// The most manifests one `ForgetCheckpoints` names.
pub const MAX_FORGET_CHECKPOINTS: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_parse_and_refuse_what_is_not_a_store() {
        assert_eq!(CheckpointStore::parse("node"), Ok(CheckpointStore::Node));
        assert_eq!(
            CheckpointStore::parse("/mnt/lustre/ckpt"),
            Ok(CheckpointStore::Shared { root: "/mnt/lustre/ckpt".into() })
        );
        assert_eq!(
            CheckpointStore::parse("s3://bucket/muster/"),
            Ok(CheckpointStore::Object { url: "s3://bucket/muster".into() })
        );
        for bad in [
            "",
            "relative/dir",
            "/",
            "/mnt/../etc",
            "/mnt//x",
            "ftp://x",
            "s3://",
            "s3://b?x=1",
            "s3://b/../c",
            "/a b",
            "file://rel",
        ] {
            assert!(CheckpointStore::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(CheckpointStore::parse(&format!("/{}", "a".repeat(600))).unwrap_err().contains("over 512"));
    }

    #[test]
    fn a_store_lies_within_another_only_below_it() {
        let p = |s: &str| CheckpointStore::parse(s).unwrap();
        assert!(p("/mnt/ckpt/team-a").within(&p("/mnt/ckpt")));
        assert!(p("/mnt/ckpt").within(&p("/mnt/ckpt")));
        assert!(!p("/mnt/ckpt-evil").within(&p("/mnt/ckpt")), "a sibling with the same prefix");
        assert!(!p("/etc").within(&p("/mnt/ckpt")));
        assert!(p("s3://b/muster/team").within(&p("s3://b/muster")));
        assert!(!p("s3://b2").within(&p("s3://b")));
        assert!(!p("node").within(&p("/mnt/ckpt")));
    }

    #[test]
    fn a_key_must_name_its_own_task_plainly() {
        assert!(check_key("alloc-3/task-1/a2-e0-0123abcd.ckpt", 3, 1).is_ok());
        for (bad, says) in [
            ("alloc-4/task-1/x", "does not begin"),
            ("alloc-3/task-12/x", "does not begin"),
            ("alloc-3/task-1/../task-2/x", "not a plain name"),
            ("alloc-3/task-1/", "not a plain name"),
            ("alloc-3/task-1/.hidden", "not a plain name"),
            ("alloc-3/task-1/a/b", "not a plain name"),
        ] {
            let e = check_key(bad, 3, 1).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert!(check_key(&format!("alloc-3/task-1/{}", "a".repeat(300)), 3, 1).unwrap_err().contains("over 256"));
    }

    #[test]
    fn settings_are_checked() {
        assert!(CheckpointSettings::default().check().is_ok());
        let s = |keep, max_bytes| CheckpointSettings { store: CheckpointStore::Node, keep, max_bytes };
        assert!(s(0, 1 << 30).check().unwrap_err().contains("keep"));
        assert!(s(17, 1 << 30).check().unwrap_err().contains("keep"));
        assert!(s(2, 1000).check().unwrap_err().contains("1 MiB"));
    }
}
