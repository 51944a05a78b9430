//! The metric store on ScyllaDB. The schema is `migrations/cql/0001_metrics.cql`.
//!
//! Points are partitioned by (job, key, bucket of [`BUCKET_STEPS`] steps); a batch's points are
//! written partition by partition, [`ROWS_PER_BATCH`] rows per unlogged batch, several batches
//! in flight.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{ScyllaConfig, bounded, cql_error, prepare, write_batch};
use crate::error::Result;
use crate::points::{MetricStore, Point, Sampler, Series};

/// Steps per partition.
pub const BUCKET_STEPS: i64 = 100_000;
/// Rows per unlogged batch: about 80 bytes each, well under the batch size warning (128 KiB on
/// ScyllaDB).
pub const ROWS_PER_BATCH: usize = 1000;

/// A point's row: job, key, bucket, step, value, time.
type PointRow<'a> = (&'a str, &'a str, i64, i64, f64, i64);

/// Prepared statements of the store.
struct Statements {
    insert_point: PreparedStatement,
    insert_key: PreparedStatement,
    insert_bucket: PreparedStatement,
    select_keys: PreparedStatement,
    select_buckets: PreparedStatement,
    select_last_bucket: PreparedStatement,
    select_summary: PreparedStatement,
    select_points: PreparedStatement,
    select_last_point: PreparedStatement,
}

/// The metric store on ScyllaDB.
pub struct ScyllaMetricStore {
    session: Arc<Session>,
    statements: Arc<Statements>,
    write_concurrency: usize,
}

impl ScyllaMetricStore {
    /// Prepares the statements on a session [`super::connect`] made.
    pub async fn new(session: Arc<Session>, config: &ScyllaConfig) -> Result<ScyllaMetricStore> {
        let ks = &config.keyspace;
        let prepare = |cql: String| {
            let session = &session;
            async move { prepare(session, cql).await }
        };
        let statements = Statements {
            insert_point: prepare(format!(
                "INSERT INTO {ks}.metric_points (job_id, key, bucket, step, value, ts_ms) VALUES (?, ?, ?, ?, ?, ?)"
            ))
            .await?,
            insert_key: prepare(format!("INSERT INTO {ks}.metric_keys (job_id, key) VALUES (?, ?)")).await?,
            insert_bucket: prepare(format!("INSERT INTO {ks}.metric_buckets (job_id, key, bucket) VALUES (?, ?, ?)")).await?,
            select_keys: prepare(format!("SELECT key FROM {ks}.metric_keys WHERE job_id = ?")).await?,
            select_buckets: prepare(format!(
                "SELECT bucket FROM {ks}.metric_buckets WHERE job_id = ? AND key = ? AND bucket >= ? AND bucket <= ?"
            ))
            .await?,
            select_last_bucket: prepare(format!(
                "SELECT bucket FROM {ks}.metric_buckets WHERE job_id = ? AND key = ? ORDER BY bucket DESC LIMIT 1"
            ))
            .await?,
            select_summary: prepare(format!(
                "SELECT COUNT(*), MIN(step), MAX(step) FROM {ks}.metric_points WHERE job_id = ? AND key = ? AND bucket = ? AND step >= ? AND step <= ?"
            ))
            .await?,
            select_points: {
                let mut statement = prepare(format!(
                    "SELECT step, value, ts_ms FROM {ks}.metric_points WHERE job_id = ? AND key = ? AND bucket = ? AND step >= ? AND step <= ?"
                ))
                .await?;
                statement.set_page_size(5000);
                statement
            },
            select_last_point: prepare(format!(
                "SELECT step, value, ts_ms FROM {ks}.metric_points WHERE job_id = ? AND key = ? AND bucket = ? ORDER BY step DESC LIMIT 1"
            ))
            .await?,
        };
        Ok(ScyllaMetricStore {
            session,
            statements: Arc::new(statements),
            write_concurrency: config.write_concurrency,
        })
    }

    async fn buckets(&self, job_id: &str, key: &str, min_step: i64, max_step: i64) -> Result<Vec<i64>> {
        let values = (
            job_id,
            key,
            min_step.div_euclid(BUCKET_STEPS),
            max_step.div_euclid(BUCKET_STEPS),
        );
        let rows = self
            .session
            .execute_iter(self.statements.select_buckets.clone(), values)
            .await
            .map_err(|e| cql_error("list buckets")(&e))?;
        rows.rows_stream::<(i64,)>()
            .map_err(|e| cql_error("read buckets")(&e))?
            .map_ok(|(bucket,)| bucket)
            .try_collect()
            .await
            .map_err(|e| cql_error("read buckets")(&e))
    }
}

