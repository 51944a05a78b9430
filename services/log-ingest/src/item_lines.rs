//! Batch items' kept output lines in the log store, and the search across a batch.
//!
//! The agent keeps an attempt's last lines (item-batch's `item-lines-kept`, 100 by default) and
//! counts the earlier ones; they reach log-ingest with the attempt's outcome on
//! `KILN_ITEM_RESULTS` ([`ItemLineWriter`]: a durable consumer of its own beside item-batch's).
//! A line is keyed by (batch, item, attempt, line), so a redelivered outcome writes nothing new;
//! line 0 of an attempt holds the count of the lines not kept, and a search skips it. On SQLite
//! the lines are one table clustered by that key, in the log store's file; on ScyllaDB
//! `item_log_lines` (`migrations/cql/0003_item_lines.cql`), whose rows expire with the store's TTL.

use std::sync::Arc;

use kiln_core::intake::{BatchWriter, Intake, Received, WriteError};
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value};

use crate::error::{Error, Result};
use crate::store::LogStore;

/// One kept line of an item attempt (line 0: the count of lines not kept, in `text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemLine {
    pub batch_id: String,
    pub key: String,
    pub attempt: i32,
    pub line: i32,
    pub stream: i32,
    pub timestamp_ms: i64,
    pub text: String,
    /// How the attempt ended (`kiln.v1.ItemState`).
    pub state: i32,
}

/// What a line must contain.
pub enum Matcher {
    /// A substring, case-sensitive.
    Substring(String),
    Regex(regex::Regex),
}

impl Matcher {
    /// A substring, or with `regex` a regular expression (bounded in size).
    pub fn new(pattern: &str, regex: bool) -> Result<Matcher> {
        if pattern.is_empty() {
            return Err(Error::InvalidArgument("pattern is empty".into()));
        }
        if !regex {
            return Ok(Matcher::Substring(pattern.to_string()));
        }
        regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map(Matcher::Regex)
            .map_err(|e| Error::InvalidArgument(format!("pattern is not a valid regular expression: {e}")))
    }

    pub fn is_match(&self, text: &str) -> bool {
        match self {
            Matcher::Substring(pattern) => text.contains(pattern.as_str()),
            Matcher::Regex(regex) => regex.is_match(text),
        }
    }
}

/// A search of a batch's item lines.
pub struct ItemSearch {
    pub batch_id: String,
    pub matcher: Matcher,
    /// Only attempts that ended so (`kiln.v1.ItemState`); none for every attempt.
    pub state: Option<i32>,
    /// At most this many lines.
    pub limit: usize,
}

/// The lines found, in (item key, attempt, line) order, and whether more matched.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub lines: Vec<ItemLine>,
    pub truncated: bool,
}

impl Found {
    /// Keeps the first `limit` of lines found in order; more means truncated.
    pub fn of(mut lines: Vec<ItemLine>, limit: usize) -> Found {
        let truncated = lines.len() > limit;
        lines.truncate(limit);
        Found { lines, truncated }
    }
}

/// The rows an outcome keeps: its lines from 1, and line 0 with the count not kept.
pub fn lines_of(result: pb::ItemResult) -> Vec<ItemLine> {
    let attempt = i32::try_from(result.attempt).unwrap_or(i32::MAX);
    let line = |line: i32, stream: i32, timestamp_ms: i64, text: String| ItemLine {
        batch_id: result.batch_id.clone(),
        key: result.key.clone(),
        attempt,
        line,
        stream,
        timestamp_ms,
        text,
        state: result.state,
    };
    let mut lines = Vec::with_capacity(result.lines.len() + 1);
    if result.lines_dropped > 0 {
        let first = result.lines.first().map_or(0, |l| l.timestamp_ms);
        lines.push(line(0, 0, first, result.lines_dropped.to_string()));
    }
    for (n, entry) in result.lines.iter().enumerate() {
        let number = i32::try_from(n + 1).unwrap_or(i32::MAX);
        lines.push(line(number, entry.stream, entry.timestamp_ms, entry.text.clone()));
    }
    lines
}

pub const ITEM_LINES: Intake = Intake {
    stream: subjects::STREAM_ITEM_RESULTS,
    consumer: subjects::CONSUMER_ITEM_LINES,
    filter: subjects::ITEM_RESULTS_ALL,
};

/// Item outcomes' lines into the log store.
pub struct ItemLineWriter {
    pub store: Arc<dyn LogStore>,
}

