//! EC2's instance metadata service, IMDSv2: a session token from `PUT /latest/api/token`
//! (`X-aws-ec2-metadata-token-ttl-seconds`), sent as `X-aws-ec2-metadata-token` with every
//! read. The token is kept and renewed when a fifth of its life is left, and at once when a
//! read is refused with 401 (the service restarted, or the token expired early), then the read
//! is tried again once.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde::Deserialize;

use super::{Identity, Interruption, MetadataSource, Notices, parse_utc};
use crate::error::{Error, Result};

const TOKEN_PATH: &str = "/latest/api/token";
const TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
/// The service is on the instance's link: anything slower than this is not answering.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A client of one instance metadata service.
pub struct Imds {
    http: reqwest::Client,
    /// `http://169.254.169.254`, without a trailing slash.
    endpoint: String,
    token_ttl: Duration,
    /// The session token and when it is to be renewed.
    token: tokio::sync::Mutex<Option<(String, Instant)>>,
}

/// `spot/instance-action`.
#[derive(Deserialize)]
struct InstanceAction {
    action: String,
    time: String,
}

/// `events/recommendations/rebalance`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rebalance {
    notice_time: String,
}

impl Imds {
    pub fn new(endpoint: &str, token_ttl: Duration) -> Result<Imds> {
        let http = reqwest::Client::builder()
            .no_proxy()
            // A new connection per read (three every poll, on the instance's link): a kept one
            // may be dead after the service restarted.
            .pool_max_idle_per_host(0)
            .connect_timeout(TIMEOUT)
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| Error::Metadata(format!("cannot build the HTTP client: {e}")))?;
        Ok(Imds {
            http,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token_ttl,
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// The session token: the one kept while it is fresh, else a new one.
    async fn token(&self, renew: bool) -> Result<String> {
        let mut kept = self.token.lock().await;
        if !renew
            && let Some((token, renew_at)) = kept.as_ref()
            && Instant::now() < *renew_at
        {
            return Ok(token.clone());
        }
        let response = self
            .http
            .put(format!("{}{TOKEN_PATH}", self.endpoint))
            .header(TTL_HEADER, self.token_ttl.as_secs().to_string())
            .send()
            .await
            .map_err(|e| Error::Metadata(format!("cannot get a session token: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(Error::Metadata(format!("a session token was refused: {status}")));
        }
        let token = response
            .text()
            .await
            .map_err(|e| Error::Metadata(format!("cannot read the session token: {e}")))?;
        // Renewed with a fifth of its life left, so a read never carries an expired one.
        let renew_at = Instant::now() + self.token_ttl.mul_f64(0.8);
        tracing::debug!(
            ttl_secs = self.token_ttl.as_secs(),
            "instance metadata session token taken"
        );
        *kept = Some((token.clone(), renew_at));
        Ok(token)
    }

    /// Reads `/latest/meta-data/<path>`; `None` when it is not there (404).
    pub async fn get(&self, path: &str) -> Result<Option<String>> {
        let mut renew = false;
        loop {
            let token = self.token(renew).await?;
            let response = self
                .http
                .get(format!("{}/latest/meta-data/{path}", self.endpoint))
                .header(TOKEN_HEADER, token)
                .send()
                .await
                .map_err(|e| Error::Metadata(format!("cannot read {path}: {e}")))?;
            match response.status() {
                StatusCode::NOT_FOUND => return Ok(None),
                StatusCode::UNAUTHORIZED if !renew => {
                    tracing::info!(path, "the session token was refused; taking a new one");
                    renew = true;
                }
                status if status.is_success() => {
                    let text = response
                        .text()
                        .await
                        .map_err(|e| Error::Metadata(format!("cannot read {path}: {e}")))?;
                    return Ok(Some(text.trim().to_string()));
                }
                status => return Err(Error::Metadata(format!("{path}: {status}"))),
            }
        }
    }

    async fn required(&self, path: &str) -> Result<String> {
        self.get(path)
            .await?
            .filter(|value| !value.is_empty())
            .ok_or_else(|| Error::Metadata(format!("{path} is missing")))
    }
}

#[async_trait::async_trait]
impl MetadataSource for Imds {
    async fn identity(&self) -> Result<Identity> {
        let instance_id = self.required("instance-id").await?;
        let instance_type = self.required("instance-type").await?;
        let zone = self.required("placement/availability-zone").await?;
        // Older instances have no placement/region: the zone less its letter.
        let region = match self.get("placement/region").await? {
            Some(region) if !region.is_empty() => region,
            _ => zone.trim_end_matches(|c: char| c.is_ascii_lowercase()).to_string(),
        };
        let market = match self.get("instance-life-cycle").await?.as_deref() {
            Some("spot") => "spot",
            _ => "on-demand",
        };
        Ok(Identity {
            instance_id,
            instance_type,
            zone,
            region,
            market: market.into(),
        })
    }

    async fn notices(&self) -> Result<Notices> {
        let rebalance_at_ms = match self.get("events/recommendations/rebalance").await? {
            Some(body) => {
                let rebalance: Rebalance = serde_json::from_str(&body)
                    .map_err(|e| Error::Metadata(format!("a rebalance recommendation that does not read: {e}")))?;
                Some(parse_utc(&rebalance.notice_time).unwrap_or_else(kiln_core::ids::now_ms))
            }
            None => None,
        };
        let interruption = match self.get("spot/instance-action").await? {
            Some(body) => {
                let action: InstanceAction = serde_json::from_str(&body)
                    .map_err(|e| Error::Metadata(format!("an interruption notice that does not read: {e}")))?;
                // Unreadable time: act as if the usual two minutes were left.
                let at_ms = parse_utc(&action.time).unwrap_or_else(|| kiln_core::ids::now_ms() + 120_000);
                Some(Interruption {
                    action: action.action,
                    at_ms,
                })
            }
            None => None,
        };
        Ok(Notices {
            rebalance_at_ms,
            interruption,
        })
    }
}
