//! One inference, whatever protocol it came in by: the service looked up and the caller checked,
//! the inputs checked against the service's metadata, the member request fanned out, the
//! answers combined by the ensemble rule, and the reply's flat parameters saying how it was made
//! (`kiln.members_used`, `kiln.members`, `kiln.partial`, and `kiln.missing` naming the members
//! left out).
//!
//! - A service with a [`Split`](kiln_core::serving::Split) sends its share of requests to the
//!   revision being tried (exactly `traffic` of every 100 this predictor answers; back to the
//!   serving revision when the tried one has no worker), or, in shadow, a copy of every request,
//!   whose answer is compared with the one returned and counted
//!   (`kiln_predictor_shadow_requests`), never returned. A version named in the path picks its
//!   revision and no split.
//! - A request that finds no worker for the quorum waits up to the service's `cold_wait_ms`
//!   for one (a service scaled to zero: the controller is asked for a worker), then is
//!   answered with its whole deadline, or refused UNAVAILABLE with the reason.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use kiln_core::auth::Principal;
use kiln_core::authz::{self, Holder, JobAccess, Need, ObjectRef, Resource, Role};
use kiln_core::serving::{Ensemble, ServiceSpec, TensorSpec};
use kiln_formats::oip::{InferRequest, InferResponse, Tensor};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::ensemble::{self, Answer};
use crate::fanout::{self, Miss};
use crate::{Error, Result, Shared};

/// The request parameter giving the deadline, in microseconds (as Triton reads it).
pub const TIMEOUT_PARAMETER: &str = "timeout";

/// The service `reference` names, if `principal` may infer with it (a viewer of its project);
/// an unknown service and one the caller may not see are refused with the same words.
///
/// `PROJECT/NAME` names the service of that project. A bare `NAME` (what KServe clients send)
/// names the service of that name in the one project the caller may read that has one; when
/// several do, the request is refused FAILED_PRECONDITION, asking for `PROJECT/NAME` and naming
/// only those projects.
pub async fn service(shared: &Shared, principal: &Principal, reference: &str) -> Result<Arc<ServiceSpec>> {
    let unknown = || {
        Error::InvalidArgument(format!(
            "unknown model `{reference}`: no inference service of that name is visible to you (`kiln serve ls` lists them)"
        ))
    };
    let named = ObjectRef::parse(reference).ok_or_else(unknown)?;
    let spec = match &named.project {
        Some(project) => shared.catalog.get(project, &named.name).await?.ok_or_else(unknown)?,
        None => {
            let mut holders: Vec<Arc<ServiceSpec>> = shared
                .catalog
                .named(&named.name)
                .into_iter()
                .filter(|spec| principal.may_read(&spec.project))
                .collect();
            if holders.is_empty() {
                // Made a moment ago, before the watch delivered it: its project is recorded.
                let projects = shared.services.projects_named(&named.name).await?;
                if let Holder::One(project) = principal.sole_holder(projects) {
                    holders.extend(shared.catalog.get(&project, &named.name).await?);
                }
            }
            match holders.len() {
                0 => return Err(unknown()),
                1 => holders.remove(0),
                _ => {
                    let mut projects: Vec<&str> = holders.iter().map(|spec| spec.project.as_str()).collect();
                    projects.sort_unstable();
                    return Err(Error::FailedPrecondition(format!(
                        "model `{reference}` is a service of more than one project you may read ({}): name one as PROJECT/{reference} (/v2/models/PROJECT/{reference}/infer)",
                        projects.join(", ")
                    )));
                }
            }
        }
    };
    let resource = Resource {
        kind: "model",
        ..Resource::project(&spec.project)
    };
    match authz::decide(principal, Need::Role(Role::Viewer), JobAccess::Deny, &resource) {
        Ok(()) => Ok(spec),
        Err(authz::Denied::PermissionDenied(message)) => Err(Error::PermissionDenied(message)),
        Err(_) => Err(unknown()),
    }
}

/// The definition a request naming `version` is answered with: the serving revision's or the
/// tried one's, without a split; any version when it names none.
pub fn at_version(spec: Arc<ServiceSpec>, version: Option<&str>) -> Result<Arc<ServiceSpec>> {
    let Some(version) = version else {
        return Ok(spec);
    };
    if version == spec.revision.to_string() {
        return Ok(Arc::new(ServiceSpec {
            split: None,
            ..(*spec).clone()
        }));
    }
    if let Some(split) = spec
        .split
        .as_ref()
        .filter(|split| version == split.spec.revision.to_string())
    {
        return Ok(Arc::new((*split.spec).clone()));
    }
    let tried = spec
        .split
        .as_ref()
        .map(|split| format!(" and tries revision {}", split.spec.revision))
        .unwrap_or_default();
    Err(Error::InvalidArgument(format!(
        "model `{}` has no version {version}; it serves revision {}{tried}",
        spec.name, spec.revision
    )))
}

