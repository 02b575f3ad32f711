//! Limits on what any peer can hold open (docs/security.md): connections in
//! total and per peer address are counted as they are accepted, before any
//! TLS handshake; TLS handshakes, requests and streams per connection are
//! bounded by the server builder.
//!
//! A connection is **pending** from its accept until it makes its first
//! authorised call (the auth layer tells [`Connections::admitted`]); then it
//! is **proven**. Pending connections cost an attacker nothing (no
//! certificate, no handshake), so they never crowd out proven peers: a new
//! connection over a cap evicts a pending one rather than being refused —
//! over the per-address cap, that address's oldest; over the total cap, the
//! oldest of the address holding the most pending connections, so that a
//! flood pays for the newcomer, not a client waiting for its handshake —
//! and only when every connection in the way is proven is the newcomer
//! closed.
//!
//! ```text
//!   accept ─▶ under both caps? ─▶ Limited (pending) ─▶ TLS (handshake_timeout) ─▶ h2
//!          │                                            first authorised call ─▶ proven
//!          └▶ over a cap: evict a pending connection in the way (the address's oldest, or
//!             the oldest of the address with most pending), and accept; none: close it
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A server's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections from one IP address.
    pub max_connections_per_peer: usize,
    /// Concurrent HTTP/2 streams (calls, watches) on one connection.
    pub max_streams_per_connection: u32,
    /// A TLS handshake not finished by then drops the connection.
    pub handshake_timeout: Duration,
    /// A call that has not produced its response by then fails with
    /// DEADLINE_EXCEEDED (a stream's messages are not limited).
    pub request_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 4096,
            max_connections_per_peer: 256,
            max_streams_per_connection: 256,
            handshake_timeout: muster_tls::HANDSHAKE_TIMEOUT,
            request_timeout: Duration::from_secs(120),
        }
    }
}

/// Tells a connection's I/O to fail: set once, wakes its reader.
#[derive(Default)]
struct Eviction {
    evicted: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Eviction {
    fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }

    fn check(&self, cx: &Context<'_>) -> io::Result<()> {
        if self.evicted.load(Ordering::SeqCst) {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "evicted: pending while the server is full"));
        }
        let mut w = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
        Ok(())
    }
}

struct Conn {
    ip: Option<IpAddr>,
    /// Accept order, for "the oldest pending".
    seq: u64,
    proven: bool,
    eviction: Arc<Eviction>,
}

#[derive(Default)]
struct Counts {
    /// Open connections not yet told to go.
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
    conns: HashMap<SocketAddr, Conn>,
    /// Pending connections by accept order.
    pending: BTreeMap<u64, SocketAddr>,
    /// Pending connections of each address, by accept order.
    pending_by_ip: HashMap<IpAddr, BTreeSet<u64>>,
    /// Addresses by how many pending connections they hold (the last holds
    /// the most): the flooder pays for the newcomer, not a client.
    heaviest: BTreeSet<(usize, IpAddr)>,
    next_seq: u64,
}

impl Counts {
    fn add_pending(&mut self, seq: u64, addr: SocketAddr) {
        self.pending.insert(seq, addr);
        let set = self.pending_by_ip.entry(addr.ip()).or_default();
        self.heaviest.remove(&(set.len(), addr.ip()));
        set.insert(seq);
        self.heaviest.insert((set.len(), addr.ip()));
    }

    fn remove_pending(&mut self, seq: u64, addr: SocketAddr) {
        if self.pending.remove(&seq).is_none() {
            return;
        }
        let set = self.pending_by_ip.get_mut(&addr.ip()).expect("a pending address is indexed");
        self.heaviest.remove(&(set.len(), addr.ip()));
        set.remove(&seq);
        if set.is_empty() {
            self.pending_by_ip.remove(&addr.ip());
        } else {
            self.heaviest.insert((set.len(), addr.ip()));
        }
    }

