//! Where metric points are kept: [`MetricStore`], and its embedded SQLite implementation.
//!
//! A point is keyed by (job, key, step): writing it again changes nothing, so JetStream
//! redelivery never duplicates a point. NaN is stored as NULL and read back as NaN; the
//! infinities are stored as they are. Queries downsample: each bucket of steps gives its lowest
//! and its highest point, so spikes survive.

use std::collections::HashMap;
use std::path::Path;

use kiln_proto::v1 as pb;
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

/// Checks that the columns of a batch line up; the message says what does not.
pub fn check_columns(columns: &pb::MetricColumns) -> std::result::Result<(), String> {
    let n = columns.steps.len();
    if columns.key_index.len() != n || columns.values.len() != n {
        return Err(format!(
            "columns differ in length: {} key indexes, {} steps, {} values; give one of each per point",
            columns.key_index.len(),
            n,
            columns.values.len()
        ));
    }
    if !columns.timestamps_ms.is_empty() && columns.timestamps_ms.len() != n {
        return Err(format!(
            "{} timestamps for {n} points: give one per point, or none",
            columns.timestamps_ms.len()
        ));
    }
    if let Some(index) = columns.key_index.iter().find(|i| **i as usize >= columns.keys.len()) {
        return Err(format!(
            "key index {index} is out of range: there are {} keys",
            columns.keys.len()
        ));
    }
    Ok(())
}

/// Turns a batch's points into columns (appended to `out`), giving points without a time `now`.
/// Columns must have been checked.
pub fn append_columns(out: &mut pb::MetricColumns, points: Vec<pb::MetricPoint>, columns: pb::MetricColumns, now: i64) {
    let mut index: HashMap<String, u32> = out
        .keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), i as u32))
        .collect();
    let mut key_index = |out: &mut pb::MetricColumns, key: String| -> u32 {
        *index.entry(key).or_insert_with_key(|key| {
            out.keys.push(key.clone());
            (out.keys.len() - 1) as u32
        })
    };
    for point in points {
        let i = key_index(out, point.key);
        out.key_index.push(i);
        out.steps.push(point.step);
        out.values.push(point.value);
        out.timestamps_ms.push(if point.timestamp_ms == 0 {
            now
        } else {
            point.timestamp_ms
        });
    }
    let remap: Vec<u32> = columns.keys.into_iter().map(|key| key_index(out, key)).collect();
    out.key_index
        .extend(columns.key_index.iter().map(|i| remap[*i as usize]));
    out.steps.extend_from_slice(&columns.steps);
    out.values.extend_from_slice(&columns.values);
    if columns.timestamps_ms.is_empty() {
        out.timestamps_ms.resize(out.steps.len(), now);
    } else {
        out.timestamps_ms
            .extend(columns.timestamps_ms.iter().map(|t| if *t == 0 { now } else { *t }));
    }
}

/// Splits columns into parts of at most `size` points, each with only the keys it uses.
pub fn split_columns(columns: &pb::MetricColumns, size: usize) -> Vec<pb::MetricColumns> {
    let size = size.max(1);
    let n = columns.steps.len();
    (0..n)
        .step_by(size)
        .map(|start| {
            let end = (start + size).min(n);
            let mut remap: HashMap<u32, u32> = HashMap::new();
            let mut part = pb::MetricColumns::default();
            for &i in &columns.key_index[start..end] {
                let j = *remap.entry(i).or_insert_with(|| {
                    part.keys.push(columns.keys[i as usize].clone());
                    (part.keys.len() - 1) as u32
                });
                part.key_index.push(j);
            }
            part.steps = columns.steps[start..end].to_vec();
            part.values = columns.values[start..end].to_vec();
            part.timestamps_ms = columns
                .timestamps_ms
                .get(start..end)
                .map(<[i64]>::to_vec)
                .unwrap_or_default();
            part
        })
        .collect()
}

