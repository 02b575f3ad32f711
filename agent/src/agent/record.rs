//! The on-disk records of started attempts (`WORK_DIR/running/slot-N`), for
//! the agent after this one.

use std::io;
use std::os::unix::fs::FileExt;

use super::*;

/// What a slot says about a started attempt, for the agent after this one:
/// `key=<alloc>-<task>-<epoch> pgid=… attempt=… gpus=0,1 walltime_s=…
/// stall_s=… gpu_health=0|1 started_ms=… checkpointing=0|1` (an old record
/// holds the pgid alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) pgid: i32,
    pub(super) attempt: u32,
    pub(super) gpus: Vec<u32>,
    pub(super) walltime_s: u64,
    pub(super) stall_s: u32,
    pub(super) gpu_health: bool,
    /// Wall clock (ms since the epoch) when it started: an adopted task's
    /// budget counts from here, not from the adoption.
    pub(super) started_ms: u64,
    /// The allocation checkpoints (a record without the field: assume so,
    /// and let the leader refuse an upload it does not want).
    pub(super) checkpointing: bool,
    /// The digest of the image it runs in (`None`: the node's own system):
    /// the next agent keeps it from eviction while it runs.
    pub(super) image: Option<String>,
}

impl Record {
    pub(super) fn encode(&self) -> String {
        let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        format!(
            "pgid={} attempt={} gpus={} walltime_s={} stall_s={} gpu_health={} started_ms={} checkpointing={}{}\n",
            self.pgid,
            self.attempt,
            gpus.join(","),
            self.walltime_s,
            self.stall_s,
            u8::from(self.gpu_health),
            self.started_ms,
            u8::from(self.checkpointing),
            self.image.as_ref().map_or(String::new(), |d| format!(" image={d}"))
        )
    }

    /// The full record, or just the pgid of an old one.
    pub(super) fn decode(text: &str) -> Result<Record, Option<i32>> {
        let text = text.trim();
        if let Ok(pgid) = text.parse::<i32>() {
            return Err(Some(pgid));
        }
        let fields: BTreeMap<&str, &str> = text.split_whitespace().filter_map(|kv| kv.split_once('=')).collect();
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let pgid = fields.get("pgid").and_then(|v| v.parse::<i32>().ok());
        let parsed = (|| {
            Some(Record {
                pgid: pgid?,
                attempt: u32::try_from(num("attempt")?).ok()?,
                gpus: match fields.get("gpus")? {
                    &"" => Vec::new(),
                    g => g.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u32>>>()?,
                },
                walltime_s: num("walltime_s")?,
                stall_s: u32::try_from(num("stall_s")?).ok()?,
                gpu_health: num("gpu_health")? == 1,
                started_ms: num("started_ms")?,
                checkpointing: num("checkpointing") != Some(0),
                image: match fields.get("image") {
                    None => None,
                    Some(d) => Some(muster_core::sm::check_digest(d).ok().map(|()| d.to_string())?),
                },
            })
        })();
        parsed.ok_or(pgid)
    }
}

