//! The outcomes of attempts, applied once (see the note of the parent module), and new rounds
//! for dead items.

use std::collections::{BTreeMap, HashMap, HashSet};

use kiln_core::ids::now_ms;
use kiln_proto::v1 as pb;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter, QuerySelect, Statement,
    TransactionTrait, Value,
};

use super::counts::Counts;
use super::{
    BatchStore, DEAD, FAILED, PENDING, ROWS_PER_STATEMENT, SUCCEEDED, again_when_ended, attempt, item, item_state_name,
};
use crate::error::Result;

/// Outcomes that moved an item (a redelivered one moves none), by the state moved to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
}

impl Applied {
    fn count(&mut self, state: &str, moved: u64) {
        match state {
            SUCCEEDED => self.succeeded += moved,
            FAILED => self.failed += moved,
            DEAD => self.dead += moved,
            _ => {}
        }
    }
}

/// The states an outcome moves an item from (the unfinished ones), each moved by a statement
/// of its own so that the counts know what each statement moved; pending first, where nearly
/// every item is.
const MOVED_FROM: [&str; 2] = [PENDING, FAILED];

/// One statement moving every item of `results` (distinct items) that is in state `from` to
/// `state`, each only if this is a later attempt of its current round (as the one-item update
/// does): `WITH v(...) AS (VALUES ...) UPDATE batch_items SET ... FROM v WHERE ...`, which
/// SQLite (3.33 on) and Postgres both take. The state is compared as `state || ''`, which no
/// index serves: given `state = ?`, SQLite finds the rows through the `(batch_id, state,
/// item_key)` index, whose entries the update itself moves, and ran 19 times slower (200,000
/// items in chunks of 500: 19.2 s against 1.0 s by the primary key).
fn bulk_update(backend: DbBackend, from: &str, state: &str, results: &[&pb::ItemResult], now: i64) -> Statement {
    const COLUMNS: usize = 9;
    let mut values: Vec<Value> = Vec::with_capacity(results.len() * COLUMNS + 4);
    let mut placeholder = |value: Value| {
        values.push(value);
        match backend {
            DbBackend::Postgres => format!("${}", values.len()),
            _ => "?".to_string(),
        }
    };
    let rows: Vec<String> = results
        .iter()
        .map(|result| {
            let row = [
                placeholder(result.batch_id.clone().into()),
                placeholder(result.key.clone().into()),
                placeholder(i32::try_from(result.round).unwrap_or(i32::MAX).into()),
                placeholder(i32::try_from(result.attempt).unwrap_or(i32::MAX).into()),
                placeholder(result.exit_code.into()),
                placeholder(result.reason.clone().into()),
                placeholder(result.cpu_seconds.into()),
                placeholder(i64::try_from(result.peak_memory_bytes).unwrap_or(i64::MAX).into()),
                placeholder(i64::try_from(result.duration_ms).unwrap_or(i64::MAX).into()),
            ];
            format!("({})", row.join(", "))
        })
        .collect();
    let state_value = placeholder(state.into());
    let now_value = placeholder(now.into());
    let from_value = placeholder(from.into());
    let sql = format!(
        "WITH v(batch_id, item_key, round, attempt, exit_code, reason, cpu_seconds, peak_memory_bytes, duration_ms) \
         AS (VALUES {}) \
         UPDATE batch_items SET state = {state_value}, attempts = batch_items.attempts + 1, \
         last_attempt = v.attempt, exit_code = v.exit_code, reason = v.reason, cpu_seconds = v.cpu_seconds, \
         peak_memory_bytes = v.peak_memory_bytes, duration_ms = v.duration_ms, updated_at_ms = {now_value} \
         FROM v WHERE batch_items.batch_id = v.batch_id AND batch_items.item_key = v.item_key \
         AND batch_items.round = v.round AND batch_items.last_attempt < v.attempt \
         AND batch_items.state || '' = {from_value}",
        rows.join(", ")
    );
    Statement::from_sql_and_values(backend, sql, values)
}