#[async_trait::async_trait]
impl MetricStore for ScyllaMetricStore {
    async fn append(&self, points: Vec<Point>) -> Result<()> {
        let (session, statements) = (&*self.session, &*self.statements);
        // Rows in partition order, then step order: each partition's rows are one run.
        let mut rows: Vec<PointRow<'_>> = points
            .iter()
            .map(|p| {
                (
                    &*p.job_id,
                    &*p.key,
                    p.step.div_euclid(BUCKET_STEPS),
                    p.step,
                    p.value,
                    p.timestamp_ms,
                )
            })
            .collect();
        rows.sort_by(|a, b| (a.0, a.1, a.2, a.3).cmp(&(b.0, b.1, b.2, b.3)));
        let batches: Vec<&[PointRow<'_>]> = rows
            .chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2))
            .flat_map(|partition| partition.chunks(ROWS_PER_BATCH))
            .collect();
        let mut keys: Vec<(&str, &str)> = rows.iter().map(|r| (r.0, r.1)).collect();
        keys.dedup();
        let mut buckets: Vec<(&str, &str, i64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
        buckets.dedup();
        let mut writes = Vec::with_capacity(batches.len());
        for batch in batches {
            writes.push(write_batch(session, &statements.insert_point, batch, "write points"));
        }
        bounded(writes, self.write_concurrency).await?;
        // The series and partitions listed, one batch per partition of the listing tables.
        let mut writes = Vec::new();
        for batch in keys.chunk_by(|a, b| a.0 == b.0) {
            writes.push(write_batch(session, &statements.insert_key, batch, "list a key"));
        }
        bounded(writes, self.write_concurrency).await?;
        let mut writes = Vec::new();
        for batch in buckets.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            writes.push(write_batch(
                session,
                &statements.insert_bucket,
                batch,
                "list a partition",
            ));
        }
        bounded(writes, self.write_concurrency).await?;
        Ok(())
    }

    async fn keys(&self, job_id: &str) -> Result<Vec<String>> {
        let rows = self
            .session
            .execute_iter(self.statements.select_keys.clone(), (job_id,))
            .await
            .map_err(|e| cql_error("list keys")(&e))?;
        rows.rows_stream::<(String,)>()
            .map_err(|e| cql_error("read keys")(&e))?
            .map_ok(|(key,)| key)
            .try_collect()
            .await
            .map_err(|e| cql_error("read keys")(&e))
    }

    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series> {
        let buckets = self.buckets(job_id, key, min_step, max_step).await?;
        let (mut total, mut lo, mut hi) = (0u64, i64::MAX, i64::MIN);
        for &bucket in &buckets {
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.select_summary,
                    (job_id, key, bucket, min_step, max_step),
                )
                .await
                .map_err(|e| cql_error("count points")(&e))?
                .into_rows_result()
                .map_err(|e| cql_error("count points")(&e))?;
            let (count, first, last) = result
                .single_row::<(i64, Option<i64>, Option<i64>)>()
                .map_err(|e| cql_error("count points")(&e))?;
            total += u64::try_from(count).unwrap_or(0);
            lo = lo.min(first.unwrap_or(i64::MAX));
            hi = hi.max(last.unwrap_or(i64::MIN));
        }
        if total == 0 {
            return Ok(Series {
                points: Vec::new(),
                total,
            });
        }
        let mut sampler = Sampler::new(lo, hi, max_points);
        for &bucket in &buckets {
            let rows = self
                .session
                .execute_iter(
                    self.statements.select_points.clone(),
                    (job_id, key, bucket, min_step, max_step),
                )
                .await
                .map_err(|e| cql_error("read points")(&e))?;
            let mut rows = rows
                .rows_stream::<(i64, Option<f64>, i64)>()
                .map_err(|e| cql_error("read points")(&e))?;
            while let Some(row) = rows.next().await {
                let (step, value, timestamp_ms) = row.map_err(|e| cql_error("read points")(&e))?;
                sampler.add(step, value.unwrap_or(f64::NAN), timestamp_ms);
            }
        }
        Ok(sampler.finish(job_id, key))
    }

    async fn latest(&self, job_id: &str, key: &str) -> Result<Option<Point>> {
        let result = self
            .session
            .execute_unpaged(&self.statements.select_last_bucket, (job_id, key))
            .await
            .map_err(|e| cql_error("find the last bucket")(&e))?
            .into_rows_result()
            .map_err(|e| cql_error("find the last bucket")(&e))?;
        let Some((bucket,)) = result
            .maybe_first_row::<(i64,)>()
            .map_err(|e| cql_error("find the last bucket")(&e))?
        else {
            return Ok(None);
        };
        let result = self
            .session
            .execute_unpaged(&self.statements.select_last_point, (job_id, key, bucket))
            .await
            .map_err(|e| cql_error("read the last point")(&e))?
            .into_rows_result()
            .map_err(|e| cql_error("read the last point")(&e))?;
        Ok(result
            .maybe_first_row::<(i64, Option<f64>, i64)>()
            .map_err(|e| cql_error("read the last point")(&e))?
            .map(|(step, value, timestamp_ms)| Point {
                job_id: job_id.into(),
                key: key.into(),
                step,
                value: value.unwrap_or(f64::NAN),
                timestamp_ms,
            }))
    }
}
