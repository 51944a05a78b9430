//! Quotas by scope, and the counts of queued jobs the submit check needs.

use std::collections::HashMap;

use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    TransactionTrait,
};

use super::entities::{job, quota, user};
use super::jobs::new_record;
use super::{JobRecord, NewJob, Store, StoreResult};
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

/// The key of the Postgres advisory lock that makes admission one step ("kiln" and 1).
const ADMISSION_LOCK: i64 = 0x6b69_6c6e_0001;

async fn queued_counts(db: &impl ConnectionTrait, owner_id: &str, project: &str) -> StoreResult<QueuedCounts> {
    let queued = || job::Entity::find().filter(job::Column::State.eq(JobState::Queued.as_str()));
    Ok(QueuedCounts {
        user: queued().filter(job::Column::OwnerId.eq(owner_id)).count(db).await? as i64,
        project: queued().filter(job::Column::Project.eq(project)).count(db).await? as i64,
        global: queued().count(db).await? as i64,
    })
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
        queued_counts(&self.db, owner_id, project).await
    }

    /// Submits a job if `admit` accepts the queued jobs it would join, counted and inserted as
    /// one step for every api replica at once: in a transaction that first takes, on Postgres,
    /// a transaction-scoped advisory lock, and on SQLite the database's write lock. So two
    /// submits can never both see room for one more. `Ok(Err(_))` is `admit`'s refusal.
    pub async fn insert_job_admitted<E>(
        &self,
        new: NewJob,
        admit: impl FnOnce(QueuedCounts) -> Result<(), E>,
    ) -> StoreResult<Result<JobRecord, E>> {
        let (owner_id, project) = (new.owner_id.clone(), new.project.clone());
        let model = new_record(new, JobState::Queued, "", "")?;
        let id = model.id.clone().unwrap();
        let txn = self.db.begin().await?;
        match txn.get_database_backend() {
            DbBackend::Postgres => {
                txn.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({ADMISSION_LOCK})"))
                    .await?;
            }
            // A write, even of no row, takes the write lock (waiting out the busy timeout), so
            // the counts below cannot go stale before the insert.
            _ => {
                txn.execute_unprepared("UPDATE jobs SET version = version WHERE 0 = 1")
                    .await?;
            }
        }
        if let Err(refused) = admit(queued_counts(&txn, &owner_id, &project).await?) {
            txn.rollback().await?;
            return Ok(Err(refused));
        }
        job::Entity::insert(model).exec_without_returning(&txn).await?;
        txn.commit().await?;
        Ok(Ok(self.job(&id).await?))
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
