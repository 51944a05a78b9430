//! `DatasetService`: names for uploaded archives, which jobs mount read-only.
//!
//! A dataset is immutable: its name points at one content-addressed archive for good, so a job
//! always sees the data it was submitted with. Dataset names are shared by all users.

use kiln_core::auth::user_principal;
use kiln_core::store::Store;
use kiln_proto::v1 as pb;
use kiln_proto::v1::dataset_service_server::DatasetService;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::jobs::validate_dataset_name;

/// DatasetsApi serves `DatasetService`.
#[derive(Clone)]
pub struct DatasetsApi {
    pub(crate) store: Store,
}

fn to_proto(dataset: kiln_core::store::entities::dataset::Model) -> pb::Dataset {
    pb::Dataset {
        name: dataset.name,
        digest: dataset.digest,
        size: u64::try_from(dataset.size).unwrap_or(0),
        created_by: dataset.created_by,
        created_at_ms: dataset.created_at_ms,
    }
}

impl DatasetsApi {
    async fn create(&self, user_name: &str, request: pb::CreateDatasetRequest) -> Result<pb::Dataset> {
        validate_dataset_name(&request.name)?;
        let artifact = self
            .store
            .artifact(&request.digest)
            .await?
            .ok_or_else(|| Error::ArtifactMissing {
                digest: request.digest.clone(),
            })?;
        if !self
            .store
            .insert_dataset(&request.name, &artifact.digest, artifact.size, user_name)
            .await?
        {
            return Err(Error::DatasetExists { name: request.name });
        }
        let dataset = self.store.dataset(&request.name).await?.expect("dataset just created");
        tracing::info!(name = %dataset.name, digest = %dataset.digest, "dataset created");
        Ok(to_proto(dataset))
    }
}

#[tonic::async_trait]
impl DatasetService for DatasetsApi {
    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_dataset(
        &self,
        request: Request<pb::CreateDatasetRequest>,
    ) -> Result<Response<pb::Dataset>, Status> {
        let principal = user_principal(&request)?;
        Ok(Response::new(
            self.create(&principal.user_name, request.into_inner()).await?,
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn list_datasets(
        &self,
        request: Request<pb::ListDatasetsRequest>,
    ) -> Result<Response<pb::ListDatasetsResponse>, Status> {
        user_principal(&request)?;
        let datasets = self.store.list_datasets().await.map_err(Error::from)?;
        Ok(Response::new(pb::ListDatasetsResponse {
            datasets: datasets.into_iter().map(to_proto).collect(),
        }))
    }
}
