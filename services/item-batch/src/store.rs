//! Batches, items and kept attempts in the metadata database (sea-orm; SQLite or Postgres).
//!
//! An item is keyed by (batch, key) and carries a sha256 of its content, so adding it again is
//! harmless and adding other content under its key is refused. Its state is `pending` until an
//! outcome arrives, then `succeeded`, `failed` (another attempt follows) or `dead`. Outcomes
//! apply once: an outcome only moves an item whose round matches and whose last applied attempt
//! is older, and never moves an item out of `succeeded` or `dead`. The counters are counts of
//! these rows, so they are exact by construction.

use std::collections::{BTreeMap, HashMap};

use kiln_core::ids::now_ms;
use kiln_core::store::Store;
use kiln_proto::v1 as pb;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionTrait,
};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub mod batch {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "batches")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub owner_id: String,
        pub project: String,
        pub name: String,
        pub spec_json: String,
        pub state: String,
        pub created_at_ms: i64,
        pub sealed_at_ms: Option<i64>,
        pub finished_at_ms: Option<i64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod item {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
    #[sea_orm(table_name = "batch_items")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub batch_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub item_key: String,
        pub uri: String,
        pub params_json: String,
        pub content_sha256: String,
        pub state: String,
        pub published: bool,
        pub round: i32,
        pub attempts: i32,
        pub last_attempt: i32,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub cpu_seconds: f64,
        pub peak_memory_bytes: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod attempt {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "item_attempts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub batch_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub item_key: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub attempt: i32,
        pub round: i32,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub lines_json: String,
        pub finished_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub use batch::Model as BatchRecord;
pub use item::Model as ItemRecord;

/// Item states as stored.
pub const PENDING: &str = "pending";
pub const SUCCEEDED: &str = "succeeded";
pub const FAILED: &str = "failed";
pub const DEAD: &str = "dead";

/// Batch states as stored.
pub const OPEN: &str = "open";
pub const SEALED: &str = "sealed";
pub const DONE: &str = "done";
pub const CANCELLED: &str = "cancelled";

pub fn item_state_name(state: pb::ItemState) -> Option<&'static str> {
    match state {
        pb::ItemState::Pending => Some(PENDING),
        pb::ItemState::Succeeded => Some(SUCCEEDED),
        pb::ItemState::Failed => Some(FAILED),
        pb::ItemState::Dead => Some(DEAD),
        pb::ItemState::Unspecified => None,
    }
}

pub fn item_state_proto(state: &str) -> pb::ItemState {
    match state {
        PENDING => pb::ItemState::Pending,
        SUCCEEDED => pb::ItemState::Succeeded,
        FAILED => pb::ItemState::Failed,
        DEAD => pb::ItemState::Dead,
        _ => pb::ItemState::Unspecified,
    }
}

pub fn batch_state_proto(state: &str) -> pb::BatchState {
    match state {
        OPEN => pb::BatchState::Open,
        SEALED => pb::BatchState::Sealed,
        DONE => pb::BatchState::Done,
        CANCELLED => pb::BatchState::Cancelled,
        _ => pb::BatchState::Unspecified,
    }
}

/// An item as added: its key, URI, parameters and content digest.
#[derive(Debug, Clone)]
pub struct NewItem {
    pub key: String,
    pub uri: String,
    pub params: BTreeMap<String, String>,
    pub sha256: String,
}

impl NewItem {
    pub fn new(key: String, uri: String, params: BTreeMap<String, String>) -> NewItem {
        let mut digest = Sha256::new();
        digest.update(uri.as_bytes());
        for (name, value) in &params {
            digest.update([0]);
            digest.update(name.as_bytes());
            digest.update([0]);
            digest.update(value.as_bytes());
        }
        NewItem {
            key,
            uri,
            params,
            sha256: hex::encode(digest.finalize()),
        }
    }
}

/// Counts of a batch's items by stored state, and what their attempts used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    pub total: u64,
    pub pending: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub cpu_seconds: f64,
    pub peak_memory_bytes: u64,
}

