//! How Muster fits what operators already run: Prometheus (every documented
//! metric exported, every exported one documented), Kubernetes-style probes,
//! grpcurl through gRPC reflection and health, and the dashboard in headless
//! Chromium; all against real `muster dev` and `muster server` processes.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::dev_proc::{Dev, http_get, tool};
use crate::{cluster, tls};

/// `docs/metrics.md`'s tables: metric name → type.
fn documented() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3 && cells[1].starts_with("`muster_") {
            let name = cells[1].trim_matches('`').to_string();
            assert!(out.insert(name.clone(), cells[2].to_string()).is_none(), "{name} documented twice");
        }
    }
    out
}

/// A scrape's `# TYPE` lines: metric name → type, `muster_*` only.
fn exported(scrape: &str) -> BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.starts_with("muster_"))
        .map(|(n, t)| (n.to_string(), t.trim().to_string()))
        .collect()
}

#[test]
fn t120_every_documented_metric_is_exported_and_every_exported_one_documented() {
    let dev = Dev::start();
    // One budget for the two waits below.
    let deadline = Instant::now() + Duration::from_secs(60);
    let left = || deadline.saturating_duration_since(Instant::now());
    muster_testkit::eventually_blocking("the agents' streams and GPUs to show", left(), || {
        let (code, body) = dev.get(0, "/metrics").expect("replica 1 serves HTTP");
        assert_eq!(code, 200, "{body}");
        if body.contains("muster_agent_streams 4") && body.contains("muster_gpus{state=\"free\"} 32") {
            Ok(())
        } else {
            Err(format!("\n{body}"))
        }
    });
    // A running task's usage is exported per task, from its cgroup.
    let id = dev.ok(&["submit", "--gpus", "1", "--", "sleep", "120"])["id"].as_u64().unwrap();
    let series = format!("muster_task_cpu_seconds{{alloc_id=\"{id}\",task=\"0\"}}");
    let scrape = muster_testkit::eventually_blocking(&format!("{series} to show"), left(), || {
        let (_, body) = dev.get(0, "/metrics").expect("replica 1 serves HTTP");
        // A follower's readiness flips off for a moment whenever its applied
        // index trails the committed one (a loaded machine): wait for it too.
        let ready = body.contains("muster_replica_ready{replica=\"2\"} 1");
        if body.contains(&series) && body.contains("muster_task_memory_bytes{") && ready {
            Ok(body)
        } else {
            Err(format!("\n{body}"))
        }
    });
    let docs = documented();
    let live = exported(&scrape);
    assert!(docs.len() >= 40, "the docs table was read: {docs:?}");
    let undocumented: Vec<&String> = live.keys().filter(|k| !docs.contains_key(*k)).collect();
    // Read through NVML only: absent on a machine without it.
    let nvml = std::path::Path::new("/dev/nvidiactl").exists();
    let nvml_only = |k: &str| k.starts_with("muster_task_gpu_");
    let missing: Vec<&String> =
        docs.keys().filter(|k| !live.contains_key(*k) && (nvml || !nvml_only(k.as_str()))).collect();
    assert!(undocumented.is_empty(), "exported but not in docs/metrics.md: {undocumented:?}");
    assert!(missing.is_empty(), "in docs/metrics.md but not exported by muster dev: {missing:?}\n{scrape}");
    for (name, kind) in &live {
        assert_eq!(&docs[name], kind, "{name}: docs/metrics.md says {}, the exporter {kind}", docs[name]);
    }
    // Raft figures are per replica; queue depth per class; one leader.
    for needle in [
        "muster_raft_is_leader{replica=\"1\"}",
        "muster_raft_committed_index{replica=\"3\"}",
        "muster_queue_depth{class=\"10\"} 0",
        "muster_replica_ready{replica=\"2\"} 1",
        "muster_raft_apply_seconds_bucket",
    ] {
        assert!(scrape.contains(needle), "{needle} missing");
    }
    let leaders = scrape.lines().filter(|l| l.starts_with("muster_raft_is_leader{") && l.ends_with(" 1")).count();
    assert_eq!(leaders, 1, "{scrape}");

    // Probes: every replica is live and ready; `/` leads to the dashboard.
    for i in 0..3 {
        let (code, body) = dev.get(i, "/healthz").unwrap();
        assert_eq!((code, body.as_str()), (200, "ok\n"));
        muster_testkit::eventually_blocking(&format!("replica {} to be ready", i + 1), Duration::from_secs(30), || {
            let (code, body) = dev.get(i, "/readyz").unwrap();
            if code == 200 {
                assert!(body.starts_with("ok\nleader "), "{body}");
                Ok(())
            } else {
                Err(body)
            }
        });
    }
    let (code, _) = dev.get(1, "/").unwrap();
    assert_eq!(code, 303, "/ redirects to /ui");
    let (code, _) = dev.get(1, "/nosuch").unwrap();
    assert_eq!(code, 404);
    // Every response is nosniff, unframeable and sends no referrer; the
    // page allows only its own script and style (t123 shows it still runs).
    for path in ["/ui", "/ui/api/overview", "/metrics", "/healthz"] {
        let (_, headers, _) = crate::dev_proc::http_get_with_headers(&dev.http[1], path).unwrap();
        let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or("");
        assert_eq!(get("x-content-type-options"), "nosniff", "{path}: {headers:?}");
        assert_eq!(get("x-frame-options"), "DENY", "{path}: {headers:?}");
        assert_eq!(get("referrer-policy"), "no-referrer", "{path}: {headers:?}");
        let csp = get("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe-inline"), "{path}: {csp}");
        if path == "/ui" {
            assert!(csp.contains("script-src 'sha256-") && csp.contains("connect-src 'self'"), "{csp}");
        }
    }
}

