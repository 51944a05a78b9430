//! One inference, whatever protocol it came in by: the service looked up and the caller checked,
//! the inputs checked against the service's metadata, the member request fanned out, the
//! answers combined by the ensemble rule, and the reply's flat parameters saying how it was made
//! (`kiln.members_used`, `kiln.members`, `kiln.partial`, and `kiln.missing` naming the members
//! left out).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_core::auth::Principal;
use kiln_core::authz::{self, JobAccess, Need, Resource, Role};
use kiln_core::serving::{Ensemble, ServiceSpec, TensorSpec};
use kiln_formats::oip::{InferRequest, InferResponse, Tensor};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::ensemble::{self, Answer};
use crate::fanout::{self, Miss};
use crate::{Error, Result, Shared};

/// The request parameter giving the deadline, in microseconds (as Triton reads it).
pub const TIMEOUT_PARAMETER: &str = "timeout";

/// The service `name`, if `principal` may infer with it (a viewer of its project); an unknown
/// name and one the caller may not see are refused with the same words.
pub async fn service(shared: &Shared, principal: &Principal, name: &str) -> Result<Arc<ServiceSpec>> {
    let unknown = || {
        Error::InvalidArgument(format!(
            "unknown model `{name}`: no inference service of that name is visible to you (`kiln serve ls` lists them)"
        ))
    };
    let spec = shared.catalog.get(name).await?.ok_or_else(unknown)?;
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

/// A version the caller names must be the serving revision.
pub fn check_version(spec: &ServiceSpec, version: Option<&str>) -> Result<()> {
    match version {
        Some(version) if version != spec.revision.to_string() => Err(Error::InvalidArgument(format!(
            "model `{}` has no version {version}; it serves revision {}",
            spec.name, spec.revision
        ))),
        _ => Ok(()),
    }
}

/// Answers `request` for the service `spec`.
pub async fn infer(shared: &Shared, spec: &ServiceSpec, request: InferRequest) -> Result<InferResponse> {
    let arrived = Instant::now();
    let outcome = answer(shared, spec, request, arrived).await;
    let label = match &outcome {
        Ok(response) if response.parameters.get("kiln.partial") == Some(&Value::Bool(true)) => "partial",
        Ok(_) => "answered",
        Err(Error::InvalidArgument(_)) => "invalid",
        Err(Error::DeadlineExceeded(_)) => "deadline",
        Err(Error::Unavailable(_)) => "unavailable",
        Err(_) => "failed",
    };
    shared
        .metrics
        .request(&spec.name, label, arrived.elapsed().as_secs_f64());
    outcome
}

async fn answer(shared: &Shared, spec: &ServiceSpec, request: InferRequest, arrived: Instant) -> Result<InferResponse> {
    check_inputs(spec, &request.inputs)?;
    let deadline = arrived + deadline(shared, spec, &request.parameters)?;
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
    let gathered = fanout::gather(&shared.nats.client, spec, Bytes::from(body), deadline, &shared.limits).await;
    for (member, _, took) in &gathered.answers {
        shared.metrics.member(
            &spec.name,
            &spec.members[*member].name,
            "answered",
            Some(took.as_secs_f64()),
        );
    }
    for (member, miss) in &gathered.misses {
        let label = match miss {
            Miss::Late => "late",
            Miss::Unavailable | Miss::Gone(_) => "unavailable",
            Miss::Refused { .. } => "refused",
            Miss::Failed(_) => "failed",
        };
        shared
            .metrics
            .member(&spec.name, &spec.members[*member].name, label, None);
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
            spec.name
        ))
    } else {
        Error::MemberFailed(format!("{tally}: {}", failed.join("; ")))
    }
}
