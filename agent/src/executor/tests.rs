//! The executor's tests: real processes, and this machine's real cgroups.

use std::time::Instant;

use super::*;
use muster_testkit::{WAIT, eventually};

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
        ports: vec![29500],
        gpu_ids: vec![4, 5],
        checkpoint_dir: PathBuf::from("/tmp/ckpt"),
        user: None,
        container: None,
    }
}

#[tokio::test]
async fn a_task_sees_its_environment_and_its_output_lands_in_the_attempt_logs() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo $MUSTER_ALLOC_ID/$MUSTER_TASK_INDEX/$MUSTER_GANG_SIZE/$MUSTER_ATTEMPT/$MUSTER_EPOCH \
                  $MUSTER_GANG_PEERS $CUDA_VISIBLE_DEVICES \"$USER_VAR\" $MUSTER_CHECKPOINT_DIR; echo oops >&2; exit 3";
    let mut t = spawn(&launch(&["sh", "-c", script]), dir.path(), Muster::NONE, None).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(3));
    let (out, err) = log_paths(dir.path(), 7, 1, 2);
    assert_eq!(fs::read_to_string(out).unwrap(), "7/1/2/2/3 n0:1,n1:1 4,5 x y /tmp/ckpt\n");
    assert_eq!(fs::read_to_string(err).unwrap(), "oops\n");
}

#[tokio::test]
async fn a_task_starts_with_the_launcher_environment_and_the_users_env_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(&[
        "sh",
        "-c",
        "echo $RANK/$WORLD_SIZE/$MASTER_ADDR:$MASTER_PORT/$LOCAL_RANK $USER_VAR; cat $MUSTER_HOSTFILE",
    ]);
    l.env.insert("MASTER_PORT".into(), "1234".into());
    let mut t = spawn(&l, dir.path(), Muster::NONE, None).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let (out, _) = log_paths(dir.path(), 7, 1, 2);
    assert_eq!(fs::read_to_string(out).unwrap(), "1/2/n0:1234/0 x y\nn0 slots=2\nn1 slots=2\n");
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = spawn(&launch(&["/nonexistent/program"]), dir.path(), Muster::NONE, None).err().unwrap();
    assert!(err.to_string().contains("cannot start \"/nonexistent/program\""), "{err}");
    assert!(matches!(spawn(&launch(&[]), dir.path(), Muster::NONE, None), Err(SpawnError::EmptyCommand)));
}

#[tokio::test]
async fn stop_ends_a_cooperative_task_with_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = spawn(&launch(&["sleep", "30"]), dir.path(), Muster::NONE, None).unwrap();
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
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, None).unwrap();
    let grandchild = wait_for_pid(&pidfile).await;
    let started = Instant::now();
    let exit = t.stop(Duration::from_millis(300)).await.unwrap();
    assert_eq!(exit, Exit::Signal(libc::SIGKILL), "TERM was trapped, so KILL ended it");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(300) + Duration::from_secs(1),
        "{took:?}"
    );
    eventually(&format!("grandchild {grandchild} to die"), WAIT, || (!alive(grandchild)).then_some(())).await;
}

#[tokio::test]
async fn leftovers_of_a_finished_task_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("bg.pid");
    let script = format!("sleep 30 & echo $! > {}", pidfile.display());
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, None).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let bg: i32 = fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    eventually(&format!("background process {bg} to die with its task"), WAIT, || (!alive(bg)).then_some(())).await;
}

/// Real cgroups of this machine (root, v1 here; v2 elsewhere), in a
/// subtree of the test's own.
fn isolation(dir: &Path, gpu_devices: Vec<crate::cgroup::GpuDevice>, pids: u64) -> crate::cgroup::Isolation {
    let opts = crate::cgroup::Options {
        root: None,
        name: crate::cgroup::default_name("executor-test", dir),
        gpu_devices,
        pids_default: pids,
    };
    crate::cgroup::Isolation::detect(&opts).unwrap_or_else(|e| panic!("these tests need this machine's cgroups: {e}"))
}

async fn wait_for_pid(path: &Path) -> i32 {
    eventually(&format!("{} to be written", path.display()), WAIT, || {
        fs::read_to_string(path).ok().and_then(|t| t.trim().parse().ok())
    })
    .await
}

