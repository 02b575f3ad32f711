//! A real `muster dev` process for the ecosystem tests: its replicas, TLS
//! dir and HTTP listeners read from what it prints, stopped with SIGINT (or
//! killed) when dropped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::muster;

/// A running `muster dev`.
pub struct Dev {
    child: Child,
    _dir: tempfile::TempDir,
    /// `host:port,host:port,host:port`.
    pub sched: String,
    /// Its throwaway CA and `admin-dev` certificate.
    pub tls: PathBuf,
    /// Each replica's HTTP listener, in replica order.
    pub http: Vec<String>,
}

impl Dev {
    /// Starts one and waits until its four agents are ready.
    pub fn start() -> Dev {
        Dev::start_with(&[])
    }

    /// Starts one with these extra `muster dev` flags and waits until its
    /// four agents are ready.
    pub fn start_with(extra: &[&str]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("dev");
        Dev::start_on(dir, data, extra)
    }

    /// Starts one on data dir `data` (inside `dir`, which it keeps), as a
    /// restart on existing data does.
    pub fn start_on(dir: tempfile::TempDir, data: PathBuf, extra: &[&str]) -> Dev {
        let mut child = Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["dev", "--data-dir"])
            .arg(&data)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut sched, mut http) = (String::new(), Vec::new());
        for line in lines.by_ref() {
            let line = line.unwrap();
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("replicas") {
                sched = rest.trim().to_string();
            } else if let Some(rest) = line.strip_prefix("http") {
                let url = rest.split_whitespace().find(|w| w.starts_with("http://")).expect("an http:// address");
                http.push(url.trim_start_matches("http://").trim_end_matches("/ui").to_string());
            } else if line.starts_with("tls") {
                break;
            }
        }
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        assert!(!sched.is_empty() && http.len() == 3, "muster dev printed its replicas and listeners: {http:?}");
        let dev = Dev { child, tls: data.join("tls"), _dir: dir, sched, http };
        muster_testkit::eventually_blocking("the agents to register", Duration::from_secs(90), || {
            let nodes = dev.json(&["node", "list"]);
            let ready = nodes["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["status"] == "ready").count());
            if ready == 4 { Ok(()) } else { Err(nodes.to_string()) }
        });
        dev
    }

    /// Runs a CLI command against it with `--output json`.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let tls = self.tls.to_str().unwrap();
        // The connection flags go before a `--` (after it comes a command).
        let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..split].to_vec();
        all.extend(["--scheduler", &self.sched, "--tls-dir", tls, "--output", "json"]);
        all.extend(&args[split..]);
        let o = muster(&all);
        if !o.status.success() {
            return serde_json::json!({"error": String::from_utf8_lossy(&o.stderr)});
        }
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// A CLI command with `--output json` whose output is one JSON
    /// document per line (`alloc watch`), whatever its exit status.
    pub fn json_lines(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let tls = self.tls.to_str().unwrap();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--scheduler", &self.sched, "--tls-dir", tls, "--output", "json"]);
        let o = muster(&all);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {e}: {l}")))
            .collect()
    }

    /// Its data directory (each agent's work dir is `NODE/` under it).
    pub fn data_dir(&self) -> PathBuf {
        self._dir.path().join("dev")
    }

    /// [`Dev::json`] of a command that must succeed.
    pub fn ok(&self, args: &[&str]) -> serde_json::Value {
        let v = self.json(args);
        assert!(v.get("error").is_none(), "{args:?}: {v}");
        v
    }

    /// `GET path` on replica `i`'s HTTP listener: (status code, body).
    pub fn get(&self, i: usize, path: &str) -> Option<(u16, String)> {
        http_get(&self.http[i], path)
    }
}

impl Dev {
    /// Stops it with SIGINT, as an operator would, and hands back its dir.
    pub fn stop(mut self) -> tempfile::TempDir {
        self.interrupt();
        let placeholder = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self._dir, placeholder)
    }

    fn interrupt(&mut self) {
        // SAFETY: signals a child this fixture owns and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.interrupt();
        }
    }
}

/// Waits for allocation `id` to end; its `alloc get`.
pub fn wait_for_end(dev: &Dev, id: &str) -> serde_json::Value {
    muster_testkit::eventually_blocking(&format!("allocation {id} to end"), Duration::from_secs(120), || {
        let a = dev.ok(&["alloc", "get", id]);
        if ["done", "failed", "cancelled"].contains(&a["status"].as_str().unwrap_or_default()) {
            Ok(a)
        } else {
            Err(a.to_string())
        }
    })
}

/// Task `task`'s standard output (its latest attempt), from its node.
pub fn task_stdout(dev: &Dev, id: &str, task: u32) -> String {
    try_task_stdout(dev, id, task).unwrap_or_else(|e| panic!("{e}"))
}

/// [`task_stdout`], or why it cannot be read (yet: no attempt has started).
pub fn try_task_stdout(dev: &Dev, id: &str, task: u32) -> Result<String, String> {
    let tls = dev.tls.to_str().unwrap().to_string();
    let task = task.to_string();
    let args = ["alloc", "logs", id, "--task", &task, "--stdout", "--scheduler", &dev.sched, "--tls-dir", &tls];
    let o = crate::muster(&args);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Until `f` holds ([`muster_testkit::eventually_blocking`]); fails after
/// 90 s (a `muster dev` of real processes on a loaded machine) naming `what`.
pub fn wait_until(what: &str, f: impl Fn() -> bool) {
    muster_testkit::eventually_blocking(what, Duration::from_secs(90), || f().then_some(()));
}

/// A plain HTTP/1.0 GET: (status code, body).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_with_headers(addr, path).map(|(code, _, body)| (code, body))
}

/// A response's headers: (name lower-cased, value).
pub type Headers = Vec<(String, String)>;

/// As [`http_get`], with the response's headers.
pub fn http_get_with_headers(addr: &str, path: &str) -> Option<(u16, Headers, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some((code, headers, body.to_string()))
}

/// An external tool the ecosystem tests drive, if installed. CI
/// (`.ci/run`) installs them and sets `MUSTER_REQUIRE_TOOLS=1`, so there a
/// missing tool fails the test instead of skipping it.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        assert!(
            std::env::var_os("MUSTER_REQUIRE_TOOLS").is_none(),
            "{name} is not installed, and MUSTER_REQUIRE_TOOLS is set (.ci/run installs it)"
        );
        announce_skip(&format!("{name} is not installed (.ci/run installs it)"));
    }
    found
}

/// Says that the running test is skipped, in `cargo test`'s default output:
/// `SKIPPED <test>: <why>`. The line goes straight to the process's stderr,
/// which the test harness does not capture (it captures the print macros),
/// so a skip never looks like a pass.
pub fn announce_skip(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}

/// Whether `python3` imports `modules` (a Python package the tests drive);
/// skipped with `install` named when it does not, and under
/// `MUSTER_REQUIRE_TOOLS` a failure, as for [`tool`].
pub fn python_imports(modules: &str, what: &str, install: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("MUSTER_REQUIRE_TOOLS").is_none(),
            "{what} is not installed, and MUSTER_REQUIRE_TOOLS is set (.ci/run installs it)"
        );
        announce_skip(&format!("{what} is not installed; {install} to run it"));
    }
    ok
}
