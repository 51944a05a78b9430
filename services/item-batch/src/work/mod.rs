//! `ItemWorkService`: one session per kiln-agent. The session pulls the batch's items from its
//! durable consumer (as many as the agent has slots, and as many again queued), sends them, and
//! holds each JetStream message until the agent's outcome for it is durable on
//! `KILN_ITEM_RESULTS` (recorded with the session's other outcomes of the moment, in one
//! message); then it acks the message, or naks it with a backoff when another attempt
//! follows. Heartbeats keep a slow item from being redelivered; a session that ends (the worker
//! was stopped, preempted or lost) naks what it held, so those items go to other workers at once.
//!
//! Attempts are JetStream deliveries, but only failed ones are charged: an item's failures are
//! counted in its row (once per delivery), and it is a dead letter when a retry rule says so or
//! its failures reach `max_attempts`. A delivery lost with its worker (a spot reclaim, a runner's
//! death) is no failure; an item lost more than `max_attempts` + [`LOST_ALLOWANCE`] times (one
//! that takes its workers down with it) is a dead letter, so it cannot go round forever.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use futures::{Stream, StreamExt};
use kiln_proto::v1 as pb;
use kiln_proto::v1::agent_message::Body;
use kiln_proto::v1::item_work_service_server::ItemWorkService;
use prost::Message;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::Shared;
use crate::error::{Error, Result};
use crate::spec::{LARGEST_SLOTS, Spec};
use crate::store;
use crate::template::{self, Values};

mod settle;

use settle::{Recorder, Settled};

/// Lost deliveries an item may have beyond `max_attempts` before it is a dead letter.
pub const LOST_ALLOWANCE: u32 = 3;
/// Items held for an agent beyond twice its slots when its items are quick (a mean under
/// [`QUICK_ITEM_MS`]), so it never waits for a round trip: as many as make [`HOARD_MS`] of its
/// work, at most [`MAX_PREFETCH`]. Slow items are not hoarded by one worker while others idle,
/// and quick ones at most for a couple of seconds. Heartbeats cover queued items too.
const QUICK_ITEM_MS: u64 = 100;
const HOARD_MS: u64 = 2_000;
const MAX_PREFETCH: usize = 510;
/// How long one fetch waits for items.
const FETCH_WAIT: Duration = Duration::from_millis(500);

type TaskStream = Pin<Box<dyn Stream<Item = Result<pb::AgentTask, Status>> + Send>>;

/// WorkApi serves `ItemWorkService`.
#[derive(Clone)]
pub struct WorkApi {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl ItemWorkService for WorkApi {
    type WorkStream = TaskStream;

