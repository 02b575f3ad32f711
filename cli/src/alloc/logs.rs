//! `muster alloc logs`: an attempt's stdout and stderr, fetched from its
//! node, stderr's lines marked when both are shown.

use muster_proto::v1;
use muster_proto::v1::allocation_service_client::AllocationServiceClient;

use crate::client::Cluster;

/// What `alloc logs` was asked for.
pub struct LogsArgs {
    pub id: u64,
    pub task: u32,
    pub attempt: u32,
    pub stdout: bool,
    pub stderr: bool,
    pub follow: bool,
}

/// Prints the attempt's output to stdout until it ends (or, following,
/// until the attempt does); stops quietly when the reader goes away.
pub async fn logs(cluster: &mut Cluster, args: LogsArgs) -> anyhow::Result<()> {
    let LogsArgs { id, task, attempt, stdout, stderr, follow } = args;
    let req = |stderr: bool| v1::LogsRequest { id, task, attempt, stderr, follow };
    let fail = |s: tonic::Status| anyhow::anyhow!(crate::client::describe(&s));
    if stdout || stderr {
        let mut stream = open_logs(cluster, req(stderr)).await?;
        while let Some(chunk) = stream.message().await.map_err(fail)? {
            if !emit(&chunk.data)? {
                return Ok(());
            }
        }
        return Ok(());
    }
    // Both: stdout as it is, stderr's lines marked. Following, they
    // interleave as they come; otherwise stdout first.
    let mut out_stream = open_logs(cluster, req(false)).await?;
    let mut err_stream = open_logs(cluster, req(true)).await?;
    let mut marked = Marked::default();
    let (mut wrote_out, mut wrote_err) = (false, false);
    let (mut out_done, mut err_done) = (false, false);
    while !(out_done && err_done) {
        let (data, is_err) = tokio::select! {
            m = out_stream.message(), if !out_done => match m.map_err(fail)? {
                Some(c) => (c.data, false),
                None => { out_done = true; continue }
            },
            m = err_stream.message(), if !err_done && (follow || out_done) => match m.map_err(fail)? {
                Some(c) => (c.data, true),
                None => { err_done = true; continue }
            },
        };
        wrote_out |= !is_err && !data.is_empty();
        wrote_err |= is_err && !data.is_empty();
        let text = if is_err { marked.push(&data) } else { data };
        if !emit(&text)? {
            return Ok(());
        }
    }
    if !emit(&marked.finish())? {
        return Ok(());
    }
    if wrote_err && !wrote_out {
        eprintln!("muster: task {task}'s attempt wrote to stderr only (marked [stderr] above)");
    }
    Ok(())
}

/// One of an attempt's logs, as a stream of chunks.
async fn open_logs(cluster: &mut Cluster, req: v1::LogsRequest) -> anyhow::Result<tonic::Streaming<v1::LogChunk>> {
    Ok(cluster.call(|ch| async move { AllocationServiceClient::new(ch).logs(req).await }).await?.into_inner())
}

/// Writes log bytes to stdout; `false` once the reader went away.
fn emit(data: &[u8]) -> anyhow::Result<bool> {
    use std::io::Write as _;
    if data.is_empty() {
        return Ok(true);
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(data).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// stderr's lines, each marked `[stderr] ` (chunks need not end at a line).
#[derive(Default)]
struct Marked {
    partial: Vec<u8>,
}

impl Marked {
    const MARK: &[u8] = b"[stderr] ";

    /// The complete lines so far, marked; the rest waits for its newline.
    fn push(&mut self, data: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(data);
        let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        let rest = self.partial.split_off(last + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        let mut out = Vec::with_capacity(lines.len() + 16);
        for line in lines.split_inclusive(|&b| b == b'\n') {
            out.extend_from_slice(Self::MARK);
            out.extend_from_slice(line);
        }
        out
    }

    /// A last line without its newline, marked and ended.
    fn finish(&mut self) -> Vec<u8> {
        if self.partial.is_empty() {
            return Vec::new();
        }
        let mut out = Self::MARK.to_vec();
        out.append(&mut self.partial);
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_lines_are_marked_even_when_chunks_split_them() {
        let mut m = Marked::default();
        let mut all = m.push(b"fir");
        all.extend(m.push(b"st\nsec"));
        all.extend(m.push(b"ond\nthird\nla"));
        all.extend(m.finish());
        assert_eq!(String::from_utf8(all).unwrap(), "[stderr] first\n[stderr] second\n[stderr] third\n[stderr] la\n");
        assert!(m.finish().is_empty());
    }
}
