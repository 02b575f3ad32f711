//! A real OCI registry for tests: Debian's `docker-registry` (the
//! distribution project's registry) on a free port of 127.0.0.1, with TLS
//! (a CA of its own) and htpasswd auth (`muster`/`secret`), or plain HTTP;
//! and images built offline from `busybox-static` with `umoci`, pushed with
//! `skopeo`. Without those tools a test skips, unless
//! `MUSTER_REQUIRE_TOOLS=1` (`.ci/run` installs them).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tools a test registry needs (and runc, which the image tests hand
/// images to as an installed runtime).
pub const TOOLS: [&str; 7] = ["docker-registry", "umoci", "skopeo", "openssl", "htpasswd", "busybox", "runc"];

/// Whether `name` is a file in a `PATH` directory.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Whether the tools are here; fails under `MUSTER_REQUIRE_TOOLS`.
pub fn tools() -> bool {
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("MUSTER_REQUIRE_TOOLS").is_none(),
        "{missing:?} not installed, and MUSTER_REQUIRE_TOOLS is set (.ci/run installs them)"
    );
    eprintln!("skipped: {missing:?} not installed");
    false
}

/// Runs `cmd`, which must succeed; its standard output.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A registry process on a free port of 127.0.0.1, killed on drop.
pub struct TestRegistry {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    tls: bool,
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

impl TestRegistry {
    /// With TLS (a CA of its own) and htpasswd auth (muster/secret), or
    /// plain HTTP without auth.
    pub fn start(tls: bool) -> TestRegistry {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            d.join("storage").display()
        );
        if tls {
            let sh = |s: &str| run(Command::new("sh").arg("-c").arg(s).current_dir(d));
            sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca");
            sh("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1");
            sh("printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && openssl x509 -req -in server.csr -CA ca.pem \
                -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext.cnf");
            sh("htpasswd -Bbn muster secret > htpasswd && mkdir -p certs && cp ca.pem certs/ca.crt");
            config.push_str(&format!(
                "  tls:\n    certificate: {0}/server.pem\n    key: {0}/server.key\nauth:\n  htpasswd:\n    realm: muster\n    path: {0}/htpasswd\n",
                d.display()
            ));
        }
        std::fs::write(d.join("config.yml"), config).unwrap();
        let mut r = TestRegistry { dir, port, child: None, tls };
        r.resume();
        r
    }

    /// Starts (again) the registry process, and waits until it listens.
    pub fn resume(&mut self) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the registry never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the registry process (its storage stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its CA certificate (PEM), with TLS.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A docker `config.json` with the right credentials.
    pub fn auth_json(&self) -> String {
        format!(r#"{{"auths": {{"{}": {{"username": "muster", "password": "secret"}}}}}}"#, self.host())
    }

    /// Whether it speaks TLS (with auth).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// Builds an image offline from busybox-static (plus, when `second`,
    /// a second layer adding /data/file.txt and deleting /bin/true) and
    /// pushes it as `test/NAME:TAG`; returns its manifest digest.
    pub fn push(&self, name: &str, tag: &str, second: bool) -> String {
        let work = tempfile::tempdir().unwrap();
        let w = work.path();
        let umoci = |args: &[&str]| run(Command::new("umoci").args(args).current_dir(w));
        umoci(&["init", "--layout", "oci"]);
        umoci(&["new", "--image", "oci:img"]);
        umoci(&["unpack", "--image", "oci:img", "bundle"]);
        let rootfs = w.join("bundle/rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::create_dir_all(rootfs.join("work")).unwrap();
        std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for c in ["sh", "echo", "cat", "env", "sleep", "ls", "true"] {
            std::os::unix::fs::symlink("/bin/busybox", rootfs.join("bin").join(c)).unwrap();
        }
        // A tag of its own in the image, so two names are two images.
        std::fs::write(rootfs.join("work/name"), format!("{name}:{tag}\n")).unwrap();
        umoci(&["repack", "--image", "oci:img", "bundle"]);
        if second {
            std::fs::remove_dir_all(w.join("bundle")).unwrap();
            umoci(&["unpack", "--image", "oci:img", "bundle"]);
            std::fs::create_dir_all(rootfs.join("data")).unwrap();
            std::fs::write(rootfs.join("data/file.txt"), "layer two\n").unwrap();
            std::fs::remove_file(rootfs.join("bin/true")).unwrap();
            umoci(&["repack", "--image", "oci:img", "bundle"]);
        }
        umoci(&[
            "config",
            "--image",
            "oci:img",
            "--config.env",
            "PATH=/bin",
            "--config.env",
            "GREETING=hello",
            "--config.workingdir",
            "/work",
            "--config.entrypoint",
            "/bin/sh",
            "--config.entrypoint",
            "-c",
            "--config.cmd",
            "echo default-cmd",
        ]);
        let dest = format!("docker://{}/test/{name}:{tag}", self.host());
        let mut copy = Command::new("skopeo");
        copy.arg("copy").current_dir(w);
        if self.tls {
            copy.args(["--dest-creds", "muster:secret", "--dest-cert-dir"]).arg(self.dir.path().join("certs"));
        } else {
            copy.arg("--dest-tls-verify=false");
        }
        run(copy.args(["oci:oci:img", &dest]));
        let mut inspect = Command::new("skopeo");
        inspect.args(["inspect", "--format", "{{.Digest}}"]);
        if self.tls {
            inspect.args(["--creds", "muster:secret", "--cert-dir"]).arg(self.dir.path().join("certs"));
        } else {
            inspect.arg("--tls-verify=false");
        }
        run(inspect.arg(&dest)).trim().to_string()
    }

    /// The registry's stored file of blob `digest`.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.path().join(format!("storage/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}
