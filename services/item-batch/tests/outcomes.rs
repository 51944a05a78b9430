//! Outcomes applied to items' rows on SQLite and on Postgres: items with one outcome in a call
//! go in bulk statements, an item with several is applied in order, and an outcome delivered
//! again, or one of an earlier attempt, moves nothing. The counts by state kept beside the rows
//! come out as the rows counted.

use kiln_core::store::Store;
use kiln_item_batch::store::{Applied, BatchRecord, BatchStore, NewItem, Tally};
use kiln_migrations::{Migrator, MigratorTrait};
use kiln_proto::v1 as pb;
use sea_orm::{ConnectionTrait, Statement};

fn outcome(key: &str, attempt: u32, state: pb::ItemState, lines: &[&str]) -> pb::ItemResult {
    pb::ItemResult {
        batch_id: "b1".into(),
        key: key.into(),
        round: 0,
        attempt,
        state: state as i32,
        exit_code: Some(if state == pb::ItemState::Succeeded { 0 } else { 3 }),
        reason: format!("attempt {attempt}"),
        lines: lines
            .iter()
            .map(|text| pb::LogEntry {
                text: (*text).into(),
                ..Default::default()
            })
            .collect(),
        cpu_seconds: 0.5,
        peak_memory_bytes: 1 << 20,
        lines_dropped: 0,
        duration_ms: 700,
    }
}

/// Batch `b1`'s items counted from their rows, as the kept counts must say.
async fn counted(store: &Store) -> Tally {
    let db = store.connection();
    let sql = "SELECT state, COUNT(*) AS n FROM batch_items WHERE batch_id = 'b1' GROUP BY state";
    let rows = db
        .query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap();
    let mut tally = Tally::default();
    for row in rows {
        let n = u64::try_from(row.try_get::<i64>("", "n").unwrap()).unwrap();
        tally.total += n;
        match row.try_get::<String>("", "state").unwrap().as_str() {
            "pending" => tally.pending += n,
            "succeeded" => tally.succeeded += n,
            "failed" => tally.failed += n,
            "dead" => tally.dead += n,
            other => panic!("state {other}"),
        }
    }
    tally
}

/// Batch `b1` with `count` items, `k0000` on.
async fn batch_of(store: &Store, count: usize) -> (BatchStore, Vec<String>) {
    store.migrate().await.unwrap();
    let batches = BatchStore::new(store);
    batches
        .insert_batch(BatchRecord {
            id: "b1".into(),
            owner_id: "owner".into(),
            project: "default".into(),
            name: "outcomes".into(),
            spec_json: "{}".into(),
            state: "sealed".into(),
            created_at_ms: 1,
            sealed_at_ms: None,
            finished_at_ms: None,
            stalled_reason: String::new(),
            worker_failures_since_ms: 0,
            paused_reason: String::new(),
        })
        .await
        .unwrap();
    let keys: Vec<String> = (0..count).map(|n| format!("k{n:04}")).collect();
    let items = keys
        .iter()
        .map(|key| NewItem::new(key.clone(), format!("mem://{key}"), Default::default()))
        .collect();
    batches.add_items("b1", items).await.unwrap();
    (batches, keys)
}

async fn outcomes_apply_once_and_in_order(store: Store) {
    use pb::ItemState::{Dead, Failed, Succeeded};
    let (batches, keys) = batch_of(&store, 1200).await;

    // 1,100 successes (more than one bulk statement), a failure then its retry's success in the
    // same call, a dead letter with its lines, and a failure.
    let mut results: Vec<pb::ItemResult> = keys[..1100].iter().map(|k| outcome(k, 1, Succeeded, &[])).collect();
    results.push(outcome("k1100", 1, Failed, &["flaky"]));
    results.push(outcome("k1100", 2, Succeeded, &[]));
    results.push(outcome("k1101", 1, Dead, &["poisoned"]));
    results.push(outcome("k1102", 2, Failed, &[]));
    let applied = batches.apply_results(&results).await.unwrap();
    assert_eq!(
        applied,
        Applied {
            succeeded: 1101,
            failed: 2,
            dead: 1
        }
    );
    let tally = Tally {
        total: 1200,
        pending: 97,
        succeeded: 1101,
        failed: 1,
        dead: 1,
    };
    assert_eq!(batches.tally("b1").await.unwrap(), tally);
    assert_eq!(counted(&store).await, tally);

    // Delivered again, and an earlier attempt's outcome arriving late: nothing moves.
    assert_eq!(batches.apply_results(&results).await.unwrap(), Applied::default());
    let late = [outcome("k1102", 1, Succeeded, &[])];
    assert_eq!(batches.apply_results(&late).await.unwrap(), Applied::default());
    assert_eq!(batches.tally("b1").await.unwrap(), tally);

    let retried = batches.item("b1", "k1100").await.unwrap().unwrap();
    assert_eq!(
        (retried.state.as_str(), retried.attempts, retried.last_attempt),
        ("succeeded", 2, 2)
    );
    let first = batches.item("b1", "k0000").await.unwrap().unwrap();
    assert_eq!(
        (
            first.attempts,
            first.exit_code,
            first.reason.as_str(),
            first.duration_ms
        ),
        (1, Some(0), "attempt 1", 700)
    );
    assert_eq!(first.peak_memory_bytes, 1 << 20);
    let dead = batches.attempts("b1", "k1101").await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].lines_json.contains("poisoned"), "{}", dead[0].lines_json);
    assert_eq!(
        batches.attempts("b1", "k1100").await.unwrap().len(),
        1,
        "the failure is kept"
    );
    assert!(
        batches.attempts("b1", "k0000").await.unwrap().is_empty(),
        "a quiet success keeps none"
    );

    // The dead item's new round, then added again with the others: counted once.
    assert_eq!(batches.retry_dead("b1").await.unwrap(), 1);
    let again = keys
        .iter()
        .map(|key| NewItem::new(key.clone(), format!("mem://{key}"), Default::default()))
        .collect();
    assert_eq!(batches.add_items("b1", again).await.unwrap().1, 1200);
    let tally = Tally {
        pending: 98,
        dead: 0,
        ..tally
    };
    assert_eq!(batches.tally("b1").await.unwrap(), tally);
    assert_eq!(counted(&store).await, tally);
}

