//! The README's shell blocks, run as written (issue 27). The blocks are
//! read from `README.md` when the tests run, so a block that changes is
//! tested as changed, and a command that stops working fails here, naming
//! the command and its output.
//!
//! What a test changes in a block, and why:
//! - placeholders a reader fills in (`…`, `HTTP_PORT`, `GRPC_ADDR`) get the
//!   values `muster dev` printed, as the README says to;
//! - fixed ports (`127.0.0.1:700N`) and paths (`/tmp/muster`,
//!   `/var/lib/muster`, `~`) move to free ports and a temporary directory,
//!   so that tests never collide;
//! - `./target/release/muster` and `cargo run --release --bin muster --`
//!   become the binary this test run built (the same source), and
//!   `cargo build`/`cargo bench` lines are checked against the workspace's
//!   targets instead of being run inside a test.
//!
//! Each command runs in one bash session, in order. A command that fails is
//! tried again for a while before the test fails, as a reader types the
//! next command a moment later (a server just started in the background
//! may not answer yet). The Python block runs as written against `muster
//! dev` (t187).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::free_port;
use crate::dev_proc::{Dev, python_imports, tool};

const README: &str = include_str!("../../../README.md");

/// The repository's root (the README's commands run there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli/ has a parent").to_path_buf()
}

/// The fenced ```sh blocks under the `## section` heading, in order.
fn blocks(section: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current = "";
    // Inside a fence: whether it is a sh block, and its text so far.
    let mut fence: Option<(bool, String)> = None;
    for line in README.lines() {
        match &mut fence {
            Some((sh, text)) if line.starts_with("```") => {
                if *sh && current == section {
                    found.push(std::mem::take(text));
                }
                fence = None;
            }
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None if line.starts_with("```") => fence = Some((line.trim() == "```sh", String::new())),
            None => {
                if let Some(h) = line.strip_prefix("## ") {
                    current = h.trim();
                }
            }
        }
    }
    assert!(!found.is_empty(), "README has no sh blocks under ## {section}");
    found
}

/// A block as the commands an interactive shell runs one at a time: a
/// line, joined with the next while it ends in `\` or opens a loop that
/// has not reached its `done`. Blank lines and comment lines are dropped.
fn commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut depth = 0i32;
    for line in block.lines() {
        if pending.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        pending.push_str(line);
        pending.push('\n');
        // Loop keywords count outside a trailing comment only.
        let code = line.split(" #").next().unwrap_or(line);
        let words: Vec<&str> = code.split(|c: char| c.is_whitespace() || c == ';').collect();
        depth += words.iter().filter(|w| **w == "do").count() as i32;
        depth -= words.iter().filter(|w| **w == "done").count() as i32;
        if depth == 0 && !line.trim_end().ends_with('\\') {
            out.push(std::mem::take(&mut pending).trim_end().to_string());
        }
    }
    assert!(pending.is_empty(), "an unfinished command at the end of a block: {pending}");
    out
}

/// What one command printed.
#[derive(Debug)]
struct Ran {
    command: String,
    stdout: String,
}

