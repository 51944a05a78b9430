//! How a session settles an item: the agent's outcome judged (a success, or a failure the
//! retry rules and the counted failures decide on), recorded durably on `KILN_ITEM_RESULTS` with
//! the other outcomes of the session settled meanwhile ([`Recorder`]: one message per group, not
//! one per attempt), then the item's message acked, or naked with a backoff when another attempt
//! follows.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use kiln_core::streams::publish;
use kiln_core::{item_results, subjects};
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::{Notify, mpsc};

use super::{Held, Session};
use crate::Shared;
use crate::error::Result;
use crate::retry;

/// Outcomes in one message at most, and their encoded bytes at most (well under NATS's 1 MiB
/// default payload limit; an outcome carries up to `item-lines-kept` lines).
const GROUP_OUTCOMES: usize = 500;
const GROUP_BYTES: usize = 256 * 1024;

/// An outcome judged, waiting to be recorded with the others of its session.
pub(super) struct Settled {
    result: pb::ItemResult,
    /// The item's message, settled with `ack` once the result is stored; None when the session
    /// does not hold it (an outcome sent again after the agent reconnected).
    held: Option<Held>,
    ack: AckKind,
}

/// Records a session's settled outcomes: what was settled while the previous group was being
/// stored goes out as the next group, so a busy session sends one message per round trip to the
/// stream rather than one per item, and a quiet one sends each outcome at once. It ends when the
/// session and every outcome it settled are gone.
pub(super) struct Recorder {
    pub(super) shared: Arc<Shared>,
    pub(super) batch_id: String,
    /// The session's own id, in its groups' message ids.
    pub(super) session: String,
    pub(super) freed: Arc<Notify>,
}

impl Recorder {
    pub(super) async fn run(self, mut settled: mpsc::UnboundedReceiver<Settled>) {
        let mut group = 0;
        let mut carried = None;
        loop {
            let first = match carried.take() {
                Some(first) => first,
                None => match settled.recv().await {
                    Some(first) => first,
                    None => return,
                },
            };
            let mut bytes = first.result.encoded_len();
            let mut members = vec![first];
            while members.len() < GROUP_OUTCOMES {
                let Ok(next) = settled.try_recv() else { break };
                let len = next.result.encoded_len();
                if bytes + len > GROUP_BYTES {
                    carried = Some(next);
                    break;
                }
                bytes += len;
                members.push(next);
            }
            group += 1;
            self.record(group, members).await;
            self.freed.notify_one();
        }
    }

    async fn record(&self, group: u64, members: Vec<Settled>) {
        let mut results = Vec::with_capacity(members.len());
        let mut acks = Vec::with_capacity(members.len());
        for Settled { result, held, ack } in members {
            results.push(result);
            acks.extend(held.map(|held| (held, ack)));
        }
        let count = results.len();
        let msg_id = subjects::item_results_msg_id(&self.batch_id, &self.session, group);
        if let Err(error) = publish(
            &self.shared.nats.jetstream,
            subjects::item_results(&self.batch_id),
            &msg_id,
            item_results::encode(results),
        )
        .await
        {
            // Not acked: the items come again after the ack wait.
            tracing::warn!(batch_id = %self.batch_id, count, error = %error, "cannot record outcomes");
            return;
        }
        for (held, ack) in acks {
            if let Err(error) = held.message.ack_with(ack).await {
                tracing::debug!(batch_id = %self.batch_id, error = %error, "ack failed");
            }
        }
    }
}

impl Session {
    /// Deliveries of an item before this one that ended without an outcome (its worker was
    /// lost): those that were not counted failures.
    pub(super) async fn lost_deliveries(&self, item: &pb::QueuedItem, delivery: u32) -> u32 {
        if delivery <= 1 {
            return 0;
        }
        let failures = match self
            .shared
            .batches
            .failures(&self.batch_id, &item.key, item.round)
            .await
        {
            Ok(failures) => failures.unwrap_or(0),
            Err(error) => {
                tracing::warn!(batch_id = %self.batch_id, key = %item.key, error = %error, "cannot read an item's failures");
                0
            }
        };
        (delivery - 1).saturating_sub(failures)
    }

