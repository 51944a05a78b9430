//! Read-your-writes for metric reads: a read waits until the metric writers have stored every
//! message that `KILN_METRICS` held when the read arrived. A search of batch items' lines waits
//! the same way for the item-line writers and `KILN_ITEM_RESULTS` (an item counted done has its
//! outcome there), through a [`CaughtUp`] of its own.
//!
//! WriteMetrics answers once its points are durable in JetStream; any replica's writer may
//! store them later. So a read first learns the stream's last sequence (its *head*, from the
//! stream's leader: every publish acked before the read is at or below it), then waits until the
//! writers' durable consumer has acknowledged every message up to the head (its *stored*
//! mark: the consumer's ack floor, or what it delivered when nothing awaits an ack; a writer
//! acks only after its store has the batch). Whichever replica wrote, whichever answers, the
//! read then sees every point whose WriteMetrics had returned: after `kiln.finish()`, after
//! FinishRun, after a job's end.
//!
//! One task per replica asks NATS for both marks, in rounds, only while reads wait, so
//! concurrent reads share rounds (two JetStream API requests each) instead of making their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer;
use async_nats::jetstream::stream::Stream;
use kiln_core::streams::{Nats, NatsError};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Pause between two rounds while a read waits for the writers.
const ROUND_PAUSE: Duration = Duration::from_millis(2);
/// Pause after a round that failed (NATS away, the consumer not made yet).
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What the last round learnt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Marks {
    /// The number of the round.
    round: u64,
    /// The stream's last sequence when the round began.
    head: u64,
    /// Every message up to this sequence is stored.
    stored: u64,
}

/// The sequence through which a consumer has acknowledged every message.
pub fn stored_through(info: &consumer::Info) -> u64 {
    if info.num_ack_pending == 0 {
        info.delivered.stream_sequence.max(info.ack_floor.stream_sequence)
    } else {
        info.ack_floor.stream_sequence
    }
}

/// The marks of a stream (`KILN_METRICS`) and its writers' consumer, shared by this replica's
/// reads.
pub struct CaughtUp {
    nats: Nats,
    stream: &'static str,
    consumer: &'static str,
    marks: watch::Sender<Marks>,
    /// Rounds begun so far.
    begun: AtomicU64,
    /// Reads waiting now.
    waiting: AtomicUsize,
    demand: Notify,
}

/// Counts a waiting read while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CaughtUp {
    /// The marks of `stream` and the durable `consumer` of its writers.
    pub fn new(nats: Nats, stream: &'static str, consumer: &'static str) -> Arc<CaughtUp> {
        Arc::new(CaughtUp {
            nats,
            stream,
            consumer,
            marks: watch::Sender::new(Marks::default()),
            begun: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            demand: Notify::new(),
        })
    }

    /// Waits, for at most `wait`, until every message published before this call is
    /// stored. False when the writers are further behind than that (or NATS does not answer):
    /// the read then answers what is stored. A `wait` of zero does not wait (and is true).
    pub async fn wait(&self, wait: Duration) -> bool {
        if wait.is_zero() {
            return true;
        }
        // A round begun before now may have read the head before a publish this read must see.
        let after = self.begun.load(Ordering::SeqCst);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        self.demand.notify_one();
        let mut marks = self.marks.subscribe();
        let caught_up = async {
            let head = marks.wait_for(|m| m.round > after).await.ok()?.head;
            marks.wait_for(|m| m.stored >= head).await.ok()
        };
        matches!(tokio::time::timeout(wait, caught_up).await, Ok(Some(_)))
    }

    /// Asks NATS for the marks while reads wait, until `shutdown`.
    pub async fn run(self: Arc<CaughtUp>, shutdown: CancellationToken) {
        let mut stream = None;
        while !shutdown.is_cancelled() {
            if self.waiting.load(Ordering::SeqCst) == 0 {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.demand.notified() => {}
                }
            }
            let round = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
            let pause = match self.round(&mut stream).await {
                Ok((head, stored)) => {
                    self.marks.send_modify(|marks| {
                        *marks = Marks {
                            round,
                            head,
                            stored: stored.max(marks.stored),
                        }
                    });
                    ROUND_PAUSE
                }
                Err(error) => {
                    tracing::warn!(stream = self.stream, error = %error, "cannot read how far the writers are");
                    stream = None;
                    ERROR_PAUSE
                }
            };
            if self.waiting.load(Ordering::SeqCst) > 0 {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }

    /// One round: the stream's head, then how far the writers have stored.
    async fn round(&self, stream: &mut Option<Stream<()>>) -> Result<(u64, u64), NatsError> {
        let stream = match stream {
            Some(stream) => stream,
            None => stream.insert(
                self.nats
                    .jetstream
                    .get_stream_no_info(self.stream)
                    .await
                    .map_err(nats_error)?,
            ),
        };
        let head = stream.get_info().await.map_err(nats_error)?.state.last_sequence;
        let writers = stream.consumer_info(self.consumer).await.map_err(nats_error)?;
        Ok((head, stored_through(&writers)))
    }
}

fn nats_error(error: impl std::fmt::Display) -> NatsError {
    NatsError::Other(error.to_string())
}
