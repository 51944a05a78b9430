//! Durable intake from JetStream: takes records from a stream in batches (one durable consumer
//! per intake, shared by every replica), hands each batch to a [`BatchWriter`], then acks it. A
//! crash before the ack means redelivery, so writers must make a second write of a record
//! harmless (log-ingest keys points and lines, item-batch applies each outcome once). A consumer
//! that fails (its leader died in a cluster, the connection dropped) is made again after a
//! pause, whatever the error: the intake ends only at shutdown.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::streams::{Nats, NatsError};

/// Which stream an intake consumes, under which durable consumer and filter.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    pub stream: &'static str,
    pub consumer: &'static str,
    pub filter: &'static str,
}

/// A message taken from the stream: its stream sequence (the same on every redelivery) and
/// payload.
#[derive(Debug, Clone)]
pub struct Received {
    pub stream_seq: u64,
    pub payload: Bytes,
}

/// Error of a writer; the batch is not acked and comes again.
pub type WriteError = Box<dyn std::error::Error + Send + Sync>;

/// Writes one batch of messages.
#[async_trait::async_trait]
pub trait BatchWriter: Send + Sync + 'static {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError>;
}

fn nats_error(error: impl std::fmt::Display) -> WriteError {
    Box::new(NatsError::Other(error.to_string()))
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
) -> Result<(), WriteError> {
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
        // A batch cut short (the consumer's leader died, the client is reconnecting): what came
        // is written and acked first, so it is not delivered again after the ack wait.
        let mut cut_short = None;
        while let Some(message) = batch.next().await {
            match message {
                Ok(message) => messages.push(message),
                Err(error) => {
                    cut_short = Some(nats_error(error));
                    break;
                }
            }
        }
        if messages.is_empty() {
            match cut_short {
                Some(error) => return Err(error),
                None => continue,
            }
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
            .collect::<Result<Vec<_>, WriteError>>()?;
        writer.write(&received).await?;
        for message in &messages {
            message.ack().await.map_err(nats_error)?;
        }
        if let Some(error) = cut_short {
            return Err(error);
        }
    }
    Ok(())
}
