//! What the benches in `cli/benches/` share (each includes this module).

#![allow(dead_code, reason = "each bench is its own crate and uses part of this")]

/// The number after `name` on the command line (`--seconds 5`), or
/// `default` when it is absent or not a number.
pub fn opt(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A replica's `/metrics` page (empty when it cannot be read), over plain
/// HTTP/1.0.
pub fn metrics(addr: impl std::net::ToSocketAddrs) -> String {
    use std::io::{Read, Write};
    let mut text = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n");
        let _ = s.read_to_string(&mut text);
    }
    text
}
