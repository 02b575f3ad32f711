//! The report of `cli/benches/vs-etcd.sh` (`vs-etcd-report.py`): from the
//! benches' own output lines, Muster's ratios against etcd round by round,
//! and with `--tls-ab` TLS's cost pair by pair and its mean. The lines below
//! are the formats `../shared/peers/etcd/run.sh` and `cargo bench -p muster
//! --bench cluster` print.

use std::path::{Path, PathBuf};
use std::process::Command;

fn report(dir: &Path, rounds: u32, ab: bool) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/vs-etcd-report.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir)
        .arg(rounds.to_string())
        .arg(if ab { "1" } else { "0" })
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "the report failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn etcd(rps: [f64; 3]) -> String {
    format!(
        "total=1500 clients=1 conns=1 elapsed=1.709s rps={} p50=1.00ms p99=2.00ms max=6.28ms errs=0\n\
         total=8000 clients=16 conns=4 elapsed=2.520s rps={} p50=4.00ms p99=10.00ms max=20.09ms errs=0\n\
         total=20000 clients=256 conns=16 elapsed=1.871s rps={} p50=20.00ms p99=50.00ms max=75.15ms errs=0\n",
        rps[0], rps[1], rps[2]
    )
}

fn muster(rps: [u32; 3], p50_1: f64, health: f64, bare: Option<(f64, f64)>) -> String {
    let mut s = format!(
        "3 replicas on loopback, fsync on every append, --insecure; leader is replica 1\n\
         \x20  1 clients:     {} committed submits/s   p50    {p50_1:.2} ms   p99    1.40 ms   (5795 submits)\n\
         \x20       a gRPC health check of the leader (transport and server layers): p50 {health:.3} ms, p99 0.255 ms\n",
        rps[0]
    );
    if let Some((plain, tls)) = bare {
        s += &format!(
            "        the same check of a bare tonic server (plain HTTP/2, no layers, its own process): p50 {plain:.3} \
             ms, p99 0.237 ms\n        the same check of a bare tonic server with mutual TLS (no layers, its own \
             process): p50 {tls:.3} ms, p99 0.300 ms\n"
        );
    }
    s += &format!(
        "  16 clients:     {} committed submits/s   p50    2.43 ms   p99    4.20 ms   (31600 submits)\n \
         256 clients:    {} committed submits/s   p50   10.00 ms   p99   19.00 ms   (118485 submits)\n",
        rps[1], rps[2]
    );
    s
}

#[test]
fn the_report_gives_each_rounds_ratios_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("etcd-1.txt"), etcd([800.0, 3000.0, 10000.0])).unwrap();
    std::fs::write(dir.path().join("muster-1.txt"), muster([1000, 6000, 25000], 0.80, 0.170, None)).unwrap();
    let text = report(dir.path(), 1, false);
    for (clients, line) in [(1, "800      1000  1.25"), (16, "3000      6000  2.00"), (256, "10000     25000  2.50")] {
        assert!(text.lines().any(|l| l.contains(line)), "{clients} clients: no `{line}` in\n{text}");
    }
    assert!(text.contains("1.00ms     0.80ms"), "the p50s side by side:\n{text}");
    assert!(!text.contains("cost of mutual TLS"), "no TLS table without --tls-ab:\n{text}");
}

#[test]
fn with_tls_ab_the_report_gives_tls_cost_per_round_and_its_mean() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Round 1: TLS 10 % slower at one client, 20 % at 16, none at 256.
    std::fs::write(d.join("etcd-1.txt"), etcd([800.0, 3000.0, 10000.0])).unwrap();
    std::fs::write(d.join("muster-1.txt"), muster([1000, 6000, 20000], 0.80, 0.170, None)).unwrap();
    std::fs::write(d.join("tls-1.txt"), muster([900, 4800, 20000], 0.88, 0.200, Some((0.160, 0.180)))).unwrap();
    // Round 2: TLS 5 % faster at one client, and the same elsewhere.
    std::fs::write(d.join("etcd-2.txt"), etcd([800.0, 3000.0, 10000.0])).unwrap();
    std::fs::write(d.join("muster-2.txt"), muster([1000, 6000, 20000], 1.00, 0.180, None)).unwrap();
    std::fs::write(d.join("tls-2.txt"), muster([1050, 6000, 20000], 0.95, 0.190, Some((0.170, 0.175)))).unwrap();
    let text = report(d, 2, true);
    let tls = text.split("Muster with mutual TLS vs etcd").nth(1).expect("a TLS-against-etcd table");
    assert!(tls.lines().any(|l| l.contains("800       900  1.12")), "round 1's TLS ratio:\n{text}");
    let cost = text.split("The cost of mutual TLS").nth(1).expect("a TLS cost table");
    for line in ["1000       900  10.0%", "6000      4800  20.0%", "20000     20000   0.0%", "1000      1050  -5.0%"] {
        assert!(cost.lines().any(|l| l.contains(line)), "no `{line}` in\n{text}");
    }
    let means: Vec<&str> = cost.lines().filter(|l| l.trim_start().starts_with("mean")).collect();
    assert_eq!(means.len(), 3, "a mean per client count:\n{text}");
    assert!(means[0].contains(" 2.5%") && means[0].contains("(2 rounds)"), "1 client: {}", means[0]);
    assert!(means[1].contains("10.0%"), "16 clients: {}", means[1]);
    let calls = text.split("One gRPC health check").nth(1).expect("the per-call table");
    assert!(calls.lines().any(|l| l.contains("0.170      0.200 |  0.160    0.180")), "round 1's calls:\n{text}");
}
