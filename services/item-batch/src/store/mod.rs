//! Batches, items and kept attempts in the metadata database (sea-orm; SQLite or Postgres).
//!
//! An item is keyed by (batch, key) and carries a sha256 of its content, so adding it again is
//! harmless and adding other content under its key is refused. Its state is `pending` until an
//! outcome arrives, then `succeeded`, `failed` (another attempt follows) or `dead`. Outcomes
//! apply once: an outcome only moves an item whose round matches and whose last applied attempt
//! is older, and never moves an item out of `succeeded` or `dead`. The counts by state
//! (`batch_counts`) change in the transaction that adds or moves the items they count, by the
//! rows each statement changed, so they are exact at every read.
//!
//! `entity` declares the four tables; `items` adds, publishes and reads items; `counts` keeps
//! and reads the counts; `outcomes` applies the outcomes of attempts and starts new rounds;
//! this module holds the stored states, the batch rows and the store itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_core::feed::Changes;
use kiln_core::ids::now_ms;
use kiln_core::store::Store;
use kiln_proto::v1 as pb;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

mod counts;
mod entity;
mod items;
mod outcomes;
mod stalls;

pub use batch::Model as BatchRecord;
pub use entity::{attempt, batch, count, item};
pub use item::Model as ItemRecord;
pub use outcomes::Applied;

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

/// Counts of a batch's items by stored state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub total: u64,
    pub pending: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
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

/// Times a transaction Postgres ended (see [`again_when_ended`]) runs again before its error is
/// returned (Unavailable: the caller may try again).
const TRANSIENT_TRIES: u32 = 5;

/// Runs `transaction` (a whole transaction) again when Postgres ended it to break a deadlock or
/// for a serialization failure (nothing of it was kept). Intake marking a page published and
/// the outcomes of that page's items (a fast worker finishes an item before its page is
/// marked) lock the same rows in other orders, as do two replicas; measured on the topology
/// harness, a 100,000-item add failed with Internal before this.
async fn again_when_ended<T, F: Future<Output = Result<T>>>(mut transaction: impl FnMut() -> F) -> Result<T> {
    let mut tries = 0;
    loop {
        match transaction().await {
            Err(Error::Store(error)) if error.is_transient() && tries < TRANSIENT_TRIES => {
                tracing::debug!(error = %error, tries, "running a transaction again that Postgres ended");
                tokio::time::sleep(kiln_core::publish::backoff(tries)).await;
                tries += 1;
            }
            outcome => return outcome,
        }
    }
}

/// The batches of `owner_id` (everyone's for `None`) in `projects`.
fn whose(owner_id: Option<&str>, projects: &kiln_core::authz::Visible) -> sea_orm::Select<batch::Entity> {
    let mut query = batch::Entity::find();
    if let Some(owner_id) = owner_id {
        query = query.filter(batch::Column::OwnerId.eq(owner_id));
    }
    if let kiln_core::authz::Visible::Only(projects) = projects {
        query = query.filter(batch::Column::Project.is_in(projects.iter().cloned()));
    }
    query
}

/// The batch tables, over the metadata store's connection.
#[derive(Clone)]
pub struct BatchStore {
    db: DatabaseConnection,
    /// On SQLite, item-batch's bulk writes (intake, outcomes) take turns here. SQLite has one
    /// writer; a second that finds the file locked sleeps in its busy handler (1, 2, 5, …,
    /// 100 ms) and tries again, so two bulk writers left to SQLite idle the machine between
    /// them (measured: an intake's 60 ms update waited up to 1.6 s beside the outcomes'
    /// transactions). Queued here they follow one another at once. Postgres locks rows.
    writes: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Whom each committed change of a batch is told (WatchBatches).
    changes: Changes,
}

impl BatchStore {
    pub fn new(store: &Store) -> BatchStore {
        let db = store.connection().clone();
        let writes = (db.get_database_backend() == sea_orm::DbBackend::Sqlite).then(Default::default);
        BatchStore {
            db,
            writes,
            changes: Changes::default(),
        }
    }

    /// Tells `changes` the batches each write changed.
    pub fn telling(self, changes: Changes) -> BatchStore {
        BatchStore { changes, ..self }
    }

    /// Tells the watchers of batches that `batch_id` changed (a figure of it that is not kept
    /// in its tables: workers, items in flight, the rate).
    pub fn touch(&self, batch_id: &str) {
        self.changes.touch(batch_id);
    }

    /// A turn at writing (see `writes`): held for one bulk transaction.
    async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.writes {
            Some(writes) => Some(writes.lock().await),
            None => None,
        }
    }

    pub async fn insert_batch(&self, record: BatchRecord) -> Result<()> {
        let id = record.id.clone();
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
            stalled_reason: Set(record.stalled_reason),
            worker_failures_since_ms: Set(record.worker_failures_since_ms),
            paused_reason: Set(record.paused_reason),
        };
        batch::Entity::insert(model).exec_without_returning(&self.db).await?;
        self.changes.touch(&id);
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
    /// Batches newest first: of `owner_id` when given, in the visible projects, live ones
    /// unless `all`.
    pub async fn list_batches(
        &self,
        owner_id: Option<&str>,
        projects: &kiln_core::authz::Visible,
        all: bool,
    ) -> Result<Vec<BatchRecord>> {
        let mut query = whose(owner_id, projects);
        if !all {
            query = query.filter(batch::Column::State.is_in([OPEN, SEALED]));
        }
        Ok(query.order_by_desc(batch::Column::Id).limit(1000).all(&self.db).await?)
    }

    /// Those of `batch_ids` that [`BatchStore::list_batches`] could list, whatever their state.
    pub async fn changed_batches(
        &self,
        batch_ids: &[String],
        owner_id: Option<&str>,
        projects: &kiln_core::authz::Visible,
    ) -> Result<Vec<BatchRecord>> {
        let mut changed = Vec::with_capacity(batch_ids.len());
        for chunk in batch_ids.chunks(500) {
            let query = whose(owner_id, projects).filter(batch::Column::Id.is_in(chunk.iter().cloned()));
            changed.extend(query.order_by_desc(batch::Column::Id).all(&self.db).await?);
        }
        Ok(changed)
    }

    /// Counts the batches by state (for `kiln_item_batch_batches`).
    pub async fn count_batches(&self) -> Result<Vec<(String, i64)>> {
        Ok(batch::Entity::find()
            .select_only()
            .column(batch::Column::State)
            .column_as(Expr::col(batch::Column::Id).count(), "n")
            .group_by(batch::Column::State)
            .into_tuple()
            .all(&self.db)
            .await?)
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
        let moved = update.exec(&self.db).await?.rows_affected == 1;
        if moved {
            self.changes.touch(batch_id);
        }
        Ok(moved)
    }
}
