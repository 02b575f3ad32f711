//! Validation of user input, shared by the API edge and `apply`.
//!
//! Each check names the field as the API spells it, so the gRPC edge can turn
//! a rejection straight into `INVALID_ARGUMENT` with that field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rejection::Rejection;
use super::types::{
    Admission, AllocSpec, LabelExpr, MAX_CONSTRAINTS, MAX_PIDS_MAX, MAX_RENDEZVOUS_PORTS, MAX_SECRET_VALUE_BYTES,
    MAX_SECRETS, MAX_SECRETS_BYTES, NodeId, PORTS_LABEL, Packing, Placement, PortRange, Resources, Secrets,
    agent_may_set,
};

/// The highest preemption class (never preempted).
pub const MAX_PREEMPTION_CLASS: u8 = 10;

/// Size limits on submitted allocations. Part of the replicated state, so
/// every replica validates against the same numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest gang.
    pub max_gang_size: u32,
    /// Most GPUs one task may ask for.
    pub max_task_gpus: u32,
    /// Longest walltime, in seconds.
    pub max_walltime_s: u64,
    /// Largest `max_retries`.
    pub max_retries: u32,
    /// Most bytes of argv, all arguments together.
    pub max_command_bytes: usize,
    /// Most bytes of environment, keys and values together.
    pub max_env_bytes: usize,
    /// Longest owner, idempotency key, node id, label key or value.
    pub max_name_bytes: usize,
    /// Most labels on a node.
    pub max_labels: usize,
    /// Watchdog trips a task may have retried elsewhere; the next one fails
    /// its allocation.
    pub watchdog_max_retries: u32,
    /// Failures of a single task retried in place on its draining node (the
    /// worker-draining seed's 3); later ones go back to the queue.
    pub drain_max_retries: u32,
    /// A failure this soon after its start (or a start that failed) is
    /// early: the same early failure twice in a row fails the allocation
    /// instead of retrying it.
    pub early_failure_ms: u64,
    /// The back-off before a gang that failed is placed again: this, doubled
    /// for each failure after the first, up to `retry_backoff_cap_ms`.
    pub retry_backoff_ms: u64,
    /// The longest back-off.
    pub retry_backoff_cap_ms: u64,
}

impl Limits {
    /// The back-off after the gang's `failures`-th failure.
    pub fn retry_backoff(&self, failures: u32) -> u64 {
        let doublings = failures.saturating_sub(1).min(32);
        self.retry_backoff_ms.saturating_mul(1u64 << doublings).min(self.retry_backoff_cap_ms)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_gang_size: 4096,
            max_task_gpus: 64,
            max_walltime_s: 30 * 24 * 3600,
            max_retries: 100,
            max_command_bytes: 64 * 1024,
            max_env_bytes: 64 * 1024,
            max_name_bytes: 256,
            max_labels: 64,
            watchdog_max_retries: 3,
            drain_max_retries: 3,
            early_failure_ms: 10_000,
            retry_backoff_ms: 1_000,
            retry_backoff_cap_ms: 60_000,
        }
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> Rejection {
    Rejection::InvalidSpec { field: field.to_string(), reason: reason.into() }
}

pub(crate) fn invalid_node(field: &str, reason: impl Into<String>) -> Rejection {
    Rejection::InvalidNode { field: field.to_string(), reason: reason.into() }
}

pub(crate) fn check_name(field: &str, value: &str, limits: &Limits) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if value.len() > limits.max_name_bytes {
        return Err(format!("{field} is {} bytes, the limit is {}", value.len(), limits.max_name_bytes));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(format!("{field} must not contain control characters"));
    }
    if value.chars().any(is_bidi_control) {
        return Err(format!("{field} must not contain bidirectional control characters"));
    }
    Ok(())
}

