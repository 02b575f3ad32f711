//! A heterogeneous fleet for the simulator, read from a node list: a CSV of
//! node classes, each with a count, its GPUs, GPU model and memory, host
//! memory, CPUs and labels.
//!
//! ```text
//!   count,gpus,gpu_model,vram_mb,mem_mb,cpus,labels
//!   64,8,H100,81920,2048000,192,rack=r1
//!   32,8,A100,40960,1024000,128,rack=r2;zone=b
//! ```
//!
//! `gpu_model` becomes the node's `gpu.model` label (what `muster agent`
//! reads from NVML); `labels` holds more, `KEY=VALUE` joined by `;`.

use std::collections::BTreeMap;

use muster_core::sm::{Limits, NodeId, Resources, validate_node};

/// One simulated node: what it has and its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetNode {
    /// Its node id (`None`: the simulator names it `node-NNNNN`).
    pub id: Option<String>,
    /// Its resources.
    pub resources: Resources,
    /// Its labels (`gpu.model` among them).
    pub labels: BTreeMap<String, String>,
}

impl FleetNode {
    /// Its `gpu.model` label, or `-` without one.
    pub fn model(&self) -> &str {
        self.labels.get("gpu.model").map_or("-", String::as_str)
    }
}

/// The most nodes a node list may describe.
pub const MAX_FLEET_NODES: usize = 100_000;

/// Parses a node list (see the module docs). Errors name the line.
pub fn parse_fleet(text: &str) -> Result<Vec<FleetNode>, String> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let (_, header) = lines.next().ok_or("the node list is empty")?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| columns.iter().position(|c| *c == name);
    let need =
        |name: &'static str| col(name).ok_or_else(|| format!("the node list's header lacks the column {name:?}"));
    let (c_count, c_gpus) = (need("count")?, need("gpus")?);
    let (c_model, c_vram, c_mem, c_cpus, c_labels) =
        (col("gpu_model"), col("vram_mb"), col("mem_mb"), col("cpus"), col("labels"));
    let mut fleet = Vec::new();
    for (i, line) in lines {
        let at = |reason: String| format!("node list line {}: {reason}", i + 1);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: Option<usize>| c.and_then(|c| fields.get(c)).copied().filter(|f| !f.is_empty());
        let number = |c: Option<usize>, name: &str, default: u64| -> Result<u64, String> {
            field(c).map_or(Ok(default), |f| f.parse().map_err(|_| at(format!("{name} {f:?} is not a number"))))
        };
        let count = number(Some(c_count), "count", 0)?;
        if count == 0 {
            return Err(at("count must be at least 1".into()));
        }
        let gpus = u32::try_from(number(Some(c_gpus), "gpus", 0)?).map_err(|_| at("gpus is too large".into()))?;
        let resources = Resources {
            gpus,
            vram_mb: number(c_vram, "vram_mb", if gpus > 0 { 80_000 } else { 0 })?,
            mem_mb: number(c_mem, "mem_mb", 128_000 * u64::from(gpus.max(1)))?,
            cpus: u32::try_from(number(c_cpus, "cpus", 12 * u64::from(gpus.max(1)))?)
                .map_err(|_| at("cpus is too large".into()))?,
        };
        let mut labels = BTreeMap::new();
        if let Some(m) = field(c_model) {
            labels.insert("gpu.model".to_string(), m.to_string());
        }
        for kv in field(c_labels).into_iter().flat_map(|l| l.split(';')).filter(|kv| !kv.trim().is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| at(format!("label {kv:?} is not KEY=VALUE")))?;
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        validate_node(&NodeId::new("node-list"), &resources, &labels, &Limits::default())
            .map_err(|e| at(e.to_string()))?;
        if fleet.len() + count as usize > MAX_FLEET_NODES {
            return Err(at(format!("the node list holds more than {MAX_FLEET_NODES} nodes")));
        }
        fleet.extend(std::iter::repeat_n(FleetNode { id: None, resources, labels }, count as usize));
    }
    if fleet.is_empty() {
        return Err("the node list holds no nodes".into());
    }
    Ok(fleet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_list_expands_to_labelled_nodes() {
        let text = "count,gpus,gpu_model,vram_mb,mem_mb,cpus,labels\n# H100s\n2,8,H100,81920,2048000,192,rack=r1;zone=a\n1,4,A100,,,,\n";
        let fleet = parse_fleet(text).unwrap();
        assert_eq!(fleet.len(), 3);
        assert_eq!(fleet[0].model(), "H100");
        assert_eq!(fleet[0].labels["rack"], "r1");
        assert_eq!(fleet[0].resources, Resources { gpus: 8, vram_mb: 81_920, mem_mb: 2_048_000, cpus: 192 });
        assert_eq!(fleet[2].model(), "A100");
        assert_eq!(fleet[2].resources, Resources { gpus: 4, vram_mb: 80_000, mem_mb: 512_000, cpus: 48 });
    }

    #[test]
    fn bad_node_lists_name_the_line() {
        for (text, needle) in [
            ("", "empty"),
            ("gpus\n8\n", "lacks the column \"count\""),
            ("count,gpus\n0,8\n", "line 2: count must be at least 1"),
            ("count,gpus\nx,8\n", "line 2: count \"x\" is not a number"),
            ("count,gpus,labels\n1,8,rack\n", "line 2: label \"rack\" is not KEY=VALUE"),
            ("count,gpus,vram_mb\n1,8,0\n", "line 2"),
            ("count,gpus\n", "holds no nodes"),
        ] {
            let err = parse_fleet(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
