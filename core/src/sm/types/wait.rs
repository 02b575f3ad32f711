//! Why an allocation waited: a short, bounded timeline of the changes of
//! its wait, kept in the allocation (and in its history record once it
//! finishes), for `muster alloc explain` on live, finished and forgotten
//! allocations.
//!
//! `apply` records the changes it sees itself (submitted, placed, requeued,
//! preempting, waiting for dependencies, ended); the leader's admission
//! pass names the rest (quota, capacity, constraint, ports, packing, a
//! planned start, a drain, a back-off) with a `NoteWaits` entry, only when a
//! gang's reason changes.

use serde::{Deserialize, Serialize};

use super::AllocId;

/// Most spans an allocation keeps. Past it, the oldest after the first (its
/// submit) are dropped and counted.
pub const MAX_WAIT_SPANS: usize = 32;

/// Most holders one span names.
pub const MAX_WAIT_HOLDERS: usize = 4;

/// Most notes one `NoteWaits` entry carries (and one admission pass makes).
pub const MAX_WAIT_NOTES: usize = 256;

/// Most bytes of a holder's owner kept in a span (longer ones are cut at a
/// character boundary).
pub const MAX_WAIT_OWNER_BYTES: usize = 64;

/// A gang's reason changes at most this often (entry time), ms: a reason
/// that flips every pass costs one note a second, not one per pass.
pub const MIN_WAIT_NOTE_GAP_MS: u64 = 1_000;

/// Where an allocation's wait stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Wait {
    /// Queued (submitted, or back in the queue); admission has not named a
    /// reason yet.
    Queued,
    /// Its vCluster's hard quota is used up (holders: its vCluster's
    /// largest running allocations).
    Quota,
    /// No room on the nodes it may use (holders: what runs on the nodes its
    /// planned start waits for, or the gang planned ahead of it).
    Capacity,
    /// Too few nodes match its placement or could ever hold one of its
    /// tasks.
    Constraint,
    /// Room, but no node with the rendezvous ports it asks for free.
    Ports,
    /// Room, but no single value of its packing label has room for the
    /// whole gang.
    Packing,
    /// Room only on nodes a higher-ranked gang's planned start needs before
    /// its walltime would end (holder: that gang).
    PlannedStart,
    /// Enough nodes could take it, but some are draining or out of service
    /// (stopped, lost, not yet registered).
    Drain,
    /// Backing off after a failure.
    Backoff,
    /// Waiting for its dependencies (holders: what it waits for).
    Dependency,
    /// Preempting others: waiting for its victims to stop (holders: the
    /// victims).
    Preempting,
    /// Placed: the wait is over (until it is queued again).
    Placed,
    /// Finished, failed or cancelled.
    Ended,
}

impl Wait {
    /// Its name, as the CLI and the API show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Wait::Queued => "queued",
            Wait::Quota => "quota",
            Wait::Capacity => "capacity",
            Wait::Constraint => "constraint",
            Wait::Ports => "ports",
            Wait::Packing => "packing",
            Wait::PlannedStart => "planned_start",
            Wait::Drain => "drain",
            Wait::Backoff => "backoff",
            Wait::Dependency => "dependency",
            Wait::Preempting => "preempting",
            Wait::Placed => "placed",
            Wait::Ended => "ended",
        }
    }

    /// Parses [`Wait::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Wait> {
        Wait::ALL.iter().copied().find(|w| w.as_str() == s)
    }

    /// Every value, in declaration order.
    pub const ALL: [Wait; 13] = [
        Wait::Queued,
        Wait::Quota,
        Wait::Capacity,
        Wait::Constraint,
        Wait::Ports,
        Wait::Packing,
        Wait::PlannedStart,
        Wait::Drain,
        Wait::Backoff,
        Wait::Dependency,
        Wait::Preempting,
        Wait::Placed,
        Wait::Ended,
    ];

    /// Whether the allocation is waiting (not placed, not ended).
    pub fn is_waiting(self) -> bool {
        !matches!(self, Wait::Placed | Wait::Ended)
    }

    /// Whether admission names this reason (a queued gang's); the others
    /// are recorded by `apply`.
    pub fn is_admission_reason(self) -> bool {
        matches!(
            self,
            Wait::Quota
                | Wait::Capacity
                | Wait::Constraint
                | Wait::Ports
                | Wait::Packing
                | Wait::PlannedStart
                | Wait::Drain
                | Wait::Backoff
        )
    }

    /// What it means, in words.
    pub fn words(self) -> &'static str {
        match self {
            Wait::Queued => "its turn in the queue",
            Wait::Quota => "its vCluster's quota",
            Wait::Capacity => "capacity",
            Wait::Constraint => "nodes matching its constraints",
            Wait::Ports => "free rendezvous ports",
            Wait::Packing => "a rack (packing value) with room for the whole gang",
            Wait::PlannedStart => "a higher-ranked gang's planned start",
            Wait::Drain => "nodes that are draining or out of service",
            Wait::Backoff => "its back-off after a failure",
            Wait::Dependency => "its dependencies",
            Wait::Preempting => "the allocations it preempts to stop",
            Wait::Placed => "placed",
            Wait::Ended => "ended",
        }
    }
}

