//! Distributed jobs: the launcher environment and rendezvous ports the
//! scheduler reserves, with real processes that bind and connect.

use std::time::{Duration, Instant};

use muster_local::{LocalCluster, LocalConfig};
use muster_proto::v1;
use muster_scheduler::sm::PortRange;

use crate::cluster::WAIT;
use crate::t26_e2e::{gang, status, submit, until};

/// A rank that meets its gang the way torch's TCPStore does: task 0 binds
/// MASTER_ADDR:MASTER_PORT and waits for every other rank to connect;
/// the others connect (retrying while task 0 starts). Task 0 then marks
/// its gang met and holds the port until the test says go.
const RANK: &str = r#"
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
shared = os.environ["SHARED"]
assert os.environ["NODE_RANK"] == str(rank) and os.environ["LOCAL_RANK"] == "0"
hosts = open(os.environ["MUSTER_HOSTFILE"]).read().split("\n")
assert len([h for h in hosts if h.endswith(" slots=1")]) == world, hosts
if rank == 0:
    s = socket.socket()
    s.bind(addr)  # no SO_REUSEADDR: a port another gang holds fails here
    s.listen(world)
    peers = [s.accept()[0] for _ in range(world - 1)]
    open(os.path.join(shared, "met-" + os.environ["MUSTER_ALLOC_ID"]), "w").close()
    while not os.path.exists(os.path.join(shared, "go")):
        time.sleep(0.05)
    for p in peers:
        p.sendall(b"go")
else:
    deadline = time.time() + 60
    while True:
        try:
            c = socket.create_connection(addr, timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("task 0 never listened")
            time.sleep(0.1)
    assert c.recv(2) == b"go"
"#;

/// A block of `n` ports on 127.0.0.1 that are free now (none fixed),
/// below the ephemeral range, as `muster agent --rendezvous-ports` asks:
/// an ephemeral port is any socket's to take (the chaos tests running
/// beside this one open thousands), and a rank's bind would then fail.
fn free_ports(n: u16) -> PortRange {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000u16, ephemeral_low.saturating_sub(n));
    assert!(high > low, "no room below the ephemeral range ({ephemeral_low})");
    let mut seed = u64::from(std::process::id()) ^ std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos() as u64);
    loop {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let first = low + ((seed >> 33) % u64::from(high - low)) as u16;
        let all_free = (first..first + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return PortRange { first, count: n };
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t152_two_gangs_whose_task_0_share_a_node_meet_on_their_own_reserved_ports() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let cfg = LocalConfig {
        agents: 2,
        heartbeat: Duration::from_millis(500),
        stop_grace: Duration::from_secs(1),
        rendezvous_ports: free_ports(8),
        ..crate::tls::local_config()
    };
    let c = LocalCluster::start(&dir.path().join("cluster"), cfg).await.unwrap();
    let spec = || {
        let mut s = gang(2, "", 1);
        s.resources = Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 100, cpus: 1 });
        s.command = vec!["python3".into(), "-c".into(), RANK.into()];
        s.env.insert("SHARED".into(), shared.display().to_string());
        s
    };
    let a = submit(&c, spec()).await;
    let b = submit(&c, spec()).await;
    // Both gangs meet while both hold their task 0's port.
    muster_testkit::eventually_async("the gangs to meet", WAIT, || async {
        if shared.join(format!("met-{a}")).exists() && shared.join(format!("met-{b}")).exists() {
            return Some(());
        }
        for id in [a, b] {
            let x = crate::t26_e2e::get(&c, id).await;
            assert!(!matches!(status(&x), v1::AllocationStatus::Failed), "gang {id} failed: {x:?}");
        }
        None
    })
    .await;
    let (ga, gb) = (crate::t26_e2e::get(&c, a).await, crate::t26_e2e::get(&c, b).await);
    assert_eq!(ga.tasks[0].node_id, gb.tasks[0].node_id, "best fit, then slot order, puts both task 0s on one node");
    assert_eq!((ga.ports.len(), gb.ports.len()), (1, 1));
    assert_ne!(ga.ports, gb.ports, "two live gangs on one node never share a port");
    std::fs::write(shared.join("go"), "").unwrap();
    for id in [a, b] {
        let done = until(&c, id, "done", |x| status(x) == v1::AllocationStatus::Done).await;
        assert!(done.ports.is_empty(), "ports return with the capacity: {done:?}");
    }
    c.shutdown().await;
}

