//! The Open Inference Protocol's REST API (KServe v2) and SINGA-Auto's `POST /predict`.
//!
//! | route | answers |
//! |---|---|
//! | `GET /v2/health/live`, `/v2/health/ready` | 200 (no token needed) |
//! | `GET /v2` | server metadata |
//! | `GET /v2/models/{name}[/versions/{v}]` | model metadata (the service's inputs and outputs) |
//! | `GET /v2/models/{name}[/versions/{v}]/ready` | 200 for a service the caller may use |
//! | `POST /v2/models/{name}[/versions/{v}]/infer` | inference, JSON or the binary tensor extension |
//! | `POST /predict[/{name}]` | `{"query": x}` → `{"prediction": y}`, `{"queries": [..]}` → `{"predictions": [..]}` |
//!
//! Every route but health needs `authorization: Bearer <token>` of a viewer of the service's
//! project. Errors are `{"error": "..."}` with 400 (the request's fault, an unknown model
//! included), 401, 403, 503 (no worker), 504 (too few members by the deadline) or 500.

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
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(model_metadata_at))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/versions/{version}/ready", get(model_ready_at))
        .route("/v2/models/{name}/infer", post(infer_latest))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer_at))
        .route("/predict", post(predict_only))
        .route("/predict/{name}", post(predict_named))
        .fallback(|| async {
            error_response(&Error::NotFound(
                "no such route; see the Open Inference Protocol's REST API".into(),
            ))
        })
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

async fn model_metadata(state: State<Arc<Shared>>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    metadata(state, headers, name, None).await
}

async fn model_metadata_at(
    state: State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    metadata(state, headers, name, Some(version)).await
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
                "name": spec.name,
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

async fn model_ready(state: State<Arc<Shared>>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    ready(state, headers, name, None).await
}

async fn model_ready_at(
    state: State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    ready(state, headers, name, Some(version)).await
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
            let spec = infer::at_version(infer::service(&shared, &principal, &name).await?, version.as_deref())?;
            Ok(axum::Json(json!({"name": spec.name, "ready": true})).into_response())
        }
        .await,
    )
}

async fn infer_latest(state: State<Arc<Shared>>, headers: HeaderMap, Path(name): Path<String>, body: Body) -> Response {
    infer_http(state, headers, name, None, body).await
}

async fn infer_at(
    state: State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, version)): Path<(String, String)>,
    body: Body,
) -> Response {
    infer_http(state, headers, name, Some(version), body).await
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
            let response = infer::infer(&shared, &spec, request).await?;
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
            let name = match name {
                Some(name) => name,
                None => predict::only_service(&shared)?,
            };
            let spec = infer::service(&shared, &principal, &name).await?;
            let body = body_bytes(&shared, body).await?;
            let answer = predict::predict(&shared, &spec, &body).await?;
            Ok(axum::Json(answer).into_response())
        }
        .await,
    )
}
