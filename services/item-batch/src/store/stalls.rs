//! Stalled batches: a batch whose workers keep failing (an image that cannot be pulled, a
//! runner without the agent binary) stops asking for new ones after `max-worker-failures`
//! failed in a row, instead of asking for ever. The stall is kept on the batch row with the
//! workers' reason, which `GetBatch` shows; `RetryFailed` clears it and restarts the count.
//!
//! Paused batches: a batch whose owner may no longer run jobs (disabled, or no longer a member
//! of its project) asks for no workers either; its paused reason is kept on the row the same
//! way, and `RetryFailed` lifts it once the owner may run jobs again.

use kiln_core::JobState;
use kiln_core::ids::now_ms;
use kiln_core::store::entities::job;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::{BatchRecord, BatchStore, OPEN, SEALED, batch};
use crate::error::Result;

impl BatchStore {
    /// The reason of the last worker when the last `limit` workers of the batch that ended
    /// (succeeded or failed; a worker stopped as not needed counts for neither), among those
    /// asked for since the last retry, all failed; `None` otherwise.
    pub async fn failing_workers(&self, record: &BatchRecord, limit: u32) -> Result<Option<String>> {
        if limit == 0 {
            return Ok(None);
        }
        let ended: Vec<(String, String)> = job::Entity::find()
            .select_only()
            .column(job::Column::State)
            .column(job::Column::Reason)
            .filter(job::Column::BatchId.eq(&record.id))
            .filter(job::Column::CreatedAtMs.gte(record.worker_failures_since_ms))
            .filter(job::Column::State.is_in([JobState::Succeeded.as_str(), JobState::Failed.as_str()]))
            .order_by_desc(job::Column::Id)
            .limit(u64::from(limit))
            .into_tuple()
            .all(&self.db)
            .await?;
        let all_failed =
            ended.len() == limit as usize && ended.iter().all(|(state, _)| state == JobState::Failed.as_str());
        Ok(all_failed.then(|| ended.into_iter().next().map(|(_, reason)| reason).unwrap_or_default()))
    }

    /// Marks a live batch stalled; false when it already was (or is no longer live).
    pub async fn stall(&self, batch_id: &str, reason: &str) -> Result<bool> {
        let result = batch::Entity::update_many()
            .col_expr(batch::Column::StalledReason, Expr::value(reason))
            .filter(batch::Column::Id.eq(batch_id))
            .filter(batch::Column::StalledReason.eq(""))
            .filter(batch::Column::State.is_in([OPEN, SEALED]))
            .exec(&self.db)
            .await?;
        self.told(batch_id, result.rows_affected == 1)
    }

    /// Marks a live batch paused; false when it already was (or is no longer live).
    pub async fn pause(&self, batch_id: &str, reason: &str) -> Result<bool> {
        let result = batch::Entity::update_many()
            .col_expr(batch::Column::PausedReason, Expr::value(reason))
            .filter(batch::Column::Id.eq(batch_id))
            .filter(batch::Column::PausedReason.eq(""))
            .filter(batch::Column::State.is_in([OPEN, SEALED]))
            .exec(&self.db)
            .await?;
        self.told(batch_id, result.rows_affected == 1)
    }

    /// Lifts a pause; true when the batch was paused.
    pub async fn clear_pause(&self, batch_id: &str) -> Result<bool> {
        let result = batch::Entity::update_many()
            .col_expr(batch::Column::PausedReason, Expr::value(""))
            .filter(batch::Column::Id.eq(batch_id))
            .filter(batch::Column::PausedReason.ne(""))
            .exec(&self.db)
            .await?;
        self.told(batch_id, result.rows_affected == 1)
    }

    /// Clears a stall and starts the count of worker failures afresh; true when the batch was
    /// stalled.
    pub async fn clear_stall(&self, batch_id: &str) -> Result<bool> {
        let was_stalled = !self.batch(batch_id).await?.stalled_reason.is_empty();
        batch::Entity::update_many()
            .col_expr(batch::Column::StalledReason, Expr::value(""))
            .col_expr(batch::Column::WorkerFailuresSinceMs, Expr::value(now_ms()))
            .filter(batch::Column::Id.eq(batch_id))
            .exec(&self.db)
            .await?;
        self.told(batch_id, was_stalled)
    }

    /// `changed`, after telling the batch's watchers when it is true.
    fn told(&self, batch_id: &str, changed: bool) -> Result<bool> {
        if changed {
            self.touch(batch_id);
        }
        Ok(changed)
    }
}
