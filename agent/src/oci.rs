//! Handing a task's image to an installed OCI runtime (`muster agent
//! --container-runtime runc`) instead of the built-in one: the agent still
//! pulls and caches the image, mounts its layers and the attempt's
//! writable layer as one overlay in a mount namespace of the attempt's own,
//! and gives the runtime a bundle whose root is that overlay.
//!
//! ```text
//!   agent child (in the attempt's cgroup)
//!     └─ exec `muster task-container --plan FILE`    waits, mirrors the exit (a shim)
//!          unshare(mount): / private; overlay(image layers + upper) at ROOT
//!          bundle/config.json: ROOT, the command, its account and environment,
//!                              /proc /dev /sys, binds, the task's GPUs
//!          cgroupsPath: the attempt's cgroup + "/oci" (a child: the runtime's
//!                       own group lies inside the attempt's, under its limits)
//!          └─ fork ─▶ exec `runc --root STATE run --bundle BUNDLE ID`
//! ```
//!
//! The mounts go with the namespace when the shim exits; the runtime's
//! state and the bundle live in the attempt's directory, removed with it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// An installed OCI runtime, as a plan names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OciRuntime {
    /// The runtime's binary (runc).
    pub program: PathBuf,
    /// Its state directory (`--root`), in the attempt's directory.
    pub state: PathBuf,
    /// The bundle directory (where `config.json` is written).
    pub bundle: PathBuf,
    /// The container's id (unique on the node: alloc, task, attempt).
    pub id: String,
}

/// A device the container may use: its path and (major, minor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceNode {
    /// Character device numbers.
    pub major: u64,
    /// The minor number.
    pub minor: u64,
}

/// The device numbers of the character device at `path`.
pub fn device_node(path: &Path) -> std::io::Result<DeviceNode> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path)?;
    if !m.file_type().is_char_device() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a character device", path.display()),
        ));
    }
    let rdev = m.rdev();
    Ok(DeviceNode { major: libc::major(rdev) as u64, minor: libc::minor(rdev) as u64 })
}

/// The controllers the agent puts an attempt in on v1: an OCI runtime
/// takes one cgroup path for all of them.
const MANAGED_V1: [&str; 5] = ["memory", "pids", "cpu", "devices", "freezer"];

/// The cgroup the runtime's container goes in, from this process's
/// `/proc/self/cgroup` text: `oci` below the attempt's group (the one path
/// the agent's v1 controllers share, or the unified one on v2), and whether
/// the node is on v1. An OCI runtime names one path for every hierarchy,
/// so v1 controllers at different paths are refused.
pub fn cgroups_path(proc_self_cgroup: &str) -> Result<(String, bool), String> {
    let mut unified = None;
    let mut v1: Vec<(&str, &str)> = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if controllers.is_empty() {
            unified = Some(path);
        }
        for c in controllers.split(',').filter(|c| MANAGED_V1.contains(c)) {
            v1.push((c, path));
        }
    }
    let oci = |p: &str| format!("{}/oci", p.trim_end_matches('/'));
    match (v1.first(), unified) {
        (Some(&(_, path)), _) => match v1.iter().find(|(_, p)| *p != path) {
            Some((c, p)) => Err(format!(
                "the attempt's cgroup is at {path} for some controllers and at {p} for {c}: an OCI runtime takes \
                 one path for all"
            )),
            None => Ok((oci(path), true)),
        },
        (None, Some(path)) => Ok((oci(path), false)),
        (None, None) => Err("this process is in no cgroup".into()),
    }
}

/// Finds the cgroup the runtime's container goes in ([`cgroups_path`]) and,
/// on v2, moves this shim into `shim` beside it: a v2 group with processes
/// of its own cannot hand controllers to a child.
pub fn enter_shim_cgroup() -> std::io::Result<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let (path, v1) = cgroups_path(&own).map_err(std::io::Error::other)?;
    if !v1 {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let attempt = path.strip_suffix("/oci").unwrap_or(&path);
        let dir = crate::cgroup::dirs_in_every_hierarchy(&mountinfo, attempt)
            .into_iter()
            .find_map(|(v2, d)| v2.then(|| d.join("shim")))
            .ok_or_else(|| std::io::Error::other("no cgroup2 mount"))?;
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("cgroup.procs"), "0")?;
    }
    Ok(path)
}

