//! The object-store path against a real S3-compatible server: moto's
//! `moto_server` (PyPI; `.ci/run` installs it). A checkpoint is uploaded to
//! `s3://BUCKET/prefix` in parts, read back checked against its digest,
//! refused when its manifest names other bytes, and deleted. Without
//! `moto_server` the test skips, unless `MUSTER_REQUIRE_TOOLS=1`.
//!
//! Its own test binary: it sets the AWS variables an agent reads from its
//! environment, before any thread starts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use muster_agent::store::{Naming, Stores};
use muster_core::sm::CheckpointStore;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn on_path(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(bin)).find(|p| p.is_file())
}

/// One HTTP/1.1 request to the server; returns the status line.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    Ok(reply.lines().next().unwrap_or_default().to_string())
}

#[test]
fn a_checkpoint_round_trips_through_an_s3_server() {
    let Some(moto) = on_path("moto_server") else {
        assert!(std::env::var("MUSTER_REQUIRE_TOOLS").is_err(), "moto_server is required (pip install moto[server])");
        eprintln!("skipped: no moto_server on PATH");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = Killed(
        Command::new(moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(port, "GET", "/").is_err() {
        assert!(Instant::now() < deadline, "moto_server never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let made = http(port, "PUT", "/muster-ckpt").unwrap();
    assert!(made.contains("200"), "{made}");
    // What an agent's environment would say (read when the store opens).
    // SAFETY: no other thread runs yet in this test binary.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
        std::env::set_var("AWS_ALLOW_HTTP", "true");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let work = tempfile::tempdir().unwrap();
        let stores = Stores::new(work.path(), "n0", None);
        let store = CheckpointStore::parse("s3://muster-ckpt/prod").unwrap();
        let src = tempfile::tempdir().unwrap();
        // Bigger than one 16 MiB part, so the upload is a real multipart one.
        let weights: Vec<u8> = (0..(40u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(src.path().join("weights.bin"), &weights).unwrap();
        let naming = Naming { alloc: 4, task: 2, attempt: 3, epoch: 1 };
        let saved = stores.save(&store, src.path(), naming, 1 << 30).await.unwrap().unwrap();
        assert!(saved.key.starts_with("alloc-4/task-2/a3-e1-"), "{}", saved.key);
        let listed = http(port, "GET", "/muster-ckpt?list-type=2&prefix=prod/alloc-4/").unwrap();
        assert!(listed.contains("200"), "{listed}");
        let dst = tempfile::tempdir().unwrap();
        stores.restore(&saved.manifest(), "", dst.path()).await.unwrap();
        assert!(std::fs::read(dst.path().join("weights.bin")).unwrap() == weights, "the bytes came back");
        let mut wrong = saved.manifest();
        wrong.sha256[5] ^= 0x40;
        let e = stores.restore(&wrong, "", dst.path()).await.unwrap_err();
        assert!(e.contains("SHA-256"), "{e}");
        assert!(std::fs::read_dir(dst.path()).unwrap().next().is_none(), "nothing of it restored");
        stores.delete(&saved.manifest()).await.unwrap();
        let gone = stores.restore(&saved.manifest(), "", dst.path()).await.unwrap_err();
        assert!(gone.contains("cannot read"), "{gone}");
    });
}
