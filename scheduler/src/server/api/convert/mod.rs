//! Protobuf ↔ state-machine types, and errors → gRPC statuses, in one place
//! at the edge. Every field is checked here (naming the field the user sent)
//! and again in `apply`.

mod alloc;
mod checkpoint;
mod events;
mod explain;
mod node;
mod status;

use tonic::Status;

pub use alloc::{
    alloc_status_filter, alloc_status_to_proto, alloc_to_proto, array_to_proto, record_to_alloc_proto, spec_from_proto,
    spec_to_proto,
};
pub use checkpoint::{manifest_to_proto, settings_from_proto, settings_to_proto, upload_from_proto};
pub use events::{describe_event, format_time_ms};
pub use explain::{explanation_to_proto, waits_to_proto};
pub use node::{admission_to_proto, node_event_to_proto, node_status_to_proto, node_to_proto};
pub use status::{propose_error_to_status, rejection_to_status};

pub use crate::server::raft::{LEADER_ADDR_HEADER, LEADER_ID_HEADER, not_leader_status};

pub use crate::sm::{DEFAULT_MAX_RETRIES, DEFAULT_WALLTIME_S};

/// An attempt's usage, as the API shows it.
pub fn usage_to_proto(u: &crate::sm::AttemptUsage) -> muster_proto::v1::AttemptUsage {
    muster_proto::v1::AttemptUsage {
        peak_memory_bytes: u.peak_memory_bytes,
        cpu_ms: u.cpu_ms,
        oom_kills: u.oom_kills,
        memory_limit_bytes: u.memory_limit_bytes,
        gpu_util_pct: u.gpu_util_pct,
        peak_gpu_memory_bytes: u.peak_gpu_memory_bytes,
    }
}

/// An agent's usage report, as the log carries it; a utilisation over 100 %
/// is refused, naming the field.
pub fn usage_from_proto(u: &muster_proto::v1::AttemptUsage) -> Result<crate::sm::AttemptUsage, Status> {
    if let Some(pct) = u.gpu_util_pct.filter(|p| *p > 100) {
        return Err(invalid("usage.gpu_util_pct", format!("{pct} is above 100")));
    }
    Ok(crate::sm::AttemptUsage {
        peak_memory_bytes: u.peak_memory_bytes,
        cpu_ms: u.cpu_ms,
        oom_kills: u.oom_kills,
        memory_limit_bytes: u.memory_limit_bytes,
        gpu_util_pct: u.gpu_util_pct,
        peak_gpu_memory_bytes: u.peak_gpu_memory_bytes,
    })
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("invalid {field}: {reason}"))
}