    /// What a failed outcome leads to: a rule's word, else another attempt while its counted
    /// failures are under `max_attempts`. Err when the failure cannot be counted.
    async fn after_failure(&self, outcome: &pb::ItemOutcome) -> Result<(pb::ItemState, String)> {
        let decision = retry::decide(&self.spec.retry_rules, retry::failure_of(outcome), outcome.exit_code);
        let reason = if outcome.reason.is_empty() {
            "failed".to_string()
        } else {
            outcome.reason.clone()
        };
        let by_rule = |verb: &str| match &decision.rule {
            Some((number, rule)) => format!("{reason}; {verb} by retry rule {number} ({rule})"),
            None => reason.clone(),
        };
        if !decision.retry {
            return Ok((pb::ItemState::Dead, by_rule("not retried")));
        }
        let failures = self
            .shared
            .batches
            .count_failure(&self.batch_id, &outcome.key, outcome.round, outcome.attempt)
            .await?
            // Not in that round any more (RetryFailed began another): judged by its deliveries.
            .unwrap_or(outcome.attempt);
        Ok(if failures >= self.spec.max_attempts {
            (pb::ItemState::Dead, by_rule("retried"))
        } else {
            (pb::ItemState::Failed, by_rule("retried"))
        })
    }

    /// Publishes one outcome durably on its own (de-duplicated by its message id).
    pub(super) async fn record(&self, result: &pb::ItemResult) -> Result<()> {
        let msg_id = subjects::item_result_msg_id(&result.batch_id, &result.key, result.round, result.attempt);
        publish(
            &self.shared.nats.jetstream,
            subjects::item_results(&result.batch_id),
            &msg_id,
            item_results::encode(vec![result.clone()]),
        )
        .await?;
        Ok(())
    }

    /// Judges an outcome and hands it to the session's [`Recorder`], which records it and then
    /// acks its message (or naks it with a backoff when another attempt follows).
    pub(super) async fn settle(&self, outcome: pb::ItemOutcome) {
        let mean = self.mean_item_ms.load(Ordering::Relaxed);
        self.mean_item_ms
            .store((mean * 7 + outcome.duration_ms) / 8, Ordering::Relaxed);
        let held = {
            let mut held = self.held.lock().expect("held lock");
            match held.get(&outcome.key) {
                Some(h) if h.attempt == outcome.attempt && h.round == outcome.round => held.remove(&outcome.key),
                _ => None,
            }
        };
        let (state, reason) = if outcome.exit_code == Some(0) {
            (pb::ItemState::Succeeded, outcome.reason.clone())
        } else {
            match self.after_failure(&outcome).await {
                Ok(decided) => decided,
                Err(error) => {
                    // Not acked: the item comes again after the ack wait.
                    tracing::warn!(batch_id = %self.batch_id, key = %outcome.key, error = %error, "cannot count a failure");
                    return;
                }
            }
        };
        let result = pb::ItemResult {
            batch_id: self.batch_id.clone(),
            key: outcome.key,
            round: outcome.round,
            attempt: outcome.attempt,
            state: state as i32,
            exit_code: outcome.exit_code,
            reason,
            lines: outcome.lines,
            cpu_seconds: outcome.cpu_seconds,
            peak_memory_bytes: outcome.peak_memory_bytes,
            duration_ms: outcome.duration_ms,
            lines_dropped: outcome.lines_dropped,
        };
        let ack = match state {
            pb::ItemState::Failed => AckKind::Nak(Some(self.backoff(outcome.attempt))),
            _ => AckKind::Ack,
        };
        // The recorder outlives every settling outcome (it ends when they are all sent).
        let _ = self.settled.send(Settled { result, held, ack });
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let base = self.shared.config.retry_backoff_ms;
        let factor = 1u64 << attempt.saturating_sub(1).min(16);
        Duration::from_millis(base.saturating_mul(factor).min(60_000))
    }
}
