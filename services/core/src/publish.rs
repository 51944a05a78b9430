//! Publishing to JetStream so that no message is lost while a cluster elects a stream leader.
//!
//! Every message carries a message id. A publish that fails or whose ack does not come in time
//! (the stream's leader died, the client is reconnecting) is sent again with the same id, with
//! backoff, for up to [`PUBLISH_WINDOW`]: that is well inside the streams' duplicate window (two
//! minutes), so a message that was stored but whose ack was lost is stored once.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::streams::NatsError;

/// How long a message is sent again before its publish fails.
pub const PUBLISH_WINDOW: Duration = Duration::from_secs(60);

/// The wait before retry `attempt` (0, 1, …): 100 ms doubling up to 2 s, plus up to a quarter
/// more at random so that clients that lost the same server do not come back in step.
pub fn backoff(attempt: u32) -> Duration {
    let base = 100u64.saturating_mul(1u64 << attempt.min(5)).min(2_000);
    Duration::from_millis(base + rand::random_range(0..=base / 4))
}

/// Whether sending the same message again may succeed.
fn transient(error: &PublishError) -> bool {
    !matches!(
        error.kind(),
        PublishErrorKind::MaxPayloadExceeded
            | PublishErrorKind::WrongLastMessageId
            | PublishErrorKind::WrongLastSequence
    )
}

fn message(msg_id: &str, payload: Bytes) -> PublishMessage {
    PublishMessage::build().payload(payload).message_id(msg_id)
}

async fn publish_once(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
) -> Result<(), PublishError> {
    js.send_publish(subject.to_string(), message(msg_id, payload))
        .await?
        .await?;
    Ok(())
}

/// Publishes a message with a JetStream message id once and waits until the stream has stored
/// it, for callers whose outbox sends it again after a failure (job changes): they are not held
/// up while a stream elects its leader.
pub async fn try_publish(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: Bytes,
) -> Result<(), NatsError> {
    publish_once(js, &subject, msg_id, payload)
        .await
        .map_err(|error| NatsError::Publish {
            subject,
            message: error.to_string(),
        })
}