    /// Stops counting `addr` (it closed, or was told to go).
    fn forget(&mut self, addr: &SocketAddr) -> Option<Conn> {
        let conn = self.conns.remove(addr)?;
        self.remove_pending(conn.seq, *addr);
        self.total -= 1;
        if let Some(ip) = conn.ip
            && let Some(n) = self.by_peer.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&ip);
            }
        }
        metrics::gauge!("muster_connections_open").set(self.total as f64);
        Some(conn)
    }

    /// The connection to evict: the oldest pending one of `ip` when given
    /// (the per-address cap), else of the address holding the most pending
    /// connections (the total cap).
    fn victim(&self, ip: Option<IpAddr>) -> Option<SocketAddr> {
        let ip = ip.or_else(|| self.heaviest.last().map(|&(_, ip)| ip))?;
        let seq = self.pending_by_ip.get(&ip)?.first()?;
        self.pending.get(seq).copied()
    }
}

/// The connections one server holds, shared by its acceptor and its auth
/// layer.
#[derive(Clone)]
pub struct Connections {
    counts: Arc<Mutex<Counts>>,
    limits: ServerLimits,
}

/// A slot held by one open connection (its address and accept order).
struct Slot {
    counts: Arc<Mutex<Counts>>,
    conn: Option<(SocketAddr, u64)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((addr, seq)) = self.conn {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            // Not if it was evicted and its address is another connection's now.
            if c.conns.get(&addr).is_some_and(|conn| conn.seq == seq) {
                c.forget(&addr);
            }
        }
    }
}

/// An accepted connection within the limits.
pub struct Limited {
    inner: TcpStream,
    eviction: Arc<Eviction>,
    _slot: Slot,
}

impl Connections {
    /// No connections yet, under `limits`.
    pub fn new(limits: ServerLimits) -> Connections {
        Connections { counts: Arc::default(), limits }
    }

