//! The Open Inference Protocol's REST API (KServe v2) and SINGA-Auto's `POST /predict`.
//!
//! | route | answers |
//! |---|---|
//! | `GET /v2/health/live`, `/v2/health/ready` | 200 (no token needed) |
//! | `GET /v2` | server metadata |
//! | `GET /v2/models/{model}[/versions/{v}]` | model metadata (the service's inputs and outputs) |
//! | `GET /v2/models/{model}[/versions/{v}]/ready` | 200 for a service the caller may use |
//! | `POST /v2/models/{model}[/versions/{v}]/infer` | inference, JSON or the binary tensor extension |
//! | `POST /predict[/{model}]` | `{"query": x}` → `{"prediction": y}`, `{"queries": [..]}` → `{"predictions": [..]}` |
//!
//! `{model}` is a service's `NAME`, or `PROJECT/NAME` (two path segments, or one with `%2F`):
//! service names are unique per project, and a bare name is the service of that name in the one
//! project the caller may read that has it ([`infer::service`]; 409 when several do). A
//! KServe client given the model name `PROJECT/NAME` builds these URLs, and the answers name
//! the model as the request did. Service names `ready`
//! and `infer` are refused at creation, so a path reads one way.
//!
//! Every route but health needs `authorization: Bearer <token>` of a viewer of the service's
//! project. Errors are `{"error": "..."}` with 400 (the request's fault, an unknown model
//! included), 401, 403, 409 (a bare name of several projects), 503 (no worker), 504 (too few
//! members by the deadline) or 500.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kiln_core::auth::Principal;
use kiln_formats::oip::{HEADER_LENGTH, InferRequest};
use serde_json::{Value, json};

use crate::{Error, Result, Shared, infer, predict};

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v2/health/live", get(|| async { axum::Json(json!({"live": true})) }))
        .route("/v2/health/ready", get(|| async { axum::Json(json!({"ready": true})) }))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{*path}", get(model_get).post(model_post))
        .route("/predict", post(predict_only))
        .route("/predict/{*model}", post(predict_named))
        .fallback(|| async { no_route() })
        .with_state(shared)
}

fn error_response(error: &Error) -> Response {
    let status = StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(json!({ "error": error.public_message() }))).into_response()
}

fn respond(outcome: Result<Response>) -> Response {
    outcome.unwrap_or_else(|error| error_response(&error))
}

async fn caller(shared: &Shared, headers: &HeaderMap) -> Result<Principal> {
    kiln_core::auth::authenticate(&shared.tokens, headers)
        .await
        .map_err(|status| {
            if status.code() == tonic::Code::Unavailable {
                Error::Unavailable(status.message().to_string())
            } else {
                Error::Unauthenticated(status.message().to_string())
            }
        })
}

async fn body_bytes(shared: &Shared, body: Body) -> Result<bytes::Bytes> {
    let limit = shared.config.max_body_bytes;
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        Error::InvalidArgument(format!(
            "the request body is larger than {limit} bytes, the predictor's max-body-bytes; send fewer or smaller tensors per request"
        ))
    })
}

async fn server_metadata(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    respond(
        async {
            caller(&shared, &headers).await?;
            Ok(axum::Json(json!({
                "name": "kiln",
                "version": env!("CARGO_PKG_VERSION"),
                "extensions": ["binary_tensor_data", "parameters"],
            }))
            .into_response())
        }
        .await,
    )
}

/// What a path under `/v2/models/` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Metadata,
    Ready,
    Infer,
}

/// A path under `/v2/models/`: `{model}[/versions/{v}][/ready|/infer]`, `{model}` being `NAME`
/// or `PROJECT/NAME`. `None` when it is none of these.
fn model_path(path: &str) -> Option<(String, Option<String>, Action)> {
    let mut segments: Vec<&str> = path.split('/').collect();
    if segments.iter().any(|segment| segment.is_empty()) {
        return None;
    }
    let action = match segments.last().copied() {
        Some("ready") if segments.len() > 1 => Action::Ready,
        Some("infer") if segments.len() > 1 => Action::Infer,
        _ => Action::Metadata,
    };
    if action != Action::Metadata {
        segments.pop();
    }
    let mut version = None;
    if segments.len() >= 3 && segments[segments.len() - 2] == "versions" {
        version = segments.pop().map(str::to_string);
        segments.pop();
    }
    match segments.as_slice() {
        [_] | [_, _] => Some((segments.join("/"), version, action)),
        _ => None,
    }
}

fn no_route() -> Response {
    error_response(&Error::NotFound(
        "no such route; see the Open Inference Protocol's REST API".into(),
    ))
}

async fn model_get(state: State<Arc<Shared>>, headers: HeaderMap, Path(path): Path<String>) -> Response {
    match model_path(&path) {
        Some((model, version, Action::Metadata)) => metadata(state, headers, model, version).await,
        Some((model, version, Action::Ready)) => ready(state, headers, model, version).await,
        _ => no_route(),
    }
}

async fn model_post(state: State<Arc<Shared>>, headers: HeaderMap, Path(path): Path<String>, body: Body) -> Response {
    match model_path(&path) {
        Some((model, version, Action::Infer)) => infer_http(state, headers, model, version, body).await,
        _ => no_route(),
    }
}

