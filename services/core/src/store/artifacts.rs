//! Records of content-addressed blobs.

use sea_orm::{ActiveValue::Set, EntityTrait};

use sea_orm::QueryOrder;

use super::entities::{artifact, dataset};
use super::{Store, StoreResult};
use crate::ids::now_ms;

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
    /// Names an artifact as a dataset; returns false when the name is taken.
    pub async fn insert_dataset(&self, name: &str, digest: &str, size: i64, created_by: &str) -> StoreResult<bool> {
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
}