/// A replica that cannot reach a majority has no leader: not ready over
/// HTTP and NOT_SERVING over gRPC health, while still alive.
#[test]
fn t121_a_replica_without_a_leader_is_alive_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let http = format!("127.0.0.1:{}", cluster::free_port());
    // Replicas 2 and 3 never start.
    let peers = format!("1={addr},2=127.0.0.1:1,3=127.0.0.1:2");
    let mut server = Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["server", "--id", "1", "--listen", &addr, "--peers", &peers, "--http", &http])
        .arg("--data-dir")
        .arg(dir.path())
        .env("MUSTER_TLS_DIR", tls::dir())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (code, body) =
        muster_testkit::eventually_blocking("the HTTP listener to answer", Duration::from_secs(60), || {
            http_get(&http, "/readyz")
        });
    // Three rounds of pre-votes have found no quorum (each one election
    // timeout apart, its own metric says so): still no leader.
    muster_testkit::eventually_blocking("three pre-vote rounds to find no quorum", Duration::from_secs(60), || {
        let (_, metrics) = http_get(&http, "/metrics").ok_or("no /metrics")?;
        let rounds = metrics
            .lines()
            .find_map(|l| l.strip_prefix("muster_raft_pre_votes_refused_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if rounds >= 3.0 { Ok(()) } else { Err(format!("{rounds} pre-vote rounds refused")) }
    });
    let (code2, body2) = http_get(&http, "/readyz").unwrap();
    assert_eq!(http_get(&http, "/healthz").map(|r| r.0), Some(200));
    let health = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let channel = muster_tls::endpoint(&addr, Some(&tls::admin())).unwrap().connect().await.unwrap();
        let mut c = tonic_health::pb::health_client::HealthClient::new(channel);
        let overall = c.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
        let raft = c.check(tonic_health::pb::HealthCheckRequest { service: "muster.v1.RaftService".into() }).await;
        let unknown = c.check(tonic_health::pb::HealthCheckRequest { service: "nosuch.Service".into() }).await;
        (overall.into_inner().status, raft.unwrap().into_inner().status, unknown.unwrap_err().code())
    });
    server.kill().unwrap();
    let _ = server.wait();
    assert_eq!(code, 503, "{body}");
    assert_eq!((code2, body2.lines().next()), (503, Some("no leader known")), "{body2}");
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(health.0, ServingStatus::NotServing as i32);
    assert_eq!(health.1, ServingStatus::Serving as i32, "the Raft service serves while the process runs");
    assert_eq!(health.2, tonic::Code::NotFound);
}