/// Runs `commands` in one bash session in `dir`, with `env` set and `path`
/// first on PATH. A command that fails is tried again every half second
/// for up to `patience`; the test fails naming a command that never
/// succeeded. Whatever the commands left running in the background is
/// killed at the end.
fn run_session(commands: &[String], dir: &Path, env: &[(&str, String)], path: &Path, patience: Duration) -> Vec<Ran> {
    let out = tempfile::tempdir().unwrap();
    let mut script = String::from(
        "set -u\n\
         __try() {\n\
           local deadline=$((SECONDS + PATIENCE))\n\
           echo \"$2\" > \"$OUT/current\"\n\
           until \"$1\" > \"$OUT/$2.out\" 2> \"$OUT/$2.err\"; do\n\
             if [ $SECONDS -ge $deadline ]; then echo \"$2\" > \"$OUT/failed\"; exit 1; fi\n\
             sleep 0.5\n\
           done\n\
         }\n",
    );
    for (i, c) in commands.iter().enumerate() {
        script.push_str(&format!("__c{i}() {{\n{c}\n}}\n__try __c{i} {i}\n"));
    }
    script.push_str("echo done > \"$OUT/finished\"\n");
    let path_var = format!("{}:{}", path.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env_remove("MUSTER_SCHEDULER")
        .env_remove("MUSTER_TLS_DIR")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PATH", path_var)
        .env("OUT", out.path())
        .env("PATIENCE", patience.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let mut stderr = String::new();
    let _ = child.stderr.take().expect("piped").read_to_string(&mut stderr);
    let status = child.wait().expect("bash ends");
    // The servers a block started in the background.
    // SAFETY: kills the process group this test created.
    unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
    let read = |name: String| std::fs::read_to_string(out.path().join(name)).unwrap_or_default();
    if let Ok(i) = read("failed".into()).trim().parse::<usize>() {
        panic!(
            "README command failed (tried for {patience:?}):\n{}\n--- stdout\n{}--- stderr\n{}",
            commands[i],
            read(format!("{i}.out")),
            read(format!("{i}.err"))
        );
    }
    assert!(status.success() && !read("finished".into()).is_empty(), "the session did not finish: {stderr}");
    commands.iter().enumerate().map(|(i, c)| Ran { command: c.clone(), stdout: read(format!("{i}.out")) }).collect()
}

/// A directory holding `muster`: the binary this test run built.
fn muster_on_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_muster"), bin.join("muster")).unwrap();
    bin
}

/// Three consecutive free ports `N1`, `N2`, `N3` (for `127.0.0.1:700N`):
/// returns the `N`.
fn free_port_decade() -> u16 {
    loop {
        let decade = free_port() / 10;
        if !(1000..=6000).contains(&decade) {
            continue;
        }
        let free = (1..=3).all(|i| std::net::TcpListener::bind(("127.0.0.1", decade * 10 + i)).is_ok());
        if free {
            return decade;
        }
    }
}

/// The set-up block's commands, which CI and t90 run.
#[test]
fn t171_the_setup_commands_are_what_ci_and_the_demo_test_run() {
    let setup = blocks("Set-up on a fresh machine");
    assert_eq!(setup.len(), 2, "exactly two set-up commands: {setup:?}");
    assert_eq!(commands(&setup[0]), [format!("cargo run --bin muster -- {}", demo_args().join(" "))]);
    assert_eq!(commands(&setup[1]), ["cargo test --workspace"]);
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim().starts_with("cargo test --workspace")), ".ci/run runs the README's tests");
}

/// The arguments the README's main command gives `muster` (t90 runs them).
pub fn demo_args() -> Vec<String> {
    let setup = blocks("Set-up on a fresh machine");
    let main = commands(&setup[0]).remove(0);
    let args = main.strip_prefix("cargo run --bin muster -- ").expect("the main command runs the muster binary");
    args.split_whitespace().map(str::to_string).collect()
}

/// "Run a three-replica cluster": certificates, three servers, a submit,
/// the status in text and JSON, a token.
#[test]
fn t172_the_readme_three_replica_cluster_runs() {
    let block = blocks("Run a three-replica cluster").remove(0);
    let dir = tempfile::tempdir().unwrap();
    // It stands for /tmp/muster, which tasks' accounts can reach.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let decade = free_port_decade();
    let text = block
        .replace("./target/release/muster", env!("CARGO_BIN_EXE_muster"))
        .replace("127.0.0.1:700", &format!("127.0.0.1:{decade}"))
        .replace("/tmp/muster", &dir.path().display().to_string());
    let mut cmds = commands(&text);
    assert_eq!(cmds.remove(0), "cargo build --release --bin muster", "the block builds the binary first");
    assert!(cmds.iter().all(|c| !c.contains("cargo ")), "no other cargo command: {cmds:?}");
    let bin = muster_on_path(dir.path());
    let ran = run_session(&cmds, &root(), &[("HOME", dir.path().display().to_string())], &bin, Duration::from_secs(60));
    let out = |needle: &str| &ran.iter().find(|r| r.command.contains(needle)).expect(needle).stdout;
    assert!(out("cluster status ").contains("leader"), "{}", out("cluster status "));
    let status: serde_json::Value = serde_json::from_str(out("--output json")).expect("cluster status JSON");
    assert_eq!(status["replicas"].as_array().map(Vec::len), Some(3), "{status}");
    // The agents ran the gang to its end, rank 1 on its own node.
    assert!(out("alloc watch 1").contains("allocation_done"), "{}", out("alloc watch 1"));
    let list = out("alloc list");
    let header = list.lines().next().unwrap_or_default();
    for column in ["NAME", "SUBMITTED", "STARTED", "ELAPSED", "NODES"] {
        assert!(header.contains(column), "alloc list shows {column}:\n{list}");
    }
    assert!(list.contains("hello") && list.contains("done") && list.contains("node-"), "{list}");
    // A root agent ran it as the account it was given, not as root.
    let me =
        if unsafe { libc::geteuid() } == 0 { "nobody".to_string() } else { std::env::var("USER").unwrap_or_default() };
    assert!(
        out("alloc logs 1").contains(&format!("rank 1 of 2 as {me}, rendezvous 127.0.0.1:")),
        "{}",
        out("alloc logs 1")
    );
    assert!(out("token create").to_lowercase().contains("token"), "{}", out("token create"));
}

