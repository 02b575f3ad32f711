//! Dependencies between allocations: what `muster submit --after` names,
//! and when each kind is met, can never be met, or is still pending.
//!
//! ```text
//!   --after 12          12 must succeed (ok, the default)
//!   --after 12:any      12 must end, however it ends
//!   --after 12:notok    12 must fail or be cancelled
//!   --after 12:started  12 must have started a task (it may still run)
//!   --after 12,13:any   both (all of a list must be met)
//! ```
//!
//! Each rule reads only the dependency's status and whether it ever
//! started, so a forgotten allocation's tombstone can answer for it.

use super::*;

/// The most dependencies one allocation may name.
pub const MAX_DEPENDENCIES: usize = 64;

/// The longest `--after` list accepted, in bytes.
pub const MAX_AFTER_EXPR_BYTES: usize = 2048;

/// What a dependency waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AfterWhen {
    /// It succeeded (done).
    #[default]
    Ok,
    /// It ended: done, failed or cancelled.
    Any,
    /// It failed or was cancelled.
    NotOk,
    /// A task of it started running.
    Started,
}

impl AfterWhen {
    /// The CLI and API spelling: `ok`, `any`, `notok`, `started`.
    pub fn as_str(self) -> &'static str {
        match self {
            AfterWhen::Ok => "ok",
            AfterWhen::Any => "any",
            AfterWhen::NotOk => "notok",
            AfterWhen::Started => "started",
        }
    }

    /// Parses the spelling [`AfterWhen::as_str`] gives.
    pub fn parse(s: &str) -> Option<AfterWhen> {
        [AfterWhen::Ok, AfterWhen::Any, AfterWhen::NotOk, AfterWhen::Started].into_iter().find(|w| w.as_str() == s)
    }

    /// What a dependent waits for, in words ("to succeed").
    pub fn waits_for(self) -> &'static str {
        match self {
            AfterWhen::Ok => "to succeed",
            AfterWhen::Any => "to end",
            AfterWhen::NotOk => "to fail or be cancelled",
            AfterWhen::Started => "to start",
        }
    }
}

/// One dependency: allocation `on`, and what it must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Dependency {
    /// The allocation waited for.
    pub on: AllocId,
    /// What it must do.
    pub when: AfterWhen,
}

/// What an allocation waits for before it may be queued (`muster submit
/// --after`, `--after-any-of`, `--keep-if-unsatisfiable`). Empty: nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct After {
    /// The dependencies, in the order given.
    pub deps: Vec<Dependency>,
    /// Met when the first of them is met (otherwise when all are).
    pub any_of: bool,
    /// When they can never be met, stay waiting (until cancelled) instead
    /// of failing at once.
    pub keep_if_unsatisfiable: bool,
}

impl After {
    /// Whether it names no dependency.
    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    /// What it waits for, in words: "12 to succeed and 13 to end", or
    /// "the first of 12 to succeed, 13 to end".
    pub fn describe(&self) -> String {
        let each: Vec<String> = self.deps.iter().map(|d| format!("{} {}", d.on, d.when.waits_for())).collect();
        if self.any_of { format!("the first of {}", each.join(", ")) } else { each.join(" and ") }
    }

    /// Checks what needs no state: at most [`MAX_DEPENDENCIES`], ids from
    /// 1, none named twice, and no flag without a dependency.
    pub fn validate(&self) -> Result<(), String> {
        if self.deps.len() > MAX_DEPENDENCIES {
            return Err(format!("{} dependencies; the most is {MAX_DEPENDENCIES}", self.deps.len()));
        }
        if self.deps.is_empty() && (self.any_of || self.keep_if_unsatisfiable) {
            return Err("any_of and keep_if_unsatisfiable need a dependency".to_string());
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.deps {
            if d.on == 0 {
                return Err("0 is not an allocation id".to_string());
            }
            if !seen.insert(d.on) {
                return Err(format!("allocation {} is named twice; name it once", d.on));
            }
        }
        Ok(())
    }
}

/// Where a dependency, or a set of them, stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not decided yet.
    Pending,
    /// Met: the dependent may be queued.
    Met,
    /// Can never be met, and why ("dependency 12 failed").
    Never(String),
}

