//! A cold pull against `skopeo copy`, in the same run: an image of about
//! 200 MB (four layers of 50 MB of random bytes, so gzip cannot shrink
//! them), built offline with umoci and pushed to Debian's registry on the
//! loopback. Each run times, alternating which goes first:
//!
//! - `skopeo copy docker://… dir:DIR`: download and verify every blob into
//!   a fresh directory (what the issue compares with);
//! - `ImageCache::pull` into a fresh cache: resolve, download the layers in
//!   parallel, verify, decompress and unpack each as it arrives.
//!
//! Run: `cargo bench -p muster-registry --bench pull` (options after `--`:
//! `--runs N`, default 5; `--layer-mb M`, default 50).

use std::process::Command;
use std::time::{Duration, Instant};

use muster_core::sm::ImageRef;
use muster_registry::{ImageCache, Registry, RegistryConfig, UnpackPolicy};
use muster_testkit::registry::{TestRegistry, run, tools};

fn opt(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Builds and pushes `test/big:1`: four layers of `mb` MiB of random bytes.
fn push_big(reg: &TestRegistry, mb: u64) {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let umoci = |args: &[&str]| run(Command::new("umoci").args(args).current_dir(w));
    umoci(&["init", "--layout", "oci"]);
    umoci(&["new", "--image", "oci:img"]);
    for layer in 0..4 {
        let _ = std::fs::remove_dir_all(w.join("bundle"));
        umoci(&["unpack", "--image", "oci:img", "bundle"]);
        let file = w.join(format!("bundle/rootfs/data-{layer}"));
        run(Command::new("head")
            .arg("-c")
            .arg(format!("{}", mb << 20))
            .arg("/dev/urandom")
            .stdout(std::fs::File::create(&file).unwrap()));
        umoci(&["repack", "--image", "oci:img", "bundle"]);
    }
    run(Command::new("skopeo")
        .current_dir(w)
        .args(["copy", "--dest-tls-verify=false", "oci:oci:img"])
        .arg(format!("docker://{}/test/big:1", reg.host())));
}

fn main() {
    if !tools() {
        return;
    }
    let runs = opt("--runs", 5);
    let mb = opt("--layer-mb", 50);
    let reg = TestRegistry::start(false);
    push_big(&reg, mb);
    let image = ImageRef::parse(&format!("{}/test/big:1", reg.host())).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let skopeo = |i: u64| {
        let dest = scratch.path().join(format!("skopeo-{i}"));
        let t = Instant::now();
        run(Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{image}"))
            .arg(format!("dir:{}", dest.display())));
        let d = t.elapsed();
        std::fs::remove_dir_all(&dest).unwrap();
        d
    };
    let ours = |i: u64| {
        let dir = scratch.path().join(format!("cache-{i}"));
        let cache = ImageCache::open(
            &dir,
            1 << 40,
            UnpackPolicy::default(),
            Registry::new(&RegistryConfig::default()).unwrap(),
        )
        .unwrap();
        let t = Instant::now();
        let pulled = rt.block_on(cache.pull(&image)).unwrap();
        let d = t.elapsed();
        assert!(!pulled.cache_hit);
        let bytes = pulled.downloaded;
        drop(pulled);
        std::fs::remove_dir_all(&dir).unwrap();
        (d, bytes)
    };
    let (mut theirs, mut mine) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for i in 0..runs {
        if i % 2 == 0 {
            theirs.push(skopeo(i));
            let (d, b) = ours(i);
            mine.push(d);
            bytes = b;
        } else {
            let (d, b) = ours(i);
            mine.push(d);
            bytes = b;
            theirs.push(skopeo(i));
        }
    }
    let show = |v: &[Duration]| {
        let mut s: Vec<f64> = v.iter().map(|d| d.as_secs_f64()).collect();
        s.sort_by(f64::total_cmp);
        format!("median {:.2} s (min {:.2}, max {:.2})", s[s.len() / 2], s[0], s[s.len() - 1])
    };
    let median = |v: &[Duration]| {
        let mut s: Vec<f64> = v.iter().map(|d| d.as_secs_f64()).collect();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    println!("cold pull of {:.0} MB (4 layers, random bytes), {runs} runs each, alternating:", bytes as f64 / 1e6);
    println!("  skopeo copy to dir:          {}", show(&theirs));
    println!("  muster cache pull + unpack:  {}", show(&mine));
    println!("  ratio (muster / skopeo, medians): {:.2}", median(&mine) / median(&theirs));
}
