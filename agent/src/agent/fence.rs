//! Self-fencing: an agent cut off from every leader stops its tasks before
//! a leader can place them again elsewhere, so that no task runs twice.
//!
//! A leader marks a node lost, and fails its tasks over to other nodes, once
//! it has heard nothing from the node for its `node_lost_after` window (the
//! leader says how long in `Registered`). Whatever the agent sent that a
//! leader then answered — a heartbeat, or its `Register` — reached that
//! leader no earlier than it was sent, so the agent counts from the send
//! time of the last answered message and errs on the safe side:
//!
//! ```text
//!   sent ──▶ answered ── silence ── sent + ½ window: SIGTERM every task
//!                                   sent + ¾ window: SIGKILL what is left
//!                                   sent + 1 window: the earliest any leader may fail them over
//! ```
//!
//! The price: a control plane that no agent can reach for half the window
//! (30 s by default, so 15 s) stops the work of every node it cannot reach;
//! the leader fails those tasks over when it is back, as it would anyway.
//! `muster agent --keep-running-when-cut-off` keeps tasks running instead,
//! for sites that prefer that and accept that a partitioned node's tasks
//! may run twice.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The window assumed until a leader says (the server's default).
pub(super) const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// What the agent knows of the leader's patience.
#[derive(Debug)]
pub(super) struct Fence {
    enabled: bool,
    /// The leader's `node_lost_after`.
    window: Duration,
    /// When the last message a leader answered was sent.
    answered_sent: Instant,
    /// Send times of heartbeats not answered yet, oldest first (a stream
    /// answers in order).
    unanswered: VecDeque<Instant>,
    /// The tasks were stopped since the last answer.
    fenced: bool,
}

impl Fence {
    /// A fence that counts from `now` (the agent's start), or that never
    /// fires when `enabled` is false.
    pub(super) fn new(enabled: bool, now: Instant) -> Fence {
        Fence { enabled, window: DEFAULT_WINDOW, answered_sent: now, unanswered: VecDeque::new(), fenced: false }
    }

    /// A leader accepted the `Register` sent at `sent`, and fails a silent
    /// node over after `window_ms` (0: it did not say).
    pub(super) fn registered(&mut self, sent: Instant, window_ms: u32) {
        if window_ms > 0 {
            self.window = Duration::from_millis(u64::from(window_ms));
        }
        self.answered(sent);
    }

    /// A heartbeat went out at `at`.
    pub(super) fn heartbeat_sent(&mut self, at: Instant) {
        self.unanswered.push_back(at);
    }

    /// The leader answered the oldest heartbeat outstanding.
    pub(super) fn heartbeat_answered(&mut self) {
        if let Some(sent) = self.unanswered.pop_front() {
            self.answered(sent);
        }
    }

    fn answered(&mut self, sent: Instant) {
        if sent > self.answered_sent {
            self.answered_sent = sent;
            self.fenced = false;
        }
    }

    /// The stream ended: what it carried will never be answered.
    pub(super) fn stream_ended(&mut self) {
        self.unanswered.clear();
    }

    /// When the tasks must be stopped, unless a leader answers first;
    /// `None` when fencing is off or already done.
    pub(super) fn due(&self) -> Option<Instant> {
        (self.enabled && !self.fenced).then(|| self.answered_sent + self.window / 2)
    }

    /// How long a stopped task gets between SIGTERM and SIGKILL: all are
    /// dead three quarters into the window.
    pub(super) fn grace(&self) -> Duration {
        self.window / 4
    }

    /// The tasks were stopped; nothing more until a leader answers again.
    pub(super) fn fenced(&mut self) {
        self.fenced = true;
    }

    /// How long since a leader last answered something sent at `now`.
    pub(super) fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.answered_sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_counts_from_the_send_time_of_the_last_answered_message() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut f = Fence::new(true, t0);
        assert_eq!(f.due(), Some(t0 + ms(15_000)), "the default window until a leader says");
        f.registered(t0 + ms(100), 8_000);
        assert_eq!(f.due(), Some(t0 + ms(4_100)));
        assert_eq!(f.grace(), ms(2_000));
        f.heartbeat_sent(t0 + ms(500));
        f.heartbeat_sent(t0 + ms(1_000));
        // The first answer is for the first heartbeat, however late it comes.
        f.heartbeat_answered();
        assert_eq!(f.due(), Some(t0 + ms(4_500)));
        f.stream_ended();
        f.heartbeat_answered();
        assert_eq!(f.due(), Some(t0 + ms(4_500)), "a lost stream's heartbeats are never answered");
        f.fenced();
        assert_eq!(f.due(), None, "once fenced, nothing more to do");
        f.heartbeat_sent(t0 + ms(9_000));
        f.heartbeat_answered();
        assert_eq!(f.due(), Some(t0 + ms(13_000)), "an answer re-arms it");
        assert_eq!(f.silent_for(t0 + ms(10_000)), ms(1_000));
    }

    #[test]
    fn an_older_answer_never_moves_the_fence_back_and_off_means_never() {
        let t0 = Instant::now();
        let mut f = Fence::new(true, t0);
        f.registered(t0 + Duration::from_secs(5), 0);
        f.registered(t0 + Duration::from_secs(2), 0);
        assert_eq!(f.due(), Some(t0 + Duration::from_secs(20)));
        assert_eq!(Fence::new(false, t0).due(), None);
    }
}
