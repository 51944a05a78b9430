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
use kiln_core::{item_results, subjects};
use kiln_proto::v1 as pb;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, Value};

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
    /// A regular expression, and sets of literals: a line it matches contains one literal of
    /// each set (none when the expression has no such set: then every line is read), in ASCII
    /// letters of either case when `folded` (an expression that begins with `(?i)`).
    Regex {
        regex: regex::Regex,
        required: Vec<Vec<String>>,
        folded: bool,
    },
}

/// Most literals of a set a regular expression's prefilter tries.
const MOST_REQUIRED: usize = 16;

/// The literals every match of `pattern` starts with, and those it ends with (each a finite
/// set of non-empty literals, else left out): a matching line contains one of each.
fn required_literals(pattern: &str) -> Vec<Vec<String>> {
    // `(?i)…`: the literals of the rest, sought in either case, when they are ASCII (the regex
    // crate here folds ASCII case only; SQLite's LIKE does the same).
    if let Some(rest) = pattern.strip_prefix("(?i)") {
        let mut sets = required_literals(rest);
        sets.retain(|set| set.iter().all(|literal| literal.is_ascii()));
        return sets;
    }
    use regex_syntax::hir::literal::{ExtractKind, Extractor};
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    let mut sets = [ExtractKind::Prefix, ExtractKind::Suffix]
        .into_iter()
        .filter_map(|kind| {
            let mut extractor = Extractor::new();
            extractor.kind(kind);
            let literals = extractor.extract(&hir);
            let texts: Option<Vec<String>> = literals
                .literals()?
                .iter()
                .map(|literal| {
                    String::from_utf8(literal.as_bytes().to_vec())
                        .ok()
                        .filter(|t| !t.is_empty())
                })
                .collect();
            texts.filter(|t| t.len() <= MOST_REQUIRED)
        })
        .collect::<Vec<_>>();
    // A literal expression starts and ends with the same set.
    sets.dedup();
    sets
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
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| Error::InvalidArgument(format!("pattern is not a valid regular expression: {e}")))?;
        Ok(Matcher::Regex {
            regex,
            required: required_literals(pattern),
            folded: pattern.starts_with("(?i)"),
        })
    }

    pub fn is_match(&self, text: &str) -> bool {
        match self {
            Matcher::Substring(pattern) => text.contains(pattern.as_str()),
            Matcher::Regex { regex, .. } => regex.is_match(text),
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
            match item_results::decode(&message.payload) {
                Ok(group) => lines.extend(group.into_iter().flat_map(lines_of)),
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

/// Rows read per query of a regular-expression search.
const SCAN_PAGE: i64 = 20_000;

const COLUMNS: &str = "item_key, attempt, line, stream, ts_ms, text, state";
/// Where `text` is in [`COLUMNS`].
const TEXT_COLUMN: usize = 5;

pub(crate) async fn sqlite_append(db: &DatabaseConnection, lines: &[ItemLine]) -> Result<()> {
    let rows = lines
        .iter()
        .map(|line| {
            [
                line.batch_id.clone().into(),
                line.key.clone().into(),
                line.attempt.into(),
                line.line.into(),
                line.stream.into(),
                line.timestamp_ms.into(),
                line.text.clone().into(),
                line.state.into(),
            ]
        })
        .collect();
    crate::store::insert_new_rows(db, &format!("item_log_lines (batch_id, {COLUMNS})"), rows).await
}

/// A substring is found by SQLite itself (`instr` over the batch's range of the key); a
/// regular expression pages through the batch's lines that hold one of its required literals
/// (all of them when it has none) and matches them here.
pub(crate) async fn sqlite_search(db: &DatabaseConnection, search: &ItemSearch) -> Result<Found> {
    let (required, folded) = match &search.matcher {
        Matcher::Regex { required, folded, .. } => (required.as_slice(), *folded),
        Matcher::Substring(_) => (&[][..], false),
    };
    // LIKE folds ASCII case; instr does not.
    let (holds, literal_value): (&str, fn(&str) -> String) = match folded {
        true => ("text LIKE ? ESCAPE '\\'", |literal| {
            format!("%{}%", like_escaped(literal))
        }),
        false => ("instr(text, ?) > 0", str::to_string),
    };
    let mut state_filter = String::new();
    for set in required {
        state_filter.push_str(&format!(" AND ({})", vec![holds; set.len()].join(" OR ")));
    }
    if search.state.is_some() {
        state_filter.push_str(" AND state = ?");
    }
    let with_state = |mut values: Vec<Value>| {
        values.extend(
            required
                .iter()
                .flatten()
                .map(|literal| Value::from(literal_value(literal))),
        );
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
            // Only the text of most rows is read: the rest of a row only when it matches.
            let text: String = row.try_get_by_index(TEXT_COLUMN)?;
            if search.matcher.is_match(&text) {
                lines.push(row_line(&search.batch_id, row)?);
                if lines.len() > search.limit {
                    return Ok(Found::of(lines, search.limit));
                }
            }
        }
        let Some(last) = rows.last() else {
            return Ok(Found::of(lines, search.limit));
        };
        after = (
            last.try_get_by_index(0)?,
            last.try_get_by_index(1)?,
            last.try_get_by_index(2)?,
        );
        if !full {
            return Ok(Found::of(lines, search.limit));
        }
    }
}

/// A literal for LIKE: its `%`, `_` and `\` escaped with `\`.
fn like_escaped(literal: &str) -> String {
    let mut escaped = String::with_capacity(literal.len());
    for c in literal.chars() {
        if matches!(c, '%' | '_' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regex_is_prefiltered_by_literals_every_match_holds() {
        let required = |pattern: &str| match Matcher::new(pattern, true).unwrap() {
            Matcher::Regex { required, .. } => required,
            Matcher::Substring(_) => unreachable!("a regex"),
        };
        assert_eq!(
            required(r"checksum mismatch in tile \d+"),
            [["checksum mismatch in tile "]]
        );
        assert_eq!(required(r"^(oom|killed) at \d+"), [["oom at ", "killed at "]]);
        assert_eq!(required(r"tile \d+ \(marker\)"), [["tile "], [" (marker)"]]);
        assert_eq!(required(r"\d+ errors"), [[" errors"]]);
        // Neither: every line is read.
        assert!(required(r"\d+ \w+").is_empty());
        assert!(required(r"a?b?").is_empty());
        assert!(required(".*").is_empty());
        // Case-insensitive: the rest's literals, sought in either case (ASCII only).
        assert_eq!(required(r"(?i)Checksum 50%_off"), [["Checksum 50%_off"]]);
        assert!(required(r"(?i)größe \d").is_empty());
        assert_eq!(like_escaped(r"50%_off\x"), r"50\%\_off\\x");
    }
}
