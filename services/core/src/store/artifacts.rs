//! Records of content-addressed blobs.

use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter};

use sea_orm::QueryOrder;

use super::entities::{artifact, dataset, job};
use super::{Store, StoreResult};
use crate::ids::now_ms;
use crate::state::JobState;

/// States of a job that will still run (a preempted one is queued again).
const LIVE: [JobState; 6] = [
    JobState::Queued,
    JobState::Scheduled,
    JobState::Provisioning,
    JobState::Running,
    JobState::Syncing,
    JobState::Preempted,
];

pub struct NewArtifact {
    pub digest: String,
    pub size: i64,
    pub created_by: String,
}

impl Store {
    pub async fn artifact(&self, digest: &str) -> StoreResult<Option<artifact::Model>> {
        Ok(artifact::Entity::find_by_id(digest.to_string()).one(&self.db).await?)
    }

    /// Records a blob; returns false when it was recorded already.
    pub async fn insert_artifact(&self, new: NewArtifact) -> StoreResult<bool> {
        if self.artifact(&new.digest).await?.is_some() {
            return Ok(false);
        }
        let inserted = artifact::Entity::insert(artifact::ActiveModel {
            digest: Set(new.digest.clone()),
            size: Set(new.size),
            created_by: Set(new.created_by),
            created_at_ms: Set(now_ms()),
        })
        .exec_without_returning(&self.db)
        .await;
        match inserted {
            Ok(_) => Ok(true),
            // A concurrent upload of the same content recorded it first.
            Err(_) if self.artifact(&new.digest).await?.is_some() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }
}

impl Store {
    /// Names an artifact as a dataset of a project; returns false when the name is taken
    /// (dataset names are unique across the instance).
    pub async fn insert_dataset(
        &self,
        project: &str,
        name: &str,
        digest: &str,
        size: i64,
        created_by: &str,
    ) -> StoreResult<bool> {
        if dataset::Entity::find_by_id(name.to_string())
            .one(&self.db)
            .await?
            .is_some()
        {
            return Ok(false);
        }
        let inserted = dataset::Entity::insert(dataset::ActiveModel {
            name: Set(name.to_string()),
            digest: Set(digest.to_string()),
            size: Set(size),
            created_by: Set(created_by.to_string()),
            created_at_ms: Set(now_ms()),
            project: Set(project.to_string()),
        })
        .exec_without_returning(&self.db)
        .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(_) if self.dataset(name).await?.is_some() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    pub async fn dataset(&self, name: &str) -> StoreResult<Option<dataset::Model>> {
        Ok(dataset::Entity::find_by_id(name.to_string()).one(&self.db).await?)
    }

    pub async fn list_datasets(&self) -> StoreResult<Vec<dataset::Model>> {
        Ok(dataset::Entity::find()
            .order_by_asc(dataset::Column::Name)
            .all(&self.db)
            .await?)
    }

    /// Removes a dataset's name; false when there was none.
    pub async fn delete_dataset(&self, name: &str) -> StoreResult<bool> {
        let deleted = dataset::Entity::delete_by_id(name.to_string()).exec(&self.db).await?;
        Ok(deleted.rows_affected > 0)
    }

    /// A job that will still run and names the dataset, if any.
    pub async fn live_job_naming_dataset(&self, name: &str) -> StoreResult<Option<String>> {
        // A superset by text (the list is JSON), then the exact check.
        let quoted = serde_json::to_string(name).map_err(|e| super::StoreError::Corrupt(e.to_string()))?;
        let candidates = job::Entity::find()
            .filter(job::Column::State.is_in(LIVE.iter().map(|s| s.as_str())))
            .filter(job::Column::DatasetsJson.contains(&quoted))
            .all(&self.db)
            .await?;
        for candidate in candidates {
            if candidate.datasets()?.iter().any(|named| named == name) {
                return Ok(Some(candidate.id));
            }
        }
        Ok(None)
    }

    /// Tells whether a dataset, a model version (as a file), a job that will still run (as its
    /// code), or a saved run artifact names the blob.
    pub async fn blob_in_use(&self, digest: &str) -> StoreResult<bool> {
        let named = dataset::Entity::find()
            .filter(dataset::Column::Digest.eq(digest))
            .one(&self.db)
            .await?
            .is_some();
        let code = job::Entity::find()
            .filter(job::Column::State.is_in(LIVE.iter().map(|s| s.as_str())))
            .filter(job::Column::CodeDigest.eq(digest))
            .one(&self.db)
            .await?
            .is_some();
        Ok(named || code || self.run_artifact_names_blob(digest).await? || self.blob_in_model(digest).await?)
    }

    /// Forgets a blob's record (after the blob itself was deleted, or before).
    pub async fn delete_artifact(&self, digest: &str) -> StoreResult<()> {
        artifact::Entity::delete_by_id(digest.to_string())
            .exec(&self.db)
            .await?;
        Ok(())
    }
}
