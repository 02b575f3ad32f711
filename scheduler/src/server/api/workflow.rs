//! `SubmitWorkflow` and `GetWorkflow`: the steps arrive named and in any
//! order; here they are checked, ordered so that each comes after every
//! step it waits for (a cycle is refused, naming its steps), and proposed
//! as one `SubmitWorkflow` entry.

use tonic::{Request, Response, Status};

use super::client::{ClientApi, alloc_missing, bind_owner};
use super::convert::{propose_error_to_status, rejection_to_status};
use crate::sm::{AfterWhen, AllocId, ArrayIndices, Command, Event, Outcome, State, WorkflowSpec, WorkflowStep};
use muster_proto::bounds::Bounded;
use muster_proto::v1;
use muster_proto::v1::SubmitWorkflowRequest;

fn invalid(field: String, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("invalid {field}: {reason}"))
}

/// The steps in an order where each comes after every step it names
/// (earlier in the request first, among those free to go), or the names
/// of the steps in a cycle.
pub fn order_steps(steps: &[v1::WorkflowStep]) -> Result<Vec<usize>, Status> {
    let index: std::collections::BTreeMap<&str, usize> =
        steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    if index.len() != steps.len() {
        let mut seen = std::collections::BTreeSet::new();
        let twice = steps.iter().find(|s| !seen.insert(s.name.as_str())).map_or("", |s| s.name.as_str());
        return Err(invalid("steps".into(), format!("two steps are named {twice:?}")));
    }
    let mut needs: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    for s in steps {
        let mut n = Vec::new();
        for name in
            s.after.iter().map(|d| d.step.as_str()).chain((!s.after_corr.is_empty()).then_some(s.after_corr.as_str()))
        {
            let Some(&j) = index.get(name) else {
                return Err(invalid(format!("steps[{}].after", s.name), format!("no step is named {name:?}")));
            };
            n.push(j);
        }
        needs.push(n);
    }
    let mut placed = vec![false; steps.len()];
    let mut order = Vec::with_capacity(steps.len());
    while order.len() < steps.len() {
        let Some(next) = (0..steps.len()).find(|&i| !placed[i] && needs[i].iter().all(|&j| placed[j])) else {
            let cycle: Vec<&str> = (0..steps.len()).filter(|&i| !placed[i]).map(|i| steps[i].name.as_str()).collect();
            return Err(invalid(
                "steps".into(),
                format!("steps {} wait for each other (a cycle): none could ever start", cycle.join(", ")),
            ));
        };
        placed[next] = true;
        order.push(next);
    }
    Ok(order)
}

/// A refusal of a step's spec, its field named as the step's.
fn in_step(step: &str, s: Status) -> Status {
    Status::new(s.code(), s.message().replacen("invalid spec.", &format!("invalid steps[{step}]."), 1))
}

/// A step's wire form as the state takes it, its step references turned
/// into positions in `order`.
fn step_from_proto(
    api: &ClientApi,
    caller: &muster_tls::Caller,
    p: &v1::WorkflowStep,
    position: &std::collections::BTreeMap<&str, u32>,
) -> Result<WorkflowStep, Status> {
    let field = |f: &str| format!("steps[{}].{f}", p.name);
    let spec = api.prepare_spec(caller, p.spec.clone()).map_err(|s| in_step(&p.name, s))?;
    let array = match p.array.as_str() {
        "" => None,
        expr => Some(ArrayIndices::parse(expr).map_err(|e| invalid(field("array"), e))?),
    };
    let mut after_steps = Vec::with_capacity(p.after.len());
    for d in &p.after {
        let when = match d.when.as_str() {
            "" => AfterWhen::Ok,
            w => AfterWhen::parse(w)
                .ok_or_else(|| invalid(field("after"), format!("{w:?} is not one of ok, any, notok, started")))?,
        };
        after_steps.push((position[d.step.as_str()], when));
    }
    let corr_step = (!p.after_corr.is_empty()).then(|| position[p.after_corr.as_str()]);
    Ok(WorkflowStep { name: p.name.clone(), spec, array, after_steps, corr_step })
}

/// Each step's name, id, kind and status now.
fn steps_to_proto(st: &State, steps: &[(String, AllocId)]) -> Vec<v1::WorkflowStepId> {
    steps
        .iter()
        .map(|(name, id)| {
            let (array, status) = match (st.alloc(*id), st.array(*id)) {
                (Some(a), _) => (false, a.status.as_str().to_string()),
                (None, Some(a)) => (true, a.final_status().map_or("running", |s| s.as_str()).to_string()),
                (None, None) => match st.compacted(*id) {
                    Some(c) => (false, c.status.as_str().to_string()),
                    None => (false, "forgotten".to_string()),
                },
            };
            v1::WorkflowStepId { name: name.clone(), id: *id, array, status }
        })
        .collect()
}