/// `muster dev` with labelled nodes, driven through the CLI: a constrained
/// gang runs only on matching nodes, a packed gang in one rack, explain
/// names the constraint no node meets, and bad expressions are refused
/// before anything reaches the log.
#[test]
fn t153_constraints_and_packing_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let labels = [
        "node-1:gpu.model=H100",
        "node-1:rack=r1",
        "node-2:gpu.model=A100",
        "node-2:rack=r1",
        "node-3:gpu.model=H100",
        "node-3:rack=r2",
        "node-4:gpu.model=A100",
        "node-4:rack=r2",
    ];
    let args: Vec<String> = labels.iter().flat_map(|l| ["--node-label".to_string(), l.to_string()]).collect();
    let (mut dev, sched, lines) = crate::t30_dev_cli::start_dev(&dir.path().join("dev"), &args);
    std::thread::spawn(move || lines.for_each(drop));
    let td = dir.path().join("dev").join("tls").display().to_string();
    let run = |args: &[&str]| {
        // The connection flags go before the task's command (`-- …`).
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..at].to_vec();
        all.extend(["--scheduler", &sched, "--tls-dir", &td]);
        if at == args.len() {
            all.extend(["--output", "json"]);
        }
        all.extend(&args[at..]);
        crate::muster(&all)
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let o = run(args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    muster_testkit::eventually_blocking("the agents to register", WAIT, || {
        (json(&["node", "list"])["nodes"].as_array().unwrap().iter().filter(|n| n["status"] == "ready").count() >= 4)
            .then_some(())
    });
    let submit = |extra: &[&str]| -> String {
        let mut a = vec!["submit", "--output", "json", "--gpus", "2"];
        a.extend(extra);
        a.extend(["--", "sleep", "30"]);
        let o = run(&a);
        assert!(o.status.success(), "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["id"].as_u64().unwrap().to_string()
    };
    let nodes_of = |id: &str| -> Vec<String> {
        muster_testkit::eventually_blocking(&format!("allocation {id} to run"), WAIT, || {
            let a = json(&["alloc", "get", id]);
            if a["status"] != "running" {
                return Err(a.to_string());
            }
            let mut n: Vec<String> =
                a["tasks"].as_array().unwrap().iter().map(|t| t["node"].as_str().unwrap().to_string()).collect();
            n.sort();
            Ok(n)
        })
    };
    // Only the H100 nodes, for two gangs in a row.
    for _ in 0..2 {
        let id = submit(&["-n", "2", "--constraint", "gpu.model=H100"]);
        assert_eq!(nodes_of(&id), ["node-1", "node-3"]);
    }
    let id = submit(&["--constraint", "gpu.model in (A100,L40S)", "--constraint", "rack!=r1"]);
    assert_eq!(nodes_of(&id), ["node-4"]);
    // One rack for a packed gang of two.
    let id = submit(&["-n", "2", "--pack-by", "rack"]);
    let packed = nodes_of(&id);
    assert!(packed == ["node-1", "node-2"] || packed == ["node-3", "node-4"], "{packed:?}");
    // No node has a B200: explain says so.
    let o = run(&["submit", "--constraint", "gpu.model=B200", "--", "true"]);
    assert_eq!(o.status.code(), Some(1), "refused at submit");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no node has gpu.model=B200; known gpu.model values: A100, H100"), "{err}");
    let id = submit(&["--constraint", "gpu.model=B200", "--queue-if-unsatisfiable"]);
    let e = json(&["alloc", "explain", &id]);
    assert_eq!(
        e["summary"],
        "it can never run on the registered nodes: no node has gpu.model=B200; known gpu.model values: A100, H100",
        "{e}"
    );
    // Bad expressions: a clear error, a non-zero exit, nothing submitted.
    let before = json(&["alloc", "list"])["allocations"].as_array().unwrap().len();
    for (flag, value, message) in [
        ("--constraint", "gpu.model in (H100", "unbalanced '('"),
        ("--constraint", "gpu model=H100", "is not a label key"),
        ("--pack-by", "rack:sometimes", "the mode is required or preferred"),
    ] {
        let o = run(&["submit", flag, value, "--", "true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(message), "{flag} {value}: {err}");
    }
    assert_eq!(json(&["alloc", "list"])["allocations"].as_array().unwrap().len(), before);
    unsafe { libc::kill(dev.id() as i32, libc::SIGINT) };
    let _ = dev.wait();
}

/// The pid of the process running task `task` of allocation `alloc`
/// (its environment names them), if one runs.
fn pid_of(alloc: u64, task: u32) -> Option<i32> {
    let want = [format!("MUSTER_ALLOC_ID={alloc}"), format!("MUSTER_TASK_INDEX={task}")];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        let has = |w: &String| vars.contains(&w.as_bytes());
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (want.iter().all(has) && String::from_utf8_lossy(&cmdline).contains("train.py")).then_some(pid)
    })
}

/// A task's latest attempt log.
fn last_log(c: &LocalCluster, alloc: u64, t: &v1::Task) -> String {
    let i: u32 = t.last_node_id.trim_start_matches("node-").parse::<u32>().unwrap() - 1;
    let path = c.agent_dir(i).join(format!("logs/alloc-{alloc}/task-{}/attempt-{}.out", t.index, t.runs));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every attempt of every rank: its lines about starting, resuming and
/// checkpoints, and Muster's own notes (stderr). What a failure needs.
fn gang_story(c: &LocalCluster, a: &v1::Allocation) -> String {
    let mut out = String::new();
    for t in &a.tasks {
        for run in 1..=t.runs {
            for i in 0..8 {
                let logs = c.agent_dir(i).join(format!("logs/alloc-{}/task-{}", a.id, t.index));
                let Ok(stdout) = std::fs::read_to_string(logs.join(format!("attempt-{run}.out"))) else { continue };
                let stderr = std::fs::read_to_string(logs.join(format!("attempt-{run}.err"))).unwrap_or_default();
                out += &format!("task {} attempt {run} on node-{}:\n", t.index, i + 1);
                let keep =
                    |l: &&str| ["starting", "resumed", "done at", "muster:", "Error"].iter().any(|k| l.contains(k));
                for l in stdout.lines().chain(stderr.lines()).filter(keep) {
                    out += &format!("  {l}\n");
                }
            }
        }
    }
    out + &format!("allocation: {a:?}")
}

/// The parameter digest each rank printed at the end of its last attempt.
fn final_digests(c: &LocalCluster, a: &v1::Allocation) -> Vec<String> {
    a.tasks
        .iter()
        .map(|t| {
            let log = last_log(c, a.id, t);
            let line = log.lines().find(|l| l.contains("params sha256")).unwrap_or_else(|| panic!("{log}"));
            line.rsplit(' ').next().unwrap().to_string()
        })
        .collect()
}

/// The example PyTorch DDP job (gloo, CPU) as a gang of four on a local
/// cluster, with no wrapper: the launcher environment and a reserved port
/// are all it needs. One rank is SIGKILLed mid-run: its peers' collective
/// fails and they exit, the gang is placed again, and every rank resumes
/// from its checkpoint, not from step 0; at the end every rank's
/// parameters are equal. A second gang whose task 0 shares the first's
/// node runs beside it on its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t154_a_pytorch_ddp_gang_resumes_from_its_checkpoints_after_a_rank_is_killed() {
    if !crate::dev_proc::python_imports("torch, torch.distributed", "PyTorch", "python3 -m pip install torch") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalConfig {
        heartbeat: Duration::from_millis(500),
        stop_grace: Duration::from_secs(2),
        rendezvous_ports: free_ports(40),
        ..crate::tls::local_config()
    };
    let c = LocalCluster::start(&dir.path().join("cluster"), cfg).await.unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/torch_ddp/train.py");
    let job = |n: u32, steps: &str| {
        let mut s = gang(n, "", 3);
        s.resources = Some(v1::Resources { gpus: 1, vram_mb: 1_000, mem_mb: 1_000, cpus: 1 });
        s.checkpoint = v1::CheckpointMode::Manual as i32;
        s.command = ["python3", script, "--steps", steps, "--checkpoint-every", "5", "--step-seconds", "0.1"]
            .map(String::from)
            .to_vec();
        s
    };
    let a = submit(&c, job(4, "80")).await;
    let b = submit(&c, job(2, "30")).await;
    let long = Instant::now() + Duration::from_secs(300);
    // Both gangs run; their task 0s share a node, on different ports.
    muster_testkit::eventually_async(
        "the gangs to run together",
        long.saturating_duration_since(Instant::now()),
        || async {
            let (ga, gb) = (crate::t26_e2e::get(&c, a).await, crate::t26_e2e::get(&c, b).await);
            if status(&ga) == v1::AllocationStatus::Running && status(&gb) == v1::AllocationStatus::Running {
                assert_eq!(ga.tasks[0].node_id, gb.tasks[0].node_id);
                assert_ne!(ga.ports, gb.ports);
                Ok(())
            } else {
                Err(format!("{ga:?} {gb:?}"))
            }
        },
    )
    .await;
    // Rank 1 of the big gang has saved step 15: kill it outright.
    let ga = crate::t26_e2e::get(&c, a).await;
    muster_testkit::eventually("rank 1 to reach step 15", long.saturating_duration_since(Instant::now()), || {
        let log = last_log(&c, a, &ga.tasks[1]);
        if log.contains("step 15 ") { Ok(()) } else { Err(log) }
    })
    .await;
    let pid = pid_of(a, 1).expect("rank 1 runs");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    for id in [a, b] {
        let done =
            muster_testkit::eventually_async(&format!("gang {id} to finish"), Duration::from_secs(300), || async {
                let x = crate::t26_e2e::get(&c, id).await;
                match status(&x) {
                    v1::AllocationStatus::Done => Ok(x),
                    v1::AllocationStatus::Failed => panic!("gang {id} failed: {x:?}"),
                    _ => Err(format!("{x:?}")),
                }
            })
            .await;
        let digests = final_digests(&c, &done);
        assert!(digests.iter().all(|d| *d == digests[0]), "every rank ends with the same parameters: {digests:?}");
        if id == a {
            for t in &done.tasks {
                assert!(t.runs >= 2, "the gang ran again after the kill: {done:?}");
                let log = last_log(&c, a, t);
                let step: u32 = log
                    .lines()
                    .find_map(|l| l.split("resumed from step ").nth(1))
                    .unwrap_or_else(|| panic!("task {} did not resume: {}", t.index, gang_story(&c, &done)))
                    .trim()
                    .parse()
                    .unwrap();
                assert!(step >= 10, "task {} resumed from step {step}, not from its checkpoint: {log}", t.index);
            }
        }
    }
    c.shutdown().await;
}
