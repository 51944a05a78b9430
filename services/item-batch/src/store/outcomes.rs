//! The outcomes of attempts, applied once (see the note of the parent module), and new rounds
//! for dead items.

use kiln_core::ids::now_ms;
use kiln_proto::v1 as pb;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};

use sea_orm::{ConnectionTrait, QuerySelect};

use super::{BatchStore, DEAD, FAILED, PENDING, SUCCEEDED, attempt, item, item_state_name};
use crate::error::Result;

/// Outcomes that moved an item (a redelivered one moves none), by the state moved to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
}

impl BatchStore {
    /// Applies outcomes in one transaction (see the module's note on applying once); returns
    /// how many moved an item, by the state they moved it to.
    pub async fn apply_results(&self, results: &[pb::ItemResult]) -> Result<Applied> {
        let now = now_ms();
        let mut applied = Applied::default();
        let tx = self.db.begin().await?;
        for result in results {
            let Some(state) = pb::ItemState::try_from(result.state).ok().and_then(item_state_name) else {
                tracing::warn!(key = %result.key, state = result.state, "dropping an outcome without a state");
                continue;
            };
            let round = i32::try_from(result.round).unwrap_or(i32::MAX);
            let attempt = i32::try_from(result.attempt).unwrap_or(i32::MAX);
            let moved = item::Entity::update_many()
                .col_expr(item::Column::State, Expr::value(state))
                .col_expr(item::Column::Attempts, Expr::col(item::Column::Attempts).add(1))
                .col_expr(item::Column::LastAttempt, Expr::value(attempt))
                .col_expr(item::Column::ExitCode, Expr::value(result.exit_code))
                .col_expr(item::Column::Reason, Expr::value(result.reason.clone()))
                .col_expr(item::Column::CpuSeconds, Expr::value(result.cpu_seconds))
                .col_expr(
                    item::Column::PeakMemoryBytes,
                    Expr::value(i64::try_from(result.peak_memory_bytes).unwrap_or(i64::MAX)),
                )
                .col_expr(
                    item::Column::DurationMs,
                    Expr::value(i64::try_from(result.duration_ms).unwrap_or(i64::MAX)),
                )
                .col_expr(item::Column::UpdatedAtMs, Expr::value(now))
                .filter(item::Column::BatchId.eq(&result.batch_id))
                .filter(item::Column::ItemKey.eq(&result.key))
                .filter(item::Column::Round.eq(round))
                .filter(item::Column::LastAttempt.lt(attempt))
                .filter(item::Column::State.is_not_in([SUCCEEDED, DEAD]))
                .exec(&tx)
                .await?
                .rows_affected;
            if moved > 0 {
                match state {
                    SUCCEEDED => applied.succeeded += moved,
                    FAILED => applied.failed += moved,
                    DEAD => applied.dead += moved,
                    _ => {}
                }
            }
            if state != SUCCEEDED || !result.lines.is_empty() {
                let lines: Vec<(i32, i64, &str)> = result
                    .lines
                    .iter()
                    .map(|l| (l.stream, l.timestamp_ms, l.text.as_str()))
                    .collect();
                let model = attempt::ActiveModel {
                    batch_id: Set(result.batch_id.clone()),
                    item_key: Set(result.key.clone()),
                    attempt: Set(attempt),
                    round: Set(round),
                    exit_code: Set(result.exit_code),
                    reason: Set(result.reason.clone()),
                    lines_json: Set(serde_json::to_string(&lines).unwrap_or_else(|_| "[]".into())),
                    finished_at_ms: Set(now),
                };
                attempt::Entity::insert(model)
                    .on_conflict(
                        OnConflict::columns([
                            attempt::Column::BatchId,
                            attempt::Column::ItemKey,
                            attempt::Column::Attempt,
                        ])
                        .update_columns([
                            attempt::Column::Round,
                            attempt::Column::ExitCode,
                            attempt::Column::Reason,
                            attempt::Column::LinesJson,
                            attempt::Column::FinishedAtMs,
                        ])
                        .to_owned(),
                    )
                    .exec_without_returning(&tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Counts a failed attempt of an item's round (once per delivery, however often its outcome
    /// is recorded) and returns the round's failures so far; `None` when the item is not in
    /// that round (a new round began).
    pub async fn count_failure(&self, batch_id: &str, key: &str, round: u32, delivery: u32) -> Result<Option<u32>> {
        let round = i32::try_from(round).unwrap_or(i32::MAX);
        let tx = self.db.begin().await?;
        item::Entity::update_many()
            .col_expr(item::Column::Failures, Expr::col(item::Column::Failures).add(1))
            .col_expr(item::Column::FailedDelivery, Expr::value(i64::from(delivery)))
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::ItemKey.eq(key))
            .filter(item::Column::Round.eq(round))
            .filter(item::Column::FailedDelivery.lt(i64::from(delivery)))
            .exec(&tx)
            .await?;
        let failures = failures_of(&tx, batch_id, key, round).await?;
        tx.commit().await?;
        Ok(failures)
    }

    /// The failed attempts of an item's round; `None` when the item is not in that round.
    pub async fn failures(&self, batch_id: &str, key: &str, round: u32) -> Result<Option<u32>> {
        failures_of(&self.db, batch_id, key, i32::try_from(round).unwrap_or(i32::MAX)).await
    }

    /// Gives the dead items of a batch a new round of attempts; they are published again.
    pub async fn retry_dead(&self, batch_id: &str) -> Result<u64> {
        let result = item::Entity::update_many()
            .col_expr(item::Column::State, Expr::value(PENDING))
            .col_expr(item::Column::Round, Expr::col(item::Column::Round).add(1))
            .col_expr(item::Column::LastAttempt, Expr::value(0))
            .col_expr(item::Column::Failures, Expr::value(0))
            .col_expr(item::Column::FailedDelivery, Expr::value(0))
            .col_expr(item::Column::Published, Expr::value(false))
            .col_expr(item::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::State.eq(DEAD))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected)
    }
}

async fn failures_of(db: &impl ConnectionTrait, batch_id: &str, key: &str, round: i32) -> Result<Option<u32>> {
    let failures: Option<i64> = item::Entity::find()
        .select_only()
        .column(item::Column::Failures)
        .filter(item::Column::BatchId.eq(batch_id))
        .filter(item::Column::ItemKey.eq(key))
        .filter(item::Column::Round.eq(round))
        .into_tuple()
        .one(db)
        .await?;
    Ok(failures.map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
}