/// An allocation that held what a waiting one needed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitHolder {
    /// The allocation (or array, for a dependency on one).
    pub alloc: AllocId,
    /// Its owner (at most [`MAX_WAIT_OWNER_BYTES`]; empty when unknown).
    pub owner: String,
    /// Its preemption class.
    pub class: u8,
}

impl WaitHolder {
    /// A holder, its owner cut to [`MAX_WAIT_OWNER_BYTES`].
    pub fn new(alloc: AllocId, owner: &str, class: u8) -> WaitHolder {
        let mut end = owner.len().min(MAX_WAIT_OWNER_BYTES);
        while !owner.is_char_boundary(end) {
            end -= 1;
        }
        WaitHolder { alloc, owner: owner[..end].to_string(), class }
    }
}

/// Holders in words: "12 (alice, class 1), 13 (bob, class 0)".
pub fn holders_words(holders: &[WaitHolder]) -> String {
    holders
        .iter()
        .map(|h| match h.owner.as_str() {
            "" => h.alloc.to_string(),
            owner => format!("{} ({owner}, class {})", h.alloc, h.class),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A wait and its holders in words: "its vCluster's quota, held by 12
/// (alice, class 1)".
pub fn wait_words(wait: Wait, holders: &[WaitHolder]) -> String {
    if holders.is_empty() {
        return wait.words().to_string();
    }
    let by = match wait {
        Wait::Dependency => "on",
        Wait::Preempting => "victims",
        Wait::PlannedStart => "of",
        _ => "held by",
    };
    format!("{}, {by} {}", wait.words(), holders_words(holders))
}

/// One change of an allocation's wait: from `since_ms` (entry time) until
/// the next span's, it stood at `wait`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitSpan {
    /// Entry time of the change.
    pub since_ms: u64,
    /// Where it stood.
    pub wait: Wait,
    /// What held it (at most [`MAX_WAIT_HOLDERS`]).
    pub holders: Vec<WaitHolder>,
}

/// An allocation's wait timeline, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitLog {
    /// The spans (at most [`MAX_WAIT_SPANS`]).
    pub spans: Vec<WaitSpan>,
    /// Spans dropped to keep the bound (the oldest after the first).
    pub dropped: u32,
}

impl WaitLog {
    /// The latest span.
    pub fn last(&self) -> Option<&WaitSpan> {
        self.spans.last()
    }

    /// Where the wait stands now (`Queued` when nothing is recorded).
    pub fn current(&self) -> Wait {
        self.spans.last().map_or(Wait::Queued, |s| s.wait)
    }

    /// Records a change at `at_ms`, unless it changes nothing. Returns
    /// whether a span was added.
    pub fn push(&mut self, at_ms: u64, wait: Wait, mut holders: Vec<WaitHolder>) -> bool {
        holders.truncate(MAX_WAIT_HOLDERS);
        if let Some(last) = self.spans.last_mut() {
            if last.wait == wait && last.holders == holders {
                return false;
            }
            // Two changes at one entry time: the later one stands.
            if last.since_ms == at_ms {
                let n = self.spans.len();
                if n > 1 && self.spans[n - 2].wait == wait && self.spans[n - 2].holders == holders {
                    self.spans.pop();
                } else {
                    let last = self.spans.last_mut().expect("checked");
                    last.wait = wait;
                    last.holders = holders;
                }
                return true;
            }
        }
        if self.spans.len() == MAX_WAIT_SPANS {
            self.spans.remove(1);
            self.dropped += 1;
        }
        self.spans.push(WaitSpan { since_ms: at_ms, wait, holders });
        true
    }

    /// The time spent waiting, per span, up to `end_ms` (the allocation's
    /// end, or now): `(span, how long)` for every span, the last one lasting
    /// until `end_ms`.
    pub fn durations(&self, end_ms: u64) -> Vec<(&WaitSpan, u64)> {
        self.spans
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let until = self.spans.get(i + 1).map_or(end_ms, |n| n.since_ms);
                (s, until.saturating_sub(s.since_ms))
            })
            .collect()
    }

    /// Total time spent waiting (in every span that is not placed or
    /// ended), up to `end_ms`.
    pub fn waited_ms(&self, end_ms: u64) -> u64 {
        self.durations(end_ms).iter().filter(|(s, _)| s.wait.is_waiting()).map(|(_, d)| d).sum()
    }
}

