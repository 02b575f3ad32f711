//! What `muster history` and `muster usage` ask of the database.

use std::collections::BTreeMap;

use muster_core::history::JobRecord;
use muster_core::sm::AllocStatus;
use rusqlite::types::Value;

use crate::store::{HistoryError, HistoryStore};

/// Which records `list` returns: every condition given must hold. Records
/// come in the order they finished.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this allocation.
    pub id: Option<u64>,
    /// Only this owner's.
    pub owner: Option<String>,
    /// Only this vCluster's.
    pub vcluster: Option<String>,
    /// Only this job array's elements.
    pub array: Option<u64>,
    /// Only those that ended so.
    pub status: Option<AllocStatus>,
    /// Only those that ended at or after this time, ms.
    pub since_ms: Option<u64>,
    /// Only those that ended before this time, ms.
    pub until_ms: Option<u64>,
    /// Only those with a higher sequence number (paging).
    pub after_seq: u64,
    /// At most this many.
    pub limit: u32,
}

/// How `usage` groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// One row per owner.
    Owner,
    /// One row per vCluster.
    VCluster,
    /// One row per owner and vCluster.
    OwnerAndVCluster,
    /// One row per job array (with its owner); allocations of no array
    /// make one row per owner, array 0.
    Array,
}

/// One row of a usage report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageRow {
    /// The owner (empty when grouped by vCluster alone).
    pub owner: String,
    /// The vCluster (empty when grouped by owner alone).
    pub vcluster: String,
    /// The job array (grouped by array; 0: allocations of no array).
    pub array: u64,
    /// Allocations that finished in the period.
    pub jobs: u64,
    /// Of those, done.
    pub done: u64,
    /// Of those, failed.
    pub failed: u64,
    /// Of those, cancelled.
    pub cancelled: u64,
    /// GPU-seconds of finished allocations' attempts within the period
    /// (an attempt that straddles an end of the period counts its part).
    pub gpu_seconds: u64,
    /// CPU-milliseconds of those attempts, counted the same way (each
    /// attempt's CPU time spread evenly over its run), from their cgroups.
    pub cpu_ms: u64,
    /// The most memory any of those attempts held at once, bytes.
    pub peak_memory_bytes: u64,
    /// Those attempts the kernel killed for going over their memory limit.
    pub oom_killed: u64,
}

