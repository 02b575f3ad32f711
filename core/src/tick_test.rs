//! Unit tests of the leader's tick: pass order, timers, silence.

use super::{Heard, LeaderConfig, NextWake, Pass, PassKind, PassTimers, Silence, Tick, TickTime, Wake};
use crate::sm::{AllocId, AllocSpec, Command};
use crate::testkit::{Fixture, n, spec};

/// Submits a one-task job of `gpus` GPUs.
fn submit(c: &mut Fixture, gpus: u32) -> AllocId {
    c.submit(spec(1, gpus))
}

/// Runs a one-task 8-GPU job on node `i`.
fn run_on(c: &mut Fixture, i: u32) -> AllocId {
    let id = submit(c, 8);
    let epoch = c.reserve(id, &[i]);
    c.start(id, 0, i, epoch);
    id
}

/// Runs a whole tick the way a shell does: each pass's commands are applied
/// before the next pass reads.
fn tick(c: &mut Fixture, time: TickTime, wake: Wake, timers: &mut PassTimers, silence: &dyn Silence) -> Vec<Pass> {
    let cfg = LeaderConfig::default();
    let mut tick = Tick::begin(time, wake, timers, &cfg);
    let mut passes = Vec::new();
    c.t = time.wall_ms;
    while let Some(pass) = tick.next(&c.s, silence, timers) {
        for cmd in pass.commands() {
            c.ok(cmd.clone());
        }
        passes.push(pass);
    }
    passes
}

fn at(ms: u64) -> TickTime {
    TickTime { wall_ms: ms, mono_ms: ms }
}

fn kinds(passes: &[Pass]) -> Vec<PassKind> {
    passes.iter().map(Pass::kind).collect()
}

#[test]
fn heard_counts_silence_from_the_later_of_last_message_and_leading() {
    let mut h = Heard::default();
    assert_eq!(h.silent_ms(&n(0), 5_000), 0, "not leading: nobody is silent");
    h.touch(&n(0), 1_000);
    assert_eq!(h.silent_ms(&n(0), 5_000), 4_000);
    h.lead_from(10_000);
    assert_eq!(h.silent_ms(&n(0), 12_000), 2_000, "a new leader forgets the old term's silence");
    assert_eq!(h.silent_ms(&n(1), 12_000), 2_000, "never heard: silent since leading");
    h.touch(&n(1), 11_500);
    h.touch(&n(1), 11_000);
    assert_eq!(h.silent_ms(&n(1), 12_000), 500, "an older message never moves last-heard back");
}

#[test]
fn a_silent_node_is_marked_lost_then_admission_places_the_failed_over_work() {
    let mut c = Fixture::new(2);
    let job = run_on(&mut c, 0);
    let mut h = Heard::default();
    h.lead_from(1_000);
    let mut timers = PassTimers::default();
    // Node 1 keeps talking; node 0 went silent at 1 s.
    h.touch(&n(1), 40_000);
    let passes = tick(&mut c, at(40_000), Wake::default(), &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::NodeLost, PassKind::Admission], "{passes:#?}");
    assert_eq!(passes[0].commands(), [Command::MarkNodeLost { node: n(0) }]);
    // Nothing woke admission, but the node-lost pass proposed: admission
    // runs in the same tick and puts the failed-over task on node 1.
    assert!(
        matches!(passes[1].commands(), [Command::ReserveGang { alloc, nodes, .. }] if *alloc == job && *nodes == [n(1)]),
        "{passes:#?}"
    );
}

#[test]
fn liveness_runs_at_most_once_per_interval() {
    let mut c = Fixture::new(1);
    run_on(&mut c, 0);
    let lost_after = LeaderConfig::default().node_lost_after_ms;
    let mut timers = PassTimers::default();
    let mut h = Heard::default();
    h.lead_from(0);
    h.touch(&n(0), 100_000);
    assert!(tick(&mut c, at(100_000), Wake::default(), &mut timers, &h).is_empty());
    // 500 ms later the node counts as silent, but the pass is not due.
    let mut silent = Heard::default();
    silent.lead_from(100_000 - lost_after);
    assert!(tick(&mut c, at(100_500), Wake::default(), &mut timers, &silent).is_empty());
    assert_eq!(timers.liveness_due_ms(&LeaderConfig::default()), 101_000);
    let passes = tick(&mut c, at(101_000), Wake::default(), &mut timers, &silent);
    assert_eq!(kinds(&passes)[0], PassKind::NodeLost);
}

