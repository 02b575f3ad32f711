//! Container images (issue 49): what a submit with `--image` asks for, and
//! what is refused before the log.

use crate::dev_proc::Dev;

/// A malformed reference, mount or working directory is refused naming the
/// flag; a well-formed one is recorded with its mounts and working
/// directory, and runs only on nodes whose agent runs images
/// (`muster.images`): none here (`--no-images`), so it is refused as
/// unsatisfiable unless asked to queue.
#[test]
fn t220_an_image_spec_is_checked_recorded_and_placed_only_where_images_run() {
    let dev = Dev::start_with(&["--no-images"]);
    for (args, needle) in [
        (vec!["--image", "Bad//ref"], "--image \"Bad//ref\": repository component \"Bad\""),
        (vec!["--image", "bb@sha256:abc"], "64 lowercase hex digits"),
        (vec!["--image", "bb", "--mount", "/data:rel"], "--mount target \"rel\": an absolute path"),
        (vec!["--image", "bb", "--mount", "/a:/b/../c"], "no empty, '.' or '..' components"),
        (vec!["--image", "bb", "--workdir", "work"], "--workdir \"work\": an absolute path"),
        (vec!["--mount", "/a:/b"], "required arguments were not provided"),
    ] {
        let mut all = vec!["submit"];
        all.extend(args);
        all.extend(["--", "true"]);
        let e = dev.json(&all);
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{all:?}: {e}");
    }
    let image = "127.0.0.1:5000/test/busybox:1";
    let args = ["submit", "--image", image, "--mount", "/tmp:/data:ro", "--workdir", "/work", "--", "true"];
    let refused = dev.json(&args);
    let msg = refused["error"].as_str().unwrap_or_default();
    assert!(msg.contains("muster.images"), "no node runs images: {refused}");
    let mut queued = args.to_vec();
    queued.insert(1, "--queue-if-unsatisfiable");
    let id = dev.ok(&queued)["id"].as_u64().unwrap().to_string();
    let a = dev.ok(&["alloc", "get", &id]);
    assert_eq!(a["image"], image);
    assert_eq!(a["mounts"], serde_json::json!(["/tmp:/data:ro"]));
    assert_eq!(a["workdir"], "/work");
    assert!(a["constraints"].to_string().contains("muster.images"), "{a}");
    // Without an image, the image's entrypoint cannot stand in for a command.
    let e = dev.json(&["submit", "--mount", "/a:/b"]);
    assert!(e["error"].as_str().unwrap_or_default().contains("--image"), "{e}");
}

