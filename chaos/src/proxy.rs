//! A TCP proxy in front of one replica's port, which the nemesis controls.
//!
//! Every replica advertises its proxy's address, so Raft peers, agents and
//! clients all reach it through here. The proxy can
//!
//! - **isolate** the replica: refuse every connection to it and cut the open
//!   ones (its inbound side of a partition);
//! - **block sources**: refuse connections from given replica processes
//!   (the outbound side of another replica's partition). A connection's
//!   source process is found from the kernel's socket tables
//!   (`/proc/net/tcp` gives the inode of the client socket bound to the
//!   peer's port; `/proc/PID/fd` tells which known process holds it);
//! - **slow** the link: every chunk forwarded waits `delay ± jitter`, and
//!   with probability `loss` it is held for a further 200–400 ms, as TCP's
//!   retransmission would after a lost segment (bytes are never dropped
//!   from an open stream: that would corrupt it, not model loss).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use muster_sim::SimRng;

/// How a link misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slowness {
    /// Added to every chunk.
    pub delay: Duration,
    /// Uniform ± around the delay.
    pub jitter: Duration,
    /// Chance a chunk is held as if a segment were lost.
    pub loss: f64,
}

/// One forwarded connection.
struct Conn {
    /// The client's end of it: its port on 127.0.0.1, to look it up in
    /// `/proc/net/tcp` again.
    peer_port: u16,
    /// The known process holding the client end, once identified.
    pid: Option<u32>,
    /// The task forwarding its bytes.
    task: JoinHandle<()>,
}

#[derive(Default)]
struct State {
    isolated: bool,
    /// Processes whose connections are refused.
    blocked: BTreeSet<u32>,
    /// Processes a connection may come from (the replicas and agents), to
    /// identify.
    known: Vec<u32>,
    slow: Option<Slowness>,
    /// Open connections.
    conns: BTreeMap<u64, Conn>,
    next: u64,
    rng: Option<SimRng>,
}

impl State {
    fn allows(&self, pid: Option<u32>) -> bool {
        !self.isolated && pid.is_none_or(|p| !self.blocked.contains(&p))
    }

    /// Aborts the open connections the current rules refuse.
    fn cut(&mut self) {
        let refused: Vec<u64> = self.conns.iter().filter(|(_, c)| !self.allows(c.pid)).map(|(k, _)| *k).collect();
        for k in refused {
            if let Some(c) = self.conns.remove(&k) {
                c.task.abort();
            }
        }
    }
}

/// One proxy.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: String, seed: u64) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State { rng: Some(SimRng::new(seed)), ..State::default() }));
        let accept = tokio::spawn(accept_loop(listener, addr.port(), target, state.clone()));
        Ok(Proxy { addr, state, accept })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("proxy lock"))
    }

    /// Isolates the replica behind it (or lets it be reached again).
    pub fn set_isolated(&self, isolated: bool) {
        self.with(|s| {
            s.isolated = isolated;
            s.cut();
        });
    }

    /// Refuses connections from these processes (replacing the last set).
    pub fn set_blocked(&self, pids: BTreeSet<u32>) {
        self.with(|s| {
            s.blocked = pids;
            s.cut();
        });
    }

    /// The processes a connection may be identified as. Open connections
    /// not identified yet are looked up again: a process started just
    /// before it was made known may already have connected, and a
    /// connection left unidentified could never be cut.
    pub fn set_known(&self, pids: Vec<u32>) {
        let port = self.addr.port();
        let unknown: Vec<(u64, u16)> = self.with(|s| {
            s.known = pids.clone();
            s.conns.iter().filter(|(_, c)| c.pid.is_none()).map(|(k, c)| (*k, c.peer_port)).collect()
        });
        let found: Vec<(u64, u32)> =
            unknown.into_iter().filter_map(|(k, peer)| source_pid(peer, port, &pids).map(|p| (k, p))).collect();
        self.with(|s| {
            for (k, pid) in found {
                if let Some(c) = s.conns.get_mut(&k) {
                    c.pid = Some(pid);
                }
            }
            s.cut();
        });
    }

    /// Slows every link through it (None: full speed).
    pub fn set_slow(&self, slow: Option<Slowness>) {
        self.with(|s| s.slow = slow);
    }

    /// Open connections.
    #[cfg(test)]
    pub fn connections(&self) -> usize {
        self.with(|s| s.conns.values().filter(|c| !c.task.is_finished()).count())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.with(|s| {
            for (_, c) in std::mem::take(&mut s.conns) {
                c.task.abort();
            }
        });
    }
}