/// Removes what the runtime left in cgroup hierarchies after it: its
/// container's group (gone already after a clean exit) and, in the
/// hierarchies the agent does not manage (blkio, net_cls, a hybrid node's
/// empty unified one, …, where the runtime made the attempt's path too),
/// the attempt's empty group. Only empty directories go.
pub fn remove_leftovers(cgroup: &str) {
    if !cgroup.starts_with('/') || cgroup.split('/').any(|p| p == "..") {
        return;
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    for (_, dir) in crate::cgroup::dirs_in_every_hierarchy(&mountinfo, cgroup) {
        let _ = std::fs::remove_dir(&dir);
    }
    let attempt = cgroup.strip_suffix("/oci").unwrap_or(cgroup);
    for (_, dir) in crate::cgroup::dirs_in_every_hierarchy(&mountinfo, attempt) {
        // Busy while a process is in it (the shim, where the agent
        // manages the hierarchy); else empty, and the attempt's.
        let _ = std::fs::remove_dir(&dir);
    }
}

/// The bundle's `config.json` for `plan`: the root it mounted, the
/// command as its account, the node's network, fresh PID, mount, UTS and
/// IPC namespaces, the container's cgroup (`cgroups_path`), and only the
/// task's GPUs among the node's devices.
pub fn config(plan: &crate::container::ContainerPlan, cgroups_path: &str, gpus: &[(PathBuf, DeviceNode)]) -> Value {
    let (uid, gid, groups) = match plan.user.as_deref().map(crate::users::TaskUser::from_arg) {
        Some(Ok(u)) => (u.uid, u.gid, u.groups.clone()),
        _ => (0, 0, Vec::new()),
    };
    // Root keeps runc's default, small set; an account keeps none.
    let caps: Vec<&str> =
        if uid == 0 { vec!["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"] } else { Vec::new() };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for f in ["/etc/resolv.conf", "/etc/hosts"] {
        if Path::new(f).is_file() {
            mounts.push(json!({"destination": f, "type": "bind", "source": f, "options": ["rbind", "ro"]}));
        }
    }
    for b in &plan.binds {
        let mode = if b.read_only { "ro" } else { "rw" };
        mounts.push(json!({"destination": b.target, "type": "bind", "source": b.source,
                           "options": ["rbind", "rprivate", mode]}));
    }
    let devices: Vec<Value> = gpus
        .iter()
        .map(|(path, d)| {
            json!({"path": path, "type": "c", "major": d.major, "minor": d.minor,
                                "fileMode": 0o666, "uid": 0, "gid": 0})
        })
        .collect();
    let mut rules = vec![json!({"allow": false, "access": "rwm"})];
    rules.extend(gpus.iter().map(|(_, d)| {
        json!({"allow": true, "type": "c", "major": d.major, "minor": d.minor,
                                                  "access": "rwm"})
    }));
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid, "additionalGids": groups},
            "args": plan.argv,
            "env": plan.env,
            "cwd": plan.workdir,
            "noNewPrivileges": true,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
        },
        "root": {"path": plan.root, "readonly": false},
        "hostname": plan.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "cgroupsPath": cgroups_path,
            "devices": devices,
            "resources": {"devices": rules},
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                            "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    })
}

/// How the runtime's exit reads as the task's: `128 + N` is signal N (as
/// runc reports a container killed by one).
pub fn exit_of(code: i32) -> crate::executor::Exit {
    if (129..=128 + 64).contains(&code) {
        crate::executor::Exit::Signal(code - 128)
    } else {
        crate::executor::Exit::Code(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_containers_cgroup_is_oci_below_the_attempts_own() {
        let hybrid = "12:freezer:/muster/n1/a-1-0-1\n11:memory:/muster/n1/a-1-0-1\n10:pids:/muster/n1/a-1-0-1\n\
                      9:blkio:/\n4:cpu,cpuacct:/muster/n1/a-1-0-1\n3:devices:/muster/n1/a-1-0-1\n1:name=systemd:/\n\
                      0::/\n";
        assert_eq!(cgroups_path(hybrid), Ok(("/muster/n1/a-1-0-1/oci".to_string(), true)));
        let v2 = "0::/muster/n1/a-1-0-1\n";
        assert_eq!(cgroups_path(v2), Ok(("/muster/n1/a-1-0-1/oci".to_string(), false)));
        let split = "12:freezer:/muster/a\n11:memory:/system.slice/muster/a\n";
        let e = cgroups_path(split).unwrap_err();
        assert!(e.contains("one path for all"), "{e}");
        assert!(cgroups_path("").is_err());
    }

    #[test]
    fn a_bundle_runs_the_plan_as_its_account_with_only_its_gpus() {
        let plan = crate::container::ContainerPlan {
            layers: vec!["/l/1".into()],
            upper: "/c/upper".into(),
            work: "/c/work".into(),
            root: "/c/root".into(),
            binds: vec![crate::container::Bind { source: "/data".into(), target: "/in".into(), read_only: true }],
            devices: vec!["/dev/nvidia1".into()],
            hostname: "n0".into(),
            workdir: "/work".into(),
            argv: vec!["python3".into(), "train.py".into()],
            env: vec!["PATH=/bin".into(), "RANK=0".into()],
            user: Some("1000:1001:1001,44".into()),
            status: None,
            oci: None,
            nvidia: None,
        };
        let gpu = (PathBuf::from("/dev/nvidia1"), DeviceNode { major: 195, minor: 1 });
        let c = config(&plan, "/muster/a/oci", &[gpu]);
        assert_eq!(c["process"]["args"], json!(["python3", "train.py"]));
        assert_eq!(c["process"]["user"], json!({"uid": 1000, "gid": 1001, "additionalGids": [1001, 44]}));
        assert_eq!(c["process"]["capabilities"]["bounding"], json!([]), "an account keeps no capability");
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(c["root"]["path"], "/c/root");
        assert_eq!(c["linux"]["cgroupsPath"], "/muster/a/oci");
        let ns: Vec<&str> =
            c["linux"]["namespaces"].as_array().unwrap().iter().map(|n| n["type"].as_str().unwrap()).collect();
        assert_eq!(ns, ["pid", "ipc", "uts", "mount"], "the node's network, as the built-in runtime");
        let rules = &c["linux"]["resources"]["devices"];
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
        assert_eq!(rules[1], json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"}));
        assert_eq!(rules.as_array().unwrap().len(), 2, "no other GPU");
        let bind = c["mounts"].as_array().unwrap().iter().find(|m| m["destination"] == "/in").unwrap();
        assert_eq!(bind["options"], json!(["rbind", "rprivate", "ro"]));
        assert_eq!(exit_of(137), crate::executor::Exit::Signal(9));
        assert_eq!(exit_of(3), crate::executor::Exit::Code(3));
    }
}
