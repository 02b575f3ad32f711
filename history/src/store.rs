//! Opening the database, storing records, finding gaps, backups.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use muster_core::history::{AttemptRecord, JobRecord};
use muster_core::sm::{AllocStatus, AttemptEnd, AttemptUsage, Resources, WatchdogKind};
use rusqlite::{Connection, OptionalExtension, params};
use thiserror::Error;

/// The schema's version (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 7;

/// The schema, as created.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    seq            INTEGER PRIMARY KEY,   -- order of finishing, the same on every replica
    id             INTEGER NOT NULL UNIQUE,
    owner          TEXT    NOT NULL,
    vcluster       TEXT    NOT NULL,
    class          INTEGER NOT NULL,      -- preemption class 0-10
    priority       INTEGER NOT NULL,
    gang_size      INTEGER NOT NULL,
    gpus           INTEGER NOT NULL,      -- per task
    vram_mb        INTEGER NOT NULL,      -- per GPU
    mem_mb         INTEGER NOT NULL,      -- per task
    cpus           INTEGER NOT NULL,      -- per task
    command        TEXT    NOT NULL,      -- JSON array of strings
    idempotency_key TEXT,                 -- the submit's key; NULL: none
    submit_ms      INTEGER NOT NULL,
    start_ms       INTEGER,               -- first task start; NULL if it never ran
    end_ms         INTEGER NOT NULL,
    status         TEXT    NOT NULL,      -- done | failed | cancelled
    reason         TEXT    NOT NULL,      -- why it failed or was cancelled
    preemptions    INTEGER NOT NULL,
    watchdog_trips INTEGER NOT NULL,
    array_id       INTEGER,               -- a job array's element: its array; NULL: none
    array_index    INTEGER,               -- and its index
    shape          TEXT,                  -- JSON: placement, retries, checkpoint, walltime, deps (replay); NULL: none
    waits          TEXT,                  -- JSON: why it waited, the timeline (alloc explain); NULL: none
    gpu_seconds    INTEGER NOT NULL       -- over all attempts
);
CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs (end_ms);
DROP INDEX IF EXISTS jobs_by_owner;
DROP INDEX IF EXISTS jobs_by_vcluster;
CREATE INDEX IF NOT EXISTS jobs_by_owner_seq ON jobs (owner, seq);
CREATE INDEX IF NOT EXISTS jobs_by_vcluster_seq ON jobs (vcluster, seq);
CREATE INDEX IF NOT EXISTS jobs_by_array_seq ON jobs (array_id, seq);
CREATE TABLE IF NOT EXISTS attempts (
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    task        INTEGER NOT NULL,
    run         INTEGER NOT NULL,         -- MUSTER_ATTEMPT
    node        TEXT    NOT NULL,
    start_ms    INTEGER NOT NULL,
    end_ms      INTEGER NOT NULL,
    outcome     TEXT    NOT NULL,         -- done | failed | oom_killed | stopped | lost | cancelled
    exit_code   INTEGER,                  -- NULL: none (killed by a signal, lost, stopped)
    gpus        INTEGER NOT NULL,
    gpu_seconds INTEGER NOT NULL,
    preempted   INTEGER NOT NULL,         -- 0 | 1
    watchdog    TEXT,                     -- budget | stall | gpu_health
    peak_memory_bytes  INTEGER,           -- from its cgroup; NULL: not reported
    cpu_ms             INTEGER,
    oom_kills          INTEGER,
    memory_limit_bytes INTEGER,           -- 0: none
    gpu_util_pct       INTEGER,           -- mean over its run; NULL: not read (no NVML)
    peak_gpu_memory_bytes INTEGER,        -- NULL: not reported
    PRIMARY KEY (job_id, task, run)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_by_time ON attempts (end_ms, start_ms);
";

/// What can go wrong with the history database.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// SQLite said no.
    #[error("job history {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A stored row that does not decode (the file was edited by hand).
    #[error("job history {path}: a stored record does not decode: {what}")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// A schema from a newer Muster.
    #[error("job history {path}: schema version {found} is newer than this build's {SCHEMA_VERSION}")]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: i64,
    },
}

/// One replica's job history.
pub struct HistoryStore {
    path: PathBuf,
    /// Inserts go through this connection.
    write: Mutex<Connection>,
    /// Queries go through this one (WAL lets them run beside an insert).
    read: Mutex<Connection>,
}