/// Issue 27: a test skipped for a missing tool says so in `cargo test`'s
/// default (captured) output, and `MUSTER_REQUIRE_TOOLS` turns the skip into
/// a failure. Runs t122 in this test binary with no grpcurl on PATH.
#[test]
fn t198_a_skip_for_a_missing_tool_is_visible_and_required_tools_fail() {
    let empty = tempfile::tempdir().unwrap();
    let run = |require: bool| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["t84_ecosystem::t122_grpcurl_lists_and_calls_musters_services", "--exact"])
            .env("PATH", empty.path())
            .env_remove("MUSTER_REQUIRE_TOOLS");
        if require {
            cmd.env("MUSTER_REQUIRE_TOOLS", "1");
        }
        cmd.output().unwrap()
    };
    let o = run(false);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("1 passed"), "{out}");
    assert!(
        err.contains("SKIPPED t84_ecosystem::t122_grpcurl_lists_and_calls_musters_services: grpcurl is not installed"),
        "the skip is not in the default output: {err}"
    );
    let o = run(true);
    assert!(!o.status.success(), "a required tool's absence must fail");
    assert!(String::from_utf8_lossy(&o.stdout).contains("MUSTER_REQUIRE_TOOLS is set"));
}

/// grpcurl, with the dev CA, lists every service through reflection,
/// describes them, checks health and calls a method.
#[test]
fn t122_grpcurl_lists_and_calls_musters_services() {
    let Some(grpcurl) = tool("grpcurl") else { return };
    let dev = Dev::start();
    let t = &dev.tls;
    let pem = |f: &str| t.join(f).to_str().unwrap().to_string();
    let creds = [
        "-cacert".to_string(),
        pem("ca.pem"),
        "-cert".into(),
        pem("admin-dev.pem"),
        "-key".into(),
        pem("admin-dev-key.pem"),
        "-authority".into(),
        "server.muster".into(),
    ];
    let addr = dev.sched.split(',').nth(1).unwrap().to_string();
    let run = |args: &[&str]| {
        let o = Command::new(&grpcurl).args(&creds).args(args).output().expect("grpcurl runs");
        (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (ok, list) = run(&[&addr, "list"]);
    assert!(ok, "{list}");
    for svc in [
        "muster.v1.AllocationService",
        "muster.v1.NodeService",
        "muster.v1.AdminService",
        "muster.v1.AgentService",
        "muster.v1.RaftService",
        "grpc.health.v1.Health",
    ] {
        assert!(list.lines().any(|l| l == svc), "{svc} not listed:\n{list}");
    }
    let (ok, desc) = run(&[&addr, "describe", "muster.v1.AllocationService"]);
    assert!(ok && desc.contains("rpc Submit ( .muster.v1.SubmitRequest )"), "{desc}");
    let (ok, desc) = run(&[&addr, "describe", "muster.v1.AllocationSpec"]);
    assert!(ok && desc.contains("preemption_class"), "{desc}");
    let (ok, health) = run(&[&addr, "grpc.health.v1.Health/Check"]);
    assert!(ok && health.contains("\"status\": \"SERVING\""), "{health}");
    let (ok, status) = run(&["-d", "{}", &addr, "muster.v1.AdminService/Status"]);
    assert!(ok && status.contains("\"stateDigest\"") && status.contains("\"role\""), "{status}");
    // Without a client certificate the TLS handshake is refused.
    let o = Command::new(&grpcurl)
        .args(["-cacert", &pem("ca.pem"), "-authority", "server.muster", &addr, "list"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a caller without a certificate listed services");
}

/// The DOM of `url` after its scripts ran for a few (virtual) seconds, as
/// headless Chromium sees it.
fn chromium_dom(chromium: &std::path::Path, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Long enough for the page's 2 s poll to redraw it more than once.
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs");
    assert!(o.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The text of the element with `id` up to its closing `</tr>` (a table
/// row), if the DOM has it.
fn row<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    Some(&dom[start..end])
}

/// The dashboard in headless Chromium: it loads, shows the four dev nodes
/// and the three replicas, redraws itself, and reflects a submitted gang
/// (running, with its nodes), a pending one (queued, with its reason) and
/// one waiting for the first (what it waits for, and where that stands).
#[test]
fn t123_the_dashboard_in_headless_chromium_shows_nodes_and_a_submitted_gang() {
    let Some(chromium) = tool("chromium") else { return };
    let dev = Dev::start();
    let url = format!("http://{}/ui", dev.http[1]);
    let dom = chromium_dom(&chromium, &url);
    assert!(dom.contains("<title>Muster</title>"), "{dom}");
    for n in 1..=4 {
        let r = row(&dom, &format!("nodes-node-{n}")).unwrap_or_else(|| panic!("node-{n} missing:\n{dom}"));
        assert!(r.contains(">ready<") && r.contains("0/8"), "{r}");
    }
    for id in 1..=3 {
        assert!(row(&dom, &format!("replicas-{id}")).is_some(), "replica {id} missing:\n{dom}");
    }
    assert_eq!(dom.matches(">leader<").count(), 1, "one leader:\n{dom}");
    assert!(dom.contains("nothing running") && dom.contains("nothing queued"), "{dom}");
    assert!(dom.contains("nothing waits for a dependency") && dom.contains("no live arrays"), "{dom}");
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(refreshes >= 2, "the page redraws itself ({refreshes} times):\n{dom}");

    let submit = |args: &[&str]| dev.json(args)["id"].as_u64().unwrap_or_else(|| panic!("submit {args:?}"));
    let running = submit(&["submit", "--gang-size", "4", "--gpus", "2", "--class", "5", "--", "sleep", "300"]);
    let pending = submit(&[
        "submit",
        "--gang-size",
        "5",
        "--gpus",
        "8",
        "--class",
        "3",
        "--queue-if-unsatisfiable",
        "--",
        "true",
    ]);
    let dependent = submit(&["submit", "--after", &running.to_string(), "--gpus", "0", "--", "true"]);
    let array = submit(&["submit", "--array", "0-9%1", "--name", "sweep", "--gpus", "0", "--", "sleep", "300"]);
    muster_testkit::eventually_blocking("the dashboard to show the gangs", Duration::from_secs(90), || {
        let dom = chromium_dom(&chromium, &url);
        let r = row(&dom, &format!("running-{running}"));
        let q = row(&dom, &format!("queue-{pending}"));
        if let (Some(r), Some(q)) = (r, q)
            && r.contains(">running<")
        {
            let w = row(&dom, &format!("waiting-{dependent}")).unwrap_or_else(|| panic!("no waiting row:\n{dom}"));
            assert!(w.contains(&format!("{running} to succeed")) && w.contains(&format!("{running} (running")), "{w}");
            assert!((1..=4).all(|n| r.contains(&format!("node-{n}"))), "on all four nodes: {r}");
            assert!(
                q.contains(">queued<") && q.contains("it can never run on the registered nodes: the gang of 5"),
                "{q}"
            );
            assert!(row(&dom, "nodes-node-1").unwrap().contains("2/8"), "{dom}");
            assert!(dom.contains("GPUs 24 free / 0 reserved / 8 running"), "{dom}");
            // The array is one row: its indices, throttle and counts.
            let a = row(&dom, &format!("arrays-{array}")).unwrap_or_else(|| panic!("no array row:\n{dom}"));
            assert!(a.contains(">sweep<") && a.contains(">0-9<") && a.contains("9 pending"), "{a}");
            return Ok(());
        }
        Err(format!("\n{dom}"))
    });
}

/// `muster agent --keep-tasks` (what the systemd unit runs, with
/// KillMode=process): the agent exits and a new one starts on the same work
/// dir while tasks run. A task still running is reattached (same attempt,
/// later finishes and is recorded done); a task that ended while no agent
/// ran is reported with the exit code its shim recorded. Each task's daemon
/// (escaped with setsid) is found through the attempt's cgroup: killed
/// before the ended task is reported, and with the adopted task when it
/// ends (issue 46). The tasks run as an unprivileged account, under the
/// root shim `muster task-exec --status` (issue 46).
#[test]
fn t124_tasks_survive_an_agent_restart_and_the_next_agent_reattaches() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let _server = crate::Procs::start(dir.path(), &addr, &["--agent-heartbeat-ms", "500"], &[]);
    tls::material(muster_tls::Role::Agent("k1".into()));
    let work = dir.path().join("k1");
    // The tasks' account reaches the work dir, and leaves its files in a
    // directory it may write.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let agent = || {
        Command::new(env!("CARGO_BIN_EXE_muster"))
            .args([
                "agent",
                "--scheduler",
                &addr,
                "--node-id",
                "k1",
                "--gpus",
                "2",
                "--vram-mb",
                "1000",
                "--keep-tasks",
                "--task-user",
                "60300:60300",
            ])
            .arg("--work-dir")
            .arg(&work)
            .env("MUSTER_TLS_DIR", tls::dir())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let get = |id: &str| -> serde_json::Value {
        let o = crate::muster(&["alloc", "get", id, "--scheduler", &addr, "--output", "json"]);
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
    };
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        muster_testkit::eventually_blocking(what, Duration::from_secs(90), || ok().then_some(()));
    };
    let mut first = agent();
    // Each task starts a daemon that leaves its process group (setsid)
    // and ignores SIGTERM, leaves its pid, then waits for its release file
    // and exits with the code in its name.
    let script = |code: u32| {
        format!(
            "cd {}; setsid sh -c 'trap \"\" TERM; echo $$ > esc-$MUSTER_ALLOC_ID.tmp; mv esc-$MUSTER_ALLOC_ID.tmp esc-$MUSTER_ALLOC_ID; \
             while :; do sleep 1; done' & \
             echo $$ > pid-$MUSTER_ALLOC_ID; while [ ! -f release-$MUSTER_ALLOC_ID ]; do sleep 0.1; done; exit {code}",
            shared.display()
        )
    };
    for (key, code) in [("keep-1", 0), ("keep-2", 3)] {
        let s = script(code);
        let args =
            ["submit", "--gpus", "1", "--max-retries", "0", "--idempotency-key", key, "--scheduler", &addr, "--"];
        wait_for("a submit to succeed", &|| crate::muster(&[&args[..], &["sh", "-c", &s]].concat()).status.success());
    }
    let read_pid = |name: String| std::fs::read_to_string(shared.join(name)).ok()?.trim().parse::<i32>().ok();
    let pid = |id: u32| read_pid(format!("pid-{id}"));
    let esc = |id: u32| read_pid(format!("esc-{id}"));
    wait_for("both tasks to run", &|| {
        get("1")["status"] == "running"
            && get("2")["status"] == "running"
            && [pid(1), pid(2), esc(1), esc(2)].iter().all(Option::is_some)
    });
    let (p1, p2, e1, e2) = (pid(1).unwrap(), pid(2).unwrap(), esc(1).unwrap(), esc(2).unwrap());
    for p in [p1, e1] {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
        assert!(status.contains("\nUid:\t60300\t60300\t60300\t60300\n"), "{p} runs as the task account:\n{status}");
    }

    // The agent exits (SIGTERM, as systemd stops it); the tasks do not.
    // SAFETY: signals our own child.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    assert!(first.wait().unwrap().success(), "the agent exits cleanly on SIGTERM");
    let alive = muster_agent::executor::alive;
    assert!(alive(p1) && alive(p2) && alive(e1) && alive(e2), "the tasks and their daemons outlive the agent");
    // Task 2 ends while no agent runs; its daemon runs on.
    std::fs::write(shared.join("release-2"), "").unwrap();
    wait_for("task 2 to exit", &|| !alive(p2));
    assert!(alive(e2));

    // The next agent finds task 2's daemon through its cgroup and kills it
    // before it reports the task's end.
    let mut second = agent();
    wait_for("allocation 2 to fail with the code it exited with", &|| get("2")["status"] == "failed");
    assert!(!alive(e2), "the daemon of a task that ended while no agent ran outlived the next agent's report");
    assert!(alive(e1), "the adopted task's daemon runs on with it");
    let a2 = get("2");
    assert_eq!(a2["tasks"][0]["exit_code"], 3, "{a2}");
    let a1 = get("1");
    assert_eq!(a1["status"], "running", "task 1 was reattached, not failed: {a1}");
    assert_eq!(a1["tasks"][0]["attempts"], 1, "{a1}");
    std::fs::write(shared.join("release-1"), "").unwrap();
    wait_for("allocation 1 to finish", &|| get("1")["status"] == "done");
    assert!(!alive(e1), "the adopted task's daemon died with it");
    let a1 = get("1");
    assert_eq!((a1["tasks"][0]["attempts"].as_u64(), a1["tasks"][0]["runs"].as_u64()), (Some(1), Some(1)), "{a1}");
    let _ = second.kill();
    let _ = second.wait();
}

/// The repository root.
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The Python client's own suite (`clients/python/tests`, pytest) against a
/// real `muster dev` of this build. Needs the package installed
/// (`pip install -e 'clients/python[test]'`, which `.ci/run` does).
#[test]
fn t125_the_python_client_suite_passes() {
    let install = "python3 -m pip install -e 'clients/python[test]'";
    if !crate::dev_proc::python_imports("muster_client, grpc", "the Python client", install)
        || !crate::dev_proc::python_imports("pytest", "pytest (the client's test extra)", install)
    {
        return;
    }
    let o = Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "clients/python/tests"])
        .current_dir(repo())
        .env("MUSTER_BIN", env!("CARGO_BIN_EXE_muster"))
        .output()
        .unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}");
    assert!(out.contains(" passed"), "{out}");
    eprintln!("{}", out.lines().last().unwrap_or_default());
}

/// `deploy/check.sh`: the Kubernetes manifests against the schemas, the
/// systemd units, every flag they pass, the dashboard and alert rules
/// against docs/metrics.md.
#[test]
fn t126_the_deploy_material_validates() {
    if tool("kubernetes-validate").is_none() {
        return;
    }
    let o =
        Command::new("bash").arg(repo().join("deploy/check.sh")).arg(env!("CARGO_BIN_EXE_muster")).output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}");
    assert!(out.contains("manifests valid (strict)") && out.contains("monitoring:"), "{out}");
}