/// A task started as an unprivileged account (by the child that joined
/// its cgroup as root) is that account through and
/// through: it cannot read a directory that is not its own, nor signal
/// a process of another user; it can read its hostfile and write its
/// progress file, and its logs are the agent's alone.
#[tokio::test]
async fn a_task_runs_as_its_account_and_reaches_only_what_it_is_given() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
    let private = dir.path().join("private");
    fs::create_dir(&private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(private.join("secret"), "s3cret").unwrap();
    let mut other = std::process::Command::new("sleep").arg("300").spawn().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let cg = iso.create((7, 1, 9), &crate::cgroup::Limits::default()).unwrap();
    let script = format!(
        "id -u; id -g; id -G; cat {}/secret && echo READ; kill -0 {} && echo SIGNALLED; \
         grep -q slots= \"$MUSTER_HOSTFILE\" && echo HOSTS; echo 1 > \"$MUSTER_PROGRESS_FILE\" && echo BEAT; \
         grep -q muster/ /proc/self/cgroup && echo JOINED",
        private.display(),
        other.id()
    );
    let mut l = launch(&["sh", "-c", &script]);
    l.env.insert(
        "MUSTER_PROGRESS_FILE".into(),
        crate::watchdog::progress_path(dir.path(), l.alloc, l.task, l.attempt).display().to_string(),
    );
    l.user = Some(crate::users::TaskUser { name: "t".into(), uid: 60101, gid: 60102, groups: vec![60102, 60103] });
    let mut t = spawn(&l, dir.path(), Muster::NONE, Some(cg)).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    other.kill().unwrap();
    let _ = other.wait();
    let (out, err) = log_paths(dir.path(), l.alloc, l.task, l.attempt);
    let text = fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..3], ["60101", "60102", "60102 60103"], "{text}");
    assert!(!text.contains("READ") && !text.contains("SIGNALLED"), "{text}");
    assert!(text.contains("HOSTS") && text.contains("BEAT") && text.contains("JOINED"), "{text}");
    let stderr = fs::read_to_string(&err).unwrap();
    assert!(stderr.contains("Permission denied") && stderr.contains("not permitted"), "{stderr}");
    for log in [&out, &err] {
        let m = fs::metadata(log).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{} is the agent's", log.display());
    }
    iso.remove_if_empty();
}

/// A (root) task that makes a cgroup inside its own and moves a
/// process there: the stop finds and kills it too, and removes both.
#[tokio::test]
async fn a_process_in_a_cgroup_the_task_made_inside_its_own_dies_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let pid_file = dir.path().join("inner.pid");
    let script = format!(
        "p=$(awk -F: '$2 == \"freezer\" {{print $3}}' /proc/self/cgroup); mkdir /sys/fs/cgroup/freezer$p/inner; \
         sh -c 'echo $$ > /sys/fs/cgroup/freezer'$p'/inner/cgroup.procs; trap \"\" TERM; echo $$ > {}; exec sleep 300' & \
         sleep 300",
        pid_file.display()
    );
    let cg = iso.create((7, 2, 3), &crate::cgroup::Limits::default()).unwrap();
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    let inner = wait_for_pid(&pid_file).await;
    let freezer = cg.dirs().iter().find(|d| d.starts_with("/sys/fs/cgroup/freezer")).cloned().unwrap();
    eventually("the process to move into the inner cgroup", WAIT, || {
        fs::read_to_string(freezer.join("inner/cgroup.procs")).ok()?.contains(&inner.to_string()).then_some(())
    })
    .await;
    t.stop(Duration::from_millis(200)).await.unwrap();
    assert!(!alive(inner), "the inner cgroup's process outlived the stop");
    assert!(!freezer.join("inner").exists() && !cg.exists(), "both cgroups removed");
    iso.remove_if_empty();
}

