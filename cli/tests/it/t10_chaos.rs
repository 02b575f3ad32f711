//! `muster chaos`: short runs of the real harness, each showing that the
//! checks hold under a kind of fault, or that they catch a deliberately
//! injected bug which that kind of fault exposes (docs/reliability.md).

use std::path::PathBuf;

use serde_json::Value;

use super::{muster, stdout};

/// One finished `muster chaos … --json --dir DIR` run.
struct Run {
    /// Whether it exited 0 (every check passed).
    passed: bool,
    /// Its JSON report.
    report: Value,
    /// Its directory (logs, data dirs, journal).
    dir: PathBuf,
    /// What it wrote to stderr.
    stderr: String,
    _keep: tempfile::TempDir,
}

/// Runs `muster chaos ARGS --json` in a fresh directory.
fn chaos(args: &[&str]) -> Run {
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("run");
    let o = muster(&[&["chaos"][..], args, &["--json", "--dir", dir.to_str().unwrap()]].concat());
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let report = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{stderr}", stdout(&o)));
    Run { passed: o.status.success(), report, dir, stderr, _keep: keep }
}

impl Run {
    /// The named check's verdict.
    fn check(&self, name: &str) -> &Value {
        let checks = self.report["checks"].as_array().unwrap();
        checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}: {:#}", self.report))
    }

    /// The named check's detail, asserting whether it passed.
    fn detail(&self, name: &str, passed: bool) -> &str {
        let c = self.check(name);
        assert_eq!(c["passed"], passed, "{name}: {:#}", self.report);
        c["detail"].as_str().unwrap()
    }

    fn faults(&self) -> &Vec<Value> {
        self.report["faults"].as_array().unwrap()
    }

    fn notes(&self) -> Vec<&str> {
        self.faults().iter().map(|f| f["note"].as_str().unwrap()).collect()
    }

    /// Asserts every check passed.
    fn passes(self) -> Run {
        assert!(self.passed, "{:#}{}", self.report, self.stderr);
        self
    }

    /// Asserts some check failed (the injected bug was caught).
    fn fails(self) -> Run {
        assert!(!self.passed, "the bug went unnoticed: {:#}", self.report);
        self
    }

    /// Agent `id`'s log.
    fn agent_log(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("agent-{id}.log"))).unwrap_or_default()
    }
}

/// The short chaos run of CI: real replicas and agents under the seeded
/// nemesis for 30 s, then every check. Retention is 5 s, so most finished
/// allocations are forgotten during the run and the checks read them from
/// the job history.
#[test]
fn t100_a_short_chaos_run_passes_every_check() {
    let run = chaos(&["--duration", "30s", "--seed", "11", "--retention", "5s"]).passes();
    assert_eq!(run.report["passed"], true);
    let kinds: std::collections::BTreeSet<&str> = run.faults().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert!(kinds.len() >= 3, "several kinds of fault: {kinds:?}");
    assert!(run.report["ops"]["ok"].as_u64().unwrap() >= 10, "{:#}", run.report);
    assert!(run.report["forgotten"].as_u64().unwrap() >= 1, "some were forgotten during the run: {:#}", run.report);
    for check in [
        "acked_exactly_once",
        "replicas_agree",
        "all_terminal",
        "journal_consistent",
        "linearizable",
        "committed_log_replays",
        "acked_entries_durable",
        "deadlines_on_time",
        "no_crashes",
    ] {
        run.detail(check, true);
    }
}

