//! The standard launcher environment of a task: what PyTorch (plain or
//! torchrun), DeepSpeed, JAX, Lightning and MPI-style launchers read to find
//! their rank and their rendezvous, so a gang starts without a wrapper.
//!
//! ```text
//!   Assign{task, gang_size, peers, ports, gpus}
//!     ──▶ WORLD_SIZE RANK NODE_RANK GROUP_RANK LOCAL_RANK LOCAL_WORLD_SIZE
//!         MASTER_ADDR (task 0's host) MASTER_PORT (the gang's first port)
//!         PET_* (torchrun's options)  JAX_COORDINATOR_ADDRESS
//!         MUSTER_PORTS  MUSTER_HOSTFILE (one "host slots=N" line per task)
//! ```
//!
//! Each task of a gang runs on a node of its own, so a task is one "node"
//! to these frameworks: `NODE_RANK` = `RANK` = the task index, and one
//! local process (`LOCAL_RANK` 0). torchrun, given the `PET_*` variables,
//! starts one worker per GPU itself (`PET_NPROC_PER_NODE`). The user's own
//! `--env` wins over every variable set here; `MUSTER_*` are the agent's.

use std::path::Path;

use crate::executor::TaskLaunch;

/// The host part of a peer address: `host:port`, `[v6]:port` or a bare
/// host (a node id, when its agent advertises no address).
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(h, _)| h);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    }
}

/// The hostfile: one `host slots=N` line per task, in task order (the form
/// Open MPI's `--hostfile` and DeepSpeed's launcher read); N is the GPUs a
/// task holds, at least 1.
pub fn hostfile(peers: &[String], gpus: usize) -> String {
    let slots = gpus.max(1);
    peers.iter().map(|p| format!("{} slots={slots}\n", host_of(p))).collect()
}

/// The launcher variables of `launch`, whose hostfile is at `hostfile`.
pub fn launcher_env(launch: &TaskLaunch, hostfile: &Path) -> Vec<(String, String)> {
    let size = launch.gang_size.to_string();
    let rank = launch.task.to_string();
    let master = launch.peers.first().map(|p| host_of(p).to_string()).unwrap_or_default();
    let per_node = launch.gpu_ids.len().max(1).to_string();
    let mut env = vec![
        ("WORLD_SIZE", size.clone()),
        ("RANK", rank.clone()),
        ("NODE_RANK", rank.clone()),
        ("GROUP_RANK", rank.clone()),
        ("LOCAL_RANK", "0".to_string()),
        ("LOCAL_WORLD_SIZE", "1".to_string()),
        ("MASTER_ADDR", master.clone()),
        ("PET_NNODES", size),
        ("PET_NODE_RANK", rank),
        ("PET_NPROC_PER_NODE", per_node),
        ("PET_MASTER_ADDR", master.clone()),
        ("MUSTER_HOSTFILE", hostfile.display().to_string()),
        ("MUSTER_PORTS", launch.ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")),
    ];
    if let Some(port) = launch.ports.first() {
        env.push(("MASTER_PORT", port.to_string()));
        env.push(("PET_MASTER_PORT", port.to_string()));
        env.push(("JAX_COORDINATOR_ADDRESS", format!("{}:{port}", bracketed(&master))));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// An IPv6 host in brackets, so `host:port` parses.
fn bracketed(host: &str) -> String {
    if host.contains(':') { format!("[{host}]") } else { host.to_string() }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn hosts_are_taken_from_every_address_form() {
        assert_eq!(host_of("10.0.0.7:7000"), "10.0.0.7");
        assert_eq!(host_of("gpu-01.example.org:7000"), "gpu-01.example.org");
        assert_eq!(host_of("[fd00::7]:7000"), "fd00::7");
        assert_eq!(host_of("node-3"), "node-3");
        assert_eq!(host_of("fd00::7"), "fd00::7");
        assert_eq!(hostfile(&["a:1".into(), "b:2".into()], 0), "a slots=1\nb slots=1\n");
        assert_eq!(hostfile(&["a:1".into()], 8), "a slots=8\n");
    }

    #[test]
    fn a_gang_task_gets_its_rank_and_task_0s_rendezvous() {
        let launch = TaskLaunch {
            alloc: 1,
            task: 2,
            gang_size: 4,
            epoch: 1,
            attempt: 1,
            command: vec!["python".into()],
            env: BTreeMap::new(),
            peers: vec!["[fd00::1]:9".into(), "h1:9".into(), "h2:9".into(), "h3:9".into()],
            gpu_ids: vec![0, 1],
            checkpoint_dir: PathBuf::from("/c"),
            user: None,
            ports: vec![29500, 29501],
            container: None,
        };
        let env: BTreeMap<String, String> = launcher_env(&launch, Path::new("/w/hosts")).into_iter().collect();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("RANK"), Some("2"));
        assert_eq!(get("NODE_RANK"), Some("2"));
        assert_eq!(get("LOCAL_RANK"), Some("0"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("1"));
        assert_eq!(get("MASTER_ADDR"), Some("fd00::1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
        assert_eq!(get("MUSTER_PORTS"), Some("29500,29501"));
        assert_eq!(get("PET_NNODES"), Some("4"));
        assert_eq!(get("PET_NPROC_PER_NODE"), Some("2"));
        assert_eq!(get("JAX_COORDINATOR_ADDRESS"), Some("[fd00::1]:29500"));
        assert_eq!(get("MUSTER_HOSTFILE"), Some("/w/hosts"));
        // No reserved port: no MASTER_PORT to guess.
        let none = TaskLaunch { ports: vec![], ..launch };
        assert!(!launcher_env(&none, Path::new("/h")).iter().any(|(k, _)| k == "MASTER_PORT"));
    }
}
