//! Quotas by scope, and the counts of queued jobs the submit check needs.

use std::collections::HashMap;

use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder};

use super::entities::{job, quota, user};
use super::{Store, StoreResult};
use crate::ids::now_ms;
use crate::state::JobState;

pub use quota::Model as QuotaRecord;

/// Queued jobs of one user, of their project, and of everyone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueuedCounts {
    pub user: i64,
    pub project: i64,
    pub global: i64,
}

impl Store {
    /// Creates or replaces the quota of `record.scope`.
    pub async fn set_quota(&self, mut record: QuotaRecord) -> StoreResult<QuotaRecord> {
        record.updated_at_ms = now_ms();
        let model = quota::ActiveModel {
            scope: Set(record.scope.clone()),
            cpu_millis: Set(record.cpu_millis),
            memory_bytes: Set(record.memory_bytes),
            gpus: Set(record.gpus),
            running_jobs: Set(record.running_jobs),
            queued_jobs: Set(record.queued_jobs),
            updated_at_ms: Set(record.updated_at_ms),
            weight: Set(record.weight),
        };
        quota::Entity::insert(model)
            .on_conflict(
                OnConflict::column(quota::Column::Scope)
                    .update_columns([
                        quota::Column::CpuMillis,
                        quota::Column::MemoryBytes,
                        quota::Column::Gpus,
                        quota::Column::RunningJobs,
                        quota::Column::QueuedJobs,
                        quota::Column::UpdatedAtMs,
                        quota::Column::Weight,
                    ])
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        Ok(record)
    }

    pub async fn quota(&self, scope: &str) -> StoreResult<Option<QuotaRecord>> {
        Ok(quota::Entity::find_by_id(scope.to_string()).one(&self.db).await?)
    }

    /// Every quota, by scope.
    pub async fn quotas(&self) -> StoreResult<Vec<QuotaRecord>> {
        Ok(quota::Entity::find()
            .order_by_asc(quota::Column::Scope)
            .all(&self.db)
            .await?)
    }

    /// Removes a quota; returns it, or `None` when the scope had none.
    pub async fn delete_quota(&self, scope: &str) -> StoreResult<Option<QuotaRecord>> {
        let existing = self.quota(scope).await?;
        if existing.is_some() {
            quota::Entity::delete_by_id(scope.to_string()).exec(&self.db).await?;
        }
        Ok(existing)
    }

    /// How many jobs wait in the queue: the user's, the project's and everyone's.
    pub async fn queued_counts(&self, owner_id: &str, project: &str) -> StoreResult<QueuedCounts> {
        let queued = || job::Entity::find().filter(job::Column::State.eq(JobState::Queued.as_str()));
        Ok(QueuedCounts {
            user: queued()
                .filter(job::Column::OwnerId.eq(owner_id))
                .count(&self.db)
                .await? as i64,
            project: queued()
                .filter(job::Column::Project.eq(project))
                .count(&self.db)
                .await? as i64,
            global: queued().count(&self.db).await? as i64,
        })
    }

    /// User names by id (quotas name users; jobs record their owner's id).
    pub async fn user_names(&self) -> StoreResult<HashMap<String, String>> {
        Ok(user::Entity::find()
            .all(&self.db)
            .await?
            .into_iter()
            .map(|user| (user.id, user.name))
            .collect())
    }
}
