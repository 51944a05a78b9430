//! What services other than item-batch (which owns the batch tables) read of a batch: the
//! project and owner a call that names it is checked against (log-ingest's search of the
//! items' lines).

use sea_orm::ConnectionTrait;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};

use super::{Store, StoreResult};

/// A batch as an authorisation rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchScope {
    pub id: String,
    pub project: String,
    pub owner_id: String,
}

impl Store {
    /// The project and owner of a batch; none when there is no such batch.
    pub async fn batch_scope(&self, batch_id: &str) -> StoreResult<Option<BatchScope>> {
        let query = Query::select()
            .columns([Alias::new("id"), Alias::new("project"), Alias::new("owner_id")])
            .from(Alias::new("batches"))
            .and_where(Expr::col(Alias::new("id")).eq(batch_id))
            .to_owned();
        let statement = self.db.get_database_backend().build(&query);
        let Some(row) = self.db.query_one_raw(statement).await? else {
            return Ok(None);
        };
        Ok(Some(BatchScope {
            id: row.try_get("", "id")?,
            project: row.try_get("", "project")?,
            owner_id: row.try_get("", "owner_id")?,
        }))
    }
}
