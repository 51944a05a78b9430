//! The api's HTTP side: the web UI's files and its JSON and server-sent-events API
//! (docs/http-api.md), a transcoder of kiln's gRPC services ([`transcode`]) behind a session
//! cookie ([`session`]) that a token or a login approved from the CLI ([`pending`]) sets.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use kiln_core::store::Store;
use sha2::Digest;
use tonic::{Code, Status};

mod files;
pub mod pending;
pub mod session;
pub mod transcode;

pub use files::Files;
use transcode::{Shape, Transcoder};

/// The largest request body: a chunk of metric points in JSON, or a file uploaded from the
/// browser (bigger archives go up with the CLI, which streams them).
const MAX_BODY_BYTES: usize = 64 << 20;

/// The chunks an uploaded file goes to `ArtifactService/UploadArtifact` in.
const UPLOAD_CHUNK_BYTES: usize = 1 << 20;

/// What the HTTP side needs to answer.
pub struct Gateway {
    pub transcoder: Transcoder,
    pub store: Store,
    /// How long a session made by a `kiln ui` login lasts.
    pub session_ms: i64,
    /// Served over HTTPS: cookies are `Secure`.
    pub secure: bool,
    pub files: Files,
}

/// The routes of the HTTP side.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let files = gateway.files.clone();
    let api = Router::new()
        .route("/api/v1/login", post(session::login))
        .route("/api/v1/logout", post(session::logout))
        .route("/api/v1/login/pending", post(pending::begin))
        .route("/api/v1/login/pending/redeem", post(pending::redeem))
        .route("/api/v1/rpc/{service}/{method}", post(rpc))
        .route("/api/v1/stream/{service}/{method}", get(stream))
        .route("/api/v1/download/{service}/{method}", get(download))
        .route("/api/v1/upload", post(upload))
        .route("/api/{*rest}", axum::routing::any(no_such_call))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(gateway);
    api.fallback_service(files.service())
        .layer(tower_http::set_header::SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; \
                 frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
            ),
        ))
        .layer(tower_http::set_header::SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(tower_http::set_header::SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
}

/// `POST /api/v1/rpc/{service}/{method}`: a unary call.
async fn rpc(
    State(gateway): State<Arc<Gateway>>,
    Path((service, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    written(&headers, |token| async move {
        gateway
            .transcoder
            .call(&service, &method, Shape::Unary)?
            .unary(&token, &body)
            .await
    })
    .await
}

/// A call that writes: the CSRF proof checked, then `call` with the caller's token; its JSON
/// answer, or the refusal.
async fn written<F: Future<Output = Result<Vec<u8>, Status>>>(
    headers: &HeaderMap,
    call: impl FnOnce(String) -> F,
) -> Response {
    let answered = async {
        session::check_csrf(headers)?;
        call(session::token(headers)?).await
    };
    match answered.await {
        Ok(json) => json_response(json),
        Err(status) => status_response(status),
    }
}

#[derive(serde::Deserialize)]
struct UploadQuery {
    /// The project that uploads the file and may use it (empty: `default`).
    #[serde(default)]
    project: String,
}

/// `POST /api/v1/upload?project=<name>`: the body (a file, such as a dataset's archive) stored
/// as a blob of the project through `ArtifactService/UploadArtifact`, which checks the caller's
/// role there and the digest computed here; answers its `UploadArtifactResponse` as JSON.
async fn upload(
    State(gateway): State<Arc<Gateway>>,
    Query(query): Query<UploadQuery>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    written(&headers, |token| async move {
        if body.is_empty() {
            return Err(Status::invalid_argument(
                "the upload is empty: send the file as the body",
            ));
        }
        let header = serde_json::json!({"header": {
            "digest": hex::encode(sha2::Sha256::digest(&body)),
            "size": body.len(),
            "project": query.project,
        }});
        let chunks = (0..body.len())
            .step_by(UPLOAD_CHUNK_BYTES)
            .map(|start| body.slice(start..(start + UPLOAD_CHUNK_BYTES).min(body.len())))
            .collect();
        gateway
            .transcoder
            .call("ArtifactService", "UploadArtifact", Shape::ClientStreaming)?
            .client_streaming(&token, header.to_string().as_bytes(), "chunk", chunks)
            .await
    })
    .await
}

#[derive(serde::Deserialize)]
struct StreamQuery {
    #[serde(default)]
    request: String,
    /// What the browser saves a download as.
    #[serde(default)]
    filename: String,
}

/// `GET /api/v1/download/{service}/{method}?request=<JSON>&filename=<name>`: a file served in
/// chunks by a server-streaming method (`ArtifactService/GetRunArtifact`, `GetOutput`,
/// `ModelService/GetModelFile`) as the body of a download. A failure after the first byte
/// breaks the body, so a download never ends cut short but whole-looking.
async fn download(
    State(gateway): State<Arc<Gateway>>,
    Path((service, method)): Path<(String, String)>,
    Query(query): Query<StreamQuery>,
    headers: HeaderMap,
) -> Response {
    let started = async {
        let token = session::token(&headers)?;
        gateway
            .transcoder
            .call(&service, &method, Shape::ServerStreaming)?
            .download(&token, query.request.as_bytes())
            .await
    };
    let chunks = match started.await {
        Ok(chunks) => chunks,
        Err(status) => return status_response(status),
    };
    let name: String = query
        .filename
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .collect();
    let name = if name.is_empty() { "download".to_string() } else { name };
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response()
}

/// `GET /api/v1/stream/{service}/{method}?request=<JSON>`: a server-streaming call as
/// server-sent events; answers with a `seq` (log lines, a watched list's changes) carry it as
/// their id, and a reconnect with `Last-Event-ID` skips what it saw.
async fn stream(
    State(gateway): State<Arc<Gateway>>,
    Path((service, method)): Path<(String, String)>,
    Query(query): Query<StreamQuery>,
    headers: HeaderMap,
) -> Response {
    let seen = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    let started = async {
        let token = session::token(&headers)?;
        let call = gateway.transcoder.call(&service, &method, Shape::ServerStreaming)?;
        // Resumed (a log, a watched list): the service starts after the event seen instead of
        // sending everything again.
        let request = match seen {
            Some(seen) if call.resumes() => resumed_after(&query.request, seen),
            _ => query.request.clone(),
        };
        call.server_streaming(&token, request.as_bytes()).await
    };
    let answers = match started.await {
        Ok(answers) => answers,
        Err(status) => return status_response(status),
    };
    let events = answers
        .filter(move |answer| {
            let fresh = !matches!((answer, seen), (Ok((Some(seq), _)), Some(seen)) if *seq <= seen);
            std::future::ready(fresh)
        })
        .map(|answer| {
            Ok::<_, Infallible>(match answer {
                Ok((seq, json)) => {
                    let event = Event::default().data(String::from_utf8_lossy(&json));
                    match seq {
                        Some(seq) => event.id(seq.to_string()),
                        None => event,
                    }
                }
                Err(status) => Event::default()
                    .event("error")
                    .data(String::from_utf8_lossy(&error_body(&status))),
            })
        })
        .chain(futures::stream::once(async {
            Ok(Event::default().event("end").data("{}"))
        }));
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// A request (JSON) with `afterSeq` set to the last event seen; one that is not a JSON object
/// goes as it is (the call refuses it).
fn resumed_after(request: &str, seen: u64) -> String {
    match serde_json::from_str::<serde_json::Value>(request) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.insert("afterSeq".into(), serde_json::Value::String(seen.to_string()));
            serde_json::Value::Object(fields).to_string()
        }
        _ => request.to_string(),
    }
}

async fn no_such_call() -> Response {
    status_response(Status::not_found(
        "no such call: the HTTP API is /api/v1/rpc/{Service}/{Method} and /api/v1/stream/{Service}/{Method} (docs/http-api.md)",
    ))
}

/// A JSON answer.
pub(crate) fn json_response(json: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

/// A refusal or failure as JSON (`{"code", "message"}`) with the HTTP status of its code.
pub(crate) fn status_response(status: Status) -> Response {
    let http = match status.code() {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (http, [(header::CONTENT_TYPE, "application/json")], error_body(&status)).into_response()
}

fn error_body(status: &Status) -> Vec<u8> {
    let code = format!("{:?}", status.code());
    let snake = code.chars().fold(String::new(), |mut out, c| {
        if c.is_uppercase() && !out.is_empty() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
        out
    });
    serde_json::to_vec(&serde_json::json!({ "code": snake, "message": status.message() })).expect("plain JSON")
}

#[cfg(test)]
mod tests {
    use super::resumed_after;

    #[test]
    fn a_resumed_log_asks_for_the_lines_after_the_one_seen() {
        let request: serde_json::Value =
            serde_json::from_str(&resumed_after(r#"{"jobId":"j1","follow":true,"afterSeq":"3"}"#, 42)).unwrap();
        assert_eq!(
            request,
            serde_json::json!({"jobId": "j1", "follow": true, "afterSeq": "42"})
        );
        assert_eq!(resumed_after("not json", 42), "not json");
    }
}