async fn metadata(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    name: String,
    version: Option<String>,
) -> Response {
    respond(
        async {
            let principal = caller(&shared, &headers).await?;
            let spec = infer::at_version(infer::service(&shared, &principal, &name).await?, version.as_deref())?;
            let tensors = |specs: &[kiln_core::serving::TensorSpec]| -> Value {
                specs
                    .iter()
                    .map(|tensor| json!({"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}))
                    .collect()
            };
            Ok(axum::Json(json!({
                "name": name,
                "versions": [spec.revision.to_string()],
                "platform": format!("kiln-ensemble-{}", spec.ensemble.as_str()),
                "inputs": tensors(&spec.inputs),
                "outputs": tensors(&spec.outputs),
            }))
            .into_response())
        }
        .await,
    )
}

async fn ready(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    name: String,
    version: Option<String>,
) -> Response {
    respond(
        async {
            let principal = caller(&shared, &headers).await?;
            infer::at_version(infer::service(&shared, &principal, &name).await?, version.as_deref())?;
            Ok(axum::Json(json!({"name": name, "ready": true})).into_response())
        }
        .await,
    )
}

async fn infer_http(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    name: String,
    version: Option<String>,
    body: Body,
) -> Response {
    respond(
        async {
            let principal = caller(&shared, &headers).await?;
            let spec = infer::at_version(infer::service(&shared, &principal, &name).await?, version.as_deref())?;
            let header_length = match headers.get(HEADER_LENGTH) {
                None => None,
                Some(value) => Some(
                    value
                        .to_str()
                        .ok()
                        .and_then(|text| text.parse::<usize>().ok())
                        .ok_or_else(|| Error::InvalidArgument(format!("{HEADER_LENGTH} must be a number of bytes")))?,
                ),
            };
            let body = body_bytes(&shared, body).await?;
            let request = InferRequest::parse(&body, header_length, &shared.limits)
                .map_err(|error| Error::InvalidArgument(error.to_string()))?;
            let wants: Vec<(String, bool)> = request
                .outputs
                .iter()
                .map(|output| (output.name.clone(), request.wants_binary(&output.name)))
                .collect();
            let default_binary = request.parameters.get("binary_data_output").and_then(Value::as_bool) == Some(true);
            let mut response = infer::infer(&shared, &spec, request).await?;
            // Named as the client named it (`PROJECT/NAME` too), as KServe clients expect.
            response.model_name = name;
            let (body, header_length) = response.encode(&|tensor| {
                wants
                    .iter()
                    .find(|(name, _)| *name == tensor.name)
                    .map_or(default_binary, |(_, binary)| *binary)
            });
            let mut reply = Response::new(Body::from(body));
            match header_length {
                Some(length) => {
                    reply.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    );
                    reply.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(length));
                }
                None => {
                    reply
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
            }
            Ok(reply)
        }
        .await,
    )
}

async fn predict_only(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    predict_http(shared, headers, None, body).await
}

async fn predict_named(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Response {
    predict_http(shared, headers, Some(name), body).await
}

async fn predict_http(shared: Arc<Shared>, headers: HeaderMap, name: Option<String>, body: Body) -> Response {
    respond(
        async {
            let principal = caller(&shared, &headers).await?;
            let spec = match name {
                Some(name) => infer::service(&shared, &principal, &name).await?,
                None => predict::only_service(&shared, &principal)?,
            };
            let body = body_bytes(&shared, body).await?;
            let answer = predict::predict(&shared, &spec, &body).await?;
            Ok(axum::Json(answer).into_response())
        }
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_paths_name_a_service_bare_or_with_its_project() {
        let parsed = |path: &str| model_path(path);
        assert_eq!(parsed("digits"), Some(("digits".into(), None, Action::Metadata)));
        assert_eq!(parsed("digits/ready"), Some(("digits".into(), None, Action::Ready)));
        assert_eq!(parsed("digits/infer"), Some(("digits".into(), None, Action::Infer)));
        assert_eq!(
            parsed("digits/versions/2/infer"),
            Some(("digits".into(), Some("2".into()), Action::Infer))
        );
        assert_eq!(
            parsed("digits/versions/2"),
            Some(("digits".into(), Some("2".into()), Action::Metadata))
        );
        assert_eq!(
            parsed("alpha/digits"),
            Some(("alpha/digits".into(), None, Action::Metadata))
        );
        assert_eq!(
            parsed("alpha/digits/ready"),
            Some(("alpha/digits".into(), None, Action::Ready))
        );
        assert_eq!(
            parsed("alpha/digits/versions/3/ready"),
            Some(("alpha/digits".into(), Some("3".into()), Action::Ready))
        );
        assert_eq!(
            parsed("alpha/digits/versions/3/infer"),
            Some(("alpha/digits".into(), Some("3".into()), Action::Infer))
        );
        // A service may be called `versions`; a project anything.
        assert_eq!(
            parsed("alpha/versions"),
            Some(("alpha/versions".into(), None, Action::Metadata))
        );
        assert_eq!(
            parsed("versions/digits/infer"),
            Some(("versions/digits".into(), None, Action::Infer))
        );
        for bad in [
            "a/b/c",
            "a/b/c/infer",
            "a//infer",
            "",
            "a/b/versions",
            "a/b/c/versions/1",
        ] {
            assert_eq!(parsed(bad), None, "{bad}");
        }
    }
}
