#!/usr/bin/env python3
"""Fails when a doc names a test, a file or a Rust item that does not exist.

Reads README.md and docs/*.md (or the files given) and checks, against the
repository's tree:

- test names (t124, t99b): a `fn t124_…` exists in a Rust test;
- file paths in backticks or links (`agent/src/users.rs`, `alloc.rs`,
  [x](../deploy/check.sh)): a file whose path ends with that one exists;
- Rust paths in backticks (`executor::RunningTask`, `Tick::preemption_considered`,
  `run_shim()`): their last segment is defined in our sources (a fn, struct,
  enum, trait, type, const, static, mod, an enum variant or a field), unless
  the path starts in a crate that is not ours (std::, tokio::, …).

`--self-test` checks that planted bad references are caught, and good ones
pass. Exit status 1 names every bad reference with its file and line.
"""

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Crates and namespaces a doc may name that are not defined here.
FOREIGN = {
    "std", "core", "alloc", "tokio", "tonic", "prost", "openraft", "serde", "libc", "nix",
    "tracing", "metrics", "axum", "hyper", "rusqlite", "postcard", "sled", "clap", "rustls",
    "futures", "bytes", "http", "tower", "sha2", "rand", "Vec", "Option", "Result", "String",
    "Arc", "Box", "Duration", "Instant", "io", "fs", "mem", "ptr", "torch", "os", "sys", "ring",
    "rcgen", "reqwest", "object_store", "aws", "k8s", "etcd", "grpc", "oci_client", "sqlite3",
    "google", "json", "subprocess", "pytest", "grpcio", "numpy", "dist", "nn", "optim",
}

TEST = re.compile(r"(?<![\w/.-])(t\d{2,3}[a-z]?)(?![\w-])")
TICKED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FILE = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*\.(?:rs|md|py|sh|toml|proto|yaml|yml|service|sysusers)$")
RUST_PATH = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*(?:\(\))?$")
FENCE = re.compile(r"^\s*```")


def tree_files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return [f for f in out.splitlines() if os.path.exists(os.path.join(ROOT, f))]


def rust_facts(files):
    """The test names and the defined identifiers of the Rust and Python sources."""
    tests, idents = set(), set()
    defn = re.compile(
        r"\b(?:fn|struct|enum|trait|type|const|static|mod|macro_rules!|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)"
    )
    variant_or_field = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:[:({,]|$)", re.M)
    for f in files:
        if not f.endswith((".rs", ".py", ".proto")):
            continue
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for m in defn.finditer(text):
            idents.add(m.group(1))
            t = re.match(r"(t\d{2,3}[a-z]?)_", m.group(1))
            if t:
                tests.add(t.group(1))
        idents.update(m.group(1) for m in variant_or_field.finditer(text))
        if f.endswith(".proto"):
            idents.update(re.findall(r"\b(?:message|service|rpc|enum)\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    return tests, idents


def check(docs, files, tests, idents):
    bad = []
    suffixes = {}
    for f in files:
        parts = f.split("/")
        for i in range(len(parts)):
            suffixes.setdefault("/".join(parts[i:]), f)
    for doc in docs:
        base = os.path.dirname(doc)
        in_fence = False
        lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
        for n, line in enumerate(lines, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            where = f"{doc}:{n}"
            for m in TEST.finditer(line):
                if m.group(1) not in tests:
                    bad.append(f"{where}: test {m.group(1)} does not exist")
            if in_fence:
                continue
            for m in LINK.finditer(line):
                target = m.group(1)
                if "://" in target or target.startswith("mailto:"):
                    continue
                path = os.path.normpath(os.path.join(base, target))
                if not os.path.exists(os.path.join(ROOT, path)):
                    bad.append(f"{where}: link target {target} does not exist")
            for m in TICKED.finditer(line):
                ref = m.group(1).strip()
                if FILE.match(ref):
                    rel = ref[2:] if ref.startswith("./") else ref
                    rel = rel.lstrip("./") if rel.startswith("../") else rel
                    if ref.startswith("../shared/") or ref.startswith("../"):
                        continue
                    if rel not in suffixes and not os.path.exists(os.path.join(ROOT, base, rel)):
                        bad.append(f"{where}: file {ref} does not exist")
                elif RUST_PATH.match(ref):
                    segments = ref.removesuffix("()").split("::")
                    if segments[0] in FOREIGN:
                        continue
                    if segments[-1] not in idents:
                        bad.append(f"{where}: {ref}: no item {segments[-1]} is defined")
    return bad


def default_docs():
    docs = ["README.md"] + sorted(os.path.join("docs", d) for d in os.listdir(os.path.join(ROOT, "docs")) if d.endswith(".md"))
    return docs


def self_test(files, tests, idents):
    global ROOT
    real = ROOT
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "docs"))
        good = os.path.join(tmp, "docs", "good.md")
        with open(good, "w") as f:
            f.write("See `executor.rs` and [here](good.md), `RunAs::agent`, `std::process::Command`.\n")
        bad = os.path.join(tmp, "docs", "bad.md")
        with open(bad, "w") as f:
            f.write("t999 and `agent/src/no_such_file.rs` and `executor::NoSuchThing` and [x](gone.md).\n")
        ROOT = tmp
        found_good = check(["docs/good.md"], files + ["docs/good.md"], tests, idents)
        found_bad = check(["docs/bad.md"], files + ["docs/bad.md"], tests, idents)
        ROOT = real
    want = ["test t999", "file agent/src/no_such_file.rs", "no item NoSuchThing", "link target gone.md"]
    missed = [w for w in want if not any(w in b for b in found_bad)]
    if found_good or missed:
        print("doc-refs self-test failed:", found_good, "missed:", missed, file=sys.stderr)
        return 1
    print("doc-refs self-test: planted bad references caught, good ones pass")
    return 0


def main():
    files = tree_files()
    tests, idents = rust_facts(files)
    if sys.argv[1:] == ["--self-test"]:
        return self_test(files, tests, idents)
    docs = sys.argv[1:] or default_docs()
    bad = check(docs, files, tests, idents)
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"{len(bad)} reference(s) in the docs name nothing that exists", file=sys.stderr)
        return 1
    print(f"doc-refs: {len(docs)} docs, every test, file and item they name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