impl Dependency {
    /// Where it stands, given its allocation's status and whether a task of
    /// it ever started.
    pub fn standing(&self, status: AllocStatus, started: bool) -> Standing {
        let on = self.on;
        let ended = |how: &str| Standing::Never(format!("dependency {on} {how}"));
        match (self.when, status) {
            (AfterWhen::Ok, AllocStatus::Done) => Standing::Met,
            (AfterWhen::Ok, AllocStatus::Failed) => ended("failed"),
            (AfterWhen::Ok, AllocStatus::Cancelled) => ended("was cancelled"),
            (AfterWhen::NotOk, AllocStatus::Failed | AllocStatus::Cancelled) => Standing::Met,
            (AfterWhen::NotOk, AllocStatus::Done) => ended("succeeded"),
            (AfterWhen::Any, s) if s.is_terminal() => Standing::Met,
            (AfterWhen::Started, _) if started => Standing::Met,
            (AfterWhen::Started, s) if s.is_terminal() => ended(&format!("ended ({}) without starting", s.as_str())),
            _ => Standing::Pending,
        }
    }
}

/// Where a list stands: with `any_of`, met when one is met and never when
/// none can be; otherwise met when all are met and never when one cannot
/// be (the first such, in list order, is the reason).
pub fn combined_standing(standings: impl IntoIterator<Item = Standing>, any_of: bool) -> Standing {
    let mut pending = false;
    let mut reasons = Vec::new();
    for s in standings {
        match s {
            Standing::Met if any_of => return Standing::Met,
            Standing::Never(why) if !any_of => return Standing::Never(why),
            Standing::Met => {}
            Standing::Never(why) => reasons.push(why),
            Standing::Pending => pending = true,
        }
    }
    match (pending, any_of) {
        (true, _) => Standing::Pending,
        (false, false) => Standing::Met,
        (false, true) if reasons.is_empty() => Standing::Met,
        (false, true) => Standing::Never(format!("none of its dependencies can be met: {}", reasons.join("; "))),
    }
}