impl HistoryStore {
    /// Opens (creating when missing) the database at `path`.
    pub fn open(path: &Path) -> Result<HistoryStore, HistoryError> {
        let err = |source| HistoryError::Sqlite { path: path.to_path_buf(), source };
        let write = Connection::open(path).map_err(err)?;
        // WAL: readers never block the writer. FULL: every transaction (a
        // batch of records) is on disk when it commits, so a record is never
        // lost to a power cut after the live state may have forgotten its
        // allocation.
        write.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        write.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        write.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        let found: i64 = write.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(err)?;
        if found > SCHEMA_VERSION {
            return Err(HistoryError::NewerSchema { path: path.to_path_buf(), found });
        }
        if found == 1 {
            // Version 1 lacked the idempotency key.
            write.execute_batch("ALTER TABLE jobs ADD COLUMN idempotency_key TEXT").map_err(err)?;
        }
        if (1..=2).contains(&found) {
            // Versions 1 and 2 lacked each attempt's usage.
            write
                .execute_batch(
                    "ALTER TABLE attempts ADD COLUMN peak_memory_bytes INTEGER;
                     ALTER TABLE attempts ADD COLUMN cpu_ms INTEGER;
                     ALTER TABLE attempts ADD COLUMN oom_kills INTEGER;
                     ALTER TABLE attempts ADD COLUMN memory_limit_bytes INTEGER;",
                )
                .map_err(err)?;
        }
        if (1..=3).contains(&found) {
            // Versions 1 to 3 lacked each attempt's GPU usage.
            write
                .execute_batch(
                    "ALTER TABLE attempts ADD COLUMN gpu_util_pct INTEGER;
                     ALTER TABLE attempts ADD COLUMN peak_gpu_memory_bytes INTEGER;",
                )
                .map_err(err)?;
        }
        if (1..=4).contains(&found) {
            // Versions 1 to 4 lacked job arrays.
            write
                .execute_batch(
                    "ALTER TABLE jobs ADD COLUMN array_id INTEGER;
                     ALTER TABLE jobs ADD COLUMN array_index INTEGER;",
                )
                .map_err(err)?;
        }
        if (1..=5).contains(&found) {
            // Versions 1 to 5 lacked each job's shape.
            write.execute_batch("ALTER TABLE jobs ADD COLUMN shape TEXT;").map_err(err)?;
        }
        if (1..=6).contains(&found) {
            // Versions 1 to 6 lacked why each job waited.
            write.execute_batch("ALTER TABLE jobs ADD COLUMN waits TEXT;").map_err(err)?;
        }
        write.execute_batch(SCHEMA).map_err(err)?;
        write.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(err)?;
        let read = Connection::open(path).map_err(err)?;
        read.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        Ok(HistoryStore { path: path.to_path_buf(), write: Mutex::new(write), read: Mutex::new(read) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn sqlite(&self, source: rusqlite::Error) -> HistoryError {
        HistoryError::Sqlite { path: self.path.clone(), source }
    }

    pub(crate) fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.read.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `records` in one transaction; a sequence number already
    /// stored is left as it is. Returns how many were new.
    pub fn insert(&self, records: &[JobRecord]) -> Result<usize, HistoryError> {
        if records.is_empty() {
            return Ok(0);
        }
        let mut conn = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let tx = conn.transaction().map_err(|e| self.sqlite(e))?;
        let mut new = 0;
        {
            let mut job = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO jobs (seq, id, owner, vcluster, class, priority, gang_size, gpus, vram_mb, \
                     mem_mb, cpus, command, submit_ms, start_ms, end_ms, status, reason, preemptions, \
                     watchdog_trips, gpu_seconds, idempotency_key, array_id, array_index, shape, waits) VALUES (?1, ?2, \
                     ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, \
                     ?23, ?24, ?25)",
                )
                .map_err(|e| self.sqlite(e))?;
            let mut attempt = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO attempts (job_id, task, run, node, start_ms, end_ms, outcome, exit_code, \
                     gpus, gpu_seconds, preempted, watchdog, peak_memory_bytes, cpu_ms, oom_kills, memory_limit_bytes, \
                     gpu_util_pct, peak_gpu_memory_bytes) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                )
                .map_err(|e| self.sqlite(e))?;
            for r in records {
                let command = serde_json::to_string(&r.command).expect("strings encode");
                let shape = r.shape.as_ref().map(|s| serde_json::to_string(s).expect("a shape encodes"));
                let waits = (!r.waits.spans.is_empty())
                    .then(|| serde_json::to_string(&r.waits).expect("a wait timeline encodes"));
                let inserted = job
                    .execute(params![
                        r.seq as i64,
                        r.id as i64,
                        r.owner,
                        r.vcluster,
                        r.class,
                        r.priority,
                        r.gang_size,
                        r.resources.gpus,
                        r.resources.vram_mb as i64,
                        r.resources.mem_mb as i64,
                        r.resources.cpus,
                        command,
                        r.submit_ms as i64,
                        r.start_ms.map(|v| v as i64),
                        r.end_ms as i64,
                        r.status.as_str(),
                        r.reason,
                        r.preemptions,
                        r.watchdog_trips,
                        r.gpu_seconds as i64,
                        r.idempotency_key,
                        r.array.map(|(a, _)| a as i64),
                        r.array.map(|(_, i)| i),
                        shape,
                        waits,
                    ])
                    .map_err(|e| self.sqlite(e))?;
                if inserted == 0 {
                    continue;
                }
                new += 1;
                for a in &r.attempts {
                    attempt
                        .execute(params![
                            r.id as i64,
                            a.task,
                            a.run,
                            a.node,
                            a.start_ms as i64,
                            a.end_ms as i64,
                            a.end.as_str(),
                            a.exit_code,
                            r.resources.gpus,
                            a.gpu_seconds as i64,
                            a.preempted,
                            a.watchdog.map(|w| w.as_str()),
                            a.usage.map(|u| u.peak_memory_bytes as i64),
                            a.usage.map(|u| u.cpu_ms as i64),
                            a.usage.map(|u| u.oom_kills),
                            a.usage.map(|u| u.memory_limit_bytes as i64),
                            a.usage.and_then(|u| u.gpu_util_pct),
                            a.usage.map(|u| u.peak_gpu_memory_bytes as i64),
                        ])
                        .map_err(|e| self.sqlite(e))?;
                }
            }
        }
        tx.commit().map_err(|e| self.sqlite(e))?;
        Ok(new)
    }

    /// How many records are stored.
    pub fn count(&self) -> Result<u64, HistoryError> {
        let n: i64 =
            self.reader().query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).map_err(|e| self.sqlite(e))?;
        Ok(n as u64)
    }