/// A 4-task gang runs from a real registry image on `muster dev`: Debian's
/// registry with TLS and auth holds a busybox image built offline; the
/// agents pull it with the credentials and CA given to `muster dev`. Each
/// rank runs inside the image (its own PID namespace and root), sees the
/// launcher environment, its hostfile and an allowed mount, and the
/// image's ENV, and the ranks rendezvous at `MASTER_ADDR:MASTER_PORT`; a mount outside what the node allows fails the task with a
/// reason that says so. The tag is pinned to its digest at submit, and a
/// tag the registry lacks is refused then.
#[test]
fn t221_a_gang_runs_from_a_registry_image_on_muster_dev() {
    use muster_testkit::registry::{TestRegistry, tools};
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(true);
    let digest = reg.push("busybox", "1", false);
    let files = tempfile::tempdir().unwrap();
    let auth = files.path().join("config.json");
    std::fs::write(&auth, reg.auth_json()).unwrap();
    let data = files.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("input.txt"), "from the host\n").unwrap();
    let dev = Dev::start_with(&[
        "--registry-auth",
        auth.to_str().unwrap(),
        "--registry-ca",
        reg.ca().to_str().unwrap(),
        "--allow-mount",
        data.to_str().unwrap(),
    ]);
    let image = format!("{}/test/busybox:1", reg.host());
    let mount = format!("{}:/data:ro", data.display());
    // The image's ENTRYPOINT is `/bin/sh -c`: the command is its script.
    // Then the ranks rendezvous: rank 0 serves MASTER_PORT, the others send
    // it their rank at MASTER_ADDR until it answers with an ack of that
    // rank (a send into a listener that was closing is sent again).
    let script = "echo rank=$RANK of $WORLD_SIZE port=$MASTER_PORT pid=$$; cat /work/name /data/input.txt; \
                  test -s $MUSTER_HOSTFILE && echo hostfile; echo greeting=$GREETING; pwd; \
                  ls / | tr '\\n' ' '; echo; ps 2>/dev/null | wc -l >/dev/null; echo ok; \
                  if [ $RANK = 0 ]; then printf '#!/bin/sh\\nread r; echo $r >> /tmp/joined; echo ack-$r\\n' \
                  > /tmp/recv; busybox chmod +x /tmp/recv; busybox touch /tmp/joined; \
                  busybox nc -ll -p $MASTER_PORT -e /tmp/recv & s=$!; n=0; \
                  until [ $(busybox sort -u /tmp/joined | busybox grep -c .) = 3 ]; do n=$((n+1)); \
                  [ $n -gt 600 ] && break; sleep 0.2; done; kill $s; \
                  echo joined=$(busybox sort -u /tmp/joined | busybox tr '\\n' ' '); \
                  else n=0; until [ \"$(echo $RANK | busybox nc -w 5 $MASTER_ADDR $MASTER_PORT)\" = ack-$RANK ]; \
                  do n=$((n+1)); [ $n -gt 600 ] && echo gave-up-$MASTER_ADDR && exit 0; sleep 0.2; done; \
                  echo sent; fi";
    let id = dev.ok(&["submit", "--image", &image, "-n", "4", "--gpus", "1", "--mount", &mount, "--", script])["id"]
        .as_u64()
        .unwrap()
        .to_string();
    let a = crate::dev_proc::wait_for_end(&dev, &id);
    assert_eq!(a["status"], "done", "{a}");
    // The tag was pinned at submit: every task and retry runs these bytes.
    assert_eq!(a["image"], format!("{image}@{digest}"), "{a}");
    for task in 0..4 {
        let out = crate::dev_proc::task_stdout(&dev, &id, task);
        assert!(out.contains(&format!("rank={task} of 4 port=")), "{out}");
        assert!(out.contains("pid=2"), "PID 1 is the container's init: {out}");
        assert!(out.contains("busybox:1\nfrom the host\n"), "the image's file and the mount: {out}");
        assert!(out.contains("hostfile\ngreeting=hello\n/work\n"), "{out}");
        assert!(out.contains("bin data dev etc proc sys tmp work"), "the image's root: {out}");
        let rendezvous = if task == 0 { "joined=1 2 3\n" } else { "ok\nsent\n" };
        assert!(out.ends_with(rendezvous), "the ranks rendezvous through the launcher environment: {out}");
    }
    // A tag the registry does not have is refused before the log.
    let e = dev.json(&["submit", "--image", &format!("{}/test/busybox:nope", reg.host()), "--", "true"]);
    assert!(e["error"].as_str().unwrap_or_default().contains("is not in its registry"), "{e}");
    // A mount the nodes do not allow fails the task, saying why.
    let id =
        dev.ok(&["submit", "--image", &image, "--mount", "/etc:/host-etc", "--max-retries", "1", "--", "true"])["id"]
            .as_u64()
            .unwrap()
            .to_string();
    let a = crate::dev_proc::wait_for_end(&dev, &id);
    assert_eq!(a["status"], "failed", "{a}");
    assert!(a.to_string().contains("this node allows mounts only under"), "{a}");
}

/// A preempted image task resumes from its checkpoint: a 4-task gang from
/// the registry's image fills `muster dev`; a class-9 gang preempts it; the
/// image tasks get the checkpoint hint (SIGUSR1, reaching the command inside
/// its container), save their step in the checkpoint directory (bound at its
/// own path inside), and once the preemptor is done they run again and
/// resume from what they saved.
#[test]
fn t222_a_preempted_image_task_resumes_from_its_checkpoint() {
    use muster_testkit::registry::{TestRegistry, tools};
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    reg.push("busybox", "1", false);
    let dev = Dev::start();
    let image = format!("{}/test/busybox:1", reg.host());
    let trainer = r#"step=0
if [ "$MUSTER_RESUME" = 1 ]; then echo "resumed from $(cat "$MUSTER_CHECKPOINT_DIR/step")"; exit 0; fi
trap 'echo $step > "$MUSTER_CHECKPOINT_DIR/step"; : > "$MUSTER_CHECKPOINT_DIR/.muster/done"' USR1
trap 'exit 143' TERM
echo armed
while true; do step=$((step+1)); sleep 0.1; done"#;
    let id = |v: serde_json::Value| v["id"].as_u64().unwrap().to_string();
    let low = id(dev.ok(&["submit", "--image", &image, "-n", "4", "--gpus", "8", "--class", "2", "--", trainer]));
    crate::dev_proc::wait_until("the image gang to run", || dev.ok(&["alloc", "get", &low])["status"] == "running");
    // A hint before a rank's traps are set would kill it (SIGUSR1's
    // default), not test the protocol: each says when they are.
    crate::dev_proc::wait_until("every rank to set its traps", || {
        (0..4).all(|task| crate::dev_proc::try_task_stdout(&dev, &low, task).is_ok_and(|o| o.contains("armed")))
    });
    let high = id(dev.ok(&["submit", "-n", "4", "--gpus", "8", "--class", "9", "--", "true"]));
    assert_eq!(crate::dev_proc::wait_for_end(&dev, &high)["status"], "done");
    let a = crate::dev_proc::wait_for_end(&dev, &low);
    assert_eq!(a["status"], "done", "{a}");
    assert!(a["preempted_count"].as_u64().unwrap_or(0) >= 1, "it was preempted: {a}");
    for task in 0..4 {
        let out = crate::dev_proc::task_stdout(&dev, &low, task);
        assert!(out.starts_with("resumed from ") && out.trim() != "resumed from", "task {task}: {out:?}");
    }
}