/// A task whose children left its process group (`setsid`, and a
/// double fork) and ignore SIGTERM: a stop ends all of them, and
/// returns only once they are gone.
#[tokio::test]
async fn a_stop_kills_what_escaped_the_process_group_through_the_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let (setsid, daemon) = (dir.path().join("setsid.pid"), dir.path().join("daemon.pid"));
    let script = format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 1; done' & \
         ( ( trap '' TERM; sleep 300 & echo $! > {} ) & ); sleep 300",
        setsid.display(),
        daemon.display()
    );
    let cg = iso.create((7, 1, 3), &crate::cgroup::Limits::default()).unwrap();
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    let (a, b) = (wait_for_pid(&setsid).await, wait_for_pid(&daemon).await);
    assert!(alive(a) && alive(b));
    let pgid = t.pgid();
    assert_ne!(unsafe { libc::getpgid(a) }, pgid, "the setsid child left the group");
    assert_eq!(t.stop(Duration::from_millis(200)).await.unwrap(), Exit::Signal(libc::SIGTERM));
    assert!(!alive(a) && !alive(b), "escaped processes outlived the stop");
    assert!(!cg.exists(), "the attempt's cgroup is removed once empty");
    let used = t.usage().expect("usage read from the cgroup");
    assert!(used.cpu_ns > 0, "{used:?}");
    iso.remove_if_empty();
}

/// In a cgroup a task starts as it would without one: the command is
/// the process group's leader (the joining shell execs it), it is in
/// every hierarchy's cgroup, and a program that cannot run is a spawn
/// error, not a task that ran and failed.
#[tokio::test]
async fn a_task_in_a_cgroup_starts_as_itself_and_a_missing_program_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let cg = iso.create((13, 0, 1), &crate::cgroup::Limits::default()).unwrap();
    let script = "echo $$; cat /proc/$$/cgroup; tr '\\0' ' ' < /proc/$$/cmdline";
    let mut t = spawn(&launch(&["sh", "-c", script]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    let pgid = t.pgid();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let (out, _) = log_paths(dir.path(), 7, 1, 2);
    let out = fs::read_to_string(out).unwrap();
    assert!(out.starts_with(&format!("{pgid}\n")), "{out}");
    assert!(out.lines().last().unwrap().starts_with("sh -c echo"), "the command itself, not the joiner: {out}");
    let joined = out.lines().filter(|l| l.ends_with(&format!("/{}", cg.name()))).count();
    assert_eq!(joined, cg.dirs().len(), "in each hierarchy's cgroup: {out}");
    for program in ["/nonexistent/program", "no-such-program-anywhere"] {
        let cg = iso.create((13, 1, 1), &crate::cgroup::Limits::default()).unwrap();
        let err = spawn(&launch(&[program]), dir.path(), Muster::NONE, Some(cg.clone())).err().unwrap();
        assert!(err.to_string().contains(&format!("cannot start {program:?}: No such file")), "{err}");
        cg.remove();
    }
    iso.remove_if_empty();
}

/// A finished task's escaped daemon dies when the task ends.
#[tokio::test]
async fn a_daemon_left_by_a_finished_task_dies_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let pidfile = dir.path().join("d.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' & while [ ! -s {} ]; do sleep 0.01; done",
        pidfile.display(),
        pidfile.display()
    );
    let cg = iso.create((8, 0, 1), &crate::cgroup::Limits::default()).unwrap();
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, Some(cg)).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let d: i32 = fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(!alive(d), "the daemon {d} outlived its task");
    iso.remove_if_empty();
}

/// A task over its memory limit is killed by the kernel at the limit
/// (swap off), and says so; its neighbour runs on.
#[tokio::test]
async fn a_memory_hog_is_oom_killed_at_its_limit_and_its_neighbour_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let limits = crate::cgroup::Limits { mem_mb: 64, ..Default::default() };
    let hog = "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n";
    let cg = iso.create((9, 0, 1), &limits).unwrap();
    let mut neighbour =
        spawn(&launch(&["sleep", "300"]), dir.path(), Muster::NONE, Some(iso.create((9, 1, 1), &limits).unwrap()))
            .unwrap();
    let mut t = spawn(&launch(&["python3", "-c", hog]), dir.path(), Muster::NONE, Some(cg)).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Signal(libc::SIGKILL));
    let used = t.usage().unwrap();
    assert!(used.oom_kills >= 1, "{used:?}");
    assert_eq!(used.memory_limit_bytes, 64 << 20);
    assert!(used.peak_memory_bytes > 48 << 20 && used.peak_memory_bytes <= 64 << 20, "{used:?}");
    assert!(alive(neighbour.pgid()), "the neighbour was hurt");
    // The OOM kill counter cannot be reset: that cgroup is never reused,
    // and the next attempt would read the kill as its own.
    assert_eq!(iso.spares(), 0, "an OOM-killed attempt's cgroup was kept for reuse");
    neighbour.stop(Duration::from_secs(5)).await.unwrap();
    assert_eq!(iso.spares(), 1, "the neighbour's emptied cgroup is kept for reuse");
    iso.remove_if_empty();
    assert!(iso.roots().iter().all(|r| !r.exists()), "a clean shutdown leaves no spare behind");
}