/// "More to run", against `muster dev` as the README says: a real PyTorch
/// DDP gang to completion, its logs, a pending gang explained, a dry run
/// naming victims, a cancel, node drain, scale-down, vClusters, the
/// history, usage, completions; then the dashboard, metrics, grpcurl,
/// backup and restore block; then a dev cluster with vClusters.
#[test]
fn t173_the_readme_more_to_run_blocks_run_against_muster_dev() {
    if !python_imports("torch, torch.distributed", "PyTorch", "python3 -m pip install torch") {
        return;
    }
    let more = blocks("More to run");
    let (tour, vclusters, web) = (&more[0], &more[1], &more[2]);
    let dev = Dev::start();
    let dir = tempfile::tempdir().unwrap();
    let bin = muster_on_path(dir.path());
    let tls = dev.tls.display().to_string();
    let env = [
        ("HOME", dir.path().display().to_string()),
        ("MUSTER_SCHEDULER", dev.sched.clone()),
        ("MUSTER_TLS_DIR", tls.clone()),
        ("MUSTER_LEADER_CACHE", "off".to_string()),
    ];
    let text = tour
        .replace("export MUSTER_SCHEDULER=…", &format!("export MUSTER_SCHEDULER={}", dev.sched))
        .replace("export MUSTER_TLS_DIR=…", &format!("export MUSTER_TLS_DIR={tls}"));
    assert!(!text.contains('…'), "every placeholder of the tour is filled:\n{text}");
    let ran = run_session(&commands(&text), &root(), &env, &bin, Duration::from_secs(60));
    let out = |needle: &str| &ran.iter().find(|r| r.command.contains(needle)).expect(needle).stdout;
    assert!(out("alloc watch 1").contains("allocation_done"), "the DDP gang finished:\n{}", out("alloc watch 1"));
    let got: serde_json::Value = serde_json::from_str(out("alloc get 1")).expect("alloc get JSON");
    assert_eq!(got["status"], "done", "{got}");
    assert_eq!(got["owner"], "dev", "the owner is the verified identity muster dev gives you (admin-dev): {got}");
    assert!(out("alloc explain 3").contains("waiting"), "{}", out("alloc explain 3"));
    assert!(out("--dry-run --gang-size 4").contains("victim"), "the dry run names victims:\n{}", out("--dry-run"));
    assert!(out("vcluster list").contains("ml"), "{}", out("vcluster list"));
    assert!(out("--array 0-99%8").contains("elements"), "{}", out("--array 0-99%8"));
    let wf = out("--workflow examples/torch_pipeline");
    assert!(wf.contains("workflow") && wf.contains("train"), "{wf}");
    assert!(out("history --since").lines().count() >= 3, "a header and two records:\n{}", out("history --since"));
    let completions = dir.path().join(".local/share/bash-completion/completions/muster");
    assert!(std::fs::read_to_string(&completions).is_ok_and(|s| s.contains("muster")), "completions written");

    // The dashboard, metrics, grpcurl, backup and restore.
    let grpc = dev.sched.split(',').next().unwrap().to_string();
    let http_port = dev.http[0].rsplit(':').next().unwrap().to_string();
    let mut cmds = commands(&web.replace("HTTP_PORT", &http_port).replace("GRPC_ADDR", &grpc));
    // The install line names what CI installs; a test does not install.
    let install = cmds.iter().position(|c| c.starts_with("python3 -m pip install")).expect("grpcurl's install line");
    let package = cmds.remove(install).split_whitespace().nth(4).unwrap_or_default().to_string();
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(!package.is_empty() && ci.contains(&package), "the README installs grpcurl as CI does: {package}");
    if tool("grpcurl").is_none() {
        cmds.retain(|c| !c.starts_with("grpcurl"));
    }
    // Outputs go to the temporary directory the block makes, not the
    // repository (the session runs in the repository's root).
    let tmp = tempfile::tempdir().unwrap();
    let before = git_status();
    let ran = run_session(
        &cmds,
        &root(),
        &[env.as_slice(), &[("TMPDIR", tmp.path().display().to_string())]].concat(),
        &bin,
        Duration::from_secs(30),
    );
    let out = |needle: &str| &ran.iter().find(|r| r.command.contains(needle)).expect(needle).stdout;
    assert!(out("/metrics").contains("muster_raft_term"), "Prometheus text");
    if let Some(r) = ran.iter().find(|r| r.command.starts_with("grpcurl")) {
        assert!(r.stdout.contains("muster.v1.AllocationService"), "{}", r.stdout);
    }
    let made: Vec<PathBuf> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.path()).collect();
    let restored = made.iter().map(|d| d.join("restored-1")).find(|d| d.is_dir()).expect("restored under $T");
    assert!(restored.read_dir().is_ok_and(|mut d| d.next().is_some()), "the restore wrote {}", restored.display());
    assert_eq!(git_status(), before, "the blocks leave nothing in the repository");
    drop(dev);

    // A dev cluster with vClusters: its flags, as the README gives them.
    let line = commands(vclusters).remove(0);
    let args: Vec<&str> = line.strip_prefix("muster dev ").expect("a muster dev line").split_whitespace().collect();
    let dev = Dev::start_with(&args);
    let names: Vec<String> = dev.ok(&["vcluster", "list"])["vclusters"]
        .as_array()
        .expect("vClusters")
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    for name in ["ml", "batch"] {
        assert!(names.iter().any(|n| n == name), "{name} created: {names:?}");
    }
}