/// What a node's cache holds steers placement, `muster image prefetch`
/// warms nodes ahead of a gang, explain shows a pull under way, and a pull
/// that fails is an outcome of its own. On `muster dev` with the Debian
/// registry: the image is prefetched onto the one node an admin labelled
/// (which then reports holding it), and a full-node job of that image goes
/// there although all four nodes fit it equally. An image pinned to a digest
/// the registry lacks fails three pulls (each on a node the next placement
/// avoids) and then the allocation, with `image_pull_failed` and the
/// registry's message, its retry budget untouched. A pull from a registry
/// that never answers shows in `alloc explain` until the job is cancelled.
#[test]
fn t223_prefetch_cache_aware_placement_pull_progress_and_pull_failures() {
    use muster_testkit::registry::{TestRegistry, tools};
    use serde_json::json;
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    let digest = reg.push("busybox", "1", false);
    let dev = Dev::start();
    let image = format!("{}/test/busybox:1", reg.host());
    let id = |v: serde_json::Value| v["id"].as_u64().unwrap().to_string();

    dev.ok(&["node", "label", "node-3", "pool=warm"]);
    let p = dev.ok(&["image", "prefetch", &image, "--constraint", "pool=warm", "--wait", "2m"]);
    assert_eq!((&p["asked"], &p["digest"]), (&json!(["node-3"]), &json!(digest)), "{p}");
    assert_eq!(p["image"], format!("{image}@{digest}"), "pinned: {p}");
    assert_eq!(dev.ok(&["node", "get", "node-3"])["images"], json!([digest]));
    assert_eq!(dev.ok(&["node", "get", "node-1"])["images"], json!([]));
    let again = dev.ok(&["image", "prefetch", &image, "--constraint", "pool=warm"]);
    assert_eq!((&again["asked"], &again["cached"]), (&json!([]), &json!(["node-3"])), "{again}");
    let e = dev.json(&["image", "prefetch", &image, "--constraint", "pool=none"]);
    assert!(e["error"].as_str().unwrap_or_default().contains("no ready node"), "{e}");
    let e = dev.json(&["image", "prefetch", &format!("{}/test/busybox:nope", reg.host())]);
    assert!(e["error"].as_str().unwrap_or_default().contains("is not in its registry"), "{e}");

    let job = id(dev.ok(&["submit", "--image", &image, "--gpus", "8", "--", "true"]));
    let a = crate::dev_proc::wait_for_end(&dev, &job);
    assert_eq!(a["status"], "done", "{a}");
    assert_eq!(a["tasks"][0]["last_node"], "node-3", "placed where the image is cached: {a}");

    let missing = format!("{}/test/busybox@sha256:{}", reg.host(), "0".repeat(64));
    let job = id(dev.ok(&["submit", "--image", &missing, "--max-retries", "1", "--", "true"]));
    let a = crate::dev_proc::wait_for_end(&dev, &job);
    assert_eq!(a["status"], "failed", "{a}");
    let reason = a["failed_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("image_pull_failed: image pull failed: not found"), "{a}");
    assert_eq!((&a["failures"], &a["image_pull_failures"]), (&json!(0), &json!(3)), "{a}");
    let pulls: Vec<String> = dev
        .json_lines(&["alloc", "watch", &job])
        .iter()
        .filter(|e| e["kind"] == "image_pull_failed")
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pulls.len(), 3, "{pulls:?}");
    let node_of = |d: &str| d.split(" on ").nth(1).and_then(|r| r.split(' ').next()).unwrap().to_string();
    assert_ne!(node_of(&pulls[0]), node_of(&pulls[1]), "the next placement avoids the node: {pulls:?}");

    // A registry that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!("{}/test/slow@sha256:{}", silent.local_addr().unwrap(), "1".repeat(64));
    let job = id(dev.ok(&["submit", "--image", &slow, "--", "true"]));
    crate::dev_proc::wait_until("explain to show the pull", || {
        let e = dev.ok(&["alloc", "explain", &job]);
        e["pulls"].as_array().is_some_and(|p| p.len() == 1 && p[0]["image"] == slow.as_str())
    });
    dev.ok(&["alloc", "cancel", &job]);
    assert_eq!(crate::dev_proc::wait_for_end(&dev, &job)["status"], "cancelled");
}

