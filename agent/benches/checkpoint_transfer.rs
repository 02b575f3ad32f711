//! What moving a checkpoint costs, against `cp` of the same file in the
//! same run on the same disk.
//!
//! ```text
//!   cargo bench -p muster-agent --bench checkpoint_transfer -- [--size 2G] [--runs 3] [--dir /var/tmp]
//! ```
//!
//! Each run, on one file of `--size` random bytes in a task's checkpoint
//! directory (hot in the page cache, as a task's freshly written checkpoint
//! is):
//!
//! - `cp + sync`: `cp` to another directory, then `sync FILE` (the copy on
//!   stable storage, as a save must be);
//! - **save, node store**: packed into the agent's own store (streamed,
//!   SHA-256 computed, `fsync`, renamed into place);
//! - **save, shared path**: the same into a directory standing for a shared
//!   file system (on the same disk here);
//! - `cp`: `cp` alone (a restore is not synced: it is a task's working
//!   copy);
//! - **restore, local**: unpacked from the node store, checked against its
//!   digest;
//! - **restore, fetched**: fetched from another agent's checkpoint service
//!   over loopback with mutual TLS (node certificates, under a grant) and
//!   unpacked as it arrives, checked against its digest.
//!
//! It prints each step's time per run, then the median, the spread and the
//! ratio of each to its `cp` in the same run.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use muster_agent::serve::{CheckpointServer, Grants};
use muster_agent::store::{Naming, Stores};
use muster_core::sm::CheckpointStore;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// `n` pseudo-random bytes (xorshift), written in 8 MiB pieces.
fn random_file(path: &Path, n: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 8 << 20];
    let mut left = n;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let take = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..take]).unwrap();
        left -= take as u64;
    }
    f.flush().unwrap();
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn sh(cmd: &mut Command) {
    let st = cmd.status().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let size = arg("--size").map_or(2 << 30, |s| muster_agent::janitor::parse_size(&s).unwrap());
    let runs: usize = arg("--runs").map_or(3, |r| r.parse().unwrap());
    let base = arg("--dir").unwrap_or_else(|| std::env::temp_dir().display().to_string());
    let root = tempfile::Builder::new().prefix("muster-ckpt-bench").tempdir_in(&base).unwrap();
    let r = root.path();

    // Two agents' certificates from one CA, and node A's checkpoint service.
    let tls_dir = r.join("tls");
    std::fs::create_dir_all(&tls_dir).unwrap();
    muster_tls::init_ca(&tls_dir, "bench", muster_tls::Validity::days(1)).unwrap();
    let mut material = Vec::new();
    for node in ["a", "b"] {
        let role = muster_tls::Role::Agent(node.into());
        muster_tls::issue(&tls_dir, &role, muster_tls::Validity::days(1), &[]).unwrap();
        material.push(muster_tls::TlsMaterial::load(&tls_dir, &role).unwrap());
    }
    let store_a = Stores::new(&r.join("a"), "a", Some(material[0].clone()));
    let store_b = Stores::new(&r.join("b"), "b", Some(material[1].clone()));
    let grants = Grants::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = CheckpointServer::new(store_a.node_root().to_path_buf(), grants.clone(), true);
    let router = tonic::transport::Server::builder()
        .tls_config(material[0].server_config())
        .unwrap()
        .add_service(server.into_service());
    tokio::spawn(router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)));

    let src = r.join("task-ckpt");
    std::fs::create_dir_all(&src).unwrap();
    println!("checkpoint of {} in {} ({runs} runs)", muster_core::words::bytes(size), r.display());
    random_file(&src.join("weights.bin"), size);
    let shared = CheckpointStore::Shared { root: r.join("shared").display().to_string() };
    let names = ["cp + sync", "save, node store", "save, shared path", "cp", "restore, local", "restore, fetched"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for run in 1..=runs {
        let copy = r.join("copy");
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy).unwrap();
        let naming = Naming { alloc: 1, task: 0, attempt: run as u32, epoch: 0 };
        let dst = copy.join("weights.bin");
        let t_cp_sync = timed(|| {
            sh(Command::new("cp").arg(src.join("weights.bin")).arg(&dst));
            sh(Command::new("sync").arg(&dst));
        });
        std::fs::remove_file(&dst).unwrap();
        let t = Instant::now();
        let saved = store_a.save(&CheckpointStore::Node, &src, naming, u64::MAX).await.unwrap().unwrap();
        let t_save = t.elapsed();
        let t = Instant::now();
        let on_shared = store_a.save(&shared, &src, naming, u64::MAX).await.unwrap().unwrap();
        let t_shared = t.elapsed();
        store_a.delete(&on_shared.manifest()).await.unwrap();
        let t_cp = timed(|| sh(Command::new("cp").arg(src.join("weights.bin")).arg(&dst)));
        std::fs::remove_file(&dst).unwrap();
        let m = muster_proto::v1::CheckpointManifest { writer: "a".into(), ..saved.manifest() };
        let restored = r.join("restored");
        let t = Instant::now();
        store_a.restore(&m, "", &restored).await.unwrap();
        let t_local = t.elapsed();
        std::fs::remove_dir_all(&restored).unwrap();
        grants.replace([(m.key.clone(), "b".to_string())]);
        let t = Instant::now();
        store_b.restore(&m, &addr, &restored).await.unwrap();
        let t_fetch = t.elapsed();
        std::fs::remove_dir_all(&restored).unwrap();
        store_a.delete(&m).await.unwrap();
        let row = [t_cp_sync, t_save, t_shared, t_cp, t_local, t_fetch];
        println!(
            "run {run}: {}",
            names.iter().zip(row).map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64())).collect::<Vec<_>>().join(", ")
        );
        for (i, d) in row.iter().enumerate() {
            times[i].push(d.as_secs_f64());
        }
    }
    println!();
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>11} {:>16}",
        "step", "median s", "min s", "max s", "GiB/s", "vs cp (same run)"
    );
    let ratio_of = |i: usize, base: usize| -> Vec<f64> { (0..runs).map(|k| times[i][k] / times[base][k]).collect() };
    for (i, name) in names.iter().enumerate() {
        let mut v = times[i].clone();
        let (min, max) = (v.iter().cloned().fold(f64::MAX, f64::min), v.iter().cloned().fold(0.0, f64::max));
        let med = median(&mut v);
        let base = if i < 3 { 0 } else { 3 };
        let mut ratios = ratio_of(i, base);
        let rmin = ratios.iter().cloned().fold(f64::MAX, f64::min);
        let rmax = ratios.iter().cloned().fold(0.0, f64::max);
        let rmed = median(&mut ratios);
        println!(
            "{name:<20} {med:>9.2} {min:>9.2} {max:>9.2} {:>11.2} {:>6.2}× ({rmin:.2}–{rmax:.2})",
            size as f64 / (1u64 << 30) as f64 / med,
            rmed
        );
    }
}
