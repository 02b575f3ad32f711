//! The leader's replicated time: its wall clock, paced.
//!
//! Log entries carry the leader's time, and every replicated deadline
//! (forced teardowns, held nodes, drains, retention, token expiry) is
//! compared with it. A leader that stamped raw wall time would pass a jump
//! of its clock straight into every deadline: a jump of a minute forward
//! fires every deadline due within the minute at once. The [`Pacer`] keeps
//! replicated time on the leader's monotonic clock instead, and lets it
//! follow the wall clock at a bounded rate:
//!
//! - when a term begins, replicated time starts at the leader's wall time,
//!   or at the last applied entry's time when that is later (replicated
//!   time never goes back);
//! - during the term it runs at the monotonic clock's rate, drifting toward
//!   the wall clock by at most [`SLEW_PER_MILLE`] ‰ of the time elapsed: a
//!   wall-clock jump of any size moves it by at most 10 % of the time that
//!   passes, so a deadline of D fires no earlier than D / 1.1 and no later
//!   than D / 0.9 whatever the leader's clock does.
//!
//! A successor whose clock is ahead of real time moves replicated time
//! ahead by that much when its term begins: skew between replicas is
//! trusted once per term, a jump during a term never.

/// How far (‰ of the monotonic time elapsed) replicated time may drift
/// toward the wall clock.
pub const SLEW_PER_MILLE: u64 = 100;

#[derive(Clone, Copy, Debug)]
struct Pace {
    term: u64,
    /// Replicated time minus monotonic time, in microseconds.
    offset_us: i128,
    mono_ms: u64,
    last_ms: u64,
}

/// Replicated time for one leader (see the module's text).
#[derive(Clone, Debug, Default)]
pub struct Pacer {
    pace: Option<Pace>,
}

impl Pacer {
    /// A pacer with no term yet.
    pub fn new() -> Pacer {
        Pacer::default()
    }

    /// Replicated time now, in `term`, given the wall and monotonic
    /// readings and the time of the last applied entry (`floor_ms`). Never
    /// less than `floor_ms`, nor than what it returned before in this term.
    pub fn now(&mut self, term: u64, wall_ms: u64, mono_ms: u64, floor_ms: u64) -> u64 {
        let target = (i128::from(wall_ms) - i128::from(mono_ms)) * 1000;
        let floor = (i128::from(floor_ms) - i128::from(mono_ms)) * 1000;
        let (offset, last) = match self.pace {
            Some(p) if p.term == term => {
                let step = i128::from(mono_ms.saturating_sub(p.mono_ms)) * i128::from(SLEW_PER_MILLE);
                (p.offset_us + (target - p.offset_us).clamp(-step, step), p.last_ms)
            }
            _ => (target, 0),
        };
        let offset = offset.max(floor);
        let now = u64::try_from((i128::from(mono_ms) * 1000 + offset) / 1000).unwrap_or(0).max(last).max(floor_ms);
        self.pace = Some(Pace {
            term,
            offset_us: offset,
            mono_ms: mono_ms.max(self.pace.map_or(0, |p| p.mono_ms)),
            last_ms: now,
        });
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicated time at each monotonic second, with the wall clock
    /// reading `wall(second)`, one term, nothing applied.
    fn run(seconds: u64, wall: impl Fn(u64) -> u64) -> Vec<u64> {
        let mut p = Pacer::new();
        (0..=seconds).map(|s| p.now(1, wall(s), s * 1000, 0)).collect()
    }

    #[test]
    fn a_good_clock_is_followed_exactly() {
        let t = run(5, |s| 1_000_000 + s * 1000);
        assert_eq!(t, [1_000_000, 1_001_000, 1_002_000, 1_003_000, 1_004_000, 1_005_000]);
    }

    #[test]
    fn a_jump_forward_is_caught_up_at_a_tenth_of_the_time_passing() {
        // The wall clock jumps a minute ahead after 2 s.
        let t = run(12, |s| 1_000_000 + s * 1000 + if s >= 2 { 60_000 } else { 0 });
        for w in t.windows(2) {
            assert_eq!(w[1] - w[0], if w[0] < 1_001_000 { 1000 } else { 1100 }, "{t:?}");
        }
        assert_eq!(t[12], 1_000_000 + 12_000 + 1_100, "11 s at 1.1×: 1.1 s of the minute caught up");
    }

    #[test]
    fn a_jump_back_slows_time_down_and_never_reverses_it() {
        let t = run(10, |s| 1_000_000 + s * 1000 - if s >= 1 { 60_000 } else { 0 });
        for w in t.windows(2) {
            assert!(w[1] > w[0], "{t:?}");
            assert!(w[1] - w[0] >= 900, "{t:?}");
        }
        assert_eq!(t[10], 1_000_000 + 10 * 900, "10 s at 0.9×");
    }

    #[test]
    fn a_clock_put_back_right_is_rejoined() {
        // 5 s a minute ahead, then right again: replicated time ends where
        // real time is, never having run ahead by more than 0.5 s.
        let t = run(30, |s| 1_000_000 + s * 1000 + if (1..6).contains(&s) { 60_000 } else { 0 });
        let real = |s: u64| 1_000_000 + s * 1000;
        assert!(t.iter().enumerate().all(|(s, &v)| v - real(s as u64) <= 500), "{t:?}");
        assert_eq!(t[30], real(30));
    }

    #[test]
    fn a_new_term_takes_the_wall_clock_or_the_applied_time_if_later() {
        let mut p = Pacer::new();
        assert_eq!(p.now(1, 5_000, 0, 0), 5_000);
        assert_eq!(p.now(1, 90_000, 1_000, 0), 6_100, "a jump within a term is paced");
        assert_eq!(p.now(2, 90_000, 1_000, 6_100), 90_000, "a new term trusts its wall clock");
        // A leader whose clock is behind what was applied starts there and
        // runs at 0.9× until its clock catches up.
        let mut p = Pacer::new();
        assert_eq!(p.now(3, 1_000, 0, 10_000), 10_000);
        assert_eq!(p.now(3, 2_000, 1_000, 10_000), 10_900);
    }

    #[test]
    fn many_close_readings_pace_like_few() {
        // Read every millisecond for 10 s after a jump: the same catch-up as
        // one reading a second (no rounding lost per reading).
        let mut p = Pacer::new();
        let mut last = 0;
        for ms in 0..=10_000u64 {
            last = p.now(1, 1_000_000 + ms + if ms > 0 { 60_000 } else { 0 }, ms, 0);
        }
        assert_eq!(last, 1_000_000 + 11_000);
    }
}
