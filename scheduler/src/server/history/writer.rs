//! The writer: stores the records applied entries leave in the replica's
//! history database, as they come.

use std::sync::Arc;

use muster_history::HistoryStore;
use tokio::sync::watch;

use crate::server::raft::Consensus;

/// Stores what applied entries leave, until `stop`.
pub async fn run_writer(shared: Consensus, store: Arc<HistoryStore>, mut stop: watch::Receiver<bool>) {
    loop {
        let records = shared.reader().records().take();
        if !records.is_empty() {
            let n = records.len();
            let s = store.clone();
            match tokio::task::spawn_blocking(move || s.insert(&records)).await {
                Ok(Ok(new)) => {
                    metrics::counter!("muster_history_records_written_total").increment(new as u64);
                    tracing::debug!(offered = n, new, "job history: records stored");
                }
                Ok(Err(e)) => {
                    // The records are derived from the log: the catch-up
                    // fetches them again once the store works.
                    metrics::counter!("muster_history_write_errors_total").increment(1);
                    tracing::error!(error = %e, records = n, "job history: cannot store records");
                }
                Err(e) => tracing::error!(error = %e, "job history: the writer task failed"),
            }
            continue;
        }
        tokio::select! {
            _ = shared.reader().records().ready() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// What this replica holds of the history, and what it lacks.
pub fn lag(shared: &Consensus, store: &HistoryStore) -> Result<(u64, u64), muster_history::HistoryError> {
    let total = shared.reader().read(|st| st.finished_total());
    let stored = store.count()?;
    Ok((stored, total.saturating_sub(stored)))
}
