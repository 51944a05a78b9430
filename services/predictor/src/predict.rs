//! SINGA-Auto's `POST /predict`, a thin adapter over the Open Inference Protocol:
//! `{"query": x}` is answered with `{"prediction": y}` and `{"queries": [x1, x2, ..]}` with
//! `{"predictions": [y1, y2, ..]}`.
//!
//! The queries are stacked along a new first dimension into the service's first input (its
//! declared name and datatype, else `input` and FP64 for numbers, BYTES for strings, BOOL for
//! booleans); the answer's first output is split along its first dimension into one
//! prediction per query, each nested as its shape says.

use std::sync::Arc;

use kiln_core::auth::Principal;
use kiln_core::serving::ServiceSpec;
use kiln_formats::oip::{Data, InferRequest, Tensor};
use serde_json::{Value, json};

use crate::{Error, Result, Shared, infer};

/// The service `/predict` without a name means: the one service here the caller may use (the
/// services of projects it may not read are neither counted nor named).
pub fn only_service(shared: &Shared, principal: &Principal) -> Result<Arc<ServiceSpec>> {
    let mut visible: Vec<Arc<ServiceSpec>> = shared
        .catalog
        .all()
        .into_iter()
        .filter(|spec| principal.may_read(&spec.project))
        .collect();
    match visible.len() {
        1 => Ok(visible.remove(0)),
        0 => Err(Error::InvalidArgument(
            "no inference service you may use is defined yet (`kiln serve create`)".into(),
        )),
        n => Err(Error::InvalidArgument(format!(
            "{n} services you may use are served here: name one, as POST /predict/NAME or /predict/PROJECT/NAME"
        ))),
    }
}

pub async fn predict(shared: &Arc<Shared>, spec: &ServiceSpec, body: &[u8]) -> Result<Value> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|error| Error::InvalidArgument(format!("the body is not JSON: {error}")))?;
    let (queries, single) = match (body.get("query"), body.get("queries")) {
        (Some(query), None) => (vec![query.clone()], true),
        (None, Some(Value::Array(queries))) if !queries.is_empty() => (queries.clone(), false),
        (None, Some(_)) => return Err(Error::InvalidArgument("`queries` must be a non-empty array".into())),
        _ => {
            return Err(Error::InvalidArgument(
                "the body must be {\"query\": ...} or {\"queries\": [...]}".into(),
            ));
        }
    };
    let mut shape = vec![queries.len() as u64];
    shape.extend(dimensions(&queries[0]));
    let mut flat = Vec::new();
    for (at, query) in queries.iter().enumerate() {
        if dimensions(query) != shape[1..] {
            return Err(Error::InvalidArgument(format!(
                "query {at} has shape {:?}; query 0 has {:?}, and all must match",
                dimensions(query),
                &shape[1..]
            )));
        }
        flatten(query, &mut flat);
    }
    let (name, datatype) = match spec.inputs.first() {
        Some(input) => (input.name.clone(), input.datatype.clone()),
        None => ("input".to_string(), guess_datatype(&flat).to_string()),
    };
    let request_body = json!({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": flat}]});
    let request = InferRequest::parse(request_body.to_string().as_bytes(), None, &shared.limits)
        .map_err(|error| Error::InvalidArgument(error.to_string()))?;
    let response = infer::infer(shared, spec, request).await?;
    let wanted = spec.outputs.first().map(|output| output.name.as_str());
    let output = response
        .outputs
        .iter()
        .find(|output| wanted.is_none_or(|name| output.name == name))
        .ok_or_else(|| Error::MemberFailed(format!("model `{}` answered no output", spec.name)))?;
    let mut predictions = split(output, queries.len())?;
    Ok(if single {
        json!({"prediction": predictions.swap_remove(0)})
    } else {
        json!({"predictions": predictions})
    })
}

fn dimensions(value: &Value) -> Vec<u64> {
    match value {
        Value::Array(items) => {
            let mut dims = vec![items.len() as u64];
            if let Some(first) = items.first() {
                dims.extend(dimensions(first));
            }
            dims
        }
        _ => Vec::new(),
    }
}

fn flatten(value: &Value, into: &mut Vec<Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|item| flatten(item, into)),
        other => into.push(other.clone()),
    }
}

fn guess_datatype(flat: &[Value]) -> &'static str {
    if flat.iter().all(Value::is_boolean) && !flat.is_empty() {
        "BOOL"
    } else if flat.iter().any(Value::is_string) {
        "BYTES"
    } else {
        "FP64"
    }
}

/// `output` cut along its first dimension into `count` nested values.
fn split(output: &Tensor, count: usize) -> Result<Vec<Value>> {
    let values: Vec<Value> = match &output.data {
        Data::Bool(values) => values.iter().map(|&value| Value::Bool(value)).collect(),
        Data::Int(values) => values
            .iter()
            .map(|&value| i64::try_from(value).map_or_else(|_| json!(value as f64), Value::from))
            .collect(),
        Data::Float(values) => values.iter().map(|&value| json!(value)).collect(),
        Data::Bytes(values) => values
            .iter()
            .map(|value| Value::String(String::from_utf8_lossy(value).into_owned()))
            .collect(),
    };
    let (first, rest) = match output.shape.split_first() {
        Some((&first, rest)) if first as usize == count => (first as usize, rest.to_vec()),
        _ => {
            return Err(Error::MemberFailed(format!(
                "output `{}` has shape {:?}; /predict needs its first dimension to be the {count} queries",
                output.name, output.shape
            )));
        }
    };
    let per = values.len() / first.max(1);
    Ok(values
        .chunks(per.max(1))
        .take(count)
        .map(|chunk| nest(chunk, &rest))
        .collect())
}

fn nest(values: &[Value], shape: &[u64]) -> Value {
    match shape.split_first() {
        None => values.first().cloned().unwrap_or(Value::Null),
        Some((&size, rest)) => {
            let per = values.len() / (size as usize).max(1);
            Value::Array(
                values
                    .chunks(per.max(1))
                    .take(size as usize)
                    .map(|chunk| nest(chunk, rest))
                    .collect(),
            )
        }
    }
}
