//! Project secrets: their sealed values (never the value in clear; see [`crate::secrets`]) by
//! project and name.

use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::entities::secret;
use super::{Store, StoreResult};
use crate::ids::now_ms;

pub use secret::Model as SecretRecord;

impl Store {
    /// Creates the secret or replaces its sealed value (keeping when it was created); returns
    /// the row as stored.
    pub async fn set_secret(&self, project: &str, name: &str, sealed: Vec<u8>) -> StoreResult<SecretRecord> {
        let now = now_ms();
        let model = secret::ActiveModel {
            project: Set(project.to_string()),
            name: Set(name.to_string()),
            sealed: Set(sealed),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
        };
        secret::Entity::insert(model)
            .on_conflict(
                OnConflict::columns([secret::Column::Project, secret::Column::Name])
                    .update_columns([secret::Column::Sealed, secret::Column::UpdatedAtMs])
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        let stored = self.secret(project, name).await?;
        stored.ok_or_else(|| super::StoreError::Corrupt(format!("secret {project}/{name} vanished as it was set")))
    }

    /// One secret with its sealed value, for the runner that opens it.
    pub async fn secret(&self, project: &str, name: &str) -> StoreResult<Option<SecretRecord>> {
        Ok(secret::Entity::find_by_id((project.to_string(), name.to_string()))
            .one(&self.db)
            .await?)
    }

    /// The secrets of a project by name, without their sealed values (left empty).
    pub async fn list_secrets(&self, project: &str) -> StoreResult<Vec<SecretRecord>> {
        let rows: Vec<(String, String, i64, i64)> = secret::Entity::find()
            .select_only()
            .columns([
                secret::Column::Project,
                secret::Column::Name,
                secret::Column::CreatedAtMs,
                secret::Column::UpdatedAtMs,
            ])
            .filter(secret::Column::Project.eq(project))
            .order_by_asc(secret::Column::Name)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(project, name, created_at_ms, updated_at_ms)| SecretRecord {
                project,
                name,
                sealed: Vec::new(),
                created_at_ms,
                updated_at_ms,
            })
            .collect())
    }

    /// Deletes a secret; returns it (without its value) when it existed.
    pub async fn delete_secret(&self, project: &str, name: &str) -> StoreResult<Option<SecretRecord>> {
        let Some(mut found) = self.secret(project, name).await? else {
            return Ok(None);
        };
        let deleted = secret::Entity::delete_by_id((project.to_string(), name.to_string()))
            .exec(&self.db)
            .await?;
        found.sealed.clear();
        Ok((deleted.rows_affected > 0).then_some(found))
    }

    /// The first of `names` the project has no secret of, if any.
    pub async fn missing_secret(&self, project: &str, names: &[String]) -> StoreResult<Option<String>> {
        if names.is_empty() {
            return Ok(None);
        }
        let present: Vec<String> = secret::Entity::find()
            .select_only()
            .column(secret::Column::Name)
            .filter(secret::Column::Project.eq(project))
            .filter(secret::Column::Name.is_in(names.iter().cloned()))
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(names.iter().find(|name| !present.contains(name)).cloned())
    }
}
