//! The real processes under test: `muster server` replicas, each advertising
//! its machine's proxy address, and `muster agent`s that reach the replicas
//! through the proxies. Killed with SIGKILL, paused with SIGSTOP, resumed
//! with SIGCONT; everything left is killed when dropped.
//!
//! There are [`MACHINES`] machines (a listening port and its proxy each).
//! Replicas 1–3 start on the first three; a replica that joins later takes
//! a free machine and the next unused id (ids are never reused: a replica
//! that comes back with an empty data dir is a new member), and a removed
//! one frees its machine.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Server flags for fast failure detection and frequent snapshots (so a
/// lagging follower needs one); every replica keeps its applied log (the
/// replay check) and a crash image (power loss).
const SERVER_FLAGS: &[&str] = &[
    // The chaos agents register unadmitted (admission is tested elsewhere).
    "--node-admission",
    "open",
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

/// Machines a replica can run on: a cluster of 3 may grow to 5.
pub const MACHINES: usize = 5;

/// The replicas the cluster starts with (ids 1–3, on machines 0–2).
pub const INITIAL_REPLICAS: u64 = 3;

/// The processes of one chaos run.
pub struct Procs {
    bin: PathBuf,
    dir: PathBuf,
    /// Where each machine's replica listens (the harness's control path).
    pub real: Vec<String>,
    /// Where each machine's replica is reached by everyone else (its proxy).
    pub proxied: Vec<String>,
    /// The replica each machine holds, if any: the members, as the harness
    /// made them.
    machines: Vec<Option<u64>>,
    /// Every replica id ever used, and its machine (retired ones too).
    placed: BTreeMap<u64, usize>,
    /// The ports of machines without a replica, held until one starts.
    holds: Vec<Option<PortHold>>,
    servers: BTreeMap<u64, Child>,
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
    /// Every read-back of a replica's log after a disk fault, before it
    /// restarted (the same check).
    pub readbacks: Vec<Readback>,
    /// Processes seen to exit on their own during the run, and how.
    exits: Vec<String>,
    /// The CA and certificates (servers, agents, the harness's admin).
    tls_dir: PathBuf,
}

/// A replica's log read back after a disk fault, before it restarted.
#[derive(Clone, Debug)]
pub struct Readback {
    /// The replica.
    pub replica: u64,
    /// `Ok(Some((acknowledged, readable)))` when it had acknowledged log
    /// entries past the last one its log reads back; `Err` when the log
    /// does not open at all.
    pub acked_beyond_readable: Result<Option<(u64, u64)>, String>,
}

/// A loopback port held for a machine whose replica is not running: bound,
/// not listening, so that no outgoing connection takes it as its local port
/// (and no other process binds it) before the next replica listens there,
/// while a connection to it is still refused at once.
struct PortHold(libc::c_int);

impl PortHold {
    /// Holds `addr`'s port, if it is free (best effort: a port still in
    /// TIME_WAIT after its last listener cannot be held).
    fn new(addr: &str) -> Option<PortHold> {
        let port: u16 = addr.rsplit(':').next()?.parse().ok()?;
        // SAFETY: plain socket calls on a descriptor this function owns; it
        // is closed on every path that does not return it.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return None;
            }
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(fd, (&sin as *const libc::sockaddr_in).cast(), len) != 0 {
                libc::close(fd);
                return None;
            }
            Some(PortHold(fd))
        }
    }
}

