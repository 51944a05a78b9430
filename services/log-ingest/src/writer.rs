//! The durable intake: takes records from a JetStream stream in batches (one durable consumer
//! per stream, shared by every replica), writes each batch in one store write, then acks it. A
//! crash before the ack means redelivery, and the stores' keys make that harmless: a point is
//! keyed by (job, key, step), a line by (job, attempt, stream sequence).
//!
//! [`LogWriter`] takes `KILN_LOGS` into the log store and wakes the followers of the jobs it
//! wrote; [`MetricWriter`] takes `KILN_METRICS` into the metric store.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use bytes::Bytes;
use futures::StreamExt;
use kiln_core::streams::{Nats, NatsError};
use kiln_core::subjects;
use kiln_proto::v1::{LogRecord, MetricBatch};
use prost::Message;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::points::MetricStore;
use crate::store::{LogStore, StoredLine};

fn nats_error(error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(error.to_string()))
}

/// Which stream a writer consumes, under which durable consumer.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    pub stream: &'static str,
    pub consumer: &'static str,
    pub filter: &'static str,
}

pub const LOGS: Intake = Intake {
    stream: subjects::STREAM_LOGS,
    consumer: subjects::CONSUMER_LOG_INGEST,
    filter: subjects::LOGS_ALL,
};
pub const METRICS: Intake = Intake {
    stream: subjects::STREAM_METRICS,
    consumer: subjects::CONSUMER_METRICS,
    filter: subjects::METRICS_ALL,
};

/// A message taken from the stream: its stream sequence (the same on every redelivery) and
/// payload.
#[derive(Debug, Clone)]
pub struct Received {
    pub stream_seq: u64,
    pub payload: Bytes,
}

/// Writes one batch of messages to a store.
#[async_trait::async_trait]
pub trait BatchWriter: Send + Sync + 'static {
    async fn write(&self, messages: &[Received]) -> Result<()>;
}

/// Consumes `intake` until shutdown, restarting the consumer after failures.
pub async fn run(
    nats: Nats,
    intake: Intake,
    batch_size: usize,
    writer: Arc<dyn BatchWriter>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        if let Err(error) = consume(&nats, intake, batch_size, writer.as_ref(), &shutdown).await {
            tracing::warn!(stream = intake.stream, error = %error, "consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume(
    nats: &Nats,
    intake: Intake,
    batch_size: usize,
    writer: &dyn BatchWriter,
    shutdown: &CancellationToken,
) -> Result<()> {
    let stream = nats.jetstream.get_stream(intake.stream).await.map_err(nats_error)?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            intake.consumer,
            pull::Config {
                durable_name: Some(intake.consumer.to_string()),
                filter_subject: intake.filter.to_string(),
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
        let received = messages
            .iter()
            .map(|m| {
                let info = m.info().map_err(nats_error)?;
                Ok(Received {
                    stream_seq: info.stream_sequence,
                    payload: m.payload.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        writer.write(&received).await?;
        for message in &messages {
            message.ack().await.map_err(nats_error)?;
        }
    }
    Ok(())
}

/// Log records into the log store.
pub struct LogWriter {
    pub store: Arc<dyn LogStore>,
    pub written: broadcast::Sender<String>,
}

#[async_trait::async_trait]
impl BatchWriter for LogWriter {
    async fn write(&self, messages: &[Received]) -> Result<()> {
        let mut lines = Vec::with_capacity(messages.len());
        for message in messages {
            match LogRecord::decode(message.payload.as_ref()) {
                Ok(record) => lines.push(StoredLine {
                    job_id: record.job_id,
                    attempt: record.attempt,
                    seq: i64::try_from(message.stream_seq).unwrap_or(i64::MAX),
                    stream: record.stream,
                    timestamp_ms: record.timestamp_ms,
                    text: record.text,
                    end: record.end,
                }),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed log record"),
            }
        }
        self.store.append(&lines).await?;
        let mut jobs: Vec<&str> = lines.iter().map(|line| line.job_id.as_str()).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for job_id in jobs {
            // No receiver is fine: nobody follows this job.
            let _ = self.written.send(job_id.to_string());
        }
        Ok(())
    }
}

/// Metric batches into the metric store.
pub struct MetricWriter {
    pub store: Arc<dyn MetricStore>,
}

#[async_trait::async_trait]
impl BatchWriter for MetricWriter {
    async fn write(&self, messages: &[Received]) -> Result<()> {
        let mut points = Vec::new();
        for message in messages {
            match MetricBatch::decode(message.payload.as_ref()) {
                Ok(batch) => points.extend(crate::points::points_of(batch)),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed metric batch"),
            }
        }
        self.store.append(&points).await
    }
}