/// `--container-runtime runc` hands each task's image to runc, the
/// installed OCI runtime, instead of the built-in one: the nodes say so
/// (`muster.images=runc`); a 2-task gang from the registry's image runs
/// with the launcher environment, its hostfile and its account's view, in
/// a cgroup of runc's own inside the attempt's; a task that daemonises a
/// child is cancelled and nothing of it is left: no process, no attempt
/// directory, no cgroup runc made, in any hierarchy.
#[test]
fn t224_an_installed_oci_runtime_runs_image_tasks_and_a_cancel_leaves_nothing() {
    use muster_testkit::registry::{TestRegistry, tools};
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    reg.push("busybox", "1", false);
    let dev = Dev::start_with(&["--container-runtime", "runc"]);
    let node = dev.ok(&["node", "get", "node-1"]);
    assert_eq!(node["labels"]["muster.images"], "runc", "{node}");
    let image = format!("{}/test/busybox:1", reg.host());
    let id = |v: serde_json::Value| v["id"].as_u64().unwrap().to_string();
    let script = "echo rank=$RANK of $WORLD_SIZE; test -s $MUSTER_HOSTFILE && echo hostfile; cat /work/name; \
                  grep -q '/oci$' /proc/self/cgroup && echo in-oci-cgroup; echo pid1=$(cat /proc/1/comm); pwd";
    let job = id(dev.ok(&["submit", "--image", &image, "-n", "2", "--gpus", "1", "--", script]));
    let a = crate::dev_proc::wait_for_end(&dev, &job);
    assert_eq!(a["status"], "done", "{a}");
    for task in 0..2 {
        let out = crate::dev_proc::task_stdout(&dev, &job, task);
        assert!(out.contains(&format!("rank={task} of 2\nhostfile\nbusybox:1\nin-oci-cgroup\n")), "{out}");
        assert!(out.contains("pid1=sh\n/work\n"), "the command is the container's PID 1: {out}");
    }

    let marker = "sleep 4242";
    let job = id(dev.ok(&["submit", "--image", &image, "--", &format!("setsid {marker} & {marker}3")]));
    let running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(marker))
        })
    };
    crate::dev_proc::wait_until("the task and its daemon to run", running);
    dev.ok(&["alloc", "cancel", &job]);
    assert_eq!(crate::dev_proc::wait_for_end(&dev, &job)["status"], "cancelled");
    assert!(!running(), "a cancelled task's processes are gone once it is cancelled");
    let attempts =
        |node: &str| std::fs::read_dir(dev.data_dir().join(node).join("containers")).map_or(0, |d| d.flatten().count());
    crate::dev_proc::wait_until("the attempt directories to go", || {
        (1..=4).all(|n| attempts(&format!("node-{n}")) == 0)
    });
    // No group runc made is left in any hierarchy (blkio, net_cls, … too)
    // under these agents' subtrees.
    let mut left = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for n in 1..=4 {
            let node = format!("node-{n}");
            let name = muster_agent::cgroup::default_name(&node, &dev.data_dir().join(&node));
            find_dirs(&h.path().join("muster").join(name), 0, &mut left);
        }
    }
    assert!(left.is_empty(), "{left:?}");
}

/// Directories named `oci` or `aN-tN-eN` (an attempt's group) under `dir`.
fn find_dirs(dir: &std::path::Path, depth: u32, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) || depth > 6 {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let attempt = name.starts_with('a') && name.contains("-t") && name.contains("-e");
        if name == "oci" || attempt {
            out.push(e.path());
        }
        find_dirs(&e.path(), depth + 1, out);
    }
}

