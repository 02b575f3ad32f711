//! What the agent's integration tests share: an agent configured against
//! one fake leader, on a temporary work dir.

use std::path::Path;
use std::time::Duration;

use muster_agent::agent::{AgentConfig, proc_sampler};
use muster_agent::watchdog::WatchdogConfig;
use muster_proto::v1;

/// Node `n1`, no GPUs, reaching the one scheduler at `addr`, with a short
/// reconnect backoff.
pub fn config(addr: String, work_dir: &Path, fence: bool) -> AgentConfig {
    AgentConfig {
        node_id: "n1".into(),
        schedulers: vec![addr],
        resources: v1::Resources { gpus: 0, vram_mb: 0, mem_mb: 1_000, cpus: 1 },
        labels: Default::default(),
        address: "n1".into(),
        ports: Default::default(),
        work_dir: work_dir.to_path_buf(),
        backoff: (Duration::from_millis(50), Duration::from_millis(100)),
        watchdog: WatchdogConfig::default(),
        sampler: proc_sampler,
        exit_when_stopped: false,
        task_shim: None,
        tls: None,
        clock: Default::default(),
        janitor: Default::default(),
        fence,
        forget_leftovers: false,
        disk_fault_file: None,
        start_without_record: false,
        checkpoint_listen: None,
        checkpoint_address: String::new(),
        isolation: None,
        run_as: muster_agent::users::RunAs::agent(),
        exe: None,
        images: None,
        executor: None,
    }
}
