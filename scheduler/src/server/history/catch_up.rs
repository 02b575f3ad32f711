//! The catch-up: every [`CATCH_UP_EVERY`], the records this replica lacks
//! (it skipped them: a snapshot install, a restart) are fetched from a peer.

use std::sync::Arc;

use muster_core::history::JobRecord;
use muster_history::HistoryStore;
use muster_proto::v1;
use muster_proto::v1::history_service_client::HistoryServiceClient;
use tokio::sync::watch;

use super::CATCH_UP_EVERY;
use super::writer::lag;
use crate::server::raft::Consensus;

/// Fetches records this replica lacks from its peers, every
/// [`CATCH_UP_EVERY`], until `stop`; exports the history's size and lag.
pub async fn run_catch_up(
    shared: Consensus,
    store: Arc<HistoryStore>,
    peers: crate::server::raft::network::Network,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CATCH_UP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let s = store.clone();
        let sh = shared.clone();
        let Ok(Ok((stored, missing))) = tokio::task::spawn_blocking(move || lag(&sh, &s)).await else { continue };
        metrics::gauge!("muster_history_records").set(stored as f64);
        metrics::gauge!("muster_history_missing").set(missing as f64);
        if missing == 0 || !shared.reader().records().is_empty() {
            continue; // nothing lacking, or the writer has work still queued
        }
        let total = shared.reader().read(|st| st.finished_total());
        let s = store.clone();
        let Ok(Ok(gaps)) = tokio::task::spawn_blocking(move || s.missing(total, 64)).await else { continue };
        for (first, last) in gaps {
            if let Err(e) = fetch_gap(&shared, &store, &peers, first, last).await {
                tracing::warn!(first, last, error = %e, "job history: no peer could fill a gap yet");
            }
        }
    }
}

/// Asks each other member in turn for records `first..=last` until one
/// answers, and stores them.
async fn fetch_gap(
    shared: &Consensus,
    store: &Arc<HistoryStore>,
    peers: &crate::server::raft::network::Network,
    first: u64,
    last: u64,
) -> Result<(), String> {
    let members: Vec<(u64, String)> = {
        let m = shared.raft().metrics().borrow().clone();
        m.membership_config.membership().nodes().map(|(id, n)| (*id, n.addr.clone())).collect()
    };
    let mut errors = Vec::new();
    let mut from = first;
    'peers: for (id, addr) in members.into_iter().filter(|(id, _)| *id != shared.id()) {
        let channel = peers.channel(&addr).map_err(|e| e.to_string())?;
        let mut client = HistoryServiceClient::new(channel).max_decoding_message_size(64 << 20);
        while from <= last {
            let reply = match client.fetch_records(v1::FetchRecordsRequest { first: from, last }).await {
                Ok(r) => r.into_inner(),
                Err(status) => {
                    errors.push(format!("replica {id}: {}", status.message()));
                    continue 'peers;
                }
            };
            let records: Vec<JobRecord> =
                postcard::from_bytes(&reply.records).map_err(|e| format!("replica {id} sent bad records: {e}"))?;
            if records.is_empty() {
                errors.push(format!("replica {id} lacks them too"));
                continue 'peers;
            }
            from = records.last().expect("non-empty").seq + 1;
            let s = store.clone();
            let n = tokio::task::spawn_blocking(move || s.insert(&records))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            metrics::counter!("muster_history_records_fetched_total").increment(n as u64);
            tracing::info!(from_replica = id, records = n, "job history: fetched records this replica skipped");
        }
        return Ok(());
    }
    Err(errors.join("; "))
}
