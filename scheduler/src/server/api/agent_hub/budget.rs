//! What one node's agent may cost the log: a budget per node id, kept
//! across its streams (a reconnect does not refill it).
//!
//! Every command an agent's message turns into is one or more log entries
//! every replica stores and applies. Valid messages alone could flood the
//! log: checkpoint manifests for the agent's own running tasks, claims
//! repeated for a task already claimed (refused by apply, but only once in
//! the log), a `Register` on every reconnect. So each node has three token
//! buckets, refilled on the replica's monotonic clock:
//!
//! ```text
//!   commands  every command              burst 4,096   refill 2,048 / s
//!   heavy     Register, checkpoint        burst   256   refill    64 / s
//!             manifests, unusable
//!             checkpoints, start failures
//!   bytes     their encoded size          burst 4 MiB   refill 1 MiB / s
//! ```
//!
//! A message over budget is not refused: its session waits until the node
//! can afford it, then proposes it. Nothing an honest agent sends is lost
//! (its exit report still follows its checkpoint, in order), and an agent
//! that floods only slows its own stream: HTTP/2 flow control pushes back on
//! its sends. The figures are far above what a real node sends (a node
//! running 8 ranks that each checkpoint and exit sends 16 commands of under
//! a kilobyte each) and above the busiest benchmark's per-node rate.
//!
//! Metric: `muster_agent_throttled_total` (counter), agent messages that
//! waited for their node's budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_clock::SharedClock;

use crate::sm::{Command, NodeId};

/// A token bucket over the monotonic clock, in milli-tokens so that slow
/// refills keep their fractions.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens (×1000); below zero when a take overdrew it.
    milli: i128,
    /// Most tokens.
    burst: u64,
    /// Tokens per second.
    rate: u64,
    /// When it was last refilled (ms, monotonic).
    at_ms: u64,
}

impl Bucket {
    fn new(burst: u64, rate: u64, now_ms: u64) -> Bucket {
        Bucket { milli: i128::from(burst) * 1000, burst, rate, at_ms: now_ms }
    }

    /// Takes `cost` tokens (overdrawing if need be) and returns how long
    /// the taker must wait until the bucket is back at zero.
    fn take(&mut self, cost: u64, now_ms: u64) -> Duration {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.at_ms = self.at_ms.max(now_ms);
        let cap = i128::from(self.burst) * 1000;
        self.milli = (self.milli + i128::from(elapsed) * i128::from(self.rate)).min(cap);
        self.milli -= i128::from(cost) * 1000;
        if self.milli >= 0 {
            return Duration::ZERO;
        }
        // milli-tokens / (tokens per second) = milliseconds.
        let owed = u64::try_from(-self.milli).unwrap_or(u64::MAX);
        Duration::from_millis(owed.div_ceil(self.rate.max(1)))
    }
}

/// A node's three buckets.
#[derive(Clone, Copy, Debug)]
struct NodeBudget {
    commands: Bucket,
    heavy: Bucket,
    bytes: Bucket,
}

/// The limits every node gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Commands of any kind: burst, then per second.
    pub commands: (u64, u64),
    /// Heavy commands (registrations, checkpoint manifests and drops,
    /// start failures): burst, then per second.
    pub heavy: (u64, u64),
    /// Encoded bytes of all commands: burst, then per second.
    pub bytes: (u64, u64),
}

impl Default for BudgetLimits {
    fn default() -> Self {
        BudgetLimits { commands: (4096, 2048), heavy: (256, 64), bytes: (4 << 20, 1 << 20) }
    }
}

/// Whether a command counts against the heavy budget: what an agent can
/// send as often as it likes with a valid certificate, each time carrying
/// up to a kilobyte or more.
pub fn is_heavy(cmd: &Command) -> bool {
    if let Command::Accounted { report, .. } = cmd {
        return is_heavy(report);
    }
    matches!(
        cmd,
        Command::RegisterNode { .. }
            | Command::SaveCheckpoint { .. }
            | Command::SaveExitCheckpoint { .. }
            | Command::DropCheckpoint { .. }
            | Command::FailTaskToStart { .. }
            | Command::FailImagePull { .. }
            | Command::FailTaskWithTail { .. }
            | Command::SetNodeImages { .. }
    )
}

/// Every node's budget on this replica.
#[derive(Clone)]
pub struct AgentBudgets {
    clock: SharedClock,
    limits: BudgetLimits,
    nodes: Arc<Mutex<BTreeMap<NodeId, NodeBudget>>>,
}

