//! Same commands ⇒ same outcomes and same digest, on independent replicas and
//! on a replica that joins from a snapshot halfway. Any iteration order that
//! leaked from a hash map (whose seed differs per map and per process) would
//! make two replicas diverge here.

use muster_scheduler::sm::{ApplyCtx, Command, State};
use proptest::prelude::*;

use crate::model::{Run, ops};

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn replicas_applying_the_same_log_agree(ops in ops(80)) {
        // The leader turns ops into a log; followers apply the log.
        let mut leader = Run::default();
        let mut log: Vec<(u64, Command)> = Vec::new();
        for op in &ops {
            for (cmd, _) in leader.step(op) {
                log.push((leader.now_ms, cmd));
            }
        }
        let half = log.len() / 2;
        let mut follower = Run::default().state;
        let mut outcomes = Vec::new();
        let mut late_joiner: Option<State> = None;
        for (i, (t, cmd)) in log.iter().enumerate() {
            if i == half {
                late_joiner = Some(State::from_snapshot(&follower.to_snapshot()).unwrap());
            }
            let ctx = ApplyCtx { time_ms: *t };
            outcomes.push(follower.apply(cmd, &ctx));
            if let Some(j) = late_joiner.as_mut() {
                let out = j.apply(cmd, &ctx);
                prop_assert_eq!(&out, outcomes.last().unwrap());
            }
        }
        prop_assert_eq!(follower.state_digest(), leader.state.state_digest());
        if let Some(j) = late_joiner {
            prop_assert_eq!(j.state_digest(), follower.state_digest());
        }
        // And once more from scratch: the same log gives the same outcomes.
        let mut again = Run::default().state;
        for ((t, cmd), expected) in log.iter().zip(&outcomes) {
            prop_assert_eq!(&again.apply(cmd, &ApplyCtx { time_ms: *t }), expected);
        }
        prop_assert_eq!(again.state_digest(), follower.state_digest());
    }
}
