//! The v2 code paths against a fake cgroupfs tree, v1 detection, names.

use super::*;

const V2_MOUNTINFO: &str = "25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n\
                            30 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n";

/// A fake unified hierarchy: the files a kernel would show where the
/// agent reads them.
fn fake_v2(own: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("sys/fs/cgroup");
    fs::create_dir_all(&top).unwrap();
    fs::write(top.join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n").unwrap();
    fs::write(top.join("cgroup.procs"), "").unwrap();
    (dir, format!("0::{own}\n"))
}

/// The subtree files a v2 kernel shows once the parent delegates.
fn kernel_files(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for f in ["cgroup.procs", "cgroup.kill", "memory.swap.max", "cgroup.subtree_control"] {
        fs::write(dir.join(f), "").unwrap();
    }
}

fn opts() -> Options {
    Options { name: "n1-0000abcd".into(), ..Options::default() }
}

/// A v1 layout (memory, devices, freezer, pids, cpu+cpuacct), the agent in
/// each hierarchy's root cgroup.
const V1_MOUNTINFO: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
";
const V1_OWN: &str = "8:pids:/\n6:freezer:/\n5:devices:/\n4:memory:/\n2:cpu,cpuacct:/\n";

/// A fake tree of [`V1_MOUNTINFO`] with the default subtree of [`opts`]
/// made in each hierarchy.
fn fake_v1() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["cpu,cpuacct", "memory", "devices", "freezer", "pids"] {
        let base = dir.path().join("sys/fs/cgroup").join(d).join("muster/n1-0000abcd");
        fs::create_dir_all(&base).unwrap();
        fs::write(base.join("cgroup.procs"), "").unwrap();
    }
    dir
}

#[test]
fn v2_delegates_controllers_down_to_the_subtree_and_sets_each_limit() {
    let (dir, own) = fake_v2("/");
    let top = dir.path().join("sys/fs/cgroup");
    kernel_files(&top.join("muster/n1-0000abcd"));
    let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap();
    assert_eq!(iso.version(), Version::V2);
    assert_eq!(iso.roots(), vec![top.join("muster/n1-0000abcd")]);
    // Its own cgroup (here the top) is where the subtree goes: the
    // agent left it for a leaf, so the top may enable controllers.
    assert_eq!(iso.moved_to, Some(top.join("agent")));
    for d in [top.clone(), top.join("muster"), top.join("muster/n1-0000abcd")] {
        assert_eq!(fs::read_to_string(d.join("cgroup.subtree_control")).unwrap(), "+memory +pids +cpu", "{d:?}");
    }
    let limits = Limits { mem_mb: 512, cpus: 2, pids: 0, gpus: vec![] };
    let cg = iso.create((7, 1, 3), &limits).unwrap();
    let at = top.join("muster/n1-0000abcd/a7-t1-e3");
    assert_eq!(cg.dirs(), vec![at.clone()]);
    let read = |f: &str| fs::read_to_string(at.join(f)).unwrap();
    assert_eq!(read("memory.max"), (512u64 << 20).to_string());
    assert_eq!(read("memory.swap.max"), "0");
    assert_eq!(read("cpu.max"), "200000 100000");
    assert_eq!(read("pids.max"), DEFAULT_PIDS_MAX.to_string());
    assert_eq!(iso.existing(), vec![(7, 1, 3)]);
    // No memory or CPU asked: neither limit is written.
    let cg2 = iso.create((8, 0, 1), &Limits { pids: 64, ..Limits::default() }).unwrap();
    let at2 = &cg2.dirs()[0];
    assert!(!at2.join("memory.max").exists() && !at2.join("cpu.max").exists());
    assert_eq!(fs::read_to_string(at2.join("pids.max")).unwrap(), "64");
}

