//! How a replica's cost grows with work (issue 24): memory per live
//! allocation, snapshot size and build time, what a snapshot holds the
//! state's lock for (an encoding copy), restart time (decode + replay),
//! what a finished allocation costs whole and compacted, memory while a
//! million allocations pass through with compaction and retention on (it
//! must be flat), the job history's query times over a million records,
//! and the admission pass with and without a million finished allocations
//! behind it.
//!
//! Run with `cargo bench -p muster-scheduler --bench retention` (options
//! after `--`: `--allocations N`, default 1,000,000; `--live N`, default
//! 100,000).
//!
//! Memory is the heap this process holds (a counting global allocator), not
//! RSS: it is exact and does not depend on the allocator returning pages.
//! Time is wall-clock on this machine; each timing is the median of 5 runs
//! unless it says otherwise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use muster_core::history::JobRecord;
use muster_history::{Filter, Group, HistoryStore};
use muster_scheduler::policy::{AdmissionConfig, plan_admission};
use muster_scheduler::sm::{AllocSpec, ApplyCtx, Command, Event, MAX_KEEP_WHOLE, NodeId, Resources, State, TaskStatus};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a
// counter is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_mb() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / 1e6
}

const NODES: u32 = 1_000;
const NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };
const ONE_GPU: Resources = Resources { gpus: 1, vram_mb: 10_000, mem_mb: 16_000, cpus: 4 };
/// A million a day: one every 86.4 ms of entry time.
const STEP_MS: u64 = 86;
const RETENTION_MS: u64 = 3_600_000;
/// The default detail window: finished allocations are compacted after it.
const DETAIL_MS: u64 = muster_scheduler::policy::DEFAULT_DETAIL_MS;
/// The default most held whole.
const KEEP_WHOLE: u64 = muster_scheduler::policy::DEFAULT_KEEP_WHOLE;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn apply(st: &mut State, cmd: Command, t: u64) -> Vec<Event> {
    match st.apply(&cmd, &ApplyCtx { time_ms: t }) {
        muster_scheduler::sm::Outcome::Accepted(e) => e,
        muster_scheduler::sm::Outcome::Rejected(r) => panic!("{cmd:?}: {r}"),
    }
}

fn cluster() -> State {
    let mut st = State::default();
    for i in 0..NODES {
        let node = NodeId::new(format!("node-{i:05}"));
        apply(&mut st, Command::RegisterNode { node: node.clone(), resources: NODE, labels: BTreeMap::new() }, 1_000);
        apply(&mut st, Command::MarkNodeReady { node }, 1_000);
    }
    st
}

fn spec(i: u64) -> AllocSpec {
    let mut s = AllocSpec::new(
        format!("user-{:03}", i % 100),
        1,
        ONE_GPU,
        vec!["python".into(), "train.py".into(), format!("--run={i}")],
    );
    s.preemption_class = (i % 5) as u8;
    s
}

fn submit(st: &mut State, i: u64, t: u64) -> u64 {
    match apply(st, Command::Submit { spec: spec(i) }, t)[..] {
        [Event::Submitted { alloc, .. }] => alloc,
        ref other => panic!("{other:?}"),
    }
}

/// Runs allocation `i` from submit to done on node `i % NODES`.
fn pass_through(st: &mut State, i: u64, t: u64) {
    let alloc = submit(st, i, t);
    let node = NodeId::new(format!("node-{:05}", i % u64::from(NODES)));
    apply(st, Command::ReserveGang { alloc, epoch: 1, nodes: vec![node.clone()] }, t);
    apply(st, Command::StartTask { alloc, task: 0, node: node.clone(), epoch: 1 }, t);
    apply(st, Command::FinishTask { alloc, task: 0, node, epoch: 1 }, t + STEP_MS / 2);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        last = Some(f());
        times.push(t.elapsed().as_secs_f64());
    }
    (median(times), last.expect("runs ≥ 1"))
}

fn queue(st: &mut State, gangs: u64, t: u64) {
    for i in 0..gangs {
        let mut s = spec(i);
        s.gang_size = 1 + (i % 4) as u32;
        s.resources = Resources { gpus: 8, ..ONE_GPU };
        apply(st, Command::Submit { spec: s }, t);
    }
}

/// The state gauges the slow way, as a check and a yardstick: GPUs
/// reserved and running, and the queue's length, walking every allocation.
fn walk_gauges(st: &State) -> (u64, u64, u32) {
    let (mut reserved, mut running, mut queued) = (0, 0, 0);
    for a in st.allocs().values().filter(|a| !a.status.is_terminal()) {
        queued += u32::from(a.is_queued() && a.nomination.is_none());
        for t in a.tasks.iter().filter(|t| t.node.is_some()) {
            match t.status {
                TaskStatus::Running | TaskStatus::Preempting => running += u64::from(a.spec.resources.gpus),
                TaskStatus::Reserved => reserved += u64::from(a.spec.resources.gpus),
                _ => {}
            }
        }
    }
    (reserved, running, queued)
}