/// A fork bomb (a loop that forks without end, each child living on)
/// stops at the pids limit; a stop still ends it, and the next task
/// starts.
#[tokio::test]
async fn a_fork_bomb_stops_at_the_pids_limit() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 32);
    let cg = iso.create((10, 0, 1), &crate::cgroup::Limits::default()).unwrap();
    let mut t =
        spawn(&launch(&["sh", "-c", "while :; do sleep 300 & done"]), dir.path(), Muster::NONE, Some(cg.clone()))
            .unwrap();
    let limit = cg.dirs().iter().find_map(|d| fs::read_to_string(d.join("pids.max")).ok()).unwrap();
    assert_eq!(limit.trim(), "32");
    let events = cg.dirs().iter().find_map(|d| fs::read_to_string(d.join("pids.events")).ok());
    // The bomb hits the limit: forks are refused (counted where the
    // kernel counts them), and it never holds more.
    eventually("the bomb to grow", WAIT, || (cg.pids().len() >= 20).then_some(())).await;
    assert!(cg.pids().len() <= 32);
    if events.is_some() {
        let refused = || {
            cg.dirs().iter().filter_map(|d| fs::read_to_string(d.join("pids.events")).ok()).any(|e| e.trim() != "max 0")
        };
        eventually("a fork to be refused", WAIT, || refused().then_some(())).await;
    }
    t.stop(Duration::from_millis(100)).await.unwrap();
    assert!(!cg.exists());
    let mut next =
        spawn(&launch(&["true"]), dir.path(), Muster::NONE, Some(iso.create((10, 1, 1), &Default::default()).unwrap()))
            .unwrap();
    assert_eq!(next.wait().await.unwrap(), Exit::Code(0));
    // A task's own limit (`submit --pids-max`) wins over the default.
    let own = iso.create((10, 2, 1), &crate::cgroup::Limits { pids: 8, ..Default::default() }).unwrap();
    let limit = own.dirs().iter().find_map(|d| fs::read_to_string(d.join("pids.max")).ok()).unwrap();
    assert_eq!(limit.trim(), "8");
    own.remove();
    iso.remove_if_empty();
}

/// Two processes spinning under a one-core quota get at most one core
/// between them (an upper bound: a loaded machine only gives less).
#[tokio::test]
async fn the_cpu_quota_holds_a_task_to_its_cores() {
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let cg = iso.create((11, 0, 1), &crate::cgroup::Limits { cpus: 1, ..Default::default() }).unwrap();
    let started = Instant::now();
    let mut t =
        spawn(&launch(&["sh", "-c", "while :; do :; done & while :; do :; done"]), dir.path(), Muster::NONE, Some(cg))
            .unwrap();
    // Until the two have used a second of CPU between them, which takes
    // at least a second of wall time under the quota.
    let cg = t.cgroup().unwrap().clone();
    eventually("a second of CPU", WAIT, || (cg.usage().cpu_ns >= 1_000_000_000).then_some(())).await;
    t.stop(Duration::from_millis(10)).await.unwrap();
    let wall = started.elapsed();
    let cpu = Duration::from_nanos(t.usage().unwrap().cpu_ns);
    assert!(cpu <= wall + Duration::from_millis(200), "{cpu:?} of CPU in {wall:?} of wall under a 1-core quota");
    assert!(cpu > Duration::ZERO);
    iso.remove_if_empty();
}