/// A batch made before the counts were kept is counted once by the migration that keeps them.
#[tokio::test]
async fn the_migration_counts_the_batches_made_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&kiln_core::testing::sqlite_config(dir.path()))
        .await
        .unwrap();
    // m0001 to m0025: the schema before batch_counts.
    Migrator::up(store.connection(), Some(25)).await.unwrap();
    let db = store.connection();
    for (key, state) in [("a", "pending"), ("b", "pending"), ("c", "succeeded"), ("d", "dead")] {
        let sql = format!(
            "INSERT INTO batch_items (batch_id, item_key, uri, params_json, content_sha256, state, published,
                round, attempts, last_attempt, exit_code, reason, cpu_seconds, peak_memory_bytes,
                updated_at_ms, failures, failed_delivery, duration_ms)
             VALUES ('b1', '{key}', 'mem://x', '{{}}', 'sha', '{state}', TRUE, 0, 0, 0, NULL, '', 0, 0, 1, 0, 0, 0)"
        );
        db.execute_raw(Statement::from_string(db.get_database_backend(), sql))
            .await
            .unwrap();
    }
    store.migrate().await.unwrap();
    let tally = BatchStore::new(&store).tally("b1").await.unwrap();
    assert_eq!(
        tally,
        Tally {
            total: 4,
            pending: 2,
            succeeded: 1,
            failed: 0,
            dead: 1
        }
    );
    assert_eq!(counted(&store).await, tally);
}

#[tokio::test]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&kiln_core::testing::sqlite_config(dir.path()))
        .await
        .unwrap();
    outcomes_apply_once_and_in_order(store).await;
}

#[tokio::test]
async fn on_postgres() {
    let store = Store::connect(&kiln_core::testing::postgres_config().await)
        .await
        .unwrap();
    outcomes_apply_once_and_in_order(store).await;
}

/// Intake marking pages published and outcomes moving the same items lock the same rows in
/// other orders (a worker finishes an item before its page is marked; two replicas): Postgres
/// ends one transaction of a deadlock, and the store runs it again. Rounds of failures keep
/// every row movable; every call must succeed and the count come out exact. With the store's
/// retries off this test failed with "deadlock detected" (SQLSTATE 40P01) in 1 of 2 runs.
#[tokio::test]
async fn intake_and_outcomes_racing_on_postgres_all_succeed() {
    use pb::ItemState::{Failed, Succeeded};
    let store = Store::connect(&kiln_core::testing::postgres_config().await)
        .await
        .unwrap();
    let (batches, keys) = batch_of(&store, 3000).await;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..4u32 {
        let (batches, keys) = (batches.clone(), keys.clone());
        tasks.spawn(async move {
            for round in 1..=8u32 {
                // Pages of intake, newest first in odd tasks, beside outcomes in another order.
                let mut pages: Vec<&[String]> = keys.chunks(700).collect();
                if task % 2 == 1 {
                    pages.reverse();
                }
                for page in pages {
                    batches.mark_published("b1", page).await?;
                }
                let attempt = round * 4 + task;
                let mut results: Vec<pb::ItemResult> = keys.iter().map(|k| outcome(k, attempt, Failed, &[])).collect();
                results.rotate_left(keys.len() * task as usize / 4);
                batches.apply_results(&results).await?;
            }
            Ok::<_, kiln_item_batch::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().expect("a racing intake or outcome call failed");
    }
    let results: Vec<pb::ItemResult> = keys.iter().map(|k| outcome(k, 1000, Succeeded, &[])).collect();
    batches.apply_results(&results).await.unwrap();
    let tally = batches.tally("b1").await.unwrap();
    assert_eq!((tally.total, tally.succeeded), (3000, 3000));
    assert_eq!(counted(&store).await, tally);
}
