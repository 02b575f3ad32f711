//! `muster audit`: an offline proof that a cluster's committed log kept
//! every promise (`muster_core::audit`), from replicas' data dirs (read,
//! never written) or a backup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use muster_core::audit::{Auditor, Violation};
use muster_raft_store::{AppliedRecord, Backup, read_applied_log, read_log, read_snapshot};
use muster_scheduler::sm::{ApplyCtx, Command, State};

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// A replica's data dir; repeat it for every replica, and their digests
    /// are compared at every index they share a checkpoint at.
    #[arg(long, value_name = "DIR", required_unless_present = "backup", conflicts_with = "backup")]
    data_dir: Vec<PathBuf>,
    /// A backup: its state's digest and invariants (it holds no log).
    #[arg(long, value_name = "FILE")]
    backup: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// One replica's audit.
#[derive(Debug, serde::Serialize)]
struct ReplicaAudit {
    dir: String,
    /// Where the replay started: 0 (the applied log from entry 1) or the
    /// snapshot's index.
    from_index: u64,
    /// The last entry checked.
    to_index: u64,
    /// Whether `to_index` is the committed index the replica recorded (or,
    /// without one, its last entry).
    committed_known: bool,
    entries: u64,
    commands: u64,
    seconds: f64,
    entries_per_second: f64,
    torn_tail: Option<String>,
    /// The state digest at the checkpoints it passed (index → hex).
    digests: BTreeMap<u64, String>,
    violation: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    replicas: Vec<ReplicaAudit>,
    /// Indexes at which two or more replicas' digests were compared.
    digests_compared: Vec<u64>,
    /// The first problem found, if any.
    violation: Option<String>,
}

pub fn run(args: &AuditArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.backup {
        return audit_backup(path, args.json);
    }
    // Digests are compared at every replica's snapshot and last index.
    let mut inputs = Vec::new();
    for dir in &args.data_dir {
        inputs.push(read_replica(dir)?);
    }
    let points: Vec<u64> = inputs.iter().flat_map(|i| [i.snapshot_index, i.end]).filter(|&i| i > 0).collect();
    let mut replicas = Vec::new();
    for input in inputs {
        replicas.push(audit_replica(input, &points));
    }
    let mut violation = replicas.iter().find_map(|r| r.violation.as_ref().map(|v| format!("{}: {v}", r.dir)));
    let mut compared = Vec::new();
    let mut at: BTreeMap<u64, Vec<(&str, &str)>> = BTreeMap::new();
    for r in &replicas {
        for (i, d) in &r.digests {
            at.entry(*i).or_default().push((r.dir.as_str(), d.as_str()));
        }
    }
    for (index, seen) in &at {
        if seen.len() < 2 {
            continue;
        }
        compared.push(*index);
        if let Some((dir, d)) = seen.iter().find(|(_, d)| *d != seen[0].1)
            && violation.is_none()
        {
            violation = Some(format!(
                "replicas disagree at entry {index}: {} has state digest {}, {dir} has {d}",
                seen[0].0, seen[0].1
            ));
        }
    }
    let report = Report { replicas, digests_compared: compared, violation };
    if args.json {
        out!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in &report.replicas {
            out!(
                "{}: entries {}..={} checked{} ({} entries, {} commands) in {:.2} s, {:.0} entries/s",
                r.dir,
                r.from_index + 1,
                r.to_index,
                if r.from_index == 0 { " from the first entry" } else { " from the snapshot" },
                r.entries,
                r.commands,
                r.seconds,
                r.entries_per_second
            );
            if !r.committed_known {
                out!("  no committed index recorded: checked every entry the log holds");
            }
            if let Some(t) = &r.torn_tail {
                out!("  {t}");
            }
        }
        if !report.digests_compared.is_empty() {
            out!("digests agree at entries {:?}", report.digests_compared);
        }
        match &report.violation {
            None => out!("audit passed: every promise held after every entry"),
            Some(v) => out!("audit FAILED: {v}"),
        }
    }
    if let Some(v) = report.violation {
        bail!("{}", v.lines().next().unwrap_or("the audit failed"));
    }
    Ok(())
}

/// The state a replica's data dir holds at its committed index (or its
/// last entry): its snapshot, or the empty state, with the log after it
/// applied. Nothing is checked and nothing written.
pub(crate) fn replayed_state(dir: &Path) -> anyhow::Result<State> {
    let input = read_replica(dir)?;
    let mut state = input.start;
    for r in input.entries.range(input.from_index + 1..=input.end).map(|(_, r)| r) {
        if let Some(batch) = &r.batch {
            let ctx = ApplyCtx { time_ms: batch.time_ms };
            for cmd in &batch.commands {
                state.apply(cmd, &ctx);
            }
        }
    }
    Ok(state)
}