/// `git status --porcelain` of the repository (empty outside a checkout).
fn git_status() -> String {
    Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=all"])
        .current_dir(root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The README's Python block, run as written against `muster dev` with the
/// environment the tour exported: the gang it submits runs to its end.
#[test]
fn t187_the_readme_python_block_runs_against_muster_dev() {
    if !python_imports("muster_client, grpc", "the Python client", "python3 -m pip install -e 'clients/python[test]'") {
        return;
    }
    let mut found = None;
    let mut section = "";
    let mut lines = README.lines();
    while let Some(line) = lines.next() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.trim();
        } else if line.trim() == "```python" && section == "More to run" {
            found = Some(lines.by_ref().take_while(|l| !l.starts_with("```")).collect::<Vec<_>>().join("\n"));
            break;
        }
    }
    let code = found.expect("a python block under ## More to run");
    let dev = Dev::start();
    let o = Command::new("python3")
        .args(["-c", &code])
        .current_dir(root())
        .env("MUSTER_SCHEDULER", &dev.sched)
        .env("MUSTER_TLS_DIR", &dev.tls)
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the Python block failed:\n{out}{err}");
    assert!(out.contains("allocation_done") || out.contains("done"), "its events, to the end:\n{out}");
    let listed = dev.ok(&["alloc", "list", "--name", "from-python"]);
    let all = listed["allocations"].as_array().expect("allocations");
    assert!(all.len() == 1 && all[0]["status"] == "done", "{listed}");
}

