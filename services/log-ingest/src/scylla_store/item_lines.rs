//! Batch items' kept lines on ScyllaDB: `item_log_lines`, a batch's rows spread over
//! [`SHARDS`] partitions by a hash of the item key. A search reads the batch's partitions in
//! parallel, matches here, and merges them in (item key, attempt, line) order.

use futures::StreamExt;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{bounded, cql_error, prepare, write_batch};
use crate::error::Result;
use crate::item_lines::{Found, ItemLine, ItemSearch};

/// Partitions per batch.
pub const SHARDS: i32 = 16;
/// Rows per unlogged batch, and their text's bytes at most.
const ROWS_PER_BATCH: usize = 500;
const TEXT_BYTES_PER_BATCH: usize = 96 << 10;
/// Rows per page of a search.
const PAGE_ROWS: i32 = 5_000;

/// A row: batch, shard, item, attempt, line, stream, time, text, state.
type ItemRow<'a> = (&'a str, i32, &'a str, i32, i32, i32, i64, &'a str, i32);

/// The shard of an item key: FNV-1a, stable across builds (the rows are stored by it).
pub fn shard_of(key: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in key.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % SHARDS as u32) as i32
}

pub(super) struct ItemStatements {
    insert: PreparedStatement,
    select: PreparedStatement,
}

impl ItemStatements {
    pub(super) async fn prepare(session: &Session, ks: &str) -> Result<ItemStatements> {
        let mut select = prepare(
            session,
            format!(
                "SELECT item_key, attempt, line, stream, ts_ms, text, state FROM {ks}.item_log_lines WHERE batch_id = ? AND shard = ?"
            ),
        )
        .await?;
        select.set_page_size(PAGE_ROWS);
        Ok(ItemStatements {
            insert: prepare(
                session,
                format!(
                    "INSERT INTO {ks}.item_log_lines (batch_id, shard, item_key, attempt, line, stream, ts_ms, text, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
            )
            .await?,
            select,
        })
    }
}

/// Writes lines, a batch per partition (and size), `concurrency` at once.
pub(super) async fn append(
    session: &Session,
    statements: &ItemStatements,
    lines: &[ItemLine],
    concurrency: usize,
) -> Result<()> {
    let mut rows: Vec<ItemRow<'_>> = lines
        .iter()
        .map(|l| {
            (
                &*l.batch_id,
                shard_of(&l.key),
                &*l.key,
                l.attempt,
                l.line,
                l.stream,
                l.timestamp_ms,
                &*l.text,
                l.state,
            )
        })
        .collect();
    rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut writes = Vec::new();
    for partition in rows.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let mut rest = partition;
        while !rest.is_empty() {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take(ROWS_PER_BATCH)
                .take_while(|row| {
                    bytes += row.7.len();
                    bytes <= TEXT_BYTES_PER_BATCH
                })
                .count()
                .max(1);
            let (batch, after) = rest.split_at(n);
            writes.push(write_batch(session, &statements.insert, batch, "write item lines"));
            rest = after;
        }
    }
    bounded(writes, concurrency).await
}

/// Every shard of the batch read at once; each stops after `limit + 1` matches (its first ones
/// in key order), so the merge's first `limit` are the batch's.
pub(super) async fn search(session: &Session, statements: &ItemStatements, search: &ItemSearch) -> Result<Found> {
    let shards = (0..SHARDS).map(|shard| search_shard(session, statements, search, shard));
    let mut lines = Vec::new();
    for found in futures::future::join_all(shards).await {
        lines.extend(found?);
    }
    lines.sort_by(|a, b| (&a.key, a.attempt, a.line).cmp(&(&b.key, b.attempt, b.line)));
    Ok(Found::of(lines, search.limit))
}

async fn search_shard(
    session: &Session,
    statements: &ItemStatements,
    search: &ItemSearch,
    shard: i32,
) -> Result<Vec<ItemLine>> {
    let failed = |e: &dyn std::fmt::Display| cql_error("search item lines")(e);
    let pages = session
        .execute_iter(statements.select.clone(), (&search.batch_id, shard))
        .await
        .map_err(|e| failed(&e))?;
    let mut rows = pages
        .rows_stream::<(String, i32, i32, i32, i64, String, i32)>()
        .map_err(|e| failed(&e))?;
    let mut found = Vec::new();
    while let Some(row) = rows.next().await {
        let (key, attempt, line, stream, timestamp_ms, text, state) = row.map_err(|e| failed(&e))?;
        if line == 0 || search.state.is_some_and(|wanted| wanted != state) || !search.matcher.is_match(&text) {
            continue;
        }
        found.push(ItemLine {
            batch_id: search.batch_id.clone(),
            key,
            attempt,
            line,
            stream,
            timestamp_ms,
            text,
            state,
        });
        if found.len() > search.limit {
            break;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_spread() {
        // Rows are stored by shard: the function must never change.
        // FNV-1a 32-bit mod 16, as computed apart from this code.
        let known = [
            ("", 5),
            ("k00001", 1),
            ("mem://marker-17", 7),
            ("s3://tiles/0000042.exr", 8),
        ];
        for (key, shard) in known {
            assert_eq!(shard_of(key), shard, "{key:?}");
        }
        let used: std::collections::HashSet<i32> = (0..1000).map(|n| shard_of(&format!("k{n:05}"))).collect();
        assert_eq!(used.len(), SHARDS as usize);
    }
}
