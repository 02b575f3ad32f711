//! Fleet scale: three release-built `muster server` processes, and N node
//! agents in this process holding N agent streams over the real protocol.
//! Each agent is the real `muster_agent::Agent` (registration, the stream,
//! assignments, claims, heartbeats, hints, end reports); only its executor
//! is simulated (`muster_agent::executor::sim`): a task "runs" for a drawn
//! duration and exits 0.
//!
//! The workload: job arrays of one-GPU elements (`--array-size`, default
//! 10,000), each followed by `--gangs-per-array` four-task gangs of whole
//! nodes, from `--submitters` users at once (default 4), each submitting
//! its share of `--tasks`, together keeping at most `--backlog` tasks
//! (default 50,000) submitted and not yet started; and a probe that
//! submits a one-GPU job every 500 ms, at a higher priority than the
//! backlog, and times submit → running through its `Watch` stream, by step
//! (the entries that submitted, reserved and started it). The submitters
//! and the probe run on their own thread and connections, apart from the
//! agents' runtime. It runs until every task has started (or
//! `--max-seconds`).
//!
//! It reports: registration time; tasks started per second (overall, and
//! sustained between the 10th and the 90th percent of starts); the probe's
//! submit → running p50/p99/max; the leader's CPU and resident memory (and
//! that memory at 10 %, 50 % and all of the tasks); the replicas' applied
//! entries per second, their mean size and the followers' largest lag; the
//! agent-sync fan-out per entry; the snapshots built (copy under the lock,
//! encoding, size); the history writer's largest backlog; leader changes it
//! did not cause (it follows them). Every 10 s it prints a line of the run
//! on stderr; with `MUSTER_FLEET_LOGS=DIR` the servers' logs, a /metrics
//! scrape every 10 s and the agents' warnings (`agents.log`) go there. It
//! also reports the leader's proposals (entries, commands per entry and per
//! task, proposal to outcome) and admission passes. `--snapshot-every N` is
//! passed to the servers.
//!
//! Run: `cargo bench -p muster --bench fleet -- --nodes 10000 --tasks 1000000`.
//! Options after `--`: `--nodes N` (default 1,000), `--tasks T` (default
//! 100,000), `--array-size A`, `--gangs-per-array G` (default 10),
//! `--submitters S`, `--backlog B`,
//! `--mean-ms M` (a task's run time, uniform on [M/2, 3M/2], default 10,000),
//! `--max-seconds S` (default 600), `--kill-leader-at K` (SIGKILL the leader
//! at the K-th start: the successor's election, when placements resume and
//! when every stream is on it, with when a tenth, half and nine tenths
//! were and the successor's CPU until then; the leader's CPU figures are
//! then the first leader's), `--insecure` (no TLS; by default every replica, agent and
//! user holds its own certificate, and every stream is mutual TLS). Put
//! `TMPDIR` on a tmpfs: every agent keeps a work dir.
//!
//! Every start is recorded by the agents' executor: a task started twice
//! (at-most-once broken) is counted and reported.
//!
//! `cargo test` (CI) runs it without `--bench`, as a smoke version against
//! the debug build: 20 nodes, 800 tasks, the leader killed at the 400th
//! start; it panics unless every task started exactly once under its
//! reservation, placements resumed on the successor, every stream came back
//! to it and the report's figures were read.
//!
//! Its parts: `fleet/users.rs` (the submitters and the probe),
//! `fleet/record.rs` (the agents' own record of every start) and
//! `fleet/scrape.rs` (reading the replicas); this file starts the cluster
//! and the agents, drives the run and reports it.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_agent::agent::{Agent, AgentConfig};
use muster_agent::executor::sim::{Durations, SimConfig, SimExecutor};
use muster_proto::v1;
use muster_tls::Role;
use tokio::sync::watch;

use common::{Servers, free_port, usage};
use record::{Counting, Starts};
use scrape::{Mark, Scrape, applied, find_leader, gauge, ready_nodes};

