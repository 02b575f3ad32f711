//! The gang fabric: the network between a gang's ranks, which the harness
//! can cut between nodes (`partition-gang`).
//!
//! Every node of a chaos run shares one machine, so the nodes' links are
//! this relay's connections. Task 0 of a gang (the master) listens on a port
//! of its own and registers it here under the gang's (allocation, epoch);
//! every other rank connects here and names the gang it joins, and the
//! fabric connects it to its master and relays both ways.
//!
//! A cut node's links to every other node are held, not closed, as in a
//! real partition: bytes (and a closed end) wait until the cut heals, so
//! each side sees only silence. Ranks on one node always reach each other.
//!
//! ```text
//!   master (task 0) ──"hub A E NODE PORT"──▶ fabric
//!   rank i ──"join A E NODE i"──▶ fabric ──"rank i"──▶ master
//!          ◀──────── "joined", then beats both ways ────────▶
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a rank may wait for its master to register.
pub const JOIN_WAIT: Duration = Duration::from_secs(30);

/// How often a held link looks again whether its cut has healed.
const HELD_POLL: Duration = Duration::from_millis(50);

/// The longest first line the fabric reads.
const MAX_LINE: usize = 256;

#[derive(Default)]
struct Links {
    /// Each gang's master: (allocation, epoch) → (node, port).
    masters: BTreeMap<(u64, u64), (String, u16)>,
    /// The nodes cut off from every other node.
    cut: BTreeSet<String>,
}

/// The running fabric; it stops accepting when dropped.
pub struct Fabric {
    addr: SocketAddr,
    links: Arc<Mutex<Links>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn lock(links: &Mutex<Links>) -> std::sync::MutexGuard<'_, Links> {
    links.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the link between nodes `a` and `b` is cut now.
fn severed(links: &Mutex<Links>, a: &str, b: &str) -> bool {
    let l = lock(links);
    a != b && (l.cut.contains(a) || l.cut.contains(b))
}

impl Fabric {
    /// Listens on a loopback port.
    pub async fn start() -> std::io::Result<Fabric> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let links = Arc::new(Mutex::new(Links::default()));
        let shared = links.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Fabric { addr, links, accept })
    }

    /// Where ranks reach it (`CHAOS_FABRIC`).
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Cuts `node` off from every other node's ranks.
    pub fn cut(&self, node: &str) {
        lock(&self.links).cut.insert(node.to_string());
    }

    /// Heals every cut.
    pub fn heal(&self) {
        lock(&self.links).cut.clear();
    }
}