/// The checks have teeth: with servers that acknowledge a submit before it
/// is committed (a deliberately injected bug), a short run fails
/// `acked_exactly_once` and `linearizable`, keeps its directory and says how
/// to reproduce it.
#[test]
fn t101_a_chaos_run_catches_an_injected_ack_before_commit_bug() {
    // Leader kills lose whatever the buggy leader acknowledged in its last second.
    let args = ["--duration", "20s", "--seed", "3", "--faults", "kill-leader", "--inject-bug", "ack-before-commit"];
    let run = chaos(&args).fails();
    assert!(run.detail("acked_exactly_once", false).contains("was acknowledged as"));
    // Half the submits are read back at once; when a read-back lands in the
    // lost second it finds nothing and the history is not linearizable.
    // Whether one does depends on timing (on a loaded machine the run makes
    // few calls), so only what a failure says is checked here; the
    // checker's own tests prove it catches such a history.
    let linear = run.check("linearizable");
    if linear["passed"] == false {
        assert!(linear["detail"].as_str().unwrap().contains("Get(Some(Absent))"), "{linear}");
    }
    assert_eq!(run.faults()[0]["kind"], "kill-leader");
    let reproduce = run.report["reproduce"].as_str().unwrap();
    assert!(reproduce.contains("--seed 3 --duration 20s --agents 3 --faults kill-leader"), "{reproduce}");
    assert!(run.dir.join("report.json").exists());
    assert!(run.stderr.contains("a check failed (seed 3)"), "{}", run.stderr);
    let o = muster(&["chaos", "--inject-bug", "nonsense"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ack-before-commit, ack-before-fsync, ack-despite-fsync-error")
    );
    let o = muster(&["chaos", "--faults", "kill-leader,meteor"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown fault \"meteor\"") && err.contains("power-loss-all"), "{err}");
}

/// The crash shim has teeth: servers whose log store acknowledges entries
/// before fsyncing them lose acknowledged allocations when the whole
/// cluster loses power, and the run says so.
#[test]
fn t102_a_chaos_run_catches_an_injected_ack_before_fsync_bug() {
    // The lost entries are found from the journal and the disks: no need
    // to wait out the liveness phase of a cluster that lost them.
    let args = ["--duration", "15s", "--seed", "5", "--faults", "power-loss-all", "--inject-bug", "ack-before-fsync"];
    let run = chaos(&[&args[..], &["--liveness-timeout", "20s"]].concat()).fails();
    assert_eq!(run.faults()[0]["kind"], "power-loss-all", "{:#}", run.report);
    assert!(run.detail("acked_exactly_once", false).contains("was acknowledged as"));
}

/// Issue 28: failing, full and slow disks. A replica whose fsync fails or
/// whose disk fills stops (status 75) without acknowledging what it did not
/// persist, and comes back on what its disk kept (after a power cycle, for
/// the failed disk); its log is read back before it restarts; every check
/// holds, `acked_entries_durable` included.
#[test]
fn t103_a_chaos_run_with_failing_full_and_slow_disks_passes_every_check() {
    let run = chaos(&["--duration", "30s", "--seed", "8", "--faults", "disk-eio,disk-full,slow-disk"]).passes();
    let stopped = run
        .faults()
        .iter()
        .filter(|f| f["kind"] != "slow-disk" && f["note"].as_str().unwrap().contains("stopped with status 75"))
        .count();
    assert!(stopped >= 1, "a failed or full disk stopped its replica: {:#?}", run.faults());
    let detail = run.detail("acked_entries_durable", true);
    assert!(!detail.starts_with("0 power losses") && !detail.contains(" 0 read-backs"), "{detail}");
}

/// A leader whose disk stalls has already sent its newest entries to its
/// followers (it replicates while its own flush is in flight) but counts
/// itself for none of them. The followers elect a successor, which may
/// commit those entries; the old leader steps down when its flush
/// completes. Nothing acknowledged is lost or doubled, and every check
/// holds.
#[test]
fn t175_a_stalled_leader_disk_loses_and_doubles_nothing() {
    let run = chaos(&["--duration", "25s", "--seed", "3", "--faults", "stall-leader-disk"]).passes();
    let stalls = run.faults().iter().filter(|f| f["kind"] == "stall-leader-disk").count();
    assert!(stalls >= 2, "{:#?}", run.faults());
}

/// The fsyncgate bug: a log store that acknowledges entries whose fsync
/// failed. A failing disk, then a power cycle of its machine, and
/// `acked_entries_durable` names the replica that acknowledged entries its
/// disk never held.
#[test]
fn t104_a_chaos_run_catches_an_injected_ack_despite_fsync_error_bug() {
    let args = ["--duration", "15s", "--seed", "9", "--faults", "disk-eio", "--inject-bug", "ack-despite-fsync-error"];
    // What the disks held is read during the fault phase; a replica the bug
    // stopped never lets the liveness phase end well, so it is kept short.
    let run = chaos(&[&args[..], &["--liveness-timeout", "5s"]].concat()).fails();
    assert!(run.detail("acked_entries_durable", false).contains("but its disk held only up to"));
}

/// Issue 28: a campaign is one command over several seeds (here two side by
/// side, each its own cluster), summed up on one screen: faults per kind,
/// calls, each check's passes, the slowest recovery. CI keeps it short;
/// docs/reliability.md gives the release gate.
#[test]
fn t105_a_chaos_campaign_runs_several_seeds_and_sums_them_up() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("campaign");
    let args = ["chaos", "--runs", "2", "--parallel", "2", "--duration", "10s", "--seed", "21"];
    let o = muster(&[&args[..], &["--faults", "kill-leader,disk-full", "--dir", run.to_str().unwrap()]].concat());
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("muster chaos campaign: 2 run(s) (seeds 21, 22), 20 s of faults"), "{text}");
    assert!(text.contains("passed in 2 of 2 runs") && !text.contains("FAIL"), "{text}");
    assert!(text.contains("every check of every run passed"), "{text}");
    assert!(run.join("seed-21/report.json").exists() && run.join("seed-22/report.json").exists());
    let o = muster(&["chaos", "--runs", "0"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--runs must be at least 1"));
    let o = muster(&["chaos", "--runs", "2", "--parallel", "9"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--parallel must be between 1 and 4"));
}

/// Issue 28: an agent cut off from every replica while its (long) tasks
/// run. It stops them half a node-lost window after a leader last answered
/// it, before the leader marks the node lost and places them elsewhere, so
/// no task runs twice (`journal_consistent`); a shorter cut off is survived.
#[test]
fn t106_a_partitioned_agent_fences_its_tasks_and_none_runs_twice() {
    let args = ["--duration", "30s", "--seed", "13", "--agents", "4", "--faults", "partition-agent"];
    let run = chaos(&[&args[..], &["--task-seconds", "15-25"]].concat()).passes();
    assert!(run.notes().iter().any(|n| n.contains("past the leader marking it lost")), "{:?}", run.notes());
    let fenced = (1..=4)
        .filter(|i| {
            run.agent_log(&format!("c{i}")).contains("stopping its tasks before a leader places them elsewhere")
        })
        .count();
    assert!(fenced >= 1, "a cut-off agent stopped its tasks");
}

/// The same partitions with agents that keep their tasks running when cut
/// off (`--keep-running-when-cut-off`): the leader places the lost node's
/// tasks elsewhere while they still run, and `journal_consistent` names the
/// attempts that ran at once.
#[test]
fn t107_a_chaos_run_catches_agents_that_do_not_fence_themselves() {
    let args = ["--duration", "30s", "--seed", "14", "--agents", "4", "--faults", "partition-agent"];
    let bug = ["--inject-bug", "no-agent-fencing", "--task-seconds", "15-25", "--liveness-timeout", "20s"];
    let run = chaos(&[&args[..], &bug[..]].concat()).fails();
    assert!(run.detail("journal_consistent", false).contains("still ran at"));
}

/// Issue 28: agents restarted under running work. Every second chaos agent
/// runs with `--keep-tasks`: stopped with SIGTERM (or killed), it leaves its
/// tasks running, and the next agent adopts them; the others' successors
/// kill what they find. No attempt runs twice, and every check holds.
#[test]
fn t108_agents_restarted_with_keep_tasks_adopt_their_tasks_and_none_runs_twice() {
    let args = ["--duration", "25s", "--seed", "17", "--agents", "4", "--faults", "restart-agent,kill-agent"];
    let run = chaos(&[&args[..], &["--task-seconds", "2-8"]].concat()).passes();
    assert!(
        run.faults().iter().any(|f| f["kind"] == "restart-agent" && f["note"] == "exited 0, tasks left running"),
        "{:#?}",
        run.faults()
    );
    let adopted =
        ["c2", "c4"].iter().any(|id| run.agent_log(id).contains("adopted a task the previous agent left running"));
    assert!(adopted, "a restarted agent adopted what its predecessor left running");
}

/// Issue 46: the daemonising workload. Every rank leaves a daemon that
/// escaped its process group, ignores SIGTERM and beats as the rank's
/// attempt. Cancels, preemptions, teardowns and agent restarts (adopting or
/// killing what the last agent left) end each attempt's whole cgroup, so no
/// daemon beats on past its attempt and every check holds.
#[test]
fn t189_tasks_that_daemonise_leave_nothing_behind_under_chaos() {
    let args = ["--duration", "25s", "--seed", "19", "--agents", "4", "--faults", "restart-agent,kill-agent"];
    let run = chaos(&[&args[..], &["--daemonising-tasks", "--task-seconds", "2-6"]].concat()).passes();
    let journal = std::fs::read_to_string(run.dir.join("journal.log")).unwrap_or_default();
    assert!(journal.lines().filter(|l| l.starts_with("beat ")).count() > 0, "the ranks and their daemons beat");
    assert!(strays(&run.dir).is_empty(), "daemons outlived the run: {:?}", strays(&run.dir));
}

/// The same workload on agents that do not contain their tasks (the
/// injected bug `no-isolation`): a stop signals the process group only, the
/// daemons beat on past their attempts' ends, and the checks see them hold
/// GPUs another attempt was given.
#[test]
fn t190_a_chaos_run_catches_agents_that_let_daemons_escape_a_stop() {
    let args = ["--duration", "20s", "--seed", "19", "--agents", "4", "--faults", "kill-leader"];
    let run = chaos(&[&args[..], &["--daemonising-tasks", "--inject-bug", "no-isolation"]].concat());
    for pid in strays(&run.dir) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let run = run.fails();
    let caught = !run.check("gpus_never_overbooked")["passed"].as_bool().unwrap()
        || !run.check("journal_consistent")["passed"].as_bool().unwrap();
    assert!(caught, "{:#}", run.report);
}

/// The `muster chaos-daemon` processes still running whose journal is in
/// `dir`.
fn strays(dir: &std::path::Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|a| a == b"chaos-daemon")
                && String::from_utf8_lossy(&environ).contains(&needle)
                && muster_agent::executor::alive(*pid)
        })
        .collect()
}