impl HistoryStore {
    /// The sequence numbers of the records that ended in `[since, until)`, as
    /// `(after, last)`: records finish in entry-time order, so a time range
    /// is a range of `seq` (found on the `end_ms` index) and every filter
    /// below becomes a range scan of an index ordered by `seq`.
    fn seq_range(&self, since_ms: Option<u64>, until_ms: Option<u64>) -> Result<(u64, u64), HistoryError> {
        let conn = self.reader();
        let after = match since_ms {
            None => 0,
            Some(since) => conn
                .query_row("SELECT MIN(seq) FROM jobs WHERE end_ms >= ?1", [since as i64], |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .map_err(|e| self.sqlite(e))?
                .map_or(u64::MAX >> 1, |s| s as u64 - 1),
        };
        let last = match until_ms {
            None => u64::MAX >> 1,
            Some(until) => conn
                .query_row("SELECT MAX(seq) FROM jobs WHERE end_ms < ?1", [until as i64], |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .map_err(|e| self.sqlite(e))?
                .map_or(0, |s| s as u64),
        };
        Ok((after, last))
    }

    /// The records `f` selects.
    pub fn list(&self, f: &Filter) -> Result<Vec<JobRecord>, HistoryError> {
        let (after, last) = self.seq_range(f.since_ms, f.until_ms)?;
        let mut cond = vec!["seq > ?".to_string(), "seq <= ?".to_string()];
        let mut args: Vec<Value> = vec![Value::Integer(f.after_seq.max(after) as i64), Value::Integer(last as i64)];
        if let Some(id) = f.id {
            cond.push("id = ?".into());
            args.push(Value::Integer(id as i64));
        }
        if let Some(owner) = &f.owner {
            cond.push("owner = ?".into());
            args.push(Value::Text(owner.clone()));
        }
        if let Some(vc) = &f.vcluster {
            cond.push("vcluster = ?".into());
            args.push(Value::Text(vc.clone()));
        }
        if let Some(array) = f.array {
            cond.push("array_id = ?".into());
            args.push(Value::Integer(array as i64));
        }
        if let Some(status) = f.status {
            cond.push("status = ?".into());
            args.push(Value::Text(status.as_str().into()));
        }
        if let Some(since) = f.since_ms {
            cond.push("end_ms >= ?".into());
            args.push(Value::Integer(since as i64));
        }
        if let Some(until) = f.until_ms {
            cond.push("end_ms < ?".into());
            args.push(Value::Integer(until as i64));
        }
        args.push(Value::Integer(i64::from(f.limit)));
        let tail = format!("WHERE {} ORDER BY seq LIMIT ?", cond.join(" AND "));
        self.select(&tail, rusqlite::params_from_iter(args))
    }

    /// GPU-seconds and job counts per group over `[since_ms, until_ms)`.
    pub fn usage(&self, since_ms: u64, until_ms: u64, group: Group) -> Result<Vec<UsageRow>, HistoryError> {
        let (key, names) = match group {
            Group::Owner => ("j.owner, '', 0", "j.owner"),
            Group::VCluster => ("'', j.vcluster, 0", "j.vcluster"),
            Group::OwnerAndVCluster => ("j.owner, j.vcluster, 0", "j.owner, j.vcluster"),
            Group::Array => ("j.owner, '', COALESCE(j.array_id, 0)", "j.owner, COALESCE(j.array_id, 0)"),
        };
        let conn = self.reader();
        let mut rows: BTreeMap<(String, String, u64), UsageRow> = BTreeMap::new();
        let counts = format!(
            "SELECT {key}, COUNT(*), SUM(j.status = 'done'), SUM(j.status = 'failed'), SUM(j.status = 'cancelled') \
             FROM jobs j WHERE j.end_ms >= ?1 AND j.end_ms < ?2 GROUP BY {names}"
        );
        let mut stmt = conn.prepare(&counts).map_err(|e| self.sqlite(e))?;
        let it = stmt
            .query_map([since_ms as i64, until_ms as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)? as u64,
                    [r.get::<_, i64>(3)?, r.get(4)?, r.get(5)?, r.get(6)?],
                ))
            })
            .map_err(|e| self.sqlite(e))?;
        for row in it {
            let (owner, vcluster, array, [jobs, done, failed, cancelled]) = row.map_err(|e| self.sqlite(e))?;
            let r = rows.entry((owner.clone(), vcluster.clone(), array)).or_insert(UsageRow {
                owner,
                vcluster,
                array,
                ..Default::default()
            });
            (r.jobs, r.done, r.failed, r.cancelled) = (jobs as u64, done as u64, failed as u64, cancelled as u64);
        }
        drop(stmt);
        let gpu = format!(
            "SELECT {key}, SUM(a.gpus * MAX(0, MIN(a.end_ms, ?2) - MAX(a.start_ms, ?1))) / 1000, \
             SUM(COALESCE(a.cpu_ms, 0) * MAX(0, MIN(a.end_ms, ?2) - MAX(a.start_ms, ?1)) \
                 / MAX(1, a.end_ms - a.start_ms)), \
             MAX(COALESCE(a.peak_memory_bytes, 0)), SUM(a.outcome = 'oom_killed') \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.end_ms > ?1 AND a.start_ms < ?2 GROUP BY {names}"
        );
        let mut stmt = conn.prepare(&gpu).map_err(|e| self.sqlite(e))?;
        let it = stmt
            .query_map([since_ms as i64, until_ms as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)? as u64,
                    [r.get::<_, i64>(3)?, r.get(4)?, r.get(5)?, r.get(6)?],
                ))
            })
            .map_err(|e| self.sqlite(e))?;
        for row in it {
            let (owner, vcluster, array, [gpu_s, cpu_ms, peak, ooms]) = row.map_err(|e| self.sqlite(e))?;
            let r = rows.entry((owner.clone(), vcluster.clone(), array)).or_insert(UsageRow {
                owner,
                vcluster,
                array,
                ..Default::default()
            });
            r.gpu_seconds = gpu_s as u64;
            r.cpu_ms = cpu_ms as u64;
            r.peak_memory_bytes = peak as u64;
            r.oom_killed = ooms as u64;
        }
        Ok(rows.into_values().collect())
    }
}
