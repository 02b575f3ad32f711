//! The image cache against a real registry: Debian's `docker-registry`
//! (the distribution project's registry) with TLS and htpasswd auth,
//! holding images built offline from `busybox-static` with `umoci` and
//! pushed with `skopeo`. Without those tools the tests skip, unless
//! `MUSTER_REQUIRE_TOOLS=1` (`.ci/run` installs them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use muster_core::sm::ImageRef;
use muster_registry::{DockerAuth, ImageCache, PullError, Registry, RegistryConfig, UnpackPolicy};

const TOOLS: [&str; 6] = ["docker-registry", "umoci", "skopeo", "openssl", "htpasswd", "busybox"];

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Whether the tools are here; fails under `MUSTER_REQUIRE_TOOLS`.
fn tools() -> bool {
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

fn run(cmd: &mut Command) -> String {
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
struct TestRegistry {
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
    fn start(tls: bool) -> TestRegistry {
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

    fn resume(&mut self) {
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

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A registry config with the right credentials and CA.
    fn config(&self) -> RegistryConfig {
        let json = format!(r#"{{"auths": {{"{}": {{"username": "muster", "password": "secret"}}}}}}"#, self.host());
        let cfg = RegistryConfig { auth: DockerAuth::parse(&json).unwrap(), ..RegistryConfig::default() };
        if self.tls { cfg.with_ca_file(&self.ca()).unwrap() } else { cfg }
    }

    /// Builds an image offline from busybox-static (plus, when `second`,
    /// a second layer adding /data/file.txt and deleting /bin/true) and
    /// pushes it as `test/NAME:TAG`; returns its manifest digest.
    fn push(&self, name: &str, tag: &str, second: bool) -> String {
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
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.path().join(format!("storage/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn cache(dir: &Path, max_bytes: u64, cfg: &RegistryConfig) -> ImageCache {
    ImageCache::open(dir, max_bytes, UnpackPolicy::default(), Registry::new(cfg)).unwrap()
}

fn image(reg: &TestRegistry, name: &str, tag: &str) -> ImageRef {
    ImageRef::parse(&format!("{}/test/{name}:{tag}", reg.host())).unwrap()
}

#[test]
fn a_tls_registry_with_auth_fills_the_cache_and_a_pinned_second_pull_needs_no_registry() {
    if !tools() {
        return;
    }
    let mut reg = TestRegistry::start(true);
    let digest = reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30, &reg.config());
    rt().block_on(async {
        let r = image(&reg, "busybox", "1");
        assert_eq!(c.registry().resolve(&r).await.unwrap(), digest, "the tag resolves to what skopeo pushed");
        let first = c.pull(&r).await.unwrap();
        assert_eq!(first.digest, digest);
        assert!(!first.cache_hit && first.downloaded > 500_000, "{first:?}");
        let busybox = std::fs::metadata(first.layer_dirs[0].join("bin/busybox")).unwrap();
        assert_eq!(busybox.len(), std::fs::metadata("/usr/bin/busybox").unwrap().len());
        assert_eq!(std::fs::read_link(first.layer_dirs[0].join("bin/sh")).unwrap(), Path::new("/bin/busybox"));
        let cfg = &first.config;
        assert_eq!(
            (cfg.env.clone(), cfg.working_dir.as_str()),
            (vec!["PATH=/bin".to_string(), "GREETING=hello".to_string()], "/work")
        );
        assert_eq!(
            (cfg.entrypoint.clone(), cfg.cmd.clone()),
            (vec!["/bin/sh".to_string(), "-c".to_string()], vec!["echo default-cmd".to_string()])
        );
        drop(first);

        // Pinned by digest, a cached image is found without the registry.
        reg.stop();
        let again = c.pull(&r.pinned(&digest)).await.unwrap();
        assert!(again.cache_hit && again.downloaded == 0, "{again:?}");
        // A tag cannot be resolved without it: the error says so.
        let e = c.pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::Unreachable(_)), "{e}");
        drop(again);
        // A new cache on the same directory finds what is there.
        drop(c);
        let reopened = cache(dir.path(), 1 << 30, &reg.config());
        assert!(reopened.pull(&r.pinned(&digest)).await.unwrap().cache_hit);
    });
}

#[test]
fn bad_credentials_unknown_images_and_an_untrusted_certificate_are_named() {
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(true);
    reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = image(&reg, "busybox", "1");
        let no_auth = RegistryConfig::default().with_ca_file(&reg.ca()).unwrap();
        let e = cache(dir.path(), 1 << 30, &no_auth).pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::Unauthorized(_)), "{e}");
        let wrong = RegistryConfig {
            auth: DockerAuth::parse(&format!(
                r#"{{"auths": {{"{}": {{"username": "muster", "password": "nope"}}}}}}"#,
                reg.host()
            ))
            .unwrap(),
            ..no_auth.clone()
        };
        let e = cache(dir.path(), 1 << 30, &wrong).pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::Unauthorized(_)), "{e}");
        let e = cache(dir.path(), 1 << 30, &reg.config()).pull(&image(&reg, "busybox", "nope")).await.unwrap_err();
        assert!(matches!(e, PullError::NotFound(_)), "{e}");
        let e = cache(dir.path(), 1 << 30, &reg.config()).pull(&image(&reg, "nothing", "1")).await.unwrap_err();
        assert!(matches!(e, PullError::NotFound(_) | PullError::Unauthorized(_)), "{e}");
        // Without the registry's CA the certificate is not trusted (and a
        // TLS registry does not fall back to plain HTTP).
        let untrusted = RegistryConfig { ca_pem: None, ..reg.config() };
        let e = cache(dir.path(), 1 << 30, &untrusted).pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::Unreachable(_)), "{e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    });
}