impl Tally {
    /// Items not finished (pending or waiting for another attempt).
    pub fn backlog(&self) -> u64 {
        self.pending + self.failed
    }

    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead
    }
}

/// Rows per bulk statement (a dozen parameters each, under every database's limit).
const ROWS_PER_STATEMENT: usize = 500;

/// The batch tables, over the metadata store's connection.
#[derive(Clone)]
pub struct BatchStore {
    db: DatabaseConnection,
}

impl BatchStore {
    pub fn new(store: &Store) -> BatchStore {
        BatchStore {
            db: store.connection().clone(),
        }
    }

    pub async fn insert_batch(&self, record: BatchRecord) -> Result<()> {
        let model = batch::ActiveModel {
            id: Set(record.id),
            owner_id: Set(record.owner_id),
            project: Set(record.project),
            name: Set(record.name),
            spec_json: Set(record.spec_json),
            state: Set(record.state),
            created_at_ms: Set(record.created_at_ms),
            sealed_at_ms: Set(record.sealed_at_ms),
            finished_at_ms: Set(record.finished_at_ms),
        };
        batch::Entity::insert(model).exec_without_returning(&self.db).await?;
        Ok(())
    }

    pub async fn batch(&self, batch_id: &str) -> Result<BatchRecord> {
        batch::Entity::find_by_id(batch_id.to_string())
            .one(&self.db)
            .await?
            .ok_or_else(|| Error::BatchNotFound {
                batch_id: batch_id.to_string(),
            })
    }

    /// Batches, newest first: one owner's (or everyone's for `None`), live ones only unless `all`.
    pub async fn list_batches(&self, owner_id: Option<&str>, all: bool) -> Result<Vec<BatchRecord>> {
        let mut query = batch::Entity::find();
        if let Some(owner_id) = owner_id {
            query = query.filter(batch::Column::OwnerId.eq(owner_id));
        }
        if !all {
            query = query.filter(batch::Column::State.is_in([OPEN, SEALED]));
        }
        Ok(query.order_by_desc(batch::Column::Id).limit(1000).all(&self.db).await?)
    }