/// Parses an `--after` list: `ID[:ok|any|notok|started]`, comma-joined.
/// An allocation named twice is refused (say what it must do once).
pub fn parse_after(list: &str) -> Result<Vec<Dependency>, String> {
    if list.len() > MAX_AFTER_EXPR_BYTES {
        return Err(format!("the dependency list is {} bytes; the most is {MAX_AFTER_EXPR_BYTES}", list.len()));
    }
    let mut deps: Vec<Dependency> = Vec::new();
    for part in list.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!("{list:?} has an empty dependency (write ID or ID:ok|any|notok|started)"));
        }
        let (id, when) = part.split_once(':').unwrap_or((part, "ok"));
        let on: AllocId = id
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{id:?} in {list:?} is not an allocation id"))?;
        let when = AfterWhen::parse(when.trim())
            .ok_or_else(|| format!("{when:?} in {list:?} is not one of ok, any, notok, started"))?;
        if deps.iter().any(|d| d.on == on) {
            return Err(format!("allocation {on} is named twice in {list:?}; name it once"));
        }
        deps.push(Dependency { on, when });
        if deps.len() > MAX_DEPENDENCIES {
            return Err(format!("{list:?} names more than {MAX_DEPENDENCIES} dependencies"));
        }
    }
    Ok(deps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind against every status, started or not, written out as a
    /// table: M met, N never, P pending.
    #[test]
    fn each_kind_is_met_never_or_pending_as_its_table_says() {
        use AllocStatus::{Cancelled, Failed};
        let table = |when: AfterWhen, status: AllocStatus, started: bool| -> char {
            match (Dependency { on: 12, when }).standing(status, started) {
                Standing::Met => 'M',
                Standing::Never(_) => 'N',
                Standing::Pending => 'P',
            }
        };
        let row = |when, started| AllocStatus::ALL.map(|s| table(when, s, started)).iter().collect::<String>();
        // Queued Suspended Reserved Running TearingDown Done Failed Cancelled Waiting
        assert_eq!(row(AfterWhen::Ok, true), "PPPPPMNNP");
        assert_eq!(row(AfterWhen::NotOk, true), "PPPPPNMMP");
        assert_eq!(row(AfterWhen::Any, false), "PPPPPMMMP");
        assert_eq!(row(AfterWhen::Started, true), "MMMMMMMMM");
        assert_eq!(row(AfterWhen::Started, false), "PPPPPNNNP");
        let why = Dependency { on: 12, when: AfterWhen::Ok }.standing(Failed, true);
        assert_eq!(why, Standing::Never("dependency 12 failed".into()));
        let why = Dependency { on: 7, when: AfterWhen::Started }.standing(Cancelled, false);
        assert_eq!(why, Standing::Never("dependency 7 ended (cancelled) without starting".into()));
    }

    #[test]
    fn a_list_needs_all_and_an_any_of_list_needs_one() {
        let never = |s: &str| Standing::Never(s.to_string());
        use Standing::{Met, Pending};
        assert_eq!(combined_standing([Met, Met], false), Met);
        assert_eq!(combined_standing([Met, Pending], false), Pending);
        assert_eq!(
            combined_standing([Pending, never("dependency 3 failed"), never("x")], false),
            never("dependency 3 failed")
        );
        assert_eq!(combined_standing([Pending, Met], true), Met);
        assert_eq!(combined_standing([Pending, never("a")], true), Pending);
        assert_eq!(
            combined_standing([never("dependency 3 failed"), never("dependency 4 failed")], true),
            never("none of its dependencies can be met: dependency 3 failed; dependency 4 failed")
        );
        assert_eq!(combined_standing([], false), Met, "no dependency: nothing to wait for");
    }

    #[test]
    fn after_lists_parse_and_each_mistake_is_named() {
        let d = |on, when| Dependency { on, when };
        assert_eq!(parse_after("12").unwrap(), [d(12, AfterWhen::Ok)]);
        assert_eq!(
            parse_after("12:any, 13:notok,14:started,15:ok").unwrap(),
            [d(12, AfterWhen::Any), d(13, AfterWhen::NotOk), d(14, AfterWhen::Started), d(15, AfterWhen::Ok)]
        );
        for (list, want) in [
            ("", "empty dependency"),
            ("12,", "empty dependency"),
            ("x", "not an allocation id"),
            ("0", "not an allocation id"),
            ("-3", "not an allocation id"),
            ("12:soon", "not one of ok, any, notok, started"),
            ("12,12:any", "named twice"),
        ] {
            let e = parse_after(list).unwrap_err();
            assert!(e.contains(want), "{list:?}: {e}");
        }
        let many = (1..=MAX_DEPENDENCIES as u64 + 1).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        assert!(parse_after(&many).unwrap_err().contains("more than 64"));
        assert!(parse_after(&"1,".repeat(MAX_AFTER_EXPR_BYTES)).unwrap_err().contains("bytes"));
        for w in [AfterWhen::Ok, AfterWhen::Any, AfterWhen::NotOk, AfterWhen::Started] {
            assert_eq!(AfterWhen::parse(w.as_str()), Some(w));
        }
        let mut after = After { deps: parse_after("12,13:any").unwrap(), ..After::default() };
        assert_eq!(after.describe(), "12 to succeed and 13 to end");
        after.any_of = true;
        assert_eq!(after.describe(), "the first of 12 to succeed, 13 to end");
    }
}
