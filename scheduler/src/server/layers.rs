//! The layering of `server/` (its module docs draw it), checked on the
//! source: every path a file names into another part of `server/`
//! (`super::…` or `crate::server::…`) must go to a part its own part may
//! use. The allowed uses form no circle, so neither do the imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The parts of `server/` (its folders and top-level files) and what each
/// may import from the others. The server's root (`mod.rs`: `hex`, the
/// Raft type aliases) is open to all.
const ALLOWED: &[(&str, &[&str])] = &[
    ("raft", &[]),
    ("policies", &[]),
    ("background", &[]),
    ("leader", &["raft"]),
    ("history", &["raft"]),
    ("api", &["raft", "leader", "history", "policies"]),
    ("observe", &["raft", "api", "policies"]),
    ("config", &["api", "observe", "policies"]),
    ("replica", &["raft", "leader", "history", "api", "observe", "policies", "background", "config"]),
];

fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    ALLOWED.iter().map(|(part, uses)| (*part, uses.iter().copied().collect())).collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read server/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file below `server/`: `api/agent_hub/mod.rs` is
/// `["api", "agent_hub"]`, `api/client.rs` is `["api", "client"]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().expect("a file name");
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The parts of `server/` that `src` (the file at module path `module`)
/// names, with the line each is named on: every path on a line (comments
/// aside) that starts `crate::server::` or `super::`, resolved against
/// `module`.
fn named_parts(module: &[String], src: &str, parts: &BTreeSet<&str>) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (n, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for path in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            let segs: Vec<&str> = path.split("::").collect();
            let ups = segs.iter().take_while(|s| **s == "super").count();
            let part = match segs.as_slice() {
                ["crate", "server", name, ..] => Some(*name),
                // `super::*` inside a file's own `mod tests` names the file.
                _ if ups > 0 && ups < module.len() => Some(module[0].as_str()),
                _ if ups > 0 && ups == module.len() => segs.get(ups).copied(),
                _ => None,
            };
            if let Some(part) = part.filter(|p| parts.contains(p)) {
                found.push((part.to_string(), n + 1));
            }
        }
    }
    found
}

#[test]
fn server_parts_import_only_the_layers_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
    let rules = allowed();
    let parts: BTreeSet<&str> = rules.keys().copied().collect();
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut broken = Vec::new();
    let (mut checked, mut crossing) = (0, 0);
    for file in &files {
        let rel = file.strip_prefix(&root).expect("below server/");
        let module = module_of(rel);
        let Some(own) = module.first().filter(|p| parts.contains(p.as_str())) else { continue };
        checked += 1;
        let src = std::fs::read_to_string(file).expect("read source");
        for (part, line) in named_parts(&module, &src, &parts) {
            crossing += usize::from(part != *own);
            if part != *own && !rules[own.as_str()].contains(part.as_str()) {
                broken.push(format!("{}:{line}: {own} imports {part}", rel.display()));
            }
        }
    }
    assert!(checked > 30 && crossing > 50, "the check read the server's files ({checked}, {crossing} crossings)");
    assert!(broken.is_empty(), "imports against the layering:\n{}", broken.join("\n"));
}

#[test]
fn the_allowed_uses_form_no_circle() {
    let rules = allowed();
    // Repeatedly drop parts that use nothing left; a circle stays behind.
    let mut left: BTreeMap<&str, BTreeSet<&str>> = rules.clone();
    while let Some(free) = left.iter().find(|(_, uses)| uses.iter().all(|u| !left.contains_key(u))).map(|(p, _)| *p) {
        left.remove(free);
    }
    assert!(left.is_empty(), "a circle among {:?}", left.keys().collect::<Vec<_>>());
}

#[test]
fn a_path_naming_another_part_is_found() {
    let parts: BTreeSet<&str> = allowed().keys().copied().collect();
    let module = vec!["raft".to_string(), "proposer".to_string()];
    let src = "use super::leader_time::X;\nuse crate::server::api::convert;\nfn f() { super::super::observe::observe(); }\n\
               // super::super::leader in a comment\nlet _ = (mysuper::x, super::super::leader::y, crate::server::api::z);\n";
    let found = named_parts(&module, src, &parts);
    let want = [("raft", 1), ("api", 2), ("observe", 3), ("leader", 5), ("api", 5)];
    assert_eq!(found, want.map(|(p, n)| (p.to_string(), n)));
}
