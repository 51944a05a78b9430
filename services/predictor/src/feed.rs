//! `WatchServices`: a list of services kept current from the ids this service publishes on
//! KILN_CHANGES after each change of a service, and at each controller pass for a running
//! one (its workers and recent traffic) (see serve.proto and kiln_core::feed).

use kiln_core::authz::{Caller, Visible};
use kiln_core::feed::{self, Feed, Source};
use kiln_core::subjects::CHANGES_SERVICES;
use kiln_proto::v1 as pb;
use tonic::Status;

use crate::manage::ServeApi;
use crate::record::ServiceRecord;
use crate::{Error, Result};

pub type ServiceChangesStream = feed::Changed<pb::ServiceChanges>;

/// The services one caller may list (what ListServices answers).
pub struct Listed {
    api: ServeApi,
    visible: Visible,
    all: bool,
}

impl Listed {
    pub async fn of(api: &ServeApi, caller: &Caller, list: &pb::ListServicesRequest) -> Result<Listed> {
        let visible = caller
            .listed_projects(&api.shared.store, &list.project)
            .await
            .map_err(Error::from)?;
        Ok(Listed {
            api: ServeApi {
                shared: api.shared.clone(),
            },
            visible,
            all: list.all,
        })
    }

    pub async fn services(&self) -> Result<Vec<pb::Service>> {
        let records = self.api.shared.services.list(&self.visible, self.all).await?;
        self.describe(&records).await
    }

    async fn describe(&self, records: &[ServiceRecord]) -> Result<Vec<pb::Service>> {
        let mut services = Vec::with_capacity(records.len());
        for record in records {
            services.push(self.api.describe(record).await?);
        }
        Ok(services)
    }

    /// Watches the list (`after_seq` as in WatchServicesRequest).
    pub async fn watch(self, after_seq: u64) -> std::result::Result<ServiceChangesStream, Status> {
        let jetstream = self.api.shared.nats.jetstream.clone();
        let pages = feed::watch(&jetstream, Feed::changes(CHANGES_SERVICES), after_seq, self).await?;
        Ok(feed::answers(pages))
    }
}

#[tonic::async_trait]
impl Source for Listed {
    type Item = pb::Service;

    async fn list(&self) -> std::result::Result<Vec<pb::Service>, Status> {
        Ok(self.services().await?)
    }

    async fn changed(&self, ids: Vec<String>) -> std::result::Result<Vec<pb::Service>, Status> {
        let records = self.api.shared.services.changed(&ids, &self.visible).await?;
        Ok(self.describe(&records).await?)
    }

    fn key(service: &pb::Service) -> String {
        format!("{}/{}", service.project, service.name)
    }
}
