//! Every replica made durable whatever it acknowledged: at each simulated
//! power loss, the log entries it had told Raft were on disk were all in
//! its last durable point (the crash image). A replica that acknowledges an
//! entry whose fsync failed, or before its fsync, breaks this on its own,
//! even when the other replicas' copies keep the entry from being lost.

use super::CheckResult;
use crate::chaos::procs::PowerLoss;

/// Checks every power loss of the run.
pub fn acked_entries_durable(losses: &[PowerLoss]) -> CheckResult {
    let violations: Vec<String> = losses
        .iter()
        .filter_map(|l| {
            let (acked, durable) = l.acked_beyond_durable?;
            Some(format!(
                "replica {} had acknowledged log entries up to {acked}, but its disk held only up to {durable}",
                l.replica
            ))
        })
        .collect();
    let checked = format!("{} power losses: each replica had made durable everything it acknowledged", losses.len());
    CheckResult::new("acked_entries_durable", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_entry_missing_from_the_disk_fails() {
        let ok = PowerLoss { replica: 1, acked_beyond_durable: None };
        assert!(acked_entries_durable(&[ok.clone(), ok.clone()]).passed);
        let lied = PowerLoss { replica: 2, acked_beyond_durable: Some((41, 37)) };
        let r = acked_entries_durable(&[ok, lied]);
        assert!(!r.passed, "{}", r.detail);
        assert!(r.detail.contains("replica 2") && r.detail.contains("up to 41") && r.detail.contains("up to 37"));
    }
}
