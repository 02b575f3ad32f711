//! A chaos campaign: several runs, one seed after another, summed up in one
//! screen — the release gate (docs/reliability.md, "Long runs").

use std::collections::BTreeMap;

use super::Report;

/// One screen for a campaign's runs: faults per kind, client calls, each
/// check's passes, the slowest recovery, and the verdict.
pub fn campaign_summary(reports: &[Report]) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in reports.iter().flat_map(|r| &r.faults) {
        *kinds.entry(f.kind).or_default() += 1;
    }
    let faults: usize = kinds.values().sum();
    let seconds: u64 = reports.iter().map(|r| r.duration_s).sum();
    let (ok, failed, unknown): (usize, usize, usize) =
        reports.iter().fold((0, 0, 0), |(a, b, c), r| (a + r.ops.ok, b + r.ops.failed, c + r.ops.unknown));
    let allocations: usize = reports.iter().map(|r| r.allocations).sum();
    let mut checks: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in reports.iter().flat_map(|r| &r.checks) {
        let e = checks.entry(c.name).or_default();
        e.0 += usize::from(c.passed);
        e.1 += 1;
    }
    let seeds: Vec<String> = reports.iter().map(|r| r.seed.to_string()).collect();
    let mut out = format!(
        "muster chaos campaign: {} run(s) (seeds {}), {} of faults\n  faults      {faults} in all: {}\n  operations  {ok} ok, {failed} failed, {unknown} unknown; {allocations} allocations\n",
        reports.len(),
        seeds.join(", "),
        muster_core::words::duration(seconds * 1000),
        kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join(", "),
    );
    let slowest =
        reports.iter().filter_map(|r| r.slowest_recovery.as_ref().map(|s| (r.seed, s))).max_by_key(|(_, s)| s.after_ms);
    match slowest {
        Some((seed, s)) => out.push_str(&format!(
            "  recovery    slowest {:.1} s: the first acknowledged submit after {} of {} was healed (seed {seed})\n",
            s.after_ms as f64 / 1000.0,
            s.kind,
            s.target
        )),
        None => out.push_str("  recovery    no fault was followed by an acknowledged submit\n"),
    }
    for (name, (passed, of)) in &checks {
        out.push_str(&format!(
            "  {:<4} {:<22} passed in {passed} of {of} runs\n",
            if passed == of { "ok" } else { "FAIL" },
            name
        ));
    }
    let failed_runs: Vec<&Report> = reports.iter().filter(|r| !r.passed).collect();
    if failed_runs.is_empty() {
        out.push_str("every check of every run passed\n");
    } else {
        for r in failed_runs {
            out.push_str(&format!(
                "FAILED seed {}: kept in {}\n  reproduce: {}\n",
                r.seed,
                r.dir.display(),
                r.reproduce
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckResult, Fault, OpCounts, Recovery};

    fn report(seed: u64, passed: bool, recovery_ms: u64) -> Report {
        let fault =
            |kind| Fault { kind, target: "replica 1".into(), start_ms: 0, end_ms: 1, note: String::new(), clock_ms: 0 };
        Report {
            seed,
            duration_s: 600,
            agents: 3,
            faults: vec![fault("kill-leader"), fault("disk-eio"), fault("kill-leader")],
            ops: OpCounts { calls: 12, ok: 10, failed: 1, unknown: 1, keys: 9 },
            allocations: 9,
            forgotten: 0,
            liveness_s: 1.0,
            checks: vec![
                CheckResult { name: "acked_exactly_once", passed, detail: String::new() },
                CheckResult { name: "replicas_agree", passed: true, detail: String::new() },
            ],
            passed,
            dir: format!("/tmp/run-{seed}").into(),
            reproduce: format!("muster chaos --seed {seed}"),
            slowest_recovery: Some(Recovery { kind: "disk-eio", target: "replica 2".into(), after_ms: recovery_ms }),
        }
    }

    #[test]
    fn a_campaign_sums_its_runs_and_names_the_failed_ones() {
        let text = campaign_summary(&[report(42, true, 900), report(43, false, 4_200), report(44, true, 300)]);
        assert!(text.contains("3 run(s) (seeds 42, 43, 44), 30 min of faults"), "{text}");
        assert!(text.contains("9 in all: disk-eio ×3, kill-leader ×6"), "{text}");
        assert!(text.contains("30 ok, 3 failed, 3 unknown; 27 allocations"), "{text}");
        assert!(text.contains("slowest 4.2 s") && text.contains("(seed 43)"), "{text}");
        assert!(text.contains("FAIL acked_exactly_once     passed in 2 of 3 runs"), "{text}");
        assert!(text.contains("ok   replicas_agree         passed in 3 of 3 runs"), "{text}");
        assert!(text.contains("FAILED seed 43: kept in /tmp/run-43"), "{text}");
        assert!(!text.contains("every check of every run passed"));
        let good = campaign_summary(&[report(1, true, 10)]);
        assert!(good.ends_with("every check of every run passed\n"), "{good}");
    }
}
