//! Container images: what `muster submit --image REF --mount SRC:DST[:ro]
//! --workdir DIR` asks for, checked before anything reaches the log.
//!
//! ```text
//!   busybox                       docker.io/library/busybox:latest
//!   ghcr.io/acme/train:v3         ghcr.io/acme/train:v3
//!   127.0.0.1:5000/t/bb@sha256:…  pinned: every task and retry runs these bytes
//! ```
//!
//! A reference follows the distribution project's grammar: an optional
//! registry (a first component with a `.` or a `:`, or `localhost`), a
//! repository of lowercase path components, then a tag, a digest or both.
//! Without a registry it is Docker Hub's, and a one-component repository
//! there is under `library/`. Without a tag or digest the tag is `latest`.

use super::*;

/// The longest image reference accepted, in bytes.
pub const MAX_IMAGE_REF_BYTES: usize = 512;

/// The longest repository name with its registry (the distribution
/// project's limit).
pub const MAX_IMAGE_NAME_BYTES: usize = 255;

/// The most `--mount`s one allocation may ask for.
pub const MAX_MOUNTS: usize = 16;

/// The longest path of a mount or of `--workdir`, in bytes.
pub const MAX_CONTAINER_PATH_BYTES: usize = 1024;

/// Docker Hub, where a reference without a registry points.
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// An image reference, parsed and normalised.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    /// The registry's host, with its port if it has one.
    pub registry: String,
    /// The repository within it (`library/busybox`).
    pub repository: String,
    /// The tag, unless only a digest was given.
    pub tag: Option<String>,
    /// The manifest digest (`sha256:…`), if the reference pins one.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses `REF` as `docker pull` would, or says what is wrong with it.
    pub fn parse(s: &str) -> Result<ImageRef, String> {
        if s.is_empty() {
            return Err("an image reference cannot be empty".into());
        }
        if s.len() > MAX_IMAGE_REF_BYTES {
            return Err(format!("{} bytes; at most {MAX_IMAGE_REF_BYTES}", s.len()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => {
                check_digest(d)?;
                (rest, Some(d.to_string()))
            }
            None => (s, None),
        };
        // A tag follows the last ':' after the last '/' (a ':' before it is
        // the registry's port).
        let slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[slash + i + 1..];
                check_tag(tag)?;
                (&rest[..slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.len() > MAX_IMAGE_NAME_BYTES {
            return Err(format!("the name is {} bytes; at most {MAX_IMAGE_NAME_BYTES}", name.len()));
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                check_registry(first)?;
                (first.to_string(), path.to_string())
            }
            _ => (DEFAULT_REGISTRY.to_string(), name.to_string()),
        };
        for component in path.split('/') {
            check_path_component(component)?;
        }
        let repository =
            if registry == DEFAULT_REGISTRY && !path.contains('/') { format!("library/{path}") } else { path };
        let tag = if tag.is_none() && digest.is_none() { Some("latest".to_string()) } else { tag };
        Ok(ImageRef { registry, repository, tag, digest })
    }

    /// The same image pinned to `digest` (what every task of an
    /// allocation then pulls).
    pub fn pinned(&self, digest: &str) -> ImageRef {
        ImageRef { digest: Some(digest.to_string()), ..self.clone() }
    }
}

impl fmt::Display for ImageRef {
    /// The full form: `registry/repository[:tag][@digest]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A digest: `sha256:` and 64 lowercase hex digits, or `sha512:` and 128.
pub fn check_digest(d: &str) -> Result<(), String> {
    let hex_len = match d.split_once(':') {
        Some(("sha256", hex)) => (hex, 64),
        Some(("sha512", hex)) => (hex, 128),
        _ => return Err(format!("digest {:?}: sha256:<64 hex digits> or sha512:<128 hex digits>", shown(d))),
    };
    let (hex, len) = hex_len;
    if hex.len() != len || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!("digest {:?}: {len} lowercase hex digits after the algorithm", shown(d)));
    }
    Ok(())
}

fn check_tag(t: &str) -> Result<(), String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = !t.is_empty()
        && t.len() <= 128
        && word(t.as_bytes()[0])
        && t.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("tag {:?}: 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'", shown(t)))
    }
}