/// Unicode's bidirectional formatting characters (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069): in a name or label they make text show
/// in another order than it compares (a U+202E in a value reverses what
/// follows), so names, labels and label expressions refuse them.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Checks a submitted allocation against `limits`.
pub fn validate_spec(spec: &AllocSpec, limits: &Limits) -> Result<(), Rejection> {
    check_name("owner", &spec.owner, limits).map_err(|r| invalid("owner", r))?;
    if !spec.name.is_empty() {
        check_name("name", &spec.name, limits).map_err(|r| invalid("name", r))?;
    }
    if spec.gang_size == 0 {
        return Err(invalid("gang_size", "must be at least 1"));
    }
    if spec.gang_size > limits.max_gang_size {
        return Err(invalid(
            "gang_size",
            format!("{} is above the maximum of {}", spec.gang_size, limits.max_gang_size),
        ));
    }
    validate_task_resources(&spec.resources, limits)?;
    if spec.preemption_class > MAX_PREEMPTION_CLASS {
        return Err(invalid(
            "preemption_class",
            format!("{} is outside 0..={MAX_PREEMPTION_CLASS}", spec.preemption_class),
        ));
    }
    if spec.is_sensitive() && spec.preemption_class != MAX_PREEMPTION_CLASS {
        return Err(invalid(
            "preemption_class",
            format!("sensitive allocations are class {MAX_PREEMPTION_CLASS}, not {}", spec.preemption_class),
        ));
    }
    if spec.checkpoint_estimate_s == 0 || u64::from(spec.checkpoint_estimate_s) > limits.max_walltime_s {
        return Err(invalid(
            "checkpoint_estimate_s",
            format!("{} s is outside 1..={} s", spec.checkpoint_estimate_s, limits.max_walltime_s),
        ));
    }
    if spec.walltime_s == 0 {
        return Err(invalid("walltime_s", "must be at least 1 second"));
    }
    if spec.walltime_s > limits.max_walltime_s {
        return Err(invalid(
            "walltime_s",
            format!("{} s is above the maximum of {} s", spec.walltime_s, limits.max_walltime_s),
        ));
    }
    if u64::from(spec.stall_timeout_s) > spec.walltime_s {
        return Err(invalid(
            "stall_timeout_s",
            format!("{} s is longer than the walltime of {} s", spec.stall_timeout_s, spec.walltime_s),
        ));
    }
    if spec.max_retries == 0 || spec.max_retries > limits.max_retries {
        return Err(invalid("max_retries", format!("{} is outside 1..={}", spec.max_retries, limits.max_retries)));
    }
    validate_placement(&spec.placement, limits)?;
    if spec.pids_max > MAX_PIDS_MAX {
        return Err(invalid("pids_max", format!("{} is above the maximum of {MAX_PIDS_MAX}", spec.pids_max)));
    }
    spec.after.validate().map_err(|r| invalid("after", r))?;
    if spec.ports > MAX_RENDEZVOUS_PORTS {
        return Err(invalid("ports", format!("{} is above the maximum of {MAX_RENDEZVOUS_PORTS}", spec.ports)));
    }
    if let Some(c) = &spec.container {
        c.check().map_err(|(field, reason)| invalid(field, reason))?;
    }
    // With an image, an empty command runs the image's own entrypoint and cmd.
    if spec.container.is_none() || !spec.command.is_empty() {
        validate_command(&spec.command, limits)?;
    }
    validate_env(&spec.env, limits)?;
    let vc = &spec.vcluster;
    if vc.is_empty()
        || vc.len() > 63
        || !vc.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || vc.starts_with('-')
    {
        return Err(invalid("vcluster", format!("{vc:?} is not a name (1-63 of a-z, 0-9, -)")));
    }
    if let Some(key) = &spec.idempotency_key {
        check_name("idempotency_key", key, limits).map_err(|r| invalid("idempotency_key", r))?;
    }
    Ok(())
}

/// The most host memory a task or node may name: 64 TiB, in MiB.
pub const MAX_MEM_MB: u64 = 64 << 20;
/// The most memory one GPU may have: 1 TiB, in MiB.
pub const MAX_VRAM_MB: u64 = 1 << 20;
/// The most CPU cores a task or node may name.
pub const MAX_CPUS: u32 = 16_384;
/// The most GPUs a node may report.
pub const MAX_NODE_GPUS: u32 = 1_024;

/// The bounds every resource amount is held to, task or node: what is
/// above them is a typo or an attack, and would overflow the sums.
fn check_bounds(r: &Resources) -> Result<(), (&'static str, String)> {
    if r.mem_mb > MAX_MEM_MB {
        return Err((
            "resources.mem_mb",
            format!("{} MiB is above the maximum of {MAX_MEM_MB} MiB (64 TiB)", r.mem_mb),
        ));
    }
    if r.vram_mb > MAX_VRAM_MB {
        return Err((
            "resources.vram_mb",
            format!("{} MiB per GPU is above the maximum of {MAX_VRAM_MB} MiB (1 TiB)", r.vram_mb),
        ));
    }
    if r.cpus > MAX_CPUS {
        return Err(("resources.cpus", format!("{} is above the maximum of {MAX_CPUS}", r.cpus)));
    }
    Ok(())
}

fn validate_task_resources(r: &Resources, limits: &Limits) -> Result<(), Rejection> {
    if r.cpus == 0 {
        return Err(invalid("resources.cpus", "must be at least 1"));
    }
    if r.mem_mb == 0 {
        return Err(invalid("resources.mem_mb", "must be at least 1"));
    }
    check_bounds(r).map_err(|(field, reason)| invalid(field, reason))?;
    if r.gpus > limits.max_task_gpus {
        return Err(invalid("resources.gpus", format!("{} is above the maximum of {}", r.gpus, limits.max_task_gpus)));
    }
    if r.gpus == 0 && r.vram_mb > 0 {
        return Err(invalid("resources.vram_mb", "asks for GPU memory without asking for a GPU"));
    }
    Ok(())
}