    /// The highest sequence number stored (0: none).
    pub fn max_seq(&self) -> Result<u64, HistoryError> {
        let n: Option<i64> =
            self.reader().query_row("SELECT MAX(seq) FROM jobs", [], |r| r.get(0)).map_err(|e| self.sqlite(e))?;
        Ok(n.unwrap_or(0) as u64)
    }

    /// Ranges `[first, last]` of sequence numbers in `1..=upto` not stored,
    /// lowest first, at most `limit` of them.
    pub fn missing(&self, upto: u64, limit: usize) -> Result<Vec<(u64, u64)>, HistoryError> {
        let conn = self.reader();
        let stored: i64 = conn
            .query_row("SELECT COUNT(*) FROM jobs WHERE seq <= ?1", [upto as i64], |r| r.get(0))
            .map_err(|e| self.sqlite(e))?;
        if stored as u64 >= upto {
            return Ok(Vec::new());
        }
        // Each stored seq whose successor is missing starts a gap, which
        // ends just before the next stored seq (or at `upto`).
        let mut gaps = Vec::new();
        let first: Option<i64> = conn
            .query_row("SELECT MIN(seq) FROM jobs WHERE seq <= ?1", [upto as i64], |r| r.get(0))
            .map_err(|e| self.sqlite(e))?;
        match first {
            None => return Ok(vec![(1, upto)]),
            Some(f) if f > 1 => gaps.push((1, f as u64 - 1)),
            Some(_) => {}
        }
        let mut stmt = conn
            .prepare(
                "SELECT a.seq + 1, (SELECT MIN(c.seq) FROM jobs c WHERE c.seq > a.seq) FROM jobs a \
                 WHERE a.seq < ?1 AND NOT EXISTS (SELECT 1 FROM jobs b WHERE b.seq = a.seq + 1) ORDER BY a.seq LIMIT ?2",
            )
            .map_err(|e| self.sqlite(e))?;
        let rows = stmt
            .query_map(params![upto as i64, limit as i64], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?)))
            .map_err(|e| self.sqlite(e))?;
        for row in rows {
            let (start, next) = row.map_err(|e| self.sqlite(e))?;
            let end = next.map_or(upto, |n| (n as u64 - 1).min(upto));
            gaps.push((start as u64, end));
        }
        gaps.truncate(limit);
        Ok(gaps)
    }

    /// The records with sequence numbers in `first..=last`, at most `limit`.
    pub fn by_seq(&self, first: u64, last: u64, limit: usize) -> Result<Vec<JobRecord>, HistoryError> {
        self.select(
            "WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq LIMIT ?3",
            params![first as i64, last as i64, limit as i64],
        )
    }

    /// Writes a consistent copy of the whole database to `dest` (which must
    /// not exist), while inserts go on.
    pub fn backup_to(&self, dest: &Path) -> Result<(), HistoryError> {
        let conn = self.reader();
        conn.execute("VACUUM INTO ?1", [dest.to_string_lossy()]).map_err(|e| self.sqlite(e))?;
        Ok(())
    }

    /// Copies the database at `src` to `dest` without writing to `src`
    /// (opened read-only, so a replica's live database, or one on a
    /// read-only mount, can be read offline as of one moment).
    pub fn copy_read_only(src: &Path, dest: &Path) -> Result<(), HistoryError> {
        let err = |source| HistoryError::Sqlite { path: src.to_path_buf(), source };
        let conn = Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        conn.execute("VACUUM INTO ?1", [dest.to_string_lossy()]).map_err(err)?;
        Ok(())
    }

    /// Stores every record of another history database (a backup), keeping
    /// what is already here. Returns how many were new.
    pub fn merge_from(&self, other: &Path) -> Result<usize, HistoryError> {
        let theirs = HistoryStore::open(other)?;
        let mut new = 0;
        let mut after = 0u64;
        loop {
            let page = theirs.by_seq(after + 1, u64::MAX >> 1, 10_000)?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            new += self.insert(&page)?;
        }
        Ok(new)
    }

    /// Runs `SELECT <job columns> FROM jobs <tail>` and loads each record's
    /// attempts.
    pub(crate) fn select(&self, tail: &str, args: impl rusqlite::Params) -> Result<Vec<JobRecord>, HistoryError> {
        let conn = self.reader();
        let sql = format!(
            "SELECT seq, id, owner, vcluster, class, priority, gang_size, gpus, vram_mb, mem_mb, cpus, command, \
             submit_ms, start_ms, end_ms, status, reason, preemptions, watchdog_trips, gpu_seconds, idempotency_key, \
             array_id, array_index, shape, waits FROM jobs {tail}"
        );
        let mut stmt = conn.prepare_cached(&sql).map_err(|e| self.sqlite(e))?;
        let rows = stmt
            .query_map(args, |r| {
                Ok(JobRow {
                    seq: r.get::<_, i64>(0)? as u64,
                    id: r.get::<_, i64>(1)? as u64,
                    owner: r.get(2)?,
                    vcluster: r.get(3)?,
                    class: r.get(4)?,
                    priority: r.get(5)?,
                    gang_size: r.get(6)?,
                    resources: Resources {
                        gpus: r.get(7)?,
                        vram_mb: r.get::<_, i64>(8)? as u64,
                        mem_mb: r.get::<_, i64>(9)? as u64,
                        cpus: r.get(10)?,
                    },
                    command: r.get(11)?,
                    submit_ms: r.get::<_, i64>(12)? as u64,
                    start_ms: r.get::<_, Option<i64>>(13)?.map(|v| v as u64),
                    end_ms: r.get::<_, i64>(14)? as u64,
                    status: r.get(15)?,
                    reason: r.get(16)?,
                    preemptions: r.get(17)?,
                    watchdog_trips: r.get(18)?,
                    gpu_seconds: r.get::<_, i64>(19)? as u64,
                    idempotency_key: r.get(20)?,
                    array: match (r.get::<_, Option<i64>>(21)?, r.get::<_, Option<u32>>(22)?) {
                        (Some(a), Some(i)) => Some((a as u64, i)),
                        _ => None,
                    },
                    shape: r.get(23)?,
                    waits: r.get(24)?,
                })
            })
            .map_err(|e| self.sqlite(e))?;
        let mut jobs = Vec::new();
        for row in rows {
            jobs.push(row.map_err(|e| self.sqlite(e))?);
        }
        drop(stmt);
        let mut attempts = conn
            .prepare_cached(
                "SELECT task, run, node, start_ms, end_ms, outcome, exit_code, gpu_seconds, preempted, watchdog, \
                 peak_memory_bytes, cpu_ms, oom_kills, memory_limit_bytes, gpu_util_pct, peak_gpu_memory_bytes \
                 FROM attempts WHERE job_id = ?1 ORDER BY task, run",
            )
            .map_err(|e| self.sqlite(e))?;
        let mut out = Vec::with_capacity(jobs.len());
        for j in jobs {
            let rows = attempts
                .query_map([j.id as i64], |r| {
                    Ok((
                        r.get::<_, u32>(0)?,
                        r.get::<_, u32>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)? as u64,
                        r.get::<_, i64>(4)? as u64,
                        r.get::<_, String>(5)?,
                        r.get::<_, Option<i32>>(6)?,
                        r.get::<_, i64>(7)? as u64,
                        r.get::<_, bool>(8)?,
                        r.get::<_, Option<String>>(9)?,
                        (
                            r.get::<_, Option<i64>>(10)?,
                            r.get::<_, Option<i64>>(11)?,
                            r.get::<_, Option<u32>>(12)?,
                            r.get::<_, Option<i64>>(13)?,
                            r.get::<_, Option<u32>>(14)?,
                            r.get::<_, Option<i64>>(15)?,
                        ),
                    ))
                })
                .map_err(|e| self.sqlite(e))?;
            let mut list = Vec::new();
            for row in rows {
                let (task, run, node, start_ms, end_ms, outcome, exit_code, gpu_seconds, preempted, watchdog, used) =
                    row.map_err(|e| self.sqlite(e))?;
                let usage = match used {
                    (Some(peak), Some(cpu), Some(oom), Some(limit), gpu_util_pct, gpu_peak) => Some(AttemptUsage {
                        peak_memory_bytes: peak as u64,
                        cpu_ms: cpu as u64,
                        oom_kills: oom,
                        memory_limit_bytes: limit as u64,
                        gpu_util_pct,
                        peak_gpu_memory_bytes: gpu_peak.unwrap_or(0) as u64,
                    }),
                    _ => None,
                };
                let end = AttemptEnd::parse(&outcome).ok_or_else(|| self.corrupt(format!("outcome {outcome:?}")))?;
                let watchdog = match watchdog {
                    None => None,
                    Some(w) => Some(WatchdogKind::parse(&w).ok_or_else(|| self.corrupt(format!("watchdog {w:?}")))?),
                };
                list.push(AttemptRecord {
                    task,
                    run,
                    node,
                    start_ms,
                    end_ms,
                    end,
                    exit_code,
                    gpu_seconds,
                    preempted,
                    watchdog,
                    usage,
                });
            }
            out.push(j.into_record(list).map_err(|what| self.corrupt(what))?);
        }
        Ok(out)
    }

    fn corrupt(&self, what: String) -> HistoryError {
        HistoryError::Corrupt { path: self.path.clone(), what }
    }

    /// Whether a record with allocation id `id` is stored.
    pub fn has_id(&self, id: u64) -> Result<bool, HistoryError> {
        let found: Option<i64> = self
            .reader()
            .query_row("SELECT seq FROM jobs WHERE id = ?1", [id as i64], |r| r.get(0))
            .optional()
            .map_err(|e| self.sqlite(e))?;
        Ok(found.is_some())
    }
}

