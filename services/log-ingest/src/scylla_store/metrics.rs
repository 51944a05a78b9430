//! The metric store on ScyllaDB. The schema is `migrations/cql/0001_metrics.cql`.
//!
//! Points are partitioned by (job, key, bucket of [`BUCKET_STEPS`] steps) and stored in chunks
//! of consecutive steps (see [`chunks`]); a batch's chunks are written partition by partition,
//! a few per unlogged batch, several batches in flight.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::chunks::{self, Chunk, Sample, pack};
use super::{ScyllaConfig, bounded, cql_error, prepare, write_batch};
use crate::error::Result;
use crate::points::{MetricStore, Point, Sampler, Series};

/// Steps per partition.
pub const BUCKET_STEPS: i64 = 100_000;
/// Chunks per unlogged batch: up to 24 KiB each, under the batch size warning (128 KiB on
/// ScyllaDB).
const CHUNKS_PER_BATCH: usize = 4;

/// A chunk's row: job, key, bucket, last step, first step, digest, steps, data.
type ChunkRow<'a> = (&'a str, &'a str, i64, i64, i64, i64, &'a [u8], &'a [u8]);

/// Prepared statements of the store.
struct Statements {
    insert_chunk: PreparedStatement,
    insert_key: PreparedStatement,
    insert_bucket: PreparedStatement,
    select_keys: PreparedStatement,
    select_buckets: PreparedStatement,
    select_last_bucket: PreparedStatement,
    select_steps: PreparedStatement,
    select_chunks: PreparedStatement,
    select_last_chunk: PreparedStatement,
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
        let paged = |mut statement: PreparedStatement, rows: i32| {
            statement.set_page_size(rows);
            statement
        };
        let statements = Statements {
            insert_chunk: prepare(format!(
                "INSERT INTO {ks}.metric_chunks (job_id, key, bucket, last_step, first_step, digest, steps, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
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
            select_steps: paged(
                prepare(format!(
                    "SELECT first_step, steps FROM {ks}.metric_chunks WHERE job_id = ? AND key = ? AND bucket = ? AND last_step >= ?"
                ))
                .await?,
                100,
            ),
            select_chunks: paged(
                prepare(format!(
                    "SELECT first_step, steps, data FROM {ks}.metric_chunks WHERE job_id = ? AND key = ? AND bucket = ? AND last_step >= ?"
                ))
                .await?,
                50,
            ),
            select_last_chunk: prepare(format!(
                "SELECT steps, data FROM {ks}.metric_chunks WHERE job_id = ? AND key = ? AND bucket = ? ORDER BY last_step DESC LIMIT 1"
            ))
            .await?,
        };
        Ok(ScyllaMetricStore {
            session,
            statements: Arc::new(statements),
            write_concurrency: config.write_concurrency,
        })
    }

    /// The rows of a paged query, as a stream.
    async fn rows<R>(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<scylla::client::pager::TypedRowStream<R>>
    where
        R: for<'frame, 'metadata> scylla::deserialize::row::DeserializeRow<'frame, 'metadata> + 'static,
    {
        self.session
            .execute_iter(statement.clone(), values)
            .await
            .map_err(|e| cql_error("read points")(&e))?
            .rows_stream::<R>()
            .map_err(|e| cql_error("read points")(&e))
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
        // Points in partition order, then step order (a stable sort: a repeated step keeps its
        // first point), packed into chunks partition by partition.
        let mut sorted: Vec<&Point> = points.iter().collect();
        sorted.sort_by(|a, b| {
            (&*a.job_id, &*a.key, a.step.div_euclid(BUCKET_STEPS), a.step).cmp(&(
                &*b.job_id,
                &*b.key,
                b.step.div_euclid(BUCKET_STEPS),
                b.step,
            ))
        });
        let mut chunks: Vec<(&str, &str, i64, Chunk)> = Vec::new();
        for partition in sorted.chunk_by(|a, b| {
            (&*a.job_id, &*a.key, a.step.div_euclid(BUCKET_STEPS))
                == (&*b.job_id, &*b.key, b.step.div_euclid(BUCKET_STEPS))
        }) {
            let first = partition[0];
            let bucket = first.step.div_euclid(BUCKET_STEPS);
            let samples: Vec<Sample> = partition.iter().map(|p| (p.step, p.value, p.timestamp_ms)).collect();
            chunks.extend(
                pack(&samples)
                    .into_iter()
                    .map(|chunk| (&*first.job_id, &*first.key, bucket, chunk)),
            );
        }
        let rows: Vec<ChunkRow<'_>> = chunks
            .iter()
            .map(|(job, key, bucket, c)| {
                (
                    *job,
                    *key,
                    *bucket,
                    c.last_step,
                    c.first_step,
                    c.digest,
                    &c.steps[..],
                    &c.data[..],
                )
            })
            .collect();
        let mut writes = Vec::new();
        for partition in rows.chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
            for batch in partition.chunks(CHUNKS_PER_BATCH) {
                writes.push(write_batch(session, &statements.insert_chunk, batch, "write points"));
            }
        }
        bounded(writes, self.write_concurrency).await?;
        // The series and partitions listed, one batch per partition of the listing tables.
        let mut keys: Vec<(&str, &str)> = rows.iter().map(|r| (r.0, r.1)).collect();
        keys.dedup();
        let mut buckets: Vec<(&str, &str, i64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
        buckets.dedup();
        let (mut listed, mut partitions) = (Vec::new(), Vec::new());
        for batch in keys.chunk_by(|a, b| a.0 == b.0) {
            listed.push(write_batch(session, &statements.insert_key, batch, "list a key"));
        }
        for batch in buckets.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            partitions.push(write_batch(
                session,
                &statements.insert_bucket,
                batch,
                "list a partition",
            ));
        }
        let concurrency = self.write_concurrency;
        futures::future::try_join(bounded(listed, concurrency), bounded(partitions, concurrency)).await?;
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
        // First the steps alone, for the sampler's range; then the points, partition by
        // partition, merged and sampled in step order.
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for &bucket in &buckets {
            let mut rows = self
                .rows::<(i64, Vec<u8>)>(&self.statements.select_steps, (job_id, key, bucket, min_step))
                .await?;
            while let Some(row) = rows.next().await {
                let (first_step, packed) = row.map_err(|e| cql_error("read steps")(&e))?;
                if first_step <= max_step {
                    for step in chunks::steps(&packed).filter(|s| (min_step..=max_step).contains(s)) {
                        (lo, hi) = (lo.min(step), hi.max(step));
                    }
                }
            }
        }
        if lo > hi {
            return Ok(Series::empty());
        }
        let mut sampler = Sampler::new(lo, hi, max_points);
        for &bucket in &buckets {
            let mut points: Vec<Sample> = Vec::new();
            let mut rows = self
                .rows::<(i64, Vec<u8>, Vec<u8>)>(&self.statements.select_chunks, (job_id, key, bucket, min_step))
                .await?;
            while let Some(row) = rows.next().await {
                let (first_step, steps, data) = row.map_err(|e| cql_error("read points")(&e))?;
                if first_step <= max_step {
                    points.extend(chunks::samples(&steps, &data).filter(|p| (min_step..=max_step).contains(&p.0)));
                }
            }
            chunks::merge(&mut points);
            for (step, value, timestamp_ms) in points {
                sampler.add(step, value, timestamp_ms);
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
            .execute_unpaged(&self.statements.select_last_chunk, (job_id, key, bucket))
            .await
            .map_err(|e| cql_error("read the last point")(&e))?
            .into_rows_result()
            .map_err(|e| cql_error("read the last point")(&e))?;
        let chunk = result
            .maybe_first_row::<(Vec<u8>, Vec<u8>)>()
            .map_err(|e| cql_error("read the last point")(&e))?;
        Ok(chunk
            .and_then(|(steps, data)| chunks::samples(&steps, &data).last())
            .map(|(step, value, timestamp_ms)| Point {
                job_id: job_id.into(),
                key: key.into(),
                step,
                value,
                timestamp_ms,
            }))
    }
}