/// Answers `request` for the service `spec`.
pub async fn infer(shared: &Arc<Shared>, spec: &ServiceSpec, request: InferRequest) -> Result<InferResponse> {
    let arrived = Instant::now();
    let outcome = route(shared, spec, request, arrived).await;
    let label = match &outcome {
        Ok(response) if response.parameters.get("kiln.partial") == Some(&Value::Bool(true)) => "partial",
        Ok(_) => "answered",
        Err(Error::InvalidArgument(_)) => "invalid",
        Err(Error::DeadlineExceeded(_)) => "deadline",
        Err(Error::Unavailable(_)) => "unavailable",
        Err(_) => "failed",
    };
    let seconds = arrived.elapsed().as_secs_f64();
    shared.metrics.request(spec, label, seconds);
    shared.traffic.record(
        &spec.key(),
        crate::traffic::Outcome::of_label(label),
        seconds,
        std::time::Instant::now(),
    );
    outcome
}

/// Picks the revision that answers: the serving one, or the tried one for its share.
async fn route(
    shared: &Arc<Shared>,
    spec: &ServiceSpec,
    request: InferRequest,
    arrived: Instant,
) -> Result<InferResponse> {
    let Some(split) = &spec.split else {
        return answer(shared, spec, request, arrived).await;
    };
    if split.shadow {
        let shadow = (*split.spec).clone();
        let copy = request.clone();
        let (sent, answered) = tokio::sync::oneshot::channel::<Vec<Tensor>>();
        let task_shared = shared.clone();
        tokio::spawn(async move {
            let outcome = answer(&task_shared, &shadow, copy, arrived).await;
            let label = match (&outcome, answered.await) {
                (Err(_), _) => "missed",
                (Ok(_), Err(_)) => "unmatched",
                (Ok(tried), Ok(returned)) if agree(&tried.outputs, &returned) => "agreed",
                (Ok(_), Ok(_)) => "differed",
            };
            task_shared
                .metrics
                .shadow(&shadow, label, arrived.elapsed().as_secs_f64());
        });
        let primary = answer(shared, spec, request, arrived).await;
        if let Ok(response) = &primary {
            let _ = sent.send(response.outputs.clone());
        }
        return primary;
    }
    // Exactly `traffic` of every 100 requests (a Bresenham split of this predictor's turns).
    let turn = shared.split_turns.fetch_add(1, Ordering::Relaxed);
    let traffic = u64::from(split.traffic.min(100));
    if (turn + 1) * traffic / 100 > turn * traffic / 100 {
        match answer(shared, &split.spec, request.clone(), arrived).await {
            Err(Error::Unavailable(_)) => {}
            outcome => return outcome,
        }
    }
    answer(shared, spec, request, arrived).await
}

/// Whether a shadow's outputs match the returned ones: the same names, shapes and values
/// (floats within a millionth, relative).
fn agree(tried: &[Tensor], returned: &[Tensor]) -> bool {
    use kiln_formats::oip::Data;
    tried.len() == returned.len()
        && returned.iter().all(|want| {
            tried.iter().find(|have| have.name == want.name).is_some_and(|have| {
                have.shape == want.shape
                    && match (&have.data, &want.data) {
                        (Data::Float(have), Data::Float(want)) => {
                            have.len() == want.len()
                                && have
                                    .iter()
                                    .zip(want)
                                    .all(|(a, b)| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0))
                        }
                        (have, want) => have == want,
                    }
            })
        })
}

