//! The offline auditor (`muster audit`): a committed log applied entry by
//! entry from a starting state, with every promise the log must keep checked
//! after each entry, and each leader decision checked before it applies.
//!
//! ```text
//!   snapshot state (or the empty state at entry 0)
//!     ─▶ for each committed entry: indexes consecutive, terms never fall
//!          for each command: a ReserveGang must be one apply accepts
//!            (room on every node, ports, quota, budget, the next epoch)
//!          apply; then the state's invariants, and epochs never fall
//! ```
//!
//! The state machine refuses a reservation that would double-book a GPU,
//! so the state itself never shows one; the auditor flags the committed
//! decision instead: a leader that proposed it broke the promise, and a
//! forged entry is caught by the same check.

use std::collections::BTreeMap;

use crate::replicated::CommandBatch;
use crate::sm::{AllocId, ApplyCtx, Command, Outcome, Rejection, State};

/// The first promise a log broke, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The entry's index.
    pub index: u64,
    /// The promise: `gpus_not_double_booked`, `ports_not_double_booked`,
    /// `gangs_all_or_nothing`, `quotas_hold`, `epochs_only_grow`,
    /// `retry_budget_kept`, `invariants`, `log_continuous`.
    pub promise: &'static str,
    /// What broke it, in words.
    pub detail: String,
    /// The command, printed (`None`: the entry as a whole).
    pub command: Option<String>,
    /// The state around it: the allocation and nodes the command names, as
    /// they stood before the entry.
    pub around: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry {}: {} broken: {}", self.index, self.promise, self.detail)?;
        if let Some(c) = &self.command {
            write!(f, "\n  command: {c}")?;
        }
        if !self.around.is_empty() {
            write!(f, "\n  before it: {}", self.around)?;
        }
        Ok(())
    }
}

/// Applies a committed log and checks it.
#[derive(Clone)]
pub struct Auditor {
    state: State,
    index: u64,
    term: u64,
    epochs: BTreeMap<AllocId, (u64, u64)>,
    /// Entries checked.
    pub entries: u64,
    /// Commands checked.
    pub commands: u64,
}

impl Auditor {
    /// An auditor that starts from `state`, the state after entry `index`
    /// (a snapshot's; the empty state and 0 for the whole log).
    pub fn new(state: State, index: u64) -> Auditor {
        let epochs = state.allocs().values().map(|a| (a.id, (a.reservation_epoch, a.preemption_epoch))).collect();
        Auditor { state, index, term: 0, epochs, entries: 0, commands: 0 }
    }

    /// The state after the last entry checked.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The last index checked (or the starting one).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Checks entry `index` of term `term` (`None`: a blank or membership
    /// entry) and applies it.
    pub fn entry(&mut self, index: u64, term: u64, batch: Option<&CommandBatch<Command>>) -> Result<(), Violation> {
        let whole =
            |promise, detail: String| Violation { index, promise, detail, command: None, around: String::new() };
        if index != self.index + 1 {
            return Err(whole("log_continuous", format!("entry {index} follows entry {}", self.index)));
        }
        if term < self.term {
            return Err(whole(
                "log_continuous",
                format!("its term {term} is below the previous entry's {}", self.term),
            ));
        }
        self.index = index;
        self.term = term;
        self.entries += 1;
        let Some(batch) = batch else { return Ok(()) };
        let ctx = ApplyCtx { time_ms: batch.time_ms };
        for cmd in &batch.commands {
            self.commands += 1;
            let budget = match cmd {
                Command::ReserveGang { alloc, .. } => self.state.alloc(*alloc).and_then(|a| {
                    (a.failures > a.spec.max_retries).then(|| {
                        format!(
                            "allocation {alloc} is placed again after {} failures; its budget is {} retries",
                            a.failures, a.spec.max_retries
                        )
                    })
                }),
                _ => None,
            };
            let violation = |promise, detail, around| Violation {
                index,
                promise,
                detail,
                command: Some(format!("{cmd:?}")),
                around,
            };
            if let Some(detail) = budget {
                return Err(violation("retry_budget_kept", detail, self.around(cmd)));
            }
            // A refused command changes nothing: what it named is read after.
            if let Outcome::Rejected(r) = self.state.apply(cmd, &ctx)
                && matches!(cmd, Command::ReserveGang { .. })
                && let Some(promise) = promise_of(&r)
            {
                let detail = format!("a committed reservation the state machine refuses: {r}");
                return Err(violation(promise, detail, self.around(cmd)));
            }
        }
        if let Err(broken) = self.state.check_invariants() {
            return Err(whole("invariants", broken));
        }
        for a in self.state.allocs().values() {
            let now = (a.reservation_epoch, a.preemption_epoch);
            let before = self.epochs.insert(a.id, now).unwrap_or((0, 0));
            if now.0 < before.0 || now.1 < before.1 {
                return Err(whole(
                    "epochs_only_grow",
                    format!("allocation {}'s reservation and preemption epochs went from {before:?} to {now:?}", a.id),
                ));
            }
        }
        Ok(())
    }