/// Agents that forget what their predecessor left running (the injected bug
/// `forget-leftovers`): restarted after a `--keep-tasks` agent, they neither
/// adopt nor kill its tasks, the leader places them again, and
/// `journal_consistent` names the attempts that ran at once.
#[test]
fn t163_a_chaos_run_catches_agents_that_forget_their_predecessors_tasks() {
    let args = ["--duration", "35s", "--seed", "17", "--agents", "4", "--faults", "restart-agent"];
    // Tasks long enough (5-10 s) that an agent restarted 1-3 s after it
    // stopped mostly finds its predecessor's still running, and 35 s of
    // restarts: with 2-8 s tasks over 25 s, a loaded machine sometimes
    // restarted only idle agents, and the bug had nothing to show.
    let bug = ["--inject-bug", "forget-leftovers", "--task-seconds", "5-10", "--liveness-timeout", "20s"];
    let run = chaos(&[&args[..], &bug[..]].concat()).fails();
    assert!(run.detail("journal_consistent", false).contains("still ran at"));
}

/// Issue 28: clock faults. The leader's wall clock jumps minutes ahead and
/// back, and a follower's drifts before the leader is killed so that it may
/// lead on its skewed clock. Replicated time is paced on the monotonic
/// clock: `deadlines_on_time` finds it at 0.9–1.1× real time within every
/// term and never further off than the skews injected, and every other
/// check holds.
#[test]
fn t109_clock_jumps_and_skews_leave_every_deadline_on_time() {
    let run = chaos(&["--duration", "40s", "--seed", "2", "--faults", "clock-jump-forward,clock-jump-back,clock-skew"])
        .passes();
    let shifts: Vec<i64> = run.faults().iter().map(|f| f["clock_ms"].as_i64().unwrap()).collect();
    assert!(shifts.iter().any(|&ms| ms >= 5_000), "a jump ahead: {:#?}", run.faults());
    assert!(shifts.iter().any(|&ms| ms <= -5_000), "a jump back: {:#?}", run.faults());
    assert!(run.faults().iter().any(|f| f["kind"] == "clock-skew"), "{:#?}", run.faults());
    assert!(run.detail("deadlines_on_time", true).contains("entries pinned to real time"));
}

