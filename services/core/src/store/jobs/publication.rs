//! A job change is committed, then published; `published_version` records what went out. The
//! services re-drive what is committed but not published (every service for the states it owns,
//! every runner for its own jobs each report interval, the scheduling leader for runners gone),
//! then mark it. The partial index `jobs_unpublished` (migration 28) holds only such rows.

use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Select};

use crate::state::JobState;
use crate::store::entities::job::{Column, Entity as Jobs};
use crate::store::{JobRecord, Store, StoreResult};

/// The jobs whose latest change has not been published yet, oldest first.
fn unpublished() -> Select<Jobs> {
    Jobs::find()
        .filter(Expr::col(Column::PublishedVersion).lt(Expr::col(Column::Version)))
        .order_by_asc(Column::CreatedAtMs)
}

impl Store {
    /// Returns the jobs in any of `states` whose latest change has not been published yet.
    pub async fn unpublished_jobs(&self, states: &[JobState]) -> StoreResult<Vec<JobRecord>> {
        Ok(unpublished()
            .filter(Column::State.is_in(states.iter().map(|s| s.as_str())))
            .all(&self.db)
            .await?)
    }

    /// Returns the jobs held by `runner_id` whose latest change has not been published yet (a
    /// look-up in the `jobs_unpublished` index: every runner asks this every report interval).
    pub async fn unpublished_jobs_on(&self, runner_id: &str) -> StoreResult<Vec<JobRecord>> {
        Ok(unpublished()
            .filter(Column::RunnerId.eq(runner_id))
            .all(&self.db)
            .await?)
    }

    /// Returns the jobs held or last held by a runner whose latest change has not been published
    /// yet, whichever runner (the scheduling leader publishes those of runners gone).
    pub async fn unpublished_runner_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        Ok(unpublished().filter(Column::RunnerId.ne("")).all(&self.db).await?)
    }

    /// Records that the job's changes up to `version` are published.
    pub async fn mark_published(&self, job_id: &str, version: i64) -> StoreResult<()> {
        Jobs::update_many()
            .col_expr(Column::PublishedVersion, Expr::value(version))
            .filter(Column::Id.eq(job_id))
            .filter(Column::PublishedVersion.lt(version))
            .exec(&self.db)
            .await?;
        Ok(())
    }
}