    /// What a command names, as the state holds it now.
    fn around(&self, cmd: &Command) -> String {
        let Command::ReserveGang { alloc, nodes, .. } = cmd else { return String::new() };
        let mut parts = Vec::new();
        if let Some(a) = self.state.alloc(*alloc) {
            parts.push(format!(
                "allocation {} ({:?}, {} × {} GPUs, vCluster {}, epoch {}, {} failures)",
                a.id,
                a.status,
                a.spec.gang_size,
                a.spec.resources.gpus,
                a.spec.vcluster,
                a.reservation_epoch,
                a.failures
            ));
        }
        for id in nodes {
            if let Some(slot) = self.state.node_slot(id) {
                let n = self.state.node(slot);
                parts
                    .push(format!("node {} ({:?}, {} of {} GPUs used)", n.id, n.status, n.used.gpus, n.resources.gpus));
            }
        }
        parts.join("; ")
    }
}

/// The promise a refused reservation would have broken (`None`: a refusal
/// a healthy leader can meet, such as a node drained by an admin while the
/// reservation was on its way).
fn promise_of(r: &Rejection) -> Option<&'static str> {
    match r {
        Rejection::InsufficientCapacity { .. } => Some("gpus_not_double_booked"),
        Rejection::NoFreePorts { .. } => Some("ports_not_double_booked"),
        Rejection::WrongNodeCount { .. } | Rejection::NodeRepeated(_) => Some("gangs_all_or_nothing"),
        Rejection::QuotaExceeded { .. } => Some("quotas_hold"),
        Rejection::StaleReservationEpoch { .. } => Some("epochs_only_grow"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sm::{AllocSpec, NodeId, Resources};

    fn batch(time_ms: u64, commands: Vec<Command>) -> CommandBatch<Command> {
        CommandBatch { time_ms, commands }
    }

    fn node(id: &str) -> Vec<Command> {
        let resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 64_000, cpus: 32 };
        vec![
            Command::RegisterNode { node: NodeId::new(id), resources, labels: BTreeMap::new() },
            Command::MarkNodeReady { node: NodeId::new(id) },
        ]
    }

    fn submit(gpus: u32) -> Command {
        let task = Resources { gpus, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 };
        let mut spec = AllocSpec::new("u", 1, task, vec!["true".into()]);
        spec.ports = 0;
        Command::Submit { spec }
    }

    fn reserve(alloc: AllocId, node: &str) -> Command {
        Command::ReserveGang { alloc, epoch: 1, nodes: vec![NodeId::new(node)] }
    }

    #[test]
    fn a_healthy_log_passes_and_a_forged_reservation_that_double_books_is_named() {
        let mut a = Auditor::new(State::default(), 0);
        a.entry(1, 1, None).unwrap();
        a.entry(2, 1, Some(&batch(1_000, [node("n1"), vec![submit(6), submit(6)]].concat()))).unwrap();
        a.entry(3, 1, Some(&batch(2_000, vec![reserve(1, "n1")]))).unwrap();
        assert_eq!((a.entries, a.commands, a.index()), (3, 5, 3));
        // Allocation 2 needs 6 GPUs; n1 has 2 free.
        let v = a.entry(4, 1, Some(&batch(3_000, vec![reserve(2, "n1")]))).unwrap_err();
        assert_eq!((v.index, v.promise), (4, "gpus_not_double_booked"));
        assert!(v.command.as_deref().unwrap().contains("ReserveGang"), "{v}");
        assert!(v.around.contains("node n1 (Ready, 6 of 8 GPUs used)"), "{v}");
    }

    #[test]
    fn gaps_falling_terms_and_stale_epochs_are_named() {
        let mut a = Auditor::new(State::default(), 0);
        a.entry(1, 2, Some(&batch(1_000, [node("n1"), vec![submit(1)]].concat()))).unwrap();
        assert_eq!(a.clone_err(3, 2, None), "log_continuous");
        assert_eq!(a.clone_err(2, 1, None), "log_continuous");
        a.entry(2, 2, Some(&batch(2_000, vec![reserve(1, "n1")]))).unwrap();
        // Rolled back, it may be reserved again only under epoch 2.
        a.entry(3, 2, Some(&batch(3_000, vec![Command::RollbackGang { alloc: 1, epoch: 1 }]))).unwrap();
        let v = a.entry(4, 2, Some(&batch(4_000, vec![reserve(1, "n1")]))).unwrap_err();
        assert_eq!(v.promise, "epochs_only_grow", "{v}");
    }

    impl Auditor {
        /// The promise `entry` names, on a copy of this auditor.
        fn clone_err(&self, index: u64, term: u64, b: Option<&CommandBatch<Command>>) -> &'static str {
            self.clone().entry(index, term, b).unwrap_err().promise
        }
    }
}