fn check_registry(r: &str) -> Result<(), String> {
    let bad = || Err(format!("registry {:?}: a host name or IPv4 address, with an optional :port", shown(r)));
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (r, None),
    };
    if let Some(p) = port
        && (p.is_empty()
            || p.len() > 5
            || !p.bytes().all(|b| b.is_ascii_digit())
            || p.parse::<u32>().unwrap_or(0) > 65535)
    {
        return bad();
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || !host.split('.').all(label_ok) {
        return bad();
    }
    Ok(())
}

/// A repository path component: lowercase letters and digits, separated by
/// one `.`, one or two `_`, or any number of `-`.
fn check_path_component(c: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "repository component {:?}: lowercase letters and digits, separated by '.', '_', '__' or '-'",
            shown(c)
        ))
    };
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return bad();
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let dashes = sep.bytes().all(|x| x == b'-');
        if !(sep == "." || sep == "_" || sep == "__" || dashes) {
            return bad();
        }
    }
    Ok(())
}

/// Up to 64 characters of `s`, for an error message.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A host path the task sees inside its image (`--mount SRC:DST[:ro]`);
/// the agent mounts only sources its operator allows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Mount {
    /// The absolute path on the node.
    pub source: String,
    /// The absolute path inside the container.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

impl Mount {
    /// Parses `SRC:DST`, `SRC:DST:ro` or `SRC:DST:rw`.
    pub fn parse(s: &str) -> Result<Mount, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let (source, target, read_only) = match parts[..] {
            [src, dst] => (src, dst, false),
            [src, dst, "ro"] => (src, dst, true),
            [src, dst, "rw"] => (src, dst, false),
            _ => return Err(format!("{:?}: SRC:DST, SRC:DST:ro or SRC:DST:rw", shown(s))),
        };
        let m = Mount { source: source.to_string(), target: target.to_string(), read_only };
        m.check()?;
        Ok(m)
    }

    /// Both paths are absolute and clean.
    pub fn check(&self) -> Result<(), String> {
        check_container_path("source", &self.source)?;
        check_container_path("target", &self.target)?;
        if self.target == "/" {
            return Err("target: a mount cannot replace the image's root".into());
        }
        Ok(())
    }
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}{}", self.source, self.target, if self.read_only { ":ro" } else { "" })
    }
}

/// An absolute path without `.` or `..` components, NUL, `:` or empty
/// components, at most [`MAX_CONTAINER_PATH_BYTES`].
pub fn check_container_path(what: &str, p: &str) -> Result<(), String> {
    if p.len() > MAX_CONTAINER_PATH_BYTES {
        return Err(format!("{what}: {} bytes; at most {MAX_CONTAINER_PATH_BYTES}", p.len()));
    }
    if !p.starts_with('/') {
        return Err(format!("{what} {:?}: an absolute path", shown(p)));
    }
    if p.contains(['\0', ':']) {
        return Err(format!("{what} {:?}: no NUL or ':'", shown(p)));
    }
    if p != "/" && p[1..].split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("{what} {:?}: no empty, '.' or '..' components", shown(p)));
    }
    Ok(())
}

/// What an allocation runs in, when it names an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// The image.
    pub image: ImageRef,
    /// Host paths it sees, in order.
    pub mounts: Vec<Mount>,
    /// Where its command starts (else the image's `WORKDIR`, else `/`).
    pub workdir: Option<String>,
}

