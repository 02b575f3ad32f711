//! A clock moved by a control file: clock faults for tests and chaos runs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Clock, SystemClock};

/// The host's clock, moved by what a control file says: a test's or a chaos
/// run's clock faults (`muster server --clock-offset-file PATH`), never the
/// host's clock itself. Absent or empty, the file moves nothing; otherwise
/// its one line is `OFFSET_MS` (a jump: the wall clock reads that many ms
/// ahead, or behind when negative) or `OFFSET_MS DRIFT_PER_MILLE SINCE_MS`
/// (a skew: from host time `SINCE_MS` on, the clock also gains, or loses,
/// that many ms per second). The monotonic reading is never moved: a
/// wall-clock jump does not move it on a real machine either.
///
/// The file is read again at most every [`ShiftedClock::REREAD_MS`].
#[derive(Debug)]
pub struct ShiftedClock {
    host: SystemClock,
    file: PathBuf,
    /// (monotonic ms of the last read, the shift it found).
    last: Mutex<Option<(u64, Shift)>>,
}

/// A control file's line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shift {
    /// ms added to the host's wall time.
    pub offset_ms: i64,
    /// ms per second gained from `since_ms` on (negative: lost).
    pub drift_per_mille: i64,
    /// Host wall time the drift starts at.
    pub since_ms: u64,
}

impl Shift {
    /// Parses a control file's text (empty: no shift).
    pub fn parse(text: &str) -> Result<Shift, String> {
        let n: Vec<&str> = text.split_whitespace().collect();
        let int = |s: &str| s.parse::<i64>().map_err(|_| format!("a clock shift takes whole numbers, not {s:?}"));
        match n.as_slice() {
            [] => Ok(Shift::default()),
            [o] => Ok(Shift { offset_ms: int(o)?, ..Shift::default() }),
            [o, d, s] => Ok(Shift {
                offset_ms: int(o)?,
                drift_per_mille: int(d)?,
                since_ms: s.parse().map_err(|_| format!("a drift's start is ms since the epoch, not {s:?}"))?,
            }),
            _ => Err(format!("a clock shift is OFFSET_MS [DRIFT_PER_MILLE SINCE_MS], not {text:?}")),
        }
    }

    /// The control file's line.
    pub fn line(&self) -> String {
        if self.drift_per_mille == 0 {
            self.offset_ms.to_string()
        } else {
            format!("{} {} {}", self.offset_ms, self.drift_per_mille, self.since_ms)
        }
    }

    /// The host's wall time `host_ms`, moved.
    pub fn apply(&self, host_ms: u64) -> u64 {
        let drifted = (host_ms.saturating_sub(self.since_ms) as i128 * self.drift_per_mille as i128) / 1000;
        (host_ms as i128 + self.offset_ms as i128 + drifted).max(0) as u64
    }
}

/// Writes (or, with `None`, removes) a clock's control file; the line is
/// renamed into place, so the clock never reads half of it.
pub fn set_shift(path: &Path, shift: Option<Shift>) -> std::io::Result<()> {
    match shift {
        None => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        Some(s) => {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, s.line())?;
            std::fs::rename(&tmp, path)
        }
    }
}

impl ShiftedClock {
    /// How often the control file is read again, ms.
    pub const REREAD_MS: u64 = 20;

    /// The host's clock, moved by what `file` says.
    pub fn new(file: impl Into<PathBuf>) -> ShiftedClock {
        ShiftedClock { host: SystemClock::new(), file: file.into(), last: Mutex::new(None) }
    }

    fn shift(&self) -> Shift {
        let mono = self.host.mono_ms();
        let mut last = self.last.lock().expect("clock lock poisoned");
        match *last {
            Some((at, s)) if mono < at + Self::REREAD_MS => s,
            _ => {
                let s =
                    std::fs::read_to_string(&self.file).ok().and_then(|t| Shift::parse(&t).ok()).unwrap_or_default();
                *last = Some((mono, s));
                s
            }
        }
    }
}

impl Clock for ShiftedClock {
    fn wall_ms(&self) -> u64 {
        self.shift().apply(self.host.wall_ms())
    }

    fn mono_ms(&self) -> u64 {
        self.host.mono_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shift_parses_prints_and_moves_time() {
        assert_eq!(Shift::parse("").unwrap(), Shift::default());
        let jump = Shift::parse("-60000\n").unwrap();
        assert_eq!(jump, Shift { offset_ms: -60_000, ..Shift::default() });
        assert_eq!(jump.line(), "-60000");
        assert_eq!(jump.apply(100_000), 40_000);
        let skew = Shift::parse("0 50 1000").unwrap();
        assert_eq!(Shift::parse(&skew.line()).unwrap(), skew);
        assert_eq!(skew.apply(1_000), 1_000);
        assert_eq!(skew.apply(11_000), 11_500, "5 % fast for 10 s");
        assert!(Shift::parse("soon").unwrap_err().contains("whole numbers"));
        assert!(Shift::parse("1 2").unwrap_err().contains("OFFSET_MS [DRIFT_PER_MILLE SINCE_MS]"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_follows_its_control_file() {
        let dir = std::env::temp_dir().join(format!("muster-clock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("clock");
        let c = ShiftedClock::new(&file);
        let host = SystemClock::new();
        assert!(c.wall_ms().abs_diff(host.wall_ms()) < 1_000, "no file: the host's time");
        set_shift(&file, Some(Shift { offset_ms: 3_600_000, ..Shift::default() })).unwrap();
        tokio::time::advance(std::time::Duration::from_millis(ShiftedClock::REREAD_MS)).await;
        assert!(c.wall_ms().abs_diff(host.wall_ms() + 3_600_000) < 1_000, "an hour ahead");
        let mono = c.mono_ms();
        set_shift(&file, None).unwrap();
        tokio::time::advance(std::time::Duration::from_millis(ShiftedClock::REREAD_MS)).await;
        assert!(c.wall_ms().abs_diff(host.wall_ms()) < 1_000, "back");
        assert_eq!(c.mono_ms(), mono + ShiftedClock::REREAD_MS, "the monotonic reading never moved");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