/// An image task adopted by the next agent (`--keep-tasks`) keeps its
/// image: the agent stops while the task runs in its container and a new
/// one starts on the same work dir; the task is reattached, its image
/// pinned again in the cache, so a later job's pull past the cache's limit
/// (1 KiB: everything not in use goes) evicts only what is not in use. The
/// adopted task then reads its image's own file and ends done, and its
/// container directory goes with it.
#[test]
fn t225_an_adopted_image_task_keeps_its_image_from_eviction() {
    use muster_testkit::registry::{TestRegistry, tools};
    use std::process::{Command, Stdio};
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    let first = reg.push("busybox", "1", false);
    let second = reg.push("other", "1", false);
    assert_ne!(first, second);
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", crate::cluster::free_port());
    let _server = crate::Procs::start(dir.path(), &addr, &["--agent-heartbeat-ms", "500"], &[]);
    crate::tls::material(muster_tls::Role::Agent("k2".into()));
    let work = dir.path().join("k2");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt;
    // The tasks' account reaches the work dir and the shared directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let agent = || {
        Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["agent", "--scheduler", &addr, "--node-id", "k2", "--gpus", "2", "--vram-mb", "1000"])
            .args(["--keep-tasks", "--task-user", "60301:60301", "--image-cache-max", "1K", "--allow-mount"])
            .arg(&shared)
            .arg("--work-dir")
            .arg(&work)
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let cli = |args: &[&str]| client(&addr, args);
    let images = || cli(&["node", "get", "k2"])["images"].clone();
    let mut one = agent();
    let mount = format!("{}:/shared", shared.display());
    let script = "touch /shared/started; while [ ! -f /shared/release ]; do sleep 0.1; done; cat /work/name";
    let image = format!("{}/test/busybox:1", reg.host());
    wait_for_images(&addr, "k2", "builtin");
    let id = cli(&["submit", "--image", &image, "--mount", &mount, "--max-retries", "0", "--", script])["id"]
        .as_u64()
        .unwrap()
        .to_string();
    crate::dev_proc::wait_until("the image task to run", || shared.join("started").exists());
    // SAFETY: signals our own child.
    unsafe { libc::kill(one.id() as i32, libc::SIGTERM) };
    assert!(one.wait().unwrap().success());
    let mut two = agent();
    assert_eq!(cli(&["alloc", "get", &id])["status"], "running");
    // Another image's pull: the cache is over its limit, and evicts what
    // no task uses.
    let other = format!("{}/test/other:1", reg.host());
    let job = cli(&["submit", "--image", &other, "--", "true"])["id"].as_u64().unwrap().to_string();
    crate::dev_proc::wait_until("the other job to end", || cli(&["alloc", "get", &job])["status"] == "done");
    crate::dev_proc::wait_until("the node to report the other image", || {
        images().as_array().is_some_and(|i| i.iter().any(|d| d == second.as_str()))
    });
    assert!(
        images().as_array().unwrap().iter().any(|d| d == first.as_str()),
        "the adopted task's image was evicted: {}",
        images()
    );
    std::fs::write(shared.join("release"), "").unwrap();
    crate::dev_proc::wait_until("the adopted task to end", || {
        ["done", "failed"].contains(&cli(&["alloc", "get", &id])["status"].as_str().unwrap_or_default())
    });
    let a = cli(&["alloc", "get", &id]);
    assert_eq!(a["status"], "done", "{a}");
    crate::dev_proc::wait_until("its container directory to go", || {
        std::fs::read_dir(work.join("containers")).map_or(true, |d| d.count() == 0)
    });
    let _ = two.kill();
    let _ = two.wait();
}

