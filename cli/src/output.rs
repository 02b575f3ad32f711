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
    let at = muster_scheduler::server::convert::format_time_ms(ms);
    if ms <= now_ms {
        let ago = now_ms - ms;
        if ago < 1_000 { format!("{at} (just now)") } else { format!("{at} ({} ago)", duration(ago)) }
    } else {
        format!("{at} (in {})", duration(ms - now_ms))
    }
}

/// A duration in words, to two units at most: `45 s`, `3 min 20 s`,
/// `2 h 5 min`, `6 days 23 h`.
pub fn duration(ms: u64) -> String {
    let s = ms / 1_000;
    let (d, h, m) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    let days = |d: u64| if d == 1 { "1 day".to_string() } else { format!("{d} days") };
    match () {
        _ if d > 0 && h > 0 => format!("{} {h} h", days(d)),
        _ if d > 0 => days(d),
        _ if h > 0 && m > 0 => format!("{h} h {m} min"),
        _ if h > 0 => format!("{h} h"),
        _ if m > 0 && !s.is_multiple_of(60) => format!("{m} min {} s", s % 60),
        _ if m > 0 => format!("{m} min"),
        _ if s > 0 => format!("{s} s"),
        _ => format!("{ms} ms"),
    }
}

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
        assert_eq!(duration(45_000), "45 s");
        assert_eq!(duration(2 * 3_600_000 + 5 * 60_000 + 9_000), "2 h 5 min");
        assert_eq!(duration(86_400_000 + 3_600_000), "1 day 1 h");
        assert_eq!(duration(250), "250 ms");
        assert_eq!([times(0), times(1), times(2), times(7)], ["never", "once", "twice", "7 times"]);
        assert_eq!([preempted(0), preempted(3)], ["never preempted", "preempted 3 times"]);
    }
}