fn main() {
    let total = arg("--allocations", 1_000_000);
    let live = arg("--live", 100_000);
    println!("retention bench: {NODES} nodes; {live} live allocations; {total} passing through");

    // 1. Memory per live allocation, snapshot, restart.
    let base = live_mb();
    let mut st = cluster();
    let nodes_mb = live_mb() - base;
    let before = live_mb();
    let t0 = 10_000;
    for i in 0..live {
        submit(&mut st, i, t0);
    }
    let per_live = (live_mb() - before) * 1e6 / live as f64;
    println!("live state: {NODES} nodes {nodes_mb:.1} MB; {live} queued allocations: {per_live:.0} bytes each");
    let (build_s, snap) = timed(5, || st.to_snapshot());
    println!(
        "snapshot of {live} live allocations: {:.1} MB, built in {:.0} ms",
        snap.len() as f64 / 1e6,
        build_s * 1e3
    );
    let (copy_s, copy) = timed(5, || st.encoding_copy());
    let (clone_s, clone) = timed(5, || st.clone());
    println!(
        "held under the state's lock to snapshot or digest it: an encoding copy {:.1} ms (a full clone would take {:.0} ms)",
        copy_s * 1e3,
        clone_s * 1e3
    );
    drop((copy, clone));
    // Place some of the queue, so the GPU gauges have tasks to count.
    for i in 0..u64::from(NODES) / 2 {
        let node = NodeId::new(format!("node-{:05}", i));
        apply(&mut st, Command::ReserveGang { alloc: i + 1, epoch: 1, nodes: vec![node.clone()] }, t0);
        apply(&mut st, Command::StartTask { alloc: i + 1, task: 0, node, epoch: 1 }, t0);
    }
    let (gauges_s, gauges) =
        timed(5, || (muster_scheduler::server::observe::dashboard::gpu_totals(&st), st.queued_by_class().clone()));
    let (walk_s, walked) = timed(5, || walk_gauges(&st));
    assert_eq!((gauges.0.1, gauges.0.2, gauges.1.values().sum::<u32>()), walked, "the indexed gauges match a walk");
    println!(
        "the state gauges (GPUs reserved and running, queue by class), read once a second under the state's lock: \
         {:.3} ms (a walk of every allocation would take {:.1} ms)",
        gauges_s * 1e3,
        walk_s * 1e3
    );
    let replay: Vec<Command> = (0..10_000).map(|i| Command::Submit { spec: spec(live + i) }).collect();
    let (restart_s, restored) = timed(5, || {
        let mut s = State::from_snapshot(&snap).expect("decodes");
        for cmd in &replay {
            s.apply(cmd, &ApplyCtx { time_ms: t0 + 1 });
        }
        s
    });
    println!("restart: decode the snapshot and replay 10,000 entries: {:.0} ms", restart_s * 1e3);
    drop((st, snap, restored));

    // 2. Retention off: what each finished allocation costs if kept.
    let mut st = cluster();
    let before = live_mb();
    let kept = total.min(100_000);
    for i in 0..kept {
        pass_through(&mut st, i, t0 + i * STEP_MS);
        st.take_finished_records();
    }
    let per_finished = (live_mb() - before) * 1e6 / kept as f64;
    println!("retention off: {kept} finished allocations held, {per_finished:.0} bytes each");
    drop(st);

    // 2b. The same, compacted after the detail window: what each costs then.
    let mut st = cluster();
    let before = live_mb();
    for i in 0..kept {
        pass_through(&mut st, i, t0 + i * STEP_MS);
        st.take_finished_records();
    }
    let end = t0 + kept * STEP_MS + DETAIL_MS;
    let compact = Command::CompactFinished { detail_ms: DETAIL_MS, keep_whole: MAX_KEEP_WHOLE, max: 10_000 };
    let mut entry_ms = Vec::new();
    while st.compact_due(end, DETAIL_MS, MAX_KEEP_WHOLE) {
        let t = Instant::now();
        apply(&mut st, compact.clone(), end);
        entry_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("compaction: {} entries of 10,000, {:.1} ms each to apply (median)", entry_ms.len(), median(entry_ms));
    let per_compacted = (live_mb() - before) * 1e6 / kept as f64;
    println!("compacted: {} finished allocations held compacted, {per_compacted:.0} bytes each", st.compacted_len());
    drop(st);

    // 3. Retention on: a million pass through; the records go to the job
    // history as the replica's writer stores them (10,000 per transaction),
    // and the heap is sampled every tenth of the way.
    let dir = tempfile::tempdir().expect("temp dir");
    let h = HistoryStore::open(&dir.path().join("history.sqlite")).expect("opens");
    let mut st = cluster();
    let started = Instant::now();
    let mut insert_s = 0.0;
    let mut pending: Vec<JobRecord> = Vec::new();
    let mut samples = Vec::new();
    let mut next_forget = t0 + 1_000;
    for i in 0..total {
        let t = t0 + i * STEP_MS;
        pass_through(&mut st, i, t);
        if t >= next_forget {
            if st.forget_due(t, RETENTION_MS) {
                let cmd = Command::ForgetFinished { retention_ms: RETENTION_MS, key_window_ms: 0, max: 1_000 };
                apply(&mut st, cmd, t);
            }
            if st.compact_due(t, DETAIL_MS, KEEP_WHOLE) {
                let cmd = Command::CompactFinished { detail_ms: DETAIL_MS, keep_whole: KEEP_WHOLE, max: 2_000 };
                apply(&mut st, cmd, t);
            }
            next_forget = t + 1_000;
        }
        pending.extend(st.take_finished_records());
        if pending.len() >= 10_000 {
            let w = Instant::now();
            h.insert(&pending).expect("inserts");
            insert_s += w.elapsed().as_secs_f64();
            pending.clear();
        }
        if (i + 1) % (total / 10).max(1) == 0 {
            samples.push((i + 1, st.allocs().len() + st.compacted_len(), live_mb(), st.to_snapshot().len()));
        }
    }
    h.insert(&pending).expect("inserts");
    drop(pending);
    let pass_s = started.elapsed().as_secs_f64() - insert_s;
    println!(
        "retention on ({} h window, one allocation every {STEP_MS} ms of entry time): {total} passed through; \
         applying took {pass_s:.1} s ({:.1} µs per allocation, 4 commands)",
        RETENTION_MS / 3_600_000,
        pass_s * 1e6 / total as f64
    );
    println!("  after N allocations | held in the live state | heap | snapshot");
    for (n, held, heap, snap) in &samples {
        println!("  {n:>10} | {held:>8} | {heap:>7.1} MB | {:>6.1} MB", *snap as f64 / 1e6);
    }
    let file_mb = std::fs::metadata(dir.path().join("history.sqlite")).map_or(0, |m| m.len()) as f64 / 1e6;
    println!(
        "history: {} records stored in {insert_s:.1} s ({:.0}/s), {file_mb:.0} MB on disk",
        h.count().expect("count"),
        total as f64 / insert_s
    );

    // 4. Admission with a million finished allocations behind it, against a
    // fresh cluster with the same queue.
    let mut fresh = cluster();
    let t = t0 + total * STEP_MS;
    queue(&mut fresh, 1_000, t);
    queue(&mut st, 1_000, t);
    let cfg = AdmissionConfig::default();
    let (fresh_s, _) = timed(5, || plan_admission(&fresh, t, &cfg));
    let (after_s, _) = timed(5, || plan_admission(&st, t, &cfg));
    println!(
        "admission pass, 1,000 queued gangs: {:.2} ms on a fresh cluster, {:.2} ms after {total} finished ({:.2}×)",
        fresh_s * 1e3,
        after_s * 1e3,
        after_s / fresh_s
    );
    drop((st, fresh));

    // 5. The job history's queries over every record.
    let end = t0 + total * STEP_MS;
    let last_day = Some(end.saturating_sub(86_400_000));
    let queries: Vec<(&str, Filter)> = vec![
        ("one allocation by id", Filter { id: Some(total / 2), limit: 10, ..Filter::default() }),
        (
            "one owner's last day, first 1,000",
            Filter { owner: Some("user-042".into()), since_ms: last_day, limit: 1_000, ..Filter::default() },
        ),
        ("everyone's last day, first 1,000", Filter { since_ms: last_day, limit: 1_000, ..Filter::default() }),
        ("one vCluster's, first 100", Filter { vcluster: Some("default".into()), limit: 100, ..Filter::default() }),
    ];
    for (what, f) in queries {
        let (s, found) = timed(5, || h.list(&f).expect("query").len());
        println!("  history query, {what}: {:.2} ms ({found} records)", s * 1e3);
    }
    for (what, group) in [("per owner", Group::Owner), ("per owner and vCluster", Group::OwnerAndVCluster)] {
        let (s, rows) = timed(3, || h.usage(t0, end, group).expect("usage").len());
        println!("  usage over every record, {what}: {:.0} ms ({rows} rows)", s * 1e3);
    }
}
