//! Outcomes from `KILN_ITEM_RESULTS` into the items' rows, a batch of messages (each a group of
//! outcomes) per transaction, acked after the commit. A redelivered outcome changes nothing (see [`crate::store`]).

use std::sync::Arc;

use kiln_core::intake::{BatchWriter, Intake, Received, WriteError};
use kiln_core::{item_results, subjects};

use crate::Shared;

pub const RESULTS: Intake = Intake {
    stream: subjects::STREAM_ITEM_RESULTS,
    consumer: subjects::CONSUMER_ITEM_RESULTS,
    filter: subjects::ITEM_RESULTS_ALL,
};

/// Messages per transaction: each holds up to 500 outcomes (a session's group).
pub const MESSAGES_PER_WRITE: usize = 100;

pub struct ResultWriter {
    pub shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl BatchWriter for ResultWriter {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            match item_results::decode(&message.payload) {
                Ok(group) => results.extend(group),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed item result"),
            }
        }
        let applied = self.shared.batches.apply_results(&results).await?;
        self.shared.metrics.applied(&applied);
        self.shared.wake.notify_one();
        Ok(())
    }
}
