//! What applied entries leave for the shell to store outside the state
//! ([`StateMachineApp::take_records`](crate::StateMachineApp::take_records);
//! for Muster, job-history records): a queue with one consumer, which
//! waits on [`Records::ready`] and drains with [`Records::take`]. A record
//! pushed while the consumer is busy is never missed.

use std::sync::Mutex;

use tokio::sync::Notify;

/// The queue.
#[derive(Debug)]
pub struct Records<R> {
    queue: Mutex<Vec<R>>,
    ready: Notify,
}

impl<R> Default for Records<R> {
    fn default() -> Self {
        Records { queue: Mutex::new(Vec::new()), ready: Notify::new() }
    }
}

impl<R> Records<R> {
    /// Appends `records` and wakes the consumer.
    pub fn push(&self, records: Vec<R>) {
        if records.is_empty() {
            return;
        }
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).extend(records);
        self.ready.notify_one();
    }

    /// Everything queued, oldest first.
    pub fn take(&self) -> Vec<R> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many records wait.
    pub fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Returns once something was pushed since the last wait returned (at
    /// once if it was pushed before this call).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_push_before_the_wait_is_not_missed_and_take_drains_in_order() {
        let r = Records::default();
        r.push(vec![1, 2]);
        r.push(Vec::new());
        r.push(vec![3]);
        tokio::time::timeout(std::time::Duration::from_secs(5), r.ready()).await.expect("woken");
        assert_eq!(r.len(), 3);
        assert_eq!(r.take(), vec![1, 2, 3]);
        assert!(r.is_empty());
    }
}