#[test]
fn silence_is_measured_on_the_monotonic_clock() {
    let mut c = Fixture::new(1);
    run_on(&mut c, 0);
    let mut h = Heard::default();
    h.lead_from(0);
    h.touch(&n(0), 1_000);
    let mut timers = PassTimers::default();
    // The wall clock jumped an hour ahead; the monotonic one did not.
    let jumped = TickTime { wall_ms: 3_600_000, mono_ms: 2_000 };
    assert!(tick(&mut c, jumped, Wake::default(), &mut timers, &h).is_empty());
}

#[test]
fn a_stuck_teardown_is_forced_at_its_deadline_and_not_before() {
    let mut c = Fixture::new(1);
    let job = run_on(&mut c, 0);
    c.ok(Command::CancelAllocation { alloc: job });
    let started = c.t;
    let force_after = LeaderConfig::default().teardown_force_after_ms;
    let mut h = Heard::default();
    h.lead_from(started);
    let mut timers = PassTimers::default();
    let early = at(started + force_after - 1);
    h.touch(&n(0), early.mono_ms);
    assert!(tick(&mut c, early, Wake::default(), &mut timers, &h).is_empty());
    let due = at(started + force_after + 1_000);
    h.touch(&n(0), due.mono_ms);
    let passes = tick(&mut c, due, Wake::default(), &mut timers, &h);
    assert_eq!(kinds(&passes)[0], PassKind::Deadlines);
    assert!(matches!(passes[0].commands(), [Command::ForceTeardown { alloc, .. }] if *alloc == job), "{passes:#?}");
}

#[test]
fn admission_runs_when_woken_and_an_empty_plan_is_still_reported() {
    let mut c = Fixture::new(1);
    let mut timers = PassTimers::default();
    let h = Heard::default();
    let passes = tick(&mut c, at(5_000), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission], "an empty plan still counts as a pass");
    assert!(passes[0].commands().is_empty());
    let job = submit(&mut c, 8);
    let passes = tick(&mut c, at(5_100), Wake { admission: true }, &mut timers, &h);
    assert!(matches!(passes[0].commands(), [Command::ReserveGang { alloc, .. }] if *alloc == job));
    // Not woken, nothing proposed earlier: no admission pass.
    submit(&mut c, 8);
    assert!(tick(&mut c, at(5_200), Wake::default(), &mut timers, &h).is_empty());
}

#[test]
fn preemption_runs_after_admission_at_most_once_per_interval() {
    let mut c = Fixture::new(1);
    run_on(&mut c, 0);
    let cfg = LeaderConfig::default();
    let mut urgent: AllocSpec = spec(1, 8);
    urgent.preemption_class = 9;
    c.submit(urgent);
    let mut h = Heard::default();
    h.lead_from(0);
    let mut timers = PassTimers::default();
    h.touch(&n(0), 200_000);
    let passes = tick(&mut c, at(200_000), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission, PassKind::Preemption], "{passes:#?}");
    assert!(
        matches!(passes[1], Pass::Preemption { reclaims: 0, ref commands } if matches!(commands[..], [Command::Preempt { .. }]))
    );
    assert_eq!(timers.preemption_due_ms(&cfg), 200_000 + cfg.preemption.min_pass_interval_ms);
    // Within the interval, admission runs alone.
    h.touch(&n(0), 200_100);
    let passes = tick(&mut c, at(200_100), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission]);
}

#[test]
fn a_newly_blocked_preemptor_does_not_wait_out_the_interval() {
    let mut c = Fixture::new(2);
    run_on(&mut c, 0);
    run_on(&mut c, 1);
    let cfg = LeaderConfig::default();
    let mut h = Heard::default();
    h.lead_from(0);
    h.touch(&n(0), 300_000);
    h.touch(&n(1), 300_000);
    let mut timers = PassTimers::default();
    let urgent = |class| AllocSpec { preemption_class: class, ..spec(1, 8) };
    c.submit(urgent(9));
    let passes = tick(&mut c, at(300_000), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission, PassKind::Preemption]);
    // A second class-9 job 100 ms later: blocked, and newer than anything
    // the last pass saw, so the pass runs now for it (not 1 s later).
    c.submit(urgent(9));
    let mut t = Tick::begin(at(300_010), Wake { admission: true }, &mut timers, &cfg);
    while let Some(p) = t.next(&c.s, &h, &mut timers) {
        assert_ne!(p.kind(), PassKind::Preemption, "inside the 50 ms floor");
    }
    assert_eq!(t.preemption_waits_until(), Some(300_000 + super::FRESH_PREEMPTION_FLOOR_MS), "the shell is told when");
    assert!(t.preemption_considered());
    // A liveness tick inside the wait never looks at preemption, so it says
    // nothing about the wait (the shell keeps it).
    let mut live = Tick::begin(at(300_020), Wake { admission: false }, &mut timers, &cfg);
    while live.next(&c.s, &h, &mut timers).is_some() {}
    assert!(!live.preemption_considered());
    assert_eq!(live.preemption_waits_until(), None);
    let passes = tick(&mut c, at(300_100), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission, PassKind::Preemption], "{passes:#?}");
    // A third finds no victim left (both nodes are held): it stays blocked,
    // and with nothing new the interval holds again; the shell learns when
    // it ends.
    c.submit(urgent(9));
    let passes = tick(&mut c, at(300_200), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission], "the pass ran and found nothing to propose");
    let mut t = Tick::begin(at(300_300), Wake { admission: true }, &mut timers, &cfg);
    while t.next(&c.s, &h, &mut timers).is_some() {}
    assert_eq!(t.preemption_waits_until(), Some(300_200 + cfg.preemption.min_pass_interval_ms));
}