/// The points of a published batch, one by one; points of columns that do not line up are
/// dropped with a warning (log-ingest checks them before publishing).
pub fn points_of(batch: pb::MetricBatch) -> Vec<Point> {
    let mut points: Vec<Point> = batch
        .points
        .into_iter()
        .map(|p| Point {
            job_id: batch.job_id.clone(),
            key: p.key,
            step: p.step,
            value: p.value,
            timestamp_ms: p.timestamp_ms,
        })
        .collect();
    if let Some(columns) = batch.columns {
        if let Err(problem) = check_columns(&columns) {
            tracing::warn!(job_id = %batch.job_id, %problem, "dropping metric columns");
            return points;
        }
        points.reserve(columns.steps.len());
        for i in 0..columns.steps.len() {
            points.push(Point {
                job_id: batch.job_id.clone(),
                key: columns.keys[columns.key_index[i] as usize].clone(),
                step: columns.steps[i],
                value: columns.values[i],
                timestamp_ms: columns.timestamps_ms.get(i).copied().unwrap_or(0),
            });
        }
    }
    points
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

/// Rows per INSERT statement (4 parameters each; SQLite allows 32,766).
const ROWS_PER_STATEMENT: usize = 4000;
/// Series ids remembered by the writer, at most (then it starts over).
const SERIES_CACHE: usize = 100_000;

/// The embedded metric store: one SQLite file in WAL mode, one transaction per batch. A series
/// (job, key) gets a small integer id, so a point's row is (series, step, value, time): about
/// 30 bytes, where the job id and key on every row took ten times that.
pub struct SqliteMetricStore {
    db: DatabaseConnection,
    series_ids: std::sync::Mutex<HashMap<(String, String), i64>>,
}

/// A series id by job and key, for the queries.
const SERIES: &str = "series_id = (SELECT id FROM metric_series WHERE job_id = ? AND key = ?)";

impl SqliteMetricStore {
    pub async fn open(path: &Path) -> Result<SqliteMetricStore> {
        let db = crate::store::open_sqlite(path).await?;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS metric_series (
                id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, key TEXT NOT NULL, UNIQUE (job_id, key)
            )",
        )
        .await?;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS metric_values (
                series_id INTEGER NOT NULL, step INTEGER NOT NULL, value REAL, ts_ms INTEGER NOT NULL,
                PRIMARY KEY (series_id, step)
            ) WITHOUT ROWID",
        )
        .await?;
        Ok(SqliteMetricStore {
            db,
            series_ids: std::sync::Mutex::new(HashMap::new()),
        })
    }

    fn statement(sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)
    }

    fn cached_id(&self, job_id: &str, key: &str) -> Option<i64> {
        let cache = self.series_ids.lock().expect("the series cache is never poisoned");
        cache.get(&(job_id.to_string(), key.to_string())).copied()
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
        // Series ids: from the cache, or made in this transaction (and cached once committed, so a
        // rolled-back id is never remembered).
        let mut made: HashMap<(String, String), i64> = HashMap::new();
        let mut ids = Vec::with_capacity(points.len());
        let mut last: Option<(&str, &str, i64)> = None;
        for point in points {
            let id = match last {
                Some((job, key, id)) if job == point.job_id && key == point.key => id,
                _ => match self.cached_id(&point.job_id, &point.key) {
                    Some(id) => id,
                    None => match made.get(&(point.job_id.clone(), point.key.clone())) {
                        Some(id) => *id,
                        None => {
                            let series = || vec![point.job_id.as_str().into(), point.key.as_str().into()];
                            tx.execute_raw(Self::statement(
                                "INSERT INTO metric_series (job_id, key) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                series(),
                            ))
                            .await?;
                            let row = tx
                                .query_one_raw(Self::statement(
                                    "SELECT id FROM metric_series WHERE job_id = ? AND key = ?",
                                    series(),
                                ))
                                .await?
                                .expect("the series was just inserted");
                            let id: i64 = row.try_get("", "id")?;
                            made.insert((point.job_id.clone(), point.key.clone()), id);
                            id
                        }
                    },
                },
            };
            last = Some((&point.job_id, &point.key, id));
            ids.push(id);
        }
        for (chunk, ids) in points.chunks(ROWS_PER_STATEMENT).zip(ids.chunks(ROWS_PER_STATEMENT)) {
            let placeholders = vec!["(?, ?, ?, ?)"; chunk.len()].join(", ");
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 4);
            for (point, id) in chunk.iter().zip(ids) {
                values.extend([
                    (*id).into(),
                    point.step.into(),
                    value_of(point.value),
                    point.timestamp_ms.into(),
                ]);
            }
            let sql = format!(
                "INSERT INTO metric_values (series_id, step, value, ts_ms) VALUES {placeholders} ON CONFLICT DO NOTHING"
            );
            tx.execute_raw(Self::statement(&sql, values)).await?;
        }
        tx.commit().await?;
        if !made.is_empty() {
            let mut cache = self.series_ids.lock().expect("the series cache is never poisoned");
            if cache.len() + made.len() > SERIES_CACHE {
                cache.clear();
            }
            cache.extend(made);
        }
        Ok(())
    }

    async fn keys(&self, job_id: &str) -> Result<Vec<String>> {
        let rows = self
            .db
            .query_all_raw(Self::statement(
                "SELECT key FROM metric_series WHERE job_id = ? ORDER BY key",
                vec![job_id.into()],
            ))
            .await?;
        rows.iter().map(|row| Ok(row.try_get("", "key")?)).collect()
    }

    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series> {
        let range = || -> Vec<Value> { vec![job_id.into(), key.into(), min_step.into(), max_step.into()] };
        let filter = format!("{SERIES} AND step >= ? AND step <= ?");
        let summary = self
            .db
            .query_one_raw(Self::statement(
                &format!("SELECT COUNT(*) AS n, MIN(step) AS lo, MAX(step) AS hi FROM metric_values WHERE {filter}"),
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
                    &format!("SELECT step, value, ts_ms FROM metric_values WHERE {filter} ORDER BY step"),
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
                "SELECT (step - ?) / ? AS bucket, {aggregate}(value) AS value, step, ts_ms FROM metric_values WHERE {filter} GROUP BY bucket"
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
                &format!("SELECT step, value, ts_ms FROM metric_values WHERE {SERIES} ORDER BY step DESC LIMIT 1"),
                vec![job_id.into(), key.into()],
            ))
            .await?;
        row.map(|row| point_of(job_id, key, &row)).transpose()
    }
}
