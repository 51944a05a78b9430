//! `WatchBatches`: a list of batches kept current from the ids this service publishes on
//! KILN_CHANGES after each change of a batch (see batch.proto and kiln_core::feed).

use std::sync::Arc;

use kiln_core::authz::{Caller, Visible};
use kiln_core::feed::{self, Feed, Source};
use kiln_core::subjects::CHANGES_BATCHES;
use kiln_proto::v1 as pb;
use tonic::Status;

use crate::Shared;
use crate::error::{Error, Result};
use crate::store::BatchRecord;

pub type BatchChangesStream = feed::Changed<pb::BatchChanges>;

/// The batches one caller may list (what ListBatches answers).
pub struct Listed {
    shared: Arc<Shared>,
    /// Only the caller's own, unless an admin asks.
    owner: Option<String>,
    visible: Visible,
    all: bool,
}

impl Listed {
    pub async fn of(shared: &Arc<Shared>, caller: &Caller, list: &pb::ListBatchesRequest) -> Result<Listed> {
        let visible = caller
            .listed_projects(&shared.store, &list.project)
            .await
            .map_err(Error::from)?;
        Ok(Listed {
            shared: shared.clone(),
            owner: (!caller.is_admin()).then(|| caller.user_id().to_string()),
            visible,
            all: list.all,
        })
    }

    pub async fn batches(&self) -> Result<Vec<pb::Batch>> {
        let records = self
            .shared
            .batches
            .list_batches(self.owner.as_deref(), &self.visible, self.all)
            .await?;
        self.describe(&records).await
    }

    async fn describe(&self, records: &[BatchRecord]) -> Result<Vec<pb::Batch>> {
        let mut batches = Vec::with_capacity(records.len());
        for record in records {
            batches.push(self.shared.describe(record).await?);
        }
        Ok(batches)
    }

    /// Watches the list (`after_seq` as in WatchBatchesRequest).
    pub async fn watch(self, after_seq: u64) -> std::result::Result<BatchChangesStream, Status> {
        let jetstream = self.shared.nats.jetstream.clone();
        let pages = feed::watch(&jetstream, Feed::changes(CHANGES_BATCHES), after_seq, self).await?;
        Ok(feed::answers(pages))
    }
}

#[tonic::async_trait]
impl Source for Listed {
    type Item = pb::Batch;

    async fn list(&self) -> std::result::Result<Vec<pb::Batch>, Status> {
        Ok(self.batches().await?)
    }

    async fn changed(&self, ids: Vec<String>) -> std::result::Result<Vec<pb::Batch>, Status> {
        let records = self
            .shared
            .batches
            .changed_batches(&ids, self.owner.as_deref(), &self.visible)
            .await?;
        Ok(self.describe(&records).await?)
    }

    fn key(batch: &pb::Batch) -> String {
        batch.id.clone()
    }
}
