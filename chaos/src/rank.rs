//! `muster chaos-rank`: the chaos workload's task, one rank of a gang that
//! behaves like a training job's.
//!
//! - Every rank journals its start, a beat every 250 ms while it lives, and
//!   its end: `end` when it finishes or is stopped (SIGTERM: exit 143),
//!   `lost` when it gives up on its peers (exit 1). Lines are
//!   `WHAT ALLOC TASK ATTEMPT EPOCH NODE MS`, one `write` each to a file
//!   opened for appending.
//! - Task 0, the master, listens on a port and registers it with the gang
//!   fabric ([`super::fabric`]); every other rank joins it there. Each side
//!   sends `beat` every 250 ms. Once every rank has joined, the master
//!   counts `--beats` steps (a beat of its own with every rank heard from
//!   in the last 600 ms, as an all-reduce needs every rank), tells every
//!   rank `done`, and they all end.
//! - A rank that hears nothing from its master for 2 s, or whose master's
//!   connection closes, gives up (as a rank whose collective timed out).
//!   The master waits for a silent rank for 60 s, as a rank blocked in a
//!   collective does: only the scheduler's teardown stops it sooner.
//! - A master whose ranks have not all joined within 30 s gives up too.
//! - With `CHAOS_DAEMON=1` (the daemonising workload), a rank first starts
//!   a daemon that escapes its process group and beats as the rank's
//!   attempt until killed ([`daemon`]).
//! - With `CHAOS_CHECKPOINT_MB` set (the large-checkpoint workload), a rank
//!   first checks the state it was restored with, if it resumes (`resumed`,
//!   or `corrupt` when the bytes are not the ones a rank wrote), then writes
//!   that many MiB of fresh state to its checkpoint directory, renamed into
//!   place: every exit, preemption and teardown then saves a large
//!   checkpoint.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::fabric::{JOIN_WAIT, read_line};
use super::workload::now_ms;

/// How often a rank beats.
const BEAT: Duration = Duration::from_millis(250);

/// How long a rank waits for a word from its master.
pub const RANK_PATIENCE: Duration = Duration::from_secs(2);

/// A step counts only if every rank was heard from this recently.
const STEP_WAIT: Duration = Duration::from_millis(600);

/// How long the master waits for a word from a rank.
pub const MASTER_PATIENCE: Duration = Duration::from_secs(60);

/// The exit status of a rank that gave up on its peers.
const GAVE_UP: i32 = 1;

/// The exit status of a rank stopped by SIGTERM (as a shell's).
const TERMINATED: i32 = 143;

/// Where this rank's lines go, and what they name.
struct Journal {
    file: Option<std::fs::File>,
    id: String,
}

impl Journal {
    fn stamp(&mut self, what: &str) {
        if let Some(f) = self.file.as_mut() {
            let _ = f.write_all(format!("{what} {} {}\n", self.id, now_ms()).as_bytes());
        }
    }

    /// Journals how the rank ends and returns its exit status.
    fn finish(&mut self, status: i32) -> i32 {
        self.stamp(if status == GAVE_UP { "lost" } else { "end" });
        status
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// Runs the rank; returns its exit status.
pub fn main(beats: u64) -> i32 {
    let file = std::fs::OpenOptions::new().append(true).create(true).open(env("CHAOS_JOURNAL")).ok();
    let id =
        ["MUSTER_ALLOC_ID", "MUSTER_TASK_INDEX", "MUSTER_ATTEMPT", "MUSTER_EPOCH", "MUSTER_NODE_ID"].map(env).join(" ");
    let mut journal = Journal { file, id };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chaos-rank: {e}");
            return 2;
        }
    };
    journal.stamp("start");
    if env("CHAOS_DAEMON") == "1"
        && let Err(e) = start_daemon()
    {
        eprintln!("chaos-rank: cannot start its daemon: {e}");
    }
    let state_mb: u64 = env("CHAOS_CHECKPOINT_MB").parse().unwrap_or(0);
    if state_mb > 0 {
        match checkpoint_state(state_mb) {
            Ok(Some(true)) => journal.stamp("resumed"),
            Ok(Some(false)) => journal.stamp("corrupt"),
            Ok(None) => {}
            Err(e) => eprintln!("chaos-rank: cannot write its state: {e}"),
        }
    }
    let gang: u32 = env("MUSTER_GANG_SIZE").parse().unwrap_or(1).max(1);
    let task: u32 = env("MUSTER_TASK_INDEX").parse().unwrap_or(0);
    let gang_id = (env("MUSTER_ALLOC_ID"), env("MUSTER_EPOCH"), env("MUSTER_NODE_ID"));
    let fabric = env("CHAOS_FABRIC");
    let status = rt.block_on(async {
        let Ok(mut term) = signal(SignalKind::terminate()) else { return GAVE_UP };
        let run = async {
            if task == 0 {
                master(&mut journal, beats, gang, &fabric, &gang_id).await
            } else {
                rank(&mut journal, task, &fabric, &gang_id).await
            }
        };
        tokio::select! {
            status = run => status,
            _ = term.recv() => TERMINATED,
        }
    });
    journal.finish(status)
}