/// A task may open its own GPU's device and not another's: a character
/// device made with mknod stands in for /dev/nvidiaN. With no driver
/// behind it, the one allowed fails to open with ENXIO; the one refused,
/// with EPERM from the devices controller, before any driver is asked.
#[tokio::test]
async fn a_task_is_refused_the_gpu_devices_it_was_not_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let mut devices = Vec::new();
    for minor in 0..2u32 {
        let path = dir.path().join(format!("gpu{minor}"));
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mknod has no other preconditions.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(241, minor)) };
        assert_eq!(rc, 0, "mknod: {}", io::Error::last_os_error());
        devices.push(crate::cgroup::GpuDevice::of(&path).unwrap());
    }
    let iso = isolation(dir.path(), devices, 0);
    if iso.version() == crate::cgroup::Version::V2 {
        return; // v2 enforces no device list (docs/isolation.md)
    }
    let limits = crate::cgroup::Limits { gpus: vec![1], ..Default::default() };
    let cg = iso.create((12, 0, 1), &limits).unwrap();
    let (g0, g1) = (dir.path().join("gpu0"), dir.path().join("gpu1"));
    let script = format!("(exec 3<{}) 2>&1; (exec 3<{}) 2>&1; true", g0.display(), g1.display());
    let mut t = spawn(&launch(&["sh", "-c", &script]), dir.path(), Muster::NONE, Some(cg)).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let refused = "Operation not permitted";
    let no_driver = "No such device or address";
    opens_said(dir.path(), 2, [refused, no_driver]);
    // The next attempt reuses that cgroup, which denied gpu0: it holds
    // gpu0 now, and is refused gpu1 instead.
    assert_eq!(iso.spares(), 1);
    let limits = crate::cgroup::Limits { gpus: vec![0], ..Default::default() };
    let cg = iso.create((12, 1, 1), &limits).unwrap();
    assert_eq!(iso.spares(), 0, "the emptied cgroup was not reused");
    let mut launch = launch(&["sh", "-c", &script]);
    launch.attempt = 3;
    let mut t = spawn(&launch, dir.path(), Muster::NONE, Some(cg)).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    opens_said(dir.path(), 3, [no_driver, refused]);
    iso.remove_if_empty();
}