/// A leader that stamps entries with its raw wall clock (the injected bug
/// `unpaced-leader-clock`): a jump ahead fires every deadline within it at
/// once, a jump back stops replicated time, and `deadlines_on_time` names
/// the stretch of the term where the replicated clock left real time's pace.
#[test]
fn t160_a_chaos_run_catches_a_leader_stamping_its_raw_clock() {
    let args = ["--duration", "25s", "--seed", "3", "--faults", "clock-jump-forward,clock-jump-back"];
    let run = chaos(&[&args[..], &["--inject-bug", "unpaced-leader-clock"]].concat()).fails();
    let detail = run.detail("deadlines_on_time", false);
    assert!(detail.contains("more than 1.1×") || detail.contains("less than 0.9×"), "{detail}");
}

/// Issue 28: membership changes under load. The cluster grows from 3 voters
/// to 5, a voter is replaced by a fresh replica with a new id, voters are
/// removed (as many of these as the run's 30 s hold on this machine),
/// between leader kills and power losses. Every check holds
/// over the replicas that remain, which report the membership the harness
/// made, and the replay still covers the log from entry 1 through the
/// retired replicas' logs.
#[test]
fn t161_replicas_join_leave_and_are_replaced_under_load() {
    let faults = "grow-cluster,shrink-cluster,replace-replica,kill-leader,power-loss-replica";
    let run = chaos(&["--duration", "30s", "--seed", "5", "--faults", faults]).passes();
    let notes = run.notes();
    assert!(notes.iter().any(|n| n.contains("joined and were promoted; voters 1, 2, 3, 4, 5")), "{notes:?}");
    // How many faults fit in the run depends on the machine's speed: a
    // voter leaves through a shrink or a replacement, whichever came.
    assert!(notes.iter().any(|n| n.contains("removed")), "a voter left: {notes:?}");
    assert!(notes.iter().any(|n| n.contains("joined on its machine") || n.contains("was removed")), "{notes:?}");
    assert!(run.detail("replicas_agree", true).contains("all voters, as the harness made them"));
    assert!(run.detail("committed_log_replays", true).starts_with("replayed entries 1..="));
}

