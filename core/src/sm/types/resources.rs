//! Identifiers, resources and usage, and whether a task fits a node.

use super::*;

/// An allocation's id, assigned by the state machine in log order (1, 2, 3, …).
pub type AllocId = u64;

/// A task's index inside its gang (0 ..= gang_size - 1).
pub type TaskIndex = u32;

/// A node's operator-facing name (the agent registers with it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub String);

impl NodeId {
    /// Builds a node id from anything string-like.
    pub fn new(id: impl Into<String>) -> Self {
        NodeId(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's dense position in [`crate::sm::State`]'s node table, assigned in
/// registration order and never reused. Tasks refer to nodes by slot so that
/// placement does not hash or compare strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeSlot(pub u32);

/// Resources, on a node (what it has) or on a task (what it needs).
///
/// `gpus`, `mem_mb` and `cpus` are consumed: the tasks placed on a node may
/// not add up to more than the node has. `vram_mb` is memory **per GPU**: on a
/// node, what each of its GPUs has; on a task, the least each of its GPUs must
/// have. It is a constraint, not a consumable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// Whole GPUs.
    pub gpus: u32,
    /// Memory per GPU, in MiB.
    pub vram_mb: u64,
    /// Host memory, in MiB.
    pub mem_mb: u64,
    /// CPU cores.
    pub cpus: u32,
}

/// The consumable part of [`Resources`]: what is in use on a node, or free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Whole GPUs.
    pub gpus: u32,
    /// Host memory, in MiB.
    pub mem_mb: u64,
    /// CPU cores.
    pub cpus: u32,
}

impl Usage {
    /// What a task of these resources consumes.
    pub fn of(r: &Resources) -> Usage {
        Usage { gpus: r.gpus, mem_mb: r.mem_mb, cpus: r.cpus }
    }

    /// Whether `need` fits inside `self` (read as free capacity).
    pub fn covers(&self, need: &Usage) -> bool {
        self.gpus >= need.gpus && self.mem_mb >= need.mem_mb && self.cpus >= need.cpus
    }

    /// `self + other`, saturating (capacity never wraps).
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            gpus: self.gpus.saturating_add(other.gpus),
            mem_mb: self.mem_mb.saturating_add(other.mem_mb),
            cpus: self.cpus.saturating_add(other.cpus),
        }
    }

    /// `self - other`, saturating at zero.
    pub fn minus(&self, other: &Usage) -> Usage {
        Usage {
            gpus: self.gpus.saturating_sub(other.gpus),
            mem_mb: self.mem_mb.saturating_sub(other.mem_mb),
            cpus: self.cpus.saturating_sub(other.cpus),
        }
    }
}

/// Whether a task of resources `need` may go on a node of resources `node`
/// whose free consumables are `free`.
pub fn fits(need: &Resources, node: &Resources, free: &Usage) -> bool {
    free.covers(&Usage::of(need)) && (need.gpus == 0 || node.vram_mb >= need.vram_mb)
}