#[tokio::test]
async fn v2_reads_usage_and_kills_through_cgroup_kill() {
    let (dir, own) = fake_v2("/");
    let top = dir.path().join("sys/fs/cgroup");
    kernel_files(&top.join("muster/n1-0000abcd"));
    let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap();
    let cg = iso.create((1, 0, 1), &Limits { mem_mb: 64, ..Limits::default() }).unwrap();
    let at = cg.dirs()[0].clone();
    fs::write(at.join("memory.peak"), "1048576\n").unwrap();
    fs::write(at.join("memory.current"), "0\n").unwrap();
    fs::write(at.join("cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n").unwrap();
    fs::write(at.join("memory.events"), "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n").unwrap();
    assert_eq!(
        cg.usage(),
        Usage {
            peak_memory_bytes: 1 << 20,
            cpu_ns: 2_500_000_000,
            oom_kills: 1,
            memory_limit_bytes: 64 << 20,
            memory_bytes: 0
        }
    );
    // A child cgroup the task made counts as its own.
    fs::create_dir_all(at.join("inner")).unwrap();
    fs::write(at.join("cgroup.procs"), "").unwrap();
    fs::write(at.join("inner/cgroup.procs"), "999999\n").unwrap();
    assert_eq!(cg.pids(), vec![999_999]);
    fs::write(at.join("cgroup.kill"), "").unwrap();
    cg.kill_once().await;
    assert_eq!(fs::read_to_string(at.join("cgroup.kill")).unwrap(), "1");
}

#[test]
fn v2_an_agent_inside_its_delegated_cgroup_moves_itself_into_a_leaf() {
    let own = "/system.slice/muster-agent.service";
    let (dir, proc_cgroup) = fake_v2(own);
    let top = dir.path().join("sys/fs/cgroup");
    let svc = top.join("system.slice/muster-agent.service");
    kernel_files(&svc);
    kernel_files(&svc.join("muster/n1-0000abcd"));
    let iso = Isolation::from_parts(V2_MOUNTINFO, &proc_cgroup, dir.path(), &opts()).unwrap();
    assert_eq!(iso.moved_to, Some(svc.join("agent")));
    assert_eq!(fs::read_to_string(svc.join("agent/cgroup.procs")).unwrap(), std::process::id().to_string());
    assert_eq!(fs::read_to_string(svc.join("cgroup.subtree_control")).unwrap(), "+memory +pids +cpu");
    assert_eq!(iso.roots(), vec![svc.join("muster/n1-0000abcd")]);
}

#[test]
fn v2_without_a_controller_or_delegation_is_refused_with_the_reason() {
    let (dir, own) = fake_v2("/");
    let top = dir.path().join("sys/fs/cgroup");
    fs::write(top.join("cgroup.controllers"), "cpu io\n").unwrap();
    let err = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &opts()).unwrap_err();
    assert!(err.contains("offers no memory controller") && err.contains("--no-isolation"), "{err}");
    let none = Isolation::from_parts("30 1 8:1 / / rw - ext4 /dev/sda1 rw\n", &own, dir.path(), &opts());
    assert!(none.unwrap_err().contains("no cgroup filesystem is mounted"));
}

#[test]
fn a_root_option_is_absolute_or_under_the_agents_own_cgroup() {
    let (dir, own) = fake_v2("/");
    let top = dir.path().join("sys/fs/cgroup");
    kernel_files(&top.join("jobs/gpu"));
    let o = Options { root: Some("/jobs/gpu".into()), ..opts() };
    let iso = Isolation::from_parts(V2_MOUNTINFO, &own, dir.path(), &o).unwrap();
    assert_eq!(iso.roots(), vec![top.join("jobs/gpu")]);
}

