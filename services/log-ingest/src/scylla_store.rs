//! The production metric store: ScyllaDB through the `scylla` driver (token-aware routing by
//! default), with prepared statements, bounded write concurrency and a retry on failed writes.
//! The schema is `migrations/cql/0001_metrics.cql`. Tests run it against Apache Cassandra 5,
//! which speaks the same CQL.
//!
//! Points are partitioned by (job, key, bucket of [`BUCKET_STEPS`] steps). Writing a point again
//! overwrites it with the same value, so redelivery never duplicates one.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::prepared::PreparedStatement;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::points::{MetricStore, Point, Sampler, Series};

/// Steps per partition.
pub const BUCKET_STEPS: i64 = 100_000;

/// Where the ScyllaDB cluster is, and how the metric tables are made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ScyllaConfig {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    pub keyspace: String,
    pub replication_factor: u32,
    /// Points expire after this many seconds; 0 keeps them.
    pub ttl_secs: u64,
    /// Writes in flight at once, at most.
    pub write_concurrency: usize,
}

impl Default for ScyllaConfig {
    fn default() -> Self {
        ScyllaConfig {
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "kiln".into(),
            replication_factor: 1,
            ttl_secs: 0,
            write_concurrency: 256,
        }
    }
}

impl ScyllaConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        if self.nodes.is_empty() {
            problems.push("scylla.nodes must name at least one node".into());
        }
        let valid_keyspace = !self.keyspace.is_empty()
            && self.keyspace.len() <= 48
            && self.keyspace.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !self.keyspace.starts_with('_');
        if !valid_keyspace {
            problems.push(format!(
                "scylla.keyspace {:?} must be 1 to 48 letters, digits or '_'",
                self.keyspace
            ));
        }
        if self.write_concurrency == 0 {
            problems.push("scylla.write-concurrency must be at least 1".into());
        }
    }
}

fn cql_error(what: &str) -> impl FnOnce(&dyn std::fmt::Display) -> Error + '_ {
    move |error| Error::LogStore(format!("scylla: cannot {what}: {error}"))
}

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
    /// Connects, applies the CQL schema, and prepares the statements.
    pub async fn open(config: &ScyllaConfig) -> Result<ScyllaMetricStore> {
        let session = SessionBuilder::new()
            .known_nodes(&config.nodes)
            .build()
            .await
            .map_err(|e| cql_error("connect")(&e))?;
        let schema = include_str!("../../../migrations/cql/0001_metrics.cql")
            .replace("${keyspace}", &config.keyspace)
            .replace("${replication}", &config.replication_factor.to_string())
            .replace("${ttl}", &config.ttl_secs.to_string());
        let statements: Vec<String> = schema
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        for statement in statements {
            session
                .query_unpaged(statement, ())
                .await
                .map_err(|e| cql_error("apply the schema")(&e))?;
        }
        let ks = &config.keyspace;
        let prepare = |cql: String| {
            let session = &session;
            async move {
                session
                    .prepare(cql)
                    .await
                    .map_err(|e| cql_error("prepare a statement")(&e))
            }
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
            session: Arc::new(session),
            statements: Arc::new(statements),
            write_concurrency: config.write_concurrency,
        })
    }

    /// Runs one write, once more if it fails (a timeout or a node going away).
    async fn write(
        session: &Session,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<()> {
        let mut last = None;
        for _ in 0..2 {
            match session.execute_unpaged(statement, &values).await {
                Ok(_) => return Ok(()),
                Err(error) => last = Some(error),
            }
        }
        Err(cql_error("write a point")(&last.expect("a failed attempt")))
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
        let points = points.as_slice();
        let (session, statements) = (&self.session, &self.statements);
        let mut series: BTreeMap<(&str, &str), Vec<i64>> = BTreeMap::new();
        for point in points {
            series
                .entry((&point.job_id, &point.key))
                .or_default()
                .push(point.step.div_euclid(BUCKET_STEPS));
        }
        // Owned tasks, at most `write_concurrency` in flight.
        let mut in_flight = tokio::task::JoinSet::new();
        for point in points {
            while in_flight.len() >= self.write_concurrency {
                in_flight
                    .join_next()
                    .await
                    .expect("tasks in flight")
                    .map_err(|e| cql_error("write a point")(&e))??;
            }
            let (session, statements) = (self.session.clone(), self.statements.clone());
            let values = (
                point.job_id.clone(),
                point.key.clone(),
                point.step.div_euclid(BUCKET_STEPS),
                point.step,
                point.value,
                point.timestamp_ms,
            );
            in_flight.spawn(async move { Self::write(&session, &statements.insert_point, values).await });
        }
        while let Some(done) = in_flight.join_next().await {
            done.map_err(|e| cql_error("write a point")(&e))??;
        }
        for ((job_id, key), mut buckets) in series {
            Self::write(session, &statements.insert_key, (job_id, key)).await?;
            buckets.sort_unstable();
            buckets.dedup();
            for bucket in buckets {
                Self::write(session, &statements.insert_bucket, (job_id, key, bucket)).await?;
            }
        }
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
