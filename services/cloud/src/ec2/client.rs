//! The Query API client: one signed form POST per call over the workspace's `reqwest` (rustls with
//! the `ring` provider, as `kiln_core::tls` installs it), SigV4 by `object_store`'s
//! `AwsAuthorizer`, errors read from AWS's error document, and throttled or unavailable calls
//! retried with full-jitter exponential backoff (docs/provisioner.md, sections 8 and 10).

use std::time::Duration;

use http::header::CONTENT_TYPE;
use kiln_formats::error::with_sources;
use object_store::aws::{AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpRequest, HttpRequestBody};
use rand::Rng;
use tracing::{debug, warn};

use super::Ec2Config;
use super::codes;
use super::params::Params;
use super::xml::ErrorResponse;
use crate::CloudError;

/// Whether a call whose answer was lost may simply be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Reads, and terminations (idempotent): a lost answer is a retryable `Unavailable`.
    Safe,
    /// Launches: a lost answer is `Ambiguous`, never retried here; the reconciler lists by tag.
    Never,
}

/// A failed call: AWS's own error document (kept whole, so callers can read the code), or a
/// failure already classified.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    Api {
        status: u16,
        code: String,
        message: String,
        retry_after: Option<Duration>,
    },
    Cloud(CloudError),
}

impl CallError {
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            CallError::Api { code, .. } => Some(code),
            CallError::Cloud(_) => None,
        }
    }

    pub(crate) fn into_cloud(self) -> CloudError {
        match self {
            CallError::Api {
                status,
                code,
                message,
                retry_after,
            } => codes::cloud_error(status, &code, &message, retry_after),
            CallError::Cloud(error) => error,
        }
    }

    /// Capacity and quota codes are answers, not outages: they are never retried.
    fn is_retryable(&self) -> bool {
        match self {
            CallError::Api { code, .. } if codes::is_capacity(code) => false,
            other => other.clone().into_cloud().is_retryable(),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Api { retry_after, .. } => *retry_after,
            CallError::Cloud(CloudError::Throttled { retry_after }) => *retry_after,
            CallError::Cloud(_) => None,
        }
    }
}

impl From<CallError> for CloudError {
    fn from(error: CallError) -> CloudError {
        error.into_cloud()
    }
}

pub(crate) struct QueryClient {
    http: reqwest::Client,
    endpoint: String,
    region: String,
    credentials: AwsCredentialProvider,
    retry_base: Duration,
    retry_cap: Duration,
    max_attempts: u32,
}

impl QueryClient {
    pub(crate) fn new(config: &Ec2Config, credentials: AwsCredentialProvider) -> Result<QueryClient, CloudError> {
        kiln_core::tls::install_default_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| CloudError::Invalid(format!("cannot build the ec2 http client: {e}")))?;
        Ok(QueryClient {
            http,
            endpoint: config.endpoint_url(),
            region: config.region.clone(),
            credentials,
            retry_base: Duration::from_millis(config.retry_base_ms),
            retry_cap: Duration::from_millis(config.retry_cap_ms),
            max_attempts: config.max_attempts.max(1),
        })
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends the call, retrying throttled and unavailable answers up to the attempt limit.
    pub(crate) async fn call(&self, params: &Params, resend: Resend) -> Result<String, CallError> {
        let action = params.action();
        let mut attempt = 1;
        loop {
            match self.send(params, resend).await {
                Ok(body) => return Ok(body),
                Err(error) if attempt < self.max_attempts && error.is_retryable() => {
                    let delay = self.backoff(attempt, error.retry_after());
                    warn!(action, attempt, delay_ms = delay.as_millis() as u64, error = %error.clone().into_cloud(), "retrying an ec2 call");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Full jitter: a uniform pick in `[0, min(cap, base * 2^(attempt-1))]`, at least the
    /// server's `Retry-After` when it sent one (capped too).
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self
            .retry_base
            .saturating_mul(1 << (attempt - 1).min(20))
            .min(self.retry_cap);
        let jitter = Duration::from_millis(rand::rng().random_range(0..=ceiling.as_millis() as u64));
        match retry_after {
            Some(after) => jitter.max(after.min(self.retry_cap)),
            None => jitter,
        }
    }

    async fn send(&self, params: &Params, resend: Resend) -> Result<String, CallError> {
        let action = params.action();
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| CallError::Cloud(CloudError::Unauthorized(format!("cannot load aws credentials: {e}"))))?;
        let body = params.encode();
        let mut request: HttpRequest = http::Request::builder()
            .method(http::Method::POST)
            .uri(&self.endpoint)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded; charset=utf-8")
            .body(HttpRequestBody::from(body.clone()))
            .map_err(|e| CallError::Cloud(CloudError::Invalid(format!("bad ec2 endpoint {}: {e}", self.endpoint))))?;
        AwsAuthorizer::new(&credential, "ec2", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| CallError::Cloud(CloudError::Unauthorized(format!("cannot sign {action}: {e}"))))?;
        let headers = request.headers().clone();
        let lost = |what: String| match resend {
            Resend::Safe => CallError::Cloud(CloudError::Unavailable(what)),
            Resend::Never => CallError::Cloud(CloudError::Ambiguous(what)),
        };
        let response = match self.http.post(&self.endpoint).headers(headers).body(body).send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() => {
                return Err(CallError::Cloud(CloudError::Unavailable(format!(
                    "{action}: cannot connect to {}: {}",
                    self.endpoint,
                    with_sources(&error)
                ))));
            }
            Err(error) => return Err(lost(format!("{action}: sent, no answer: {}", with_sources(&error)))),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = match response.text().await {
            Ok(text) => text,
            Err(error) => return Err(lost(format!("{action}: answer cut off: {}", with_sources(&error)))),
        };
        if status == 200 {
            debug!(action, bytes = text.len(), "ec2 answered");
            return Ok(text);
        }
        match ErrorResponse::first(&text) {
            Some((code, message)) => Err(CallError::Api {
                status,
                code,
                message,
                retry_after,
            }),
            None => {
                let head: String = text.chars().take(200).collect();
                Err(CallError::Cloud(codes::status_error(
                    status,
                    &format!("{action}: {head}"),
                    retry_after,
                )))
            }
        }
    }
}
