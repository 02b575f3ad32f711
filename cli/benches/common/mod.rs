//! What the benches in `cli/benches/` share (each includes this module).

#![allow(dead_code, reason = "each bench is its own crate and uses part of this")]

/// The number after `name` on the command line (`--seconds 5`), or
/// `default` when it is absent or not a number.
pub fn opt(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A replica's `/metrics` page (empty when it cannot be read), over plain
/// HTTP/1.0.
pub fn metrics(addr: impl std::net::ToSocketAddrs) -> String {
    use std::io::{Read, Write};
    let mut text = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n");
        let _ = s.read_to_string(&mut text);
    }
    text
}

/// Percentile `p` (0 to 1) of `sorted`, which must not be empty.
pub fn pct(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Appends one 400-byte block to `file` and times its `fdatasync`.
fn timed_sync(file: &mut std::fs::File) -> std::time::Duration {
    use std::io::Write;
    file.write_all(&[0u8; 400]).expect("write a sync probe");
    let t = std::time::Instant::now();
    file.sync_data().expect("sync a sync probe");
    t.elapsed()
}

/// `fdatasync` of one appended 400-byte block, `n` times back to back, in
/// a file under `dir`: the disk's floor for one replica's share of a
/// commit in this run. p50 and p99.
pub fn sync_floor(dir: &std::path::Path, n: usize) -> (std::time::Duration, std::time::Duration) {
    let path = dir.join("sync-floor.probe");
    let mut file = std::fs::File::create(&path).expect("create the sync probe file");
    let mut lat: Vec<_> = (0..n.max(1)).map(|_| timed_sync(&mut file)).collect();
    drop(file);
    let _ = std::fs::remove_file(&path);
    lat.sort();
    (pct(&lat, 0.50), pct(&lat, 0.99))
}

/// A thread that appends a block to a file under a directory and syncs
/// it every 10 ms, timing each sync, until [`DiskProbe::finish`]: shows
/// whether the disk itself stalled during a phase of a bench.
pub struct DiskProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(std::time::Duration, std::time::Duration)>>,
}

impl DiskProbe {
    /// Starts probing a file in `dir`; times are counted from `origin`.
    pub fn start(dir: &std::path::Path, origin: std::time::Instant) -> DiskProbe {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = dir.join("disk.probe");
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut file = std::fs::File::create(&path).expect("create the disk probe file");
            let mut syncs = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let began = std::time::Instant::now() - origin;
                syncs.push((began, timed_sync(&mut file)));
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            drop(file);
            let _ = std::fs::remove_file(&path);
            syncs
        });
        DiskProbe { stop, thread }
    }

    /// Stops the probe; one line on what it saw: p50, p99 and the slowest
    /// sync, with when it began.
    pub fn finish(self) -> String {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let syncs = self.thread.join().expect("the disk probe thread");
        let Some(&(at, slowest)) = syncs.iter().max_by_key(|(_, took)| *took) else {
            return "the disk probe made no sync".into();
        };
        let mut took: Vec<_> = syncs.iter().map(|(_, t)| *t).collect();
        took.sort();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        format!(
            "a probe's fdatasync every 10 ms on the same disk: n={} p50 {:.2} ms  p99 {:.2} ms  slowest {:.1} ms at +{:.2} s",
            took.len(),
            ms(pct(&took, 0.5)),
            ms(pct(&took, 0.99)),
            ms(slowest),
            at.as_secs_f64()
        )
    }
}

/// A free TCP port on loopback (for a server about to bind it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Server processes, killed when dropped.
pub struct Servers(pub Vec<std::process::Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// (utime + stime in clock ticks, VmRSS in KiB) of a process (zeros once
/// it is gone).
pub fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks = fields.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}
