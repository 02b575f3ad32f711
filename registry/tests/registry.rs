//! The image cache against a real registry: Debian's `docker-registry`
//! (the distribution project's registry) with TLS and htpasswd auth,
//! holding images built offline from `busybox-static` with `umoci` and
//! pushed with `skopeo`. Without those tools the tests skip, unless
//! `MUSTER_REQUIRE_TOOLS=1` (`.ci/run` installs them).

use std::path::Path;

use muster_core::sm::ImageRef;
use muster_registry::{DockerAuth, ImageCache, PullError, Registry, RegistryConfig, UnpackPolicy};
use muster_testkit::registry::{TestRegistry, tools};

/// A registry config with the right credentials and CA.
fn config(reg: &TestRegistry) -> RegistryConfig {
    let cfg = RegistryConfig { auth: DockerAuth::parse(&reg.auth_json()).unwrap(), ..RegistryConfig::default() };
    if reg.tls() { cfg.with_ca_file(&reg.ca()).unwrap() } else { cfg }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn cache(dir: &Path, max_bytes: u64, cfg: &RegistryConfig) -> ImageCache {
    ImageCache::open(dir, max_bytes, UnpackPolicy::default(), Registry::new(cfg).unwrap()).unwrap()
}

/// A registry with TLS and auth holding `busybox:1` (and its digest), and
/// an empty cache that pulls from it with the right credentials and CA;
/// `None` where the tools are missing.
fn busybox_and_cache() -> Option<(TestRegistry, String, tempfile::TempDir, ImageCache)> {
    if !tools() {
        return None;
    }
    let reg = TestRegistry::start(true);
    let digest = reg.push("busybox", "1", false);
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30, &config(&reg));
    Some((reg, digest, dir, c))
}

fn image(reg: &TestRegistry, name: &str, tag: &str) -> ImageRef {
    ImageRef::parse(&format!("{}/test/{name}:{tag}", reg.host())).unwrap()
}

#[test]
fn a_tls_registry_with_auth_fills_the_cache_and_a_pinned_second_pull_needs_no_registry() {
    let Some((mut reg, digest, dir, c)) = busybox_and_cache() else { return };
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
        let reopened = cache(dir.path(), 1 << 30, &config(&reg));
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
        let e = cache(dir.path(), 1 << 30, &config(&reg)).pull(&image(&reg, "busybox", "nope")).await.unwrap_err();
        assert!(matches!(e, PullError::NotFound(_)), "{e}");
        let e = cache(dir.path(), 1 << 30, &config(&reg)).pull(&image(&reg, "nothing", "1")).await.unwrap_err();
        assert!(matches!(e, PullError::NotFound(_) | PullError::Unauthorized(_)), "{e}");
        // Without the registry's CA the certificate is not trusted (and a
        // TLS registry does not fall back to plain HTTP).
        let untrusted = RegistryConfig { ca_pem: None, ..config(&reg) };
        let e = cache(dir.path(), 1 << 30, &untrusted).pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::Unreachable(_)), "{e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    });
}

#[test]
fn two_pulls_of_one_image_at_once_download_it_once() {
    let Some((reg, _, _dir, c)) = busybox_and_cache() else { return };
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
    let c = cache(dir.path(), 1, &config(&reg));
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
    let Some((reg, _, dir, c)) = busybox_and_cache() else { return };
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
        // Bytes appended after a whole, valid archive: the unpacker is done
        // before they come, but the stream is read to its end and checked.
        let mut bytes = std::fs::read(&blob).unwrap();
        bytes[at] ^= 0xff;
        bytes.extend(std::iter::repeat_n(0u8, 4 << 20));
        std::fs::write(&blob, bytes).unwrap();
        let e = c.pull(&r).await.unwrap_err();
        assert!(matches!(e, PullError::BadImage(_)), "{e}");
        assert!(c.images().is_empty() && c.bytes() == 0, "nothing of it is kept");
        let tmp: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().collect();
        assert!(tmp.is_empty(), "no half-unpacked layer is left");
    });
}