#[test]
fn finished_allocations_are_forgotten_in_the_deadline_pass_after_the_retention_window() {
    let mut c = Fixture::new(1);
    let job = submit(&mut c, 1);
    c.ok(Command::CancelAllocation { alloc: job });
    let ended = c.t;
    let retention = LeaderConfig::default().retention.expect("on by default");
    let mut h = Heard::default();
    h.lead_from(ended);
    let mut timers = PassTimers::default();
    // Past the detail window, but not yet by its batch (a tenth of it):
    // nothing yet; then a compaction.
    let detail_batch = retention.batch_ms.min(retention.detail_ms / 10);
    let compact_at = ended + retention.detail_ms + detail_batch;
    assert!(tick(&mut c, at(compact_at - 1_000), Wake::default(), &mut timers, &h).is_empty());
    let passes = tick(&mut c, at(compact_at), Wake::default(), &mut timers, &h);
    assert!(matches!(passes[0].commands(), [Command::CompactFinished { .. }]), "{passes:#?}");
    assert!(c.s.compacted(job).is_some());
    // Past the retention window, but not yet by the batching minute:
    // nothing yet.
    let window = retention.retention_ms;
    assert!(tick(&mut c, at(ended + window + retention.batch_ms - 1_000), Wake::default(), &mut timers, &h).is_empty());
    let passes = tick(&mut c, at(ended + window + retention.batch_ms), Wake::default(), &mut timers, &h);
    assert_eq!(kinds(&passes)[0], PassKind::Deadlines);
    assert!(matches!(passes[0].commands(), [Command::ForgetFinished { .. }]), "{passes:#?}");
    assert!(c.s.was_forgotten(job));
    assert!(c.s.compacted(job).is_none());
    // With retention off nothing is ever forgotten, or compacted.
    let other = submit(&mut c, 1);
    c.ok(Command::CancelAllocation { alloc: other });
    let cfg = LeaderConfig { retention: None, ..LeaderConfig::default() };
    let mut timers = PassTimers::default();
    let late = at(c.t + 100 * retention.retention_ms);
    let mut t = Tick::begin(late, Wake::default(), &mut timers, &cfg);
    assert!(t.next(&c.s, &h, &mut timers).is_none());
}

/// A leader that was not leading while allocations passed both windows
/// (or a simulator whose clock jumps) finds a compaction and a forget due
/// at once: the compaction goes first, so both are accepted (`c.ok`).
#[test]
fn a_compaction_and_a_forget_due_in_one_pass_are_both_accepted() {
    let mut c = Fixture::new(1);
    let job = submit(&mut c, 1);
    c.ok(Command::CancelAllocation { alloc: job });
    let retention = LeaderConfig::default().retention.expect("on by default");
    let mut h = Heard::default();
    let late = c.t + retention.retention_ms + retention.batch_ms;
    h.lead_from(late);
    let mut timers = PassTimers::default();
    let passes = tick(&mut c, at(late), Wake::default(), &mut timers, &h);
    assert!(
        matches!(passes[0].commands(), [Command::CompactFinished { .. }, Command::ForgetFinished { .. }]),
        "{passes:#?}"
    );
    assert!(c.s.was_forgotten(job));
}

#[test]
fn more_finished_allocations_than_are_kept_whole_are_compacted_before_their_window_ends() {
    let mut c = Fixture::new(1);
    let defaults = LeaderConfig::default().retention.expect("on by default");
    let retention = crate::policy::RetentionConfig { keep_whole: 20, ..defaults };
    let cfg = LeaderConfig { retention: Some(retention), ..LeaderConfig::default() };
    let mut h = Heard::default();
    h.lead_from(c.t);
    let ids: Vec<AllocId> = (0..22).map(|_| submit(&mut c, 1)).collect();
    for &id in &ids {
        c.ok(Command::CancelAllocation { alloc: id });
    }
    // 22 held whole: within a tenth over the 20, so nothing yet.
    let mut timers = PassTimers::default();
    let mut t = Tick::begin(at(c.t + 1_000), Wake::default(), &mut timers, &cfg);
    assert!(t.next(&c.s, &h, &mut timers).is_none());
    let id = submit(&mut c, 1);
    c.ok(Command::CancelAllocation { alloc: id });
    let mut t = Tick::begin(at(c.t + 2_000), Wake::default(), &mut timers, &cfg);
    let pass = t.next(&c.s, &h, &mut timers).expect("a pass");
    assert!(
        matches!(pass.commands(), [Command::CompactFinished { keep_whole: 20, .. }]),
        "23 held whole, well within the detail window: {pass:#?}"
    );
}