/// A `jobs` row before its attempts are attached.
struct JobRow {
    seq: u64,
    id: u64,
    owner: String,
    vcluster: String,
    class: u8,
    priority: i32,
    gang_size: u32,
    resources: Resources,
    command: String,
    submit_ms: u64,
    start_ms: Option<u64>,
    end_ms: u64,
    status: String,
    reason: String,
    preemptions: u32,
    watchdog_trips: u32,
    gpu_seconds: u64,
    idempotency_key: Option<String>,
    array: Option<(u64, u32)>,
    shape: Option<String>,
    waits: Option<String>,
}

impl JobRow {
    fn into_record(self, attempts: Vec<AttemptRecord>) -> Result<JobRecord, String> {
        let status = AllocStatus::parse(&self.status).ok_or_else(|| format!("status {:?}", self.status))?;
        let command: Vec<String> =
            serde_json::from_str(&self.command).map_err(|e| format!("command {:?}: {e}", self.command))?;
        let shape = match &self.shape {
            None => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|e| format!("shape {text:?}: {e}"))?),
        };
        let waits = match &self.waits {
            None => Default::default(),
            Some(text) => serde_json::from_str(text).map_err(|e| format!("waits {text:?}: {e}"))?,
        };
        Ok(JobRecord {
            seq: self.seq,
            id: self.id,
            owner: self.owner,
            vcluster: self.vcluster,
            class: self.class,
            priority: self.priority,
            gang_size: self.gang_size,
            resources: self.resources,
            command,
            idempotency_key: self.idempotency_key,
            submit_ms: self.submit_ms,
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            status,
            reason: self.reason,
            preemptions: self.preemptions,
            watchdog_trips: self.watchdog_trips,
            gpu_seconds: self.gpu_seconds,
            attempts,
            array: self.array,
            shape,
            waits,
        })
    }
}
