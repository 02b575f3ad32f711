//! The driver's user-space side inside images: on a node with
//! `nvidia-container-cli` (libnvidia-container, what enroot and the NVIDIA
//! container toolkit use), a task holding GPUs gets the driver's libraries
//! and tools mounted into its image's root before it starts, for its GPUs
//! only. The device files themselves are bound by the runtime and kept to
//! the task's own by its devices cgroup, so the tool is run with
//! `--no-cgroups --no-devbind`.
//!
//! ```text
//!   the container's root mounted (overlay, /dev, binds), before pivot_root / runc:
//!   nvidia-container-cli --load-kmods configure --no-cgroups --no-devbind
//!       --compute --utility --device=0,1 --pid=PID ROOT
//!   (PID: a process in the mount namespace that holds ROOT, as the host sees it)
//! ```

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The tool's name, looked up on `PATH` when the agent starts.
pub const NVIDIA_CLI: &str = "nvidia-container-cli";

/// The node's `nvidia-container-cli`, if it has one.
pub fn find() -> Option<PathBuf> {
    crate::executor::find_on_path(NVIDIA_CLI).ok()
}

/// What a container plan says of the tool: run it for these GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaHook {
    /// The tool.
    pub program: PathBuf,
    /// The task's GPU indices.
    pub gpus: Vec<u32>,
}

impl NvidiaHook {
    /// Its command line for the root at `root`, in the mount namespace of
    /// process `pid`.
    pub fn argv(&self, pid: u32, root: &Path) -> Vec<OsString> {
        let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        let mut argv: Vec<OsString> = vec![self.program.clone().into()];
        argv.extend(
            [
                "--load-kmods".to_string(),
                "configure".into(),
                "--no-cgroups".into(),
                "--no-devbind".into(),
                "--compute".into(),
                "--utility".into(),
                format!("--device={}", gpus.join(",")),
                format!("--pid={pid}"),
            ]
            .map(OsString::from),
        );
        argv.push(root.as_os_str().to_owned());
        argv
    }

    /// Runs it, and waits; an error names how it ended and the last line
    /// it wrote.
    pub fn run(&self, pid: u32, root: &Path) -> io::Result<()> {
        let argv = self.argv(pid, root);
        let out = std::process::Command::new(&argv[0]).args(&argv[1..]).stdin(std::process::Stdio::null()).output()?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        Err(io::Error::other(format!("{NVIDIA_CLI} ended with {}: {last}", out.status)))
    }
}

/// This process's pid as the host's `/proc` names it (inside a new PID
/// namespace `getpid` says 1; the host's procfs, still mounted, does not).
pub fn host_pid() -> io::Result<u32> {
    let link = std::fs::read_link("/proc/self")?;
    link.to_string_lossy().parse().map_err(|_| io::Error::other(format!("/proc/self is {}", link.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_configures_only_the_tasks_gpus_leaving_devices_and_cgroups_to_the_runtime() {
        let hook = NvidiaHook { program: "/usr/bin/nvidia-container-cli".into(), gpus: vec![1, 3] };
        let argv: Vec<String> =
            hook.argv(4242, Path::new("/w/containers/1-0-1/root")).iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(
            argv,
            [
                "/usr/bin/nvidia-container-cli",
                "--load-kmods",
                "configure",
                "--no-cgroups",
                "--no-devbind",
                "--compute",
                "--utility",
                "--device=1,3",
                "--pid=4242",
                "/w/containers/1-0-1/root"
            ]
        );
        assert_eq!(host_pid().unwrap(), std::process::id(), "outside a new PID namespace, the same");
        let failing = NvidiaHook { program: "/bin/false".into(), gpus: vec![0] };
        let e = failing.run(1, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("nvidia-container-cli ended with exit status: 1"), "{e}");
    }
}