/// A cluster that keeps removed voters on as learners (the injected bug
/// `removed-voters-linger`): the leader replicates for ever to machines that
/// were taken away, whose addresses now serve new members. Those refuse
/// traffic meant for their predecessors (`x-muster-raft-to`), so nothing
/// else breaks, and `replicas_agree` names the learners left behind.
#[test]
fn t162_a_chaos_run_catches_removed_voters_that_linger() {
    let args = ["--duration", "20s", "--seed", "3", "--faults", "grow-cluster,shrink-cluster,replace-replica"];
    let run = chaos(&[&args[..], &["--inject-bug", "removed-voters-linger"]].concat()).fails();
    assert!(run.detail("replicas_agree", false).contains("and learners [1"));
    for check in ["acked_exactly_once", "committed_log_replays", "no_crashes"] {
        run.detail(check, true);
    }
}

/// A log store that acknowledges entries whose write failed on a full disk
/// (the injected bug `ack-despite-write-error`): the torn record stays and
/// later records follow it, so the log read back before the replica
/// restarts stops at the tear, short of what it acknowledged, and
/// `acked_entries_durable` names the replica.
#[test]
fn t164_a_chaos_run_catches_a_store_that_acknowledges_a_failed_write() {
    // The bug costs the cluster acknowledged work: its liveness phase cannot
    // end well, so it is kept short.
    let args = ["--duration", "15s", "--seed", "9", "--faults", "disk-full", "--liveness-timeout", "5s"];
    let run = chaos(&[&args[..], &["--inject-bug", "ack-despite-write-error"]].concat()).fails();
    assert!(run.detail("acked_entries_durable", false).contains("but its log read back only up to"));
}