/// The daemonising workload (`muster chaos --daemonising-tasks`): each rank
/// starts `muster chaos-daemon`, which leaves the rank's process group and
/// session (`setsid`), ignores SIGTERM and beats in the journal as the rank's
/// attempt until it is killed. Only an agent that kills the attempt's whole
/// cgroup ends it with the rank; one that signals the process group leaves
/// it beating past the attempt's end, where `gpus_never_overbooked` and
/// `journal_consistent` see it overlap the next attempt.
fn start_daemon() -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("chaos-daemon")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid and signal are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            Ok(())
        });
    }
    // Not waited for: it outlives the rank unless its cgroup is killed
    // (its zombie, if the rank outlives it, goes with the rank).
    cmd.spawn().map(drop)
}

/// `muster chaos-daemon`: beats in the journal as the attempt that started
/// it, every 250 ms, until killed.
pub fn daemon() -> i32 {
    let file = std::fs::OpenOptions::new().append(true).create(true).open(env("CHAOS_JOURNAL")).ok();
    let id =
        ["MUSTER_ALLOC_ID", "MUSTER_TASK_INDEX", "MUSTER_ATTEMPT", "MUSTER_EPOCH", "MUSTER_NODE_ID"].map(env).join(" ");
    let mut journal = Journal { file, id };
    loop {
        journal.stamp("beat");
        std::thread::sleep(BEAT);
    }
}

