//! The `muster` binary, run as a user would.
//!
//! Each `tNN_area.rs` holds one area's tests; each test's own number is
//! unique across the binary. The file numbers put the areas whose tests
//! run longest first (chaos runs, checkpoints of gigabytes, PyTorch, the
//! README against `muster dev`): the harness starts tests in name order,
//! and a long test started last would set the suite's end.
//! `cluster.rs`, `dev_proc.rs` and `tls.rs` are shared helpers, as is what
//! this file defines.

mod cluster;
mod dev_proc;
mod t10_chaos;
mod t12_checkpoints;
mod t14_distributed;
mod t16_readme;
mod t20_commands;
mod t22_build;
mod t24_bench_report;
mod t26_e2e;
mod t28_cli_cluster;
mod t30_dev_cli;
mod t32_failover;
mod t40_teardown;
mod t42_preemption;
mod t48_hardening;
mod t50_watchdogs;
mod t60_node_lifecycle;
mod t62_node_trust;
mod t64_isolation;
mod t70_vclusters;
mod t72_workflows;
mod t74_images;
mod t80_security;
mod t82_history;
mod t84_ecosystem;
mod t86_replay;
mod t87_waits;
mod t88_sim_agents;
mod tls;

use std::process::{Command, Output};

pub fn muster(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(args)
        .env("MUSTER_TLS_DIR", tls::dir())
        .output()
        .expect("muster runs")
}

/// A checkpoint manifest as an agent uploads it: on its own disk, named
/// for task `task` of `alloc`, `bytes` long, with a digest made from `name`.
pub fn manifest(alloc: u64, task: u32, name: &str, bytes: u64) -> muster_proto::v1::CheckpointManifest {
    let mut sha256 = vec![0u8; 32];
    for (d, b) in sha256.iter_mut().zip(name.bytes()) {
        *d = b;
    }
    muster_proto::v1::CheckpointManifest {
        bytes,
        sha256,
        store: "node".into(),
        key: format!("alloc-{alloc}/task-{task}/{name}"),
        ..Default::default()
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Real `muster server` (replica 1, alone) and `muster agent` processes
/// (2 GPUs each), killed (after a SIGCONT, in case a test froze one) when
/// dropped, even when an assertion fails.
/// Real processes of one test; each one's stderr goes to a file in the
/// test's directory, and the tails are printed if the test panics.
struct Procs(Vec<std::process::Child>, Vec<std::path::PathBuf>);

impl Procs {
    fn start(dir: &std::path::Path, addr: &str, server_args: &[&str], agents: &[&str]) -> Procs {
        Procs::start_with(dir, addr, server_args, agents, &[])
    }

    /// As `start`, with `agent_args` given to every agent.
    fn start_with(
        dir: &std::path::Path,
        addr: &str,
        server_args: &[&str],
        agents: &[&str],
        agent_args: &[&str],
    ) -> Procs {
        std::fs::create_dir_all(dir).unwrap();
        let log = |name: &str| {
            let path = dir.join(format!("{name}.stderr"));
            (std::fs::File::create(&path).unwrap(), path)
        };
        let (server_log, server_path) = log("server");
        let mut procs = Procs(
            vec![
                Command::new(env!("CARGO_BIN_EXE_muster"))
                    .args(["server", "--id", "1", "--listen", addr, "--peers", &format!("1={addr}")])
                    // The tests' agents register unadmitted.
                    .args(["--node-admission", "open"])
                    .args(server_args)
                    .arg("--data-dir")
                    .arg(dir.join("server"))
                    .env("MUSTER_TLS_DIR", tls::dir())
                    .stderr(server_log)
                    .spawn()
                    .unwrap(),
            ],
            vec![server_path],
        );
        for node in agents {
            tls::material(muster_tls::Role::Agent(node.to_string()));
            let (agent_log, agent_path) = log(node);
            procs.0.push(
                Command::new(env!("CARGO_BIN_EXE_muster"))
                    .args(["agent", "--scheduler", addr, "--node-id", node, "--gpus", "2", "--vram-mb", "1000"])
                    // Tests write where their tasks' user may: the tasks
                    // run as this (root) test's user unless a test says.
                    .args((!agent_args.iter().any(|a| a.starts_with("--task-user"))).then_some("--allow-root-tasks"))
                    .args(agent_args)
                    .arg("--work-dir")
                    .arg(dir.join(node))
                    .env("MUSTER_TLS_DIR", tls::dir())
                    .stderr(agent_log)
                    .spawn()
                    .unwrap(),
            );
            procs.1.push(agent_path);
        }
        procs
    }

    /// The process of the `i`-th agent.
    fn agent(&self, i: usize) -> &std::process::Child {
        &self.0[1 + i]
    }

    /// Whether the `i`-th agent has exited, and how.
    fn agent_exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.0[1 + i].try_wait().unwrap()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for path in &self.1 {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                eprintln!("--- {} (last {} lines)", path.display(), tail.len());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// The Prometheus text a `--metrics` listener serves, if it answers.
fn scrape(metrics: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}
