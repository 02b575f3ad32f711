//! `muster submit --workflow pipeline.toml`: every step of a workflow in
//! one submit, accepted or refused whole.
//!
//! ```toml
//! name = "pipeline"
//! idempotency_key = "nightly-2026-11-28"   # optional
//!
//! [[step]]
//! name = "preprocess"
//! command = ["python3", "prep.py"]
//!
//! [[step]]
//! name = "train"
//! after = ["preprocess"]                   # a step's name, "step:any", or an allocation id
//! gang-size = 4
//! gpus = 1
//! command = ["python3", "train.py"]
//!
//! [[step]]
//! name = "evaluate"
//! after = ["train:ok"]
//! command = ["python3", "eval.py"]
//! ```
//!
//! Every other key of a step is a `muster submit` flag, spelled as on the
//! command line (`gang-size` or `gang_size`, `walltime = "2h"`, `env =
//! ["K=V"]`, `constraint = ["gpu.model=H100"]`), and checked as the command
//! line is; `array` and `after-corr` (a step's name) make an array step.
//! `{dir}` in a step's command or flags is the file's own directory.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use muster_proto::v1;

use crate::submit::{SubmitArgs, spec_of};

/// Step keys that are not `muster submit` flags.
const OWN_KEYS: &[&str] = &["name", "command", "after", "after-corr", "array", "after-any-of"];

/// Flags a step may not set: the workflow holds them.
const WORKFLOW_KEYS: &[&str] = &["idempotency-key", "secret", "dry-run", "workflow", "owner"];

/// The request a workflow file describes.
/// `{dir}` in a step's strings is `dir`, the workflow file's directory.
pub fn request_of(
    text: &str,
    dir: &std::path::Path,
    queue_if_unsatisfiable: bool,
) -> anyhow::Result<v1::SubmitWorkflowRequest> {
    let doc: toml::Table = toml::from_str(text).context("the workflow file is not TOML")?;
    let mut name = None;
    let mut key = String::new();
    let mut steps = Vec::new();
    for (k, v) in &doc {
        match (k.as_str(), v) {
            ("name", toml::Value::String(s)) => name = Some(s.clone()),
            ("idempotency_key" | "idempotency-key", toml::Value::String(s)) => key = s.clone(),
            ("step", toml::Value::Array(list)) => {
                for (i, s) in list.iter().enumerate() {
                    let toml::Value::Table(t) = s else { bail!("step {} is not a table ([[step]])", i + 1) };
                    steps.push(step_of(t, dir).with_context(|| match t.get("name") {
                        Some(toml::Value::String(n)) => format!("step {n:?}"),
                        _ => format!("step {}", i + 1),
                    })?);
                }
            }
            (k @ ("name" | "idempotency_key" | "idempotency-key" | "step"), _) => {
                bail!("{k} has the wrong type (name and idempotency_key are strings, step a list of [[step]] tables)")
            }
            (other, _) => bail!("unknown key {other:?} (a workflow has name, idempotency_key and [[step]] tables)"),
        }
    }
    let Some(name) = name else { bail!("the workflow needs a name (name = \"pipeline\")") };
    if steps.is_empty() {
        bail!("the workflow has no step ([[step]] tables)");
    }
    Ok(v1::SubmitWorkflowRequest { name, idempotency_key: key, steps, queue_if_unsatisfiable })
}

/// One `[[step]]` table as a wire step: its own keys, and the rest parsed
/// as `muster submit` flags.
fn step_of(t: &toml::Table, dir: &std::path::Path) -> anyhow::Result<v1::WorkflowStep> {
    let dir = dir.to_string_lossy();
    let text = |k: &str| -> anyhow::Result<Option<String>> {
        match t.get(k).or_else(|| t.get(&k.replace('-', "_"))) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => bail!("{k} must be a string"),
        }
    };
    let strings = |k: &str| -> anyhow::Result<Vec<String>> {
        match t.get(k) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(list)) => list
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s.replace("{dir}", &dir)),
                    toml::Value::Integer(n) => Ok(n.to_string()),
                    _ => bail!("{k} must be a list of strings"),
                })
                .collect(),
            Some(toml::Value::String(s)) => Ok(vec![s.clone()]),
            Some(_) => bail!("{k} must be a list of strings"),
        }
    };
    let Some(name) = text("name")? else { bail!("a step needs a name") };
    let command = strings("command")?;
    if command.is_empty() {
        bail!("a step needs a command (command = [\"python3\", \"train.py\"])");
    }
    // Step references and existing allocation ids, each with its kind.
    let mut after = Vec::new();
    let mut ids = Vec::new();
    for entry in strings("after")? {
        let (on, when) = entry.split_once(':').map_or((entry.as_str(), ""), |(a, b)| (a, b));
        if on.bytes().all(|b| b.is_ascii_digit()) && !on.is_empty() {
            ids.push(entry.clone());
        } else {
            after.push(v1::StepDependency { step: on.to_string(), when: when.to_string() });
        }
    }
    // Everything else: `muster submit` flags.
    let mut argv: Vec<String> = vec!["submit".into(), "--name".into(), name.clone()];
    for id in &ids {
        argv.extend(["--after".into(), id.clone()]);
    }
    let mut any_of = false;
    for (k, v) in t {
        let flag = k.replace('_', "-");
        if OWN_KEYS.contains(&flag.as_str()) {
            if flag == "after-any-of" {
                any_of = matches!(v, toml::Value::Boolean(true));
            }
            continue;
        }
        if WORKFLOW_KEYS.contains(&flag.as_str()) {
            bail!("{k} is the workflow's, not a step's");
        }
        match v {
            toml::Value::Boolean(true) => argv.push(format!("--{flag}")),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(list) => {
                for item in list {
                    argv.push(format!("--{flag}"));
                    argv.push(scalar(k, item)?.replace("{dir}", &dir));
                }
            }
            other => {
                argv.push(format!("--{flag}"));
                argv.push(scalar(k, other)?);
            }
        }
    }
    let keep = argv.iter().any(|a| a == "--keep-if-unsatisfiable");
    argv.retain(|a| a != "--keep-if-unsatisfiable");
    argv.push("--".into());
    argv.extend(command);
    let args = <Wrap as clap::Parser>::try_parse_from(&argv).map_err(|e| {
        let text = e.to_string();
        anyhow::anyhow!("{}", text.lines().next().unwrap_or("bad step").trim_start_matches("error: "))
    })?;
    let mut spec = spec_of(&args.args)?;
    spec.after_any_of = any_of;
    spec.keep_if_unsatisfiable = keep;
    if (any_of || keep) && ids.is_empty() && after.is_empty() {
        bail!("after-any-of and keep-if-unsatisfiable need a dependency (after = [...])");
    }
    Ok(v1::WorkflowStep {
        name,
        spec: Some(spec),
        array: text("array")?.unwrap_or_default(),
        after,
        after_corr: text("after-corr")?.unwrap_or_default(),
    })
}

