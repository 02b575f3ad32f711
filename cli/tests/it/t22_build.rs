//! The README's two set-up commands share one build (issue 27): `cargo run
//! --bin muster` builds the binary's dependencies with the features the
//! workspace's tests turn on as well, so `cargo test --workspace` (and
//! `cargo test -p muster`) compile only the tests' own crates on top. The
//! features are pinned by `workspace-hack/`; this test fails, naming the
//! crate, when a dependency change makes the two resolve differently.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each package (`name vX.Y.Z`) and the feature sets it is built with in
/// the build `args` selects, as `cargo tree` resolves it.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .arg("tree")
        .args(args)
        .args(["--prefix", "none", "--format", "{p} {f}", "--offline", "--locked"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let mut by_package: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.replace(" (*)", "");
        let mut words = line.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else { continue };
        let feats = words.next().filter(|f| !f.starts_with('(')).unwrap_or("").to_string();
        by_package.entry(format!("{name} {version}")).or_default().insert(feats);
    }
    by_package
}

#[test]
fn t170_the_binary_and_the_workspace_tests_resolve_the_same_features() {
    let binary = features(&["-p", "muster", "-e", "normal,build"]);
    let tests = features(&["--workspace", "-e", "normal,build,dev"]);
    let differ: Vec<String> = binary
        .iter()
        .filter(|(package, feats)| tests.get(*package) != Some(*feats))
        .map(|(package, feats)| format!("{package}: binary {feats:?}, tests {:?}", tests.get(package)))
        .collect();
    assert!(
        differ.is_empty(),
        "these dependencies would be built twice (add the tests' features to workspace-hack/Cargo.toml):\n{}",
        differ.join("\n")
    );
    assert!(binary.len() > 100, "cargo tree listed the binary's dependencies: {}", binary.len());
}