/// Issue 28: a full agent disk. The busiest agent's disk fills, so it cannot
/// record new attempts and refuses to start them (the leader places them
/// again); then it dies and restarts with room: everything it started is
/// recorded, found and killed or adopted, and no attempt runs twice.
#[test]
fn t165_a_full_agent_disk_refuses_starts_and_nothing_runs_twice() {
    let args = ["--duration", "30s", "--seed", "19", "--agents", "4", "--faults", "agent-disk-full"];
    let run = chaos(&[&args[..], &["--task-seconds", "2-8"]].concat()).passes();
    assert!(run.faults().len() >= 2, "{:#?}", run.faults());
    assert!(run.notes().iter().all(|n| n.contains("then killed and restarted")), "{:?}", run.notes());
}

/// Agents that start an attempt even when its record cannot be written (the
/// injected bug `start-without-record`): on a full disk they run what the
/// agent after them can neither adopt nor kill, the leader places it again,
/// and `journal_consistent` names the attempts that ran at once. (Only an
/// unrecorded solo task or gang master outlives its re-placement: a gang's
/// other ranks give up as soon as their master is killed. So the run is
/// long enough for several disk faults.)
#[test]
fn t166_a_chaos_run_catches_agents_that_start_unrecorded_attempts() {
    let args = ["--duration", "60s", "--seed", "19", "--agents", "4", "--faults", "agent-disk-full"];
    let bug = ["--inject-bug", "start-without-record", "--task-seconds", "2-8", "--liveness-timeout", "20s"];
    let run = chaos(&[&args[..], &bug[..]].concat()).fails();
    assert!(run.detail("journal_consistent", false).contains("still ran at"));
}

/// Issue 28: a partition between a gang's peers only. The busiest agent's
/// node is cut off from every other node's ranks (the gang fabric; the
/// control plane is untouched): ranks that lose their master give up after
/// 2 s and exit 1, while masters wait, blocked as in a collective. The
/// leader tears each broken gang down, stops every rank, and places it
/// again; no attempt runs twice and no two placements of a gang overlap.
#[test]
fn t167_a_partition_between_gang_peers_breaks_gangs_that_restart_cleanly() {
    let run = chaos(&["--duration", "30s", "--seed", "7", "--faults", "partition-gang"]).passes();
    let gave_up: usize = run
        .notes()
        .iter()
        .filter_map(|n| n.split("; ").nth(1)?.strip_suffix(" ranks gave up")?.parse::<usize>().ok())
        .sum();
    assert!(gave_up >= 1, "some rank lost its peers: {:?}", run.notes());
    assert!(run.detail("journal_consistent", true).contains("no gang's placements overlapping"));
    run.detail("all_terminal", true);
}

/// A leader that never tells a failed gang's other ranks to stop (the
/// injected bug `spare-failed-gang-peers`): after a peer partition the
/// masters run on, blocked, past the force deadline, while the gang is
/// placed again, and `journal_consistent` names the placements that ran at
/// once. The overlaps happen in the fault phase, and the spared masters
/// never let the liveness phase end well, so it is kept short.
#[test]
fn t168_a_chaos_run_catches_a_leader_that_spares_a_failed_gangs_peers() {
    // Four agents: room to place the gang again while spared masters still
    // hold nodes, on a machine loaded by the rest of the suite too.
    let args = ["--duration", "30s", "--seed", "7", "--faults", "partition-gang", "--agents", "4"];
    let run =
        chaos(&[&args[..], &["--inject-bug", "spare-failed-gang-peers", "--liveness-timeout", "5s"]].concat()).fails();
    // A spared rank overlapping the gang's next placement, or the same
    // task's next attempt: either is the bug.
    let detail = run.detail("journal_consistent", false);
    assert!(detail.contains("still ran"), "{detail}");
}

/// Servers that refuse a submit whose write is merely slow (the injected
/// bug `refuse-slow-writes`: ABORTED after 250 ms, though the entry stays
/// proposed). A slow disk makes writes slow; the client takes a refusal as
/// final and gives the key up, and `acked_exactly_once` finds the
/// allocation it was told was never made.
#[test]
fn t169_a_chaos_run_catches_a_slow_write_reported_as_refused() {
    let args = ["--duration", "30s", "--seed", "5", "--faults", "slow-disk"];
    let run = chaos(&[&args[..], &["--inject-bug", "refuse-slow-writes"]].concat()).fails();
    assert!(run.detail("acked_exactly_once", false).contains("was refused each time it was sent, but exists as"));
}
