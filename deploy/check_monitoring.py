#!/usr/bin/env python3
"""Check Muster's monitoring material against docs/metrics.md.

    python3 deploy/check_monitoring.py              # check the real files
    python3 deploy/check_monitoring.py --self-test  # show the checker catches broken input

Checks deploy/grafana/muster.json, deploy/prometheus/muster-rules.yaml and
deploy/prometheus/prometheus.yml:

* the dashboard is valid JSON (schemaVersion 39, a Prometheus `datasource`
  variable, core panel types only); every panel has a title and a
  description, every non-row panel has targets with an expression, panels do
  not overlap;
* every `muster_*` name in a dashboard or rule expression is a metric listed
  in docs/metrics.md (`_bucket`/`_sum`/`_count` of a documented histogram
  count as that histogram; a bare histogram name is an error, as it has no
  series of its own); names with colons must be recording rules defined in
  the rules file, named level:metric:operations; selectors use only `up`,
  documented metrics or recording rules;
* label matchers use the documented labels (plus `job`, `instance`, and `le`
  on `_bucket`), and equality matchers use documented values where the docs
  enumerate them;
* histogram_quantile() is applied to the `_bucket` series of a documented
  histogram, through rate()/increase(), aggregated `by (le, ...)`;
* rate()/irate()/increase() are applied only to counters (or histogram
  series); delta()/deriv()/idelta()/predict_linear() never to counters;
* every alert has `for:`, a severity label (critical, warning or info), and
  summary and description annotations; alert and recording-rule names are
  unique; the alerts the runbook relies on exist;
* prometheus.yml loads muster-rules.yaml and scrapes every job a rule names;
* `promtool check rules` / `check config` pass, when promtool is on PATH.

Standard library plus PyYAML. Exits 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit("check_monitoring: PyYAML is required (pip install pyyaml)")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "muster.json"
RULES = ROOT / "deploy" / "prometheus" / "muster-rules.yaml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

METRIC_TYPES = {"counter", "gauge", "histogram"}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")
EXTRA_METRICS = {"up"}  # Prometheus' own, allowed beside the documented ones
ALWAYS_LABELS = {"job", "instance"}
SEVERITIES = {"critical", "warning", "info"}
CORE_PANELS = {
    "row", "timeseries", "stat", "gauge", "bargauge", "table", "text",
    "state-timeline", "status-history", "heatmap", "piechart", "barchart",
    "histogram", "logs", "nodeGraph", "news", "dashlist", "alertlist",
}
REQUIRED_ALERTS = [
    "MusterNoLeader", "MusterReplicaNotReady", "MusterReplicaDown",
    "MusterApplyLag", "MusterFrequentElections", "MusterSlowApply",
    "MusterNodesLost", "MusterQueueStuck", "MusterPreemptionStorm",
    "MusterPreemptionCycles", "MusterCheckpointFailures",
    "MusterWatchdogTrips", "MusterDrainTimeouts", "MusterConnectionsRefused",
]
RECORD_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_]+$")
ALERT_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
DURATION_RE = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
IDENT_RE = re.compile(r"(?<![A-Za-z0-9_:.$])[A-Za-z_:][A-Za-z0-9_:]*")
SELECTOR_RE = re.compile(r"(?<![A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
COUNTER_FUNCS = ("rate", "irate", "increase")
GAUGE_FUNCS = ("delta", "idelta", "deriv", "predict_linear", "holt_winters", "double_exponential_smoothing")
AGGREGATORS_RE = re.compile(r"(?<![A-Za-z0-9_:])(sum|avg|min|max|count)\s*(\(|by\b|without\b)")
BY_LE_RE = re.compile(r"\bby\s*\(([^)]*)\)")


# --------------------------------------------------------------------- docs

@dataclass
class Metric:
    name: str
    type: str
    labels: set[str] = field(default_factory=set)
    values: dict[str, set[str] | None] = field(default_factory=dict)


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (p.strip() for p in parts) if p]


def _parse_labels(cell: str) -> tuple[set[str], dict[str, set[str] | None]]:
    """`result` = committed \\| failed, `reason` (`total`, `per_peer`), `vcluster` (the victim's)."""
    cell = cell.replace("\\|", "|")
    labels: set[str] = set()
    values: dict[str, set[str] | None] = {}
    for part in _split_top(cell):
        m = re.match(r"`([A-Za-z_][A-Za-z0-9_]*)`\s*(.*)$", part, re.S)
        if not m:
            continue
        name, rest = m.group(1), m.group(2).strip()
        labels.add(name)
        vals: set[str] | None = None
        if rest.startswith("="):
            rhs = rest[1:].strip()
            if "…" not in rhs and "..." not in rhs:
                vals = {v.strip().strip("`") for v in rhs.split("|") if v.strip()}
        elif rest.startswith("(") and rest.endswith(")"):
            inner = rest[1:-1]
            ticked = re.findall(r"`([^`]+)`", inner)
            if ticked and not re.sub(r"`[^`]+`", "", inner).replace(",", "").strip():
                vals = set(ticked)
        values[name] = vals
    return labels, values


def parse_docs(text: str) -> tuple[dict[str, Metric], list[str]]:
    metrics: dict[str, Metric] = {}
    errors: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 4:
            continue
        m = re.fullmatch(r"`(muster_[a-z0-9_]+)`", cells[0])
        if not m:
            continue
        name, typ = m.group(1), cells[1].lower()
        if typ not in METRIC_TYPES:
            errors.append(f"docs/metrics.md:{lineno}: {name} has unknown type {cells[1]!r}")
            continue
        if name in metrics:
            errors.append(f"docs/metrics.md:{lineno}: {name} listed twice")
        labels, values = _parse_labels(cells[2])
        metrics[name] = Metric(name, typ, labels, values)
    if not metrics:
        errors.append("docs/metrics.md: no metric rows found (| `muster_name` | type | labels | meaning |)")
    return metrics, errors


# ---------------------------------------------------------------- expressions

@dataclass
class Ctx:
    docs: dict[str, Metric]
    records: set[str]
    errors: list[str] = field(default_factory=list)
    referenced: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")


def _strip(expr: str) -> str:
    s = STRING_RE.sub('""', expr)
    s = re.sub(r"#[^\n]*", "", s)
    s = re.sub(r"\[[^\]]*\]", "[]", s)
    s = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", "", s)
    return s


def _resolve(tok: str, ctx: Ctx) -> tuple[str, str | None] | None:
    """('counter'|'gauge'|'histogram'|'record'|'extra', suffix); None when unknown."""
    if ":" in tok:
        return ("record", None) if tok in ctx.records else None
    if tok in EXTRA_METRICS:
        return ("extra", None)
    m = ctx.docs.get(tok)
    if m is not None:
        return (m.type, None)
    for suf in HIST_SUFFIXES:
        base = tok[: -len(suf)]
        if tok.endswith(suf) and base in ctx.docs and ctx.docs[base].type == "histogram":
            return ("histogram", suf)
    return None


def _base(tok: str) -> str:
    for suf in HIST_SUFFIXES:
        if tok.endswith(suf) and tok[: -len(suf)].startswith("muster_"):
            return tok[: -len(suf)]
    return tok


def _calls(s: str, names: tuple[str, ...]):
    pat = re.compile(r"(?<![A-Za-z0-9_:])(" + "|".join(names) + r")\s*\(")
    for m in pat.finditer(s):
        depth, i = 1, m.end()
        while i < len(s) and depth:
            depth += {"(": 1, ")": -1}.get(s[i], 0)
            i += 1
        yield m.group(1), s[m.end(): i - 1]


def _tokens(s: str) -> list[str]:
    return [t for t in IDENT_RE.findall(s) if t.startswith("muster_") or ":" in t]


def check_expr(expr: str, where: str, ctx: Ctx) -> None:
    if not isinstance(expr, str) or not expr.strip():
        ctx.err(where, "empty expression")
        return
    s = _strip(expr)

    # Names: documented metrics, histogram series, defined recording rules.
    for tok in _tokens(s):
        kind = _resolve(tok, ctx)
        if kind is None:
            if ":" in tok:
                ctx.err(where, f"{tok} is not a recording rule defined in muster-rules.yaml")
            else:
                ctx.err(where, f"unknown metric {tok} (not in docs/metrics.md)")
            continue
        if kind[0] == "histogram" and kind[1] is None:
            ctx.err(where, f"{tok} is a histogram: use {tok}_bucket, _sum or _count")
        if kind[0] != "record":
            ctx.referenced.add(_base(tok))

    # Selectors: only documented names, documented labels and values.
    for m in SELECTOR_RE.finditer(expr):
        name, body = m.group(1), m.group(2)
        kind = _resolve(name, ctx)
        if kind is None and not name.startswith("muster_") and ":" not in name:
            ctx.err(where, f"selector on {name}: only docs/metrics.md metrics, up, or recording rules")
            continue
        if kind is None or kind[0] in ("record",):
            continue
        if kind[0] == "extra":
            allowed, values = ALWAYS_LABELS, {}
        else:
            metric = ctx.docs[_base(name)]
            allowed = metric.labels | ALWAYS_LABELS | ({"le"} if kind[1] == "_bucket" else set())
            values = metric.values
        for lm in MATCHER_RE.finditer(body):
            label, op, raw = lm.group(1), lm.group(2), lm.group(3)[1:-1]
            if label not in allowed:
                ctx.err(where, f"{name} has no label {label!r} (documented: {', '.join(sorted(allowed))})")
                continue
            if label == "job" and op == "=" and "$" not in raw:
                ctx.jobs.add(raw)
            known = values.get(label)
            if not known or "$" in raw:
                continue
            if op == "=":
                wanted = [raw]
            elif op == "=~" and re.fullmatch(r"[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*", raw):
                wanted = raw.split("|")
            else:
                continue
            for v in wanted:
                if v not in known:
                    ctx.err(where, f'{name}{{{label}="{v}"}}: documented values are {", ".join(sorted(known))}')

    # rate()/irate()/increase(): counters (and histogram series) only.
    for fn, arg in _calls(s, COUNTER_FUNCS):
        for tok in _tokens(arg):
            kind = _resolve(tok, ctx)
            if kind and kind[0] not in ("counter", "histogram", "record"):
                ctx.err(where, f"{fn}() applied to {tok}, a {kind[0]}, not a counter")

    # delta()/deriv()/...: never on counters.
    for fn, arg in _calls(s, GAUGE_FUNCS):
        for tok in _tokens(arg):
            kind = _resolve(tok, ctx)
            if kind and kind[0] == "counter":
                ctx.err(where, f"{fn}() applied to counter {tok}: use rate() or increase()")

    # histogram_quantile(): a documented histogram's _bucket, rated, by le.
    for _, arg in _calls(s, ("histogram_quantile",)):
        toks = _tokens(arg)
        if not toks:
            ctx.err(where, "histogram_quantile() with no metric")
        for tok in toks:
            kind = _resolve(tok, ctx)
            if kind is None:
                continue
            if kind[0] == "record":
                continue
            if kind[0] != "histogram":
                ctx.err(where, f"histogram_quantile() over {tok}, which docs/metrics.md calls a {kind[0]}, not a histogram")
            elif kind[1] != "_bucket":
                ctx.err(where, f"histogram_quantile() over {tok}: needs {_base(tok)}_bucket")
        if any(_resolve(t, ctx) and _resolve(t, ctx)[0] != "record" for t in toks):
            if not re.search(r"(?<![A-Za-z0-9_:])(rate|irate|increase)\s*\(", arg):
                ctx.err(where, "histogram_quantile() over raw buckets: wrap them in rate() or increase()")
            if AGGREGATORS_RE.search(arg):
                groups = BY_LE_RE.findall(arg)
                if not any("le" in [g.strip() for g in grp.split(",")] for grp in groups):
                    ctx.err(where, "histogram_quantile() over an aggregation that drops `le`: use sum by (le, ...)")


# ------------------------------------------------------------------ dashboard

def _walk_panels(panels):
    for p in panels or []:
        yield p
        if p.get("type") == "row":
            yield from _walk_panels(p.get("panels"))


def check_dashboard(text: str, ctx: Ctx, where: str = "muster.json") -> int:
    try:
        dash = json.loads(text)
    except json.JSONDecodeError as e:
        ctx.err(where, f"invalid JSON: {e}")
        return 0
    if not isinstance(dash, dict):
        ctx.err(where, "not a JSON object")
        return 0
    if dash.get("schemaVersion") != 39:
        ctx.err(where, f"schemaVersion is {dash.get('schemaVersion')!r}, want 39")
    if not dash.get("title"):
        ctx.err(where, "dashboard has no title")
    variables = (dash.get("templating") or {}).get("list") or []
    ds_vars = [v for v in variables if v.get("type") == "datasource" and v.get("query") == "prometheus"]
    if not any(v.get("name") == "datasource" for v in ds_vars):
        ctx.err(where, "no `datasource` template variable of type datasource / prometheus")
    for v in variables:
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            check_expr(q or "", f"{where}: variable {v.get('name')}", ctx)

    ids: set = set()
    cells: dict[tuple[int, int], str] = {}
    count = 0
    for p in _walk_panels(dash.get("panels")):
        title = p.get("title")
        label = f"{where}: panel {p.get('id')} {title!r}"
        if not isinstance(title, str) or not title.strip():
            ctx.err(label, "panel has no title")
        if p.get("id") in ids:
            ctx.err(label, "duplicate panel id")
        ids.add(p.get("id"))
        ptype = p.get("type")
        if ptype not in CORE_PANELS:
            ctx.err(label, f"panel type {ptype!r} is not a core Grafana panel")
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            ctx.err(label, "panel has no complete gridPos")
        else:
            if g["x"] + g["w"] > 24:
                ctx.err(label, "panel runs past the 24-column grid")
            for yy in range(g["y"], g["y"] + g["h"]):
                for xx in range(g["x"], g["x"] + g["w"]):
                    if (xx, yy) in cells:
                        ctx.err(label, f"overlaps panel {cells[(xx, yy)]!r}")
                        break
                    cells[(xx, yy)] = title
                else:
                    continue
                break
        if ptype == "row":
            continue
        count += 1
        if not isinstance(p.get("description"), str) or not p["description"].strip():
            ctx.err(label, "panel has no description")
        ds = p.get("datasource") or {}
        if ds.get("uid") != "${datasource}":
            ctx.err(label, "panel datasource is not ${datasource}")
        targets = p.get("targets")
        if not targets:
            ctx.err(label, "panel has no targets")
            continue
        refs = set()
        for t in targets:
            ref = t.get("refId")
            if ref in refs:
                ctx.err(label, f"duplicate refId {ref!r}")
            refs.add(ref)
            tds = t.get("datasource")
            if tds is not None and tds.get("uid") != "${datasource}":
                ctx.err(label, f"target {ref} datasource is not ${{datasource}}")
            check_expr(t.get("expr") or "", f"{label} target {ref}", ctx)
    if count == 0:
        ctx.err(where, "dashboard has no panels")
    return count


# ---------------------------------------------------------------------- rules

def collect_records(doc) -> set[str]:
    names = set()
    for g in (doc or {}).get("groups") or []:
        for r in (g or {}).get("rules") or []:
            if isinstance(r, dict) and isinstance(r.get("record"), str):
                names.add(r["record"])
    return names


def check_rules(doc, ctx: Ctx, where: str = "muster-rules.yaml") -> tuple[list[str], list[str]]:
    alerts: list[str] = []
    records: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        ctx.err(where, "no top-level `groups:` list")
        return alerts, records
    group_names = set()
    for gi, g in enumerate(doc["groups"]):
        if not isinstance(g, dict) or not g.get("name"):
            ctx.err(where, f"group {gi} has no name")
            continue
        if g["name"] in group_names:
            ctx.err(where, f"duplicate group {g['name']!r}")
        group_names.add(g["name"])
        rules = g.get("rules")
        if not isinstance(rules, list) or not rules:
            ctx.err(where, f"group {g['name']!r} has no rules")
            continue
        for ri, r in enumerate(rules):
            if not isinstance(r, dict):
                ctx.err(where, f"group {g['name']!r} rule {ri} is not a mapping")
                continue
            if ("record" in r) == ("alert" in r):
                ctx.err(where, f"group {g['name']!r} rule {ri}: needs exactly one of record/alert")
                continue
            if "record" in r:
                name = r["record"]
                label = f"{where}: record {name}"
                if not isinstance(name, str) or not RECORD_NAME_RE.match(name):
                    ctx.err(label, "recording rule name must be level:metric:operations")
                if name in records:
                    ctx.err(label, "duplicate recording rule")
                if "for" in r or "annotations" in r:
                    ctx.err(label, "recording rules take no for/annotations")
                records.append(name)
            else:
                name = r["alert"]
                label = f"{where}: alert {name}"
                if not isinstance(name, str) or not ALERT_NAME_RE.match(name):
                    ctx.err(label, "alert name must be CamelCase")
                if name in alerts:
                    ctx.err(label, "duplicate alert name")
                alerts.append(name)
                f = r.get("for")
                if f is None:
                    ctx.err(label, "alert has no `for:`")
                elif not DURATION_RE.match(str(f)):
                    ctx.err(label, f"`for: {f}` is not a duration")
                sev = (r.get("labels") or {}).get("severity")
                if sev is None:
                    ctx.err(label, "alert has no severity label")
                elif sev not in SEVERITIES:
                    ctx.err(label, f"severity {sev!r} not one of {', '.join(sorted(SEVERITIES))}")
                ann = r.get("annotations") or {}
                for key in ("summary", "description"):
                    if not isinstance(ann.get(key), str) or not ann[key].strip():
                        ctx.err(label, f"alert has no {key} annotation")
                    elif ann[key].count("{{") != ann[key].count("}}"):
                        ctx.err(label, f"unbalanced template braces in {key}")
            check_expr(r.get("expr") or "", label, ctx)
    return alerts, records


def check_required_alerts(alerts: list[str], ctx: Ctx) -> None:
    for name in REQUIRED_ALERTS:
        if name not in alerts:
            ctx.err("muster-rules.yaml", f"missing alert {name}")


def check_prometheus(doc, ctx: Ctx, where: str = "prometheus.yml") -> None:
    if not isinstance(doc, dict):
        ctx.err(where, "not a YAML mapping")
        return
    if RULES.name not in [Path(str(p)).name for p in doc.get("rule_files") or []]:
        ctx.err(where, f"rule_files does not load {RULES.name}")
    jobs = {c.get("job_name") for c in doc.get("scrape_configs") or [] if isinstance(c, dict)}
    for job in sorted(ctx.jobs):
        if job not in jobs:
            ctx.err(where, f'rules select job="{job}" but no scrape config has that job_name')


def run_promtool(ctx: Ctx) -> bool:
    exe = shutil.which("promtool")
    if not exe:
        return False
    for args in (["check", "rules", str(RULES)], ["check", "config", str(PROMETHEUS)]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        if p.returncode != 0:
            out = (p.stdout + p.stderr).strip().replace("\n", " | ")
            ctx.err("promtool " + " ".join(args[:2]), out)
    return True


# ----------------------------------------------------------------------- main

def fail(errors: list[str]) -> int:
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    print(f"monitoring: {len(errors)} problem(s)", file=sys.stderr)
    return 1


def main() -> int:
    docs, errors = parse_docs(DOCS.read_text(encoding="utf-8"))
    if errors:
        return fail(errors)
    try:
        rules_doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        return fail([f"{RULES.name}: invalid YAML: {e}"])
    try:
        prom_doc = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        return fail([f"{PROMETHEUS.name}: invalid YAML: {e}"])

    ctx = Ctx(docs, collect_records(rules_doc))
    panels = check_dashboard(DASHBOARD.read_text(encoding="utf-8"), ctx)
    alerts, records = check_rules(rules_doc, ctx)
    check_required_alerts(alerts, ctx)
    check_prometheus(prom_doc, ctx)
    promtool = run_promtool(ctx)
    if ctx.errors:
        return fail(ctx.errors)
    unused = sorted(set(docs) - ctx.referenced)
    if unused:
        print(f"note: documented but not monitored: {', '.join(unused)}")
    extra = ", promtool ok" if promtool else ""
    print(f"monitoring: {panels} panels, {len(alerts)} alerts, {len(records)} recording rules, "
          f"{len(ctx.referenced)} metrics referenced{extra}: ok")
    return 0


def _alert(name: str, expr: str, **over) -> dict:
    rule = {"alert": name, "expr": expr, "for": "5m", "labels": {"severity": "warning"},
            "annotations": {"summary": "s", "description": "d"}}
    rule.update(over)
    return {k: v for k, v in rule.items() if v is not None}


def self_test() -> int:
    """Feed deliberately broken input; every case must be caught, the control must pass."""
    docs, errors = parse_docs(DOCS.read_text(encoding="utf-8"))
    assert not errors, errors
    assert docs["muster_sm_queue_depth"].type == "gauge"
    assert docs["muster_gpus"].values["state"] == {"free", "reserved", "running"}
    assert docs["muster_connections_refused_total"].values["reason"] == {"total", "per_peer"}
    assert docs["muster_preemptions_total"].labels == {"vcluster", "reason"}

    def rules(*rs) -> dict:
        return {"groups": [{"name": "selftest", "rules": list(rs)}]}

    def errors_for(doc) -> list[str]:
        ctx = Ctx(docs, collect_records(doc))
        check_rules(doc, ctx, "selftest")
        return ctx.errors

    cases = [
        # (what, rules doc, substrings one error must all contain)
        ("unknown metric", rules(_alert("A", "muster_no_such_metric > 0")),
         ["unknown metric", "muster_no_such_metric"]),
        ("rate on a gauge", rules(_alert("A", "rate(muster_sm_queue_depth[5m]) > 0")),
         ["rate()", "muster_sm_queue_depth", "gauge"]),
        ("increase on a gauge", rules(_alert("A", "sum(increase(muster_gpus{state=\"free\"}[1h])) > 0")),
         ["increase()", "muster_gpus", "gauge"]),
        ("histogram_quantile on a gauge", rules(_alert("A", "histogram_quantile(0.9, sum by (le) (rate(muster_raft_term[5m]))) > 1")),
         ["histogram_quantile()", "muster_raft_term", "gauge"]),
        ("histogram_quantile dropping le", rules(_alert("A", "histogram_quantile(0.9, sum(rate(muster_raft_apply_seconds_bucket[5m]))) > 1")),
         ["drops `le`"]),
        ("bare histogram name", rules(_alert("A", "muster_raft_apply_seconds > 1")),
         ["is a histogram"]),
        ("undocumented label", rules(_alert("A", "muster_gpus{status=\"free\"} > 0")),
         ["no label 'status'"]),
        ("undocumented label value", rules(_alert("A", "muster_gpus{state=\"idle\"} > 0")),
         ['state="idle"']),
        ("missing for", rules(_alert("A", "muster_sm_nodes > 0", **{"for": None})),
         ["no `for:`"]),
        ("missing severity", rules(_alert("A", "muster_sm_nodes > 0", labels={})),
         ["no severity"]),
        ("missing summary", rules(_alert("A", "muster_sm_nodes > 0", annotations={"description": "d"})),
         ["no summary"]),
        ("duplicate alert", rules(_alert("A", "muster_sm_nodes > 0"), _alert("A", "muster_sm_nodes > 1")),
         ["duplicate alert"]),
        ("bad recording-rule name", rules({"record": "muster_queue_total", "expr": "max(muster_sm_queue_depth)"}),
         ["level:metric:operations"]),
        ("undefined recording rule", rules(_alert("A", "job:muster_nope:max > 0")),
         ["not a recording rule"]),
        ("foreign metric", rules(_alert("A", "node_load1{job=\"x\"} > 1")),
         ["selector on node_load1"]),
    ]
    caught = 0
    for what, doc, needles in cases:
        errs = errors_for(doc)
        hit = [e for e in errs if all(n in e for n in needles)]
        if not hit:
            print(f"self-test FAILED: {what} not caught; errors were: {errs}", file=sys.stderr)
            return 1
        caught += 1

    # The brief's own example: one rule file with both faults, both caught.
    both = errors_for(rules(_alert("Broken", "rate(muster_sm_queue_depth[5m]) > 0 and muster_bogus_total > 0")))
    assert any("unknown metric muster_bogus_total" in e for e in both), both
    assert any("rate() applied to muster_sm_queue_depth, a gauge" in e for e in both), both

    # Broken dashboards.
    dctx = Ctx(docs, set())
    check_dashboard("{not json", dctx, "selftest.json")
    assert any("invalid JSON" in e for e in dctx.errors), dctx.errors
    dctx = Ctx(docs, set())
    check_dashboard(json.dumps({"schemaVersion": 39, "title": "t", "panels": [
        {"id": 1, "type": "timeseries", "description": "d", "datasource": {"uid": "${datasource}"},
         "gridPos": {"h": 4, "w": 4, "x": 0, "y": 0}, "targets": [{"refId": "A", "expr": "muster_sm_nodes"}]},
        {"id": 2, "type": "timeseries", "title": "no targets", "description": "d",
         "datasource": {"uid": "${datasource}"}, "gridPos": {"h": 4, "w": 4, "x": 4, "y": 0}},
    ]}), dctx, "selftest.json")
    for needle in ("panel has no title", "panel has no targets", "no `datasource` template variable"):
        assert any(needle in e for e in dctx.errors), (needle, dctx.errors)
    caught += 2

    # Control: correct rules raise nothing (no false positives).
    good = rules(
        {"record": "job:muster_sm_queue_depth:max", "expr": "max by (job) (muster_sm_queue_depth)"},
        _alert("Good1", 'sum by (job) (rate(muster_preemptions_total{reason="priority"}[5m])) > 0.1'),
        _alert("Good2", "histogram_quantile(0.99, sum by (instance, le) (rate(muster_raft_apply_seconds_bucket[5m]))) > 1"),
        _alert("Good3", 'job:muster_sm_queue_depth:max > 0 and on (job) max by (job) (muster_gpus{state=~"free|reserved"}) > 0'),
        _alert("Good4", 'up{job="muster"} == 0'),
    )
    assert errors_for(good) == [], errors_for(good)
    print(f"self-test: {caught} broken inputs caught, control clean: ok")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true", help="check that the checker catches broken input")
    a = ap.parse_args()
    sys.exit(self_test() if a.self_test else main())