/// `<alloc>-<task>-<epoch>`.
pub(super) fn parse_key(name: &str) -> Option<Key> {
    let mut it = name.split('-');
    let k = (it.next()?.parse().ok()?, it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    it.next().is_none().then_some(k)
}

/// One record found when the agent starts.
pub(super) struct Found {
    pub(super) slot: u32,
    /// `None` when the record is torn.
    pub(super) key: Option<Key>,
    pub(super) record: Result<Record, Option<i32>>,
}

/// The records of the attempts this agent started: `WORK_DIR/running/slot-N`,
/// each blank (free) or holding one record. A slot is rewritten in place and
/// blanked when its attempt ends, never created or removed per task: on a
/// node starting hundreds of tasks a second, every removed file makes each
/// later file creation in its directory slower for a while (ext4 scans
/// past recently freed inodes).
///
/// **A full disk.** Every slot is [`SLOT_BYTES`] long and only ever
/// overwritten in place, so once a slot exists, writing a record into it
/// needs no new space. An attempt's slot is reserved before its process is
/// spawned ([`Records::reserve`]); when the disk has no room for a new slot,
/// the attempt is not started (its start fails, and the leader places it
/// again) rather than run unrecorded, where the agent after this one could
/// neither adopt nor kill it.
pub(super) struct Records {
    dir: PathBuf,
    taken: BTreeMap<Key, u32>,
    free: BTreeSet<u32>,
    slots: u32,
    /// Slots whose file is known to be [`SLOT_BYTES`] long (found so, or
    /// written since): writing one needs no new space and no look first.
    sized: BTreeSet<u32>,
    /// Injected disk faults (`muster agent --disk-fault-file`, tests and
    /// chaos only): the file reading `full` makes every write that needs new
    /// space fail with ENOSPC.
    fault_file: Option<PathBuf>,
}

/// The size of every record slot: a record is padded to it with spaces.
pub(super) const SLOT_BYTES: usize = 512;

impl Records {
    /// Opens `dir` (created when missing) and returns what it holds. Every
    /// record found keeps its slot until [`Records::adopt`] names its key or
    /// [`Records::release`] frees it. A record in the older one-file-per-key
    /// form (`<alloc>-<task>-<epoch>`) moves into a slot.
    pub(super) fn open(dir: PathBuf, fault_file: Option<PathBuf>) -> io::Result<(Records, Vec<Found>)> {
        fs::create_dir_all(&dir)?;
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        let mut records = Records {
            dir,
            taken: BTreeMap::new(),
            free: BTreeSet::new(),
            slots: 0,
            sized: BTreeSet::new(),
            fault_file,
        };
        let mut older = Vec::new();
        for name in names {
            match name.strip_prefix("slot-").and_then(|n| n.parse::<u32>().ok()) {
                Some(n) => records.slots = records.slots.max(n + 1),
                None => older.push(name),
            }
        }
        let mut found = Vec::new();
        for n in 0..records.slots {
            let text = fs::read_to_string(records.path(n)).unwrap_or_default();
            if text.len() >= SLOT_BYTES {
                records.sized.insert(n);
            }
            if text.trim().is_empty() {
                records.free.insert(n);
                continue;
            }
            let key = text.split_whitespace().find_map(|f| f.strip_prefix("key=")).and_then(parse_key);
            found.push(Found { slot: n, key, record: Record::decode(&text) });
        }
        for name in older {
            let path = records.dir.join(&name);
            let (Some(key), Ok(text)) = (parse_key(&name), fs::read_to_string(&path)) else { continue };
            let slot = records.claim();
            records.write_slot(slot, &format!("key={name} {}", text.trim()))?;
            fs::remove_file(&path)?;
            found.push(Found { slot, key: Some(key), record: Record::decode(&text) });
        }
        Ok((records, found))
    }

    fn path(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("slot-{slot}"))
    }

    /// The lowest free slot, or a new one.
    fn claim(&mut self) -> u32 {
        self.free.pop_first().unwrap_or_else(|| {
            self.slots += 1;
            self.slots - 1
        })
    }

    /// A found record's attempt is this agent's now: its slot stays until
    /// [`Records::clear`].
    pub(super) fn adopt(&mut self, slot: u32, key: Key) {
        self.taken.insert(key, slot);
    }

    /// A found record is done with: its slot is blanked (in place).
    pub(super) fn release(&mut self, slot: u32) {
        if let Err(e) = self.write_slot(slot, "") {
            tracing::warn!(slot, error = %e, "cannot blank a record slot");
        }
        self.free.insert(slot);
    }

    /// Whether the injected disk fault says the disk is full.
    fn disk_full(&self) -> bool {
        self.fault_file.as_ref().and_then(|f| fs::read_to_string(f).ok()).is_some_and(|t| t.trim() == "full")
    }

    /// Writes `text`, padded to [`SLOT_BYTES`], over slot `slot` in place.
    /// Only a slot that does not exist yet (or is short) needs new space;
    /// one this agent wrote or found whole is not looked at first.
    fn write_slot(&mut self, slot: u32, text: &str) -> io::Result<()> {
        let mut bytes = text.as_bytes().to_vec();
        if bytes.len() > SLOT_BYTES {
            return Err(io::Error::other(format!("a record of {} bytes does not fit a slot", bytes.len())));
        }
        bytes.resize(SLOT_BYTES, b' ');
        let path = self.path(slot);
        let grows = !self.sized.contains(&slot) && fs::metadata(&path).map_or(true, |m| m.len() < SLOT_BYTES as u64);
        if grows && self.disk_full() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let f = fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path)?;
        f.write_all_at(&bytes, 0)?;
        self.sized.insert(slot);
        Ok(())
    }

    /// Reserves a slot for an attempt about to start (before its process is
    /// spawned), so that recording it later needs no new space. A slot
    /// already whole is only taken: a `starting` line in it would tell the
    /// agent after this one nothing (no process group to kill or adopt)
    /// that a blank slot does not, and it would cost every task a write.
    pub(super) fn reserve(&mut self, key: Key) -> io::Result<()> {
        let slot = match self.taken.get(&key) {
            Some(&s) => s,
            None => self.claim(),
        };
        if self.sized.contains(&slot) {
            self.taken.insert(key, slot);
            return Ok(());
        }
        match self.write_slot(slot, &format!("key={}-{}-{} starting", key.0, key.1, key.2)) {
            Ok(()) => {
                self.taken.insert(key, slot);
                Ok(())
            }
            Err(e) => {
                self.taken.remove(&key);
                self.free.insert(slot);
                Err(e)
            }
        }
    }

    /// Records a started attempt (in its reserved slot, or a new one).
    pub(super) fn put(&mut self, key: Key, r: &Record) -> io::Result<()> {
        let slot = match self.taken.get(&key) {
            Some(&s) => s,
            None => self.claim(),
        };
        self.taken.insert(key, slot);
        self.write_slot(slot, &format!("key={}-{}-{} {}", key.0, key.1, key.2, r.encode()))
    }

    /// The attempt ended: its slot is emptied for the next.
    pub(super) fn clear(&mut self, key: Key) {
        if let Some(slot) = self.taken.remove(&key) {
            self.release(slot);
        }
    }

    /// The directory (for tests).
    #[cfg(test)]
    pub(super) fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}
