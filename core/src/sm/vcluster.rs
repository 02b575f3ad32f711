//! vClusters: named slices of the cluster with a type (how their work may be
//! preempted), home nodes, hard quotas and a borrowing limit. They are
//! replicated objects, created and updated through the log
//! (`CreateVCluster`, `UpdateVCluster`).
//!
//! A node is home to the vCluster whose home selector matches it: an
//! explicit node list, or labels that must all match (by default
//! `muster.vcluster=<name>`, the label nodes already carry). The built-in
//! `default` vCluster exists without being created (hpc-batch, no quotas)
//! and takes every allocation that names no other; it may be updated like
//! any other.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rejection::Rejection;
use super::types::{CheckpointStore, DEFAULT_VCLUSTER, Node, NodeId, VCLUSTER_LABEL, VClusterType, check_cap};

/// Most nodes an explicit home list may name.
pub const MAX_HOME_NODES: usize = 10_000;
/// Most labels a home selector may require.
pub const MAX_HOME_LABELS: usize = 16;

/// Which nodes are a vCluster's home.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HomeNodes {
    /// Nodes carrying every one of these labels.
    Labels(BTreeMap<String, String>),
    /// Exactly these nodes.
    Nodes(Vec<NodeId>),
}

impl HomeNodes {
    /// The default selector of vCluster `name`: `muster.vcluster=<name>`
    /// (for `default`, also nodes with no such label).
    pub fn default_for(name: &str) -> HomeNodes {
        HomeNodes::Labels(BTreeMap::from([(VCLUSTER_LABEL.to_string(), name.to_string())]))
    }

    /// Whether `node` is at home here.
    pub fn matches(&self, node: &Node) -> bool {
        match self {
            HomeNodes::Nodes(ids) => ids.contains(&node.id),
            HomeNodes::Labels(want) => want.iter().all(|(k, v)| {
                // A node without a muster.vcluster label belongs to default.
                let have = node.labels.get(k).map(String::as_str);
                have == Some(v.as_str()) || (k == VCLUSTER_LABEL && have.is_none() && v == DEFAULT_VCLUSTER)
            }),
        }
    }
}

/// Hard quotas: admission never goes past them (unset: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// GPUs held by the vCluster's reserved and running tasks.
    pub max_gpus: Option<u32>,
    /// Nodes its tasks occupy.
    pub max_nodes: Option<u32>,
    /// Allocations reserved or running at once.
    pub max_allocations: Option<u32>,
}

/// What happens to a submission that would go past a hard quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OverQuota {
    /// It waits in the queue until the vCluster's usage falls.
    #[default]
    Queue,
    /// It is refused at submission.
    Reject,
}

impl OverQuota {
    /// `queue` or `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverQuota::Queue => "queue",
            OverQuota::Reject => "reject",
        }
    }

    /// Parses `queue` or `reject`.
    pub fn parse(s: &str) -> Option<OverQuota> {
        match s {
            "queue" => Some(OverQuota::Queue),
            "reject" => Some(OverQuota::Reject),
            _ => None,
        }
    }
}

/// What an operator sets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VClusterSpec {
    /// How its work may be preempted.
    pub vtype: VClusterType,
    /// Its home nodes.
    pub home: HomeNodes,
    /// Its hard quotas.
    pub quota: Quota,
    /// The share of its demand (in GPUs) it may run on other vClusters'
    /// idle nodes, percent (0: never borrows).
    pub borrow_limit_pct: u8,
    /// Queue or refuse what would go past a quota.
    pub over_quota: OverQuota,
    /// Where its allocations' checkpoints go, and their cap (unset: the
    /// cluster's).
    pub checkpoints: VcCheckpoints,
}

/// A vCluster's own checkpoint settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcCheckpoints {
    /// Its store (unset: the cluster's).
    pub store: Option<CheckpointStore>,
    /// Its cap, bytes (unset: the cluster's).
    pub max_bytes: Option<u64>,
}

impl VClusterSpec {
    /// The spec of a vCluster created with nothing but its name (and of the
    /// built-in `default`).
    pub fn default_for(name: &str) -> VClusterSpec {
        VClusterSpec {
            vtype: VClusterType::HpcBatch,
            home: HomeNodes::default_for(name),
            quota: Quota::default(),
            borrow_limit_pct: 0,
            over_quota: OverQuota::Queue,
            checkpoints: VcCheckpoints::default(),
        }
    }
}

/// A vCluster as the state holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VCluster {
    /// Its name.
    pub name: String,
    /// What an operator set.
    pub spec: VClusterSpec,
    /// Entry time of its creation (0 for the built-in `default`).
    pub created_ms: u64,
    /// Entry time of its latest change.
    pub updated_ms: u64,
    /// Who made the latest change.
    pub updated_by: String,
    /// Bumped by every change (1 once created).
    pub revision: u64,
}

