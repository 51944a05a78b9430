//! The log store on ScyllaDB, shared by every log-ingest replica. The schema is
//! `migrations/cql/0002_logs.cql`.
//!
//! Lines are partitioned by (job, attempt, bucket of [`LOG_BUCKET_SEQS`] stream sequences), and
//! `log_buckets` lists a job's partitions in (attempt, bucket) order. Readers must never see a
//! line before an earlier one of the same writer's batch (a follower's cursor would step over
//! it, and an end record seen early would end the follow): so the lines of one job are written
//! in (attempt, seq) order, one isolated single-partition batch after the other, after their
//! partitions are listed; different jobs are written concurrently.

use std::sync::Arc;

use futures::StreamExt;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::item_lines::{self, ItemStatements};
use super::{ScyllaConfig, bounded, cql_error, prepare, write_batch};
use crate::error::Result;
use crate::item_lines::{Found, ItemLine, ItemSearch};
use crate::store::{Cursor, LogStore, StoredLine};

/// Stream sequences per partition: no partition holds more lines than this.
pub const LOG_BUCKET_SEQS: i64 = 20_000;
/// Most lines, and most bytes of text, per unlogged batch (ScyllaDB warns above 128 KiB).
const LINES_PER_BATCH: usize = 500;
const TEXT_BYTES_PER_BATCH: usize = 96 << 10;

/// A line's row: job, attempt, bucket, seq, stream, time, text, end.
type LineRow<'a> = (&'a str, i32, i64, i64, i32, i64, &'a str, bool);

struct Statements {
    insert_line: PreparedStatement,
    insert_bucket: PreparedStatement,
    select_buckets_after: PreparedStatement,
    select_buckets_desc: PreparedStatement,
    select_lines: PreparedStatement,
    select_seqs_desc: PreparedStatement,
}

/// The log store on ScyllaDB.
pub struct ScyllaLogStore {
    session: Arc<Session>,
    statements: Statements,
    items: ItemStatements,
    write_concurrency: usize,
}

fn bucket_of(seq: i64) -> i64 {
    seq.div_euclid(LOG_BUCKET_SEQS)
}

