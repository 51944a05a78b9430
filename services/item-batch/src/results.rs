//! Outcomes from `KILN_ITEM_RESULTS` into the items' rows, a batch of messages per transaction,
//! acked after the commit. A redelivered outcome changes nothing (see [`crate::store`]).

use std::sync::Arc;

use kiln_core::intake::{BatchWriter, Intake, Received, WriteError};
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;

use crate::Shared;

pub const RESULTS: Intake = Intake {
    stream: subjects::STREAM_ITEM_RESULTS,
    consumer: subjects::CONSUMER_ITEM_RESULTS,
    filter: subjects::ITEM_RESULTS_ALL,
};

pub struct ResultWriter {
    pub shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl BatchWriter for ResultWriter {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            match pb::ItemResult::decode(message.payload.as_ref()) {
                Ok(result) => results.push(result),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed item result"),
            }
        }
        let applied = self.shared.batches.apply_results(&results).await?;
        self.shared.metrics.applied(&applied);
        self.shared.wake.notify_one();
        Ok(())
    }
}
