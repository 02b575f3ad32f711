//! Workflows: every step of a `SubmitWorkflow` is checked before any is
//! made, so the entry is accepted or refused whole; then the workflow
//! takes the next id and its steps are submitted in order (as allocations
//! or arrays), each step's dependencies on earlier steps mapped to their
//! ids.

use super::*;
use crate::sm::types::{Dependency, MAX_DEPENDENCIES, MAX_WORKFLOW_STEPS, Workflow, WorkflowSpec, valid_step_name};

/// A name as an error shows it: at most its first 64 characters.
fn shown(name: &str) -> String {
    name.chars().take(64).collect()
}

fn invalid(field: String, reason: String) -> Rejection {
    Rejection::InvalidSpec { field, reason }
}

/// The hash a workflow keeps of its spec (a retried submit must match).
pub fn workflow_sha256(spec: &WorkflowSpec) -> [u8; 32] {
    let bytes = postcard::to_stdvec(spec).expect("encoding into memory cannot fail");
    sha2::Sha256::digest(&bytes).into()
}

impl State {
    /// Workflow `id`, if it is one.
    pub fn workflow(&self, id: AllocId) -> Option<&Workflow> {
        self.workflows.get(&id)
    }

    /// The workflow allocation `id` is a step of (or an element of an
    /// array step of), and the step's name.
    pub fn workflow_of(&self, id: AllocId) -> Option<(&Workflow, &str)> {
        let step = match self.index.workflow_steps.get(&id) {
            Some(s) => s,
            None => self.index.workflow_steps.get(&self.array_of(id)?.0.id)?,
        };
        let w = self.workflows.get(&step.0)?;
        Some((w, w.steps[step.1 as usize].0.as_str()))
    }

    /// Every workflow held, in id order.
    pub fn workflows(&self) -> impl Iterator<Item = &Workflow> {
        self.workflows.values()
    }

    /// What an earlier submit with the same owner and key made: the
    /// workflow when the spec is the same, a conflict otherwise.
    pub fn workflow_submitted_before(&self, spec: &WorkflowSpec) -> Option<Result<AllocId, Rejection>> {
        let key = spec.idempotency_key.as_ref()?;
        let name = (spec.owner.clone(), key.clone());
        let sha = workflow_sha256(spec);
        let (existing, same) = match self.idempotency.get(&name) {
            Some(&id) => (id, self.workflows.get(&id).is_some_and(|w| w.spec_sha256 == sha)),
            None => {
                let f = self.forgotten_keys.get(&name)?;
                (f.alloc, f.spec_sha256 == sha)
            }
        };
        Some(if same {
            Ok(existing)
        } else {
            Err(Rejection::IdempotencyConflict { key: key.clone(), alloc: existing })
        })
    }