/// The agents run on the allocator of the `muster` binary they stand for
/// (`muster agent` is jemalloc, not glibc's malloc, whose arena locks and
/// chunk merging took 9 % of this process in a profile).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "fleet/record.rs"]
mod record;
#[path = "fleet/scrape.rs"]
mod scrape;
#[path = "fleet/users.rs"]
mod users;

/// A failover's reconnect wave, as the bench sees it on the successor.
#[derive(Default)]
struct Wave {
    /// The successor's pid and CPU ticks at its election.
    successor: Option<(u32, u64)>,
    /// When 10 %, 20 %, … 100 % of the streams were on it.
    tenths: [Option<Instant>; 10],
    /// Its CPU ticks from its election until every stream was on it.
    cpu_until_back: Option<u64>,
}

impl Wave {
    /// The successor holds `streams` of `nodes` now: notes the tenths
    /// reached, and whether all are back (then its CPU since election).
    fn saw(&mut self, streams: u64, nodes: usize) -> bool {
        let now = Instant::now();
        for (i, at) in self.tenths.iter_mut().enumerate() {
            if at.is_none() && streams * 10 >= nodes as u64 * (i as u64 + 1) {
                *at = Some(now);
            }
        }
        let all = streams >= nodes as u64;
        if all && self.cpu_until_back.is_none() {
            self.cpu_until_back = self.successor.map(|(pid, at)| usage(pid).0.saturating_sub(at));
        }
        all
    }
}

/// Node `i`'s id (from `node-00001`).
fn node_name(i: usize) -> String {
    format!("node-{:05}", i + 1)
}

/// A leader kill: when, and the successor with when it was elected and
/// when every stream was on it.
type Failover = (Instant, Option<(usize, Instant)>, Option<Instant>);

