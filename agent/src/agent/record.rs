//! The on-disk record of a started attempt (`WORK_DIR/running/<alloc>-<task>-<epoch>`), for the agent after this one.

use super::*;

/// What `running/<alloc>-<task>-<epoch>` says about a started attempt, for
/// the agent after this one: `pgid=… attempt=… gpus=0,1 walltime_s=…
/// stall_s=… gpu_health=0|1 started_ms=…` (an old record holds the pgid
/// alone).
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
}

impl Record {
    pub(super) fn encode(&self) -> String {
        let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        format!(
            "pgid={} attempt={} gpus={} walltime_s={} stall_s={} gpu_health={} started_ms={} checkpointing={}\n",
            self.pgid,
            self.attempt,
            gpus.join(","),
            self.walltime_s,
            self.stall_s,
            u8::from(self.gpu_health),
            self.started_ms,
            u8::from(self.checkpointing)
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
