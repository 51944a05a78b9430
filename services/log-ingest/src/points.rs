//! Where metric points are kept: [`MetricStore`], and its embedded SQLite implementation.
//!
//! A point is keyed by (job, key, step): writing it again changes nothing, so JetStream
//! redelivery never duplicates a point. NaN is stored as NULL and read back as NaN; the
//! infinities are stored as they are. Queries downsample: each bucket of steps gives its lowest
//! and its highest point, so spikes survive.

use std::collections::HashMap;
use std::path::Path;

use std::sync::{Arc, LazyLock, Mutex};

use kiln_formats::columns::check_columns;
use kiln_proto::v1 as pb;

use crate::error::{Error, Result};

mod sampler;
pub use sampler::{Band, Sampler, Series};

/// One metric point. The job and the key are shared with the other points of their batch or
/// series (a clone is a reference count, not a copy).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub job_id: Arc<str>,
    pub key: Arc<str>,
    pub step: i64,
    pub value: f64,
    pub timestamp_ms: i64,
}

/// The points of a published batch, one by one; points of columns that do not line up are
/// dropped with a warning (log-ingest checks them before publishing).
pub fn points_of(batch: pb::MetricBatch) -> Vec<Point> {
    let job_id: Arc<str> = batch.job_id.into();
    let mut points: Vec<Point> = batch
        .points
        .into_iter()
        .map(|p| Point {
            job_id: job_id.clone(),
            key: p.key.into(),
            step: p.step,
            value: p.value,
            timestamp_ms: p.timestamp_ms,
        })
        .collect();
    if let Some(columns) = batch.columns {
        if let Err(problem) = check_columns(&columns) {
            tracing::warn!(%job_id, %problem, "dropping metric columns");
            return points;
        }
        let keys: Vec<Arc<str>> = columns.keys.into_iter().map(Arc::from).collect();
        points.reserve(columns.steps.len());
        for i in 0..columns.steps.len() {
            points.push(Point {
                job_id: job_id.clone(),
                key: keys[columns.key_index[i] as usize].clone(),
                step: columns.steps[i],
                value: columns.values[i],
                timestamp_ms: columns.timestamps_ms.get(i).copied().unwrap_or(0),
            });
        }
    }
    points
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
/// rusqlite: cached prepared statements of 64 rows each cost well under a microsecond per point,
/// where binding four values per point through sqlx cost several (measured: the writer, not the
/// intake, bounded end-to-end throughput). A series (job, key) gets a small integer id, so a
/// point's row is (series, step, value, time). One connection writes, another reads (WAL lets
/// reads run during a write); both are used from blocking threads.
pub struct SqliteMetricStore {
    writer: Arc<Mutex<rusqlite::Connection>>,
    reader: Arc<Mutex<rusqlite::Connection>>,
    series_ids: Arc<Mutex<HashMap<SeriesKey, i64>>>,
}

/// A series: (job, key).
type SeriesKey = (Arc<str>, Arc<str>);

/// Points per INSERT statement: stepping one statement of many rows costs a fraction of
/// stepping a one-row statement per point (the statement's start, bindings' reset and halt are
/// paid once). 64 rows are 256 parameters, far below SQLite's limit of 32,766.
const ROWS_PER_INSERT: usize = 64;

/// `INSERT` of `rows` points, each (series, step, value, time); a point already stored is
/// left as it is.
fn insert_values(rows: usize) -> String {
    let values = vec!["(?, ?, ?, ?)"; rows].join(", ");
    format!("INSERT INTO metric_values (series_id, step, value, ts_ms) VALUES {values} ON CONFLICT DO NOTHING")
}

/// The two inserts the writer uses, built once: [`ROWS_PER_INSERT`] points, and one.
static INSERT_MANY: LazyLock<String> = LazyLock::new(|| insert_values(ROWS_PER_INSERT));
static INSERT_ONE: LazyLock<String> = LazyLock::new(|| insert_values(1));

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
        job_id: job_id.into(),
        key: key.into(),
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
            let mut made: HashMap<SeriesKey, i64> = HashMap::new();
            {
                let cached = cache.lock().expect("the series cache is never poisoned");
                let mut new_series = tx
                    .prepare_cached("INSERT INTO metric_series (job_id, key) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?;
                let mut series_id = tx.prepare_cached("SELECT id FROM metric_series WHERE job_id = ?1 AND key = ?2")?;
                // Series ids first, then the rows in statements of ROWS_PER_INSERT rows each.
                let mut rows: Vec<(i64, i64, Option<f64>, i64)> = Vec::with_capacity(points.len());
                let mut last: Option<(&str, &str, i64)> = None;
                for point in &points {
                    let id = match last {
                        Some((job, key, id)) if job == &*point.job_id && key == &*point.key => id,
                        _ => {
                            let series = (point.job_id.clone(), point.key.clone());
                            match cached.get(&series).or_else(|| made.get(&series)) {
                                Some(id) => *id,
                                None => {
                                    new_series.execute((&*point.job_id, &*point.key))?;
                                    let id: i64 =
                                        series_id.query_row((&*point.job_id, &*point.key), |row| row.get(0))?;
                                    made.insert(series, id);
                                    id
                                }
                            }
                        }
                    };
                    last = Some((&*point.job_id, &*point.key, id));
                    rows.push((id, point.step, value_of(point.value), point.timestamp_ms));
                }
                drop(cached);
                // In key order, each statement's rows land on the same few B-tree pages. A batch
                // is a few runs already in order (one per message), which a stable sort merges.
                rows.sort_by_key(|&(id, step, _, _)| (id, step));
                let mut chunks = rows.chunks_exact(ROWS_PER_INSERT);
                let mut insert = tx.prepare_cached(&INSERT_MANY)?;
                for chunk in &mut chunks {
                    for (i, (id, step, value, ts)) in chunk.iter().enumerate() {
                        insert.raw_bind_parameter(4 * i + 1, id)?;
                        insert.raw_bind_parameter(4 * i + 2, step)?;
                        insert.raw_bind_parameter(4 * i + 3, value)?;
                        insert.raw_bind_parameter(4 * i + 4, ts)?;
                    }
                    insert.raw_execute()?;
                }
                let mut insert_one = tx.prepare_cached(&INSERT_ONE)?;
                for row in chunks.remainder() {
                    insert_one.execute(*row)?;
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
            // The first and last steps come from the primary key's order at the cost of one
            // lookup each; then one scan in step order (no sort) counts the points and keeps
            // each bucket's lowest and highest.
            let bound = |aggregate: &str| -> Result<Option<i64>> {
                let sql = format!("SELECT {aggregate}(step) FROM metric_values WHERE {filter}");
                Ok(connection.prepare_cached(&sql)?.query_row(range, |row| row.get(0))?)
            };
            let (Some(lo), Some(hi)) = (bound("MIN")?, bound("MAX")?) else {
                return Ok(Series::empty());
            };
            let mut sampler = Sampler::new(lo, hi, max_points);
            let mut statement = connection.prepare_cached(&format!(
                "SELECT step, value, ts_ms FROM metric_values WHERE {filter} ORDER BY step"
            ))?;
            let mut rows = statement.query(range)?;
            while let Some(row) = rows.next()? {
                let value: Option<f64> = row.get(1)?;
                sampler.add(row.get(0)?, value.unwrap_or(f64::NAN), row.get(2)?);
            }
            Ok(sampler.finish(&job_id, &key))
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

#[cfg(test)]
mod tests;