/// The kept record of an attempt: its outcome and last lines.
fn attempt_row(result: &pb::ItemResult, now: i64) -> attempt::ActiveModel {
    let lines: Vec<(i32, i64, &str)> = result
        .lines
        .iter()
        .map(|l| (l.stream, l.timestamp_ms, l.text.as_str()))
        .collect();
    attempt::ActiveModel {
        batch_id: Set(result.batch_id.clone()),
        item_key: Set(result.key.clone()),
        attempt: Set(i32::try_from(result.attempt).unwrap_or(i32::MAX)),
        round: Set(i32::try_from(result.round).unwrap_or(i32::MAX)),
        exit_code: Set(result.exit_code),
        reason: Set(result.reason.clone()),
        lines_json: Set(serde_json::to_string(&lines).unwrap_or_else(|_| "[]".into())),
        finished_at_ms: Set(now),
    }
}

/// An attempt recorded again (its outcome redelivered) replaces the first record.
fn attempt_conflict() -> OnConflict {
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
    .to_owned()
}

impl BatchStore {
    /// Applies outcomes in one transaction (see the module's note on applying once); returns
    /// how many moved an item, by the state they moved it to.
    pub async fn apply_results(&self, results: &[pb::ItemResult]) -> Result<Applied> {
        let now = now_ms();
        // An item's outcomes must apply in order (a failure, then its retry's success): an item
        // with more than one here is applied a statement at a time, the others in bulk, one
        // statement per state and chunk.
        let mut outcomes: HashMap<(&str, &str), usize> = HashMap::new();
        for result in results {
            *outcomes.entry((&result.batch_id, &result.key)).or_default() += 1;
        }
        let mut bulk: BTreeMap<&'static str, Vec<&pb::ItemResult>> = BTreeMap::new();
        let mut one_by_one = Vec::new();
        let mut attempts = Vec::new();
        for result in results {
            let Some(state) = pb::ItemState::try_from(result.state).ok().and_then(item_state_name) else {
                tracing::warn!(key = %result.key, state = result.state, "dropping an outcome without a state");
                continue;
            };
            if outcomes[&(result.batch_id.as_str(), result.key.as_str())] > 1 {
                one_by_one.push((state, result));
                continue;
            }
            bulk.entry(state).or_default().push(result);
            if state != SUCCEEDED || !result.lines.is_empty() {
                attempts.push(attempt_row(result, now));
            }
        }
        // Rows locked in one order (by key) by every transaction deadlock less often.
        for results in bulk.values_mut() {
            results.sort_unstable_by(|a, b| (&a.batch_id, &a.key).cmp(&(&b.batch_id, &b.key)));
        }
        let applied = again_when_ended(|| self.apply_once(&bulk, &attempts, &one_by_one, now)).await?;
        let batches: HashSet<&str> = results.iter().map(|result| result.batch_id.as_str()).collect();
        self.changes.touch_all(batches);
        Ok(applied)
    }

    /// Counts a failed attempt of an item's round (once per delivery, however often its outcome
    /// is recorded) and returns the round's failures so far; `None` when the item is not in
    /// that round (a new round began).
    pub async fn count_failure(&self, batch_id: &str, key: &str, round: u32, delivery: u32) -> Result<Option<u32>> {
        let round = i32::try_from(round).unwrap_or(i32::MAX);
        again_when_ended(|| self.count_failure_once(batch_id, key, round, delivery)).await
    }

