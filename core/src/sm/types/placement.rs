//! Where a gang may run: label constraints over node labels, and topology
//! packing (all tasks under one value of a label such as `rack`).
//!
//! ```text
//!   gpu.model=H100          the label equals the value
//!   gpu.model!=T4           the label is absent or differs
//!   gpu.model in (H100,A100)   gpu.model notin (T4)
//!   rack                    the label exists        !rack   it does not
//! ```
//!
//! A list of expressions is joined by commas (outside parentheses), all of
//! which must hold, as in Kubernetes label selectors.

use super::*;

/// How a label is tested.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LabelOp {
    /// Present and equal.
    Eq(String),
    /// Absent, or present and different.
    NotEq(String),
    /// Present and one of these (sorted, distinct).
    In(Vec<String>),
    /// Absent, or present and none of these (sorted, distinct).
    NotIn(Vec<String>),
    /// Present.
    Exists,
    /// Absent.
    NotExists,
}

/// One label expression of a placement constraint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LabelExpr {
    /// The label key.
    pub key: String,
    /// The test.
    pub op: LabelOp,
}

/// Most expressions one allocation may carry.
pub const MAX_CONSTRAINTS: usize = 16;

impl LabelExpr {
    /// Whether a node with `labels` meets the expression.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match &self.op {
            LabelOp::Eq(x) => v == Some(x),
            LabelOp::NotEq(x) => v != Some(x),
            LabelOp::In(xs) => v.is_some_and(|v| xs.binary_search(v).is_ok()),
            LabelOp::NotIn(xs) => v.is_none_or(|v| xs.binary_search(v).is_err()),
            LabelOp::Exists => v.is_some(),
            LabelOp::NotExists => v.is_none(),
        }
    }

    /// Parses a comma-separated list of expressions (commas inside `( )`
    /// belong to an `in` list).
    pub fn parse_list(s: &str) -> Result<Vec<LabelExpr>, String> {
        let mut out = Vec::new();
        let mut depth = 0usize;
        let mut start = 0;
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.checked_sub(1).ok_or_else(|| format!("{s:?}: unbalanced ')'"))?,
                ',' if depth == 0 => {
                    out.push(LabelExpr::parse(&s[start..i])?);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if depth != 0 {
            return Err(format!("{s:?}: unbalanced '('"));
        }
        out.push(LabelExpr::parse(&s[start..])?);
        Ok(out)
    }

    /// Parses one expression.
    pub fn parse(s: &str) -> Result<LabelExpr, String> {
        let s = s.trim();
        let key_of = |k: &str| -> Result<String, String> {
            let k = k.trim();
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/')) {
                return Err(format!("{s:?}: {k:?} is not a label key (letters, digits, . - _ /)"));
            }
            Ok(k.to_string())
        };
        let value_of = |v: &str| -> Result<String, String> {
            let v = v.trim();
            let odd = |c: char| {
                c.is_control() || crate::sm::validate::is_bidi_control(c) || matches!(c, ',' | '(' | ')' | '=' | '!')
            };
            if v.is_empty() || v.chars().any(odd) {
                return Err(format!("{s:?}: {v:?} is not a label value"));
            }
            Ok(v.to_string())
        };
        let list_of = |rest: &str| -> Result<Vec<String>, String> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("{s:?}: the values of in/notin go in parentheses, e.g. (H100,A100)"))?;
            let mut vs = inner.split(',').map(value_of).collect::<Result<Vec<_>, _>>()?;
            vs.sort();
            vs.dedup();
            Ok(vs)
        };
        if let Some((k, v)) = s.split_once("!=") {
            return Ok(LabelExpr { key: key_of(k)?, op: LabelOp::NotEq(value_of(v)?) });
        }
        if s.contains("==") {
            return Err(format!("{s:?}: write key=value (== is not an operator)"));
        }
        if let Some((k, v)) = s.split_once('=') {
            return Ok(LabelExpr { key: key_of(k)?, op: LabelOp::Eq(value_of(v)?) });
        }
        let words: Vec<&str> = s.splitn(2, char::is_whitespace).collect();
        if let [k, rest] = words[..] {
            let rest = rest.trim_start();
            if let Some(list) = rest.strip_prefix("notin") {
                return Ok(LabelExpr { key: key_of(k)?, op: LabelOp::NotIn(list_of(list)?) });
            }
            if let Some(list) = rest.strip_prefix("in") {
                return Ok(LabelExpr { key: key_of(k)?, op: LabelOp::In(list_of(list)?) });
            }
            return Err(format!(
                "{s:?} is not a label expression (key=value, key!=value, key in (a,b), key notin (a,b), key, !key)"
            ));
        }
        if let Some(k) = s.strip_prefix('!') {
            return Ok(LabelExpr { key: key_of(k)?, op: LabelOp::NotExists });
        }
        Ok(LabelExpr { key: key_of(s)?, op: LabelOp::Exists })
    }
}

impl fmt::Display for LabelExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        match &self.op {
            LabelOp::Eq(v) => write!(f, "{k}={v}"),
            LabelOp::NotEq(v) => write!(f, "{k}!={v}"),
            LabelOp::In(vs) => write!(f, "{k} in ({})", vs.join(",")),
            LabelOp::NotIn(vs) => write!(f, "{k} notin ({})", vs.join(",")),
            LabelOp::Exists => write!(f, "{k}"),
            LabelOp::NotExists => write!(f, "!{k}"),
        }
    }
}

/// All tasks of a gang under one value of a topology label.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Packing {
    /// The topology label (`rack`, `block`, `switch`, …).
    pub key: String,
    /// Required: placed only where one value has room for the whole gang.
    /// Preferred: packed when it can be, spread when it cannot.
    pub required: bool,
}

impl Packing {
    /// Parses `rack` (required) or `rack:preferred` / `rack:required`.
    pub fn parse(s: &str) -> Result<Packing, String> {
        let (key, mode) = s.trim().split_once(':').unwrap_or((s.trim(), "required"));
        let required = match mode {
            "required" => true,
            "preferred" => false,
            _ => return Err(format!("{s:?}: the mode is required or preferred, not {mode:?}")),
        };
        let expr = LabelExpr::parse(key)?;
        if expr.op != LabelOp::Exists {
            return Err(format!("{s:?}: pack by a label key, e.g. rack"));
        }
        Ok(Packing { key: expr.key, required })
    }
}

impl fmt::Display for Packing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.key, if self.required { "required" } else { "preferred" })
    }
}

/// Where a gang may go: its constraints and packing.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// Every expression must hold on each of the gang's nodes.
    pub constraints: Vec<LabelExpr>,
    /// Topology packing, if any.
    pub pack_by: Option<Packing>,
}

impl Placement {
    /// Whether the gang may go anywhere it fits.
    pub fn is_any(&self) -> bool {
        self.constraints.is_empty() && self.pack_by.is_none()
    }

    /// The first constraint a node with `labels` does not meet.
    pub fn unmet<'a>(&'a self, labels: &BTreeMap<String, String>) -> Option<&'a LabelExpr> {
        self.constraints.iter().find(|c| !c.matches(labels))
    }

    /// Whether a node with `labels` meets every constraint (and carries the
    /// packing label when packing is required).
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        self.unmet(labels).is_none() && self.pack_by.as_ref().is_none_or(|p| !p.required || labels.contains_key(&p.key))
    }
}
