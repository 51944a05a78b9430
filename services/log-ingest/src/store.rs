//! Where log lines are kept: [`LogStore`], and its embedded SQLite implementation (the ScyllaDB
//! one is `scylla_store::ScyllaLogStore`; `tests/log_store.rs` runs the same suite on both).
//! Jobs' lines and batch items' kept lines ([`crate::item_lines`]) share the store.
//!
//! Lines are keyed by (job, attempt, seq), where seq is the line's sequence in the `KILN_LOGS`
//! stream: writing a line again changes nothing, so JetStream redelivery never duplicates a line,
//! and lines of several writers (the runner, WriteLogs) interleave in arrival order.

use std::path::Path;

use kiln_core::config::{DatabaseConfig, DatabaseUrl};
use kiln_core::store::Store;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value};

use crate::error::Result;
use crate::item_lines::{Found, ItemLine, ItemSearch};

/// One stored line; `end` marks the last record of an attempt (its text is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLine {
    pub job_id: String,
    pub attempt: i32,
    pub seq: i64,
    pub stream: i32,
    pub timestamp_ms: i64,
    pub text: String,
    pub end: bool,
}

/// Position after which to read: (attempt, seq); the default reads from the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub attempt: i32,
    pub seq: i64,
}

/// A store of log lines.
#[async_trait::async_trait]
pub trait LogStore: Send + Sync + 'static {
    /// Stores lines; lines already stored are left as they are.
    async fn append(&self, lines: &[StoredLine]) -> Result<()>;
    /// Returns up to `limit` lines of a job after `after`, in (attempt, seq) order.
    async fn read(&self, job_id: &str, after: Cursor, limit: u32) -> Result<Vec<StoredLine>>;
    /// The cursor to read a job's last `lines` lines from (end markers do not count).
    async fn tail_cursor(&self, job_id: &str, lines: u32) -> Result<Cursor>;
    /// Stores batch items' lines; lines already stored are left as they are.
    async fn append_item_lines(&self, lines: &[ItemLine]) -> Result<()>;
    /// The lines of a batch's items that match, in (item key, attempt, line) order.
    async fn search_item_lines(&self, search: &ItemSearch) -> Result<Found>;
}

/// Rows per INSERT statement (under 10 parameters each, well under SQLite's limit).
const ROWS_PER_STATEMENT: usize = 500;

/// Inserts rows of `N` values into `table` (its name and columns, as `t (a, b)`) in one
/// transaction, [`ROWS_PER_STATEMENT`] a statement, leaving the rows already there as they are.
pub(crate) async fn insert_new_rows<const N: usize>(
    db: &DatabaseConnection,
    table: &str,
    rows: Vec<[Value; N]>,
) -> Result<()> {
    let row = format!("({})", vec!["?"; N].join(", "));
    let tx = db.begin().await?;
    let mut rows = rows.into_iter();
    loop {
        let chunk: Vec<[Value; N]> = rows.by_ref().take(ROWS_PER_STATEMENT).collect();
        if chunk.is_empty() {
            break;
        }
        let placeholders = vec![row.as_str(); chunk.len()].join(", ");
        let sql = format!("INSERT INTO {table} VALUES {placeholders} ON CONFLICT DO NOTHING");
        let values: Vec<Value> = chunk.into_iter().flatten().collect();
        tx.execute_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The embedded log store: one SQLite file in WAL mode, one transaction per batch.
pub struct SqliteLogStore {
    db: DatabaseConnection,
}

/// Opens (creating it and its directory) an embedded SQLite store file in WAL mode, the way the
/// metadata store opens its own.
pub(crate) async fn open_sqlite(path: &Path) -> Result<DatabaseConnection> {
    let config = DatabaseConfig {
        url: DatabaseUrl::new(format!("sqlite://{}?mode=rwc", path.display())),
        max_connections: 8,
    };
    Ok(Store::connect(&config).await?.connection().clone())
}

impl SqliteLogStore {
    pub async fn open(path: &Path) -> Result<SqliteLogStore> {
        let db = open_sqlite(path).await?;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS log_lines (
                job_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                stream INTEGER NOT NULL,
                ts_ms INTEGER NOT NULL,
                text TEXT NOT NULL,
                is_end INTEGER NOT NULL,
                PRIMARY KEY (job_id, attempt, seq)
            ) WITHOUT ROWID",
        )
        .await?;
        db.execute_unprepared(crate::item_lines::SQLITE_TABLE).await?;
        Ok(SqliteLogStore { db })
    }
}

#[async_trait::async_trait]
impl LogStore for SqliteLogStore {
    async fn append(&self, lines: &[StoredLine]) -> Result<()> {
        let rows = lines
            .iter()
            .map(|line| {
                [
                    line.job_id.clone().into(),
                    line.attempt.into(),
                    line.seq.into(),
                    line.stream.into(),
                    line.timestamp_ms.into(),
                    line.text.clone().into(),
                    line.end.into(),
                ]
            })
            .collect();
        insert_new_rows(
            &self.db,
            "log_lines (job_id, attempt, seq, stream, ts_ms, text, is_end)",
            rows,
        )
        .await
    }

    async fn read(&self, job_id: &str, after: Cursor, limit: u32) -> Result<Vec<StoredLine>> {
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "SELECT job_id, attempt, seq, stream, ts_ms, text, is_end FROM log_lines
             WHERE job_id = ? AND (attempt > ? OR (attempt = ? AND seq > ?))
             ORDER BY attempt, seq LIMIT ?",
            [
                job_id.into(),
                after.attempt.into(),
                after.attempt.into(),
                after.seq.into(),
                i64::from(limit).into(),
            ],
        );
        let rows = self.db.query_all_raw(statement).await?;
        rows.iter()
            .map(|row| {
                Ok(StoredLine {
                    job_id: row.try_get("", "job_id")?,
                    attempt: row.try_get("", "attempt")?,
                    seq: row.try_get("", "seq")?,
                    stream: row.try_get("", "stream")?,
                    timestamp_ms: row.try_get("", "ts_ms")?,
                    text: row.try_get("", "text")?,
                    end: row.try_get("", "is_end")?,
                })
            })
            .collect()
    }

    async fn tail_cursor(&self, job_id: &str, lines: u32) -> Result<Cursor> {
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "SELECT attempt, seq FROM log_lines WHERE job_id = ? AND is_end = 0
             ORDER BY attempt DESC, seq DESC LIMIT 1 OFFSET ?",
            [job_id.into(), i64::from(lines).into()],
        );
        match self.db.query_one_raw(statement).await? {
            Some(row) => Ok(Cursor {
                attempt: row.try_get("", "attempt")?,
                seq: row.try_get("", "seq")?,
            }),
            None => Ok(Cursor::default()),
        }
    }

    async fn append_item_lines(&self, lines: &[ItemLine]) -> Result<()> {
        crate::item_lines::sqlite_append(&self.db, lines).await
    }

    async fn search_item_lines(&self, search: &ItemSearch) -> Result<Found> {
        crate::item_lines::sqlite_search(&self.db, search).await
    }
}
