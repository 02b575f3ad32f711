//! The agent streams this replica holds, and log requests waiting for an agent's answer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_proto::v1;
use muster_proto::v1::scheduler_message::Msg as Out;
use tokio::sync::mpsc;
use tonic::Status;

use crate::sm::NodeId;

/// What a stream sends its agent. Boxed: a channel allocates its slots 32 at
/// a time when created, and one per node agent at 208 bytes a message was
/// 6.5 KiB of every stream's idle memory.
pub(crate) type OutItem = Box<Result<v1::SchedulerMessage, Status>>;

/// The sending end of a stream to its agent.
pub(crate) type Outbound = mpsc::Sender<OutItem>;

/// The response stream of `Connect`: the channel's items, unboxed.
pub struct OutboundStream(pub(crate) mpsc::Receiver<OutItem>);

impl tokio_stream::Stream for OutboundStream {
    type Item = Result<v1::SchedulerMessage, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|item| item.map(|b| *b))
    }
}

/// The agent streams this replica holds, by node, and log requests waiting
/// for an agent's answer.
#[derive(Clone, Default)]
pub struct AgentRegistry {
    inner: Arc<Mutex<RegistryInner>>,
}

#[derive(Default)]
struct RegistryInner {
    streams: BTreeMap<NodeId, Outbound>,
    /// Log requests waiting, by request id: the node asked and the waiter.
    pending: BTreeMap<u64, (NodeId, tokio::sync::oneshot::Sender<v1::LogData>)>,
    next_request: u64,
    /// Each node's image pulls under way, as its latest heartbeat said.
    pulls: BTreeMap<NodeId, Vec<v1::ImagePull>>,
}

/// A fresh request id nobody can guess: a counter through SipHash under the
/// process's random keys (`RandomState` seeds them from the OS), so another
/// agent cannot aim a reply at someone's `alloc logs -f`.
fn unguessable_id(counter: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(counter);
    h.finish()
}

impl AgentRegistry {
    // `muster_agent_streams` moves by increments so that several replicas
    // in one process (`muster dev`) add up rather than overwrite.
    pub(crate) fn attach(&self, node: &NodeId, tx: &Outbound) {
        if self.inner.lock().expect("registry lock").streams.insert(node.clone(), tx.clone()).is_none() {
            metrics::gauge!("muster_agent_streams").increment(1.0);
        }
    }

    pub(crate) fn detach(&self, node: &NodeId, tx: &Outbound) {
        let mut inner = self.inner.lock().expect("registry lock");
        if inner.streams.get(node).is_some_and(|t| t.same_channel(tx)) {
            inner.streams.remove(node);
            inner.pulls.remove(node);
            metrics::gauge!("muster_agent_streams").decrement(1.0);
        }
    }

    /// What `node`'s heartbeat said of its image pulls (replacing what the
    /// one before said).
    pub(crate) fn set_pulls(&self, node: &NodeId, pulls: Vec<v1::ImagePull>) {
        let mut inner = self.inner.lock().expect("registry lock");
        if pulls.is_empty() {
            inner.pulls.remove(node);
        } else {
            inner.pulls.insert(node.clone(), pulls);
        }
    }

    /// The image pulls under way for allocation `alloc`'s tasks, with the
    /// node each is on. Only what the node a task is placed on says counts
    /// (`placed(task, node, epoch)`): another node cannot speak for it.
    pub fn pulls_of(&self, alloc: u64, placed: impl Fn(u32, &NodeId, u64) -> bool) -> Vec<(NodeId, v1::ImagePull)> {
        let inner = self.inner.lock().expect("registry lock");
        let mut out: Vec<(NodeId, v1::ImagePull)> = inner
            .pulls
            .iter()
            .flat_map(|(node, pulls)| pulls.iter().map(move |p| (node, p)))
            .filter(|(node, p)| {
                p.task.as_ref().is_some_and(|t| t.alloc_id == alloc && placed(t.task_index, node, t.epoch))
            })
            .map(|(node, p)| (node.clone(), p.clone()))
            .collect();
        out.sort_by_key(|(_, p)| p.task.as_ref().map(|t| t.task_index));
        out
    }

    /// Sends `msg` to `node`'s agent, if its stream is open here and has
    /// room (a full stream is not waited for).
    pub(crate) fn try_send(&self, node: &NodeId, msg: Out) -> bool {
        let stream = self.inner.lock().expect("registry lock").streams.get(node).cloned();
        stream.is_some_and(|s| s.try_send(Box::new(Ok(v1::SchedulerMessage { msg: Some(msg) }))).is_ok())
    }

