//! The real processes under test: three `muster server` replicas, each
//! advertising its proxy's address, and `muster agent`s that reach the
//! replicas through the proxies. Killed with SIGKILL, paused with SIGSTOP,
//! resumed with SIGCONT; everything left is killed when dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Server flags for fast failure detection and frequent snapshots (so a
/// lagging follower needs one); every replica keeps its applied log (the
/// replay check) and a crash image (power loss).
const SERVER_FLAGS: &[&str] = &[
    "--keep-applied-log",
    "--crash-image",
    "--heartbeat-ms",
    "100",
    "--snapshot-every",
    "100",
    "--keep-log-behind-snapshot",
    "20",
    "--agent-heartbeat-ms",
    "500",
    "--node-lost-after-ms",
    "8000",
    "--preempt-grace-ms",
    "1000",
    "--teardown-force-after-ms",
    "15000",
    "--preemption-min-runtime-ms",
    "1000",
    "--checkpoint-timeout-ms",
    "2000",
    "--preemption-grace-ms",
    "1000",
    "--max-deferral-ms",
    "2000",
];

/// GPUs each agent offers.
pub const AGENT_GPUS: u32 = 4;

/// The processes of one chaos run.
pub struct Procs {
    bin: PathBuf,
    dir: PathBuf,
    /// Where each replica listens (the harness's control path).
    pub real: Vec<String>,
    /// Where each replica is reached by everyone else (its proxy).
    pub proxied: Vec<String>,
    servers: Vec<Option<Child>>,
    agents: Vec<Option<Child>>,
    agent_ids: Vec<String>,
    /// Flags every server gets besides the fixed ones (`--inject-bug`,
    /// `--retention`).
    server_args: Vec<String>,
    /// Flags every agent gets besides the fixed ones.
    agent_args: Vec<String>,
    /// Every simulated power loss: whether the replica had made durable
    /// everything it acknowledged (the `acked_entries_durable` check).
    pub power_losses: Vec<PowerLoss>,
    /// Processes seen to exit on their own during the run, and how.
    exits: Vec<String>,
}

/// One simulated power loss of a replica, and what its crash image said.
#[derive(Clone, Debug)]
pub struct PowerLoss {
    /// The replica.
    pub replica: u64,
    /// `Some((acknowledged, durable))` when it had acknowledged log entries
    /// past what its last durable point held.
    pub acked_beyond_durable: Option<(u64, u64)>,
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn log(dir: &Path, name: &str) -> std::io::Result<File> {
    File::options().create(true).append(true).open(dir.join(format!("{name}.log")))
}

impl Procs {
    /// Nothing started yet.
    pub fn new(
        bin: &Path,
        dir: &Path,
        real: Vec<String>,
        proxied: Vec<String>,
        agents: u32,
        (server_args, agent_args): (Vec<String>, Vec<String>),
    ) -> Procs {
        Procs {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            servers: (0..real.len()).map(|_| None).collect(),
            real,
            proxied,
            agents: (0..agents).map(|_| None).collect(),
            agent_ids: (0..agents).map(|i| format!("c{}", i + 1)).collect(),
            server_args,
            agent_args,
            power_losses: Vec::new(),
            exits: Vec::new(),
        }
    }

    /// The agents' node ids.
    pub fn agent_ids(&self) -> &[String] {
        &self.agent_ids
    }

    /// Starts (or restarts) replica `id` (1-based) on its data dir.
    pub fn spawn_server(&mut self, id: u64) -> std::io::Result<()> {
        let i = id as usize - 1;
        let peers: Vec<String> = self.proxied.iter().enumerate().map(|(j, a)| format!("{}={a}", j + 1)).collect();
        let child = Command::new(&self.bin)
            .args(["server", "--id", &id.to_string(), "--listen", &self.real[i], "--advertise", &self.proxied[i]])
            .args(["--peers", &peers.join(",")])
            .arg("--data-dir")
            .arg(self.data_dir(id))
            .args(SERVER_FLAGS)
            .arg("--disk-fault-file")
            .arg(self.disk_fault_file(id))
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .args(&self.server_args)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log(&self.dir, &format!("replica-{id}"))?)
            .spawn()?;
        self.servers[i] = Some(child);
        Ok(())
    }

