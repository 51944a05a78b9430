//! How a session settles an item: the agent's outcome judged (a success, or a failure the
//! retry rules and the counted failures decide on), recorded durably on `KILN_ITEM_RESULTS`,
//! then the item's message acked, or naked with a backoff when another attempt follows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use kiln_core::streams::publish;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;

use super::Session;
use crate::error::Result;
use crate::retry;

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

    /// Publishes an outcome durably (de-duplicated by its message id).
    pub(super) async fn record(&self, result: &pb::ItemResult) -> Result<()> {
        let msg_id = subjects::item_result_msg_id(&result.batch_id, &result.key, result.round, result.attempt);
        publish(
            &self.shared.nats.jetstream,
            subjects::item_results(&result.batch_id),
            &msg_id,
            result.encode_to_vec().into(),
        )
        .await?;
        Ok(())
    }

    /// Records an outcome, then acks its message (or naks it with a backoff when another
    /// attempt follows).
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
        if let Err(error) = self.record(&result).await {
            // Not acked: the item comes again after the ack wait.
            tracing::warn!(batch_id = %self.batch_id, key = %result.key, error = %error, "cannot record an outcome");
            return;
        }
        if let Some(held) = held {
            let ack = match state {
                pb::ItemState::Failed => AckKind::Nak(Some(self.backoff(outcome.attempt))),
                _ => AckKind::Ack,
            };
            if let Err(error) = held.message.ack_with(ack).await {
                tracing::debug!(batch_id = %self.batch_id, key = %result.key, error = %error, "ack failed");
            }
        }
        self.freed.notify_one();
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let base = self.shared.config.retry_backoff_ms;
        let factor = 1u64 << attempt.saturating_sub(1).min(16);
        Duration::from_millis(base.saturating_mul(factor).min(60_000))
    }
}
