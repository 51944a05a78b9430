//! Where metric points are kept: [`MetricStore`], and its embedded SQLite implementation.
//!
//! A point is keyed by (job, key, step): writing it again changes nothing, so JetStream
//! redelivery never duplicates a point. NaN is stored as NULL and read back as NaN; the
//! infinities are stored as they are. Queries downsample: each bucket of steps gives its lowest
//! and its highest point, so spikes survive.

use std::path::Path;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, QueryResult, Statement, TransactionTrait, Value};

use crate::error::Result;

/// One metric point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub job_id: String,
    pub key: String,
    pub step: i64,
    pub value: f64,
    pub timestamp_ms: i64,
}

/// A downsampled series and how many points it had in the range.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub points: Vec<Point>,
    pub total: u64,
}

/// A store of metric points.
#[async_trait::async_trait]
pub trait MetricStore: Send + Sync + 'static {
    /// Stores points; points already stored are left as they are.
    async fn append(&self, points: &[Point]) -> Result<()>;
    /// The keys a job has written, sorted.
    async fn keys(&self, job_id: &str) -> Result<Vec<String>>;
    /// A series in a step range, with at most `max_points` points.
    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series>;
    /// The point of a key with the highest step.
    async fn latest(&self, job_id: &str, key: &str) -> Result<Option<Point>>;
}

/// Rows per INSERT statement (5 parameters each).
const ROWS_PER_STATEMENT: usize = 1000;

/// The embedded metric store: one SQLite file in WAL mode, one transaction per batch.
pub struct SqliteMetricStore {
    db: DatabaseConnection,
}

impl SqliteMetricStore {
    pub async fn open(path: &Path) -> Result<SqliteMetricStore> {
        let db = crate::store::open_sqlite(path).await?;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS metric_points (
                job_id TEXT NOT NULL, key TEXT NOT NULL, step INTEGER NOT NULL,
                value REAL, ts_ms INTEGER NOT NULL,
                PRIMARY KEY (job_id, key, step)
            ) WITHOUT ROWID",
        )
        .await?;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS metric_keys (job_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (job_id, key)) WITHOUT ROWID",
        )
        .await?;
        Ok(SqliteMetricStore { db })
    }

    fn statement(sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)
    }
}

fn value_of(value: f64) -> Value {
    if value.is_nan() {
        Value::Double(None)
    } else {
        value.into()
    }
}

fn point_of(job_id: &str, key: &str, row: &QueryResult) -> Result<Point> {
    let value: Option<f64> = row.try_get("", "value")?;
    Ok(Point {
        job_id: job_id.to_string(),
        key: key.to_string(),
        step: row.try_get("", "step")?,
        value: value.unwrap_or(f64::NAN),
        timestamp_ms: row.try_get("", "ts_ms")?,
    })
}

#[async_trait::async_trait]
impl MetricStore for SqliteMetricStore {
    async fn append(&self, points: &[Point]) -> Result<()> {
        let tx = self.db.begin().await?;
        for chunk in points.chunks(ROWS_PER_STATEMENT) {
            let placeholders = vec!["(?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 5);
            for point in chunk {
                values.extend([
                    point.job_id.clone().into(),
                    point.key.clone().into(),
                    point.step.into(),
                    value_of(point.value),
                    point.timestamp_ms.into(),
                ]);
            }
            let sql = format!(
                "INSERT INTO metric_points (job_id, key, step, value, ts_ms) VALUES {placeholders} ON CONFLICT DO NOTHING"
            );
            tx.execute_raw(Self::statement(&sql, values)).await?;
            let mut keys: Vec<(&str, &str)> = chunk.iter().map(|p| (p.job_id.as_str(), p.key.as_str())).collect();
            keys.sort_unstable();
            keys.dedup();
            let placeholders = vec!["(?, ?)"; keys.len()].join(", ");
            let values: Vec<Value> = keys
                .iter()
                .flat_map(|(job, key)| [(*job).into(), (*key).into()])
                .collect();
            let sql = format!("INSERT INTO metric_keys (job_id, key) VALUES {placeholders} ON CONFLICT DO NOTHING");
            tx.execute_raw(Self::statement(&sql, values)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn keys(&self, job_id: &str) -> Result<Vec<String>> {
        let rows = self
            .db
            .query_all_raw(Self::statement(
                "SELECT key FROM metric_keys WHERE job_id = ? ORDER BY key",
                vec![job_id.into()],
            ))
            .await?;
        rows.iter().map(|row| Ok(row.try_get("", "key")?)).collect()
    }

    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series> {
        let range = || -> Vec<Value> { vec![job_id.into(), key.into(), min_step.into(), max_step.into()] };
        let filter = "job_id = ? AND key = ? AND step >= ? AND step <= ?";
        let summary = self
            .db
            .query_one_raw(Self::statement(
                &format!("SELECT COUNT(*) AS n, MIN(step) AS lo, MAX(step) AS hi FROM metric_points WHERE {filter}"),
                range(),
            ))
            .await?
            .expect("an aggregate returns a row");
        let total: i64 = summary.try_get("", "n")?;
        let total = u64::try_from(total).unwrap_or(0);
        if total == 0 {
            return Ok(Series {
                points: Vec::new(),
                total,
            });
        }
        if total as usize <= max_points {
            let rows = self
                .db
                .query_all_raw(Self::statement(
                    &format!("SELECT step, value, ts_ms FROM metric_points WHERE {filter} ORDER BY step"),
                    range(),
                ))
                .await?;
            let points = rows
                .iter()
                .map(|row| point_of(job_id, key, row))
                .collect::<Result<_>>()?;
            return Ok(Series { points, total });
        }
        // Buckets of equal step width; each gives its lowest and highest point (SQLite returns
        // the row of the MIN/MAX for the bare columns).
        let lo: i64 = summary.try_get("", "lo")?;
        let hi: i64 = summary.try_get("", "hi")?;
        let buckets = (max_points / 2).max(1) as i64;
        let width = ((hi - lo) / buckets + 1).max(1);
        let mut points = Vec::with_capacity(max_points);
        for aggregate in ["MIN", "MAX"] {
            if aggregate == "MIN" && max_points < 2 {
                continue;
            }
            let sql = format!(
                "SELECT (step - ?) / ? AS bucket, {aggregate}(value) AS value, step, ts_ms FROM metric_points WHERE {filter} GROUP BY bucket"
            );
            let mut values: Vec<Value> = vec![lo.into(), width.into()];
            values.extend(range());
            for row in self.db.query_all_raw(Self::statement(&sql, values)).await? {
                points.push(point_of(job_id, key, &row)?);
            }
        }
        points.sort_by_key(|point| point.step);
        points.dedup_by_key(|point| point.step);
        Ok(Series { points, total })
    }

    async fn latest(&self, job_id: &str, key: &str) -> Result<Option<Point>> {
        let row = self
            .db
            .query_one_raw(Self::statement(
                "SELECT step, value, ts_ms FROM metric_points WHERE job_id = ? AND key = ? ORDER BY step DESC LIMIT 1",
                vec![job_id.into(), key.into()],
            ))
            .await?;
        row.map(|row| point_of(job_id, key, &row)).transpose()
    }
}