#[async_trait::async_trait]
impl BatchWriter for ItemLineWriter {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
        let mut lines = Vec::new();
        for message in messages {
            match pb::ItemResult::decode(message.payload.as_ref()) {
                Ok(result) => lines.extend(lines_of(result)),
                Err(error) => tracing::warn!(error = %error, "dropping a malformed item result"),
            }
        }
        if !lines.is_empty() {
            self.store.append_item_lines(&lines).await?;
        }
        Ok(())
    }
}

/// The SQLite table, in the log store's file.
pub(crate) const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS item_log_lines (
    batch_id TEXT NOT NULL,
    item_key TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    line INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    ts_ms INTEGER NOT NULL,
    text TEXT NOT NULL,
    state INTEGER NOT NULL,
    PRIMARY KEY (batch_id, item_key, attempt, line)
) WITHOUT ROWID";

/// Rows per INSERT statement (8 parameters each, well under SQLite's limit).
const ROWS_PER_STATEMENT: usize = 500;
/// Rows read per query of a regular-expression search.
const SCAN_PAGE: i64 = 20_000;

const COLUMNS: &str = "item_key, attempt, line, stream, ts_ms, text, state";

pub(crate) async fn sqlite_append(db: &DatabaseConnection, lines: &[ItemLine]) -> Result<()> {
    let tx = db.begin().await?;
    for chunk in lines.chunks(ROWS_PER_STATEMENT) {
        let placeholders = vec!["(?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql =
            format!("INSERT INTO item_log_lines (batch_id, {COLUMNS}) VALUES {placeholders} ON CONFLICT DO NOTHING");
        let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 8);
        for line in chunk {
            values.extend([
                line.batch_id.clone().into(),
                line.key.clone().into(),
                line.attempt.into(),
                line.line.into(),
                line.stream.into(),
                line.timestamp_ms.into(),
                line.text.clone().into(),
                line.state.into(),
            ]);
        }
        tx.execute_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A substring is found by SQLite itself (`instr` over the batch's range of the key); a
/// regular expression pages through the batch's lines and matches them here.
pub(crate) async fn sqlite_search(db: &DatabaseConnection, search: &ItemSearch) -> Result<Found> {
    let state_filter = if search.state.is_some() { " AND state = ?" } else { "" };
    let with_state = |mut values: Vec<Value>| {
        if let Some(state) = search.state {
            values.push(state.into());
        }
        values
    };
    let wanted = i64::try_from(search.limit).unwrap_or(i64::MAX).saturating_add(1);
    if let Matcher::Substring(pattern) = &search.matcher {
        let sql = format!(
            "SELECT {COLUMNS} FROM item_log_lines WHERE batch_id = ? AND line > 0 AND instr(text, ?) > 0{state_filter}
             ORDER BY item_key, attempt, line LIMIT ?"
        );
        let mut values = with_state(vec![search.batch_id.clone().into(), pattern.clone().into()]);
        values.push(wanted.into());
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
            .await?;
        let lines = rows
            .iter()
            .map(|row| row_line(&search.batch_id, row))
            .collect::<Result<_>>()?;
        return Ok(Found::of(lines, search.limit));
    }
    let mut lines = Vec::new();
    let mut after: (String, i32, i32) = (String::new(), 0, 0);
    loop {
        let sql = format!(
            "SELECT {COLUMNS} FROM item_log_lines WHERE batch_id = ? AND line > 0
             AND (item_key, attempt, line) > (?, ?, ?){state_filter}
             ORDER BY item_key, attempt, line LIMIT ?"
        );
        let mut values = vec![
            search.batch_id.clone().into(),
            after.0.clone().into(),
            after.1.into(),
            after.2.into(),
        ];
        values = with_state(values);
        values.push(SCAN_PAGE.into());
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
            .await?;
        let full = rows.len() as i64 == SCAN_PAGE;
        for row in &rows {
            let line = row_line(&search.batch_id, row)?;
            after = (line.key.clone(), line.attempt, line.line);
            if search.matcher.is_match(&line.text) {
                lines.push(line);
                if lines.len() > search.limit {
                    return Ok(Found::of(lines, search.limit));
                }
            }
        }
        if !full {
            return Ok(Found::of(lines, search.limit));
        }
    }
}

fn row_line(batch_id: &str, row: &sea_orm::QueryResult) -> Result<ItemLine> {
    Ok(ItemLine {
        batch_id: batch_id.to_string(),
        key: row.try_get("", "item_key")?,
        attempt: row.try_get("", "attempt")?,
        line: row.try_get("", "line")?,
        stream: row.try_get("", "stream")?,
        timestamp_ms: row.try_get("", "ts_ms")?,
        text: row.try_get("", "text")?,
        state: row.try_get("", "state")?,
    })
}
