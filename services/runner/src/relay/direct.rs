//! The relay's direct channel: `POST /infer` over HTTP/1.1 keep-alive on `direct-addr`, taking
//! the requests of the predictors that learnt its URL and token from the load reports. A request
//! without the token is refused 401; out of rotation the answer is 503 at once (the predictor
//! asks another worker); one dropped unanswered (expired, or the worker missed its deadline) is
//! answered 504. Otherwise the answer is the worker's, as through NATS.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_core::serving::{BUDGET_HEADER, DIRECT_TOKEN_HEADER};
use kiln_formats::oip::HEADER_LENGTH;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Relay, Reply, Request, budget_of};
use crate::{Error, Result};

/// Binds the direct channel, records its URL and token, and serves it until `stop`.
pub(super) async fn listen(relay: Arc<Relay>, stop: CancellationToken) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&relay.settings.direct_addr)
        .await
        .map_err(Error::io(format!("cannot listen on {}", relay.settings.direct_addr)))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("the direct channel's address"))?;
    let url = match relay.settings.direct_advertise_host.as_str() {
        "" => format!("http://{addr}"),
        host => format!("http://{host}:{}", addr.port()),
    };
    let token = hex::encode(rand::random::<[u8; 16]>());
    let _ = relay.direct.set((url, token));
    let router = axum::Router::new()
        .route("/infer", axum::routing::post(infer))
        .with_state(relay);
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::warn!(error = %error, "the relay's direct channel failed");
        }
    });
    Ok(())
}

/// Counts a request in flight until dropped, even when the caller gave up on it.
struct InFlight<'a>(&'a Relay);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.load.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn infer(State(relay): State<Arc<Relay>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = Instant::now();
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let token = relay.direct.get().map(|(_, token)| token.as_str()).unwrap_or_default();
    if !kiln_core::auth::constant_time_eq(header(DIRECT_TOKEN_HEADER).unwrap_or_default(), token) {
        return error(StatusCode::UNAUTHORIZED, "a relay's direct channel needs its token");
    }
    let Some(turn) = relay.current.lock().expect("rotation lock").clone() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the worker is out of rotation");
    };
    relay.load.in_flight.fetch_add(1, Ordering::Relaxed);
    let _counted = InFlight(&relay);
    let request = Request {
        budget: budget_of(header(BUDGET_HEADER)),
        payload: body,
        arrived,
        channel: "direct",
    };
    match relay.take(&turn, request).await {
        Reply::Answer {
            status,
            header_length,
            body,
        } => {
            let mut response = (StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), body).into_response();
            let headers = response.headers_mut();
            headers.insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(length) = header_length.and_then(|length| HeaderValue::from_str(&length).ok()) {
                headers.insert(HEADER_LENGTH, length);
            }
            response
        }
        Reply::Nothing => StatusCode::GATEWAY_TIMEOUT.into_response(),
    }
}
