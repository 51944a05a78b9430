//! item-log-search: how fast `kiln batch logs B --grep` answers over 1,000,000 stored item lines
//! on the embedded (SQLite) log store. It stores 10,000 items × 100 kept lines (the default of
//! `item-lines-kept`) through the store, as log-ingest's item-line writer does, then times each
//! search as SearchBatchLogs runs it (p50/max over `--runs`). Beside it, GNU grep over the same
//! lines in a flat file: the floor of a search that reads every line.
//!
//!   cargo run --release -p kiln-bench --bin item-log-search -- [--items 10000] [--lines 100]

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use kiln_log_ingest::item_lines::{ItemLine, ItemSearch, Matcher};
use kiln_log_ingest::store::{LogStore, SqliteLogStore};
use kiln_proto::v1::ItemState;

#[derive(Parser)]
struct Args {
    /// Items of the batch.
    #[arg(long, default_value_t = 10_000)]
    items: usize,
    /// Kept lines per item.
    #[arg(long, default_value_t = 100)]
    lines: usize,
    /// Times each search runs.
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

const BATCH: &str = "01900000-0000-7000-8000-000000000001";
/// Items that print the rare marker.
const MARKED: [usize; 7] = [17, 404, 2500, 5000, 7777, 9001, 9999];

fn text(item: usize, line: usize) -> String {
    if line == 50 && MARKED.contains(&item) {
        format!("frame {line}: checksum mismatch in tile {item} (marker)")
    } else {
        format!(
            "frame {line}: rendered tile {item} in {} ms, {} bytes",
            10 + (item * 7 + line) % 90,
            4096 + item * 13 + line
        )
    }
}

fn state(item: usize) -> ItemState {
    if item % 100 == 99 {
        ItemState::Dead
    } else {
        ItemState::Succeeded
    }
}

fn spread(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "p50 {:>7.1} ms  max {:>7.1} ms",
        ms(times[times.len() / 2]),
        ms(*times.last().unwrap())
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let store = SqliteLogStore::open(&dir.path().join("logs.db")).await?;
    let flat = dir.path().join("lines.txt");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&flat)?);
    let started = Instant::now();
    let mut rows = Vec::new();
    for item in 0..args.items {
        let key = format!("s3://tiles/{item:07}.exr");
        for line in 1..=args.lines {
            let text = text(item, line);
            writeln!(file, "{key}\t1\t{text}")?;
            rows.push(ItemLine {
                batch_id: BATCH.into(),
                key: key.clone(),
                attempt: 1,
                line: line as i32,
                stream: 1,
                timestamp_ms: 1_800_000_000_000 + (item * args.lines + line) as i64,
                text,
                state: state(item) as i32,
            });
        }
        // As the writer does: a batch of outcomes per transaction.
        if rows.len() >= 20_000 {
            store.append_item_lines(&rows).await?;
            rows.clear();
        }
    }
    store.append_item_lines(&rows).await?;
    file.flush()?;
    let total = args.items * args.lines;
    println!(
        "stored {total} item lines ({} items × {}) in {:.1} s; SQLite file {:.0} MiB",
        args.items,
        args.lines,
        started.elapsed().as_secs_f64(),
        std::fs::metadata(dir.path().join("logs.db"))?.len() as f64 / (1 << 20) as f64
    );

    let searches: [(&str, &str, bool, Option<ItemState>, usize); 8] = [
        ("rare substring (7 lines)", "marker", false, None, 1000),
        ("common substring, first 1000", "rendered tile", false, None, 1000),
        (
            "rare regex (7 lines)",
            r"checksum mismatch in tile \d+",
            true,
            None,
            1000,
        ),
        (
            "rare regex, literal at its end",
            r"tile \d+ \(marker\)",
            true,
            None,
            1000,
        ),
        (
            "rare regex, case-insensitive",
            r"(?i)checksum MISMATCH",
            true,
            None,
            1000,
        ),
        (
            "rare regex, literals in every line",
            r"in 10 ms, 13\d{4} bytes",
            true,
            None,
            1000,
        ),
        (
            "rare substring, dead attempts",
            "marker",
            false,
            Some(ItemState::Dead),
            1000,
        ),
        ("no match (reads every line)", "segfault", false, None, 1000),
    ];
    let heading = ("search", "found", "kiln (SearchBatchLogs' store query)");
    println!(
        "\n{:<34} {:>8}  {:<32} grep -F/-E over a flat file",
        heading.0, heading.1, heading.2
    );
    for (name, pattern, regex, state, limit) in searches {
        let mut times = Vec::new();
        let mut found = 0;
        for _ in 0..args.runs {
            let search = ItemSearch {
                batch_id: BATCH.into(),
                matcher: Matcher::new(pattern, regex)?,
                state: state.map(|s| s as i32),
                limit,
            };
            let started = Instant::now();
            found = store.search_item_lines(&search).await?.lines.len();
            times.push(started.elapsed());
        }
        let mut grep_times = Vec::new();
        for _ in 0..args.runs {
            let started = Instant::now();
            let folded = pattern.strip_prefix("(?i)");
            let output = std::process::Command::new("grep")
                .arg(if regex { "-cE" } else { "-cF" })
                .args(folded.map(|_| "-i"))
                .arg(match regex {
                    true => folded.unwrap_or(pattern).replace(r"\d", "[0-9]"),
                    false => pattern.to_string(),
                })
                .arg(&flat)
                .output()
                .context("grep runs")?;
            grep_times.push(started.elapsed());
            anyhow::ensure!(output.status.code().is_some_and(|c| c <= 1), "grep failed");
        }
        println!("{name:<34} {found:>8}  {:<32} {}", spread(times), spread(grep_times));
    }
    Ok(())
}
