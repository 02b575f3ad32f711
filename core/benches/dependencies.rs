//! What dependencies cost a replica's apply (issue 48): a submit that waits
//! against a plain one, and one cancel that fails N waiting dependents in a
//! single entry (a fan-out on one allocation, and a chain) against N
//! cancels of N plain queued allocations, one entry each. Both sides run in
//! the same process, on the same state sizes.
//!
//! Run with `cargo bench -p muster-core --bench dependencies` (after `--`:
//! `--n N`, default 20,000; `--runs R`, default 5). Each figure is the
//! median of the runs, with the spread (min–max).

use std::time::{Duration, Instant};

use muster_core::sm::{
    After, AfterWhen, AllocId, AllocSpec, ApplyCtx, Command, Dependency, Event, NodeId, Outcome, Resources, State,
};

fn spec() -> AllocSpec {
    AllocSpec::new("bench", 1, Resources { gpus: 1, vram_mb: 0, mem_mb: 1_000, cpus: 1 }, vec!["true".into()])
}

fn apply(st: &mut State, cmd: Command) -> Vec<Event> {
    match st.apply(&cmd, &ApplyCtx { time_ms: 1_000 }) {
        Outcome::Accepted(e) => e,
        Outcome::Rejected(r) => panic!("{cmd:?}: {r}"),
    }
}

fn submitted(events: &[Event]) -> AllocId {
    match events {
        [Event::Submitted { alloc, .. }, ..] => *alloc,
        other => panic!("{other:?}"),
    }
}

fn fresh() -> State {
    let mut st = State::default();
    let node = NodeId("n0".to_string());
    let resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };
    apply(&mut st, Command::RegisterNode { node: node.clone(), resources, labels: Default::default() });
    apply(&mut st, Command::MarkNodeReady { node });
    st
}

/// One run: (plain submit, waiting submit, plain cancel, cascade per
/// dependent in a fan-out, in a chain), each per allocation.
fn run(n: usize) -> [Duration; 5] {
    // Plain: n queued allocations, submitted then cancelled one by one.
    let mut st = fresh();
    let t = Instant::now();
    let ids: Vec<AllocId> = (0..n).map(|_| submitted(&apply(&mut st, Command::Submit { spec: spec() }))).collect();
    let plain_submit = t.elapsed() / n as u32;
    let t = Instant::now();
    for id in ids {
        apply(&mut st, Command::CancelAllocation { alloc: id });
    }
    let plain_cancel = t.elapsed() / n as u32;

    let mut out = [plain_submit, Duration::ZERO, plain_cancel, Duration::ZERO, Duration::ZERO];
    for (slot, chain) in [(3, false), (4, true)] {
        let mut st = fresh();
        let head = submitted(&apply(&mut st, Command::Submit { spec: spec() }));
        let mut last = head;
        let t = Instant::now();
        for _ in 0..n {
            let on = if chain { last } else { head };
            let after = After { deps: vec![Dependency { on, when: AfterWhen::Ok }], ..After::default() };
            last = submitted(&apply(&mut st, Command::Submit { spec: AllocSpec { after, ..spec() } }));
        }
        if !chain {
            out[1] = t.elapsed() / n as u32;
        }
        let t = Instant::now();
        let events = apply(&mut st, Command::CancelAllocation { alloc: head });
        out[slot] = t.elapsed() / n as u32;
        assert_eq!(events.len(), n + 1, "the head's cancel and every dependent's failure");
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (n, runs) = (arg("--n", 20_000), arg("--runs", 5).max(1));
    let mut all: Vec<[Duration; 5]> = (0..runs).map(|_| run(n)).collect();
    let names = [
        "submit, plain",
        "submit, waiting on one allocation",
        "cancel, plain queued (one entry each)",
        "failed in one cascade entry, fan-out",
        "failed in one cascade entry, chain",
    ];
    println!("dependencies: {n} allocations, {runs} runs; per allocation, median (min–max)");
    let mut medians = [Duration::ZERO; 5];
    for (k, name) in names.iter().enumerate() {
        all.sort_by_key(|r| r[k]);
        let (lo, mid, hi) = (all[0][k], all[runs / 2][k], all[runs - 1][k]);
        medians[k] = mid;
        println!("  {name:<40} {:>7.2} µs ({:.2}–{:.2})", us(mid), us(lo), us(hi));
    }
    println!("  waiting submit / plain submit: {:.2}×", us(medians[1]) / us(medians[0]));
    println!("  cascade fan-out / plain cancel: {:.2}×", us(medians[3]) / us(medians[2]));
    println!("  cascade chain / plain cancel: {:.2}×", us(medians[4]) / us(medians[2]));
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