    /// Agent streams held open.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("registry lock").streams.len()
    }

    /// Whether no agent stream is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An agent's reply to a log request. Only the node the request was
    /// sent to may answer it; a reply from any other stream is dropped (and
    /// the request keeps waiting for its own node).
    pub(crate) fn answer(&self, from: &NodeId, data: v1::LogData) -> bool {
        let mut inner = self.inner.lock().expect("registry lock");
        match inner.pending.get(&data.request_id) {
            Some((asked, _)) if asked == from => {
                let (_, waiter) = inner.pending.remove(&data.request_id).expect("just found");
                let _ = waiter.send(data);
                true
            }
            _ => false,
        }
    }

    /// Asks `node`'s agent for part of a log file.
    pub async fn fetch_logs(&self, node: &NodeId, mut req: v1::FetchLogs) -> Result<v1::LogData, Status> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stream = {
            let mut inner = self.inner.lock().expect("registry lock");
            let stream = inner
                .streams
                .get(node)
                .cloned()
                .ok_or_else(|| Status::unavailable(format!("node {node} has no agent connected to the leader")))?;
            inner.next_request += 1;
            req.request_id = unguessable_id(inner.next_request);
            while inner.pending.contains_key(&req.request_id) {
                inner.next_request += 1;
                req.request_id = unguessable_id(inner.next_request);
            }
            inner.pending.insert(req.request_id, (node.clone(), tx));
            stream
        };
        let id = req.request_id;
        stream
            .send(Box::new(Ok(v1::SchedulerMessage { msg: Some(Out::FetchLogs(req)) })))
            .await
            .map_err(|_| Status::unavailable(format!("node {node}'s agent stream closed")))?;
        match tokio::time::timeout(Duration::from_secs(10), rx).await {
            Ok(Ok(data)) => Ok(data),
            _ => {
                self.inner.lock().expect("registry lock").pending.remove(&id);
                Err(Status::deadline_exceeded(format!("node {node}'s agent did not answer for the logs")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22, item 7: a log reply is taken only from the node the request
    /// went to, and request ids cannot be guessed from earlier ones.
    #[tokio::test]
    async fn a_log_reply_counts_only_from_the_node_asked() {
        let registry = AgentRegistry::default();
        let (a, b) = (NodeId::new("node-a"), NodeId::new("node-b"));
        let (tx_a, mut rx_a) = mpsc::channel(4);
        let (tx_b, _rx_b) = mpsc::channel(4);
        registry.attach(&a, &tx_a);
        registry.attach(&b, &tx_b);
        let asking = registry.clone();
        let fetch =
            tokio::spawn(async move { asking.fetch_logs(&NodeId::new("node-a"), v1::FetchLogs::default()).await });
        let Some(Ok(v1::SchedulerMessage { msg: Some(Out::FetchLogs(req)) })) = rx_a.recv().await.map(|b| *b) else {
            panic!("node-a was asked")
        };
        let forged =
            v1::LogData { request_id: req.request_id, data: b"injected".to_vec(), eof: true, ..Default::default() };
        assert!(!registry.answer(&b, forged), "node-b cannot answer node-a's request");
        let real = v1::LogData { request_id: req.request_id, data: b"real".to_vec(), ..Default::default() };
        assert!(registry.answer(&a, real));
        assert_eq!(fetch.await.unwrap().unwrap().data, b"real");

        let ids: std::collections::BTreeSet<u64> = (1..=64).map(unguessable_id).collect();
        assert_eq!(ids.len(), 64);
        let sequential = (1..=64u64).filter(|&n| ids.contains(&n) || ids.contains(&(req.request_id + n))).count();
        assert_eq!(sequential, 0, "ids are not a counter");
    }

    /// Pull progress counts only from the node the task is placed on: a
    /// node cannot report (or hide) a pull for another node's task, and a
    /// node's report replaces its last one.
    #[test]
    fn pull_progress_counts_only_from_the_tasks_own_node() {
        let registry = AgentRegistry::default();
        let (a, b) = (NodeId::new("node-a"), NodeId::new("node-b"));
        let pull = |task: u32, done: u64| v1::ImagePull {
            task: Some(v1::TaskRef { alloc_id: 7, task_index: task, epoch: 1 }),
            image: "r/i@sha256:x".into(),
            done_bytes: done,
            total_bytes: 100,
            elapsed_ms: 5,
        };
        registry.set_pulls(&a, vec![pull(0, 10)]);
        // node-b claims task 0 (placed on node-a) and its own task 1.
        registry.set_pulls(&b, vec![pull(0, 99), pull(1, 20)]);
        let on = |task: u32, node: &NodeId, epoch: u64| {
            epoch == 1 && node.as_str() == if task == 0 { "node-a" } else { "node-b" }
        };
        let got: Vec<(String, u32, u64)> = registry
            .pulls_of(7, on)
            .into_iter()
            .map(|(n, p)| (n.to_string(), p.task.unwrap().task_index, p.done_bytes))
            .collect();
        assert_eq!(got, vec![("node-a".into(), 0, 10), ("node-b".into(), 1, 20)]);
        assert!(registry.pulls_of(8, on).is_empty(), "another allocation");
        registry.set_pulls(&a, Vec::new());
        assert_eq!(registry.pulls_of(7, on).len(), 1, "node-a's pull ended");
    }
}
