//! Limits on what any peer can hold open (docs/security.md): connections in
//! total and per peer address are counted as they are accepted, before any
//! TLS handshake, and a connection over either cap is closed at once; TLS
//! handshakes, requests and streams per connection are bounded by the
//! server builder.
//!
//! ```text
//!   accept ─▶ over max_connections or max_connections_per_peer? ─▶ close
//!          └▶ Limited (holds its slot until dropped) ─▶ TLS (handshake_timeout) ─▶ h2
//! ```

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
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

#[derive(Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// A slot held by one open connection.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    peer: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if let Some(peer) = self.peer
            && let Some(n) = c.by_peer.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                c.by_peer.remove(&peer);
            }
        }
        metrics::gauge!("muster_connections_open").set(c.total as f64);
    }
}

/// An accepted connection within the limits.
pub struct Limited {
    inner: TcpStream,
    _slot: Slot,
}

/// Accepts from `listener`, closing connections over the limits.
pub fn incoming(listener: TcpListener, limits: ServerLimits) -> impl Stream<Item = io::Result<Limited>> {
    let counts = Arc::new(Mutex::new(Counts::default()));
    TcpListenerStream::new(listener).filter_map(move |accepted| {
        let tcp = match accepted {
            Ok(tcp) => tcp,
            Err(e) => return Some(Err(e)),
        };
        let peer = tcp.peer_addr().ok().map(|a| a.ip());
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        let from_peer = peer.map_or(0, |p| c.by_peer.get(&p).copied().unwrap_or(0));
        let over = if c.total >= limits.max_connections {
            Some("total")
        } else if from_peer >= limits.max_connections_per_peer {
            Some("per_peer")
        } else {
            None
        };
        if let Some(reason) = over {
            metrics::counter!("muster_connections_refused_total", "reason" => reason).increment(1);
            tracing::warn!(peer = ?peer, reason, open = c.total, from_peer, "connection refused: over the limit");
            return None;
        }
        c.total += 1;
        if let Some(p) = peer {
            *c.by_peer.entry(p).or_default() += 1;
        }
        metrics::gauge!("muster_connections_open").set(c.total as f64);
        drop(c);
        Some(Ok(Limited { inner: tcp, _slot: Slot { counts: counts.clone(), peer } }))
    })
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
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

    /// Connections over a cap are closed at once; closing one frees its slot.
    #[tokio::test]
    async fn connections_over_a_cap_are_closed_and_slots_come_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ServerLimits { max_connections: 10, max_connections_per_peer: 2, ..ServerLimits::default() };
        let mut accepted = Box::pin(incoming(listener, limits));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(c) = accepted.next().await {
                let _ = tx.send(c.unwrap());
            }
        });
        let a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let held_a = rx.recv().await.unwrap();
        let _held_b = rx.recv().await.unwrap();
        // The third from the same address is closed by the server.
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(30), c.read(&mut buf)).await.unwrap().unwrap_or(0);
        assert_eq!(n, 0, "the third connection was closed");
        // Dropping one frees a slot.
        drop((a, held_a));
        let _d = TcpStream::connect(addr).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().is_some());
    }
}
