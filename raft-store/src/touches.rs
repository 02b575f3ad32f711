//! Who to wake after an entry applies: watchers of the keys it touched.
//!
//! The application names the keys each applied batch touched
//! ([`StateMachineApp::take_touched`](crate::StateMachineApp::take_touched);
//! for Muster, node slots). A watcher of key `k` wakes when an entry touched
//! `k`, or when a snapshot replaced the whole state, and never for entries
//! that touched other keys: with 10,000 agent streams, an entry that touches
//! one node wakes one stream. A watch never misses a change made while its
//! holder was busy (it is a counter, not an edge).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The watchers, by key.
#[derive(Debug)]
pub struct Touches {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    keys: BTreeMap<u32, watch::Sender<u64>>,
    all: watch::Sender<u64>,
}

impl Default for Touches {
    fn default() -> Self {
        Touches { inner: Mutex::new(Inner { keys: BTreeMap::new(), all: watch::Sender::new(0) }) }
    }
}

impl Touches {
    /// A watch on `key`.
    pub fn watch(&self, key: u32) -> TouchWatch {
        let mut inner = self.inner.lock().expect("touches lock");
        let key_rx = inner.keys.entry(key).or_insert_with(|| watch::Sender::new(0)).subscribe();
        TouchWatch { key: key_rx, all: inner.all.subscribe() }
    }

    /// Wakes the watchers of `keys`; forgets keys nobody watches any more.
    pub fn touch(&self, keys: &[u32]) {
        if keys.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().expect("touches lock");
        for key in keys {
            if let Some(tx) = inner.keys.get(key) {
                if tx.receiver_count() == 0 {
                    inner.keys.remove(key);
                } else {
                    tx.send_modify(|n| *n += 1);
                }
            }
        }
    }

    /// Wakes every watcher (the whole state changed: a snapshot installed).
    pub fn touch_all(&self) {
        self.inner.lock().expect("touches lock").all.send_modify(|n| *n += 1);
    }

    /// How many keys have a watcher entry.
    pub fn watched(&self) -> usize {
        self.inner.lock().expect("touches lock").keys.len()
    }
}

/// One watcher's view of its key.
#[derive(Debug)]
pub struct TouchWatch {
    key: watch::Receiver<u64>,
    all: watch::Receiver<u64>,
}

impl TouchWatch {
    /// Waits until an entry touched the key (or a snapshot replaced the
    /// state) since the last call. Pending forever once the store is gone.
    pub async fn changed(&mut self) {
        tokio::select! {
            r = self.key.changed() => if r.is_err() { std::future::pending::<()>().await },
            r = self.all.changed() => if r.is_err() { std::future::pending::<()>().await },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn woke(w: &mut TouchWatch) -> bool {
        tokio::time::timeout(Duration::from_secs(1), w.changed()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_touched_keys_wake_and_no_change_is_missed() {
        let t = Touches::default();
        let (mut a, mut b) = (t.watch(1), t.watch(2));
        t.touch(&[1]);
        assert!(woke(&mut a).await, "a touch made before waiting is not missed");
        assert!(!woke(&mut b).await, "another key's touch does not wake");
        assert!(!woke(&mut a).await, "each touch wakes once");
        t.touch_all();
        assert!(woke(&mut a).await && woke(&mut b).await, "a snapshot wakes everyone");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_nobody_watches_are_forgotten() {
        let t = Touches::default();
        let w = t.watch(5);
        assert_eq!(t.watched(), 1);
        drop(w);
        t.touch(&[5]);
        assert_eq!(t.watched(), 0);
    }
}