    async fn work(&self, request: Request<Streaming<pb::AgentMessage>>) -> Result<Response<TaskStream>, Status> {
        let caller = crate::grpc::caller(&request)?;
        let mut incoming = request.into_inner();
        let hello = match incoming.next().await {
            Some(Ok(pb::AgentMessage {
                body: Some(Body::Hello(hello)),
            })) => hello,
            Some(Err(status)) => return Err(status),
            _ => return Err(Error::InvalidArgument("the first message of a session must be a hello".into()).into()),
        };
        let batch = crate::grpc::authorized_batch(&self.shared, &caller, &hello.batch_id).await?;
        let (tx, rx) = mpsc::channel(2 * LARGEST_SLOTS as usize + 16);
        if !matches!(batch.state.as_str(), store::OPEN | store::SEALED) {
            let _ = tx.send(Ok(stop(&format!("batch is {}", batch.state)))).await;
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        let spec = Spec::from_json(&batch.spec_json)?;
        let consumer = self.shared.ensure_consumer(&batch.id).await?;
        let slots = hello.slots.clamp(1, LARGEST_SLOTS) as usize;
        let (settled, to_record) = mpsc::unbounded_channel();
        let freed = Arc::new(Notify::new());
        let recorder = Recorder {
            shared: self.shared.clone(),
            batch_id: batch.id.clone(),
            session: kiln_core::ids::new_id(),
            freed: freed.clone(),
        };
        tokio::spawn(recorder.run(to_record));
        let session = Arc::new(Session {
            shared: self.shared.clone(),
            batch_id: batch.id.clone(),
            spec,
            limit: 2 * slots,
            mean_item_ms: AtomicU64::new(1000),
            held: Mutex::new(HashMap::new()),
            settled,
            freed,
            closed: CancellationToken::new(),
        });
        tokio::spawn(session.clone().dispatch(consumer, tx));
        tokio::spawn(session.read(incoming));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Items queued for an agent of `slots` slots beyond twice its slots, by its items' mean time.
fn prefetch(mean_item_ms: u64, slots: usize) -> usize {
    if mean_item_ms >= QUICK_ITEM_MS {
        return 0;
    }
    let hoard = HOARD_MS / mean_item_ms.max(1) * slots as u64;
    usize::try_from(hoard).unwrap_or(MAX_PREFETCH).min(MAX_PREFETCH)
}

fn stop(reason: &str) -> pb::AgentTask {
    pb::AgentTask {
        body: Some(pb::agent_task::Body::Stop(pb::StopAgent { reason: reason.into() })),
    }
}

/// A message held for the agent until its outcome is durable.
struct Held {
    message: jetstream::Message,
    attempt: u32,
    round: u32,
}

struct Session {
    shared: Arc<Shared>,
    batch_id: String,
    spec: Spec,
    limit: usize,
    /// Moving mean of the agent's item durations.
    mean_item_ms: AtomicU64,
    held: Mutex<HashMap<String, Held>>,
    /// Judged outcomes, to the session's recorder.
    settled: mpsc::UnboundedSender<Settled>,
    /// Told when items are settled, so dispatch sends more.
    freed: Arc<Notify>,
    closed: CancellationToken,
}

impl Session {
    fn held_count(&self) -> usize {
        self.held.lock().expect("held lock").len()
    }

    /// Sends items while the agent has room, until the batch ends, the worker idles out (no item
    /// for `idle_stop_ms` and none waiting), or the agent goes.
    async fn dispatch(self: Arc<Self>, mut consumer: PullConsumer, tx: mpsc::Sender<Result<pb::AgentTask, Status>>) {
        let idle_stop = Duration::from_millis(self.shared.config.idle_stop_ms);
        let mut last_work = Instant::now();
        while !self.closed.is_cancelled() {
            match self.shared.batch_state(&self.batch_id).await.as_deref() {
                Ok(store::CANCELLED) => {
                    let _ = tx.send(Ok(stop("batch cancelled"))).await;
                    return;
                }
                Ok(store::DONE) => {
                    let _ = tx.send(Ok(stop("batch done"))).await;
                    return;
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(batch_id = %self.batch_id, error = %error, "cannot read the batch"),
            }
            let limit = self.limit + prefetch(self.mean_item_ms.load(Ordering::Relaxed), self.limit / 2);
            let free = limit.saturating_sub(self.held_count());
            if free == 0 {
                tokio::select! {
                    _ = self.freed.notified() => {}
                    _ = self.closed.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let fetched = match consumer.fetch().max_messages(free).expires(FETCH_WAIT).messages().await {
                Ok(messages) => messages,
                Err(error) => {
                    tracing::debug!(batch_id = %self.batch_id, error = %error, "fetch failed");
                    tokio::time::sleep(FETCH_WAIT).await;
                    continue;
                }
            };
            let mut fetched = std::pin::pin!(fetched);
            let mut got = 0;
            while let Some(message) = fetched.next().await {
                let Ok(message) = message else { break };
                got += 1;
                if self.closed.is_cancelled() {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                    continue;
                }
                if let Some(task) = self.take(message).await
                    && tx.send(Ok(task)).await.is_err()
                {
                    self.closed.cancel();
                }
            }
            if got > 0 || self.held_count() > 0 {
                last_work = Instant::now();
            } else if last_work.elapsed() >= idle_stop {
                // An empty fetch is not an empty batch: on a loaded server a pull can expire
                // before it is served (the million-item run saw hundreds of workers leave at once
                // while 370,000 items waited, and their instances idle out), and a paused
                // consumer serves none. The worker stays while items wait that no worker took.
                match consumer.info().await.map(|info| info.num_pending) {
                    Ok(waiting) if waiting > 0 => last_work = Instant::now(),
                    _ => {
                        let _ = tx.send(Ok(stop("no items for a while"))).await;
                        return;
                    }
                }
            }
        }
    }

    /// Turns a message into the agent's task and holds it, or settles it at once (a malformed
    /// message, an item lost too often).
    async fn take(&self, message: jetstream::Message) -> Option<pb::AgentTask> {
        let attempt = match message.info() {
            Ok(info) => u32::try_from(info.delivered).unwrap_or(u32::MAX),
            Err(_) => 1,
        };
        let item = match pb::QueuedItem::decode(message.payload.as_ref()) {
            Ok(item) => item,
            Err(error) => {
                tracing::warn!(batch_id = %self.batch_id, error = %error, "dropping a malformed item");
                let _ = message.ack_with(AckKind::Term).await;
                return None;
            }
        };
        let lost = self.lost_deliveries(&item, attempt).await;
        if lost > self.spec.max_attempts + LOST_ALLOWANCE {
            let result = pb::ItemResult {
                batch_id: self.batch_id.clone(),
                key: item.key.clone(),
                round: item.round,
                attempt,
                state: pb::ItemState::Dead as i32,
                reason: format!("lost with its worker {lost} times (a worker was stopped or died while running it)"),
                ..Default::default()
            };
            if self.record(&result).await.is_ok() {
                let _ = message.ack_with(AckKind::Term).await;
            }
            return None;
        }
        self.shared.metrics.items_dispatched.inc();
        let output = self.spec.output_of(&item.key);
        let command = template::render(
            &self.spec.command,
            Values {
                uri: &item.uri,
                output: &output,
                item: &item.key,
                attempt,
            },
        );
        let mut env: HashMap<String, String> = item
            .params
            .iter()
            .map(|(name, value)| (format!("KILN_PARAM_{name}"), value.clone()))
            .collect();
        env.insert("KILN_ITEM".into(), item.key.clone());
        env.insert("KILN_ITEM_URI".into(), item.uri.clone());
        env.insert("KILN_ITEM_OUTPUT".into(), output);
        env.insert("KILN_ITEM_ATTEMPT".into(), attempt.to_string());
        let task = pb::ItemToRun {
            key: item.key.clone(),
            attempt,
            command,
            env,
            timeout_secs: self.spec.item_timeout_secs,
            round: item.round,
            keep_lines: self.shared.config.item_lines_kept,
        };
        self.held.lock().expect("held lock").insert(
            item.key,
            Held {
                message,
                attempt,
                round: item.round,
            },
        );
        Some(pb::AgentTask {
            body: Some(pb::agent_task::Body::Item(task)),
        })
    }

    /// Reads the agent's messages until it goes, then gives back what it held.
    async fn read(self: Arc<Self>, mut incoming: Streaming<pb::AgentMessage>) {
        while let Some(message) = incoming.next().await {
            match message.map(|m| m.body) {
                Ok(Some(Body::Outcome(outcome))) => {
                    let session = self.clone();
                    tokio::spawn(async move { session.settle(outcome).await });
                }
                Ok(Some(Body::Heartbeat(beat))) => {
                    let held = self.held.lock().expect("held lock");
                    for key in &beat.keys {
                        if let Some(held) = held.get(key) {
                            let message = held.message.clone();
                            tokio::spawn(async move { message.ack_with(AckKind::Progress).await });
                        }
                    }
                }
                Ok(_) => {}
                Err(status) => {
                    tracing::debug!(batch_id = %self.batch_id, %status, "agent stream failed");
                    break;
                }
            }
        }
        self.closed.cancel();
        let held: Vec<Held> = self.held.lock().expect("held lock").drain().map(|(_, h)| h).collect();
        for held in held {
            let _ = held.message.ack_with(AckKind::Nak(None)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_items_are_queued_for_a_couple_of_seconds_of_work_and_slow_ones_not_at_all() {
        assert_eq!(prefetch(0, 1), MAX_PREFETCH);
        assert_eq!(prefetch(10, 1), 200);
        assert_eq!(prefetch(10, 2), 400);
        assert_eq!(prefetch(99, 1), 20);
        assert_eq!(prefetch(100, 1), 0);
        assert_eq!(prefetch(5_000, 8), 0);
    }
}