    /// Moves a batch from one of `from` to `to` (a compare-and-set); false when it was in no
    /// state of `from`.
    pub async fn set_batch_state(&self, batch_id: &str, from: &[&str], to: &str) -> Result<bool> {
        let now = now_ms();
        let mut update = batch::Entity::update_many()
            .col_expr(batch::Column::State, Expr::value(to))
            .filter(batch::Column::Id.eq(batch_id))
            .filter(batch::Column::State.is_in(from.iter().copied()));
        if to == SEALED {
            update = update.col_expr(batch::Column::SealedAtMs, Expr::value(now));
        }
        if to == DONE || to == CANCELLED {
            update = update.col_expr(batch::Column::FinishedAtMs, Expr::value(now));
        }
        Ok(update.exec(&self.db).await?.rows_affected == 1)
    }

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
        let tx = self.db.begin().await?;
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
            });
            item::Entity::insert_many(models)
                .on_conflict(
                    OnConflict::columns([item::Column::BatchId, item::Column::ItemKey])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&tx)
                .await?;
        }
        tx.commit().await?;
        Ok((fresh, duplicates))
    }

    /// Records that items are on `KILN_ITEMS`.
    pub async fn mark_published(&self, batch_id: &str, keys: &[String]) -> Result<()> {
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            item::Entity::update_many()
                .col_expr(item::Column::Published, Expr::value(true))
                .filter(item::Column::BatchId.eq(batch_id))
                .filter(item::Column::ItemKey.is_in(chunk.iter().cloned()))
                .exec(&self.db)
                .await?;
        }
        Ok(())
    }

    /// Items recorded but not yet on `KILN_ITEMS` (a crash came between), at most `limit`.
    pub async fn unpublished(&self, batch_id: &str, limit: u64) -> Result<Vec<ItemRecord>> {
        Ok(item::Entity::find()
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::Published.eq(false))
            .filter(item::Column::State.eq(PENDING))
            .order_by_asc(item::Column::ItemKey)
            .limit(limit)
            .all(&self.db)
            .await?)
    }

    pub async fn tally(&self, batch_id: &str) -> Result<Tally> {
        let rows: Vec<(String, i64, Option<f64>, Option<i64>)> = item::Entity::find()
            .select_only()
            .column(item::Column::State)
            .column_as(Expr::col(item::Column::ItemKey).count(), "n")
            .column_as(Expr::col(item::Column::CpuSeconds).sum(), "cpu")
            .column_as(Expr::col(item::Column::PeakMemoryBytes).max(), "peak")
            .filter(item::Column::BatchId.eq(batch_id))
            .group_by(item::Column::State)
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut tally = Tally::default();
        for (state, n, cpu, peak) in rows {
            let n = u64::try_from(n).unwrap_or(0);
            tally.total += n;
            tally.cpu_seconds += cpu.unwrap_or(0.0);
            tally.peak_memory_bytes = Ord::max(tally.peak_memory_bytes, u64::try_from(peak.unwrap_or(0)).unwrap_or(0));
            match state.as_str() {
                PENDING => tally.pending += n,
                SUCCEEDED => tally.succeeded += n,
                FAILED => tally.failed += n,
                DEAD => tally.dead += n,
                _ => {}
            }
        }
        Ok(tally)
    }

    /// Whether any item of a batch is unfinished (pending, or waiting for another attempt): one
    /// index probe, where [`BatchStore::tally`] counts every row.
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

    /// Applies outcomes in one transaction (see the module's note on applying once).
    pub async fn apply_results(&self, results: &[pb::ItemResult]) -> Result<()> {
        let now = now_ms();
        let tx = self.db.begin().await?;
        for result in results {
            let Some(state) = pb::ItemState::try_from(result.state).ok().and_then(item_state_name) else {
                tracing::warn!(key = %result.key, state = result.state, "dropping an outcome without a state");
                continue;
            };
            let round = i32::try_from(result.round).unwrap_or(i32::MAX);
            let attempt = i32::try_from(result.attempt).unwrap_or(i32::MAX);
            item::Entity::update_many()
                .col_expr(item::Column::State, Expr::value(state))
                .col_expr(item::Column::Attempts, Expr::col(item::Column::Attempts).add(1))
                .col_expr(item::Column::LastAttempt, Expr::value(attempt))
                .col_expr(item::Column::ExitCode, Expr::value(result.exit_code))
                .col_expr(item::Column::Reason, Expr::value(result.reason.clone()))
                .col_expr(
                    item::Column::CpuSeconds,
                    Expr::col(item::Column::CpuSeconds).add(result.cpu_seconds),
                )
                .col_expr(
                    item::Column::PeakMemoryBytes,
                    Expr::value(i64::try_from(result.peak_memory_bytes).unwrap_or(i64::MAX)),
                )
                .col_expr(item::Column::UpdatedAtMs, Expr::value(now))
                .filter(item::Column::BatchId.eq(&result.batch_id))
                .filter(item::Column::ItemKey.eq(&result.key))
                .filter(item::Column::Round.eq(round))
                .filter(item::Column::LastAttempt.lt(attempt))
                .filter(item::Column::State.is_not_in([SUCCEEDED, DEAD]))
                .exec(&tx)
                .await?;
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
        Ok(())
    }

    /// Gives the dead items of a batch a new round of attempts; they are published again.
    pub async fn retry_dead(&self, batch_id: &str) -> Result<u64> {
        let result = item::Entity::update_many()
            .col_expr(item::Column::State, Expr::value(PENDING))
            .col_expr(item::Column::Round, Expr::col(item::Column::Round).add(1))
            .col_expr(item::Column::LastAttempt, Expr::value(0))
            .col_expr(item::Column::Published, Expr::value(false))
            .col_expr(item::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(item::Column::BatchId.eq(batch_id))
            .filter(item::Column::State.eq(DEAD))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected)
    }
}
