//! Adding items to a batch in two stages that overlap: one message's items are recorded in the
//! database (duplicates by key found, new rows inserted) while the items recorded before them
//! are published to `KILN_ITEMS` through one JetStream [`Pipeline`] that stays full across
//! messages. Recording and publishing took turns before, each waiting on the other; the
//! breakdown that led here is in docs/design-notes.md ("Batch intake").
//!
//! The guarantees are those of one stage after the other: an item is published only after its
//! row is committed, and marked published only after JetStream stored it; a crash in between
//! leaves rows unpublished, which [`Shared::publish_unpublished`] puts on the queue again (the
//! message id of batch, key and round makes a second copy within the duplicate window a no-op).
//! An AddItems call answers only once everything it recorded is stored on the queue.

use std::collections::VecDeque;
use std::sync::Arc;

use kiln_core::publish::Pipeline;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::Shared;
use crate::error::{Error, Result};
use crate::store::NewItem;

/// Messages published and awaiting their acks at once.
const IN_FLIGHT: usize = 4096;
/// Recorded messages waiting for the publisher: a message is recorded while the one before is
/// published, and no more, so a slow queue holds the client back instead of filling memory.
const RECORDED_AHEAD: usize = 1;

/// One caller's additions to one batch.
pub(crate) struct Intake {
    shared: Arc<Shared>,
    batch_id: String,
    to_publish: Option<mpsc::Sender<Vec<pb::QueuedItem>>>,
    publisher: JoinHandle<Result<()>>,
    pub added: u64,
    pub duplicates: u64,
}

impl Intake {
    pub fn start(shared: Arc<Shared>, batch_id: String) -> Intake {
        shared.intake_began(&batch_id);
        let (to_publish, recorded) = mpsc::channel(RECORDED_AHEAD);
        let publisher = tokio::spawn(publish_stage(shared.clone(), batch_id.clone(), recorded));
        Intake {
            shared,
            batch_id,
            to_publish: Some(to_publish),
            publisher,
            added: 0,
            duplicates: 0,
        }
    }

    pub fn batch_id(&self) -> &str {
        &self.batch_id
    }

    /// Records checked items in an open batch and hands the new ones to the publisher.
    pub async fn add(&mut self, items: Vec<NewItem>) -> Result<()> {
        let (fresh, duplicates) = self.shared.record(&self.batch_id, items).await?;
        self.duplicates += duplicates;
        self.added += fresh.len() as u64;
        self.shared.metrics.items_added.inc_by(fresh.len() as u64);
        let queued = fresh
            .into_iter()
            .map(|item| pb::QueuedItem {
                batch_id: self.batch_id.clone(),
                key: item.key,
                uri: item.uri,
                params: item.params.into_iter().collect(),
                round: 0,
            })
            .collect();
        self.publish(queued).await
    }

    /// Hands items already recorded to the publisher.
    pub async fn publish(&mut self, items: Vec<pb::QueuedItem>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let sent = match &self.to_publish {
            Some(to_publish) => to_publish.send(items).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The publisher stopped: its error says why.
        self.to_publish = None;
        match (&mut self.publisher).await {
            Ok(Err(error)) => Err(error),
            Ok(Ok(())) => Err(Error::Internal("the publisher of new items stopped early".into())),
            Err(join) => Err(Error::Internal(format!("the publisher of new items failed: {join}"))),
        }
    }

    /// Waits until everything recorded is stored on the queue; returns (added, duplicates).
    pub async fn finish(mut self) -> Result<(u64, u64)> {
        self.to_publish = None;
        match (&mut self.publisher).await {
            Ok(result) => result?,
            Err(join) => return Err(Error::Internal(format!("the publisher of new items failed: {join}"))),
        }
        Ok((self.added, self.duplicates))
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        // A caller that went away: what was recorded is still published, then the batch's
        // stragglers are the scaler's again.
        self.shared.intake_ended(&self.batch_id);
    }
}

/// Publishes what the intake recorded, in order, marking each message's items published once
/// JetStream has stored all of them.
async fn publish_stage(
    shared: Arc<Shared>,
    batch_id: String,
    mut recorded: mpsc::Receiver<Vec<pb::QueuedItem>>,
) -> Result<()> {
    let subject = subjects::items(&batch_id);
    let mut pipeline = Pipeline::new(shared.nats.jetstream.clone(), subject, IN_FLIGHT);
    // Keys sent but not yet marked, with the number sent when the last of them was.
    let mut unmarked: VecDeque<(u64, Vec<String>)> = VecDeque::new();
    let mut sent: u64 = 0;
    while let Some(items) = recorded.recv().await {
        let mut keys = Vec::with_capacity(items.len());
        for item in items {
            let msg_id = subjects::item_msg_id(&batch_id, &item.key, item.round);
            pipeline.send(msg_id, item.encode_to_vec().into()).await?;
            keys.push(item.key);
            sent += 1;
        }
        unmarked.push_back((sent, keys));
        if recorded.is_empty() {
            // Nothing more yet: settle rather than hold a share of the process's ack budget
            // while waiting (see `Pipeline`).
            pipeline.settle().await?;
        }
        while let Some((last, _)) = unmarked.front()
            && pipeline.stored() >= *last
        {
            let (_, keys) = unmarked.pop_front().expect("a front entry");
            shared.batches.mark_published(&batch_id, &keys).await?;
        }
    }
    pipeline.flush().await?;
    for (_, keys) in unmarked {
        shared.batches.mark_published(&batch_id, &keys).await?;
    }
    Ok(())
}
