//! Records of content-addressed blobs.

use sea_orm::{ActiveValue::Set, EntityTrait};

use super::entities::artifact;
use super::{Store, StoreResult};
use crate::ids::now_ms;

pub struct NewArtifact {
    pub digest: String,
    pub size: i64,
    pub created_by: String,
}

impl Store {
    pub async fn artifact(&self, digest: &str) -> StoreResult<Option<artifact::Model>> {
        Ok(artifact::Entity::find_by_id(digest.to_string())
            .one(&self.db)
            .await?)
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