/// On a node with `nvidia-container-cli`, a task holding GPUs gets the
/// driver's libraries in its image: the agent runs the tool once the
/// container's root is mounted, for the task's GPUs only, with the root and
/// a process of the mount namespace that holds it, leaving devices and
/// cgroups to the runtime; a task without GPUs is left alone. Both runtimes:
/// the built-in one (k3) and runc (k4). No GPU here: the tool is a script
/// that checks what the real one needs (the pid's namespace shows the root)
/// and adds a library as it would; the GPU is `/dev/kmsg` (no default
/// device of runc's), named with `--gpu-device`.
#[test]
fn t226_a_gpu_task_gets_the_drivers_libraries_from_nvidia_container_cli() {
    use muster_testkit::registry::{TestRegistry, tools};
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", crate::cluster::free_port());
    let _server = crate::Procs::start(dir.path(), &addr, &["--agent-heartbeat-ms", "500"], &[]);
    let bin = dir.path().join("bin");
    let calls = dir.path().join("calls");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&calls).unwrap();
    let tool = bin.join("nvidia-container-cli");
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\nfor a; do root=$a; done\npid=$(echo \"$@\" | sed -n 's/.*--pid=\\([0-9]*\\).*/\\1/p')\n\
             out={}/$(basename $(dirname $root))\necho \"$@\" > $out.args\n\
             test -d /proc/$pid/root$root/bin && echo sees-root > $out.check\n\
             mkdir -p $root/usr/lib && echo driver > $root/usr/lib/libcuda.so.1\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let agent = |node: &str, extra: &[&str]| {
        crate::tls::material(muster_tls::Role::Agent(node.into()));
        Command::new(env!("CARGO_BIN_EXE_muster"))
            .args(["agent", "--scheduler", &addr, "--node-id", node, "--gpus", "1", "--vram-mb", "1000"])
            .args(["--gpu-device", "/dev/kmsg", "--allow-root-tasks"])
            .args(extra)
            .arg("--work-dir")
            .arg(dir.path().join(node))
            .env("MUSTER_TLS_DIR", crate::tls::dir())
            .env("PATH", &path)
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let cgroup_root = format!("/muster/k4-{}", std::process::id());
    let mut agents = [agent("k3", &[]), agent("k4", &["--container-runtime", "runc", "--cgroup-root", &cgroup_root])];
    let cli = |args: &[&str]| client(&addr, args);
    wait_for_images(&addr, "k3", "builtin");
    wait_for_images(&addr, "k4", "runc");
    let image = format!("{}/test/busybox:1", reg.host());
    let run = |runtime: &str, gpus: &str| {
        let c = format!("muster.images={runtime}");
        let script = "cat /usr/lib/libcuda.so.1 2>/dev/null || echo no-driver";
        let id = cli(&["submit", "--image", &image, "--constraint", &c, "--gpus", gpus, "--", script])["id"]
            .as_u64()
            .unwrap()
            .to_string();
        crate::dev_proc::wait_until("the job to end", || {
            ["done", "failed"].contains(&cli(&["alloc", "get", &id])["status"].as_str().unwrap_or(""))
        });
        let a = cli(&["alloc", "get", &id]);
        assert_eq!(a["status"], "done", "{a}");
        let o = crate::muster(&["alloc", "logs", &id, "--stdout", "--scheduler", &addr]);
        (id, String::from_utf8_lossy(&o.stdout).into_owned())
    };
    for runtime in ["builtin", "runc"] {
        let (_, out) = run(runtime, "0");
        assert_eq!(out, "no-driver\n", "{runtime}: a task without GPUs is left alone");
        assert_eq!(std::fs::read_dir(&calls).unwrap().count(), 0, "{runtime}: the tool was not run");
        let (id, out) = run(runtime, "1");
        assert_eq!(out, "driver\n", "{runtime}: the tool's library is in the image");
        let attempt = format!("{id}-0-1");
        let args = std::fs::read_to_string(calls.join(format!("{attempt}.args"))).unwrap();
        assert!(
            args.starts_with("--load-kmods configure --no-cgroups --no-devbind --compute --utility --device=0 --pid="),
            "{runtime}: {args}"
        );
        assert!(args.trim_end().ends_with(&format!("containers/{attempt}/root")), "{runtime}: {args}");
        assert!(calls.join(format!("{attempt}.check")).exists(), "{runtime}: the pid's namespace held the root");
        for f in std::fs::read_dir(&calls).unwrap().flatten() {
            std::fs::remove_file(f.path()).unwrap();
        }
    }
    for a in &mut agents {
        let _ = a.kill();
        let _ = a.wait();
    }
}

/// A CLI command against the server at `addr`, with `--output json` (the
/// connection flags before a `--`), which must succeed.
fn client(addr: &str, args: &[&str]) -> serde_json::Value {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let all = [&args[..split], &["--scheduler", addr, "--output", "json"], &args[split..]].concat();
    let o = crate::muster(&all);
    assert!(o.status.success(), "{all:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// Waits until node `node` of the server at `addr` has registered and runs
/// images through `runtime` (its `muster.images` label).
fn wait_for_images(addr: &str, node: &str, runtime: &str) {
    crate::dev_proc::wait_until("the node to run images", || {
        let o = crate::muster(&["node", "get", node, "--scheduler", addr, "--output", "json"]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).is_ok_and(|n| n["labels"]["muster.images"] == runtime)
    });
}
