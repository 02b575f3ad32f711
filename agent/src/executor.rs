//! The executor: runs each task attempt as a child process in its own
//! process group, with the task's environment and per-attempt log files, and
//! stops it with SIGTERM → grace → SIGKILL to the whole group.
//!
//! ```text
//!   spawn(spec) ──▶ setpgid(0,0) child ── stdout/stderr ──▶ logs/alloc-A/task-T/attempt-N.{out,err}
//!        │
//!        ├── wait() ──▶ Exit { code | signal }   (then SIGKILL the group: no orphans)
//!        └── stop(grace): SIGTERM group ─ grace ─▶ SIGKILL group
//! ```
//!
//! A child that traps SIGTERM, or a grandchild that outlives its parent,
//! still dies: signals go to the process group, not the one pid.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use thiserror::Error;
use tokio::process::{Child, Command};

/// Everything needed to start one attempt of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLaunch {
    /// The allocation.
    pub alloc: u64,
    /// The task's index in its gang.
    pub task: u32,
    /// The gang's size.
    pub gang_size: u32,
    /// The reservation epoch the attempt runs under.
    pub epoch: u64,
    /// The attempt number (1 for the first).
    pub attempt: u32,
    /// argv.
    pub command: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The addresses of the gang's nodes, in task order.
    pub peers: Vec<String>,
    /// The GPU indices this task may use (`CUDA_VISIBLE_DEVICES`).
    pub gpu_ids: Vec<u32>,
    /// Where the task may leave a checkpoint when preempted
    /// (`MUSTER_CHECKPOINT_DIR`; restored there before a resumed attempt).
    pub checkpoint_dir: PathBuf,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The process exited with this code.
    Code(i32),
    /// The process was killed by this signal.
    Signal(i32),
}

impl Exit {
    /// Whether the attempt succeeded.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

/// Why a task could not be started.
#[derive(Debug, Error)]
pub enum SpawnError {
    /// The command is empty.
    #[error("the command is empty")]
    EmptyCommand,
    /// The log directory or files could not be created.
    #[error("cannot create log files in {path}: {source}")]
    Logs {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The program could not be executed.
    #[error("cannot start {program:?}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The error.
        source: io::Error,
    },
}

/// Where an attempt's output goes: `DIR/logs/alloc-A/task-T/attempt-N.{out,err}`.
pub fn log_paths(work_dir: &Path, alloc: u64, task: u32, attempt: u32) -> (PathBuf, PathBuf) {
    let dir = work_dir.join("logs").join(format!("alloc-{alloc}")).join(format!("task-{task}"));
    (dir.join(format!("attempt-{attempt}.out")), dir.join(format!("attempt-{attempt}.err")))
}

/// A running attempt.
pub struct RunningTask {
    child: Child,
    pgid: i32,
    exited: Option<Exit>,
}

/// Sends `signal` to a process group.
pub fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg has no memory-safety preconditions; a group that is
    // already gone gives ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(sig)) => Exit::Signal(sig),
        (None, None) => Exit::Code(-1),
    }
}