    /// Applies outcomes, in one transaction (see `again_when_ended`).
    async fn apply_once(
        &self,
        bulk: &BTreeMap<&'static str, Vec<&pb::ItemResult>>,
        attempts: &[attempt::ActiveModel],
        one_by_one: &[(&'static str, &pb::ItemResult)],
        now: i64,
    ) -> Result<Applied> {
        let _turn = self.write_turn().await;
        let tx = self.db.begin().await?;
        let mut applied = Applied::default();
        let mut counts = Counts::default();
        for (&state, results) in bulk {
            // Sorted by batch: each statement moves one batch's items.
            for batch in results.chunk_by(|a, b| a.batch_id == b.batch_id) {
                for chunk in batch.chunks(ROWS_PER_STATEMENT) {
                    let mut unmoved = chunk.len() as u64;
                    for from in MOVED_FROM {
                        if unmoved == 0 {
                            break;
                        }
                        let statement = bulk_update(tx.get_database_backend(), from, state, chunk, now);
                        let moved = tx.execute_raw(statement).await?.rows_affected();
                        counts.moved(&chunk[0].batch_id, from, state, moved);
                        applied.count(state, moved);
                        unmoved = unmoved.saturating_sub(moved);
                    }
                }
            }
        }
        for chunk in attempts.chunks(ROWS_PER_STATEMENT) {
            attempt::Entity::insert_many(chunk.iter().cloned())
                .on_conflict(attempt_conflict())
                .exec_without_returning(&tx)
                .await?;
        }
        for &(state, result) in one_by_one {
            let round = i32::try_from(result.round).unwrap_or(i32::MAX);
            let attempt = i32::try_from(result.attempt).unwrap_or(i32::MAX);
            for from in MOVED_FROM {
                // (`state || ''`: by the primary key, as in `bulk_update`.)
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
                    .filter(Expr::cust("state || ''").eq(from))
                    .exec(&tx)
                    .await?
                    .rows_affected;
                counts.moved(&result.batch_id, from, state, moved);
                applied.count(state, moved);
                if moved > 0 {
                    break;
                }
            }
            if state != SUCCEEDED || !result.lines.is_empty() {
                attempt::Entity::insert(attempt_row(result, now))
                    .on_conflict(attempt_conflict())
                    .exec_without_returning(&tx)
                    .await?;
            }
        }
        counts.write(&tx).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// Counts a failed attempt, in one transaction (see `again_when_ended`).
    async fn count_failure_once(&self, batch_id: &str, key: &str, round: i32, delivery: u32) -> Result<Option<u32>> {
        let _turn = self.write_turn().await;
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
        let retried = again_when_ended(|| self.retry_dead_once(batch_id)).await?;
        self.changes.touch(batch_id);
        Ok(retried)
    }

    /// Gives dead items a new round, in one transaction (see `again_when_ended`).
    async fn retry_dead_once(&self, batch_id: &str) -> Result<u64> {
        let _turn = self.write_turn().await;
        let tx = self.db.begin().await?;
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
            .exec(&tx)
            .await?;
        let mut counts = Counts::default();
        counts.moved(batch_id, DEAD, PENDING, result.rows_affected);
        counts.write(&tx).await?;
        tx.commit().await?;
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

#[cfg(test)]
mod tests {
    use sea_orm::{ConnectionTrait, Statement};

    use super::*;

    /// The bulk update must find its rows by key: through the state index, whose entries it
    /// moves, SQLite ran it 19 times slower (see `bulk_update`). With `state = ?` this plan named
    /// `batch_items_state_idx`.
    #[tokio::test]
    async fn the_bulk_update_finds_items_by_key_not_by_the_state_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = kiln_core::store::Store::connect(&kiln_core::testing::sqlite_config(dir.path()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let db = store.connection();
        let result = pb::ItemResult {
            batch_id: "b1".into(),
            key: "k1".into(),
            attempt: 1,
            ..Default::default()
        };
        let update = bulk_update(DbBackend::Sqlite, PENDING, SUCCEEDED, &[&result], 1);
        let explain = Statement {
            sql: format!("EXPLAIN QUERY PLAN {}", update.sql),
            ..update
        };
        let plan: Vec<String> = db
            .query_all_raw(explain)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get::<String>("", "detail").unwrap())
            .collect();
        let search = plan
            .iter()
            .find(|step| step.contains("batch_items"))
            .expect("a step on batch_items");
        assert!(
            search.contains("sqlite_autoindex_batch_items_1"),
            "found by another index: {plan:?}"
        );
    }
}