impl ContainerSpec {
    /// Every field within its limits.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let r = self.image.to_string();
        ImageRef::parse(&r).map_err(|e| ("image", e))?;
        if self.mounts.len() > MAX_MOUNTS {
            return Err(("mounts", format!("{} mounts; at most {MAX_MOUNTS}", self.mounts.len())));
        }
        let mut targets = std::collections::BTreeSet::new();
        for m in &self.mounts {
            m.check().map_err(|e| ("mounts", e))?;
            if !targets.insert(m.target.as_str()) {
                return Err(("mounts", format!("two mounts at {}", shown(&m.target))));
            }
        }
        if let Some(w) = &self.workdir {
            check_container_path("workdir", w).map_err(|e| ("workdir", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(s: &str) -> String {
        ImageRef::parse(s).unwrap().to_string()
    }

    #[test]
    fn references_normalise_as_docker_pull_does() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(full("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(full("acme/train:v3"), "docker.io/acme/train:v3");
        assert_eq!(full("ghcr.io/acme/train:v3.1-rc_2"), "ghcr.io/acme/train:v3.1-rc_2");
        assert_eq!(full("localhost/x"), "localhost/x:latest");
        assert_eq!(full("127.0.0.1:5000/test/busybox:1"), "127.0.0.1:5000/test/busybox:1");
        assert_eq!(full(&format!("127.0.0.1:5000/bb@{d}")), format!("127.0.0.1:5000/bb@{d}"));
        assert_eq!(full(&format!("bb:1@{d}")), format!("docker.io/library/bb:1@{d}"));
        assert_eq!(full("a.b/c__d/e-----f/g.h_i"), "a.b/c__d/e-----f/g.h_i:latest");
        let r = ImageRef::parse("127.0.0.1:5000/test/busybox").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "test/busybox", Some("latest"))
        );
        assert_eq!(r.pinned(&d).to_string(), format!("127.0.0.1:5000/test/busybox:latest@{d}"));
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        let long = "a".repeat(300);
        for (r, needle) in [
            ("", "cannot be empty"),
            ("Busybox", "repository component \"Busybox\""),
            ("bb:", "tag \"\""),
            ("bb:-x", "tag \"-x\""),
            ("bb@sha256:abc", "64 lowercase hex digits"),
            ("bb@md5:abc", "sha256:<64 hex digits>"),
            ("reg.io:99999/x", "registry \"reg.io:99999\""),
            ("reg.io/a//b", "repository component \"\""),
            ("reg.io/a/../b", "repository component \"..\""),
            ("a..b/c", "registry \"a..b\""),
            ("x/y_.z", "repository component \"y_.z\""),
            (long.as_str(), "the name is 300 bytes"),
        ] {
            let e = ImageRef::parse(r).unwrap_err();
            assert!(e.contains(needle), "{r:?}: {e}");
        }
        assert!(ImageRef::parse(&"a".repeat(600)).unwrap_err().contains("at most 512"));
    }

    #[test]
    fn mounts_are_absolute_clean_and_distinct() {
        assert_eq!(
            Mount::parse("/data/sets:/data:ro").unwrap(),
            Mount { source: "/data/sets".into(), target: "/data".into(), read_only: true }
        );
        assert!(!Mount::parse("/a:/b").unwrap().read_only);
        for (m, needle) in [
            ("/a", "SRC:DST"),
            ("a:/b", "source \"a\": an absolute path"),
            ("/a:/b/../etc", "no empty, '.' or '..'"),
            ("/a:/", "cannot replace the image's root"),
            ("/a:/b:rx", "SRC:DST"),
        ] {
            let e = Mount::parse(m).unwrap_err();
            assert!(e.contains(needle), "{m}: {e}");
        }
        let image = ImageRef::parse("bb").unwrap();
        let m = Mount::parse("/a:/b").unwrap();
        let c = ContainerSpec { image, mounts: vec![m.clone(), m], workdir: Some("rel".into()) };
        assert_eq!(c.check().unwrap_err().0, "mounts");
        let c = ContainerSpec { mounts: vec![], ..c };
        assert_eq!(c.check().unwrap_err(), ("workdir", "workdir \"rel\": an absolute path".to_string()));
    }
}
