//! The writers of log-ingest's two intakes (see `kiln_core::intake`): a crash before the ack
//! means redelivery, and the stores' keys make that harmless: a point is keyed by (job, key,
//! step), a line by (job, attempt, stream sequence).
//!
//! [`LogWriter`] takes `KILN_LOGS` into the log store and wakes the followers of the jobs it
//! wrote; [`MetricWriter`] takes `KILN_METRICS` into the metric store.

use std::sync::Arc;

use kiln_core::intake::{BatchWriter, Intake, Received, WriteError};
use kiln_core::subjects;
use kiln_proto::v1::{LogRecord, MetricBatch};
use prost::Message;
use tokio::sync::broadcast;

use crate::points::MetricStore;
use crate::service_metrics::StoreCounters;
use crate::store::{LogStore, StoredLine};

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

/// Log records into the log store.
pub struct LogWriter {
    pub store: Arc<dyn LogStore>,
    pub written: broadcast::Sender<String>,
    pub counters: StoreCounters,
}

#[async_trait::async_trait]
impl BatchWriter for LogWriter {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
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
        self.counters.received.inc_by(lines.len() as u64);
        let started = std::time::Instant::now();
        let appended = self.store.append(&lines).await;
        self.counters.wrote(lines.len(), started.elapsed(), appended.is_ok());
        appended?;
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
    pub counters: StoreCounters,
}

#[async_trait::async_trait]
impl BatchWriter for MetricWriter {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
        let mut points = Vec::new();
        for message in messages {
            match MetricBatch::decode(message.payload.as_ref()) {
                Ok(batch) => points.extend(crate::points::points_of(batch)),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed metric batch"),
            }
        }
        let count = points.len();
        self.counters.received.inc_by(count as u64);
        let started = std::time::Instant::now();
        let appended = self.store.append(points).await;
        self.counters.wrote(count, started.elapsed(), appended.is_ok());
        Ok(appended?)
    }
}