/// The waiting spans of `log` in words, its last span lasting until
/// `end_ms`: "waited 3 min in all: 2 min for its vCluster's quota, held by
/// 5 (alice, class 0); then 1 min for …".
pub fn waits_summary(log: &WaitLog, end_ms: u64) -> String {
    let spans: Vec<String> = log
        .durations(end_ms)
        .into_iter()
        .filter(|(s, d)| s.wait.is_waiting() && *d > 0)
        .map(|(s, d)| format!("{} for {}", crate::words::duration(d), wait_words(s.wait, &s.holders)))
        .collect();
    let dropped = match log.dropped {
        0 => String::new(),
        n => format!(" ({n} older changes not kept)"),
    };
    match spans.as_slice() {
        [] => format!("did not wait{dropped}"),
        _ => format!(
            "waited {} in all{dropped}: {}",
            crate::words::duration(log.waited_ms(end_ms)),
            spans.join("; then ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_skips_repeats_and_keeps_the_bound() {
        let mut log = WaitLog::default();
        assert!(log.push(0, Wait::Queued, vec![]));
        assert!(!log.push(5, Wait::Queued, vec![]));
        assert!(log.push(10, Wait::Quota, vec![WaitHolder::new(3, "alice", 1)]));
        // The same reason with another holder is a change.
        assert!(log.push(20, Wait::Quota, vec![WaitHolder::new(4, "bob", 1)]));
        assert_eq!(log.spans.len(), 3);
        for i in 0..100u64 {
            log.push(100 + i, if i % 2 == 0 { Wait::Capacity } else { Wait::Ports }, vec![]);
        }
        assert_eq!(log.spans.len(), MAX_WAIT_SPANS);
        assert_eq!(log.spans[0].wait, Wait::Queued, "the first span stays");
        assert_eq!(log.dropped as usize, 3 + 100 - MAX_WAIT_SPANS);
        assert_eq!(log.spans.last().unwrap().since_ms, 199);
    }

    #[test]
    fn a_second_change_at_one_time_replaces_the_first() {
        let mut log = WaitLog::default();
        log.push(0, Wait::Queued, vec![]);
        log.push(7, Wait::Quota, vec![]);
        log.push(7, Wait::Placed, vec![]);
        assert_eq!(log.spans.iter().map(|s| s.wait).collect::<Vec<_>>(), [Wait::Queued, Wait::Placed]);
        // Back to what stood before at the same time: the change vanishes.
        log.push(7, Wait::Queued, vec![]);
        assert_eq!(log.spans.len(), 1);
        // The first span too.
        let mut log = WaitLog::default();
        log.push(3, Wait::Queued, vec![]);
        log.push(3, Wait::Quota, vec![]);
        assert_eq!(log.spans.iter().map(|s| (s.since_ms, s.wait)).collect::<Vec<_>>(), [(3, Wait::Quota)]);
    }

    #[test]
    fn durations_and_total_wait() {
        let mut log = WaitLog::default();
        log.push(1_000, Wait::Queued, vec![]);
        log.push(3_000, Wait::Quota, vec![]);
        log.push(10_000, Wait::PlannedStart, vec![]);
        log.push(15_000, Wait::Placed, vec![]);
        log.push(20_000, Wait::Ended, vec![]);
        let d: Vec<(Wait, u64)> = log.durations(20_000).into_iter().map(|(s, d)| (s.wait, d)).collect();
        assert_eq!(
            d,
            [
                (Wait::Queued, 2_000),
                (Wait::Quota, 7_000),
                (Wait::PlannedStart, 5_000),
                (Wait::Placed, 5_000),
                (Wait::Ended, 0)
            ]
        );
        assert_eq!(log.waited_ms(20_000), 14_000);
    }

    #[test]
    fn summary_names_each_reason_with_its_holders() {
        let mut log = WaitLog::default();
        log.push(0, Wait::Queued, vec![]);
        log.push(0, Wait::Quota, vec![WaitHolder::new(5, "alice", 0)]);
        log.push(120_000, Wait::PlannedStart, vec![WaitHolder::new(7, "bob", 2)]);
        log.push(180_000, Wait::Placed, vec![]);
        log.push(300_000, Wait::Ended, vec![]);
        assert_eq!(
            waits_summary(&log, 300_000),
            "waited 3 min in all: 2 min for its vCluster's quota, held by 5 (alice, class 0); then 1 min for a \
             higher-ranked gang's planned start, of 7 (bob, class 2)"
        );
        assert_eq!(waits_summary(&WaitLog::default(), 5), "did not wait");
    }

    #[test]
    fn owners_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_WAIT_OWNER_BYTES);
        let h = WaitHolder::new(1, &long, 0);
        assert!(h.owner.len() <= MAX_WAIT_OWNER_BYTES);
        assert!(long.starts_with(&h.owner));
        for w in Wait::ALL {
            assert_eq!(Wait::parse(w.as_str()), Some(w));
        }
    }
}
