//! The log store's conformance suite: every test runs on the embedded SQLite store and on the
//! ScyllaDB store, against the Apache Cassandra 5 node scripts/test.sh starts
//! (`KILN_TEST_SCYLLA_NODES`), each in a keyspace of its own. It covers what GetLogs (with
//! follow), TailLogs and SearchLogs rely on: reads in (attempt, seq) order after a cursor, in
//! pages; a line stored once however often it is written; end records; the tail's cursor.

use crate::common;
use kiln_log_ingest::item_lines::{ItemLine, ItemSearch, Matcher};
use kiln_log_ingest::store::{Cursor, LogStore, StoredLine};
use kiln_proto::v1::ItemState;

fn line(job_id: &str, attempt: i32, seq: i64, text: &str) -> StoredLine {
    StoredLine {
        job_id: job_id.into(),
        attempt,
        seq,
        stream: 1 + (seq % 2) as i32,
        timestamp_ms: 1_000 + seq,
        text: text.into(),
        end: false,
    }
}

fn end(job_id: &str, attempt: i32, seq: i64) -> StoredLine {
    StoredLine {
        end: true,
        ..line(job_id, attempt, seq, "")
    }
}

fn texts(lines: &[StoredLine]) -> Vec<&str> {
    lines.iter().map(|l| l.text.as_str()).collect()
}

/// Every line of a job after `from`, read in pages of `page` the way the API reads them.
async fn read_all(store: &dyn LogStore, job_id: &str, from: Cursor, page: u32) -> Vec<StoredLine> {
    let (mut cursor, mut all) = (from, Vec::new());
    loop {
        let lines = store.read(job_id, cursor, page).await.unwrap();
        assert!(lines.len() <= page as usize);
        let full = lines.len() == page as usize;
        if let Some(last) = lines.last() {
            cursor = Cursor {
                attempt: last.attempt,
                seq: last.seq,
            };
        }
        all.extend(lines);
        if !full {
            return all;
        }
    }
}