/// Reads one `\n`-terminated line, a byte at a time (nothing past it is
/// consumed: the rest of the stream is relayed as it is).
pub async fn read_line<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<String> {
    let mut line = Vec::new();
    loop {
        let b = r.read_u8().await?;
        if b == b'\n' {
            return String::from_utf8(line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
        if line.len() >= MAX_LINE {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
        }
        line.push(b);
    }
}

/// One connection: a master registering, or a rank joining its master.
async fn serve(mut stream: TcpStream, links: Arc<Mutex<Links>>) {
    let Ok(line) = read_line(&mut stream).await else { return };
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["hub", alloc, epoch, node, port] => {
            let (Ok(alloc), Ok(epoch), Ok(port)) = (alloc.parse(), epoch.parse(), port.parse()) else { return };
            lock(&links).masters.insert((alloc, epoch), (node.to_string(), port));
            let _ = stream.write_all(b"ok\n").await;
        }
        ["join", alloc, epoch, node, rank] => {
            let (Ok(alloc), Ok(epoch)) = (alloc.parse::<u64>(), epoch.parse::<u64>()) else { return };
            let give_up = tokio::time::Instant::now() + JOIN_WAIT;
            let master = loop {
                if let Some(m) = lock(&links).masters.get(&(alloc, epoch)).cloned() {
                    break m;
                }
                if tokio::time::Instant::now() >= give_up {
                    return; // closed: the rank gives up
                }
                tokio::time::sleep(HELD_POLL).await;
            };
            let (master_node, port) = master;
            let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", port)).await else { return };
            if upstream.write_all(format!("rank {rank}\n").as_bytes()).await.is_err()
                || stream.write_all(b"joined\n").await.is_err()
            {
                return;
            }
            let node = node.to_string();
            let (down_r, down_w) = stream.into_split();
            let (up_r, up_w) = upstream.into_split();
            let toward_master = relay(down_r, up_w, links.clone(), node.clone(), master_node.clone());
            let toward_rank = relay(up_r, down_w, links, master_node, node);
            tokio::join!(toward_master, toward_rank);
        }
        _ => {}
    }
}

/// Copies `from` to `to`, holding each chunk (and the end of the stream)
/// while the link between `a` and `b` is cut.
async fn relay<R, W>(mut from: R, mut to: W, links: Arc<Mutex<Links>>, a: String, b: String)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = [0u8; 4096];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        while severed(&links, &a, &b) {
            tokio::time::sleep(HELD_POLL).await;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// A master and a joined rank exchange lines; a cut holds them (both
    /// ways) until it heals, and then they arrive.
    #[tokio::test]
    async fn a_cut_holds_a_links_bytes_until_it_heals() {
        let fabric = Fabric::start().await.unwrap();
        let master = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = master.local_addr().unwrap().port();
        let mut reg = TcpStream::connect(fabric.addr()).await.unwrap();
        reg.write_all(format!("hub 7 2 c1 {port}\n").as_bytes()).await.unwrap();
        assert_eq!(read_line(&mut reg).await.unwrap(), "ok");

        let mut rank = TcpStream::connect(fabric.addr()).await.unwrap();
        rank.write_all(b"join 7 2 c2 1\n").await.unwrap();
        let (mut at_master, _) = master.accept().await.unwrap();
        assert_eq!(read_line(&mut at_master).await.unwrap(), "rank 1");
        assert_eq!(read_line(&mut rank).await.unwrap(), "joined");

        rank.write_all(b"beat\n").await.unwrap();
        assert_eq!(read_line(&mut at_master).await.unwrap(), "beat");

        fabric.cut("c1");
        rank.write_all(b"held\n").await.unwrap();
        at_master.write_all(b"held too\n").await.unwrap();
        let mut at_master = tokio::io::BufReader::new(at_master);
        let mut line = String::new();
        let quiet = tokio::time::timeout(Duration::from_millis(300), at_master.read_line(&mut line)).await;
        assert!(quiet.is_err(), "a cut link carried {line:?}");
        let mut rank = tokio::io::BufReader::new(rank);
        let quiet = tokio::time::timeout(Duration::from_millis(300), rank.read_line(&mut line)).await;
        assert!(quiet.is_err(), "a cut link carried {line:?}");

        fabric.heal();
        line.clear();
        at_master.read_line(&mut line).await.unwrap();
        assert_eq!(line, "held\n");
        line.clear();
        rank.read_line(&mut line).await.unwrap();
        assert_eq!(line, "held too\n");
    }

    /// Ranks on the master's own node are never cut off from it, and a rank
    /// whose master never registers is let go.
    #[tokio::test(start_paused = true)]
    async fn one_nodes_ranks_stay_linked_and_a_missing_master_is_given_up() {
        let fabric = Fabric::start().await.unwrap();
        fabric.cut("c1");
        assert!(!severed(&fabric.links, "c1", "c1"));
        assert!(severed(&fabric.links, "c1", "c3") && severed(&fabric.links, "c3", "c1"));
        assert!(!severed(&fabric.links, "c2", "c3"));
        let mut rank = TcpStream::connect(fabric.addr()).await.unwrap();
        rank.write_all(b"join 9 1 c2 1\n").await.unwrap();
        let mut rest = Vec::new();
        // Paused time runs ahead while everything waits: the fabric gives up
        // after JOIN_WAIT and closes the connection.
        let n = rank.read_to_end(&mut rest).await.unwrap();
        assert_eq!(n, 0);
    }
}
