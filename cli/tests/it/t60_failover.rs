//! Process-level failover: three `muster server` processes, continuous
//! submits with idempotency keys, the leader killed with SIGKILL and
//! restarted three times. Nothing acknowledged is lost or duplicated, and
//! every replica ends at the same applied index and digest.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use crate::cluster::{Client, Cluster, converged, leader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_killing_the_leader_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshot often so restarts also exercise snapshot + log replay.
    let mut cluster = Cluster::start(dir.path(), &["--snapshot-every", "40"]);
    leader(&cluster.addrs, None).await;

    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let submitter = {
        let (acked, stop, addrs) = (acked.clone(), stop.clone(), cluster.addrs.clone());
        tokio::spawn(async move {
            let mut client = Client::new(&addrs);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{i:05}");
                let id = client.submit_until_acked(&key).await;
                acked.lock().await.insert(key, id);
                i += 1;
            }
        })
    };

    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let old = leader(&cluster.addrs, None).await;
        let before = acked.lock().await.len();
        cluster.kill(old);
        let new = leader(&cluster.addrs, Some(old)).await;
        eprintln!("round {round}: killed leader {old} after {before} acks; replica {new} leads");
        cluster.spawn(old);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    submitter.await.unwrap();

    let acked = acked.lock().await.clone();
    assert!(acked.len() > 20, "the submitter made progress through the kills: {} acks", acked.len());
    let (index, digest) = converged(&cluster.addrs).await;
    eprintln!("converged at index {index}, digest {digest}");

    let all = Client::new(&cluster.addrs).list_all().await;
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for a in &all {
        by_key.entry(a.spec.clone().unwrap().idempotency_key).or_default().push(a.id);
    }
    for (key, id) in &acked {
        assert_eq!(
            by_key.get(key),
            Some(&vec![*id]),
            "acknowledged {key} -> {id} lost or duplicated\n{}",
            cluster.logs()
        );
    }
    assert_eq!(all.len(), acked.len(), "no allocation that was never acknowledged");
}
