//! Resource discovery from the operating system.
//!
//! CPUs from the scheduler affinity the agent runs under (what it may use,
//! which in a container is less than the host has), memory from
//! `/proc/meminfo`. NVIDIA GPUs through NVML (`libnvidia-ml.so`, loaded at
//! run time by `nvml-wrapper`, so a machine without the library still
//! works): their count and the smallest GPU's memory. Without NVML, GPUs are
//! counted from `/proc/driver/nvidia/gpus/` and VRAM must come from
//! configuration.

use std::path::Path;

use thiserror::Error;

/// What a node can offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeResources {
    /// Usable CPU cores.
    pub cpus: u32,
    /// Total memory, MiB.
    pub mem_mb: u64,
    /// GPUs visible to the driver.
    pub gpus: u32,
    /// Memory per GPU, MiB (0 when unknown).
    pub vram_mb: u64,
}

/// Why resources could not be discovered.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// A system file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// `/proc/meminfo` has no usable `MemTotal` line.
    #[error("/proc/meminfo has no MemTotal line in kB")]
    NoMemTotal,
}

/// Reads `MemTotal` from meminfo text, in MiB.
pub fn parse_meminfo_mb(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let kb: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == "kB").then_some(kb / 1024)
}

fn count_gpus(dir: &Path) -> u32 {
    std::fs::read_dir(dir).map_or(0, |entries| entries.filter_map(Result::ok).count() as u32)
}

/// GPUs seen through NVML: (count, memory of the smallest GPU in MiB), or
/// `None` when the NVML library is not installed or finds no driver.
pub fn nvml_gpus() -> Option<(u32, u64)> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let count = nvml.device_count().ok()?;
    let mut smallest: Option<u64> = None;
    for i in 0..count {
        let total = nvml.device_by_index(i).ok()?.memory_info().ok()?.total / (1024 * 1024);
        smallest = Some(smallest.map_or(total, |s| s.min(total)));
    }
    Some((count, smallest.unwrap_or(0)))
}

/// Discovers this machine's resources.
pub fn probe_resources() -> Result<NodeResources, ProbeError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|source| ProbeError::Io { path: "/proc/meminfo".into(), source })?;
    let mem_mb = parse_meminfo_mb(&meminfo).ok_or(ProbeError::NoMemTotal)?;
    let (gpus, vram_mb) = nvml_gpus().unwrap_or_else(|| (count_gpus(Path::new("/proc/driver/nvidia/gpus")), 0));
    Ok(NodeResources { cpus, mem_mb, gpus, vram_mb })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_total_is_read_in_mib() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(parse_meminfo_mb(text), Some(24_000));
        assert_eq!(parse_meminfo_mb("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_mb("MemTotal: lots\n"), None);
        assert_eq!(parse_meminfo_mb("MemTotal: 1024 MB\n"), None);
    }

    #[test]
    fn nvml_absent_or_present_never_fails_the_probe() {
        // Without the library (CI, this machine) NVML reports nothing and the
        // probe falls back; with it, every GPU has memory.
        match nvml_gpus() {
            None => assert_eq!(probe_resources().unwrap().vram_mb, 0),
            Some((count, vram_mb)) => assert!(count == 0 || vram_mb > 0),
        }
    }

    #[test]
    fn this_machine_probes_to_something_plausible() {
        let r = probe_resources().unwrap();
        assert!(r.cpus >= 1);
        assert!(r.mem_mb >= 256, "{r:?}");
        let expected = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| parse_meminfo_mb(&t));
        assert_eq!(Some(r.mem_mb), expected);
    }
}
