//! Nodes and their history, on the wire.

use muster_proto::v1;

use super::describe_event;

/// The wire form of a node status.
pub fn node_status_to_proto(s: crate::sm::NodeStatus) -> v1::NodeStatus {
    use crate::sm::NodeStatus as S;
    match s {
        S::Pending => v1::NodeStatus::Pending,
        S::Ready => v1::NodeStatus::Ready,
        S::Draining => v1::NodeStatus::Draining,
        S::Stopping => v1::NodeStatus::Stopping,
        S::Stopped => v1::NodeStatus::Stopped,
        S::Terminated => v1::NodeStatus::Terminated,
        S::Lost => v1::NodeStatus::Lost,
    }
}

/// The wire form of one entry of a node's history.
pub fn node_event_to_proto(n: &crate::sm::Node, h: &crate::sm::AllocEvent) -> v1::NodeEvent {
    let (kind, detail) = describe_event(&h.event);
    v1::NodeEvent {
        node_id: n.id.to_string(),
        revision: h.revision,
        time_ms: h.time_ms,
        kind: kind.to_string(),
        detail,
        status: node_status_to_proto(n.status) as i32,
    }
}

/// The wire form of a node.
pub fn node_to_proto(st: &crate::sm::State, n: &crate::sm::Node) -> v1::Node {
    let r = |g, v, m, c| v1::Resources { gpus: g, vram_mb: v, mem_mb: m, cpus: c };
    v1::Node {
        id: n.id.to_string(),
        resources: Some(r(n.resources.gpus, n.resources.vram_mb, n.resources.mem_mb, n.resources.cpus)),
        labels: n.labels.clone().into_iter().collect(),
        status: node_status_to_proto(n.status) as i32,
        used: Some(r(n.used.gpus, 0, n.used.mem_mb, n.used.cpus)),
        tasks: st.tasks_on_node(n.slot).count() as u32,
        registered_at_ms: n.registered_at_ms,
        status_since_ms: n.status_since_ms,
        drain: n.drain.as_ref().map(|d| v1::NodeDrain {
            started_at_ms: d.started_at_ms,
            deadline_ms: d.deadline_ms,
            reason: d.reason.clone(),
            by: d.by.clone(),
        }),
        events: n.history.iter().map(|h| node_event_to_proto(n, h)).collect(),
        revision: n.revision,
        reported_labels: n.reported_labels.clone().into_iter().collect(),
        admin_labels: st.node_policy(&n.id).map(|p| p.labels.clone().into_iter().collect()).unwrap_or_default(),
        admission: st.node_policy(&n.id).and_then(|p| p.admission.as_ref()).map(admission_to_proto),
        images: n.images.clone(),
    }
}

/// The wire form of an admission.
pub fn admission_to_proto(a: &crate::sm::Admission) -> v1::NodeAdmission {
    let r = &a.resources;
    v1::NodeAdmission {
        resources: Some(v1::Resources { gpus: r.gpus, vram_mb: r.vram_mb, mem_mb: r.mem_mb, cpus: r.cpus }),
        labels: a.labels.clone().into_iter().collect(),
        cert_sha256: a.cert_sha256.map(|d| crate::server::hex(&d)).unwrap_or_default(),
        by: a.by.clone(),
        at_ms: a.at_ms,
    }
}