async fn answer(shared: &Shared, spec: &ServiceSpec, request: InferRequest, arrived: Instant) -> Result<InferResponse> {
    check_inputs(spec, &request.inputs)?;
    let budget = deadline(shared, spec, &request.parameters)?;
    let deadline = arrived + budget;
    let member_request = InferRequest {
        id: request.id.clone(),
        parameters: forwarded(&request.parameters),
        inputs: request.inputs,
        outputs: request
            .outputs
            .iter()
            .map(|output| kiln_formats::oip::RequestedOutput {
                name: output.name.clone(),
                parameters: Map::new(),
            })
            .collect(),
    };
    let (body, _) = member_request.encode(&|_| false);
    let body = Bytes::from(body);
    let mut gathered = fanout::gather(shared.channel(), spec, body.clone(), deadline, &shared.limits).await;
    let no_worker = |gathered: &fanout::Gathered| {
        gathered.answers.len() < spec.quorum.max(1)
            && gathered
                .misses
                .iter()
                .any(|(_, miss)| matches!(miss, Miss::Unavailable | Miss::Gone(_)))
    };
    if spec.cold_wait_ms > 0 && no_worker(&gathered) {
        cold_start(shared, spec).await?;
        let deadline = Instant::now() + budget;
        gathered = fanout::gather(shared.channel(), spec, body, deadline, &shared.limits).await;
    }
    for (member, _, took) in &gathered.answers {
        shared
            .metrics
            .member(spec, &spec.members[*member].name, "answered", Some(took.as_secs_f64()));
    }
    for (member, miss) in &gathered.misses {
        let label = match miss {
            Miss::Late => "late",
            Miss::Unavailable | Miss::Gone(_) => "unavailable",
            Miss::Refused { .. } => "refused",
            Miss::Failed(_) => "failed",
        };
        shared.metrics.member(spec, &spec.members[*member].name, label, None);
    }
    if gathered.answers.len() < spec.quorum.max(1) {
        return Err(short_of_quorum(
            spec,
            &gathered.misses,
            gathered.answers.len(),
            deadline - arrived,
        ));
    }
    let names: Vec<String> = spec.members.iter().map(|member| member.name.clone()).collect();
    let answers: Vec<Answer<'_>> = gathered
        .answers
        .iter()
        .map(|(member, response, _)| Answer {
            member: *member,
            weight: spec.members[*member].weight,
            outputs: &response.outputs,
        })
        .collect();
    let outputs = ensemble::combine(spec.ensemble, &answers, &names)
        .map_err(|mismatch| Error::MemberFailed(format!("the members' answers do not combine: {mismatch}")))?;
    let used = answers.len();
    let mut parameters = Map::new();
    parameters.insert("kiln.members_used".into(), Value::from(used));
    parameters.insert("kiln.members".into(), Value::from(spec.members.len()));
    let partial = spec.ensemble != Ensemble::First && used < spec.members.len();
    parameters.insert("kiln.partial".into(), Value::Bool(partial));
    if partial {
        let mut missing: Vec<&str> = gathered
            .misses
            .iter()
            .map(|(member, _)| spec.members[*member].name.as_str())
            .collect();
        missing.sort_unstable();
        parameters.insert("kiln.missing".into(), Value::String(missing.join(",")));
    }
    Ok(InferResponse {
        model_name: spec.name.clone(),
        model_version: Some(spec.revision.to_string()),
        id: request.id,
        parameters,
        outputs: filter_outputs(outputs, &request.outputs),
    })
}

/// How often a request waiting for a worker probes the members and asks for one again.
const COLD_PROBE_EVERY: Duration = Duration::from_millis(100);
const COLD_ASK_EVERY: Duration = Duration::from_secs(1);

/// Waits, up to the service's cold-start wait, until the quorum of its members have a worker
/// in rotation, asking the controller for workers meanwhile.
async fn cold_start(shared: &Shared, spec: &ServiceSpec) -> Result<()> {
    let started = Instant::now();
    let until = started + Duration::from_millis(spec.cold_wait_ms);
    let mut asked: Option<Instant> = None;
    shared.metrics.cold_start(spec);
    loop {
        if asked.is_none_or(|at| at.elapsed() >= COLD_ASK_EVERY) {
            asked = Some(Instant::now());
            let subject = kiln_core::subjects::serve_demand(&spec.project, &spec.name);
            if let Err(error) = shared
                .nats
                .client
                .publish(subject, spec.revision.to_string().into())
                .await
            {
                tracing::warn!(service = %spec.name, error = %error, "cannot ask for a worker");
            }
        }
        if fanout::ready_members(&shared.nats.client, spec, COLD_PROBE_EVERY).await >= spec.quorum.max(1) {
            tracing::debug!(service = %spec.name, waited_ms = started.elapsed().as_millis() as u64, "a request found its workers");
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(Error::Unavailable(format!(
                "model `{}` has no worker ready: none answered within its {} ms cold-start wait (it scales to zero when idle, or its workers are starting); a worker was asked for, retry shortly or see `kiln serve status {}`",
                spec.name,
                spec.cold_wait_ms,
                spec.qualified()
            )));
        }
        tokio::time::sleep_until((Instant::now() + COLD_PROBE_EVERY).min(until)).await;
    }
}