impl AgentBudgets {
    /// Budgets with these limits, timed by `clock`'s monotonic reading.
    pub fn new(clock: SharedClock, limits: BudgetLimits) -> AgentBudgets {
        AgentBudgets { clock, limits, nodes: Arc::default() }
    }

    /// Charges `cmd` to `node`'s budget and returns how long to wait before
    /// proposing it (zero while the node is within its budget).
    pub fn charge(&self, node: &NodeId, cmd: &Command) -> Duration {
        let now = self.clock.mono_ms();
        let l = self.limits;
        let mut nodes = self.nodes.lock().expect("budget lock");
        let b = nodes.entry(node.clone()).or_insert_with(|| NodeBudget {
            commands: Bucket::new(l.commands.0, l.commands.1, now),
            heavy: Bucket::new(l.heavy.0, l.heavy.1, now),
            bytes: Bucket::new(l.bytes.0, l.bytes.1, now),
        });
        let mut wait = b.commands.take(1, now).max(b.bytes.take(cmd.encoded_len() as u64, now));
        if is_heavy(cmd) {
            wait = wait.max(b.heavy.take(1, now));
        }
        wait
    }

    /// Charges `cmd` and waits out whatever it owes.
    pub async fn pay(&self, node: &NodeId, cmd: &Command) {
        let wait = self.charge(node, cmd);
        if !wait.is_zero() {
            metrics::counter!("muster_agent_throttled_total").increment(1);
            tracing::debug!(node = %node, command = cmd.name(), wait_ms = wait.as_millis() as u64, "agent over its budget; waiting");
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_clock::ManualClock;

    fn drop_cmd(reason_bytes: usize) -> Command {
        Command::DropCheckpoint {
            alloc: 1,
            task: 0,
            node: NodeId::new("n"),
            epoch: 1,
            seq: 1,
            reason: "r".repeat(reason_bytes),
        }
    }

    #[test]
    fn a_bucket_waits_what_it_owes_and_refills_with_time() {
        let mut b = Bucket::new(2, 4, 0);
        assert_eq!(b.take(1, 0), Duration::ZERO);
        assert_eq!(b.take(1, 0), Duration::ZERO);
        assert_eq!(b.take(1, 0), Duration::from_millis(250), "one token owed at 4/s");
        assert_eq!(b.take(1, 0), Duration::from_millis(500));
        // 500 ms later it is back at zero: the next token costs 250 ms more.
        assert_eq!(b.take(1, 500), Duration::from_millis(250));
        // A long quiet spell refills only up to the burst.
        assert_eq!(b.take(2, 60_000), Duration::ZERO);
        assert_eq!(b.take(1, 60_000), Duration::from_millis(250));
    }

    /// Heavy commands run out long before light ones, bytes by size, and a
    /// budget belongs to the node: a second stream of it shares it, while
    /// another node has its own.
    #[tokio::test(start_paused = true)]
    async fn heavy_commands_and_bytes_have_their_own_budgets_per_node() {
        let clock = ManualClock::new(0);
        let limits = BudgetLimits { commands: (100, 100), heavy: (3, 1), bytes: (10_000, 1_000) };
        let budgets = AgentBudgets::new(SharedClock::new(clock.clone()), limits);
        let (a, b) = (NodeId::new("a"), NodeId::new("b"));
        let light = Command::StartTask { alloc: 1, task: 0, node: a.clone(), epoch: 1 };
        assert!(!is_heavy(&light) && is_heavy(&drop_cmd(1)));
        for _ in 0..3 {
            assert_eq!(budgets.charge(&a, &drop_cmd(1)), Duration::ZERO);
        }
        assert_eq!(budgets.charge(&a, &drop_cmd(1)), Duration::from_secs(1), "the fourth heavy one waits");
        assert_eq!(budgets.charge(&a, &light), Duration::ZERO, "light commands are not held up by the heavy budget");
        assert_eq!(budgets.charge(&b, &drop_cmd(1)), Duration::ZERO, "another node has its own");
        let big = drop_cmd(6_000);
        assert_eq!(budgets.charge(&b, &big), Duration::ZERO);
        let owed = budgets.charge(&b, &big);
        assert!(owed >= Duration::from_secs(2), "{owed:?}: the bytes budget owes for the second 6 kB");
        clock.advance(10_000);
        assert_eq!(budgets.charge(&a, &drop_cmd(1)), Duration::ZERO, "refilled with time");
    }
}
