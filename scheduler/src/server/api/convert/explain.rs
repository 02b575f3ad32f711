//! Why an allocation waits, on the wire.

use muster_proto::v1;

use super::alloc_status_to_proto;
use crate::sm::State;

/// The wire form of an explanation.
pub fn explanation_to_proto(e: crate::policy::Explanation, st: &State, now_ms: u64) -> v1::Explanation {
    let preemption = e.preemption.map(|p| match p {
        Ok(d) => v1::PreemptionPlan {
            victims: d
                .victims
                .iter()
                .map(|v| v1::Victim {
                    id: v.alloc,
                    preemption_class: u32::from(v.class),
                    gpus: v.gpus,
                    elapsed_s: v.elapsed_s,
                    checkpoint_cost: v.checkpoint_gpu_s,
                    recompute_cost: v.recompute_gpu_s,
                    value_cost: v.value_gpu_s,
                    total_cost: v.total(),
                })
                .collect(),
            node_ids: d.nodes.iter().map(|&s| st.node(s).id.to_string()).collect(),
            total_cost: d.cost_gpu_s,
            value: d.value_gpu_s,
            reason: String::new(),
        },
        Err(why) => v1::PreemptionPlan { reason: why.to_string(), ..Default::default() },
    });
    let (waits, waits_dropped, waited_ms) = match st.alloc(e.alloc) {
        Some(a) => {
            let end = a.finished_at_ms.unwrap_or(now_ms);
            (waits_to_proto(&a.waits, end), a.waits.dropped, a.waits.waited_ms(end))
        }
        None => (Vec::new(), 0, 0),
    };
    v1::Explanation {
        planned_start: e.planned_start.map(|p| v1::PlannedStart {
            start_ms: p.start_ms,
            in_ms: p.start_ms.saturating_sub(now_ms),
            node_ids: p.nodes.iter().map(|&s| st.node(s).id.to_string()).collect(),
        }),
        preemption,
        id: e.alloc,
        status: alloc_status_to_proto(e.status) as i32,
        summary: e.summary,
        checkpoints: e.checkpoints,
        pulls: Vec::new(),
        classes: e
            .classes
            .into_iter()
            .map(|c| v1::NodeClassReason {
                class: c.class,
                nodes: c.nodes,
                can_take_now: c.can_take_now,
                reason: c.reason,
            })
            .collect(),
        waits,
        waits_dropped,
        waited_ms,
    }
}

/// The wire form of a wait timeline whose last span lasts until `end_ms`.
pub fn waits_to_proto(log: &crate::sm::WaitLog, end_ms: u64) -> Vec<v1::WaitSpan> {
    log.durations(end_ms)
        .into_iter()
        .map(|(s, d)| v1::WaitSpan {
            since_ms: s.since_ms,
            duration_ms: d,
            wait: s.wait.as_str().to_string(),
            detail: crate::sm::wait_words(s.wait, &s.holders),
            holders: s
                .holders
                .iter()
                .map(|h| v1::WaitHolder { id: h.alloc, owner: h.owner.clone(), preemption_class: u32::from(h.class) })
                .collect(),
        })
        .collect()
}