/// FNV-1a, 64 bits: enough to tell the state a rank wrote from any other.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Checks the state a resumed rank was given (`Some(intact)`; `None` when
/// it starts afresh), then writes `mb` MiB of new state: 8 bytes of
/// checksum, then the bytes, written under a temporary name and renamed.
fn checkpoint_state(mb: u64) -> std::io::Result<Option<bool>> {
    let dir = std::path::PathBuf::from(env("MUSTER_CHECKPOINT_DIR"));
    let path = dir.join("state.bin");
    let resumed = (env("MUSTER_RESUME") == "1").then(|| match std::fs::read(&path) {
        Ok(b) if b.len() as u64 == mb * 1_048_576 + 8 => b[..8] == fnv(&b[8..]).to_le_bytes(),
        _ => false,
    });
    let mut x = now_ms() ^ fnv(env("MUSTER_ALLOC_ID").as_bytes()) ^ 0x9E37_79B9_7F4A_7C15;
    let mut body = vec![0u8; (mb * 1_048_576) as usize];
    for chunk in body.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let tmp = dir.join("state.bin.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&fnv(&body).to_le_bytes())?;
    f.write_all(&body)?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    Ok(resumed)
}

/// What a rank's reader on the master's side reports.
enum Heard {
    /// The rank joined: its index and where to write to it.
    Joined(u32, OwnedWriteHalf),
    /// The rank said something (it is alive).
    Spoke(u32),
}

/// Task 0: registers, waits for every rank, beats with them, ends them.
async fn master(journal: &mut Journal, beats: u64, gang: u32, fabric: &str, id: &(String, String, String)) -> i32 {
    let (tx, mut rx) = mpsc::unbounded_channel();
    if gang > 1 {
        let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else { return GAVE_UP };
        let Ok(port) = listener.local_addr().map(|a| a.port()) else { return GAVE_UP };
        let registered = async {
            let mut s = TcpStream::connect(fabric).await.ok()?;
            s.write_all(format!("hub {} {} {} {port}\n", id.0, id.1, id.2).as_bytes()).await.ok()?;
            (read_line(&mut s).await.ok()? == "ok").then_some(())
        };
        if registered.await.is_none() {
            return GAVE_UP;
        }
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let (mut r, w) = stream.into_split();
                    let Ok(first) = read_line(&mut r).await else { return };
                    let Some(rank) = first.strip_prefix("rank ").and_then(|r| r.parse().ok()) else { return };
                    let _ = tx.send(Heard::Joined(rank, w));
                    while read_line(&mut r).await.is_ok() {
                        let _ = tx.send(Heard::Spoke(rank));
                    }
                    // A closed connection is silence, as for a rank
                    // blocked in a collective whose peer died.
                });
            }
        });
    }
    let started = Instant::now();
    let mut ranks: BTreeMap<u32, (OwnedWriteHalf, Instant)> = BTreeMap::new();
    let mut counted = 0u64;
    let mut tick = tokio::time::interval(BEAT);
    tick.tick().await;
    loop {
        tokio::select! {
            Some(h) = rx.recv() => match h {
                Heard::Joined(rank, w) => {
                    ranks.insert(rank, (w, Instant::now()));
                }
                Heard::Spoke(rank) => {
                    if let Some((_, heard)) = ranks.get_mut(&rank) {
                        *heard = Instant::now();
                    }
                }
            },
            _ = tick.tick() => {
                journal.stamp("beat");
                for (w, _) in ranks.values_mut() {
                    let _ = w.write_all(b"beat\n").await;
                }
                if ranks.len() + 1 < gang as usize {
                    if started.elapsed() > JOIN_WAIT {
                        return GAVE_UP;
                    }
                    continue;
                }
                if ranks.values().any(|(_, heard)| heard.elapsed() > MASTER_PATIENCE) {
                    return GAVE_UP;
                }
                // A step (an all-reduce) completes only with every rank's
                // part: a silent rank blocks the master.
                if ranks.values().any(|(_, heard)| heard.elapsed() > STEP_WAIT) {
                    continue;
                }
                counted += 1;
                if counted >= beats {
                    for (w, _) in ranks.values_mut() {
                        let _ = w.write_all(b"done\n").await;
                    }
                    return 0;
                }
            }
        }
    }
}

/// Task `task` > 0: joins its master through the fabric and beats with it
/// until told `done`, or gives up.
async fn rank(journal: &mut Journal, task: u32, fabric: &str, id: &(String, String, String)) -> i32 {
    let Ok(mut s) = TcpStream::connect(fabric).await else { return GAVE_UP };
    if s.write_all(format!("join {} {} {} {task}\n", id.0, id.1, id.2).as_bytes()).await.is_err() {
        return GAVE_UP;
    }
    let (mut r, mut w) = s.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok(line) = read_line(&mut r).await {
            let _ = tx.send(line);
        }
    });
    let join_by = Instant::now() + JOIN_WAIT + RANK_PATIENCE;
    let mut heard: Option<Instant> = None;
    let mut tick = tokio::time::interval(BEAT);
    tick.tick().await;
    loop {
        tokio::select! {
            h = rx.recv() => match h {
                Some(line) if line == "done" => return 0,
                Some(_) => heard = Some(Instant::now()),
                // The master's connection closed: a peer is gone.
                None => return GAVE_UP,
            },
            _ = tick.tick() => {
                journal.stamp("beat");
                let gave_up = match heard {
                    Some(at) => at.elapsed() > RANK_PATIENCE || w.write_all(b"beat\n").await.is_err(),
                    None => Instant::now() > join_by,
                };
                if gave_up {
                    return GAVE_UP;
                }
            }
        }
    }
}