/// Publishes a message with a JetStream message id and waits until the stream has stored it,
/// sending it again after failures for up to [`PUBLISH_WINDOW`]. Publishing the same id again
/// within the duplicate window stores nothing new.
pub async fn publish(js: &jetstream::Context, subject: String, msg_id: &str, payload: Bytes) -> Result<(), NatsError> {
    let deadline = Instant::now() + PUBLISH_WINDOW;
    let mut attempt = 0;
    loop {
        let error = match publish_once(js, &subject, msg_id, payload.clone()).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        let wait = backoff(attempt);
        if !transient(&error) || Instant::now() + wait >= deadline {
            return Err(NatsError::Publish {
                subject,
                message: error.to_string(),
            });
        }
        if attempt == 0 {
            tracing::warn!(subject, msg_id, error = %error, "publish failed; sending it again");
        }
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// How long the oldest ack of a [`Pipeline`] may be awaited before nothing more is sent until
/// it comes. A stored message is acked in about a millisecond here; one unanswered this long
/// was most likely sent to a leader that died, and a message sent after it could be stored by
/// the next leader before it is sent again, out of order.
pub const ACK_OVERDUE: Duration = Duration::from_millis(300);

/// How many messages every [`Pipeline`] of the process together may have awaiting their acks.
/// async-nats lets a connection await 5,000 and makes a publish wait for one of those to be
/// freed; two pipelines holding 2,500 apiece once each waited for the other, and every other
/// publisher on the connection (a lease's renewal) waited behind them. Pipelines take from this
/// smaller budget instead, and one that finds it empty first settles its own oldest message:
/// a pipeline waits for the budget only while it holds none of it, and the connection always
/// has acks to spare for publishers that await theirs at once.
pub const PIPELINE_BUDGET: usize = 4096;

static BUDGET: Semaphore = Semaphore::const_new(PIPELINE_BUDGET);

/// Publishes to one subject with up to `in_flight` messages awaiting their acks. When an ack
/// fails, that message and every one sent after it are sent again in order, one at a time, by
/// [`publish`] (those already stored are dropped as duplicates), and pipelining goes on. While
/// the oldest ack is overdue ([`ACK_OVERDUE`]) nothing new is sent, so that a stream leader's
/// election in a quiet stream (a job's log lines) does not store later messages before earlier
/// ones; a message sent in the moment before the earlier one is known lost can still be.
///
/// Messages awaiting acks hold a share of [`PIPELINE_BUDGET`], so a caller that waits for its
/// next message should [`Pipeline::settle`] first rather than hold that share while idle.
pub struct Pipeline {
    js: jetstream::Context,
    subject: String,
    limit: usize,
    in_flight: VecDeque<Pending>,
    stored: u64,
}

struct Pending {
    msg_id: String,
    payload: Bytes,
    ack: Option<PublishAckFuture>,
    sent_at: Instant,
    /// This message's share of [`PIPELINE_BUDGET`], given back when it leaves the pipeline.
    _budget: SemaphorePermit<'static>,
}

impl Pipeline {
    pub fn new(js: jetstream::Context, subject: impl Into<String>, in_flight: usize) -> Pipeline {
        Pipeline {
            js,
            subject: subject.into(),
            limit: in_flight.max(1),
            in_flight: VecDeque::with_capacity(in_flight),
            stored: 0,
        }
    }

    /// How many of the messages sent so far are stored: always the first ones sent, as acks
    /// are taken in order and a failure sends the rest again in order.
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// Sends a message, first waiting for the oldest ack when `in_flight` await theirs.
    pub async fn send(&mut self, msg_id: String, payload: Bytes) -> Result<(), NatsError> {
        while self
            .in_flight
            .front()
            .is_some_and(|oldest| oldest.sent_at.elapsed() >= ACK_OVERDUE)
        {
            self.settle_oldest().await?;
        }
        let budget = loop {
            if let Ok(permit) = BUDGET.try_acquire() {
                break permit;
            }
            if self.in_flight.is_empty() {
                break BUDGET.acquire().await.expect("the budget is never closed");
            }
            self.settle_oldest().await?;
        };
        let sent = self
            .js
            .send_publish(self.subject.clone(), message(&msg_id, payload.clone()))
            .await;
        let failed = sent.as_ref().err().map(ToString::to_string);
        self.in_flight.push_back(Pending {
            msg_id,
            payload,
            ack: sent.ok(),
            sent_at: Instant::now(),
            _budget: budget,
        });
        if let Some(error) = failed {
            return self.send_again(&error).await;
        }
        if self.in_flight.len() >= self.limit {
            self.settle_oldest().await?;
        }
        Ok(())
    }

    /// Waits until every message sent is stored.
    pub async fn flush(mut self) -> Result<(), NatsError> {
        self.settle().await
    }

    /// Waits until every message sent so far is stored.
    pub async fn settle(&mut self) -> Result<(), NatsError> {
        while !self.in_flight.is_empty() {
            self.settle_oldest().await?;
        }
        Ok(())
    }

    async fn settle_oldest(&mut self) -> Result<(), NatsError> {
        let Some(ack) = self.in_flight.front_mut().and_then(|p| p.ack.take()) else {
            return self.send_again("not sent").await;
        };
        match ack.await {
            Ok(_) => {
                self.in_flight.pop_front();
                self.stored += 1;
                Ok(())
            }
            Err(error) => self.send_again(&error.to_string()).await,
        }
    }

    async fn send_again(&mut self, error: &str) -> Result<(), NatsError> {
        tracing::warn!(subject = %self.subject, error, pending = self.in_flight.len(), "publish failed; sending the pending messages again");
        while let Some(pending) = self.in_flight.pop_front() {
            publish(&self.js, self.subject.clone(), &pending.msg_id, pending.payload).await?;
            self.stored += 1;
        }
        Ok(())
    }
}

/// Publishes messages (message id, payload) to one subject through a [`Pipeline`] of 1024, and
/// returns once JetStream has stored every one.
pub async fn publish_all(
    js: &jetstream::Context,
    subject: &str,
    messages: Vec<(String, Bytes)>,
) -> Result<(), NatsError> {
    let mut pipeline = Pipeline::new(js.clone(), subject, 1024);
    for (msg_id, payload) in messages {
        pipeline.send(msg_id, payload).await?;
    }
    pipeline.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        assert!((100..=125).contains(&backoff(0).as_millis()));
        assert!((200..=250).contains(&backoff(1).as_millis()));
        assert!((2_000..=2_500).contains(&backoff(5).as_millis()));
        assert!((2_000..=2_500).contains(&backoff(u32::MAX).as_millis()));
    }
}