/// A flag's value as text.
fn scalar(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) => f.to_string(),
        _ => bail!("{key} must be a string, a number, true or a list of them"),
    })
}

#[derive(clap::Parser)]
struct Wrap {
    #[command(flatten)]
    args: SubmitArgs,
}

/// Prints the workflow's ids by step.
pub fn print(resp: &v1::SubmitWorkflowResponse, out: crate::output::Output) {
    match out {
        crate::output::Output::Json => {
            let steps: BTreeMap<&str, serde_json::Value> = resp
                .steps
                .iter()
                .map(|s| (s.name.as_str(), serde_json::json!({ "id": s.id, "array": s.array, "status": s.status })))
                .collect();
            out!(
                "{}",
                serde_json::json!({ "id": resp.id, "duplicate": resp.duplicate, "workflow": true, "steps": steps })
            );
        }
        crate::output::Output::Text => {
            let again = if resp.duplicate { " (already submitted with this idempotency key)" } else { "" };
            out!("workflow {} submitted{again}", resp.id);
            for s in &resp.steps {
                let kind = if s.array { "array" } else { "allocation" };
                out!("  {:<20} {kind} {} ({})", s.name, s.id, s.status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIPELINE: &str = r#"
name = "pipeline"
idempotency_key = "k1"

[[step]]
name = "train"
after = ["preprocess"]
gang-size = 4
gpus = 1
env = ["LR=0.1"]
walltime = "2h"
command = ["python3", "{dir}/train.py"]

[[step]]
name = "preprocess"
command = ["python3", "prep.py"]

[[step]]
name = "evaluate"
after = ["train:ok", "7:any"]
array = "0-3%2"
command = ["python3", "eval.py"]
"#;

    #[test]
    fn a_workflow_file_becomes_steps_with_flags_checked_as_the_command_lines() {
        let r = request_of(PIPELINE, std::path::Path::new("/w"), false).unwrap();
        assert_eq!((r.name.as_str(), r.idempotency_key.as_str(), r.steps.len()), ("pipeline", "k1", 3));
        let train = &r.steps[0];
        let spec = train.spec.as_ref().unwrap();
        assert_eq!((spec.gang_size, spec.resources.unwrap().gpus, spec.walltime_s), (4, 1, 7200));
        assert_eq!(spec.env.get("LR").map(String::as_str), Some("0.1"));
        assert_eq!(spec.name, "train");
        assert_eq!(spec.command, ["python3", "/w/train.py"], "{{dir}} is the file's directory");
        assert_eq!(train.after[0].step, "preprocess");
        let eval = &r.steps[2];
        assert_eq!(eval.array, "0-3%2");
        assert_eq!(eval.after[0].when, "ok");
        let ids: Vec<(u64, &str)> = eval.spec.as_ref().unwrap().after.iter().map(|d| (d.id, d.when.as_str())).collect();
        assert_eq!(ids, [(7, "any")], "a number names an existing allocation");
    }

    #[test]
    fn mistakes_in_a_workflow_file_are_named() {
        let cases = [
            ("name = 3", "wrong type"),
            ("[[step]]\nname = \"a\"\ncommand = [\"true\"]", "needs a name"),
            ("name = \"w\"", "no step"),
            ("name = \"w\"\nfoo = 1", "unknown key \"foo\""),
            ("name = \"w\"\n[[step]]\nname = \"a\"", "needs a command"),
            ("name = \"w\"\n[[step]]\nname = \"a\"\ncommand = [\"true\"]\ngpu = 2", "--gpu"),
            ("name = \"w\"\n[[step]]\nname = \"a\"\ncommand = [\"true\"]\nsecret = [\"A=b\"]", "the workflow's"),
            ("name = \"w\"\n[[step]]\nname = \"a\"\ncommand = [\"true\"]\nwalltime = \"soon\"", "walltime"),
            ("not toml [", "not TOML"),
        ];
        for (text, want) in cases {
            let e = format!("{:#}", request_of(text, std::path::Path::new("/w"), false).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
