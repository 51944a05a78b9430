//! The durable intake: takes log records from `KILN_LOGS` in batches (durable consumer
//! `log-ingest`, shared by every replica), stores each batch in one write, then acks it. A crash
//! before the ack means redelivery, and the store's key makes that harmless.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::streams::{Nats, NatsError};
use kiln_core::subjects;
use kiln_proto::v1::LogRecord;
use prost::Message;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::store::{LogStore, StoredLine};

fn nats_error(error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(error.to_string()))
}

/// Consumes log records until shutdown; `written` gets the id of each job with new lines.
pub async fn run(
    nats: Nats,
    store: Arc<dyn LogStore>,
    batch_size: usize,
    written: broadcast::Sender<String>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        if let Err(error) = consume(&nats, store.as_ref(), batch_size, &written, &shutdown).await {
            tracing::warn!(error = %error, "log consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume(
    nats: &Nats,
    store: &dyn LogStore,
    batch_size: usize,
    written: &broadcast::Sender<String>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let stream = nats
        .jetstream
        .get_stream(subjects::STREAM_LOGS)
        .await
        .map_err(nats_error)?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            subjects::CONSUMER_LOG_INGEST,
            pull::Config {
                durable_name: Some(subjects::CONSUMER_LOG_INGEST.to_string()),
                filter_subject: subjects::LOGS_ALL.to_string(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 20_000,
                ..Default::default()
            },
        )
        .await
        .map_err(nats_error)?;
    while !shutdown.is_cancelled() {
        let mut batch = consumer
            .fetch()
            .max_messages(batch_size)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(nats_error)?;
        let mut messages = Vec::with_capacity(batch_size);
        while let Some(message) = batch.next().await {
            messages.push(message.map_err(nats_error)?);
        }
        if messages.is_empty() {
            continue;
        }
        let mut lines = Vec::with_capacity(messages.len());
        for message in &messages {
            match LogRecord::decode(message.payload.as_ref()) {
                Ok(record) => lines.push(StoredLine {
                    job_id: record.job_id,
                    attempt: record.attempt,
                    seq: i64::try_from(record.seq).unwrap_or(i64::MAX),
                    stream: record.stream,
                    timestamp_ms: record.timestamp_ms,
                    text: record.text,
                    end: record.end,
                }),
                Err(error) => {
                    tracing::warn!(subject = %message.subject, error = %error, "dropping a malformed log record")
                }
            }
        }
        store.append(&lines).await?;
        for message in &messages {
            message.ack().await.map_err(nats_error)?;
        }
        let mut jobs: Vec<&str> = lines.iter().map(|line| line.job_id.as_str()).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for job_id in jobs {
            // No receiver is fine: nobody follows this job.
            let _ = written.send(job_id.to_string());
        }
    }
    Ok(())
}