#[test]
fn v1_hierarchies_are_found_in_mountinfo_with_the_agents_own_paths() {
    let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    let own = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n5:devices:/\n4:memory:/box/1\n2:cpu,cpuacct:/\n0::/\n";
    let dir = tempfile::tempdir().unwrap();
    for d in ["cpu,cpuacct", "memory/box/1", "devices", "freezer", "pids"] {
        let base = dir.path().join("sys/fs/cgroup").join(d).join("muster/n1-0000abcd");
        fs::create_dir_all(&base).unwrap();
        fs::write(base.join("cgroup.procs"), "").unwrap();
    }
    let iso = Isolation::from_parts(mountinfo, own, dir.path(), &opts()).unwrap();
    assert_eq!(iso.version(), Version::V1);
    let cg = dir.path().join("sys/fs/cgroup");
    let sub = "muster/n1-0000abcd";
    assert_eq!(
        iso.roots(),
        vec![
            cg.join("memory/box/1").join(sub),
            cg.join("pids").join(sub),
            cg.join("cpu,cpuacct").join(sub),
            cg.join("devices").join(sub),
            cg.join("freezer").join(sub),
        ]
    );
    // memory's own cgroup differs: no one path for an OCI runtime, unless
    // the root is absolute.
    assert_eq!(iso.uniform_path(), None);
    for d in ["cpu,cpuacct", "memory", "devices", "freezer", "pids"] {
        let base = dir.path().join("sys/fs/cgroup").join(d).join("muster/n1");
        fs::create_dir_all(&base).unwrap();
        fs::write(base.join("cgroup.procs"), "").unwrap();
    }
    let o = Options { root: Some("/muster/n1".into()), ..opts() };
    let absolute = Isolation::from_parts(mountinfo, own, dir.path(), &o).unwrap();
    assert_eq!(absolute.uniform_path(), Some("/muster/n1"));
    // No freezer: a stop could not be sure to end every process.
    let without: String = mountinfo.lines().filter(|l| !l.contains("freezer")).map(|l| format!("{l}\n")).collect();
    let err = Isolation::from_parts(&without, own, dir.path(), &opts()).unwrap_err();
    assert!(err.contains("the freezer controller is not mounted"), "{err}");
}

/// On v1 an attempt is refused the GPUs it was not given, for reading and
/// writing (the device files of a fake tree keep the last rule written).
#[test]
fn v1_an_attempt_is_refused_every_gpu_but_its_own() {
    let dir = fake_v1();
    let gpu = |minor| GpuDevice { path: format!("/dev/nvidia{minor}").into(), major: 195, minor };
    let o = Options { gpu_devices: vec![gpu(0), gpu(1)], ..opts() };
    let iso = Isolation::from_parts(V1_MOUNTINFO, V1_OWN, dir.path(), &o).unwrap();
    let limits = Limits { gpus: vec![0], ..Limits::default() };
    let cg = iso.create((1, 0, 1), &limits).unwrap();
    let deny = fs::read_to_string(cg.dir_of("devices").join("devices.deny")).unwrap();
    assert_eq!(deny, "c 195:1 rw");
}

#[test]
fn names_parse_back_and_default_names_differ_by_work_dir() {
    assert_eq!(parse_attempt_name(&Isolation::attempt_name((12, 3, 45))), Some((12, 3, 45)));
    assert_eq!(parse_attempt_name("agent"), None);
    assert_ne!(default_name("n1", Path::new("/a")), default_name("n1", Path::new("/b")));
    assert!(default_name("gpu node/1", Path::new("/a")).starts_with("gpu_node_1-"));
    assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
}

