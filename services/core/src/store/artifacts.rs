//! Records of content-addressed blobs.

use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder};

use super::entities::{artifact, artifact_project, dataset, job};
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
    /// The project that uploaded it, which it then belongs to.
    pub project: String,
}

/// A dataset as a job or a sweep names it: `NAME` in the naming project, or `PROJECT/NAME` for a
/// dataset of another project (which the caller needs a role in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetRef {
    pub project: String,
    pub name: String,
}

impl DatasetRef {
    /// Reads a reference made from `home` (the job's project); `None` when it has more than one
    /// `/`.
    pub fn parse(reference: &str, home: &str) -> Option<DatasetRef> {
        match reference.split_once('/') {
            Some((project, name)) if !name.contains('/') => Some(DatasetRef {
                project: project.to_string(),
                name: name.to_string(),
            }),
            Some(_) => None,
            None => Some(DatasetRef {
                project: home.to_string(),
                name: reference.to_string(),
            }),
        }
    }

    /// The reference as `home` writes it: the bare name for its own datasets.
    pub fn relative_to(&self, home: &str) -> String {
        if self.project == home {
            self.name.clone()
        } else {
            format!("{}/{}", self.project, self.name)
        }
    }
}

impl Store {
    pub async fn artifact(&self, digest: &str) -> StoreResult<Option<artifact::Model>> {
        Ok(artifact::Entity::find_by_id(digest.to_string()).one(&self.db).await?)
    }

    /// Records a blob and that its uploader's project has it; returns false when the blob was
    /// recorded already (the project is given it all the same).
    pub async fn insert_artifact(&self, new: NewArtifact) -> StoreResult<bool> {
        self.grant_artifact(&new.digest, &new.project).await?;
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

    /// The projects a blob belongs to.
    pub async fn artifact_projects(&self, digest: &str) -> StoreResult<Vec<String>> {
        Ok(artifact_project::Entity::find()
            .filter(artifact_project::Column::Digest.eq(digest))
            .all(&self.db)
            .await?
            .into_iter()
            .map(|row| row.project)
            .collect())
    }

    /// Tells whether `project` has the blob.
    pub async fn artifact_in_project(&self, digest: &str, project: &str) -> StoreResult<bool> {
        Ok(
            artifact_project::Entity::find_by_id((digest.to_string(), project.to_string()))
                .one(&self.db)
                .await?
                .is_some(),
        )
    }

    /// Gives a project a blob (it uploaded it, or one of its records names it); idempotent.
    pub async fn grant_artifact(&self, digest: &str, project: &str) -> StoreResult<()> {
        let inserted = artifact_project::Entity::insert(artifact_project::ActiveModel {
            digest: Set(digest.to_string()),
            project: Set(project.to_string()),
        })
        .on_conflict(
            OnConflict::columns([artifact_project::Column::Digest, artifact_project::Column::Project])
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(&self.db)
        .await;
        match inserted {
            Ok(_) | Err(sea_orm::DbErr::RecordNotInserted) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

impl Store {
    /// Names an artifact as a dataset of a project; returns false when the project has a
    /// dataset of that name (names are unique per project).
    pub async fn insert_dataset(
        &self,
        project: &str,
        name: &str,
        digest: &str,
        size: i64,
        created_by: &str,
    ) -> StoreResult<bool> {
        if self.dataset(project, name).await?.is_some() {
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
            Err(_) if self.dataset(project, name).await?.is_some() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// A project's dataset by name.
    pub async fn dataset(&self, project: &str, name: &str) -> StoreResult<Option<dataset::Model>> {
        Ok(dataset::Entity::find_by_id((project.to_string(), name.to_string()))
            .one(&self.db)
            .await?)
    }

    /// The dataset a job of `home` names by `reference` (see [`DatasetRef`]).
    pub async fn dataset_named(&self, home: &str, reference: &str) -> StoreResult<Option<dataset::Model>> {
        match DatasetRef::parse(reference, home) {
            Some(named) => self.dataset(&named.project, &named.name).await,
            None => Ok(None),
        }
    }

    pub async fn list_datasets(&self) -> StoreResult<Vec<dataset::Model>> {
        Ok(dataset::Entity::find()
            .order_by_asc(dataset::Column::Project)
            .order_by_asc(dataset::Column::Name)
            .all(&self.db)
            .await?)
    }

    /// Removes a dataset's name; false when there was none.
    pub async fn delete_dataset(&self, project: &str, name: &str) -> StoreResult<bool> {
        let deleted = dataset::Entity::delete_by_id((project.to_string(), name.to_string()))
            .exec(&self.db)
            .await?;
        Ok(deleted.rows_affected > 0)
    }

    /// A job that will still run and names the dataset (from its own project or another), if any.
    pub async fn live_job_naming_dataset(&self, project: &str, name: &str) -> StoreResult<Option<String>> {
        // A superset by text (the list is JSON), then the exact check.
        let quoted = serde_json::to_string(name).map_err(|e| super::StoreError::Corrupt(e.to_string()))?;
        let qualified = serde_json::to_string(&format!("{project}/{name}"))
            .map_err(|e| super::StoreError::Corrupt(e.to_string()))?;
        let candidates = job::Entity::find()
            .filter(job::Column::State.is_in(LIVE.iter().map(|s| s.as_str())))
            .filter(
                Condition::any()
                    .add(job::Column::DatasetsJson.contains(&quoted))
                    .add(job::Column::DatasetsJson.contains(&qualified)),
            )
            .all(&self.db)
            .await?;
        let wanted = DatasetRef {
            project: project.to_string(),
            name: name.to_string(),
        };
        for candidate in candidates {
            let names = candidate.datasets()?;
            if names
                .iter()
                .any(|named| DatasetRef::parse(named, &candidate.project).as_ref() == Some(&wanted))
            {
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
        artifact_project::Entity::delete_many()
            .filter(artifact_project::Column::Digest.eq(digest))
            .exec(&self.db)
            .await?;
        Ok(())
    }
}
