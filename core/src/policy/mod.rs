//! Pure decisions: functions from a read-only [`crate::sm::State`] and `now`
//! to the commands the leader should propose. No clock, randomness, I/O or
//! async; `apply` re-checks everything they propose.

mod admission;
mod backfill;
mod capacity;
mod explain;
mod nodes;
mod preemption;
mod reclaim;
mod retention;
mod teardown;

#[cfg(test)]
mod admission_test;
#[cfg(test)]
mod preemption_test;

pub use admission::{AdmissionConfig, AdmissionPlan, Order, PackChoice, PassStats, plan_admission};
pub use backfill::{PlannedStart, expected_end_ms, planned_start};
pub use explain::{
    ClassReason, Explanation, explain, explain_spec, explain_with_admission, unsatisfiable, waiting_summary,
};
pub use nodes::{
    DEFAULT_DRAIN_TIMEOUT_MS, ScaleDownChoice, drain_timeout_ms, plan_drain_expiries, plan_scale_down, planned_nodes,
};
pub use preemption::{
    DEFAULT_PREEMPTION_WAIT_MS, Decision, Excluded, NoPreemption, PreemptionConfig, Preemptor, VictimCost, decide,
    plan_preemptions, score, waits_for_start,
};
pub use reclaim::{DEFAULT_RETURN_GRACE_MS, Reclaim, ReclaimConfig, plan_reclaims, reclaim_due_ms};
pub use retention::{
    DEFAULT_COMPACT_PER_ENTRY, DEFAULT_DETAIL_MS, DEFAULT_KEEP_WHOLE, DEFAULT_KEY_WINDOW_MS, DEFAULT_RETENTION_MS,
    RetentionConfig, plan_compact, plan_forget,
};
pub use teardown::{DEFAULT_FORCE_AFTER_MS, plan_expired_nominations, plan_forced_teardowns};
