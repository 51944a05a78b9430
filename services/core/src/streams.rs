//! Connecting to NATS, creating the streams and buckets idempotently, and publishing with a
//! message id so JetStream drops duplicates.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;

use crate::config::NatsConfig;
use crate::error::ErrorKind;
use crate::subjects::*;

/// NatsError is a failure talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[error("cannot create stream or bucket {name}: {message}")]
    Setup { name: String, message: String },
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    #[error("NATS request failed: {0}")]
    Other(String),
}

impl NatsError {
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Unavailable
    }
}

/// Nats holds a client and its JetStream context.
#[derive(Clone, Debug)]
pub struct Nats {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
}

/// Connects to NATS, failing fast when it is not reachable, and makes sure every stream and
/// bucket exists.
pub async fn connect(config: &NatsConfig) -> Result<Nats, NatsError> {
    let client = async_nats::ConnectOptions::new()
        .name("kiln")
        .connection_timeout(Duration::from_secs(5))
        .connect(config.url.as_str())
        .await
        .map_err(|source| NatsError::Connect {
            url: config.url.clone(),
            source,
        })?;
    let jetstream = jetstream::new(client.clone());
    let nats = Nats { client, jetstream };
    ensure_streams(&nats.jetstream, config.replicas).await?;
    Ok(nats)
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
        spec(STREAM_LAUNCH, &[LAUNCH_ALL], WorkQueue, Duration::ZERO),
        spec(STREAM_CONTROL, &[CONTROL_ALL], Interest, day),
        spec(STREAM_METRICS, &[METRICS_ALL], Limits, day),
        spec(STREAM_LOGS, &[LOGS_ALL], Limits, day),
        spec(STREAM_ITEMS, &[ITEMS_ALL], WorkQueue, Duration::ZERO),
        spec(STREAM_ITEM_RESULTS, &[ITEM_RESULTS_ALL], Limits, 7 * day),
    ]
}

/// Creates every stream and KV bucket that does not exist yet; existing ones are kept as they
/// are, so every service can call this at start.
pub async fn ensure_streams(js: &jetstream::Context, replicas: usize) -> Result<(), NatsError> {
    for config in stream_configs(replicas) {
        let name = config.name.clone();
        js.get_or_create_stream(config).await.map_err(|e| NatsError::Setup {
            name,
            message: e.to_string(),
        })?;
    }
    for (bucket, ttl) in [
        (BUCKET_LEASES, Duration::from_secs(30)),
        (BUCKET_CAPACITY, Duration::from_secs(60)),
        // An expired runner lease stays readable for an hour, so a scheduler that takes over
        // still knows what to do with the jobs of a runner that died while none led.
        (BUCKET_RUNNERS, Duration::from_secs(3600)),
        // Kept until overwritten (a max age of zero is none).
        (BUCKET_SCHEDULER, Duration::ZERO),
    ] {
        if js.get_key_value(bucket).await.is_ok() {
            continue;
        }
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
            return Err(NatsError::Setup {
                name: bucket.to_string(),
                message: error.to_string(),
            });
        }
    }
    Ok(())
}

/// The longest log line on `KILN_LOGS`, in bytes: runners cut longer output into pieces of this
/// size, and WriteLogs refuses longer lines.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// Publishes a message with a JetStream message id and waits until the stream has stored it.
/// Publishing the same id again within the duplicate window stores nothing new.
pub async fn publish(js: &jetstream::Context, subject: String, msg_id: &str, payload: Bytes) -> Result<(), NatsError> {
    let publish = jetstream::message::PublishMessage::build()
        .payload(payload)
        .message_id(msg_id);
    let ack = js
        .send_publish(subject.clone(), publish)
        .await
        .map_err(|e| NatsError::Publish {
            subject: subject.clone(),
            message: e.to_string(),
        })?;
    ack.await.map_err(|e| NatsError::Publish {
        subject,
        message: e.to_string(),
    })?;
    Ok(())
}

/// Publishes messages (message id, payload) to one subject with up to `IN_FLIGHT` awaiting their
/// acks, and returns once JetStream has acknowledged every one.
pub async fn publish_all(
    js: &jetstream::Context,
    subject: &str,
    messages: Vec<(String, Bytes)>,
) -> Result<(), NatsError> {
    const IN_FLIGHT: usize = 1024;
    let failed = |e: &dyn std::fmt::Display| NatsError::Publish {
        subject: subject.to_string(),
        message: e.to_string(),
    };
    let mut acks = std::collections::VecDeque::with_capacity(IN_FLIGHT);
    for (msg_id, payload) in messages {
        let publish = jetstream::message::PublishMessage::build()
            .payload(payload)
            .message_id(msg_id);
        acks.push_back(
            js.send_publish(subject.to_string(), publish)
                .await
                .map_err(|e| failed(&e))?,
        );
        if acks.len() >= IN_FLIGHT
            && let Some(oldest) = acks.pop_front()
        {
            oldest.await.map_err(|e| failed(&e))?;
        }
    }
    for ack in acks {
        ack.await.map_err(|e| failed(&e))?;
    }
    Ok(())
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
        assert_eq!(configs.len(), 7);
    }
}