async fn lines_are_stored_once_and_read_in_order(store: Box<dyn LogStore>) {
    let batch: Vec<StoredLine> = (1..=1200)
        .map(|seq| line("j1", 1, seq, &format!("line {seq}")))
        .collect();
    store.append(&batch).await.unwrap();
    // Redelivery of part of the batch, and a second attempt written first.
    store
        .append(&[line("j1", 2, 1300, "retry"), batch[5].clone()])
        .await
        .unwrap();
    store.append(&[line("j2", 1, 1301, "other job")]).await.unwrap();
    store.append(&batch[1000..]).await.unwrap();

    let all = store.read("j1", Cursor::default(), 5000).await.unwrap();
    assert_eq!(all.len(), 1201);
    assert_eq!(all[0], batch[0], "every field comes back");
    assert_eq!(all[1199].text, "line 1200");
    assert_eq!(all[1200].text, "retry");
    let after = store.read("j1", Cursor { attempt: 1, seq: 1199 }, 10).await.unwrap();
    assert_eq!(texts(&after), ["line 1200", "retry"]);
    assert_eq!(
        texts(&store.read("j1", Cursor { attempt: 2, seq: 0 }, 10).await.unwrap()),
        ["retry"]
    );
    assert!(
        store
            .read("j1", Cursor { attempt: 2, seq: 1300 }, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.read("nope", Cursor::default(), 10).await.unwrap().is_empty());
    assert_eq!(
        read_all(&*store, "j1", Cursor::default(), 7).await,
        all,
        "pages add up to the whole"
    );
}

async fn lines_far_apart_in_the_stream_come_back_in_order(store: Box<dyn LogStore>) {
    // The stream's sequence is shared by every job: a job's lines are sparse, and span the Scylla
    // store's partitions (20,000 sequences each) and attempts.
    let seqs = [3, 19_999, 20_000, 20_001, 45_000, 1_000_000, 5_000_000];
    let mut lines: Vec<StoredLine> = seqs.iter().map(|&s| line("j", 1, s, &format!("a1 {s}"))).collect();
    lines.push(end("j", 1, 5_000_001));
    lines.extend([line("j", 2, 5_000_010, "a2 first"), line("j", 2, 6_000_000, "a2 last")]);
    lines.push(line("k", 1, 20_002, "the other job"));
    lines.reverse();
    store.append(&lines).await.unwrap();
    let all = read_all(&*store, "j", Cursor::default(), 2).await;
    let expected: Vec<String> = seqs
        .iter()
        .map(|s| format!("a1 {s}"))
        .chain(["".into(), "a2 first".into(), "a2 last".into()])
        .collect();
    assert_eq!(texts(&all), expected);
    assert!(
        all[7].end && !all[6].end && !all[8].end,
        "the end record is where it was written"
    );
    let from = read_all(
        &*store,
        "j",
        Cursor {
            attempt: 1,
            seq: 20_000,
        },
        3,
    )
    .await;
    assert_eq!(from.first().map(|l| l.seq), Some(20_001));
    assert_eq!(from.len(), 7);
    assert_eq!(
        texts(&store.read("k", Cursor::default(), 10).await.unwrap()),
        ["the other job"]
    );
}

async fn the_tail_cursor_skips_end_records(store: Box<dyn LogStore>) {
    let mut lines: Vec<StoredLine> = (1..=5).map(|s| line("j", 1, s * 10_000, &format!("a1 {s}"))).collect();
    lines.push(end("j", 1, 60_000));
    lines.extend((1..=3).map(|s| line("j", 2, 100_000 + s, &format!("a2 {s}"))));
    lines.push(end("j", 2, 100_004));
    store.append(&lines).await.unwrap();
    for (n, expected) in [
        (0, vec![]),
        (1, vec!["a2 3"]),
        (3, vec!["a2 1", "a2 2", "a2 3"]),
        (5, vec!["a1 4", "a1 5", "a2 1", "a2 2", "a2 3"]),
        (8, vec!["a1 1", "a1 2", "a1 3", "a1 4", "a1 5", "a2 1", "a2 2", "a2 3"]),
        (
            100_000,
            vec!["a1 1", "a1 2", "a1 3", "a1 4", "a1 5", "a2 1", "a2 2", "a2 3"],
        ),
    ] {
        let cursor = store.tail_cursor("j", n).await.unwrap();
        let tail: Vec<StoredLine> = read_all(&*store, "j", cursor, 1000).await;
        let shown: Vec<&str> = tail.iter().filter(|l| !l.end).map(|l| l.text.as_str()).collect();
        assert_eq!(shown, expected, "the last {n} lines");
        assert!(tail.last().unwrap().end, "the end record follows the tail");
    }
    assert_eq!(store.tail_cursor("j", 8).await.unwrap(), Cursor::default());
    assert_eq!(store.tail_cursor("nope", 3).await.unwrap(), Cursor::default());
}

async fn long_lines_and_many_jobs_in_one_batch_survive(store: Box<dyn LogStore>) {
    // 40 lines of 16 KiB (more than one write request's worth in the Scylla store), unicode, an
    // empty line, and 50 jobs in one batch.
    let long = "é".repeat(8 * 1024);
    let mut lines: Vec<StoredLine> = (1..=40)
        .map(|s| line("long", 1, s, &format!("{s:02}{}", &long[..long.len() - 2])))
        .collect();
    lines.push(line("long", 1, 41, ""));
    lines.extend((0..50).map(|j| line(&format!("job{j}"), 1, 100 + j, &format!("job {j} says ✓"))));
    store.append(&lines).await.unwrap();
    let all = read_all(&*store, "long", Cursor::default(), 1000).await;
    assert_eq!(all, lines[..41].to_vec());
    assert_eq!(all[0].text.len(), 16 * 1024);
    for j in 0..50 {
        let got = store.read(&format!("job{j}"), Cursor::default(), 10).await.unwrap();
        assert_eq!(texts(&got), [format!("job {j} says ✓")]);
    }
}

fn item_line(batch: &str, key: &str, attempt: i32, line: i32, text: &str, state: ItemState) -> ItemLine {
    ItemLine {
        batch_id: batch.into(),
        key: key.into(),
        attempt,
        line,
        stream: 1,
        timestamp_ms: 5_000 + i64::from(line),
        text: text.into(),
        state: state as i32,
    }
}

fn search(batch: &str, pattern: &str, regex: bool, state: Option<ItemState>, limit: usize) -> ItemSearch {
    ItemSearch {
        batch_id: batch.into(),
        matcher: Matcher::new(pattern, regex).unwrap(),
        state: state.map(|s| s as i32),
        limit,
    }
}

fn found(lines: &[ItemLine]) -> Vec<(&str, i32, &str)> {
    lines
        .iter()
        .map(|l| (l.key.as_str(), l.attempt, l.text.as_str()))
        .collect()
}

async fn item_lines_are_searched_across_a_batch(store: Box<dyn LogStore>) {
    // 3,000 items of two lines each; seven print a marker, one of them in two attempts (the
    // first failed), and one item's first lines were not kept (line 0 holds the count).
    let markers = [7, 300, 1111, 1500, 2222, 2718, 2999];
    let mut lines = Vec::new();
    for n in 0..3000 {
        let key = format!("k{n:05}");
        let said = if markers.contains(&n) {
            format!("found marker in {key}")
        } else {
            format!("plain {key}")
        };
        lines.push(item_line(
            "b1",
            &key,
            1,
            1,
            &format!("starting {key}"),
            ItemState::Succeeded,
        ));
        lines.push(item_line("b1", &key, 1, 2, &said, ItemState::Succeeded));
    }
    for retried in &mut lines[2 * 300..2 * 300 + 2] {
        (retried.attempt, retried.state) = (2, ItemState::Dead as i32);
    }
    lines.push(item_line(
        "b1",
        "k00300",
        1,
        1,
        "marker before the retry",
        ItemState::Failed,
    ));
    lines.push(item_line("b1", "k00042", 1, 0, "4242", ItemState::Succeeded));
    // Another batch says marker too; it is not b1's.
    lines.push(item_line(
        "b2",
        "k00001",
        1,
        1,
        "marker elsewhere",
        ItemState::Succeeded,
    ));
    for chunk in lines.chunks(700) {
        store.append_item_lines(chunk).await.unwrap();
    }
    // A redelivered outcome changes nothing.
    store.append_item_lines(&lines[600..610]).await.unwrap();

    let all = store
        .search_item_lines(&search("b1", "marker", false, None, 100))
        .await
        .unwrap();
    assert!(!all.truncated);
    let keys: Vec<&str> = all.lines.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "k00007", "k00300", "k00300", "k01111", "k01500", "k02222", "k02718", "k02999"
        ],
        "exactly the items that printed it, in key order"
    );
    assert_eq!(
        found(&all.lines[1..3]),
        [
            ("k00300", 1, "marker before the retry"),
            ("k00300", 2, "found marker in k00300")
        ],
        "attempts in order"
    );
    assert_eq!(
        all.lines[0],
        item_line("b1", "k00007", 1, 2, "found marker in k00007", ItemState::Succeeded)
    );

    let dead = store
        .search_item_lines(&search("b1", "marker", false, Some(ItemState::Dead), 100))
        .await
        .unwrap();
    assert_eq!(found(&dead.lines), [("k00300", 2, "found marker in k00300")]);
    let failed = store
        .search_item_lines(&search("b1", "marker", false, Some(ItemState::Failed), 100))
        .await
        .unwrap();
    assert_eq!(found(&failed.lines), [("k00300", 1, "marker before the retry")]);

    let regex = store
        .search_item_lines(&search("b1", r"^found marker in k0[12]\d{3}$", true, None, 100))
        .await
        .unwrap();
    assert_eq!(regex.lines.len(), 5, "k01111 to k02999: {:?}", found(&regex.lines));
    // No literal every match starts or ends with: every line is read.
    let unfiltered = store
        .search_item_lines(&search("b1", r"\w+ marker\b.*", true, None, 100))
        .await
        .unwrap();
    assert_eq!(unfiltered.lines.len(), 7, "{:?}", found(&unfiltered.lines));
    // Either case, prefiltered in either case.
    let folded = store
        .search_item_lines(&search("b1", r"(?i)FOUND Marker in k0000\d", true, None, 100))
        .await
        .unwrap();
    assert_eq!(found(&folded.lines), [("k00007", 1, "found marker in k00007")]);

    let first_three = store
        .search_item_lines(&search("b1", "marker", false, None, 3))
        .await
        .unwrap();
    assert!(first_three.truncated);
    assert_eq!(
        first_three.lines,
        all.lines[..3].to_vec(),
        "the first lines in key order"
    );
    let exact = store
        .search_item_lines(&search("b1", "marker", false, None, 8))
        .await
        .unwrap();
    assert!(!exact.truncated, "as many as matched is not truncated");

    let counts = store
        .search_item_lines(&search("b1", "4242", false, None, 10))
        .await
        .unwrap();
    assert!(counts.lines.is_empty(), "a count of lines not kept is not a line");
    let every = store
        .search_item_lines(&search("b1", "k0", false, None, 100_000))
        .await
        .unwrap();
    assert_eq!(every.lines.len(), 6000);
    assert!(
        store
            .search_item_lines(&search("nope", "marker", false, None, 10))
            .await
            .unwrap()
            .lines
            .is_empty()
    );
}

macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = kiln_log_ingest::store::SqliteLogStore::open(&dir.path().join("logs.db")).await.unwrap();
                    super::$name(Box::new(store)).await;
                }
            )*
        }
        mod cassandra {
            $(
                #[tokio::test]
                async fn $name() {
                    let config = super::common::cassandra_config();
                    let session = kiln_log_ingest::scylla_store::connect(&config).await.unwrap();
                    let store = kiln_log_ingest::scylla_store::ScyllaLogStore::new(session, &config).await.unwrap();
                    super::$name(Box::new(store)).await;
                }
            )*
        }
    };
}

store_suite!(
    lines_are_stored_once_and_read_in_order,
    lines_far_apart_in_the_stream_come_back_in_order,
    the_tail_cursor_skips_end_records,
    long_lines_and_many_jobs_in_one_batch_survive,
    item_lines_are_searched_across_a_batch,
);