/// Runs `tick` to its end without proposing anything (what it would do is
/// not the point: when it asks to be woken is).
fn finish(t: &mut Tick, c: &Fixture, h: &Heard, timers: &mut PassTimers) {
    while t.next(&c.s, h, timers).is_some() {}
}

#[test]
fn the_next_wake_keeps_a_preemption_wait_through_liveness_ticks_and_drops_it_when_nothing_waits() {
    let mut c = Fixture::new(1);
    run_on(&mut c, 0);
    let cfg = LeaderConfig::default();
    let mut h = Heard::default();
    h.lead_from(0);
    h.touch(&n(0), 400_000);
    let mut timers = PassTimers::default();
    let urgent = AllocSpec { preemption_class: 9, ..spec(1, 8) };
    c.submit(urgent);
    let passes = tick(&mut c, at(400_000), Wake { admission: true }, &mut timers, &h);
    assert_eq!(kinds(&passes), [PassKind::Admission, PassKind::Preemption]);
    // A second urgent job finds no victim left (the only job is already
    // stopping for the first): its pass waits out the 50 ms floor, and the
    // shell is told when.
    let second = c.submit(AllocSpec { preemption_class: 9, ..spec(1, 8) });
    let mut t = Tick::begin(at(400_010), Wake { admission: true }, &mut timers, &cfg);
    finish(&mut t, &c, &h, &mut timers);
    let wait = t.next_wake(&c.s, &timers, &NextWake::default());
    let due = 400_000 + super::FRESH_PREEMPTION_FLOOR_MS;
    assert_eq!(wait.preemption_ms, Some(due));
    assert_eq!(wait.admission_ms(), Some(due));
    assert_eq!(wait.liveness_ms, 400_000 + cfg.liveness_every_ms, "the liveness passes ran at 400 000");
    // A liveness tick inside the wait keeps it.
    let mut live = Tick::begin(at(400_020), Wake { admission: false }, &mut timers, &cfg);
    finish(&mut live, &c, &h, &mut timers);
    assert_eq!(live.next_wake(&c.s, &timers, &wait).preemption_ms, Some(due));
    // Once nothing waits (the second is cancelled), a tick that looks asks
    // for nothing more.
    c.ok(Command::CancelAllocation { alloc: second });
    let mut t = Tick::begin(at(400_300), Wake { admission: true }, &mut timers, &cfg);
    finish(&mut t, &c, &h, &mut timers);
    assert_eq!(t.next_wake(&c.s, &timers, &wait).preemption_ms, None);
}

#[test]
fn the_next_wake_names_the_end_of_a_back_off_on_the_monotonic_clock() {
    let mut c = Fixture::new(1);
    let id = c.submit(AllocSpec { max_retries: 5, ..spec(1, 1) });
    let epoch = c.reserve(id, &[0]);
    c.start(id, 0, 0, epoch);
    c.t += 30_000;
    c.fail(id, 0, 0, epoch);
    let at_wall = c.s.alloc(id).unwrap().retry_after_ms;
    assert!(at_wall > c.t, "the gang backs off");
    let cfg = LeaderConfig::default();
    let mut timers = PassTimers::default();
    let h = Heard::default();
    // Wall and monotonic clocks have different origins.
    let time = TickTime { wall_ms: c.t, mono_ms: 7_000 };
    let mut t = Tick::begin(time, Wake { admission: true }, &mut timers, &cfg);
    finish(&mut t, &c, &h, &mut timers);
    let next = t.next_wake(&c.s, &timers, &NextWake::default());
    assert_eq!(next.retry_ms, Some(7_000 + (at_wall - c.t)));
    assert_eq!(next.admission_ms(), next.retry_ms);
    // At the back-off's end nothing is left to wait for.
    let mut t = Tick::begin(
        TickTime { wall_ms: at_wall, mono_ms: 7_000 + (at_wall - c.t) },
        Wake::default(),
        &mut timers,
        &cfg,
    );
    finish(&mut t, &c, &h, &mut timers);
    assert_eq!(t.next_wake(&c.s, &timers, &NextWake::default()).retry_ms, None);
}