#[test]
fn two_pulls_of_one_image_at_once_download_it_once() {
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(true);
    reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30, &reg.config());
    rt().block_on(async {
        let r = image(&reg, "busybox", "1");
        let (a, b) = tokio::join!(c.pull(&r), c.pull(&r));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.digest, b.digest);
        let layer = std::fs::metadata(reg.blob_file(&layer_digest(&a))).unwrap().len();
        assert_eq!(a.downloaded + b.downloaded, layer, "one download: {} + {}", a.downloaded, b.downloaded);
    });
}

/// The first layer's digest of a pulled image (its directory's name).
fn layer_digest(p: &muster_registry::PulledImage) -> String {
    let d = &p.layer_dirs[0];
    format!("sha256:{}", d.file_name().unwrap().to_string_lossy())
}

#[test]
fn layers_apply_whiteouts_and_eviction_spares_images_in_use() {
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(true);
    reg.push("layered", "1", true);
    reg.push("other", "1", false);
    let dir = tempfile::tempdir().unwrap();
    // A limit smaller than any image: every pull evicts what it can.
    let c = cache(dir.path(), 1, &reg.config());
    rt().block_on(async {
        let layered = c.pull(&image(&reg, "layered", "1")).await.unwrap();
        assert_eq!(layered.layer_dirs.len(), 2);
        let top = &layered.layer_dirs[1];
        assert_eq!(std::fs::read_to_string(top.join("data/file.txt")).unwrap(), "layer two\n");
        use std::os::unix::fs::FileTypeExt;
        let wh = std::fs::symlink_metadata(top.join("bin/true")).unwrap();
        assert!(wh.file_type().is_char_device(), "the deleted file is an overlay whiteout");
        // In use: pulling another image evicts nothing of it.
        let other = c.pull(&image(&reg, "other", "1")).await.unwrap();
        assert!(layered.layer_dirs.iter().all(|d| d.is_dir()), "the image in use stays");
        assert_eq!(c.images().len(), 2);
        let layered_digest = layered.digest.clone();
        drop(layered);
        drop(other);
        // Unused now: the next pull evicts the least recently used first.
        let again = c.pull(&image(&reg, "other", "1")).await.unwrap();
        assert!(again.cache_hit);
        c.evict().unwrap();
        assert_eq!(c.images(), std::slice::from_ref(&again.digest), "the layered image went; the one in use stayed");
        drop(again);
        // A pull after eviction downloads again.
        let back = c.pull(&image(&reg, "layered", "1")).await.unwrap();
        assert!(!back.cache_hit && back.downloaded > 0 && back.digest == layered_digest);
    });
}

#[test]
fn a_plain_http_registry_on_the_loopback_is_reached() {
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(false);
    let digest = reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30, &RegistryConfig::default());
    let pulled = rt().block_on(c.pull(&image(&reg, "busybox", "1"))).unwrap();
    assert_eq!(pulled.digest, digest);
}

#[test]
fn a_layer_whose_bytes_do_not_match_its_digest_is_refused_and_not_kept() {
    if !tools() {
        return;
    }
    let reg = TestRegistry::start(true);
    reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30, &reg.config());
    rt().block_on(async {
        let r = image(&reg, "busybox", "1");
        let m = c.registry().manifest(&r).await.unwrap();
        let blob = reg.blob_file(&m.manifest.layers[0].digest);
        // The same length, one byte changed deep inside the gzip stream.
        let mut bytes = std::fs::read(&blob).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0xff;
        std::fs::write(&blob, bytes).unwrap();
        let e = c.pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::BadImage(_)), "{e}");
        assert!(c.images().is_empty() && c.bytes() == 0, "nothing of it is kept");
        let tmp: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().collect();
        assert!(tmp.is_empty(), "no half-unpacked layer is left");
    });
}