/// An emptied cgroup is renamed for the next attempt instead of being
/// removed and made again: the next attempt gets the same directories
/// with its own limits, and counts only its own CPU time and peak memory.
/// One a task changed (as a task running as root could) is not reused,
/// and an agent started again removes the spares of the one before.
#[tokio::test]
async fn an_emptied_cgroup_is_reused_with_the_next_attempts_limits_and_counts_only_its_use() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    if iso.version() == crate::cgroup::Version::V2 {
        return; // v2 has no rename: every attempt makes its own (docs/isolation.md)
    }
    let heavy = crate::cgroup::Limits { mem_mb: 256, cpus: 1, pids: 50, gpus: vec![] };
    let cg = iso.create((20, 0, 1), &heavy).unwrap();
    let inodes =
        |cg: &crate::cgroup::TaskCgroup| cg.dirs().iter().map(|d| fs::metadata(d).unwrap().ino()).collect::<Vec<_>>();
    let first = inodes(&cg);
    // About 100 MB held and a busy loop's CPU time.
    let busy = "x = bytearray(100 << 20)\nfor i in range(len(x) // 4096): x[i * 4096] = 1\ni = 0\nwhile i < 3_000_000: i += 1\n";
    let mut t = spawn(&launch(&["python3", "-c", busy]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let heavy_use = t.usage().unwrap();
    assert!(heavy_use.peak_memory_bytes >= 100 << 20, "{heavy_use:?}");
    assert!(!cg.exists());
    assert_eq!(iso.spares(), 1);
    let light = crate::cgroup::Limits { mem_mb: 0, cpus: 2, pids: 0, gpus: vec![] };
    let cg = iso.create((20, 1, 1), &light).unwrap();
    assert_eq!(iso.spares(), 0);
    assert_eq!(inodes(&cg), first, "a new cgroup was made, not the emptied one reused");
    let read = |f: &str| cg.dirs().iter().find_map(|d| fs::read_to_string(d.join(f)).ok()).unwrap();
    assert!(read("memory.limit_in_bytes").trim().parse::<u64>().unwrap() >= 1 << 62, "the memory limit stayed");
    assert_eq!(read("cpu.cfs_quota_us").trim(), "200000");
    assert_eq!(read("pids.max").trim(), crate::cgroup::DEFAULT_PIDS_MAX.to_string());
    let mut t = spawn(&launch(&["true"]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let light_use = t.usage().unwrap();
    assert!(light_use.peak_memory_bytes < 50 << 20, "the last attempt's peak counted: {light_use:?}");
    assert!(
        light_use.cpu_ns < heavy_use.cpu_ns / 4,
        "the last attempt's CPU counted: {light_use:?} after {heavy_use:?}"
    );
    assert_eq!(iso.spares(), 1);
    // A task that changed its own cgroup's knobs leaves it unusable.
    let cg = iso.create((20, 2, 1), &light).unwrap();
    let shares = cg.dirs().into_iter().find(|d| d.join("cpu.shares").exists()).unwrap().join("cpu.shares");
    fs::write(&shares, "4096").unwrap();
    let mut t = spawn(&launch(&["true"]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    assert_eq!(iso.spares(), 0, "a changed cgroup was kept for reuse");
    assert!(cg.dirs().iter().all(|d| !d.exists()));
    // One more spare, then a new agent on the same subtree.
    let cg = iso.create((20, 3, 1), &light).unwrap();
    cg.remove();
    assert_eq!(iso.spares(), 1);
    let again = isolation(dir.path(), vec![], 0);
    assert_eq!(again.spares(), 0);
    for root in again.roots() {
        let left: Vec<_> =
            fs::read_dir(&root).unwrap().flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "{} still holds {left:?}", root.display());
    }
    again.remove_if_empty();
}

/// A cgroup's files are held open across the attempts that reuse it
/// (cgroup/files.rs): a copy of it kept from an earlier attempt reaches
/// nothing of the attempt that reuses it, and its process list is read
/// afresh each time (v1 hands a listing cached per open file to a later
/// read of the same file).
#[tokio::test]
async fn a_stale_copy_of_a_reused_cgroup_reaches_nothing_and_its_process_list_is_read_afresh() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let iso = isolation(dir.path(), vec![], 0);
    let limits = crate::cgroup::Limits::default();
    let first = iso.create((21, 0, 1), &limits).unwrap();
    // Files opened through it before it becomes a spare.
    assert!(first.pids().is_empty());
    let _ = first.usage();
    first.remove();
    let reused = iso.version() == crate::cgroup::Version::V1;
    assert_eq!(iso.spares(), usize::from(reused));
    let cg = iso.create((21, 1, 1), &limits).unwrap();
    let mut t = spawn(&launch(&["sleep", "300"]), dir.path(), Muster::NONE, Some(cg.clone())).unwrap();
    let leader = t.pgid();
    assert_eq!(cg.pids(), vec![leader]);
    assert!(first.pids().is_empty(), "a stale copy sees the next attempt's processes");
    first.kill_all().await;
    first.signal_all(libc::SIGKILL);
    first.remove();
    assert!(alive(leader), "a stale copy killed the attempt that reuses its cgroup");
    assert!(cg.exists());
    // A process moved in from outside shows in the very next read.
    let mut outside = std::process::Command::new("sleep").arg("300").spawn().unwrap();
    let other = outside.id() as i32;
    for d in cg.dirs() {
        fs::write(d.join("cgroup.procs"), other.to_string()).unwrap();
    }
    let mut both = vec![leader, other];
    both.sort_unstable();
    assert_eq!(cg.pids(), both, "the process list was read from a cached listing");
    assert_eq!(t.stop(Duration::from_millis(100)).await.unwrap(), Exit::Signal(libc::SIGTERM));
    assert!(outside.wait().unwrap().signal().is_some(), "the moved-in process outlived the stop");
    assert!(!alive(leader));
    iso.remove_if_empty();
}

/// Attempt `attempt`'s output (the test launch's task) holds one line
/// per device opened, gpu0's then gpu1's, each with its error.
fn opens_said(work_dir: &Path, attempt: u32, errors: [&str; 2]) {
    let (out, _) = log_paths(work_dir, 7, 1, attempt);
    let out = fs::read_to_string(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (i, (line, error)) in lines.iter().zip(errors).enumerate() {
        assert!(line.contains(&format!("gpu{i}")) && line.contains(error), "{out}");
    }
}

/// The child starts clean of the agent's signal state: nothing blocked,
/// SIGPIPE not ignored (the agent ignores it; a task's pipeline must not),
/// in its own process group, in its working directory.
#[tokio::test]
async fn a_task_starts_with_no_signal_blocked_or_ignored_in_its_own_group() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: ignoring SIGPIPE, as the agent's runtime does.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut t = spawn(&launch(&["cat", "/proc/self/status"]), dir.path(), Muster::NONE, None).unwrap();
    let pid = t.pgid();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let (out, _) = log_paths(dir.path(), 7, 1, 2);
    let status = fs::read_to_string(out).unwrap();
    for line in ["SigBlk:\t0000000000000000", &format!("Pid:\t{pid}")] {
        assert!(status.lines().any(|l| l == line), "no {line:?} in\n{status}");
    }
    let ignored = status.lines().find_map(|l| l.strip_prefix("SigIgn:\t")).unwrap();
    assert_eq!(u64::from_str_radix(ignored, 16).unwrap() & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored:\n{status}");
    let mut t =
        spawn(&launch(&["sh", "-c", "echo $(ps -o pgid= -p $$) $(pwd -P)"]), dir.path(), Muster::NONE, None).unwrap();
    let pid = t.pgid();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let (out, _) = log_paths(dir.path(), 7, 1, 2);
    let want = format!("{pid} {}\n", dir.path().canonicalize().unwrap().display());
    assert_eq!(fs::read_to_string(out).unwrap().trim_start(), want);
}

/// A task dropped before anyone waited for it is reaped once it exits: no
/// zombie is left behind.
#[tokio::test]
async fn a_task_dropped_unwaited_leaves_no_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let t = spawn(&launch(&["sleep", "0.2"]), dir.path(), Muster::NONE, None).unwrap();
    let pid = t.pgid();
    drop(t);
    assert!(fs::metadata(format!("/proc/{pid}")).is_ok(), "still running when dropped");
    eventually("the dropped task is reaped", WAIT, || fs::metadata(format!("/proc/{pid}")).is_err().then_some(()))
        .await;
}

/// A re-run on the same node (a watchdog's) finds no beat of the run
/// before it in its progress file: the file is gone before the task starts.
#[tokio::test]
async fn each_run_starts_with_no_beat_in_its_progress_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(&["sh", "-c", "test -e \"$MUSTER_PROGRESS_FILE\" && echo stale || echo fresh"]);
    let progress = crate::watchdog::progress_path(dir.path(), l.alloc, l.task, l.attempt);
    l.env.insert("MUSTER_PROGRESS_FILE".into(), progress.display().to_string());
    fs::create_dir_all(progress.parent().unwrap()).unwrap();
    fs::write(&progress, ".\n.\n").unwrap();
    let mut t = spawn(&l, dir.path(), Muster::NONE, None).unwrap();
    assert_eq!(t.wait().await.unwrap(), Exit::Code(0));
    let (out, _) = log_paths(dir.path(), 7, 1, 2);
    assert_eq!(fs::read_to_string(out).unwrap(), "fresh\n");
}

#[test]
fn an_image_task_runs_entrypoint_then_its_command_or_the_images_cmd_as_docker_run_does() {
    let c = ContainerLaunch {
        layers: vec![],
        config: muster_registry::ImageConfig {
            entrypoint: vec!["/bin/sh".into(), "-c".into()],
            cmd: vec!["echo default".into()],
            ..Default::default()
        },
        binds: vec![],
        workdir: None,
        runtime: None,
        nvidia: None,
    };
    assert_eq!(c.argv(&[]), ["/bin/sh", "-c", "echo default"]);
    assert_eq!(c.argv(&["echo mine".to_string()]), ["/bin/sh", "-c", "echo mine"]);
    let no_entrypoint =
        ContainerLaunch { config: muster_registry::ImageConfig { cmd: vec!["top".into()], ..Default::default() }, ..c };
    assert_eq!(no_entrypoint.argv(&["ls".to_string(), "/".to_string()]), ["ls", "/"]);
    assert_eq!(no_entrypoint.argv(&[]), ["top"]);
    // No command and nothing in the image: refused before anything starts.
    let bare = ContainerLaunch { config: Default::default(), ..no_entrypoint };
    assert!(bare.argv(&[]).is_empty());
}
