//! Where metric points are kept: [`MetricStore`], and its embedded SQLite implementation.
//!
//! A point is keyed by (job, key, step): writing it again changes nothing, so JetStream
//! redelivery never duplicates a point. NaN is stored as NULL and read back as NaN; the
//! infinities are stored as they are. Queries downsample: each bucket of steps gives its lowest
//! and its highest point, so spikes survive.

use std::collections::HashMap;
use std::path::Path;

use std::sync::{Arc, Mutex};

use kiln_proto::v1 as pb;

use crate::error::{Error, Result};

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
    /// Stores points (taken by value: the embedded store hands them to a writer thread);
    /// points already stored are left as they are.
    async fn append(&self, points: Vec<Point>) -> Result<()>;
    /// The keys a job has written, sorted.
    async fn keys(&self, job_id: &str) -> Result<Vec<String>>;
    /// A series in a step range, with at most `max_points` points.
    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series>;
    /// The point of a key with the highest step.
    async fn latest(&self, job_id: &str, key: &str) -> Result<Option<Point>>;
}

/// Series ids remembered by the writer, at most (then it starts over).
const SERIES_CACHE: usize = 100_000;

/// The embedded metric store: one SQLite file in WAL mode, one transaction per batch, through
/// rusqlite: a prepared statement stepped once per point costs about a microsecond, where
/// binding four values per point through sqlx cost several (measured: the writer, not the
/// intake, bounded end-to-end throughput). A series (job, key) gets a small integer id, so a
/// point's row is (series, step, value, time). One connection writes, another reads (WAL lets
/// reads run during a write); both are used from blocking threads.
pub struct SqliteMetricStore {
    writer: Arc<Mutex<rusqlite::Connection>>,
    reader: Arc<Mutex<rusqlite::Connection>>,
    series_ids: Arc<Mutex<HashMap<(String, String), i64>>>,
}

/// A series id by job and key, for the queries.
const SERIES: &str = "series_id = (SELECT id FROM metric_series WHERE job_id = ?1 AND key = ?2)";

fn open_connection(path: &Path) -> Result<rusqlite::Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::LogStore(format!("cannot create {}: {e}", dir.display())))?;
    }
    let connection = rusqlite::Connection::open(path)?;
    connection.busy_timeout(std::time::Duration::from_secs(10))?;
    // WAL, and every commit synced: a batch acked to JetStream is on disk.
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "FULL")?;
    Ok(connection)
}

/// Runs `work` on a connection from a blocking thread.
async fn with<T: Send + 'static>(
    connection: &Arc<Mutex<rusqlite::Connection>>,
    work: impl FnOnce(&mut rusqlite::Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    let connection = connection.clone();
    tokio::task::spawn_blocking(move || {
        let mut connection = connection.lock().expect("a connection lock is never poisoned");
        work(&mut connection)
    })
    .await
    .map_err(|e| Error::LogStore(format!("a store thread failed: {e}")))?
}

impl SqliteMetricStore {
    pub async fn open(path: &Path) -> Result<SqliteMetricStore> {
        let writer = open_connection(path)?;
        writer.execute_batch(
            "CREATE TABLE IF NOT EXISTS metric_series (
                id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, key TEXT NOT NULL, UNIQUE (job_id, key)
            );
            CREATE TABLE IF NOT EXISTS metric_values (
                series_id INTEGER NOT NULL, step INTEGER NOT NULL, value REAL, ts_ms INTEGER NOT NULL,
                PRIMARY KEY (series_id, step)
            ) WITHOUT ROWID;",
        )?;
        let reader = open_connection(path)?;
        Ok(SqliteMetricStore {
            writer: Arc::new(Mutex::new(writer)),
            reader: Arc::new(Mutex::new(reader)),
            series_ids: Arc::default(),
        })
    }
}

fn value_of(value: f64) -> Option<f64> {
    (!value.is_nan()).then_some(value)
}

fn point_of(job_id: &str, key: &str, row: &rusqlite::Row<'_>) -> rusqlite::Result<Point> {
    let value: Option<f64> = row.get("value")?;
    Ok(Point {
        job_id: job_id.to_string(),
        key: key.to_string(),
        step: row.get("step")?,
        value: value.unwrap_or(f64::NAN),
        timestamp_ms: row.get("ts_ms")?,
    })
}