/// Starts an attempt in its own process group, in `work_dir`.
pub fn spawn(launch: &TaskLaunch, work_dir: &Path) -> Result<RunningTask, SpawnError> {
    let program = launch.command.first().ok_or(SpawnError::EmptyCommand)?;
    let (out_path, err_path) = log_paths(work_dir, launch.alloc, launch.task, launch.attempt);
    let dir = out_path.parent().expect("log path has a parent").to_path_buf();
    let logs = |source| SpawnError::Logs { path: dir.clone(), source };
    fs::create_dir_all(&dir).map_err(logs)?;
    let stdout = File::create(&out_path).map_err(logs)?;
    let stderr = File::create(&err_path).map_err(logs)?;
    let mut cmd = Command::new(program);
    cmd.args(&launch.command[1..])
        .current_dir(work_dir)
        .envs(&launch.env)
        .env("MUSTER_ALLOC_ID", launch.alloc.to_string())
        .env("MUSTER_TASK_INDEX", launch.task.to_string())
        .env("MUSTER_GANG_SIZE", launch.gang_size.to_string())
        .env("MUSTER_GANG_PEERS", launch.peers.join(","))
        .env("MUSTER_ATTEMPT", launch.attempt.to_string())
        .env("MUSTER_EPOCH", launch.epoch.to_string())
        .env("MUSTER_CHECKPOINT_DIR", &launch.checkpoint_dir)
        .env("CUDA_VISIBLE_DEVICES", launch.gpu_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(false);
    let child = cmd.spawn().map_err(|source| SpawnError::Exec { program: program.clone(), source })?;
    let pgid = child.id().expect("a just-spawned child has a pid") as i32;
    Ok(RunningTask { child, pgid, exited: None })
}

impl RunningTask {
    /// The process group id (the leader's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Waits for the attempt to end; then kills whatever is left of its
    /// process group so nothing it started outlives it.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        let status = self.child.wait().await?;
        signal_group(self.pgid, libc::SIGKILL);
        let exit = exit_of(status);
        self.exited = Some(exit);
        Ok(exit)
    }

    /// Stops the attempt: SIGTERM to the group, up to `grace` to exit, then
    /// SIGKILL to the group. Returns how it ended.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<Exit> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        signal_group(self.pgid, libc::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                signal_group(self.pgid, libc::SIGKILL);
                let exit = exit_of(status?);
                self.exited = Some(exit);
                Ok(exit)
            }
            Err(_) => {
                signal_group(self.pgid, libc::SIGKILL);
                self.wait().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn launch(command: &[&str]) -> TaskLaunch {
        TaskLaunch {
            alloc: 7,
            task: 1,
            gang_size: 2,
            epoch: 3,
            attempt: 2,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: [("USER_VAR".to_string(), "x y".to_string())].into(),
            peers: vec!["n0:1".into(), "n1:1".into()],
            gpu_ids: vec![4, 5],
            checkpoint_dir: PathBuf::from("/tmp/ckpt"),
        }
    }

    /// Whether `pid` is a live process (a zombie waiting to be reaped by
    /// whoever adopted it counts as dead: it runs nothing).
    fn alive(pid: i32) -> bool {
        match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => false,
            Ok(stat) => {
                stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            }
        }
    }

    #[tokio::test]
    async fn a_task_sees_its_environment_and_its_output_lands_in_the_attempt_logs() {
        let dir = tempfile::tempdir().unwrap();
        let script = "echo $MUSTER_ALLOC_ID/$MUSTER_TASK_INDEX/$MUSTER_GANG_SIZE/$MUSTER_ATTEMPT/$MUSTER_EPOCH \
                      $MUSTER_GANG_PEERS $CUDA_VISIBLE_DEVICES \"$USER_VAR\" $MUSTER_CHECKPOINT_DIR; echo oops >&2; exit 3";
        let mut t = spawn(&launch(&["sh", "-c", script]), dir.path()).unwrap();
        assert_eq!(t.wait().await.unwrap(), Exit::Code(3));
        let (out, err) = log_paths(dir.path(), 7, 1, 2);
        assert_eq!(fs::read_to_string(out).unwrap(), "7/1/2/2/3 n0:1,n1:1 4,5 x y /tmp/ckpt\n");
        assert_eq!(fs::read_to_string(err).unwrap(), "oops\n");
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = spawn(&launch(&["/nonexistent/program"]), dir.path()).err().unwrap();
        assert!(err.to_string().contains("cannot start \"/nonexistent/program\""), "{err}");
        assert!(matches!(spawn(&launch(&[]), dir.path()), Err(SpawnError::EmptyCommand)));
    }

    #[tokio::test]
    async fn stop_ends_a_cooperative_task_with_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = spawn(&launch(&["sleep", "30"]), dir.path()).unwrap();
        let started = Instant::now();
        assert_eq!(t.stop(Duration::from_secs(10)).await.unwrap(), Exit::Signal(libc::SIGTERM));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// The seed's stubborn process: it traps TERM, and its grandchild keeps
    /// running; both die at the end of the grace.
    #[tokio::test]
    async fn stop_kills_a_term_trapping_group_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("trap '' TERM; sleep 30 & echo $! > {}; wait; wait", pidfile.display());
        let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pidfile.exists() || fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
            assert!(Instant::now() < deadline, "grandchild never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let grandchild: i32 = fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let started = Instant::now();
        let exit = t.stop(Duration::from_millis(300)).await.unwrap();
        assert_eq!(exit, Exit::Signal(libc::SIGKILL), "TERM was trapped, so KILL ended it");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(300) + Duration::from_secs(1),
            "{took:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) {
            assert!(Instant::now() < deadline, "grandchild {grandchild} survived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn leftovers_of_a_finished_task_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("bg.pid");
        let script = format!("sleep 30 & echo $! > {}", pidfile.display());
        let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path()).unwrap();
        assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
        let bg: i32 = fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(bg) {
            assert!(Instant::now() < deadline, "background process {bg} outlived its task");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
