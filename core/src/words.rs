//! Quantities as people read them in explanations and CLI text: a duration
//! in words. JSON output and the state keep exact milliseconds; this is for
//! sentences only.

/// A duration in words, to two units at most: `45 s`, `3 min 20 s`,
/// `2 h 5 min`, `6 days 23 h`; under a second, `250 ms`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words_to_two_units() {
        assert_eq!(duration(45_000), "45 s");
        assert_eq!(duration(200_000), "3 min 20 s");
        assert_eq!(duration(180_000), "3 min");
        assert_eq!(duration(3_600_000), "1 h");
        assert_eq!(duration(2 * 3_600_000 + 5 * 60_000 + 9_000), "2 h 5 min");
        assert_eq!(duration(86_400_000), "1 day");
        assert_eq!(duration(86_400_000 + 3_600_000), "1 day 1 h");
        assert_eq!(duration(7 * 86_400_000), "7 days");
        assert_eq!(duration(250), "250 ms");
    }
}