/// A v1 cgroup is taken back as a spare only when nothing of its attempt
/// can reach the next one: each way its last attempt (or a task running as
/// root) could have left it is refused, on a fake tree whose files say
/// what a kernel's would.
#[test]
fn v1_a_cgroup_is_kept_for_reuse_only_when_its_attempt_left_nothing_behind() {
    let dir = fake_v1();
    // An earlier agent's spare is removed when the subtree is set up.
    let stale = dir.path().join("sys/fs/cgroup/pids/muster/n1-0000abcd/spare-7");
    fs::create_dir_all(&stale).unwrap();
    let iso = Isolation::from_parts(V1_MOUNTINFO, V1_OWN, dir.path(), &opts()).unwrap();
    assert!(!stale.exists());
    let limits = Limits { mem_mb: 64, cpus: 1, pids: 50, gpus: vec![] };
    let unlimited = "9223372036854771712";
    let cases: [(&str, &str, &str); 12] = [
        ("freezer", "cgroup.procs", "4242\n"),
        ("memory", "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"),
        ("memory", "memory.oom_control", "oom_kill_disable 1\nunder_oom 0\noom_kill 0\n"),
        ("memory", "memory.usage_in_bytes", "8388608"),
        ("memory", "memory.limit_in_bytes", unlimited),
        ("memory", "memory.soft_limit_in_bytes", "1048576"),
        ("pids", "pids.max", "max"),
        ("cpu", "cpu.cfs_quota_us", "-1"),
        ("cpu", "cpu.cfs_period_us", "50000"),
        ("cpu", "cpu.shares", "2048"),
        ("freezer", "freezer.state", "FROZEN"),
        ("memory", "", ""),
    ];
    for (i, (controller, file, value)) in cases.iter().enumerate() {
        let cg = iso.create((1, i as u32, 1), &limits).unwrap();
        // What a kernel shows for a clean, emptied cgroup with these limits.
        for (c, f, v) in [
            ("freezer", "cgroup.procs", ""),
            ("memory", "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"),
            ("memory", "memory.usage_in_bytes", "163840"),
            ("memory", "memory.soft_limit_in_bytes", unlimited),
            ("cpu", "cpu.cfs_period_us", "100000"),
            ("cpu", "cpu.shares", "1024"),
            ("freezer", "freezer.state", "THAWED\n"),
        ] {
            fs::write(cg.dir_of(c).join(f), v).unwrap();
        }
        if file.is_empty() {
            // A cgroup the task made below its own.
            fs::create_dir(cg.dir_of(controller).join("inner")).unwrap();
        } else {
            fs::write(cg.dir_of(controller).join(file), value).unwrap();
        }
        let spares = iso.spares.as_ref().unwrap();
        assert!(!spares.put(&cg, cg.applied.as_ref().unwrap()), "kept with {controller}/{file} = {value:?}");
        assert_eq!(iso.spares(), 0);
        // And the same cgroup, clean, is kept: renamed in every hierarchy.
        let fix = match *file {
            "cgroup.procs" => "",
            "memory.oom_control" => "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
            "memory.usage_in_bytes" => "4194304",
            "memory.limit_in_bytes" => "67108864",
            "memory.soft_limit_in_bytes" => unlimited,
            "pids.max" => "50",
            "cpu.cfs_quota_us" => "100000",
            "cpu.cfs_period_us" => "100000",
            "cpu.shares" => "1024",
            "freezer.state" => "THAWED",
            _ => {
                fs::remove_dir(cg.dir_of(controller).join("inner")).unwrap();
                ""
            }
        };
        if !file.is_empty() {
            fs::write(cg.dir_of(controller).join(file), fix).unwrap();
        }
        assert!(spares.put(&cg, cg.applied.as_ref().unwrap()), "refused once {controller}/{file} is clean");
        assert!(!cg.dirs().iter().any(|d| d.exists()));
        assert_eq!(iso.spares(), 1);
        // The next attempt takes it: renamed back in every hierarchy, its
        // counters reset, the parent's device list restored, and only
        // the limits that differ written (the spare's unchanged ones are
        // marked to show that).
        let root = iso.dir_of("memory");
        let spare = fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("spare-"))
            .unwrap();
        fs::write(root.join(&spare).join("memory.limit_in_bytes"), "untouched").unwrap();
        fs::write(iso.dir_of("pids").join(&spare).join("pids.max"), "untouched").unwrap();
        let next = iso.create((2, i as u32, 1), &Limits { mem_mb: 64, cpus: 2, pids: 50, gpus: vec![] }).unwrap();
        assert_eq!(iso.spares(), 0);
        let read = |c: &str, f: &str| fs::read_to_string(next.dir_of(c).join(f)).unwrap();
        assert_eq!(read("memory", "memory.max_usage_in_bytes"), "0");
        assert_eq!(read("cpu", "cpuacct.usage"), "0");
        assert_eq!(read("devices", "devices.allow"), "a");
        assert_eq!(read("memory", "memory.limit_in_bytes"), "untouched");
        assert_eq!(read("pids", "pids.max"), "untouched");
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "200000");
        for d in next.dirs() {
            fs::remove_dir_all(d).unwrap();
        }
    }
}
