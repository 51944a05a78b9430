//! `DatasetService`: names for uploaded archives, which jobs mount read-only.
//!
//! A dataset is immutable: its name points at one content-addressed archive for good, so a job
//! always sees the data it was submitted with. Datasets belong to a project (its viewers list
//! them and name them from jobs of other projects as `PROJECT/NAME`, members create them), and
//! names are unique in a project. Its creator or a maintainer may delete it once no job that has
//! not ended names it; the archive goes with it unless another dataset (or a live job's code) is
//! the same blob.

use std::sync::Arc;

use kiln_core::authz::{Caller, Resource};
use kiln_core::objects::artifact_path;
use kiln_core::store::Store;
use kiln_proto::v1 as pb;
use kiln_proto::v1::dataset_service_server::DatasetService;
use object_store::{ObjectStore, ObjectStoreExt};
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};
use crate::jobs::validate_dataset_name;

/// DatasetsApi serves `DatasetService`.
#[derive(Clone)]
pub struct DatasetsApi {
    pub(crate) store: Store,
    pub(crate) objects: Arc<dyn ObjectStore>,
}

fn to_proto(dataset: kiln_core::store::entities::dataset::Model) -> pb::Dataset {
    pb::Dataset {
        name: dataset.name,
        digest: dataset.digest,
        size: u64::try_from(dataset.size).unwrap_or(0),
        created_by: dataset.created_by,
        created_at_ms: dataset.created_at_ms,
        project: dataset.project,
    }
}

impl DatasetsApi {
    async fn create(&self, caller: &Caller, request: pb::CreateDatasetRequest) -> Result<pb::Dataset> {
        let project = access::project(&self.store, caller, &request.project).await?;
        validate_dataset_name(&request.name)?;
        let user_name = &caller.principal.user_name;
        // The archive must be the project's, or of a project the caller reads.
        let artifact = caller
            .usable_blob(&self.store, &request.digest, &project)
            .await?
            .ok_or_else(|| Error::ArtifactMissing {
                digest: request.digest.clone(),
            })?;
        if !self
            .store
            .insert_dataset(&project, &request.name, &artifact.digest, artifact.size, user_name)
            .await?
        {
            return Err(Error::DatasetExists { name: request.name });
        }
        let dataset = self
            .store
            .dataset(&project, &request.name)
            .await?
            .ok_or_else(|| Error::Internal(format!("dataset {} vanished after its creation", request.name)))?;
        tracing::info!(name = %dataset.name, digest = %dataset.digest, "dataset created");
        Ok(to_proto(dataset))
    }
}

impl DatasetsApi {
    async fn delete(&self, caller: &Caller, request: &pb::DeleteDatasetRequest) -> Result<pb::DeleteDatasetResponse> {
        let name = request.name.as_str();
        let project = if request.project.is_empty() {
            kiln_core::authz::DEFAULT_PROJECT
        } else {
            request.project.as_str()
        };
        let missing = || Error::NotFound(format!("dataset {name} not found"));
        let dataset = self.store.dataset(project, name).await?.ok_or_else(missing)?;
        let creator = self.store.user_by_name(&dataset.created_by).await?;
        let owner_id = creator.as_ref().map_or("", |user| user.id.as_str());
        caller.authorize(&Resource::owned("dataset", name, &dataset.project, owner_id))?;
        if let Some(job_id) = self.store.live_job_naming_dataset(project, name).await? {
            return Err(Error::DatasetInUse {
                name: name.to_string(),
                job_id,
            });
        }
        if !self.store.delete_dataset(project, name).await? {
            return Err(missing());
        }
        let archive_deleted = !self.store.blob_in_use(&dataset.digest).await?;
        if archive_deleted {
            // The record first: an upload of the same content then stores the blob again.
            self.store.delete_artifact(&dataset.digest).await?;
            match self.objects.delete(&artifact_path(&dataset.digest)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        tracing::info!(name, digest = %dataset.digest, archive_deleted, "dataset deleted");
        Ok(pb::DeleteDatasetResponse { archive_deleted })
    }
}

#[tonic::async_trait]
impl DatasetService for DatasetsApi {
    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn delete_dataset(
        &self,
        request: Request<pb::DeleteDatasetRequest>,
    ) -> Result<Response<pb::DeleteDatasetResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.delete(&caller, request.get_ref()).await?))
    }

    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_dataset(
        &self,
        request: Request<pb::CreateDatasetRequest>,
    ) -> Result<Response<pb::Dataset>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.create(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all)]
    async fn list_datasets(
        &self,
        request: Request<pb::ListDatasetsRequest>,
    ) -> Result<Response<pb::ListDatasetsResponse>, Status> {
        let caller = access::caller(&request)?;
        let visible = caller
            .listed_projects(&self.store, &request.get_ref().project)
            .await
            .map_err(Error::from)?;
        let datasets = self.store.list_datasets().await.map_err(Error::from)?;
        Ok(Response::new(pb::ListDatasetsResponse {
            datasets: datasets
                .into_iter()
                .filter(|dataset| visible.contains(&dataset.project))
                .map(to_proto)
                .collect(),
        }))
    }
}