/// What one data dir holds.
struct ReplicaInput {
    dir: PathBuf,
    start: State,
    snapshot_index: u64,
    from_index: u64,
    end: u64,
    committed_known: bool,
    /// Index → (term, batch), from the applied log and the Raft log.
    entries: BTreeMap<u64, AppliedRecord<Command>>,
    torn_tail: Option<String>,
}

fn read_replica(dir: &Path) -> anyhow::Result<ReplicaInput> {
    let name = dir.display();
    if !dir.join("log").is_dir() && !dir.join("snapshot.bin").exists() {
        bail!("{name} is not a replica's data dir (no log/ and no snapshot.bin)");
    }
    let snapshot = read_snapshot(dir)?;
    let (snapshot_index, snapshot_state) = match &snapshot {
        Some(s) => (s.index, State::from_snapshot(&s.data).with_context(|| format!("{name}: snapshot.bin"))?),
        None => (0, State::default()),
    };
    let applied = read_applied_log::<State>(dir)?;
    let log = read_log::<State>(dir).with_context(|| format!("{name}: the Raft log is damaged"))?;
    let mut entries: BTreeMap<u64, AppliedRecord<Command>> = BTreeMap::new();
    for r in applied.into_iter().chain(log.records) {
        entries.entry(r.index).or_insert(r);
    }
    // From entry 1 when the logs hold every entry from there to the
    // snapshot (`--keep-applied-log` keeps them), otherwise from the
    // snapshot: a replica that installed a leader's snapshot lacks the
    // entries it covers. (Entry 0 is the cluster's first membership.)
    let contiguous = entries.range(1..).map(|(i, _)| *i).zip(1u64..).take_while(|(i, n)| i == n).count() as u64;
    let (from_index, start) = if contiguous > 0 && contiguous >= snapshot_index {
        (0, State::default())
    } else {
        (snapshot_index, snapshot_state)
    };
    let last = entries.keys().next_back().copied().unwrap_or(from_index).max(snapshot_index);
    // Every entry up to the committed index must be there: a replica that
    // recorded entries as committed and lacks them lost them.
    let (end, committed_known) = match log.committed {
        Some(c) => (c.max(snapshot_index), true),
        None => (last, false),
    };
    Ok(ReplicaInput {
        dir: dir.to_path_buf(),
        start,
        snapshot_index,
        from_index,
        end,
        committed_known,
        entries,
        torn_tail: log.torn_tail,
    })
}

fn audit_replica(input: ReplicaInput, points: &[u64]) -> ReplicaAudit {
    let started = Instant::now();
    let mut auditor = Auditor::new(input.start, input.from_index);
    let mut digests = BTreeMap::new();
    let digest = |s: &State| muster_scheduler::server::hex(&s.state_digest().0);
    if points.contains(&input.from_index) {
        digests.insert(input.from_index, digest(auditor.state()));
    }
    let mut violation: Option<Violation> = None;
    for index in input.from_index + 1..=input.end {
        let Some(r) = input.entries.get(&index) else {
            violation = Some(Violation {
                index,
                promise: "log_continuous",
                detail: format!(
                    "entry {index} is committed (the replica recorded entries up to {} as committed) but in \
                     neither its applied log nor its Raft log",
                    input.end
                ),
                command: None,
                around: String::new(),
            });
            break;
        };
        if let Err(v) = auditor.entry(r.index, r.term, r.batch.as_ref()) {
            violation = Some(v);
            break;
        }
        if points.contains(&index) {
            digests.insert(index, digest(auditor.state()));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    ReplicaAudit {
        dir: input.dir.display().to_string(),
        from_index: input.from_index,
        to_index: auditor.index(),
        committed_known: input.committed_known,
        entries: auditor.entries,
        commands: auditor.commands,
        seconds,
        entries_per_second: auditor.entries as f64 / seconds.max(1e-9),
        torn_tail: input.torn_tail,
        digests,
        violation: violation.map(|v| v.to_string()),
    }
}

fn audit_backup(path: &Path, json: bool) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let backup = Backup::decode(&bytes).with_context(|| path.display().to_string())?;
    let state: State = backup.verify().with_context(|| path.display().to_string())?;
    let invariants = state.check_invariants();
    if json {
        out!(
            "{}",
            serde_json::json!({
                "backup": path.display().to_string(),
                "index": backup.index,
                "digest": muster_scheduler::server::hex(&backup.digest),
                "violation": invariants.as_ref().err(),
            })
        );
    } else {
        out!(
            "{}: the state at entry {} restores to its recorded digest {}",
            path.display(),
            backup.index,
            muster_scheduler::server::hex(&backup.digest)
        );
    }
    if let Err(broken) = invariants {
        bail!("{}: the state at entry {} breaks an invariant: {broken}", path.display(), backup.index);
    }
    if !json {
        out!("audit passed: its invariants hold (a backup holds no log; audit the replicas' data dirs for that)");
    }
    Ok(())
}