    /// Checks every step as its submit would, with the earlier steps
    /// counted (their quota demand, their names): what
    /// [`State::submit_workflow`] then makes cannot be refused half-way.
    pub fn check_workflow(&self, wf: &WorkflowSpec) -> Result<(), Rejection> {
        if !valid_step_name(&wf.name) {
            return Err(invalid(
                "name".into(),
                format!("{:?}: 1 to 64 letters, digits, '.', '_' or '-'", shown(&wf.name)),
            ));
        }
        if wf.steps.is_empty() || wf.steps.len() > MAX_WORKFLOW_STEPS {
            return Err(invalid(
                "steps".into(),
                format!("{} steps; a workflow has 1 to {MAX_WORKFLOW_STEPS}", wf.steps.len()),
            ));
        }
        if let Some(key) = &wf.idempotency_key {
            check_name("idempotency_key", key, &self.limits).map_err(|r| invalid("idempotency_key".into(), r))?;
        }
        let mut names = BTreeSet::new();
        let mut extra: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
        for (i, step) in wf.steps.iter().enumerate() {
            let field = |f: &str| format!("steps[{}].{f}", step.name);
            if !valid_step_name(&step.name) {
                return Err(invalid(
                    format!("steps[{i}].name"),
                    format!("{:?}: 1 to 64 letters, digits, '.', '_' or '-'", shown(&step.name)),
                ));
            }
            if !names.insert(step.name.as_str()) {
                return Err(invalid(field("name"), format!("two steps are named {}", step.name)));
            }
            let spec = &step.spec;
            if spec.owner != wf.owner {
                return Err(invalid(field("owner"), "every step is the workflow owner's".into()));
            }
            if spec.idempotency_key.is_some() {
                return Err(invalid(field("idempotency_key"), "the workflow's key covers its steps".into()));
            }
            let named = |r: Rejection| match r {
                Rejection::InvalidSpec { field: f, reason } => invalid(field(&f), reason),
                other => other,
            };
            // The flags may rest on dependencies on earlier steps alone
            // (checked with those below).
            let mut own = spec.clone();
            if own.after.deps.is_empty() && !step.after_steps.is_empty() {
                own.after.any_of = false;
                own.after.keep_if_unsatisfiable = false;
            }
            validate_spec(&own, &self.limits).map_err(named)?;
            if let Some(indices) = &step.array {
                indices.validate().map_err(|reason| invalid(field("array"), reason))?;
            }
            if self.vcluster(&spec.vcluster).is_none() {
                return Err(Rejection::UnknownVCluster(spec.vcluster.clone()));
            }
            // What this step may hold live at once, for its own quota check
            // and the steps after it: an array, as many as its throttle lets
            // run.
            let live = step.array.as_ref().map_or(1, |indices| indices.most_live(indices.count()));
            let (gpus, allocs) = extra.get(spec.vcluster.as_str()).copied().unwrap_or_default();
            if let Some(reason) = self.submit_quota_excess_with(spec, live, gpus, allocs) {
                return Err(Rejection::OverQuota { vcluster: spec.vcluster.clone(), reason });
            }
            let e = extra.entry(spec.vcluster.as_str()).or_default();
            e.0 += live * u64::from(spec.gang_size) * u64::from(spec.resources.gpus);
            e.1 += live as usize;
            self.check_job_store(spec).map_err(named)?;
            self.check_dependencies(&spec.after).map_err(named)?;
            let mut seen = BTreeSet::new();
            for &(on, _) in &step.after_steps {
                if on as usize >= i {
                    return Err(invalid(
                        field("after"),
                        format!(
                            "a step waits only for steps before it ({} is not)",
                            wf.steps.get(on as usize).map_or("an unknown step", |s| s.name.as_str())
                        ),
                    ));
                }
                if !seen.insert(on) {
                    return Err(invalid(field("after"), format!("step {} is named twice", wf.steps[on as usize].name)));
                }
            }
            let total = spec.after.deps.len() + step.after_steps.len() + usize::from(step.corr_step.is_some());
            if total > MAX_DEPENDENCIES {
                return Err(invalid(field("after"), format!("{total} dependencies; the most is {MAX_DEPENDENCIES}")));
            }
            if (spec.after.any_of || spec.after.keep_if_unsatisfiable) && total == 0 {
                return Err(invalid(
                    field("after"),
                    "--after-any-of and --keep-if-unsatisfiable need a dependency".into(),
                ));
            }
            if let Some(c) = step.corr_step {
                let Some(indices) = &step.array else {
                    return Err(invalid(field("after_corr"), "only an array step pairs with another array".into()));
                };
                let Some(other) = wf.steps.get(c as usize).filter(|_| (c as usize) < i) else {
                    return Err(invalid(field("after_corr"), "it names no array step before it".into()));
                };
                let Some(theirs) = &other.array else {
                    return Err(invalid(field("after_corr"), format!("step {} is not an array", other.name)));
                };
                if spec.after.any_of {
                    return Err(invalid(field("after_corr"), "cannot be combined with --after-any-of".into()));
                }
                if let Some(missing) = indices.iter().find(|&k| theirs.position_of(k).is_none()) {
                    return Err(invalid(
                        field("after_corr"),
                        format!("step {} has no element with index {missing}", other.name),
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn submit_workflow(&mut self, wf: &WorkflowSpec) -> Applied {
        self.check_workflow(wf)?;
        if let Some(earlier) = self.workflow_submitted_before(wf) {
            return earlier.map(|id| {
                vec![Event::WorkflowSubmitted { workflow: id, steps: wf.steps.len() as u32, duplicate: true }]
            });
        }
        let id = self.next_alloc_id;
        self.next_alloc_id += 1;
        let mut events =
            vec![Event::WorkflowSubmitted { workflow: id, steps: wf.steps.len() as u32, duplicate: false }];
        let mut ids: Vec<AllocId> = Vec::with_capacity(wf.steps.len());
        for step in &wf.steps {
            let mut spec = step.spec.clone();
            for &(on, when) in &step.after_steps {
                spec.after.deps.push(Dependency { on: ids[on as usize], when });
            }
            let corr = step.corr_step.map(|c| ids[c as usize]);
            let made = match &step.array {
                Some(indices) => self.submit_array(&spec, indices, corr, &Secrets::default()),
                None => self.submit(&spec, &Secrets::default()),
            };
            // check_workflow checked all that submit does.
            let made = made.expect("a checked workflow step is accepted");
            ids.push(match made.first() {
                Some(Event::Submitted { alloc, .. }) => *alloc,
                Some(Event::ArraySubmitted { array, .. }) => *array,
                other => unreachable!("a submit starts with its id, not {other:?}"),
            });
            events.extend(made);
        }
        for (k, &step) in ids.iter().enumerate() {
            self.index.workflow_steps.insert(step, (id, k as u32));
        }
        let steps = wf.steps.iter().map(|s| s.name.clone()).zip(ids).collect();
        self.workflows.insert(
            id,
            Workflow {
                id,
                name: wf.name.clone(),
                owner: wf.owner.clone(),
                steps,
                submit_time_ms: self.now_ms,
                idempotency_key: wf.idempotency_key.clone(),
                spec_sha256: workflow_sha256(wf),
            },
        );
        if let Some(key) = &wf.idempotency_key {
            self.idempotency.insert((wf.owner.clone(), key.clone()), id);
        }
        Ok(events)
    }

    /// Whether every step of workflow `w` has ended.
    pub fn workflow_finished(&self, w: &Workflow) -> bool {
        w.steps.iter().all(|&(_, id)| match (self.allocs.get(&id), self.arrays.get(&id)) {
            (Some(a), _) => a.status.is_terminal(),
            (None, Some(array)) => array.finished_at_ms.is_some(),
            (None, None) => true,
        })
    }

    /// Cancels every step of workflow `id` not yet finished.
    pub(super) fn cancel_workflow(&mut self, id: AllocId) -> Applied {
        let w = self.workflows.get(&id).ok_or(Rejection::UnknownAllocation(id))?;
        let live: Vec<AllocId> =
            w.steps.iter().map(|&(_, s)| s).filter(|&s| self.check_cancel_any(s).is_ok()).collect();
        if live.is_empty() {
            return Err(Rejection::AlreadyTerminal { alloc: id, status: AllocStatus::Done });
        }
        let mut events = Vec::new();
        for step in live {
            events.extend(self.cancel(step).expect("checked by check_cancel_any"));
        }
        Ok(events)
    }

    /// Forgets workflows none of whose steps the state still holds; a key
    /// stays honoured until `key_window_ms` after the submit, as an
    /// allocation's does.
    pub(super) fn forget_workflows(&mut self, key_window_ms: u64) -> usize {
        let gone: Vec<AllocId> = self
            .workflows
            .values()
            .filter(|w| w.steps.iter().all(|(_, s)| !self.holds(*s) && !self.arrays.contains_key(s)))
            .map(|w| w.id)
            .collect();
        for id in &gone {
            let w = self.workflows.remove(id).expect("found");
            for (_, s) in &w.steps {
                self.index.workflow_steps.remove(s);
            }
            let expires_ms = w.submit_time_ms.saturating_add(key_window_ms);
            self.retire_key(&w.owner, w.idempotency_key.as_deref(), *id, expires_ms, || w.spec_sha256);
        }
        gone.len()
    }
}
