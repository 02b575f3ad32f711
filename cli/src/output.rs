//! `--output text|json` for client commands.

use clap::ValueEnum;

/// How a client command prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned text for people.
    #[default]
    Text,
    /// One JSON document for scripts.
    Json,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A moment for people: RFC 3339 in UTC and how far it is from `now_ms`,
/// `2026-11-25T13:30:02Z (3 min ago)` or `… (in 6 days)`. JSON output keeps
/// the milliseconds.
pub fn when(ms: u64, now_ms: u64) -> String {
    let at = muster_scheduler::server::api::convert::format_time_ms(ms);
    if ms <= now_ms {
        let ago = now_ms - ms;
        if ago < 1_000 { format!("{at} (just now)") } else { format!("{at} ({} ago)", duration(ago)) }
    } else {
        format!("{at} (in {})", duration(ms - now_ms))
    }
}

pub use muster_scheduler::words::duration;

/// How often something happened: `never`, `once`, `twice`, `N times`.
pub fn times(n: u64) -> String {
    match n {
        0 => "never".into(),
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

/// `never preempted`, `preempted once`, `preempted 3 times`.
pub fn preempted(n: u64) -> String {
    match n {
        0 => "never preempted".into(),
        n => format!("preempted {}", times(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_as_words() {
        let now = 1_795_482_045_152;
        assert_eq!(when(now - 200_000, now), "2026-11-24T00:57:25Z (3 min 20 s ago)");
        assert_eq!(when(now + 7 * 86_400_000, now), "2026-12-01T01:00:45Z (in 7 days)");
        assert_eq!(when(now, now), "2026-11-24T01:00:45Z (just now)");
        assert_eq!([times(0), times(1), times(2), times(7)], ["never", "once", "twice", "7 times"]);
        assert_eq!([preempted(0), preempted(3)], ["never preempted", "preempted 3 times"]);
    }
}