async fn accept_loop(listener: TcpListener, port: u16, target: String, state: Arc<Mutex<State>>) {
    loop {
        let Ok((inbound, peer)) = listener.accept().await else { continue };
        let known = state.lock().expect("proxy lock").known.clone();
        let pid = source_pid(peer.port(), port, &known);
        let mut s = state.lock().expect("proxy lock");
        s.conns.retain(|_, c| !c.task.is_finished());
        if !s.allows(pid) {
            continue; // dropped: the connection closes
        }
        let id = s.next;
        s.next += 1;
        let task = tokio::spawn(forward(inbound, target.clone(), state.clone()));
        s.conns.insert(id, Conn { peer_port: peer.port(), pid, task });
    }
}

async fn forward(inbound: TcpStream, target: String, state: Arc<Mutex<State>>) {
    let Ok(outbound) = TcpStream::connect(&target).await else { return };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    tokio::select! {
        _ = pump(ri, wo, state.clone()) => {}
        _ = pump(ro, wi, state) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let wait = {
            let mut s = state.lock().expect("proxy lock");
            match s.slow {
                None => Duration::ZERO,
                Some(slow) => {
                    let rng = s.rng.as_mut().expect("seeded");
                    let jitter = slow.jitter.as_millis() as u64;
                    let base = slow.delay.as_millis() as u64;
                    let mut ms = (base + rng.range(0, 2 * jitter)).saturating_sub(jitter);
                    if rng.chance(slow.loss) {
                        ms += rng.range(200, 400);
                    }
                    Duration::from_millis(ms)
                }
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The known process holding the client end of a loopback connection from
/// `peer_port` to `local_port`, if it is one of `known`.
fn source_pid(peer_port: u16, local_port: u16, known: &[u32]) -> Option<u32> {
    if known.is_empty() {
        return None;
    }
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|table| socket_inode(&table, peer_port, local_port))?;
    let needle = format!("socket:[{inode}]");
    known.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == needle))
        })
    })
}

/// The inode of the socket in a `/proc/net/tcp` table whose local port is
/// `local` and remote port `remote`.
fn socket_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    let port = |addr: &str| addr.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && port(f[1]) == Some(local) && port(f[2]) == Some(remote)).then(|| f[9].parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_socket_by_its_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                     0: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1\n\
                     1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1\n";
        assert_eq!(socket_inode(table, 0xD431, 0x1F90), Some(4242));
        assert_eq!(socket_inode(table, 0x1F90, 0xD431), Some(4343));
        assert_eq!(socket_inode(table, 1, 2), None);
    }

    /// A loopback echo server's address.
    async fn echo_server() -> String {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        target
    }

    /// Whether `c` was closed (read to its end or reset within 10 s).
    async fn closed(c: &mut TcpStream) -> bool {
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await.unwrap();
        n.is_err() || n.unwrap() == 0
    }

    #[tokio::test]
    async fn forwards_identifies_its_own_process_and_cuts_when_blocked() {
        let proxy = Proxy::start(echo_server().await, 1).await.unwrap();
        let me = std::process::id();
        proxy.set_known(vec![me]);
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        // This process is identified as the source, so blocking it cuts the
        // connection and refuses the next one.
        proxy.set_blocked(BTreeSet::from([me]));
        assert!(closed(&mut c).await, "cut");
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = c.write_all(b"ping").await;
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b)).await.unwrap();
        assert!(n.is_err() || n.unwrap() == 0, "refused");
        // Unblocked: through again, slowly.
        proxy.set_blocked(BTreeSet::new());
        proxy.set_slow(Some(Slowness { delay: Duration::from_millis(50), jitter: Duration::ZERO, loss: 0.0 }));
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let t = std::time::Instant::now();
        c.write_all(b"pong").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        assert!(t.elapsed() >= Duration::from_millis(100), "50 ms each way");
        assert_eq!(proxy.connections(), 1);
    }

    /// A process that connected before it was made known (an agent spawned
    /// just before the harness lists its pid) is identified when it is, so
    /// a later cut still reaches its open connection.
    #[tokio::test]
    async fn a_connection_made_before_its_process_was_known_is_still_cut() {
        let proxy = Proxy::start(echo_server().await, 2).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        // Unknown when accepted: blocking this process cannot cut it yet.
        let me = std::process::id();
        proxy.set_blocked(BTreeSet::from([me]));
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping", "not identified, so not cut");
        // Made known: identified and cut at once.
        proxy.set_known(vec![me]);
        assert!(closed(&mut c).await, "cut once known");
    }
}