/// The request's deadline: `parameters.timeout` (microseconds) when it gives one, else the
/// service's; at most the predictor's `max-deadline-ms`.
fn deadline(shared: &Shared, spec: &ServiceSpec, parameters: &Map<String, Value>) -> Result<Duration> {
    let most = Duration::from_millis(shared.config.max_deadline_ms);
    let asked = match parameters.get(TIMEOUT_PARAMETER) {
        None => Duration::from_millis(spec.deadline_ms),
        Some(value) => match value.as_u64() {
            Some(micros) if micros > 0 => Duration::from_micros(micros),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "parameters.timeout is {value}; give the deadline as a positive number of microseconds"
                )));
            }
        },
    };
    Ok(asked.min(most))
}

/// The request parameters a worker sees: the client's, without the ones the predictor acts on.
fn forwarded(parameters: &Map<String, Value>) -> Map<String, Value> {
    parameters
        .iter()
        .filter(|(name, _)| {
            !matches!(name.as_str(), TIMEOUT_PARAMETER | "binary_data_output") && !name.starts_with("kiln.")
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

fn filter_outputs(outputs: Vec<Tensor>, requested: &[kiln_formats::oip::RequestedOutput]) -> Vec<Tensor> {
    if requested.is_empty() {
        return outputs;
    }
    requested
        .iter()
        .filter_map(|wanted| outputs.iter().find(|output| output.name == wanted.name).cloned())
        .collect()
}

/// Checks the inputs against the service's metadata, when it states them.
pub fn check_inputs(spec: &ServiceSpec, inputs: &[Tensor]) -> Result<()> {
    if spec.inputs.is_empty() {
        return Ok(());
    }
    let expected = |input: &TensorSpec| format!("{} {:?}", input.datatype, input.shape);
    for input in inputs {
        let Some(wanted) = spec.inputs.iter().find(|wanted| wanted.name == input.name) else {
            let names: Vec<&str> = spec.inputs.iter().map(|wanted| wanted.name.as_str()).collect();
            return Err(Error::InvalidArgument(format!(
                "input `{}` is not an input of model `{}` (its inputs: {})",
                input.name,
                spec.name,
                names.join(", ")
            )));
        };
        let fits = wanted.shape.len() == input.shape.len()
            && wanted
                .shape
                .iter()
                .zip(&input.shape)
                .all(|(&want, &have)| want < 0 || u64::try_from(want) == Ok(have));
        if wanted.datatype != input.datatype.name() || !fits {
            return Err(Error::InvalidArgument(format!(
                "input `{}` is {} {:?}; model `{}` takes {} (-1: any size)",
                input.name,
                input.datatype.name(),
                input.shape,
                spec.name,
                expected(wanted)
            )));
        }
    }
    if let Some(missing) = spec
        .inputs
        .iter()
        .find(|wanted| !inputs.iter().any(|input| input.name == wanted.name))
    {
        return Err(Error::InvalidArgument(format!(
            "input `{}` ({}) is missing",
            missing.name,
            expected(missing)
        )));
    }
    Ok(())
}

fn short_of_quorum(spec: &ServiceSpec, misses: &[(usize, Miss)], answered: usize, budget: Duration) -> Error {
    if let Some((member, Miss::Refused { message, .. })) =
        misses.iter().find(|(_, miss)| matches!(miss, Miss::Refused { .. }))
    {
        return Error::InvalidArgument(format!(
            "member {} refused the request: {message}",
            spec.members[*member].name
        ));
    }
    let named = |wanted: fn(&Miss) -> bool| {
        let mut names: Vec<&str> = misses
            .iter()
            .filter(|(_, miss)| wanted(miss))
            .map(|(member, _)| spec.members[*member].name.as_str())
            .collect();
        names.sort_unstable();
        names.join(", ")
    };
    let late = named(|miss| matches!(miss, Miss::Late));
    let unavailable = named(|miss| matches!(miss, Miss::Unavailable | Miss::Gone(_)));
    let failed: Vec<String> = misses
        .iter()
        .filter_map(|(member, miss)| match miss {
            Miss::Failed(message) => Some(format!("{}: {message}", spec.members[*member].name)),
            _ => None,
        })
        .collect();
    let tally = format!(
        "{answered} of {} member(s) of `{}` answered; the quorum is {}",
        spec.members.len(),
        spec.name,
        spec.quorum
    );
    if !late.is_empty() {
        Error::DeadlineExceeded(format!(
            "{tally} within the {} ms deadline (late: {late}{})",
            budget.as_millis(),
            if unavailable.is_empty() {
                String::new()
            } else {
                format!("; no worker serving: {unavailable}")
            }
        ))
    } else if failed.is_empty() {
        Error::Unavailable(format!(
            "{tally}: no worker is serving {unavailable} (none ready, or all out of rotation); retry, or see `kiln serve status {}`",
            spec.qualified()
        ))
    } else {
        Error::MemberFailed(format!("{tally}: {}", failed.join("; ")))
    }
}
