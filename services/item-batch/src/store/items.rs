//! A batch's items: adding them (refusing other content under a known key), recording that
//! they are on `KILN_ITEMS`, and reading them and their kept attempts.

use std::collections::HashMap;

use kiln_core::ids::now_ms;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait};

use super::counts::Counts;
use super::{BatchStore, FAILED, ItemRecord, NewItem, PENDING, ROWS_PER_STATEMENT, again_when_ended, attempt, item};
use crate::error::{Error, Result};
use crate::usage::Measured;

impl BatchStore {
    /// Adds items: those already there with the same content are duplicates; one already there
    /// with other content refuses the whole call (nothing of it is added). Returns the items
    /// added and how many were duplicates.
    pub async fn add_items(&self, batch_id: &str, items: Vec<NewItem>) -> Result<(Vec<NewItem>, u64)> {
        let mut existing: HashMap<String, String> = HashMap::new();
        for chunk in items.chunks(ROWS_PER_STATEMENT) {
            let rows: Vec<(String, String)> = item::Entity::find()
                .select_only()
                .column(item::Column::ItemKey)
                .column(item::Column::ContentSha256)
                .filter(item::Column::BatchId.eq(batch_id))
                .filter(item::Column::ItemKey.is_in(chunk.iter().map(|i| i.key.clone())))
                .into_tuple()
                .all(&self.db)
                .await?;
            existing.extend(rows);
        }
        let mut fresh: Vec<NewItem> = Vec::with_capacity(items.len());
        let mut seen: HashMap<String, String> = HashMap::new();
        let mut duplicates = 0;
        for item in items {
            let earlier = existing.get(&item.key).or_else(|| seen.get(&item.key));
            match earlier {
                Some(sha) if *sha == item.sha256 => duplicates += 1,
                Some(_) => {
                    return Err(Error::AlreadyExists(format!(
                        "item {:?} is already in batch {batch_id} with other content (URI or parameters); give it another key",
                        item.key
                    )));
                }
                None => {
                    seen.insert(item.key.clone(), item.sha256.clone());
                    fresh.push(item);
                }
            }
        }
        let now = now_ms();
        again_when_ended(|| self.insert_new(batch_id, &fresh, now)).await?;
        self.changes.touch(batch_id);
        Ok((fresh, duplicates))
    }

    /// Records that items are on `KILN_ITEMS`.
    pub async fn mark_published(&self, batch_id: &str, keys: &[String]) -> Result<()> {
        // Rows locked in one order (by key) by every transaction deadlock less often.
        let mut keys: Vec<&String> = keys.iter().collect();
        keys.sort_unstable();
        again_when_ended(|| self.mark_published_once(batch_id, &keys)).await
    }

