//! What one applied entry that touches one node costs the agent hub with
//! 10,000 agent streams connected: the streams' wake-ups and sync plans.
//!
//! Run with `cargo bench -p muster-scheduler --bench hub_wake` (options
//! after `--`: `--streams N`, default 10,000; `--entries E`, default 200).
//!
//! Each stream is a tokio task holding what a hub session holds (its node
//! and a `SentMemory`) and doing what a session does when woken: read the
//! state and run `plan_sync` for its node. Every entry drains or undrains
//! one node. Two ways to wake the streams are measured on the same state,
//! in the same run:
//!
//! - **every entry**: each stream wakes on every applied entry (what the
//!   hub did when it watched Raft's applied index);
//! - **touched nodes**: each stream watches its node's key in the store's
//!   `Touches`, which the state machine's `take_touched` feeds (what the
//!   hub does now).
//!
//! It prints wall time and CPU time per entry, and wake-ups per entry.
//! Networking is left out: both ways send the same messages (one notice to
//! the touched node's agent).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use muster_core::sync::{SentMemory, SyncConfig, plan_sync};
use muster_raft_store::Touches;
use muster_scheduler::sm::{AllocSpec, ApplyCtx, Command, Event, NodeId, Resources, State};
use tokio::sync::watch;

const NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };
const CFG: SyncConfig = SyncConfig { stop_grace_ms: 15_000, preemption_grace_ms: 30_000 };

fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// `n` ready nodes, each running a one-task job.
fn cluster(n: u32) -> State {
    let mut st = State::default();
    let ctx = ApplyCtx { time_ms: 1_000 };
    let ok = |st: &mut State, cmd: Command| {
        let out = st.apply(&cmd, &ctx);
        assert!(out.is_accepted(), "{cmd:?}: {out:?}");
        out.events().to_vec()
    };
    for i in 0..n {
        let node = NodeId::new(format!("node-{i:05}"));
        ok(&mut st, Command::RegisterNode { node: node.clone(), resources: NODE, labels: BTreeMap::new() });
        ok(&mut st, Command::MarkNodeReady { node: node.clone() });
        let spec = AllocSpec::new("u", 1, Resources { gpus: 8, ..NODE }, vec!["x".into()]);
        let [Event::Submitted { alloc, .. }] = ok(&mut st, Command::Submit { spec })[..] else { panic!() };
        ok(&mut st, Command::ReserveGang { alloc, epoch: 1, nodes: vec![node.clone()] });
        ok(&mut st, Command::StartTask { alloc, task: 0, node, epoch: 1 });
    }
    st.take_touched_nodes();
    st
}

#[derive(Clone, Copy, PartialEq)]
enum Wake {
    EveryEntry,
    TouchedNodes,
}

struct Figures {
    wall_per_entry: Duration,
    cpu_per_entry_s: f64,
    wakes_per_entry: f64,
}

async fn measure(way: Wake, streams: u32, entries: u64) -> Figures {
    let state = Arc::new(RwLock::new(cluster(streams)));
    let touches = Arc::new(Touches::default());
    let (applied_tx, applied_rx) = watch::channel(0u64);
    let wakes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..streams {
        let node = NodeId::new(format!("node-{i:05}"));
        let state = state.clone();
        let wakes = wakes.clone();
        let mut sent = SentMemory::default();
        // Every stream has had its first sync.
        let first = plan_sync(&state.read().unwrap(), &node, &sent, false, &CFG);
        sent.sent(&first);
        let mut applied = applied_rx.clone();
        let mut touched = touches.watch(i);
        tasks.push(tokio::spawn(async move {
            loop {
                match way {
                    Wake::EveryEntry => {
                        if applied.changed().await.is_err() {
                            return;
                        }
                    }
                    Wake::TouchedNodes => touched.changed().await,
                }
                let plan = plan_sync(&state.read().unwrap(), &node, &sent, false, &CFG);
                sent.sent(&plan);
                wakes.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let per_entry = match way {
        Wake::EveryEntry => u64::from(streams),
        Wake::TouchedNodes => 1,
    };
    let (cpu0, t0) = (cpu_s(), Instant::now());
    for e in 0..entries {
        // Drain a node, then undrain it.
        let node = NodeId::new(format!("node-{:05}", ((e / 2) * 7919) % u64::from(streams)));
        let node_cmd = if e % 2 == 0 {
            Command::DrainNode { node, timeout_ms: 3_600_000, reason: "bench".into(), by: "bench".into() }
        } else {
            Command::CancelDrain { node, by: "bench".into() }
        };
        let touched = {
            let mut st = state.write().unwrap();
            let out = st.apply(&node_cmd, &ApplyCtx { time_ms: 2_000 + e });
            assert!(out.is_accepted(), "{node_cmd:?}: {out:?}");
            st.take_touched_nodes().into_iter().map(|s| s.0).collect::<Vec<_>>()
        };
        assert_eq!(touched.len(), 1, "one node touched");
        match way {
            Wake::EveryEntry => applied_tx.send_modify(|n| *n += 1),
            Wake::TouchedNodes => touches.touch(&touched),
        }
        let want = (e + 1) * per_entry;
        while wakes.load(Ordering::SeqCst) < want {
            tokio::task::yield_now().await;
        }
    }
    let (wall, cpu) = (t0.elapsed(), cpu_s() - cpu0);
    // Anything that would wake late has had time to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let total = wakes.load(Ordering::SeqCst);
    for t in tasks {
        t.abort();
    }
    Figures {
        wall_per_entry: wall / entries as u32,
        cpu_per_entry_s: cpu / entries as f64,
        wakes_per_entry: total as f64 / entries as f64,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let streams = opt("--streams", 10_000) as u32;
    let entries = opt("--entries", 200);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("{streams} agent streams, {entries} entries, each touching one node");
    let mut rows = Vec::new();
    for (name, way) in [("every entry", Wake::EveryEntry), ("touched nodes", Wake::TouchedNodes)] {
        let r = rt.block_on(measure(way, streams, entries));
        println!(
            "{name:<14} {:>10.1} µs wall/entry  {:>10.1} µs CPU/entry  {:>8.1} wake-ups/entry",
            r.wall_per_entry.as_secs_f64() * 1e6,
            r.cpu_per_entry_s * 1e6,
            r.wakes_per_entry
        );
        rows.push(r);
    }
    println!(
        "touched nodes: {:.0}x less wall time per entry than waking every stream",
        rows[0].wall_per_entry.as_secs_f64() / rows[1].wall_per_entry.as_secs_f64().max(1e-9)
    );
}
