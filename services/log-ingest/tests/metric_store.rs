//! The metric store's conformance suite: every test runs on the embedded SQLite store and on the
//! ScyllaDB store, against the Apache Cassandra 5 node scripts/test.sh starts
//! (`KILN_TEST_SCYLLA_NODES`), each in a keyspace of its own.

use crate::common;

use kiln_log_ingest::points::{MetricStore, Point};

fn point(job_id: &str, key: &str, step: i64, value: f64) -> Point {
    Point {
        job_id: job_id.into(),
        key: key.into(),
        step,
        value,
        timestamp_ms: step + 1,
    }
}

async fn points_are_stored_once_and_special_values_survive(store: Box<dyn MetricStore>) {
    let points = vec![
        point("j", "loss", 1, 0.5),
        point("j", "loss", 2, f64::NAN),
        point("j", "loss", 3, f64::INFINITY),
        point("j", "loss", 4, f64::NEG_INFINITY),
        point("j", "acc", 1, 0.1),
        point("other", "loss", 1, 9.0),
    ];
    store.append(points.clone()).await.unwrap();
    store.append(points[..2].to_vec()).await.unwrap();
    assert_eq!(store.keys("j").await.unwrap(), ["acc", "loss"]);
    assert!(store.keys("nobody").await.unwrap().is_empty());
    let series = store.series("j", "loss", i64::MIN, i64::MAX, 100).await.unwrap();
    assert_eq!(series.total, 4);
    let values: Vec<f64> = series.points.iter().map(|p| p.value).collect();
    assert_eq!(values[0], 0.5);
    assert!(values[1].is_nan());
    assert_eq!(values[2..], [f64::INFINITY, f64::NEG_INFINITY]);
    assert_eq!(series.points[0].timestamp_ms, 2);
    assert_eq!(store.latest("j", "loss").await.unwrap().unwrap().step, 4);
    assert!(store.latest("j", "nope").await.unwrap().is_none());
    let window = store.series("j", "loss", 2, 3, 100).await.unwrap();
    assert_eq!(window.points.iter().map(|p| p.step).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(window.total, 2);
}

async fn series_across_partitions_come_back_in_order(store: Box<dyn MetricStore>) {
    // Steps far apart land in different partitions of the Scylla store.
    let steps = [0, 5, 99_999, 100_000, 250_000, 1_000_000, -3];
    let points: Vec<Point> = steps.iter().map(|&s| point("j", "k", s, s as f64)).collect();
    store.append(points.clone()).await.unwrap();
    let series = store.series("j", "k", i64::MIN, i64::MAX, 100).await.unwrap();
    let mut sorted = steps.to_vec();
    sorted.sort_unstable();
    assert_eq!(series.points.iter().map(|p| p.step).collect::<Vec<_>>(), sorted);
    assert_eq!(store.latest("j", "k").await.unwrap().unwrap().step, 1_000_000);
    let window = store.series("j", "k", 99_999, 250_000, 100).await.unwrap();
    assert_eq!(
        window.points.iter().map(|p| p.step).collect::<Vec<_>>(),
        [99_999, 100_000, 250_000]
    );
}

async fn downsampling_keeps_the_extremes(store: Box<dyn MetricStore>) {
    let points: Vec<Point> = (0..100_000)
        .map(|step| {
            let value = match step {
                31_337 => 1000.0,
                77_777 => -1000.0,
                _ => (step as f64 / 100.0).sin(),
            };
            point("j", "loss", step, value)
        })
        .collect();
    store.append(points.clone()).await.unwrap();
    let series = store.series("j", "loss", i64::MIN, i64::MAX, 500).await.unwrap();
    assert_eq!(series.total, 100_000);
    assert!(
        series.points.len() <= 500 && series.points.len() > 400,
        "{}",
        series.points.len()
    );
    assert!(series.points.iter().any(|p| p.step == 31_337 && p.value == 1000.0));
    assert!(series.points.iter().any(|p| p.step == 77_777 && p.value == -1000.0));
    assert!(series.points.windows(2).all(|w| w[0].step < w[1].step));
}

async fn a_redelivered_batch_of_many_partitions_stores_nothing_twice(store: Box<dyn MetricStore>) {
    // Several series, each across a partition boundary and longer than one write request (and
    // one chunk of the Scylla store).
    let mut points = Vec::new();
    for job in ["j1", "j2"] {
        for key in ["loss", "acc", "lr"] {
            points.extend((97_500..102_500).map(|step| point(job, key, step, step as f64)));
        }
    }
    points.push(point("j1", "loss", 100_001, f64::NAN));
    points.retain(|p| !(p.step == 100_001 && p.value == 100_001.0 && &*p.key == "loss" && &*p.job_id == "j1"));
    // First regrouped (every third point, as another batch), then whole, then whole again.
    store.append(points.iter().step_by(3).cloned().collect()).await.unwrap();
    store.append(points.clone()).await.unwrap();
    points.reverse();
    store.append(points).await.unwrap();
    for job in ["j1", "j2"] {
        assert_eq!(store.keys(job).await.unwrap(), ["acc", "loss", "lr"]);
        for key in ["loss", "acc", "lr"] {
            let series = store.series(job, key, i64::MIN, i64::MAX, 20_000).await.unwrap();
            assert_eq!(series.total, 5_000, "{job} {key}");
            assert_eq!(series.points.len(), 5_000);
            assert!(series.points.windows(2).all(|w| w[0].step + 1 == w[1].step));
        }
    }
    let loss = store.series("j1", "loss", 100_001, 100_001, 10).await.unwrap();
    assert!(loss.points[0].value.is_nan());
    assert_eq!(store.latest("j2", "lr").await.unwrap().unwrap().step, 102_499);
}

macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = kiln_log_ingest::points::SqliteMetricStore::open(&dir.path().join("metrics.db")).await.unwrap();
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
                    let store = kiln_log_ingest::scylla_store::ScyllaMetricStore::new(session, &config).await.unwrap();
                    super::$name(Box::new(store)).await;
                }
            )*
        }
    };
}

store_suite!(
    points_are_stored_once_and_special_values_survive,
    series_across_partitions_come_back_in_order,
    downsampling_keeps_the_extremes,
    a_redelivered_batch_of_many_partitions_stores_nothing_twice,
);
