//! Pure decisions: functions from a read-only [`crate::sm::State`] and `now`
//! to the commands the leader should propose. No clock, randomness, I/O or
//! async; `apply` re-checks everything they propose.

mod admission;
mod explain;
mod teardown;

#[cfg(test)]
mod admission_test;

pub use admission::{AdmissionConfig, AdmissionPlan, Order, PassStats, plan_admission};
pub use explain::{ClassReason, Explanation, explain};
pub use teardown::{DEFAULT_FORCE_AFTER_MS, plan_force_drains};
