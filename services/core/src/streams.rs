//! Connecting to NATS (one server or a cluster), creating the streams and buckets idempotently
//! with the configured replicas, and publishing with a message id so JetStream drops duplicates.
//!
//! A node of a cluster may die at any time: the client reconnects forever (to any server of
//! `nats.url` or that the cluster advertises), and a publish that fails or times out while a
//! stream elects a new leader is sent again with the same message id (see [`publish`]).

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use tokio::time::Instant;

use crate::config::NatsConfig;
use crate::error::ErrorKind;
use crate::nats_auth::Service;
use crate::subjects::*;

pub use crate::publish::{Pipeline, backoff, publish, publish_all, try_publish};

/// How long [`connect`] keeps trying to reach NATS and set the streams up before it gives up.
const CONNECT_WINDOW: Duration = Duration::from_secs(30);

/// NatsError is a failure talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("nats.url {url:?} is not a server URL: {message}")]
    Url { url: String, message: String },
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[error("cannot read the NATS credentials {path}: {message}")]
    Credentials { path: String, message: String },
    #[error("cannot create stream or bucket {name}: {message}")]
    Setup { name: String, message: String },
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    #[error("NATS request failed: {0}")]
    Other(String),
}

impl NatsError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            NatsError::Url { .. } | NatsError::Credentials { .. } => ErrorKind::InvalidArgument,
            _ => ErrorKind::Unavailable,
        }
    }
}

/// Nats holds a client and its JetStream context.
#[derive(Clone, Debug)]
pub struct Nats {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
}

