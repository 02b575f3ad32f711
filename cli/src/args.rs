//! Parsing of command-line values shared by several commands.

/// Parses `90`, `90s`, `30m`, `4h`, `2d` into seconds.
pub fn parse_duration_s(s: &str) -> anyhow::Result<u64> {
    muster_scheduler::sm::parse_duration_s(s).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_s("90").unwrap(), 90);
        assert_eq!(parse_duration_s("30m").unwrap(), 1800);
        assert_eq!(parse_duration_s("4h").unwrap(), 14_400);
        assert_eq!(parse_duration_s("2d").unwrap(), 172_800);
        assert!(parse_duration_s("4w").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_duration_s("h").is_err());
    }
}