impl VCluster {
    /// The built-in `default` vCluster, before anyone changes it.
    pub fn builtin_default() -> VCluster {
        VCluster {
            name: DEFAULT_VCLUSTER.to_string(),
            spec: VClusterSpec::default_for(DEFAULT_VCLUSTER),
            created_ms: 0,
            updated_ms: 0,
            updated_by: String::new(),
            revision: 0,
        }
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> Rejection {
    Rejection::InvalidVCluster { field: field.to_string(), reason: reason.into() }
}

/// A name: 1-63 characters of a-z 0-9 and `-`, not starting with `-` (the
/// rule `spec.vcluster` of a submission follows).
pub fn validate_name(name: &str) -> Result<(), Rejection> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok { Ok(()) } else { Err(invalid("name", "must be 1-63 characters of a-z 0-9 -, not starting with -")) }
}

/// Checks every field of a spec (the API checks the same, and names them).
pub fn validate_spec(spec: &VClusterSpec) -> Result<(), Rejection> {
    match &spec.home {
        HomeNodes::Nodes(ids) => {
            if ids.is_empty() {
                return Err(invalid("home_nodes", "an explicit home list must name at least one node"));
            }
            if ids.len() > MAX_HOME_NODES {
                return Err(invalid("home_nodes", format!("at most {MAX_HOME_NODES} nodes")));
            }
            let mut sorted: Vec<&NodeId> = ids.iter().collect();
            sorted.sort();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err(invalid("home_nodes", "a node is listed twice"));
            }
            if ids.iter().any(|n| n.as_str().is_empty() || n.as_str().len() > 253) {
                return Err(invalid("home_nodes", "node ids are 1-253 characters"));
            }
        }
        HomeNodes::Labels(labels) => {
            if labels.is_empty() {
                return Err(invalid("home_labels", "a selector must require at least one label"));
            }
            if labels.len() > MAX_HOME_LABELS {
                return Err(invalid("home_labels", format!("at most {MAX_HOME_LABELS} labels")));
            }
            if labels.iter().any(|(k, v)| k.is_empty() || k.len() > 128 || v.len() > 256) {
                return Err(invalid("home_labels", "keys are 1-128 characters, values at most 256"));
            }
        }
    }
    if spec.borrow_limit_pct > 100 {
        return Err(invalid("borrow_limit_pct", "must be between 0 and 100"));
    }
    let q = spec.quota;
    if q.max_gpus == Some(0) || q.max_nodes == Some(0) || q.max_allocations == Some(0) {
        return Err(invalid("quota", "a quota of 0 would admit nothing; leave it unset for no limit"));
    }
    if let Some(store) = &spec.checkpoints.store
        && CheckpointStore::parse(&store.spec()).as_ref() != Ok(store)
    {
        return Err(invalid("checkpoint_store", format!("{:?} is not a store spelling", store.spec())));
    }
    if let Some(cap) = spec.checkpoints.max_bytes {
        check_cap(cap).map_err(|r| invalid("max_checkpoint_bytes", r))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::{NodeSlot, NodeStatus, Resources, Usage};

    fn node(id: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            id: NodeId::new(id),
            slot: NodeSlot(0),
            resources: Resources { gpus: 8, vram_mb: 1, mem_mb: 1, cpus: 1 },
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            reported_labels: Default::default(),
            status: NodeStatus::Ready,
            status_since_ms: 0,
            drain: None,
            used: Usage::default(),
            registered_at_ms: 0,
            revision: 0,
            history: Default::default(),
            images: Vec::new(),
        }
    }

    #[test]
    fn home_selectors_match_labels_lists_and_the_default() {
        let ml = HomeNodes::default_for("ml");
        assert!(ml.matches(&node("a", &[("muster.vcluster", "ml")])));
        assert!(!ml.matches(&node("b", &[])));
        let default = HomeNodes::default_for(DEFAULT_VCLUSTER);
        assert!(default.matches(&node("b", &[])), "an unlabelled node is default's");
        assert!(!default.matches(&node("a", &[("muster.vcluster", "ml")])));
        let two = HomeNodes::Labels([("pool".into(), "a100".into()), ("rack".into(), "r1".into())].into());
        assert!(two.matches(&node("c", &[("pool", "a100"), ("rack", "r1"), ("x", "y")])));
        assert!(!two.matches(&node("c", &[("pool", "a100")])));
        let list = HomeNodes::Nodes(vec![NodeId::new("gpu-1"), NodeId::new("gpu-2")]);
        assert!(list.matches(&node("gpu-2", &[])) && !list.matches(&node("gpu-3", &[])));
    }

    #[test]
    fn bad_specs_name_their_field() {
        let field = |spec: VClusterSpec| match validate_spec(&spec) {
            Err(Rejection::InvalidVCluster { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let base = VClusterSpec::default_for("ml");
        assert!(validate_spec(&base).is_ok());
        assert_eq!(field(VClusterSpec { borrow_limit_pct: 101, ..base.clone() }), "borrow_limit_pct");
        assert_eq!(field(VClusterSpec { home: HomeNodes::Nodes(vec![]), ..base.clone() }), "home_nodes");
        let twice = HomeNodes::Nodes(vec![NodeId::new("a"), NodeId::new("a")]);
        assert_eq!(field(VClusterSpec { home: twice, ..base.clone() }), "home_nodes");
        assert_eq!(field(VClusterSpec { home: HomeNodes::Labels(BTreeMap::new()), ..base.clone() }), "home_labels");
        let zero = Quota { max_gpus: Some(0), ..Quota::default() };
        assert_eq!(field(VClusterSpec { quota: zero, ..base }), "quota");
        for bad in ["", "Ml", "-ml", "ml_x", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("ml-training-2").is_ok() && validate_name("9ml").is_ok());
    }
}
