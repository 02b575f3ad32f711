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

/// The labels an agent puts on its node by itself: `hostname`,
/// `cpu.model`, and with NVML `gpu.model` (short, e.g. `H100`),
/// `gpu.product` (the whole name, spaces as `-`), `gpu.memory_mb` (the
/// smallest GPU's), `gpu.count` and `driver.version`. Labels set with
/// `muster agent --label` win over these.
pub fn probe_labels() -> std::collections::BTreeMap<String, String> {
    let mut labels = std::collections::BTreeMap::new();
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            labels.insert("hostname".to_string(), h.to_string());
        }
    }
    if let Some(cpu) = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| cpu_model(&t)) {
        labels.insert("cpu.model".to_string(), cpu);
    }
    if let Ok(nvml) = nvml_wrapper::Nvml::init() {
        let names: Vec<String> =
            (0..nvml.device_count().unwrap_or(0)).filter_map(|i| nvml.device_by_index(i).ok()?.name().ok()).collect();
        if let Some(name) = names.first() {
            labels.insert("gpu.model".to_string(), gpu_model(name));
            labels.insert("gpu.product".to_string(), label_value(name));
            labels.insert("gpu.count".to_string(), names.len().to_string());
        }
        if let Some((_, vram_mb)) = nvml_gpus().filter(|&(n, _)| n > 0) {
            labels.insert("gpu.memory_mb".to_string(), vram_mb.to_string());
        }
        if let Ok(v) = nvml.sys_driver_version() {
            labels.insert("driver.version".to_string(), label_value(&v));
        }
    }
    labels
}

/// A free-form name as a label value: runs of spaces and characters a
/// constraint cannot hold become one `-`.
pub fn label_value(s: &str) -> String {
    let mut out = String::new();
    for c in s.trim().chars() {
        if c.is_whitespace() || c.is_control() || matches!(c, ',' | '(' | ')' | '=' | '!') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c);
        }
    }
    out.trim_matches('-').to_string()
}

/// The short model of an NVML device name: `NVIDIA H100 80GB HBM3` → `H100`,
/// `NVIDIA A100-SXM4-80GB` → `A100`, `Tesla V100-SXM2-16GB` → `V100`,
/// `NVIDIA GeForce RTX 4090` → `RTX-4090`.
pub fn gpu_model(name: &str) -> String {
    let words: Vec<&str> =
        name.split_whitespace().filter(|w| !matches!(*w, "NVIDIA" | "Tesla" | "GeForce" | "Quadro")).collect();
    let Some(first) = words.first() else { return label_value(name) };
    let head = first.split('-').next().unwrap_or(first);
    match (head, words.get(1)) {
        ("RTX" | "TITAN" | "GTX", Some(next)) => label_value(&format!("{head}-{next}")),
        _ => label_value(head),
    }
}

/// The `model name` of the first CPU in `/proc/cpuinfo` text, as a label value.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    let line = cpuinfo.lines().find(|l| l.starts_with("model name"))?;
    let v = label_value(line.split_once(':')?.1);
    (!v.is_empty()).then_some(v)
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
    fn gpu_and_cpu_names_become_short_label_values() {
        assert_eq!(gpu_model("NVIDIA H100 80GB HBM3"), "H100");
        assert_eq!(gpu_model("NVIDIA A100-SXM4-80GB"), "A100");
        assert_eq!(gpu_model("Tesla V100-SXM2-16GB"), "V100");
        assert_eq!(gpu_model("NVIDIA GeForce RTX 4090"), "RTX-4090");
        assert_eq!(gpu_model("NVIDIA L40S"), "L40S");
        assert_eq!(label_value("NVIDIA H100 80GB HBM3"), "NVIDIA-H100-80GB-HBM3");
        assert_eq!(label_value(" Intel(R) Xeon(R) CPU @ 2.20GHz "), "Intel-R-Xeon-R-CPU-@-2.20GHz");
        let info = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: x\n";
        assert_eq!(cpu_model(info).as_deref(), Some("AMD-EPYC-7B13"));
        assert_eq!(cpu_model("processor: 0\n"), None);
        // Every value is one a constraint can name.
        for v in [gpu_model("NVIDIA GeForce RTX 4090"), label_value(" Intel(R) Xeon(R) CPU @ 2.20GHz ")] {
            let e = muster_core::sm::LabelExpr::parse(&format!("k={v}")).unwrap();
            assert_eq!(e.to_string(), format!("k={v}"));
        }
    }

    #[test]
    fn this_machine_labels_itself_with_its_hostname_and_cpu() {
        let labels = probe_labels();
        assert!(labels.get("hostname").is_some_and(|h| !h.is_empty()), "{labels:?}");
        assert!(labels.contains_key("cpu.model") || !std::path::Path::new("/proc/cpuinfo").exists(), "{labels:?}");
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