    /// Inserts items found new, in one transaction (see `again_when_ended`).
    async fn insert_new(&self, batch_id: &str, fresh: &[NewItem], now: i64) -> Result<()> {
        let _turn = self.write_turn().await;
        let tx = self.db.begin().await?;
        let mut counts = Counts::default();
        for chunk in fresh.chunks(ROWS_PER_STATEMENT) {
            let models = chunk.iter().map(|item| item::ActiveModel {
                batch_id: Set(batch_id.to_string()),
                item_key: Set(item.key.clone()),
                uri: Set(item.uri.clone()),
                params_json: Set(serde_json::to_string(&item.params).unwrap_or_else(|_| "{}".into())),
                content_sha256: Set(item.sha256.clone()),
                state: Set(PENDING.to_string()),
                published: Set(false),
                round: Set(0),
                attempts: Set(0),
                last_attempt: Set(0),
                exit_code: Set(None),
                reason: Set(String::new()),
                cpu_seconds: Set(0.0),
                peak_memory_bytes: Set(0),
                updated_at_ms: Set(now),
                failures: Set(0),
                failed_delivery: Set(0),
                duration_ms: Set(0),
            });
            // A key another intake added meanwhile is not added again, nor counted.
            let added = item::Entity::insert_many(models)
                .on_conflict(
                    OnConflict::columns([item::Column::BatchId, item::Column::ItemKey])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&tx)
                .await?;
            counts.added(batch_id, added);
        }
        counts.write(&tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Marks items published, in one transaction (see `again_when_ended`).
    async fn mark_published_once(&self, batch_id: &str, keys: &[&String]) -> Result<()> {
        let _turn = self.write_turn().await;
        let tx = self.db.begin().await?;
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            item::Entity::update_many()
                .col_expr(item::Column::Published, Expr::value(true))
                .filter(item::Column::BatchId.eq(batch_id))
                .filter(item::Column::ItemKey.is_in(chunk.iter().map(|key| key.as_str())))
                .exec(&tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Items recorded but not yet on `KILN_ITEMS` (a crash came between), at most `limit`,
    /// by key after `after` (the items of a page are marked published while the next is read).
    pub async fn unpublished(&self, batch_id: &str, after: &str, limit: u64) -> Result<Vec<ItemRecord>> {
        Ok(item::Entity::find()
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::ItemKey.gt(after))
            .filter(item::Column::Published.eq(false))
            .filter(item::Column::State.eq(PENDING))
            .order_by_asc(item::Column::ItemKey)
            .limit(limit)
            .all(&self.db)
            .await?)
    }

    /// The last attempts' figures of up to `limit` of a batch's items with an outcome, how many
    /// have one, and the largest peak memory and wall time among them all.
    pub async fn usage(&self, batch_id: &str, limit: u64) -> Result<(Vec<Measured>, u64, Measured)> {
        let measured = || {
            item::Entity::find()
                .select_only()
                .filter(item::Column::BatchId.eq(batch_id))
                .filter(item::Column::Attempts.gt(0))
        };
        let rows: Vec<(f64, i64, i64)> = measured()
            .column(item::Column::CpuSeconds)
            .column(item::Column::PeakMemoryBytes)
            .column(item::Column::DurationMs)
            .limit(limit)
            .into_tuple()
            .all(&self.db)
            .await?;
        let totals: Option<(i64, Option<i64>, Option<i64>)> = measured()
            .column_as(Expr::col(item::Column::ItemKey).count(), "n")
            .column_as(Expr::col(item::Column::PeakMemoryBytes).max(), "peak")
            .column_as(Expr::col(item::Column::DurationMs).max(), "longest")
            .into_tuple()
            .one(&self.db)
            .await?;
        let positive = |n: i64| u64::try_from(n).unwrap_or(0);
        let sample = rows
            .into_iter()
            .map(|(cpu_seconds, peak, duration)| Measured {
                cpu_seconds,
                peak_memory_bytes: positive(peak),
                duration_ms: positive(duration),
            })
            .collect();
        let (count, peak, longest) = totals.unwrap_or_default();
        let max = Measured {
            cpu_seconds: 0.0,
            peak_memory_bytes: positive(peak.unwrap_or(0)),
            duration_ms: positive(longest.unwrap_or(0)),
        };
        Ok((sample, positive(count), max))
    }

    /// The CPU seconds of a batch's items' last attempts, summed, and their largest peak
    /// memory: read from every row, so served from [`crate::usage::UsageCache`].
    pub async fn figures(&self, batch_id: &str) -> Result<(f64, u64)> {
        let totals: Option<(Option<f64>, Option<i64>)> = item::Entity::find()
            .select_only()
            .column_as(Expr::col(item::Column::CpuSeconds).sum(), "cpu")
            .column_as(Expr::col(item::Column::PeakMemoryBytes).max(), "peak")
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::Attempts.gt(0))
            .into_tuple()
            .one(&self.db)
            .await?;
        let (cpu, peak) = totals.unwrap_or_default();
        Ok((cpu.unwrap_or(0.0), u64::try_from(peak.unwrap_or(0)).unwrap_or(0)))
    }

    /// Whether any item of a batch is unfinished (pending, or waiting for another attempt): one
    /// index probe.
    pub async fn has_backlog(&self, batch_id: &str) -> Result<bool> {
        let found: Option<String> = item::Entity::find()
            .select_only()
            .column(item::Column::ItemKey)
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::State.is_in([PENDING, FAILED]))
            .into_tuple()
            .one(&self.db)
            .await?;
        Ok(found.is_some())
    }

    /// A page of items in key order, after `after`, in any of `states` (all for none).
    pub async fn items(&self, batch_id: &str, states: &[&str], after: &str, limit: u64) -> Result<Vec<ItemRecord>> {
        let mut query = item::Entity::find()
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::ItemKey.gt(after));
        if !states.is_empty() {
            query = query.filter(item::Column::State.is_in(states.iter().copied()));
        }
        Ok(query
            .order_by_asc(item::Column::ItemKey)
            .limit(limit)
            .all(&self.db)
            .await?)
    }

    pub async fn item(&self, batch_id: &str, key: &str) -> Result<Option<ItemRecord>> {
        Ok(item::Entity::find_by_id((batch_id.to_string(), key.to_string()))
            .one(&self.db)
            .await?)
    }

    pub async fn attempts(&self, batch_id: &str, key: &str) -> Result<Vec<attempt::Model>> {
        Ok(attempt::Entity::find()
            .filter(attempt::Column::BatchId.eq(batch_id))
            .filter(attempt::Column::ItemKey.eq(key))
            .order_by_asc(attempt::Column::Round)
            .order_by_asc(attempt::Column::Attempt)
            .all(&self.db)
            .await?)
    }
}