/// The probe's dashboard flood: 100 clients asking the leader's
/// `/ui/api/overview` about 330 times a second, with 1,000 gangs queued,
/// moved the term from 1 to 5 (every request rebuilt the view: ten
/// explanations and a TLS channel to each peer, on the runtime that runs
/// Raft). Now the view is built at most once per `--ui-refresh-ms`, on the
/// listener's own runtime: under the same flood (the per-client rate limit
/// lifted, so every request is served) the leader and its term stay, a
/// reader's `Get`s all succeed, and the view was built about once a second.
#[test]
fn t183_a_dashboard_flood_does_not_depose_the_leader() {
    use muster_proto::v1;
    use muster_proto::v1::admin_service_client::AdminServiceClient;
    use muster_proto::v1::allocation_service_client::AllocationServiceClient;
    let dev = Dev::start_with(&["--http-rate", "100000"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let admin = muster_tls::TlsMaterial::load_for_client(&dev.tls, None).unwrap();
    let addrs: Vec<String> = dev.sched.split(',').map(str::to_string).collect();
    let status = |i: usize| {
        rt.block_on(async {
            let c = cluster::channel_as(&addrs[i], &admin).await?;
            AdminServiceClient::new(c).status(v1::StatusRequest {}).await.ok().map(|r| r.into_inner())
        })
    };
    let leader = status(0).expect("replica 1 answers").leader_id;
    assert!(leader > 0, "a leader");
    let li = leader as usize - 1;
    let term_before = status(li).unwrap().term;
    // One gang holds every GPU; a thousand lower-class gangs queue behind it.
    let spec = |class: u32| v1::AllocationSpec {
        gang_size: 4,
        resources: Some(v1::Resources { gpus: 8, cpus: 1, mem_mb: 64, vram_mb: 0 }),
        preemption_class: class,
        command: vec!["sleep".into(), "600".into()],
        ..Default::default()
    };
    let channel = rt.block_on(cluster::channel_as(&addrs[li], &admin)).unwrap();
    let first = rt.block_on(async {
        let mut c = AllocationServiceClient::new(channel.clone());
        let first = c
            .submit(v1::SubmitRequest { spec: Some(spec(5)), dry_run: false, ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .id;
        for chunk in 0..20 {
            let calls: Vec<_> = (0..50)
                .map(|_| {
                    let mut c = c.clone();
                    tokio::spawn(async move {
                        c.submit(v1::SubmitRequest { spec: Some(spec(3)), dry_run: false, ..Default::default() }).await
                    })
                })
                .collect();
            for call in calls {
                let r = call.await.unwrap();
                assert!(r.is_ok(), "submit in chunk {chunk}: {r:?}");
            }
        }
        first
    });
    let overview = |addr: &str| -> serde_json::Value {
        let (code, body) = http_get(addr, "/ui/api/overview").expect("the listener answers");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    crate::dev_proc::wait_until("the dashboard shows 1,000 queued", || {
        overview(&dev.http[li])["queue"]["total"].as_u64() == Some(1000)
    });
    let builds = |addr: &str| -> u64 {
        let (_, m) = http_get(addr, "/metrics").unwrap();
        let line = m.lines().find(|l| l.starts_with("muster_ui_overview_builds_total ")).unwrap_or("x 0");
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
    };
    let builds_before = builds(&dev.http[li]);

    // The flood: 100 clients, one request every 300 ms each, 40 each.
    let start = Instant::now();
    let target = dev.http[li].clone();
    let flood: Vec<_> = (0..100)
        .map(|_| {
            let target = target.clone();
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                for _ in 0..40 {
                    let t = Instant::now();
                    codes.push(http_get(&target, "/ui/api/overview").map_or(0, |r| r.0));
                    std::thread::sleep(Duration::from_millis(300).saturating_sub(t.elapsed()));
                }
                codes
            })
        })
        .collect();
    // A reader meanwhile, as in the probe.
    let (mut ok, mut failed) = (0, Vec::new());
    rt.block_on(async {
        let mut c = AllocationServiceClient::new(channel.clone());
        while flood.iter().any(|h| !h.is_finished()) {
            match c.get(v1::GetRequest { id: first }).await {
                Ok(_) => ok += 1,
                Err(e) => failed.push(format!("{}: {}", e.code(), e.message())),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let codes: Vec<u16> = flood.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed();
    let served = codes.iter().filter(|c| **c == 200).count();
    assert_eq!(
        served,
        4000,
        "every request was served: {:?}",
        codes.iter().filter(|c| **c != 200).take(5).collect::<Vec<_>>()
    );
    let after = status(li).unwrap();
    assert_eq!((after.leader_id, after.term), (leader, term_before), "no election during the flood");
    assert!(failed.is_empty() && ok > 0, "the reader's Gets: {ok} OK, failed {failed:?}");
    let built = builds(&dev.http[li]) - builds_before;
    let most = elapsed.as_secs() + 2;
    assert!(built <= most, "{built} views built in {elapsed:?} (at most one a second)");
    eprintln!("flood: {} requests in {elapsed:?}, {built} views built, {ok} reads", codes.len());
}

/// One HTTP/1.0 GET from source address `from` with extra request headers:
/// (status, headers lower-cased, body).
fn get_from(from: &str, addr: &str, path: &str, extra: &[(&str, &str)]) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut s = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(addr.parse().unwrap()).await.unwrap().into_std().unwrap()
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    write!(s, "{req}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (code, headers, body.to_string())
}

/// `--http-token-file`: the dashboard, its API and `/metrics` need the
/// token (as a bearer header, or the cookie `/ui?token=` sets and then
/// takes out of the address bar); probes stay open. `--http-rate`: one
/// address over its rate is answered 429 while another is served.
#[test]
fn t184_the_dashboard_token_and_the_per_client_rate() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", cluster::free_port());
    let http = format!("127.0.0.1:{}", cluster::free_port());
    let token = "t0ken-for-the-dashboard.x";
    let token_file = dir.path().join("ui-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let weak = dir.path().join("weak");
    std::fs::write(&weak, "short").unwrap();
    let refused = crate::muster(&[
        "server",
        "--id",
        "1",
        "--listen",
        &addr,
        "--http",
        &http,
        "--data-dir",
        "/nonexistent/x",
        "--http-token-file",
        weak.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("--http-token-file") && err.contains("16 to 256"), "{err}");
    let mut server = Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["server", "--id", "1", "--listen", &addr, "--peers", &format!("1={addr}"), "--http", &http])
        .args(["--http-rate", "5", "--http-token-file"])
        .arg(&token_file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("MUSTER_TLS_DIR", tls::dir())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    crate::dev_proc::wait_until("the HTTP listener answers", || http_get(&http, "/healthz").is_some());
    let get = |path: &str, extra: &[(&str, &str)]| get_from("127.0.0.1", &http, path, extra);
    let header = |h: &[(String, String)], k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (code, h, _) = get("/ui", &[]);
    assert_eq!(code, 401);
    assert_eq!(header(&h, "www-authenticate").as_deref(), Some("Bearer realm=\"muster\""));
    assert_eq!(get("/metrics", &[]).0, 401, "metrics need the token too");
    assert_eq!(get("/ui?token=wrong-token-0123456789", &[]).0, 401);
    let bearer = format!("Bearer {token}");
    let (code, _, body) = get("/ui/api/overview", &[("Authorization", &bearer)]);
    assert_eq!(code, 200, "{body}");
    let (code, h, _) = get(&format!("/ui?token={token}"), &[]);
    assert_eq!(code, 303);
    assert_eq!(header(&h, "location").as_deref(), Some("/ui"), "the token leaves the address bar");
    let cookie = header(&h, "set-cookie").unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    assert_eq!(get("/ui", &[("Cookie", &pair)]).0, 200);
    assert_eq!(get("/ui", &[("Cookie", "muster_ui=not-the-token-at-all")]).0, 401);
    let stale = [("Cookie", "muster_ui=not-the-token-at-all")];
    assert_eq!(get(&format!("/ui?token={token}"), &stale).0, 303, "a stale cookie does not block a new login");
    assert_eq!(get("/healthz", &[]).0, 200, "probes need no token");

    // Another address floods: past its burst (10 at 5/s) it gets 429 with
    // Retry-After, and this address is still served.
    let start = Instant::now();
    let codes: Vec<(u16, Option<String>)> = (0..30)
        .map(|_| {
            let (c, h, _) = get_from("127.0.0.2", &http, "/ui", &[("Authorization", &bearer)]);
            (c, header(&h, "retry-after"))
        })
        .collect();
    let served = codes.iter().filter(|(c, _)| *c == 200).count();
    let allowed = 10 + (start.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    assert!(served >= 10 && served <= allowed, "{served} served of 30 (at most {allowed})");
    assert!(codes.iter().all(|(c, r)| *c == 200 || (*c == 429 && r.as_deref() == Some("1"))), "{codes:?}");
    assert_eq!(get("/ui", &[("Authorization", &bearer)]).0, 200, "127.0.0.1 has its own bucket");
    assert_eq!(get_from("127.0.0.2", &http, "/healthz", &[]).0, 200, "probes are not limited");
    server.kill().unwrap();
    let _ = server.wait();
}