/// The options of `config`'s TLS and authentication settings.
async fn auth_options(config: &NatsConfig) -> Result<async_nats::ConnectOptions, NatsError> {
    crate::tls::install_default_provider();
    let credentials_error = |path: &std::path::Path, message: String| NatsError::Credentials {
        path: path.display().to_string(),
        message,
    };
    let mut options = match &config.credentials_file {
        Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| credentials_error(path, e.to_string()))?,
        None => async_nats::ConnectOptions::new(),
    };
    if let Some(path) = &config.nkey_seed_file {
        let seed = std::fs::read_to_string(path).map_err(|e| credentials_error(path, e.to_string()))?;
        options = options.nkey(seed.trim().to_string());
    }
    if config.require_tls {
        options = options.require_tls(true);
    }
    if let Some(path) = &config.tls_ca_file {
        options = options.add_root_certificates(path.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// Connects to the servers of `nats.url` and makes sure every stream and bucket exists with
/// `nats.replicas`. Both are retried with backoff for [`CONNECT_WINDOW`] (a cluster may still be
/// electing its leaders); after that the last error is returned. Once connected, the client
/// reconnects forever.
pub async fn connect(config: &NatsConfig) -> Result<Nats, NatsError> {
    connect_with(config, None).await
}

/// [`connect`] as `service`: the connection is named `kiln-<service>` and its replies come
/// under the service's own inbox prefix, the only one its NATS user may subscribe to
/// ([`crate::nats_auth`]).
pub async fn connect_as(config: &NatsConfig, service: Service) -> Result<Nats, NatsError> {
    connect_with(config, Some(service)).await
}

async fn connect_with(config: &NatsConfig, service: Option<Service>) -> Result<Nats, NatsError> {
    let name = service.map_or_else(|| "kiln".to_string(), |service| format!("kiln-{service}"));
    let servers = config
        .servers()
        .into_iter()
        .map(|url| {
            url.parse::<async_nats::ServerAddr>().map_err(|e| NatsError::Url {
                url: url.to_string(),
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + CONNECT_WINDOW;
    let mut attempt = 0;
    let client = loop {
        let mut options = auth_options(config).await?;
        if let Some(service) = service {
            options = options.custom_inbox_prefix(service.inbox_prefix());
        }
        let options = options
            .name(&name)
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| backoff(u32::try_from(attempts).unwrap_or(u32::MAX)))
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("connected to NATS"),
                    async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
                    // A permissions violation: this service's NATS user may not use a subject.
                    async_nats::Event::ServerError(error) => tracing::warn!(error = %error, "NATS server error"),
                    other => tracing::info!(event = %other, "NATS connection event"),
                }
            });
        match options.connect(servers.clone()).await {
            Ok(client) => break client,
            Err(source) if Instant::now() + backoff(attempt) >= deadline => {
                return Err(NatsError::Connect {
                    url: config.url.clone(),
                    source,
                });
            }
            Err(error) => {
                tracing::warn!(url = %config.url, error = %error, "cannot connect to NATS; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
        }
    };
    if config.replicas > 1 && client.server_info().cluster.is_none() {
        return Err(NatsError::Setup {
            name: "every stream".into(),
            message: format!(
                "nats.replicas = {} needs a JetStream cluster of at least {} servers, and {} is a single server: set nats.replicas = 1 or point nats.url at a cluster",
                config.replicas,
                config.replicas,
                client.server_info().server_name
            ),
        });
    }
    let jetstream = jetstream::new(client.clone());
    let mut attempt = 0;
    loop {
        match ensure_streams(&jetstream, config.replicas).await {
            Ok(()) => break,
            Err(error) if Instant::now() + backoff(attempt) >= deadline => return Err(error),
            Err(error) => {
                tracing::warn!(error = %error, "cannot set the streams up yet; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
        }
    }
    Ok(Nats { client, jetstream })
}

/// Returns the configuration of every stream kiln uses.
pub fn stream_configs(replicas: usize) -> Vec<stream::Config> {
    let day = Duration::from_secs(24 * 3600);
    let spec = |name: &str, subjects: &[&str], retention, max_age| stream::Config {
        name: name.to_string(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        retention,
        max_age,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    use stream::RetentionPolicy::{Interest, Limits, WorkQueue};
    vec![
        spec(STREAM_JOBS, &[JOB_QUEUED, JOB_EVENT_ALL], Limits, 7 * day),
        // A launch is for one runner (`kiln.launch.<pool>.<runner>`); one for a runner that is
        // gone (an instance released, its consumer deleted after an hour idle) would stay for
        // ever: a day bounds it. The job itself was queued again when the runner's lease lapsed.
        spec(STREAM_LAUNCH, &[LAUNCH_ALL], WorkQueue, day),
        spec(STREAM_CONTROL, &[CONTROL_ALL], Interest, day),
        spec(STREAM_METRICS, &[METRICS_ALL], Limits, day),
        spec(STREAM_LOGS, &[LOGS_ALL], Limits, day),
        spec(STREAM_ITEMS, &[ITEMS_ALL], WorkQueue, Duration::ZERO),
        spec(STREAM_ITEM_RESULTS, &[ITEM_RESULTS_ALL], Limits, 7 * day),
        // Which records of a list changed (kiln_core::feed): a day of them, so a page left open
        // overnight resumes with the whole list instead.
        spec(STREAM_CHANGES, &[CHANGES_ALL], Limits, day),
    ]
}

/// The KV buckets kiln uses, with the max age of their entries.
pub const BUCKETS: [(&str, Duration); 7] = [
    (BUCKET_LEASES, Duration::from_secs(30)),
    (BUCKET_CAPACITY, Duration::from_secs(60)),
    // An expired runner lease stays readable for an hour, so a scheduler that takes over still
    // knows what to do with the jobs of a runner that died while none led.
    (BUCKET_RUNNERS, Duration::from_secs(3600)),
    // Kept until overwritten (a max age of zero is none).
    (BUCKET_SCHEDULER, Duration::ZERO),
    (BUCKET_SERVICES, Duration::ZERO),
    // A pass writes the demand every second: an hour-old snapshot is a dead scheduler's.
    (BUCKET_DEMAND, Duration::from_secs(3600)),
    (BUCKET_PROVISIONER, Duration::from_secs(3600)),
];

/// The stream behind a KV bucket.
pub fn bucket_stream(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// Creates every stream and KV bucket that does not exist yet, so every service can call this
/// at start. Existing ones are kept as they are, except their replicas: one with other replicas
/// than `replicas` is updated to them (JetStream moves the data), or the error says why not.
pub async fn ensure_streams(js: &jetstream::Context, replicas: usize) -> Result<(), NatsError> {
    let setup = |name: &str, error: &dyn std::fmt::Display| NatsError::Setup {
        name: name.to_string(),
        message: with_replicas_hint(error.to_string(), replicas),
    };
    for config in stream_configs(replicas) {
        let name = config.name.clone();
        let stream = js.get_or_create_stream(config).await.map_err(|e| setup(&name, &e))?;
        ensure_replicas(js, stream.cached_info().config.clone(), replicas).await?;
    }
    for (bucket, ttl) in BUCKETS {
        if js.get_key_value(bucket).await.is_err() {
            let created = js
                .create_key_value(kv::Config {
                    bucket: bucket.to_string(),
                    history: 1,
                    max_age: ttl,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await;
            // Another service may have created it in the meantime.
            if let Err(error) = created
                && js.get_key_value(bucket).await.is_err()
            {
                return Err(setup(bucket, &error));
            }
        }
        let mut stream = js
            .get_stream(bucket_stream(bucket))
            .await
            .map_err(|e| setup(bucket, &e))?;
        let info = stream.info().await.map_err(|e| setup(bucket, &e))?;
        ensure_replicas(js, info.config.clone(), replicas).await?;
    }
    Ok(())
}

/// Updates a stream that has other replicas than `replicas` to them.
async fn ensure_replicas(
    js: &jetstream::Context,
    mut config: stream::Config,
    replicas: usize,
) -> Result<(), NatsError> {
    let had = config.num_replicas;
    if had == replicas {
        return Ok(());
    }
    tracing::warn!(stream = %config.name, had, replicas, "the stream has other replicas than nats.replicas; updating it");
    config.num_replicas = replicas;
    let name = config.name.clone();
    js.update_stream(config).await.map_err(|e| NatsError::Setup {
        name,
        message: with_replicas_hint(
            format!("it has {had} replicas and nats.replicas is {replicas}; changing them failed: {e}"),
            replicas,
        ),
    })?;
    Ok(())
}

fn with_replicas_hint(message: String, replicas: usize) -> String {
    if replicas > 1 {
        format!("{message} (nats.replicas = {replicas} needs a JetStream cluster of at least {replicas} servers)")
    } else {
        message
    }
}

/// The longest log line on `KILN_LOGS`, in bytes: runners cut longer output into pieces of this
/// size, and WriteLogs refuses longer lines.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// How often [`request`] asks again while nobody listens on the subject.
const NO_RESPONDERS_RETRY: Duration = Duration::from_millis(100);

/// Asks `subject` over core NATS request/reply and waits up to `timeout` for the answer; `None`
/// when none came in time. While nobody listens (no responders: a leader between terms, or none
/// started yet) it asks again every 100 ms until the timeout, so a short gap in leadership is
/// not an error.
pub async fn request(
    nats: &Nats,
    subject: &str,
    payload: Bytes,
    timeout: Duration,
) -> Result<Option<Bytes>, NatsError> {
    use async_nats::RequestErrorKind;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let ask = async_nats::Request::new().payload(payload.clone()).timeout(Some(left));
        match nats.client.send_request(subject.to_string(), ask).await {
            Ok(answer) => return Ok(Some(answer.payload)),
            Err(error) if error.kind() == RequestErrorKind::TimedOut => return Ok(None),
            Err(error) if error.kind() == RequestErrorKind::NoResponders => {
                tokio::time::sleep(NO_RESPONDERS_RETRY.min(left)).await;
            }
            Err(error) => return Err(NatsError::Other(format!("request on {subject}: {error}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_do_not_overlap() {
        let configs = stream_configs(1);
        let mut subjects: Vec<&String> = configs.iter().flat_map(|c| &c.subjects).collect();
        let count = subjects.len();
        subjects.sort();
        subjects.dedup();
        assert_eq!(subjects.len(), count);
        assert_eq!(configs.len(), 8);
    }
}