impl Drop for PortHold {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this hold's own, closed once.
        unsafe {
            libc::close(self.0);
        }
    }
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
        tls_dir: PathBuf,
    ) -> Procs {
        let initial = (1..=INITIAL_REPLICAS).map(Some);
        let holds = real
            .iter()
            .enumerate()
            .map(|(m, a)| (m as u64 >= INITIAL_REPLICAS).then(|| PortHold::new(a)).flatten())
            .collect();
        Procs {
            holds,
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            machines: initial.chain(std::iter::repeat(None)).take(real.len()).collect(),
            placed: (1..=INITIAL_REPLICAS).map(|id| (id, id as usize - 1)).collect(),
            servers: BTreeMap::new(),
            real,
            proxied,
            agents: (0..agents).map(|_| None).collect(),
            agent_ids: (0..agents).map(|i| format!("c{}", i + 1)).collect(),
            server_args,
            agent_args,
            power_losses: Vec::new(),
            readbacks: Vec::new(),
            exits: Vec::new(),
            tls_dir,
        }
    }

    /// The agents' node ids.
    pub fn agent_ids(&self) -> &[String] {
        &self.agent_ids
    }

    /// The members, as the harness made them (replicas on a machine), by id.
    pub fn members(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.machines.iter().flatten().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Where member `id` listens (the harness's control path).
    pub fn addr(&self, id: u64) -> &str {
        &self.real[self.machine(id)]
    }

    /// Where everyone else reaches replica `id` (its machine's proxy).
    pub fn advertised(&self, id: u64) -> &str {
        &self.proxied[self.machine(id)]
    }

    /// The machine replica `id` runs (or ran) on.
    pub fn machine(&self, id: u64) -> usize {
        self.placed[&id]
    }

    /// The control addresses of the members.
    pub fn member_addrs(&self) -> Vec<String> {
        self.members().into_iter().map(|id| self.addr(id).to_string()).collect()
    }

    /// Every replica id ever used, retired ones included.
    pub fn all_ids(&self) -> Vec<u64> {
        self.placed.keys().copied().collect()
    }

    /// A new replica on a free machine, with the next unused id and an
    /// empty data dir (not started yet); `None` when no machine is free.
    pub fn new_replica(&mut self) -> Option<u64> {
        let machine = self.machines.iter().position(Option::is_none)?;
        let id = self.placed.keys().next_back().map_or(1, |l| l + 1);
        self.machines[machine] = Some(id);
        self.placed.insert(id, machine);
        Some(id)
    }

    /// Stops replica `id` for good (it was removed from the cluster) and
    /// frees its machine. Its data dir is renamed `retired-ID`: nothing
    /// starts on it again, but its applied log still counts for the replay
    /// check.
    pub fn retire(&mut self, id: u64) -> Result<(), String> {
        self.kill_server(id);
        if let Some(m) = self.machines.iter().position(|m| *m == Some(id)) {
            self.machines[m] = None;
            self.holds[m] = PortHold::new(&self.real[m]);
        }
        let (from, to) = (self.data_dir(id), self.dir.join(format!("retired-{id}")));
        match std::fs::rename(&from, &to) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {e}", from.display())),
            _ => Ok(()),
        }
    }

    /// Where replica `id`'s applied log is: its data dir, or its retired one.
    pub fn applied_log_dir(&self, id: u64) -> PathBuf {
        let retired = self.dir.join(format!("retired-{id}"));
        if retired.exists() { retired } else { self.data_dir(id) }
    }

    /// Starts (or restarts) replica `id` on its data dir. The first three
    /// form the cluster; a later one starts empty and waits to be added.
    pub fn spawn_server(&mut self, id: u64) -> std::io::Result<()> {
        let i = self.machine(id);
        self.holds[i] = None;
        let peers: Vec<String> =
            (1..=INITIAL_REPLICAS).map(|j| format!("{j}={}", self.proxied[j as usize - 1])).collect();
        let child = Command::new(&self.bin)
            .args(["server", "--id", &id.to_string(), "--listen", &self.real[i], "--advertise", &self.proxied[i]])
            .args(if id <= INITIAL_REPLICAS { vec!["--peers".to_string(), peers.join(",")] } else { Vec::new() })
            .arg("--data-dir")
            .arg(self.data_dir(id))
            .args(SERVER_FLAGS)
            .arg("--disk-fault-file")
            .arg(self.disk_fault_file(id))
            .arg("--clock-offset-file")
            .arg(self.clock_file(id))
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .args(&self.server_args)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log(&self.dir, &format!("replica-{id}"))?)
            .spawn()?;
        self.servers.insert(id, child);
        Ok(())
    }

    /// Starts (or restarts) agent `i` (0-based).
    pub fn spawn_agent(&mut self, i: usize) -> std::io::Result<()> {
        let id = self.agent_ids[i].clone();
        let child = Command::new(&self.bin)
            .args(["agent", "--scheduler", &self.proxied.join(","), "--node-id", &id])
            // The ranks journal into the harness's own directory.
            .arg("--allow-root-tasks")
            .args(["--gpus", &AGENT_GPUS.to_string(), "--vram-mb", "16000", "--cpus", "8", "--mem-mb", "16000"])
            // Other agents fetch this one's checkpoints on loopback.
            .args(["--checkpoint-listen", "127.0.0.1:0", "--checkpoint-address", "127.0.0.1:0"])
            .arg("--work-dir")
            .arg(self.dir.join("agents").join(&id))
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .args(&self.agent_args)
            .args(self.keeps_tasks(i).then_some("--keep-tasks"))
            .arg("--disk-fault-file")
            .arg(self.agent_disk_file(i))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log(&self.dir, &format!("agent-{id}"))?)
            .spawn()?;
        self.agents[i] = Some(child);
        Ok(())
    }

    /// The control file of agent `i`'s injected disk faults.
    fn agent_disk_file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("agent-disk-{}", self.agent_ids[i]))
    }

    /// Fills agent `i`'s disk (`true`) or makes room on it again.
    pub fn set_agent_disk_full(&self, i: usize, full: bool) -> Result<(), String> {
        let path = self.agent_disk_file(i);
        let done = if full {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, "full").and_then(|()| std::fs::rename(&tmp, &path))
        } else {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        };
        done.map_err(|e| format!("{}: {e}", path.display()))
    }

    /// How many attempts agent `i` has refused to start so far, by its log.
    pub fn agent_refused_starts(&self, i: usize) -> usize {
        let log =
            std::fs::read_to_string(self.dir.join(format!("agent-{}.log", self.agent_ids[i]))).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("cannot record the attempt") || l.contains("starting an attempt without its record"))
            .count()
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
        self.servers.iter().map(|(&id, c)| (id, c.id())).collect()
    }

    /// `kill -9` replica `id`.
    pub fn kill_server(&mut self, id: u64) {
        if let Some(mut c) = self.servers.remove(&id) {
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
        self.tls_dir.clone()
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

    /// Reads back the log of replica `id`, whose process is gone, and
    /// records whether it holds everything the replica acknowledged.
    pub fn read_back(&mut self, id: u64) {
        let found = muster_raft_store::acked_beyond_readable(&self.data_dir(id)).map_err(|e| e.to_string());
        self.readbacks.push(Readback { replica: id, acked_beyond_readable: found });
    }

    /// The control file of replica `id`'s injected disk faults.
    fn disk_fault_file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("disk-fault-{id}"))
    }

    /// Gives replica `id`'s disk `fault` (`None`: heals it).
    pub fn set_disk_fault(&self, id: u64, fault: Option<muster_raft_store::DiskFault>) -> Result<(), String> {
        muster_raft_store::set_disk_fault(&self.disk_fault_file(id), fault).map_err(|e| e.to_string())
    }

    /// The control file of replica `id`'s clock shift.
    fn clock_file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("clock-{id}"))
    }

    /// Moves replica `id`'s wall clock by `shift` (`None`: puts it right).
    pub fn set_clock(&self, id: u64, shift: Option<muster_clock::Shift>) -> Result<(), String> {
        muster_clock::set_shift(&self.clock_file(id), shift).map_err(|e| e.to_string())
    }

    /// How replica `id` exited, if it has (it is then no longer running).
    pub fn server_exit(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let status = self.servers.get_mut(&id).and_then(|c| c.try_wait().ok().flatten())?;
        self.servers.remove(&id);
        Some(status)
    }

    /// SIGSTOP (`true`) or SIGCONT replica `id`.
    pub fn pause_server(&self, id: u64, pause: bool) {
        if let Some(c) = self.servers.get(&id) {
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
        for (id, c) in self.servers.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                // Its last words, so that a report kept nowhere else still
                // says why (the log's last line that is not a backtrace's).
                let log = std::fs::read_to_string(self.dir.join(format!("replica-{id}.log"))).unwrap_or_default();
                let last = log.lines().rev().find(|l| {
                    let l = l.trim_start();
                    !l.is_empty() && !l.starts_with("at ") && !l.chars().next().is_some_and(|c| c.is_ascii_digit())
                });
                match last {
                    Some(line) => out.push(format!(
                        "replica {id} exited {status}: {}",
                        line.trim().chars().take(400).collect::<String>()
                    )),
                    None => out.push(format!("replica {id} exited {status}")),
                }
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
        for (_, mut c) in std::mem::take(&mut self.servers) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_refuses_connections_and_binds_until_released() {
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let hold = PortHold::new(&addr).expect("a free port is held");
        let refused = std::net::TcpStream::connect(&addr).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "held, not listening");
        assert!(std::net::TcpListener::bind(&addr).is_err(), "nobody else binds it");
        assert!(PortHold::new(&addr).is_none());
        drop(hold);
        assert!(std::net::TcpListener::bind(&addr).is_ok(), "released");
    }
}