fn workflow_to_proto(st: &State, id: AllocId) -> Result<v1::WorkflowInfo, Status> {
    let Some(w) = st.workflow(id) else {
        return Err(match st.holds(id) || st.array(id).is_some() {
            true => Status::not_found(format!("{id} is not a workflow")),
            false => alloc_missing(st, id),
        });
    };
    Ok(v1::WorkflowInfo {
        id,
        name: w.name.clone(),
        owner: w.owner.clone(),
        steps: steps_to_proto(st, &w.steps),
        submit_time_ms: w.submit_time_ms,
        finished: st.workflow_finished(w),
    })
}

impl ClientApi {
    pub(super) async fn submit_workflow_request(
        &self,
        req: Request<SubmitWorkflowRequest>,
    ) -> Result<Response<v1::SubmitWorkflowResponse>, Status> {
        req.get_ref().check_bounds()?;
        let caller = muster_tls::Caller::of(&req);
        let req = req.into_inner();
        if req.steps.is_empty() {
            return Err(invalid("steps".into(), "a workflow has at least one step"));
        }
        let owner = bind_owner(&caller, "")?;
        let order = order_steps(&req.steps)?;
        let position: std::collections::BTreeMap<&str, u32> =
            order.iter().enumerate().map(|(k, &i)| (req.steps[i].name.as_str(), k as u32)).collect();
        let mut steps = Vec::with_capacity(order.len());
        for &i in &order {
            let mut p = req.steps[i].clone();
            if let Some(spec) = p.spec.as_mut() {
                if !spec.owner.is_empty() && spec.owner != owner {
                    return Err(invalid(format!("steps[{}].owner", p.name), "every step is the workflow owner's"));
                }
                spec.owner = owner.clone();
            }
            let mut step = step_from_proto(self, &caller, &p, &position)?;
            self.pin_image(&mut step.spec).await.map_err(|s| in_step(&p.name, s))?;
            steps.push(step);
        }
        let workflow = WorkflowSpec {
            name: req.name.clone(),
            owner,
            idempotency_key: (!req.idempotency_key.is_empty()).then(|| req.idempotency_key.clone()),
            steps,
        };
        // Checked whole before the log (apply checks again), and a retry
        // answered from the state; a follower's state may lag: it proposes.
        if self.s.is_leader() {
            let before = self.s.reader().read(|st| {
                st.check_workflow(&workflow)?;
                Ok::<_, crate::sm::Rejection>(
                    st.workflow_submitted_before(&workflow).map(|r| r.map(|id| (id, st.workflow(id).cloned()))),
                )
            });
            match before.map_err(|r| rejection_to_status(&r))? {
                Some(Ok((id, w))) => {
                    let steps = self.s.reader().read(|st| steps_to_proto(st, &w.map(|w| w.steps).unwrap_or_default()));
                    return Ok(Response::new(v1::SubmitWorkflowResponse { id, duplicate: true, steps }));
                }
                Some(Err(r)) => return Err(rejection_to_status(&r)),
                None => {}
            }
        }
        // What no registered node can ever run is refused before the log,
        // as a plain submit's is: after the retry check, so that a retry
        // of a workflow already made is answered with it whatever the
        // nodes are now.
        if !req.queue_if_unsatisfiable {
            for s in &workflow.steps {
                if let Some(why) = self.s.reader().read(|st| crate::policy::unsatisfiable(st, &s.spec)) {
                    return Err(Status::failed_precondition(format!(
                        "unsatisfiable: no registered node can ever run step {}: {why} (queue_if_unsatisfiable \
                         queues it for nodes yet to join)",
                        s.name
                    )));
                }
            }
        }
        let outcome =
            self.s.proposer().propose(Command::SubmitWorkflow { workflow }).await.map_err(propose_error_to_status)?;
        match outcome {
            Outcome::Accepted(events) => match events.first() {
                Some(Event::WorkflowSubmitted { workflow, duplicate, .. }) => {
                    self.wake_admission();
                    let info = self.s.reader().read(|st| workflow_to_proto(st, *workflow));
                    let steps = info.map(|i| i.steps).unwrap_or_default();
                    Ok(Response::new(v1::SubmitWorkflowResponse { id: *workflow, duplicate: *duplicate, steps }))
                }
                other => Err(Status::internal(format!("unexpected workflow events {other:?}"))),
            },
            Outcome::Rejected(r) => Err(rejection_to_status(&r)),
        }
    }

    pub(super) async fn get_workflow_request(
        &self,
        req: Request<v1::GetRequest>,
    ) -> Result<Response<v1::WorkflowInfo>, Status> {
        req.get_ref().check_bounds()?;
        let id = req.into_inner().id;
        self.s.linearizable().await?;
        self.s.reader().read(|st| workflow_to_proto(st, id)).map(Response::new)
    }
}