impl ScyllaLogStore {
    /// The (attempt, bucket) partitions a job's log lines lie in, as `statement` lists them.
    async fn partitions(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<impl futures::Stream<Item = Result<(i32, i64)>> + Unpin> {
        let pages = self
            .session
            .execute_iter(statement.clone(), values)
            .await
            .map_err(|e| cql_error("list log partitions")(&e))?;
        let rows = pages
            .rows_stream::<(i32, i64)>()
            .map_err(|e| cql_error("list log partitions")(&e))?;
        Ok(rows.map(|row| row.map_err(|e| cql_error("list log partitions")(&e))))
    }

    /// Prepares the statements on a session [`super::connect`] made.
    pub async fn new(session: Arc<Session>, config: &ScyllaConfig) -> Result<ScyllaLogStore> {
        let ks = &config.keyspace;
        let columns = "seq, stream, ts_ms, text, is_end";
        let paged = |mut statement: PreparedStatement, rows: i32| {
            statement.set_page_size(rows);
            statement
        };
        let statements = Statements {
            insert_line: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.log_lines (job_id, attempt, bucket, seq, stream, ts_ms, text, is_end) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                ),
            )
            .await?,
            insert_bucket: prepare(
                &session,
                format!("INSERT INTO {ks}.log_buckets (job_id, attempt, bucket) VALUES (?, ?, ?)"),
            )
            .await?,
            select_buckets_after: paged(
                prepare(
                    &session,
                    format!(
                        "SELECT attempt, bucket FROM {ks}.log_buckets WHERE job_id = ? AND (attempt, bucket) >= (?, ?)"
                    ),
                )
                .await?,
                100,
            ),
            select_buckets_desc: paged(
                prepare(
                    &session,
                    format!(
                        "SELECT attempt, bucket FROM {ks}.log_buckets WHERE job_id = ? ORDER BY attempt DESC, bucket DESC"
                    ),
                )
                .await?,
                100,
            ),
            select_lines: prepare(
                &session,
                format!(
                    "SELECT {columns} FROM {ks}.log_lines WHERE job_id = ? AND attempt = ? AND bucket = ? AND seq > ? LIMIT ?"
                ),
            )
            .await?,
            select_seqs_desc: paged(
                prepare(
                    &session,
                    format!(
                        "SELECT seq, is_end FROM {ks}.log_lines WHERE job_id = ? AND attempt = ? AND bucket = ? ORDER BY seq DESC"
                    ),
                )
                .await?,
                5000,
            ),
        };
        let items = ItemStatements::prepare(&session, ks).await?;
        Ok(ScyllaLogStore {
            session,
            statements,
            items,
            write_concurrency: config.write_concurrency,
        })
    }

    /// Writes one job's rows (in (attempt, seq) order): its partitions listed, then its lines in
    /// order, one batch at a time.
    async fn append_job(&self, rows: &[LineRow<'_>]) -> Result<()> {
        let session = &*self.session;
        let mut partitions: Vec<(&str, i32, i64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
        partitions.dedup();
        write_batch(
            session,
            &self.statements.insert_bucket,
            &partitions,
            "list a log partition",
        )
        .await?;
        for partition in rows.chunk_by(|a, b| (a.1, a.2) == (b.1, b.2)) {
            let mut rest = partition;
            while !rest.is_empty() {
                let mut bytes = 0;
                let n = rest
                    .iter()
                    .take(LINES_PER_BATCH)
                    .take_while(|row| {
                        bytes += row.6.len();
                        bytes <= TEXT_BYTES_PER_BATCH
                    })
                    .count()
                    .max(1);
                let (batch, after) = rest.split_at(n);
                write_batch(session, &self.statements.insert_line, batch, "write log lines").await?;
                rest = after;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl LogStore for ScyllaLogStore {
    async fn append(&self, lines: &[StoredLine]) -> Result<()> {
        let mut rows: Vec<LineRow<'_>> = lines
            .iter()
            .map(|l| {
                let bucket = bucket_of(l.seq);
                (
                    &*l.job_id,
                    l.attempt,
                    bucket,
                    l.seq,
                    l.stream,
                    l.timestamp_ms,
                    &*l.text,
                    l.end,
                )
            })
            .collect();
        rows.sort_by(|a, b| (a.0, a.1, a.3).cmp(&(b.0, b.1, b.3)));
        rows.dedup_by(|a, b| (a.0, a.1, a.3) == (b.0, b.1, b.3));
        let mut writes = Vec::new();
        for job in rows.chunk_by(|a, b| a.0 == b.0) {
            writes.push(self.append_job(job));
        }
        bounded(writes, self.write_concurrency).await
    }

    async fn read(&self, job_id: &str, after: Cursor, limit: u32) -> Result<Vec<StoredLine>> {
        let mut lines = Vec::new();
        let mut buckets = self
            .partitions(
                &self.statements.select_buckets_after,
                (job_id, after.attempt, bucket_of(after.seq)),
            )
            .await?;
        while let Some(bucket) = buckets.next().await {
            let (attempt, bucket) = bucket?;
            let wanted = i32::try_from(limit as usize - lines.len()).unwrap_or(i32::MAX);
            let from = if attempt == after.attempt { after.seq } else { i64::MIN };
            let result = self
                .session
                .execute_unpaged(&self.statements.select_lines, (job_id, attempt, bucket, from, wanted))
                .await
                .map_err(|e| cql_error("read log lines")(&e))?
                .into_rows_result()
                .map_err(|e| cql_error("read log lines")(&e))?;
            for row in result
                .rows::<(i64, i32, i64, String, bool)>()
                .map_err(|e| cql_error("read log lines")(&e))?
            {
                let (seq, stream, timestamp_ms, text, end) = row.map_err(|e| cql_error("read log lines")(&e))?;
                lines.push(StoredLine {
                    job_id: job_id.to_string(),
                    attempt,
                    seq,
                    stream,
                    timestamp_ms,
                    text,
                    end,
                });
            }
            if lines.len() >= limit as usize {
                break;
            }
        }
        Ok(lines)
    }

    async fn tail_cursor(&self, job_id: &str, lines: u32) -> Result<Cursor> {
        // Newest first: the line before the last `lines` ones (end records skipped) is the cursor.
        let mut seen: u32 = 0;
        let mut buckets = self.partitions(&self.statements.select_buckets_desc, (job_id,)).await?;
        while let Some(bucket) = buckets.next().await {
            let (attempt, bucket) = bucket?;
            let rows = self
                .session
                .execute_iter(self.statements.select_seqs_desc.clone(), (job_id, attempt, bucket))
                .await
                .map_err(|e| cql_error("read log lines")(&e))?;
            let mut rows = rows
                .rows_stream::<(i64, bool)>()
                .map_err(|e| cql_error("read log lines")(&e))?;
            while let Some(row) = rows.next().await {
                let (seq, end) = row.map_err(|e| cql_error("read log lines")(&e))?;
                if end {
                    continue;
                }
                if seen == lines {
                    return Ok(Cursor { attempt, seq });
                }
                seen += 1;
            }
        }
        Ok(Cursor::default())
    }

    async fn append_item_lines(&self, lines: &[ItemLine]) -> Result<()> {
        item_lines::append(&self.session, &self.items, lines, self.write_concurrency).await
    }

    async fn search_item_lines(&self, search: &ItemSearch) -> Result<Found> {
        item_lines::search(&self.session, &self.items, search).await
    }
}