fn validate_placement(p: &Placement, limits: &Limits) -> Result<(), Rejection> {
    if p.constraints.len() > MAX_CONSTRAINTS {
        return Err(invalid(
            "constraints",
            format!("{} expressions, the limit is {MAX_CONSTRAINTS}", p.constraints.len()),
        ));
    }
    // Each must read back as written: what the CLI and the API parse.
    for c in &p.constraints {
        let text = c.to_string();
        if text.len() > limits.max_name_bytes * 4 || LabelExpr::parse(&text).as_ref() != Ok(c) {
            return Err(invalid("constraints", format!("{text:?} is not a valid label expression")));
        }
    }
    if let Some(pack) = &p.pack_by
        && Packing::parse(&pack.to_string()).as_ref() != Ok(pack)
    {
        return Err(invalid("pack_by", format!("{:?} is not a label key", pack.key)));
    }
    Ok(())
}

fn validate_command(command: &[String], limits: &Limits) -> Result<(), Rejection> {
    match command.first() {
        None => return Err(invalid("command", "must name a program")),
        Some(program) if program.is_empty() => return Err(invalid("command", "the program name is empty")),
        Some(_) => {}
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(invalid("command", "arguments must not contain NUL"));
    }
    let bytes: usize = command.iter().map(|a| a.len() + 1).sum();
    if bytes > limits.max_command_bytes {
        return Err(invalid("command", format!("{bytes} bytes, the limit is {}", limits.max_command_bytes)));
    }
    Ok(())
}

fn validate_env(env: &BTreeMap<String, String>, limits: &Limits) -> Result<(), Rejection> {
    let mut bytes = 0usize;
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid("env", format!("{k:?} is not a valid variable name")));
        }
        if v.contains('\0') {
            return Err(invalid("env", format!("the value of {k} contains NUL")));
        }
        bytes += k.len() + v.len() + 2;
    }
    if bytes > limits.max_env_bytes {
        return Err(invalid("env", format!("{bytes} bytes, the limit is {}", limits.max_env_bytes)));
    }
    Ok(())
}

/// Checks a node registration against `limits`.
pub fn validate_node(
    node: &NodeId,
    resources: &Resources,
    labels: &BTreeMap<String, String>,
    limits: &Limits,
) -> Result<(), Rejection> {
    check_name("node_id", node.as_str(), limits).map_err(|r| invalid_node("node_id", r))?;
    if resources.cpus == 0 {
        return Err(invalid_node("resources.cpus", "must be at least 1"));
    }
    if resources.mem_mb == 0 {
        return Err(invalid_node("resources.mem_mb", "must be at least 1"));
    }
    if resources.gpus > 0 && resources.vram_mb == 0 {
        return Err(invalid_node("resources.vram_mb", "a node with GPUs must report their memory"));
    }
    check_bounds(resources).map_err(|(field, reason)| invalid_node(field, reason))?;
    if resources.gpus > MAX_NODE_GPUS {
        return Err(invalid_node(
            "resources.gpus",
            format!("{} is above the maximum of {MAX_NODE_GPUS}", resources.gpus),
        ));
    }
    if labels.len() > limits.max_labels {
        return Err(invalid_node("labels", format!("{} labels, the limit is {}", labels.len(), limits.max_labels)));
    }
    for (k, v) in labels {
        check_name("labels", k, limits).map_err(|r| invalid_node("labels", r))?;
        if v.len() > limits.max_name_bytes {
            return Err(invalid_node("labels", format!("the value of {k} is too long")));
        }
        if v.chars().any(|c| c.is_control() || is_bidi_control(c)) {
            return Err(invalid_node("labels", format!("the value of {k} holds control or bidirectional characters")));
        }
    }
    if let Some(v) = labels.get(PORTS_LABEL) {
        PortRange::parse(v).map_err(|r| invalid_node(&format!("labels.{PORTS_LABEL}"), r))?;
    }
    if let Some(v) = labels.get(DRAIN_TIMEOUT_LABEL) {
        let s = parse_duration_s(v).map_err(|r| invalid_node(&format!("labels.{DRAIN_TIMEOUT_LABEL}"), r))?;
        if s > limits.max_walltime_s {
            return Err(invalid_node(
                &format!("labels.{DRAIN_TIMEOUT_LABEL}"),
                format!("{s} s is above the maximum of {} s", limits.max_walltime_s),
            ));
        }
    }
    Ok(())
}

