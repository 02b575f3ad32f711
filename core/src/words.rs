//! Quantities as people read them in explanations and CLI text: a duration
//! in words, a size in binary units. JSON output and the state keep exact
//! milliseconds and bytes; this is for sentences only.

/// Days since 1970-01-01 of a date in the proleptic Gregorian calendar
/// (Howard Hinnant's days-from-civil): what parsing a UTC time needs.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

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

/// A byte count: `512 B`, `3.2 MiB`, `2.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(bytes((2 << 30) + (1 << 29)), "2.5 GiB");
        assert_eq!(bytes(64 << 30), "64.0 GiB");
    }

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