    /// Starts (or restarts) agent `i` (0-based).
    pub fn spawn_agent(&mut self, i: usize) -> std::io::Result<()> {
        let id = self.agent_ids[i].clone();
        let child = Command::new(&self.bin)
            .args(["agent", "--scheduler", &self.proxied.join(","), "--node-id", &id])
            .args(["--gpus", &AGENT_GPUS.to_string(), "--vram-mb", "16000", "--cpus", "8", "--mem-mb", "16000"])
            .arg("--work-dir")
            .arg(self.dir.join("agents").join(&id))
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .args(&self.agent_args)
            .args(self.keeps_tasks(i).then_some("--keep-tasks"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log(&self.dir, &format!("agent-{id}"))?)
            .spawn()?;
        self.agents[i] = Some(child);
        Ok(())
    }

    /// The pid of agent `i`, while it runs.
    pub fn agent_pid(&self, i: usize) -> Option<u32> {
        self.agents[i].as_ref().map(Child::id)
    }

    /// The pids of the running agents (for the proxies).
    pub fn agent_pids(&self) -> Vec<u32> {
        self.agents.iter().flatten().map(Child::id).collect()
    }

    /// The pids of the running replicas, by id (for the proxies).
    pub fn server_pids(&self) -> Vec<(u64, u32)> {
        self.servers.iter().enumerate().filter_map(|(i, c)| c.as_ref().map(|c| (i as u64 + 1, c.id()))).collect()
    }

    /// `kill -9` replica `id`.
    pub fn kill_server(&mut self, id: u64) {
        if let Some(mut c) = self.servers[id as usize - 1].take() {
            signal(&c, libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The shared execution journal the tasks append to.
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal.log")
    }

    /// The run's CA and certificates (servers, agents, the harness's admin).
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.join("tls")
    }

    /// Replica `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("data-{id}"))
    }

    /// `kill -9` replica `id` and turn its data dir into what the last fsync
    /// made durable, as a power loss would; first records whether it had
    /// acknowledged more than that.
    pub fn power_loss_server(&mut self, id: u64) -> Result<(), String> {
        self.kill_server(id);
        let dir = self.data_dir(id);
        let acked_beyond_durable = muster_raft_store::acked_beyond_durable(&dir).map_err(|e| e.to_string())?;
        self.power_losses.push(PowerLoss { replica: id, acked_beyond_durable });
        muster_raft_store::restore_crash_image(&dir).map_err(|e| e.to_string())
    }

    /// The control file of replica `id`'s injected disk faults.
    fn disk_fault_file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("disk-fault-{id}"))
    }

    /// Gives replica `id`'s disk `fault` (`None`: heals it).
    pub fn set_disk_fault(&self, id: u64, fault: Option<muster_raft_store::DiskFault>) -> Result<(), String> {
        muster_raft_store::set_disk_fault(&self.disk_fault_file(id), fault).map_err(|e| e.to_string())
    }

    /// How replica `id` exited, if it has (it is then no longer running).
    pub fn server_exit(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let slot = &mut self.servers[id as usize - 1];
        let status = slot.as_mut().and_then(|c| c.try_wait().ok().flatten())?;
        *slot = None;
        Some(status)
    }

    /// SIGSTOP (`true`) or SIGCONT replica `id`.
    pub fn pause_server(&self, id: u64, pause: bool) {
        if let Some(c) = &self.servers[id as usize - 1] {
            signal(c, if pause { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// `kill -9` agent `i` (its tasks keep running until the restarted agent
    /// kills what it left).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            signal(&c, libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether agent `i` runs with `--keep-tasks` (every second one: its
    /// tasks outlive it, and the next agent adopts them).
    pub fn keeps_tasks(&self, i: usize) -> bool {
        i % 2 == 1
    }

    /// Asks agent `i` to stop as an operator would (SIGTERM); returns its
    /// process, to wait for.
    pub fn terminate_agent(&mut self, i: usize) -> Option<Child> {
        let c = self.agents[i].take()?;
        signal(&c, libc::SIGCONT);
        signal(&c, libc::SIGTERM);
        Some(c)
    }

    /// SIGSTOP (`true`) or SIGCONT agent `i`.
    pub fn pause_agent(&self, i: usize, pause: bool) {
        if let Some(c) = &self.agents[i] {
            signal(c, if pause { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Records a process that exited on its own when it should not have.
    pub fn unexpected_exit(&mut self, what: String) {
        self.exits.push(what);
    }

    /// Whether every process that should run still does (one that exited by
    /// itself crashed), and the unexpected exits seen during the run.
    pub fn crashed(&mut self) -> Vec<String> {
        let mut out = self.exits.clone();
        for (i, c) in self.servers.iter_mut().enumerate() {
            if let Some(c) = c
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push(format!("replica {} exited {status}", i + 1));
            }
        }
        for (i, c) in self.agents.iter_mut().enumerate() {
            if let Some(c) = c
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push(format!("agent {} exited {status}", self.agent_ids[i]));
            }
        }
        out
    }

    /// Stops the agents with SIGTERM (their tasks get their grace and
    /// nothing is left running), then kills the replicas.
    pub fn shutdown(&mut self) {
        let agents: Vec<Child> = self.agents.iter_mut().filter_map(Option::take).collect();
        for c in &agents {
            signal(c, libc::SIGCONT);
            signal(c, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for mut c in agents {
            while matches!(c.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for mut c in self.servers.iter_mut().filter_map(Option::take) {
            signal(&c, libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.shutdown();
    }
}