    /// The connection from `addr` made an authorised call: it is proven,
    /// and never evicted for a newcomer.
    pub fn admitted(&self, addr: SocketAddr) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = c.conns.get_mut(&addr)
            && !conn.proven
        {
            conn.proven = true;
            let seq = conn.seq;
            c.remove_pending(seq, addr);
        }
    }

    /// Accepts from `listener`, evicting pending connections or closing
    /// newcomers over the limits.
    pub fn incoming(&self, listener: TcpListener) -> impl Stream<Item = io::Result<Limited>> + use<> {
        let this = self.clone();
        TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
            Ok(tcp) => this.admit(tcp).map(Ok),
            Err(e) => Some(Err(e)),
        })
    }

    fn admit(&self, tcp: TcpStream) -> Option<Limited> {
        // tonic applies its own `tcp_nodelay` only to listeners it accepts
        // from: without this, Nagle holds a reply's second small write
        // (HTTP/2 DATA, then trailers) until the client's delayed ACK, up to
        // 40 ms later.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
        let addr = tcp.peer_addr().ok();
        let ip = addr.map(|a| a.ip());
        let limits = self.limits;
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let from_peer = ip.map_or(0, |p| c.by_peer.get(&p).copied().unwrap_or(0));
            let (reason, in_the_way) = if c.total >= limits.max_connections {
                ("total", None)
            } else if from_peer >= limits.max_connections_per_peer {
                ("per_peer", ip)
            } else {
                break;
            };
            let Some(victim) = c.victim(in_the_way) else {
                metrics::counter!("muster_connections_refused_total", "reason" => reason).increment(1);
                tracing::warn!(peer = ?ip, reason, open = c.total, from_peer, "connection refused: over the limit");
                return None;
            };
            let conn = c.forget(&victim).expect("a pending connection is counted");
            conn.eviction.evict();
            metrics::counter!("muster_connections_evicted_total", "reason" => reason).increment(1);
            tracing::info!(peer = %victim, reason, "evicted a pending connection for a newcomer");
        }
        let eviction = Arc::new(Eviction::default());
        let seq = c.next_seq;
        c.next_seq += 1;
        if let Some(a) = addr {
            c.total += 1;
            if let Some(p) = ip {
                *c.by_peer.entry(p).or_default() += 1;
            }
            c.add_pending(seq, a);
            c.conns.insert(a, Conn { ip, seq, proven: false, eviction: eviction.clone() });
            metrics::gauge!("muster_connections_open").set(c.total as f64);
        }
        drop(c);
        Some(Limited {
            inner: tcp,
            eviction,
            _slot: Slot { counts: self.counts.clone(), conn: addr.map(|a| (a, seq)) },
        })
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.eviction.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.eviction.check(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A server side that hands each accepted connection to the test.
    async fn serve(limits: ServerLimits) -> (SocketAddr, Connections, tokio::sync::mpsc::UnboundedReceiver<Limited>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Connections::new(limits);
        let mut accepted = Box::pin(conns.incoming(listener));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(c) = accepted.next().await {
                let _ = tx.send(c.unwrap());
            }
        });
        (addr, conns, rx)
    }

    /// Every accepted connection has Nagle off: tonic sets `TCP_NODELAY`
    /// only on listeners it accepts from itself, and with Nagle a reply's
    /// trailers wait for the client's delayed ACK (a CLI call took 53 ms
    /// instead of 11).
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let (addr, _conns, mut rx) = serve(ServerLimits::default()).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let held = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
        assert!(held.inner.nodelay().unwrap(), "TCP_NODELAY is off on an accepted connection");
    }

    /// Whether the server closed `c` (its read ends) within 30 s.
    async fn closed(c: &mut TcpStream) -> bool {
        let mut buf = [0u8; 1];
        matches!(tokio::time::timeout(Duration::from_secs(30), c.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
    }

    /// Reads from the server side, as the TLS layer would, until it fails.
    fn pump(mut held: Limited) {
        tokio::spawn(async move {
            let mut buf = [0u8; 16];
            while matches!(held.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }

    /// Issue 22, item 10: over a cap, the oldest connection that has not
    /// proven itself (no authorised call yet) makes room for the newcomer;
    /// proven connections are never evicted, and when only they are in the
    /// way, the newcomer is closed.
    #[tokio::test]
    async fn pending_connections_make_room_and_proven_ones_keep_theirs() {
        let limits = ServerLimits { max_connections: 10, max_connections_per_peer: 2, ..ServerLimits::default() };
        let (addr, conns, mut rx) = serve(limits).await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        pump(rx.recv().await.unwrap());
        let b = TcpStream::connect(addr).await.unwrap();
        let held_b = rx.recv().await.unwrap();
        // A third from the same address: the oldest pending one (a) goes.
        let c = TcpStream::connect(addr).await.unwrap();
        let held_c = rx.recv().await.unwrap();
        assert!(closed(&mut a).await, "the oldest pending connection was evicted");
        // b and c prove themselves; a fourth finds nobody to evict.
        conns.admitted(b.local_addr().unwrap());
        conns.admitted(c.local_addr().unwrap());
        let mut d = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut d).await, "the newcomer is closed when only proven connections are in the way");
        // Closing a proven one frees its slot.
        drop((b, held_b));
        let _e = TcpStream::connect(addr).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().is_some());
        drop((c, held_c));
    }

    /// The total cap evicts the oldest pending connection of any address.
    #[tokio::test]
    async fn the_total_cap_evicts_the_oldest_pending_connection_anywhere() {
        let limits = ServerLimits { max_connections: 2, max_connections_per_peer: 10, ..ServerLimits::default() };
        let (addr, conns, mut rx) = serve(limits).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        pump(rx.recv().await.unwrap());
        let proven = TcpStream::connect(addr).await.unwrap();
        let _held = rx.recv().await.unwrap();
        conns.admitted(proven.local_addr().unwrap());
        let _third = TcpStream::connect(addr).await.unwrap();
        let _held3 = rx.recv().await.unwrap();
        assert!(closed(&mut first).await);
    }
}
