//! `WatchSweeps`: a list of sweeps kept current from the ids this service publishes on
//! KILN_CHANGES after each change of a sweep or of its trials' jobs (see sweep.proto and
//! kiln_core::feed).

use kiln_core::authz::{Caller, Visible};
use kiln_core::feed::{self, Feed, Source};
use kiln_core::subjects::CHANGES_SWEEPS;
use kiln_proto::v1 as pb;
use tonic::Status;

use crate::error::{Error, Result};
use crate::grpc::SweepApi;
use crate::record::SweepRecord;

/// Most sweeps one ListSweeps returns.
const LIST_LIMIT: u64 = 1000;

pub type SweepChangesStream = feed::Changed<pb::SweepChanges>;

/// The sweeps one caller may list (what ListSweeps answers), without their trials.
pub struct Listed {
    api: SweepApi,
    visible: Visible,
    all: bool,
}

impl Listed {
    pub async fn of(api: &SweepApi, caller: &Caller, list: &pb::ListSweepsRequest) -> Result<Listed> {
        let visible = caller
            .listed_projects(&api.shared.store, &list.project)
            .await
            .map_err(Error::from)?;
        Ok(Listed {
            api: api.clone(),
            visible,
            all: list.all,
        })
    }

    pub async fn sweeps(&self) -> Result<Vec<pb::Sweep>> {
        let records = self
            .api
            .shared
            .sweeps
            .list_sweeps(&self.visible, self.all, LIST_LIMIT)
            .await?;
        self.describe(records).await
    }

    async fn describe(&self, records: Vec<SweepRecord>) -> Result<Vec<pb::Sweep>> {
        let mut sweeps = Vec::with_capacity(records.len());
        for record in records {
            let view = self.api.view(record).await?;
            sweeps.push(self.api.describe(&view, false).await?);
        }
        Ok(sweeps)
    }

    /// Watches the list (`after_seq` as in WatchSweepsRequest).
    pub async fn watch(self, after_seq: u64) -> std::result::Result<SweepChangesStream, Status> {
        let jetstream = self.api.shared.nats.jetstream.clone();
        let pages = feed::watch(&jetstream, Feed::changes(CHANGES_SWEEPS), after_seq, self).await?;
        Ok(feed::answers(pages))
    }
}

#[tonic::async_trait]
impl Source for Listed {
    type Item = pb::Sweep;

    async fn list(&self) -> std::result::Result<Vec<pb::Sweep>, Status> {
        Ok(self.sweeps().await?)
    }

    async fn changed(&self, ids: Vec<String>) -> std::result::Result<Vec<pb::Sweep>, Status> {
        let records = self.api.shared.sweeps.changed_sweeps(&ids, &self.visible).await?;
        Ok(self.describe(records).await?)
    }

    fn key(sweep: &pb::Sweep) -> String {
        sweep.id.clone()
    }
}
