//! Every replica made durable whatever it acknowledged: at each simulated
//! power loss, the log entries it had told Raft were on disk were all in
//! its last durable point (the crash image); and after each disk fault,
//! before it restarted, its log read back every entry it had acknowledged.
//! A replica that acknowledges an entry whose fsync or write failed, or
//! before its fsync, breaks this on its own, even when the other replicas'
//! copies keep the entry from being lost.

use super::CheckResult;
use crate::procs::{PowerLoss, Readback};

/// Checks every power loss and every read-back of the run.
pub fn acked_entries_durable(losses: &[PowerLoss], readbacks: &[Readback]) -> CheckResult {
    let mut violations: Vec<String> = losses
        .iter()
        .filter_map(|l| {
            let (acked, durable) = l.acked_beyond_durable?;
            Some(format!(
                "replica {} had acknowledged log entries up to {acked}, but its disk held only up to {durable}",
                l.replica
            ))
        })
        .collect();
    for r in readbacks {
        match &r.acked_beyond_readable {
            Ok(None) => {}
            Ok(Some((acked, readable))) => violations.push(format!(
                "replica {} had acknowledged log entries up to {acked}, but its log read back only up to {readable}",
                r.replica
            )),
            Err(e) => violations.push(format!("replica {}'s log does not read back: {e}", r.replica)),
        }
    }
    let checked = format!(
        "{} power losses and {} read-backs after a disk fault: each replica had made durable, and could read back, everything it acknowledged",
        losses.len(),
        readbacks.len()
    );
    CheckResult::new("acked_entries_durable", violations, checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_entry_missing_from_the_disk_fails() {
        let ok = PowerLoss { replica: 1, acked_beyond_durable: None };
        assert!(acked_entries_durable(&[ok.clone(), ok.clone()], &[]).passed);
        let lied = PowerLoss { replica: 2, acked_beyond_durable: Some((41, 37)) };
        let r = acked_entries_durable(&[ok, lied], &[]);
        assert!(!r.passed, "{}", r.detail);
        assert!(r.detail.contains("replica 2") && r.detail.contains("up to 41") && r.detail.contains("up to 37"));
    }

    #[test]
    fn an_acknowledged_entry_that_does_not_read_back_fails() {
        let back = |replica, found| Readback { replica, acked_beyond_readable: found };
        let r = acked_entries_durable(&[], &[back(1, Ok(None))]);
        assert!(r.passed && r.detail.contains("1 read-backs"), "{}", r.detail);
        let r = acked_entries_durable(&[], &[back(1, Ok(None)), back(3, Ok(Some((90, 61))))]);
        assert!(
            !r.passed && r.detail.contains("replica 3") && r.detail.contains("read back only up to 61"),
            "{}",
            r.detail
        );
        let r = acked_entries_durable(&[], &[back(2, Err("a gap".into()))]);
        assert!(!r.passed && r.detail.contains("does not read back: a gap"), "{}", r.detail);
    }
}
