//! Every committed entry is small: checkpoint bytes never travel through
//! the log (a manifest is a few hundred bytes), and the proposer closes a
//! batch before it passes the entry limit. The detail names the largest
//! entry of the run.

use muster_core::sm::Command;

use super::{CheckResult, ReplicaLog};

/// The most an entry's commands may take, encoded: the proposer's limit
/// (`MAX_ENTRY_BYTES`, 1 MiB) plus the batch's framing.
pub const ENTRY_LIMIT_BYTES: usize = (1 << 20) + 64;

/// Checks the size of every entry in the replicas' applied logs.
pub fn log_entries_bounded(logs: &[ReplicaLog]) -> CheckResult {
    let mut largest = (0usize, 0u64);
    let mut entries = 0usize;
    let mut violations = Vec::new();
    // Replicas hold the same committed entries: the first log that has
    // any says it for all.
    if let Some(log) = logs.iter().find(|l| !l.records.is_empty()) {
        for r in &log.records {
            let Some(batch) = &r.batch else { continue };
            entries += 1;
            let bytes = muster_raft_store::codec::encode::<muster_raft_store::CommandBatch<Command>>(batch)
                .map_or(0, |b| b.len());
            if bytes > largest.0 {
                largest = (bytes, r.index);
            }
            if bytes > ENTRY_LIMIT_BYTES {
                violations.push(format!("entry {} of replica {} is {bytes} bytes", r.index, log.replica));
            }
        }
    }
    let checked = format!("{entries} entries; the largest, index {}, is {} bytes", largest.1, largest.0);
    CheckResult::new("log_entries_bounded", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_core::sm::NodeId;
    use muster_raft_store::{AppliedRecord, CommandBatch};

    fn log(reasons: &[usize]) -> ReplicaLog {
        let records = reasons
            .iter()
            .enumerate()
            .map(|(i, &n)| AppliedRecord {
                index: i as u64 + 1,
                term: 1,
                batch: Some(CommandBatch {
                    time_ms: 0,
                    commands: vec![Command::FailTaskToStart {
                        alloc: 1,
                        task: 0,
                        node: NodeId::new("n"),
                        epoch: 1,
                        reason: "r".repeat(n),
                    }],
                }),
            })
            .collect();
        ReplicaLog { replica: 1, records }
    }

    #[test]
    fn an_entry_over_the_limit_fails_and_the_largest_is_named() {
        let r = log_entries_bounded(&[log(&[10, 1000])]);
        assert!(r.passed && r.detail.contains("2 entries; the largest, index 2"), "{}", r.detail);
        let r = log_entries_bounded(&[log(&[10, 2 << 20])]);
        assert!(!r.passed && r.detail.contains("entry 2 of replica 1"), "{}", r.detail);
    }
}