/// The node label giving its drain timeout (its pool's default, the seed's
/// per-template `drain_timeout_hours`), as a duration such as `4h`.
pub const DRAIN_TIMEOUT_LABEL: &str = "muster.drain-timeout";

/// Parses `90`, `90s`, `30m`, `4h`, `2d` into seconds.
pub fn parse_duration_s(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 30m, 4h)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use s, m, h or d)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too long"))
}

/// The longest reason an operator may give for a lifecycle command.
pub const MAX_REASON_BYTES: usize = 1024;

/// Checks an operator's lifecycle request: who asked, why, and (for a drain)
/// the timeout, which may not exceed the longest walltime.
pub fn validate_node_request(
    by: &str,
    reason: &str,
    timeout_ms: Option<u64>,
    limits: &Limits,
) -> Result<(), Rejection> {
    check_name("by", by, limits).map_err(|r| invalid_node("by", r))?;
    if reason.len() > MAX_REASON_BYTES {
        return Err(invalid_node("reason", format!("{} bytes, the limit is {MAX_REASON_BYTES}", reason.len())));
    }
    if reason.chars().any(|c| c.is_control()) {
        return Err(invalid_node("reason", "must not contain control characters"));
    }
    if let Some(t) = timeout_ms
        && t / 1000 > limits.max_walltime_s
    {
        return Err(invalid_node(
            "timeout",
            format!("{} s is above the maximum of {} s", t / 1000, limits.max_walltime_s),
        ));
    }
    Ok(())
}

/// Checks an admission: what it admits is a node that could register.
pub fn validate_admission(a: &Admission, limits: &Limits) -> Result<(), Rejection> {
    let field = |f: &str| format!("admission.{f}");
    check_name("by", &a.by, limits).map_err(|r| invalid_node("admission.by", r))?;
    check_bounds(&a.resources).map_err(|(f, r)| invalid_node(&field(f), r))?;
    if a.resources.gpus > MAX_NODE_GPUS {
        return Err(invalid_node(
            "admission.resources.gpus",
            format!("{} is above the maximum of {MAX_NODE_GPUS}", a.resources.gpus),
        ));
    }
    if a.labels.len() > limits.max_labels {
        return Err(invalid_node(
            "admission.labels",
            format!("{} labels, the limit is {}", a.labels.len(), limits.max_labels),
        ));
    }
    for (k, v) in &a.labels {
        check_name("admission.labels", k, limits).map_err(|r| invalid_node("admission.labels", r))?;
        if !agent_may_set(k) {
            return Err(invalid_node(
                "admission.labels",
                format!("{k} is reserved: an admin sets it with muster node label, the agent never reports it"),
            ));
        }
        if v.len() > limits.max_name_bytes || v.chars().any(|c| c.is_control() || is_bidi_control(c)) {
            return Err(invalid_node(
                "admission.labels",
                format!("the value of {k} is too long or holds control characters"),
            ));
        }
    }
    Ok(())
}

/// Checks an allocation's secrets: environment names not also in its
/// `env`, values without NUL, within [`MAX_SECRETS`],
/// [`MAX_SECRET_VALUE_BYTES`] and [`MAX_SECRETS_BYTES`]. Errors name the
/// secret, never its value.
pub fn validate_secrets(spec: &AllocSpec, secrets: &Secrets) -> Result<(), Rejection> {
    let bad = |reason: String| Rejection::InvalidSpec { field: "secrets".into(), reason };
    if secrets.0.len() > MAX_SECRETS {
        return Err(bad(format!("{} secrets, the limit is {MAX_SECRETS}", secrets.0.len())));
    }
    let mut bytes = 0;
    for (k, v) in &secrets.0 {
        let name_ok = !k.is_empty()
            && k.len() <= 128
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !name_ok {
            return Err(bad(format!("{:?} is not a variable name (letters, digits and _, at most 128)", prefix(k))));
        }
        if spec.env.contains_key(k) {
            return Err(bad(format!("{k} is also in env: a variable is either plain or secret")));
        }
        if v.len() > MAX_SECRET_VALUE_BYTES {
            return Err(bad(format!("the value of {k} is {} bytes, the limit is {MAX_SECRET_VALUE_BYTES}", v.len())));
        }
        if v.contains('\0') {
            return Err(bad(format!("the value of {k} contains NUL")));
        }
        bytes += k.len() + v.len();
    }
    if bytes > MAX_SECRETS_BYTES {
        return Err(bad(format!("{bytes} bytes, the limit is {MAX_SECRETS_BYTES}")));
    }
    Ok(())
}

/// At most 40 characters of `s`, for errors that must not echo much.
fn prefix(s: &str) -> String {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