#[async_trait::async_trait]
impl MetricStore for SqliteMetricStore {
    async fn append(&self, points: Vec<Point>) -> Result<()> {
        let cache = self.series_ids.clone();
        with(&self.writer, move |connection| {
            let tx = connection.transaction()?;
            // Series ids: from the cache, or made in this transaction (and cached once
            // committed, so a rolled-back id is never remembered).
            let mut made: HashMap<(String, String), i64> = HashMap::new();
            {
                let cached = cache.lock().expect("the series cache is never poisoned");
                let mut new_series = tx.prepare_cached(
                    "INSERT INTO metric_series (job_id, key) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                )?;
                let mut series_id = tx.prepare_cached("SELECT id FROM metric_series WHERE job_id = ?1 AND key = ?2")?;
                let mut insert = tx.prepare_cached(
                    "INSERT INTO metric_values (series_id, step, value, ts_ms) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                )?;
                let mut last: Option<(&str, &str, i64)> = None;
                for point in &points {
                    let id = match last {
                        Some((job, key, id)) if job == point.job_id && key == point.key => id,
                        _ => {
                            let series = (point.job_id.clone(), point.key.clone());
                            match cached.get(&series).or_else(|| made.get(&series)) {
                                Some(id) => *id,
                                None => {
                                    new_series.execute((&point.job_id, &point.key))?;
                                    let id: i64 = series_id.query_row((&point.job_id, &point.key), |row| row.get(0))?;
                                    made.insert(series, id);
                                    id
                                }
                            }
                        }
                    };
                    last = Some((&point.job_id, &point.key, id));
                    insert.execute((id, point.step, value_of(point.value), point.timestamp_ms))?;
                }
            }
            tx.commit()?;
            if !made.is_empty() {
                let mut cached = cache.lock().expect("the series cache is never poisoned");
                if cached.len() + made.len() > SERIES_CACHE {
                    cached.clear();
                }
                cached.extend(made);
            }
            Ok(())
        })
        .await
    }

    async fn keys(&self, job_id: &str) -> Result<Vec<String>> {
        let job_id = job_id.to_string();
        with(&self.reader, move |connection| {
            let mut statement =
                connection.prepare_cached("SELECT key FROM metric_series WHERE job_id = ?1 ORDER BY key")?;
            let keys = statement
                .query_map([&job_id], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(keys)
        })
        .await
    }

    async fn series(&self, job_id: &str, key: &str, min_step: i64, max_step: i64, max_points: usize) -> Result<Series> {
        let (job_id, key) = (job_id.to_string(), key.to_string());
        with(&self.reader, move |connection| {
            let filter = format!("{SERIES} AND step >= ?3 AND step <= ?4");
            let range = (&job_id, &key, min_step, max_step);
            let (total, lo, hi): (i64, Option<i64>, Option<i64>) = connection
                .prepare_cached(&format!(
                    "SELECT COUNT(*), MIN(step), MAX(step) FROM metric_values WHERE {filter}"
                ))?
                .query_row(range, |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
            let total = u64::try_from(total).unwrap_or(0);
            let (Some(lo), Some(hi)) = (lo, hi) else {
                return Ok(Series {
                    points: Vec::new(),
                    total,
                });
            };
            if total as usize <= max_points {
                let mut statement = connection.prepare_cached(&format!(
                    "SELECT step, value, ts_ms FROM metric_values WHERE {filter} ORDER BY step"
                ))?;
                let points = statement
                    .query_map(range, |row| point_of(&job_id, &key, row))?
                    .collect::<rusqlite::Result<Vec<Point>>>()?;
                return Ok(Series { points, total });
            }
            // Buckets of equal step width; each gives its lowest and highest point (SQLite
            // returns the row of the MIN/MAX for the bare columns).
            let buckets = (max_points / 2).max(1) as i64;
            let width = ((hi - lo) / buckets + 1).max(1);
            let mut points = Vec::with_capacity(max_points);
            for aggregate in ["MIN", "MAX"] {
                if aggregate == "MIN" && max_points < 2 {
                    continue;
                }
                let mut statement = connection.prepare_cached(&format!(
                    "SELECT (step - ?5) / ?6 AS bucket, {aggregate}(value) AS value, step, ts_ms FROM metric_values WHERE {filter} GROUP BY bucket"
                ))?;
                let rows = statement.query_map((&job_id, &key, min_step, max_step, lo, width), |row| {
                    point_of(&job_id, &key, row)
                })?;
                for row in rows {
                    points.push(row?);
                }
            }
            points.sort_by_key(|point| point.step);
            points.dedup_by_key(|point| point.step);
            Ok(Series { points, total })
        })
        .await
    }

    async fn latest(&self, job_id: &str, key: &str) -> Result<Option<Point>> {
        let (job_id, key) = (job_id.to_string(), key.to_string());
        with(&self.reader, move |connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT step, value, ts_ms FROM metric_values WHERE {SERIES} ORDER BY step DESC LIMIT 1"
            ))?;
            let mut rows = statement.query_map((&job_id, &key), |row| point_of(&job_id, &key, row))?;
            Ok(rows.next().transpose()?)
        })
        .await
    }
}