fn main() {
    // `cargo test` runs this target without `--bench`: the smoke version,
    // which fails (panics) unless every task started once, the failover
    // came back and the report's figures were read.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let submitters = common::opt("--submitters", if smoke { 2 } else { 4 }).clamp(1, 64);
    let backlog = common::opt("--backlog", 50_000).max(1);
    let (nodes, tasks, array_size, gangs_per_array, mean_ms, max_seconds, kill_at) = if smoke {
        (20, 800, 200, 2, 1_000, 300, 400)
    } else {
        (
            common::opt("--nodes", 1_000) as usize,
            common::opt("--tasks", 100_000),
            common::opt("--array-size", 10_000).clamp(1, 1_000_000),
            common::opt("--gangs-per-array", 10),
            common::opt("--mean-ms", 10_000),
            common::opt("--max-seconds", 600),
            common::opt("--kill-leader-at", 0),
        )
    };
    let snapshot_every = common::opt("--snapshot-every", 0);
    let insecure = std::env::args().any(|a| a == "--insecure");
    // The servers' logs, when MUSTER_FLEET_LOGS names a directory (made if
    // it is not there).
    let logs = std::env::var_os("MUSTER_FLEET_LOGS").map(std::path::PathBuf::from);
    if let Some(dir) = &logs {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("MUSTER_FLEET_LOGS={}: {e}", dir.display()));
        // The agents' warnings (a task that did not start, a fence, a
        // stream that failed) go there too.
        let file = std::fs::File::create(dir.join("agents.log")).unwrap();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // The submitters and the probe (the cluster's users) run on their own
    // thread, with their own connections: on the agents' runtime they would
    // wait behind 10,000 agents' work for a turn, and time this process's
    // queue rather than the control plane's.
    let users_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fleet-users")
        .enable_all()
        .build()
        .unwrap();
    let users = users_rt.handle().clone();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        // Mutual TLS (unless --insecure): the servers', the bench's (an
        // admin, to list nodes), the users' (a client) and one per agent.
        let (admin, user, agent_certs) = if insecure {
            (None, None, Vec::new())
        } else {
            let issued = Instant::now();
            let roles: Vec<Role> = (1..=3)
                .map(Role::Server)
                .chain([Role::Admin("bench".into()), Role::Client("fleet".into())])
                .chain((0..nodes).map(|i| Role::Agent(node_name(i))))
                .collect();
            let mut m = muster_local::ensure_certs(&dir.path().join("tls"), &roles).expect("issue the certificates");
            let agents = m.split_off(5);
            if !smoke {
                println!("  issued {} certificates in {:.1} s", roles.len(), issued.elapsed().as_secs_f64());
            }
            let user = m.pop();
            (m.pop(), user, agents)
        };
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let https: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let room = (nodes + 200).to_string();
        let mut servers = Servers(
            (0..3)
                .map(|i| {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
                    cmd.arg("server");
                    if insecure {
                        cmd.arg("--insecure");
                    } else {
                        cmd.env("MUSTER_TLS_DIR", dir.path().join("tls"));
                    }
                    cmd.args(["--node-admission", "open"])
                        .args(["--max-connections", &room, "--max-connections-per-peer", &room])
                        .args(["--id", &(i + 1).to_string(), "--listen", &addrs[i], "--peers", &peers.join(",")])
                        .args(["--http", &https[i]])
                        .arg("--data-dir")
                        .arg(dir.path().join(format!("d{i}")))
                        .args(if snapshot_every > 0 {
                            vec!["--snapshot-every".to_string(), snapshot_every.to_string()]
                        } else {
                            vec![]
                        })
                        .stdout(Stdio::null())
                        .stderr(logs.as_ref().map_or(Stdio::null(), |d| {
                            std::fs::File::create(d.join(format!("server-{}.log", i + 1))).unwrap().into()
                        }))
                        .spawn()
                        .unwrap()
                })
                .collect(),
        );
        let leader = find_leader(&https, None).await;
        let pid = servers.0[leader].id();
        let mut ch = muster_tls::endpoint(&addrs[leader], admin.as_ref()).unwrap().connect().await.unwrap();

        // The fleet: real agents, simulated tasks.
        let starts = Arc::new(Starts {
            origin: Instant::now(),
            count: AtomicU64::new(0),
            per_tenth: Mutex::default(),
            tasks: Mutex::default(),
            same_epoch: AtomicU64::new(0),
            overlapping: AtomicU64::new(0),
            restarted: AtomicU64::new(0),
            restarted_gang: AtomicU64::new(0),
            distinct_work: AtomicU64::new(0),
        });
        let mean = Duration::from_millis(mean_ms);
        let sim = SimConfig {
            durations: Durations::Uniform(mean / 2, mean * 3 / 2),
            seed: 51,
            term_delay: Duration::from_millis(100),
            hint_reply: Some(Duration::from_millis(500)),
        };
        let registering = Instant::now();
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::new();
        for i in 0..nodes {
            let node_id = node_name(i);
            let cfg = AgentConfig {
                node_id: node_id.clone(),
                schedulers: addrs.clone(),
                resources: v1::Resources { gpus: 8, vram_mb: 80_000, mem_mb: 512_000, cpus: 64 },
                labels: Default::default(),
                address: format!("10.{}.{}.{}:29500", i / 65_536, i / 256 % 256, i % 256),
                ports: muster_core::sm::PortRange { first: 29_500, count: 500 },
                work_dir: dir.path().join("agents").join(&node_id),
                backoff: (Duration::from_millis(200), Duration::from_secs(5)),
                watchdog: muster_agent::watchdog::WatchdogConfig {
                    gpu_health: false,
                    poll: Duration::from_secs(5),
                    ..Default::default()
                },
                sampler: muster_agent::agent::null_sampler,
                exit_when_stopped: false,
                task_shim: None,
                tls: agent_certs.get(i).cloned(),
                clock: Default::default(),
                janitor: Default::default(),
                fence: true,
                forget_leftovers: false,
                disk_fault_file: None,
                start_without_record: false,
                checkpoint_listen: None,
                checkpoint_address: String::new(),
                isolation: None,
                run_as: muster_agent::users::RunAs::agent(),
                exe: None,
                images: None,
                executor: Some(Arc::new(Counting { sim: SimExecutor::new(sim, &node_id), starts: starts.clone() })),
            };
            let agent = Agent::new(cfg).expect("an agent's work dir");
            handles.push(tokio::spawn(agent.run(stopped.clone())));
        }
        loop {
            // The 10,000 registrations can cost the leader its lead (an
            // election nobody caused): a replica that no longer leads
            // refuses the listing, so the wait follows the leader.
            let (ready, error) = match ready_nodes(&ch).await {
                Ok(ready) => (ready, None),
                Err(e) => {
                    let now = find_leader(&https, None).await;
                    if let Ok(c) = muster_tls::endpoint(&addrs[now], admin.as_ref()).unwrap().connect().await {
                        ch = c;
                    }
                    (0, Some(e))
                }
            };
            if ready >= nodes {
                break;
            }
            if registering.elapsed() > Duration::from_secs(max_seconds) {
                let why = error.map_or(String::new(), |e| format!(" (the listing: {e})"));
                println!("only {ready} of {nodes} nodes registered in {max_seconds} s{why}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let registered_in = registering.elapsed();

        // Load: arrays and gangs, and the probe.
        let (cpu0, rss0) = usage(pid);
        let followers: Vec<u32> = (0..3).filter(|&i| i != leader).map(|i| servers.0[i].id()).collect();
        let followers_cpu0: Vec<u64> = followers.iter().map(|&p| usage(p).0).collect();
        let (fleet_cpu0, _) = usage(std::process::id());
        let applied0: Vec<u64> = https.iter().map(|h| applied(h)).collect();
        let leader0 = Scrape::of(&https[leader]);
        let fanout0 = (leader0.value("muster_agent_sync_seconds_sum"), leader0.value("muster_agent_sync_seconds_count"));
        let appended0 = leader0.value("muster_raft_appended_bytes_total");
        let load = Instant::now();
        let started_before = starts.count.load(Ordering::Relaxed);
        let done = Arc::new(AtomicBool::new(false));
        // The users' leader, followed after a failover.
        let current = users::LeaderAddr::new(&addrs[leader], user);
        let workload = users::Workload { tasks, submitters, backlog, array_size, gangs_per_array };
        let submitting = users::submit(&users, &workload, &current, &starts);
        let probe = users::probe(&users, current.clone(), done.clone());
        let rss_peak = {
            let done = done.clone();
            tokio::spawn(async move {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(usage(pid).1);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                peak
            })
        };
        let mut lag_max = 0u64;
        let mut history_backlog = 0u64;
        // The leader's resident memory and latest snapshot when 10 %, 50 %
        // and all of the tasks had started.
        let marks = [tasks / 10, tasks / 2, tasks];
        let mut at_marks: Vec<Mark> = Vec::new();
        let mut last_scrape = Instant::now();
        // The replica the submitters talk to; elections nobody caused
        // (no kill) are followed, and counted.
        let mut leading = leader;
        let mut elections = Vec::new();
        // Every 10 s, a line on stderr: how the run goes (not in the smoke).
        let mut last_line = (Instant::now(), 0u64, cpu0, applied0[leader]);
        if !smoke {
            eprintln!("    t(s)  starts/s  applied  entries/s  leader-cpu  leader-MiB  queued  history-missing  streams");
        }
        // A failover: (the kill, the successor elected, all streams on it).
        let mut failover: Option<Failover> = None;
        // The reconnect wave after it: when a tenth, two tenths, … of the
        // streams were on the successor, and its CPU ticks from its
        // election until all were.
        let mut wave = Wave::default();
        let (mut last_idle_check, mut last_progress) = (Instant::now(), (Instant::now(), 0));
        let submitted = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = starts.count.load(Ordering::Relaxed) - started_before;
            let distinct = starts.distinct_work.load(Ordering::Relaxed);
            if kill_at > 0 && failover.is_none() && started >= kill_at {
                // The replica that leads now: an election nobody caused
                // (followed above) may have moved the leadership.
                let _ = servers.0[leading].kill();
                let killed = Instant::now();
                let next = find_leader(&https, Some(leading)).await;
                let elected = Instant::now();
                wave.successor = Some((servers.0[next].id(), usage(servers.0[next].id()).0));
                current.set(&addrs[next]);
                failover = Some((killed, Some((next, elected)), None));
            }
            if let Some((_, Some((next, _)), back @ None)) = &mut failover
                && wave.saw(gauge(&https[*next], "muster_agent_streams"), nodes)
            {
                *back = Some(Instant::now());
            }
            if last_scrape.elapsed() >= Duration::from_secs(1) && failover.is_none() {
                last_scrape = Instant::now();
                // One scrape of each replica a second.
                let mut scrapes: Vec<Scrape> = https.iter().map(|h| Scrape::of(h)).collect();
                let now: Vec<u64> = scrapes.iter().map(|s| s.value("muster_raft_applied_index") as u64).collect();
                let top = now.iter().copied().max().unwrap_or(0);
                lag_max = lag_max.max(top - now.iter().copied().min().unwrap_or(0));
                let l = scrapes.swap_remove(leading);
                if l.value("muster_raft_is_leader") < 1.0 {
                    let next = find_leader(&https, None).await;
                    if next != leading {
                        current.set(&addrs[next]);
                        eprintln!("  replica {} leads now, at {:.0} s", next + 1, load.elapsed().as_secs_f64());
                        elections.push((load.elapsed().as_secs_f64(), next));
                        leading = next;
                    }
                }
                history_backlog = history_backlog.max(l.value("muster_history_missing") as u64);
                if let Some(&mark) = marks.get(at_marks.len())
                    && distinct >= mark
                {
                    at_marks.push(Mark::read(distinct, usage(pid).1, &l));
                }
                if !smoke && last_line.0.elapsed() >= Duration::from_secs(10) {
                    let secs = last_line.0.elapsed().as_secs_f64();
                    let (cpu, rss) = usage(pid);
                    let applied = now[leading];
                    eprintln!(
                        "  {:6.0}  {:8.0}  {applied:7}  {:9.1}  {:9.0} %  {:10}  {:6.0}  {:15.0}  {:7.0}",
                        load.elapsed().as_secs_f64(),
                        (started - last_line.1) as f64 / secs,
                        applied.saturating_sub(last_line.3) as f64 / secs,
                        (cpu - last_line.2) as f64 / secs,
                        rss / 1024,
                        l.value("muster_sm_queue_depth"),
                        l.value("muster_history_missing"),
                        l.value("muster_agent_streams"),
                    );
                    last_line = (Instant::now(), started, cpu, applied);
                    if let Some(d) = &logs {
                        let _ = std::fs::write(d.join(format!("metrics-{:.0}.txt", load.elapsed().as_secs_f64())), &l.0);
                    }
                }
            }
            // When a task of the workload last started.
            if distinct != last_progress.1 {
                last_progress = (Instant::now(), distinct);
            }
            if submitting.iter().all(|s| s.is_finished()) {
                if distinct >= tasks {
                    break tasks;
                }
                // Tasks that will never start (an allocation that failed:
                // a gang that could not be restarted whole) end the run
                // once the leader has nothing queued or reserved and no
                // task of the workload has started for 20 s (longer than
                // any runs).
                if last_idle_check.elapsed() >= Duration::from_secs(1)
                    && last_progress.0.elapsed() >= Duration::from_secs(20)
                {
                    last_idle_check = Instant::now();
                    let now_leading = failover.as_ref().and_then(|f| f.1).map_or(leading, |(next, _)| next);
                    let l = Scrape::of(&https[now_leading]);
                    if l.value("muster_raft_is_leader") >= 1.0
                        && l.value("muster_sm_queue_depth") == 0.0
                        && l.series("muster_gpus{state=\"reserved\"}") == 0.0
                    {
                        break tasks;
                    }
                }
            }
            if load.elapsed() > Duration::from_secs(max_seconds) {
                println!("stopped after {max_seconds} s with {started} of {tasks} tasks started");
                break started;
            }
        };
        let elapsed = load.elapsed().as_secs_f64();
        // The last streams may come back after the last start (an agent's
        // back-off): waited for, up to a minute, so "never" is a real one.
        if let Some((_, Some((next, _)), back @ None)) = &mut failover {
            let until = Instant::now() + Duration::from_secs(60);
            while Instant::now() < until {
                if wave.saw(gauge(&https[*next], "muster_agent_streams"), nodes) {
                    *back = Some(Instant::now());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        done.store(true, Ordering::Relaxed);
        let (cpu1, rss1) = usage(pid);
        let applied1: Vec<u64> = https.iter().map(|h| applied(h)).collect();
        let last = failover.as_ref().and_then(|f| f.1).map_or(leading, |(next, _)| next);
        let ended = Scrape::of(&https[last]);
        if failover.is_none() && at_marks.len() < marks.len() {
            let distinct = starts.distinct_work.load(Ordering::Relaxed);
            at_marks.push(Mark::read(distinct, rss1, &ended));
        }
        let rss_peak = rss_peak.await.unwrap_or(0).max(rss1);
        // The probes submitted while the workload ran: not those of the
        // quiet end of a run whose last tasks never started.
        let probes: Vec<users::ProbeTimes> =
            probe.await.unwrap_or_default().into_iter().filter(|p| p.at <= last_progress.0).collect();
        let per_second = starts.per_second();
        // Sustained: the 10th to the 90th percent of starts.
        let total: u64 = per_second.iter().sum();
        let (mut acc, mut from, mut to) = (0u64, None, None);
        for (s, n) in per_second.iter().enumerate() {
            acc += n;
            if from.is_none() && acc * 10 >= total {
                from = Some(s);
            }
            if to.is_none() && acc * 10 >= total * 9 {
                to = Some(s);
            }
        }
        let (from, to) = (from.unwrap_or(0), to.unwrap_or(0).max(from.unwrap_or(0) + 1));
        let sustained = per_second[from..to.min(per_second.len())].iter().sum::<u64>() as f64 / (to - from) as f64;

        println!(
            "fleet: {nodes} real agents (simulated tasks, 8 GPUs each), 3 {} muster servers, {}; \
             {submitted} tasks from {submitters} submitters in arrays of {array_size} one-GPU elements and four-node \
             gangs; run time uniform \
             {:.1}-{:.1} s",
            if cfg!(debug_assertions) { "debug" } else { "release" },
            if insecure { "insecure" } else { "mutual TLS, a certificate per agent" },
            mean.as_secs_f64() / 2.0,
            mean.as_secs_f64() * 1.5
        );
        println!("  registered {nodes} nodes in {:.1} s", registered_in.as_secs_f64());
        println!(
            "  tasks started: {:.0}/s over the run ({submitted} in {elapsed:.1} s); sustained {sustained:.0}/s \
             (the 10th to the 90th percent of starts, seconds {from}-{to})",
            submitted as f64 / elapsed
        );
        users::report(&probes);
        println!(
            "  leader: {:.0} % of a core; resident {} MiB before the load, peak {} MiB",
            (cpu1 - cpu0) as f64 / 100.0 / elapsed * 100.0,
            rss0 / 1024,
            rss_peak / 1024
        );
        let entries = applied1[last].saturating_sub(applied0[last]);
        // Counted by the leader the run ended with (after a failover, the
        // successor's own counts: its bytes and syncs since it started).
        let (fan_sum0, fan_count0, appended0) = if last == leader { (fanout0.0, fanout0.1, appended0) } else { (0.0, 0.0, 0.0) };
        let appended = ended.value("muster_raft_appended_bytes_total") - appended0;
        println!(
            "  log: {entries} entries applied, {:.0}/s, {:.0} bytes each on average ({:.2} MB/s); followers' largest \
             lag {lag_max} entries",
            entries as f64 / elapsed,
            appended / entries.max(1) as f64,
            appended / elapsed / 1e6,
        );
        // What the leader proposed: its entries' commands, and how long
        // each entry took from its proposal to its outcome (the commit and
        // apply, not its commands' wait to be batched); and its admission
        // passes.
        let since = |name: &str| ended.value(name) - if last == leader { leader0.value(name) } else { 0.0 };
        let (proposed, commit_s, commands) = (
            since("muster_raft_commit_seconds_count"),
            since("muster_raft_commit_seconds_sum"),
            since("muster_raft_batch_commands_sum"),
        );
        let (passes, pass_s) = (since("muster_admission_pass_seconds_count"), since("muster_admission_pass_seconds_sum"));
        println!(
            "  the leader's proposals: {proposed:.0} entries of {:.1} commands on average ({:.0} commands/s, {:.1} a \
             task started), {:.1} ms each from proposal to outcome; {passes:.0} admission passes, {:.1} ms each to \
             decide",
            commands / proposed.max(1.0),
            commands / elapsed,
            commands / submitted.max(1) as f64,
            commit_s / proposed.max(1.0) * 1e3,
            pass_s / passes.max(1.0) * 1e3,
        );
        let (syncs, sync_s) = (
            ended.value("muster_agent_sync_seconds_count") - fan_count0,
            ended.value("muster_agent_sync_seconds_sum") - fan_sum0,
        );
        println!(
            "  agent-sync fan-out: {syncs:.0} stream syncs, {:.2} per entry, {:.0} us each; {:.2} ms per entry, {:.0} % \
             of a core",
            syncs / entries.max(1) as f64,
            sync_s / syncs.max(1.0) * 1e6,
            sync_s / entries.max(1) as f64 * 1e3,
            sync_s / elapsed * 100.0,
        );
        let (snaps, copy_s, encode_s) = (
            ended.value("muster_raft_snapshot_encode_seconds_count"),
            ended.value("muster_raft_snapshot_copy_seconds_sum"),
            ended.value("muster_raft_snapshot_encode_seconds_sum"),
        );
        println!(
            "  snapshots built by the leader: {snaps:.0}, each a {:.0} ms copy under the state's lock and a {:.0} ms \
             encoding; the latest {:.1} MB",
            copy_s / snaps.max(1.0) * 1e3,
            encode_s / snaps.max(1.0) * 1e3,
            ended.value("muster_raft_snapshot_bytes") / 1e6,
        );
        println!("  history writer: largest backlog {history_backlog} records (muster_history_missing, per second)");
        if !at_marks.is_empty() {
            let first = at_marks[0].rss_kib.max(1) as f64;
            let first_heap = at_marks[0].allocated.max(1) as f64;
            let marks: Vec<String> = at_marks
                .iter()
                .map(|Mark { started: n, rss_kib: rss, snapshot: snap, whole, compacted, allocated: heap, kept }| {
                    format!(
                        "{n} started: {} MiB ({:+.0} %; live allocations {} MiB, {:+.0} %; the allocator's \
                         resident {} MiB), snapshot {:.1} MB, {whole} allocations held whole and {compacted} \
                         compacted",
                        rss / 1024,
                        (*rss as f64 / first - 1.0) * 100.0,
                        heap >> 20,
                        (*heap as f64 / first_heap - 1.0) * 100.0,
                        kept >> 20,
                        *snap as f64 / 1e6
                    )
                })
                .collect();
            println!("  leader memory: {}", marks.join("; "));
        }
        if let Some((killed, elected, back)) = failover {
            let s = |d: Option<Duration>| d.map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
            let elected_at = elected.map(|(_, at)| at);
            println!(
                "  failover: leader killed (SIGKILL) at start {kill_at}; successor elected after {}; placements \
                 resumed after {} (its first start); all {nodes} streams on it after {}",
                s(elected_at.map(|at| at - killed)),
                s(elected_at.and_then(|at| starts.first_after(at)).zip(elected_at).map(|(d, at)| at + d - killed)),
                s(back.map(|at| at - killed)),
            );
            let tenths: Vec<String> = [0, 4, 8]
                .iter()
                .map(|&i| wave.tenths[i].map_or("never".to_string(), |at| format!("{:.1}", (at - killed).as_secs_f64())))
                .collect();
            let cpu = match (elected_at, back, wave.cpu_until_back) {
                (Some(from), Some(to), Some(ticks)) => {
                    format!("{:.0} % of a core", ticks as f64 / (to - from).as_secs_f64().max(0.01))
                }
                _ => "-".to_string(),
            };
            println!(
                "  reconnect wave: 10 %, 50 %, 90 % of the streams on the successor after {} s; the successor used {cpu} \
                 from its election until all were",
                tenths.join(", ")
            );
        }
        if !elections.is_empty() {
            let at: Vec<String> =
                elections.iter().map(|(t, r)| format!("replica {} at {t:.0} s", r + 1)).collect();
            println!("  leader changes nobody caused: {} ({})", elections.len(), at.join(", "));
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let broken = load(&starts.same_epoch) + load(&starts.overlapping);
        println!(
            "  the agents' own record: {} of the {tasks} tasks started ({} probes); started again under the same \
             reservation {}, while still running {}{}; restarted under a new reservation after their attempt ended {} \
             (of gangs {}); allocations failed (a gang not restarted whole, ...) {:.0}",
            load(&starts.distinct_work),
            starts.tasks.lock().unwrap().len() as u64 - load(&starts.distinct_work),
            load(&starts.same_epoch),
            load(&starts.overlapping),
            if broken == 0 { "" } else { " (AT-MOST-ONCE BROKEN)" },
            load(&starts.restarted),
            load(&starts.restarted_gang),
            ended.value("muster_allocations_failed_total"),
        );
        let (fleet_cpu1, fleet_rss) = usage(std::process::id());
        let followers_cpu: Vec<String> = followers
            .iter()
            .zip(&followers_cpu0)
            .map(|(&p, &c0)| format!("{:.0} %", (usage(p).0 - c0) as f64 / elapsed))
            .collect();
        println!("  followers: {} of a core each", followers_cpu.join(", "));
        println!(
            "  this process (the {nodes} agents and the submitters): {:.0} % of a core, resident {} MiB",
            (fleet_cpu1 - fleet_cpu0) as f64 / elapsed,
            fleet_rss / 1024
        );
        if smoke {
            assert!(registered_in < Duration::from_secs(max_seconds), "the fleet registered");
            assert_eq!(starts.distinct_work.load(Ordering::Relaxed), tasks, "every task of the workload started");
            assert_eq!(broken, 0, "no task started twice under one reservation, or while it still ran");
            assert!(!probes.is_empty(), "the probe's jobs started");
            assert!(entries > 0 && appended > 0.0, "the log's figures were read");
            assert!(syncs > 0.0, "the fan-out's figures were read");
            assert!(ended.value("muster_allocator_allocated_bytes") > 0.0, "the allocator's figures were read");
            let (_, elected, back) = failover.expect("the leader was killed");
            let elected = elected.expect("a successor was elected").1;
            assert!(starts.first_after(elected).is_some(), "placements resumed on the successor");
            assert!(back.is_some(), "every stream came back to the successor");
        }
        let _ = stop.send(true);
        for h in handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        drop(servers);
    });
    users_rt.shutdown_background();
}
