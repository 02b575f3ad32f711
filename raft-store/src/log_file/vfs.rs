//! The seam between the log and its disk: the two operations a failing
//! disk can fail. Production uses [`RealDisk`]; the chaos harness and the
//! tests put [`FaultyDisk`](crate::faults::FaultyDisk) in its place, so no
//! fault branches inside the log's own code.

use std::fs::File;
use std::io::{self, Write};

/// Writes and syncs of the log's segment files.
pub(crate) trait Vfs: Send + Sync {
    /// Appends `buf` to `file` (opened for appending). On an error part of
    /// it may have landed; the caller cuts it off.
    fn append(&self, file: &File, buf: &[u8]) -> io::Result<()>;

    /// Makes what was written to `file` durable (`fdatasync`).
    fn sync(&self, file: &File) -> io::Result<()>;
}

/// The disk as it is.
pub(crate) struct RealDisk;

impl Vfs for RealDisk {
    fn append(&self, mut file: &File, buf: &[u8]) -> io::Result<()> {
        file.write_all(buf)
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }
}
