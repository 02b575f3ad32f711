//! Disk faults injected into a running replica, for the chaos harness and
//! tests only: a control file the harness writes and removes while the
//! replica runs (`muster server --disk-fault-file PATH`). Absent or empty,
//! the disk behaves; otherwise the file's one line names the fault:
//!
//! | line | what the log's next operations see |
//! |---|---|
//! | `fsync-eio` | every `fdatasync` fails with EIO (a failing disk) |
//! | `append-enospc` | every append writes half its bytes and fails with ENOSPC (a full disk) |
//! | `slow-sync MS` | every `fdatasync` takes MS milliseconds longer (a slow or overloaded disk) |
//! | `stall-sync` | every `fdatasync` waits until the fault is cleared (a stalled disk: a hung network volume) |
//!
//! The store reads the file before each append and sync, so a fault takes
//! effect and clears within one operation.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::log_file::vfs::{RealDisk, Vfs};

/// A fault of the disk under the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// `fdatasync` fails with EIO.
    SyncFails,
    /// Writes fail with ENOSPC after writing part of their bytes.
    Full,
    /// `fdatasync` takes this much longer.
    SlowSync(Duration),
    /// `fdatasync` waits until the fault is cleared.
    StalledSync,
}

impl DiskFault {
    /// Parses a control file's line (`None`: no fault).
    pub fn parse(line: &str) -> Result<Option<DiskFault>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => Ok(None),
            ["fsync-eio"] => Ok(Some(DiskFault::SyncFails)),
            ["append-enospc"] => Ok(Some(DiskFault::Full)),
            ["stall-sync"] => Ok(Some(DiskFault::StalledSync)),
            ["slow-sync", ms] => ms
                .parse::<u64>()
                .map(|ms| Some(DiskFault::SlowSync(Duration::from_millis(ms))))
                .map_err(|_| format!("slow-sync takes milliseconds, not {ms:?}")),
            _ => Err(format!("unknown disk fault {line:?}: fsync-eio, append-enospc, slow-sync MS or stall-sync")),
        }
    }

    /// The control file's line for this fault.
    pub fn line(&self) -> String {
        match self {
            DiskFault::SyncFails => "fsync-eio".into(),
            DiskFault::Full => "append-enospc".into(),
            DiskFault::SlowSync(d) => format!("slow-sync {}", d.as_millis()),
            DiskFault::StalledSync => "stall-sync".into(),
        }
    }
}

/// Sets (or, with `None`, clears) the fault a replica's control file names.
/// The line is renamed into place, so the replica never reads half of it.
pub fn set_disk_fault(path: &Path, fault: Option<DiskFault>) -> io::Result<()> {
    match fault {
        None => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        Some(f) => {
            let tmp = path.with_extension("tmp");
            fs::write(&tmp, f.line())?;
            fs::rename(&tmp, path)
        }
    }
}

/// The control file a store reads.
#[derive(Clone, Debug)]
pub(crate) struct FaultSwitch(pub(crate) PathBuf);

impl FaultSwitch {
    /// The fault in force now (an unreadable or unknown line is none).
    pub(crate) fn current(&self) -> Option<DiskFault> {
        fs::read_to_string(&self.0).ok().and_then(|line| DiskFault::parse(&line).ok().flatten())
    }
}

/// The disk under a log that reads its faults from a control file: each
/// append and sync does what the fault in force says, or the real thing.
pub(crate) struct FaultyDisk(pub(crate) FaultSwitch);

impl Vfs for FaultyDisk {
    fn append(&self, file: &File, buf: &[u8]) -> io::Result<()> {
        match self.0.current() {
            // A full disk: part of the write lands, then ENOSPC.
            Some(DiskFault::Full) => RealDisk.append(file, &buf[..buf.len() / 2]).and(Err(enospc())),
            _ => RealDisk.append(file, buf),
        }
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        match self.0.current() {
            Some(DiskFault::SyncFails) => Err(eio()),
            Some(DiskFault::SlowSync(d)) => {
                std::thread::sleep(d);
                RealDisk.sync(file)
            }
            Some(DiskFault::StalledSync) => {
                while self.0.current() == Some(DiskFault::StalledSync) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                RealDisk.sync(file)
            }
            _ => RealDisk.sync(file),
        }
    }
}

/// The error a failing disk gives.
pub(crate) fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

/// The error a full disk gives.
pub(crate) fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_parse_and_bad_ones_are_named() {
        assert_eq!(DiskFault::parse(""), Ok(None));
        assert_eq!(DiskFault::parse("fsync-eio\n"), Ok(Some(DiskFault::SyncFails)));
        assert_eq!(DiskFault::parse("append-enospc"), Ok(Some(DiskFault::Full)));
        assert_eq!(DiskFault::parse("slow-sync 250"), Ok(Some(DiskFault::SlowSync(Duration::from_millis(250)))));
        assert_eq!(DiskFault::parse("stall-sync"), Ok(Some(DiskFault::StalledSync)));
        assert!(DiskFault::parse("slow-sync soon").unwrap_err().contains("milliseconds"));
        assert!(DiskFault::parse("melt").unwrap_err().contains("unknown disk fault"));
        for f in [
            DiskFault::SyncFails,
            DiskFault::Full,
            DiskFault::SlowSync(Duration::from_millis(7)),
            DiskFault::StalledSync,
        ] {
            assert_eq!(DiskFault::parse(&f.line()), Ok(Some(f)));
        }
    }

    #[test]
    fn a_fault_is_set_and_cleared_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk-fault");
        let switch = FaultSwitch(path.clone());
        assert_eq!(switch.current(), None);
        set_disk_fault(&path, Some(DiskFault::SyncFails)).unwrap();
        assert_eq!(switch.current(), Some(DiskFault::SyncFails));
        set_disk_fault(&path, None).unwrap();
        set_disk_fault(&path, None).unwrap();
        assert_eq!(switch.current(), None);
        assert_eq!(eio().raw_os_error(), Some(5));
    }
}