/// The simulator, chaos, probe and benchmark lines. A `muster` command
/// passes when it exits 0, or is still running after `BUDGET` (a long
/// simulation or a five-minute chaos run has then parsed its flags, read
/// its inputs and started); a `cargo bench` line must name a benchmark the
/// workspace has (CI's clippy builds every one). The commands run side by
/// side, so the test takes one budget, not one per long command.
#[test]
fn t174_the_readme_simulator_and_benchmark_lines_run() {
    const BUDGET: Duration = Duration::from_secs(20);
    let block = blocks("More to run").pop().unwrap();
    let benches = workspace_benches();
    let mut ran = 0;
    let mut running = Vec::new();
    for c in commands(&block) {
        if let Some(args) = c.strip_prefix("cargo run --release --bin muster -- ") {
            let dir = tempfile::tempdir().unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_muster"))
                .args(args.split_whitespace())
                .current_dir(root())
                .env("TMPDIR", dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            running.push((c.clone(), child, dir));
        } else if let Some(rest) = c.strip_prefix("cargo bench -p ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(words.get(1), Some(&"--bench"), "{c}");
            let (package, bench) = (words[0], words[2]);
            assert!(
                benches.get(package).is_some_and(|b| b.iter().any(|n| n == bench)),
                "`{c}`: no bench {bench} in {package} ({benches:?})"
            );
            ran += 1;
        } else {
            panic!("a README command this test does not know how to run: {c}");
        }
    }
    // Each command's stderr is drained as it runs (a full pipe would stall
    // it), and read once it has exited or the budget is spent.
    let readers: Vec<_> = running
        .iter_mut()
        .map(|(_, child, _)| {
            let mut pipe = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                let mut err = String::new();
                let _ = pipe.read_to_string(&mut err);
                err
            })
        })
        .collect();
    let deadline = Instant::now() + BUDGET;
    let mut exited: Vec<Option<std::process::ExitStatus>> = vec![None; running.len()];
    while Instant::now() < deadline && exited.iter().any(Option::is_none) {
        for (i, (_, child, _)) in running.iter_mut().enumerate() {
            if exited[i].is_none() {
                exited[i] = child.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (((c, mut child, _dir), status), reader) in running.into_iter().zip(exited).zip(readers) {
        // SAFETY: the process group this test created.
        unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        let err = reader.join().unwrap();
        if let Some(s) = status {
            assert!(s.success(), "`{c}` failed: {err}");
        }
        ran += 1;
    }
    assert!(ran >= 10, "{ran} commands");
}

/// Each workspace package's benchmark targets, from its manifest.
fn workspace_benches() -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for dir in std::fs::read_dir(root()).unwrap().flatten() {
        let manifest = dir.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
        let Some(name) = text.lines().find_map(|l| l.strip_prefix("name = ").map(|n| n.trim_matches('"').to_string()))
        else {
            continue;
        };
        let mut benches: Vec<String> = Vec::new();
        let mut in_bench = false;
        for line in text.lines() {
            if line.starts_with('[') {
                in_bench = line.trim() == "[[bench]]";
            } else if in_bench && let Some(n) = line.strip_prefix("name = ") {
                benches.push(n.trim_matches('"').to_string());
            }
        }
        // Benches found by file name (autobenches) count too.
        if let Ok(files) = std::fs::read_dir(dir.path().join("benches")) {
            for f in files.flatten() {
                if let Some(stem) = f.path().file_stem().and_then(|s| s.to_str())
                    && f.path().extension().is_some_and(|e| e == "rs")
                {
                    benches.push(stem.to_string());
                }
            }
        }
        out.insert(name, benches);
    }
    out
}

#[test]
fn commands_join_continued_lines_and_loops_and_skip_comments() {
    let block = "# a comment\nexport A=1\nfor i in 1 2; do\n  echo $i &\ndone\ngrpcurl -x \\\n  -y list   # note\n\nfor j in 3; do echo $j; done\nwatch   # exit when done\n";
    assert_eq!(
        commands(block),
        [
            "export A=1",
            "for i in 1 2; do\n  echo $i &\ndone",
            "grpcurl -x \\\n  -y list   # note",
            "for j in 3; do echo $j; done",
            "watch   # exit when done"
        ]
    );
}
