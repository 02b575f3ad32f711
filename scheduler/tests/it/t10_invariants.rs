//! Properties that hold after every command of any sequence: no node is ever
//! over-committed, no gang is ever partly reserved or partly running outside
//! a teardown, the derived indexes match a rebuild, planned commands are
//! accepted, and snapshot → restore gives back the same state and digest.

use muster_scheduler::sm::{ApplyCtx, Command, State};
use proptest::prelude::*;

use crate::model::{Op, Run, ops};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_command(ops in ops(80)) {
        let mut run = Run::default();
        for op in &ops {
            for (cmd, out) in run.step(op) {
                if let Err(e) = run.state.check_invariants() {
                    panic!("after {cmd:?} ({out:?}): {e}");
                }
                // A fresh admission plan is made from the current view, so it
                // must be accepted whole.
                if matches!(op, Op::Admit { .. }) && matches!(cmd, Command::ReserveGang { .. } | Command::RollbackGang { .. }) {
                    prop_assert!(out.is_accepted(), "planned {:?} was rejected: {:?}", cmd, out);
                }
            }
        }
    }

    #[test]
    fn snapshot_restore_keeps_state_and_digest(ops in ops(60)) {
        let mut run = Run::default();
        for op in &ops {
            run.step(op);
        }
        let restored = State::from_snapshot(&run.state.to_snapshot()).expect("own snapshot decodes");
        prop_assert_eq!(restored.state_digest(), run.state.state_digest());
        prop_assert_eq!(&restored, &run.state);
    }

    /// A rejected command changes nothing (applied at time 0, the clock
    /// cannot move either).
    #[test]
    fn rejections_change_nothing(ops in ops(60)) {
        let mut run = Run::default();
        for op in &ops {
            let mut probe = run.state.clone();
            for cmd in run.commands(op) {
                let before = probe.clone();
                if !probe.apply(&cmd, &ApplyCtx { time_ms: 0 }).is_accepted() {
                    prop_assert_eq!(&probe, &before, "rejected {:?} changed the state", cmd);
                }
            }
            run.step(op);
        }
    }
}
