//! System metrics of running jobs reach `KILN_METRICS` under `sys/...` keys.

use kiln_e2e::{Stack, metric_batches, spec, test_image};
use kiln_proto::v1 as pb;
use kiln_runner::collector::{CPU_PERCENT, HOST_CPU_PERCENT, HOST_MEMORY_USED_BYTES, MEMORY_BYTES};

fn values(batches: &[pb::MetricBatch], key: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| &b.points)
        .filter(|p| p.key == key)
        .map(|p| p.value)
        .collect()
}

fn assert_sane(batches: &[pb::MetricBatch], job_id: &str) {
    assert!(batches.len() >= 2, "{batches:?}");
    assert!(batches.iter().all(|b| b.job_id == job_id && b.attempt == 1));
    let steps: Vec<i64> = batches.iter().map(|b| b.points[0].step).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    let memory = values(batches, MEMORY_BYTES);
    assert!(!memory.is_empty() && memory.iter().all(|&m| m > 0.0), "{memory:?}");
    assert!(values(batches, CPU_PERCENT).iter().all(|&c| c >= 0.0));
    assert!(values(batches, HOST_MEMORY_USED_BYTES).iter().all(|&m| m > 0.0));
    assert_eq!(values(batches, HOST_CPU_PERCENT).len(), batches.len());
}

#[tokio::test]
async fn a_process_job_reports_its_cpu_and_memory() {
    let stack = Stack::start().await;
    // Busy for three seconds of wall clock, however loaded the machine is.
    let script = "end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; done";
    let job = stack.submit(&["sh", "-c", script]).await;
    stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    let batches = metric_batches(&stack, &job.id).await;
    assert_sane(&batches, &job.id);
    let busiest = values(&batches, CPU_PERCENT).into_iter().fold(0.0, f64::max);
    assert!(busiest > 10.0, "the busy loop should show: {busiest}");
}

#[tokio::test]
async fn a_container_job_reports_the_engines_stats() {
    let stack = Stack::start_docker().await;
    let mut job_spec = spec(&["sh", "-c", "sleep 4"]);
    job_spec.image = test_image();
    let job = stack.submit_spec(job_spec).await;
    stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_sane(&metric_batches(&stack, &job.id).await, &job.id);
}

mod write_and_query {
    use kiln_core::auth::Scope;
    use kiln_e2e::Stack;
    use kiln_proto::v1 as pb;
    use tonic::Code;

    fn points(key: &str, steps: std::ops::Range<i64>, value: impl Fn(i64) -> f64) -> Vec<pb::MetricPoint> {
        steps
            .map(|step| pb::MetricPoint {
                key: key.into(),
                step,
                value: value(step),
                timestamp_ms: 0,
            })
            .collect()
    }

    async fn write(
        stack: &Stack,
        token: &str,
        job_id: &str,
        points: Vec<pb::MetricPoint>,
    ) -> Result<u32, tonic::Status> {
        let request = pb::WriteMetricsRequest {
            job_id: job_id.into(),
            points,
            columns: None,
        };
        Ok(stack
            .logs_as(token)
            .await
            .write_metrics(request)
            .await?
            .into_inner()
            .accepted)
    }

    /// Queries until the series holds `total` points (the writers store what was accepted).
    async fn query(stack: &Stack, job_id: &str, key: &str, max_points: u32, total: u64) -> pb::MetricSeries {
        let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
        loop {
            let request = pb::QueryMetricsRequest {
                job_ids: vec![job_id.into()],
                keys: vec![key.into()],
                max_points,
                ..Default::default()
            };
            let response = stack
                .logs_client()
                .await
                .query_metrics(request)
                .await
                .unwrap()
                .into_inner();
            if let Some(series) = response.series.into_iter().next()
                && series.total_points >= total
            {
                assert_eq!(series.total_points, total, "more points than were written");
                return series;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the points never became queryable"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn points_are_stored_exactly_once_and_come_back_faithfully() {
        let stack = Stack::start_without_runner().await;
        let job = stack.submit(&["true"]).await;
        let mut batch = points("train/loss", 0..20_000, |s| 1.0 / (s as f64 + 1.0));
        batch[7].value = f64::NAN;
        batch[8].value = f64::INFINITY;
        batch[9].value = f64::NEG_INFINITY;
        assert_eq!(
            write(&stack, &stack.token, &job.id, batch.clone()).await.unwrap(),
            20_000
        );
        // A retried request adds nothing.
        write(&stack, &stack.token, &job.id, batch[..500].to_vec())
            .await
            .unwrap();
        write(&stack, &stack.token, &job.id, points("train/acc", 0..10, |s| s as f64))
            .await
            .unwrap();

        let series = query(&stack, &job.id, "train/loss", 100_000, 20_000).await;
        assert_eq!(series.points.len(), 20_000);
        assert!(series.points[7].value.is_nan());
        assert_eq!(
            (series.points[8].value, series.points[9].value),
            (f64::INFINITY, f64::NEG_INFINITY)
        );
        assert_eq!(series.points[10].value, 1.0 / 11.0);

        let downsampled = query(&stack, &job.id, "train/loss", 500, 20_000).await;
        assert!(downsampled.points.len() <= 500, "{}", downsampled.points.len());
        let values: Vec<f64> = downsampled.points.iter().map(|p| p.value).collect();
        assert!(
            values.contains(&f64::INFINITY) && values.contains(&f64::NEG_INFINITY),
            "the extremes survive"
        );

        query(&stack, &job.id, "train/acc", 10, 10).await;
        let keys = stack
            .logs_client()
            .await
            .list_metric_keys(pb::ListMetricKeysRequest { job_id: job.id.clone() })
            .await;
        assert_eq!(keys.unwrap().into_inner().keys, ["train/acc", "train/loss"]);
        let latest = stack
            .logs_client()
            .await
            .latest_metrics(pb::LatestMetricsRequest {
                job_ids: vec![job.id.clone()],
                keys: vec![],
            })
            .await
            .unwrap()
            .into_inner()
            .series;
        let latest: Vec<(String, i64)> = latest.iter().map(|s| (s.key.clone(), s.points[0].step)).collect();
        assert_eq!(
            latest,
            [("train/acc".to_string(), 9), ("train/loss".to_string(), 19_999)]
        );
    }

    #[tokio::test]
    async fn columns_are_checked_and_stored_with_rows() {
        let stack = Stack::start_without_runner().await;
        let job = stack.submit(&["true"]).await;
        let send = |points: Vec<pb::MetricPoint>, columns: pb::MetricColumns| pb::WriteMetricsRequest {
            job_id: job.id.clone(),
            points,
            columns: Some(columns),
        };
        let columns = pb::MetricColumns {
            keys: vec!["a".into(), "b".into()],
            key_index: vec![0, 1, 0, 1],
            steps: vec![0, 0, 1, 1],
            values: vec![1.0, 2.0, f64::NAN, 4.0],
            timestamps_ms: vec![],
        };
        let mut client = stack.logs_client().await;
        let accepted = client
            .write_metrics(send(points("a", 2..4, |s| s as f64), columns.clone()))
            .await
            .unwrap()
            .into_inner()
            .accepted;
        assert_eq!(accepted, 6);
        let a = query(&stack, &job.id, "a", 100, 4).await;
        let steps: Vec<i64> = a.points.iter().map(|p| p.step).collect();
        assert_eq!(steps, [0, 1, 2, 3]);
        assert!(a.points[1].value.is_nan());
        assert!(
            a.points.iter().all(|p| p.timestamp_ms > 0),
            "the server dates undated points"
        );
        let b = query(&stack, &job.id, "b", 100, 2).await;
        assert_eq!(b.points.iter().map(|p| p.value).collect::<Vec<_>>(), [2.0, 4.0]);

        let short = pb::MetricColumns {
            values: vec![1.0],
            ..columns.clone()
        };
        let status = client.write_metrics(send(vec![], short)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("differ in length"), "{status:?}");
        let out_of_range = pb::MetricColumns {
            key_index: vec![0, 1, 2, 1],
            ..columns.clone()
        };
        let status = client.write_metrics(send(vec![], out_of_range)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("key index 2"), "{status:?}");
        let bad_times = pb::MetricColumns {
            timestamps_ms: vec![1],
            ..columns
        };
        let status = client.write_metrics(send(vec![], bad_times)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }

    #[tokio::test]
    async fn a_job_token_writes_its_own_job_only() {
        let stack = Stack::start_without_runner().await;
        let job = stack.submit(&["true"]).await;
        let other = stack.submit(&["true"]).await;
        let owner = stack.store.job(&job.id).await.unwrap().owner_id;
        let token = stack
            .store
            .create_token(&owner, "job", Scope::Job(job.id.clone()))
            .await
            .unwrap()
            .token;
        assert_eq!(
            write(&stack, &token, &job.id, points("x", 0..3, |_| 1.0))
                .await
                .unwrap(),
            3
        );
        // Another job does not exist for a job's token.
        let status = write(&stack, &token, &other.id, points("x", 0..3, |_| 1.0))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        // It reads its own job (the issue: "read and write only that job"), and no other.
        let query = |job_id: &str| pb::QueryMetricsRequest {
            job_ids: vec![job_id.to_string()],
            ..Default::default()
        };
        let mut logs = stack.logs_as(&token).await;
        logs.query_metrics(query(&job.id)).await.expect("its own job's metrics");
        let status = logs.query_metrics(query(&other.id)).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }

    #[tokio::test]
    async fn limits_are_named() {
        let stack = Stack::start_without_runner().await;
        let job = stack.submit(&["true"]).await;
        let long_key = "k".repeat(251);
        let status = write(&stack, &stack.token, &job.id, points(&long_key, 0..1, |_| 1.0))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("250"), "{status:?}");

        let big: Vec<pb::MetricPoint> = points(&"k".repeat(200), 0..25_000, |_| 1.0);
        let status = write(&stack, &stack.token, &job.id, big).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("4 MiB"), "{status:?}");

        let many: Vec<pb::MetricPoint> = (0..10_001)
            .map(|n| pb::MetricPoint {
                key: format!("k{n}"),
                step: 0,
                value: 1.0,
                timestamp_ms: 0,
            })
            .collect();
        let status = write(&stack, &stack.token, &job.id, many).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("10000 keys per job"), "{status:?}");

        // The limit counts the keys of earlier requests too.
        let keys = |range: std::ops::Range<usize>| -> Vec<pb::MetricPoint> {
            range
                .map(|n| pb::MetricPoint {
                    key: format!("k{n}"),
                    step: 0,
                    value: 1.0,
                    timestamp_ms: 0,
                })
                .collect()
        };
        write(&stack, &stack.token, &job.id, keys(0..9_999)).await.unwrap();
        let status = write(&stack, &stack.token, &job.id, keys(9_998..10_001))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("10001 metric keys"), "{status:?}");
        write(&stack, &stack.token, &job.id, keys(9_990..10_000)).await.unwrap();

        let status = write(
            &stack,
            &stack.token,
            &kiln_core::ids::new_id(),
            points("x", 0..1, |_| 1.0),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }

    #[tokio::test]
    async fn a_running_job_s_system_metrics_are_queryable() {
        let stack = Stack::start().await;
        let job = stack.submit(&["sleep", "1"]).await;
        stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
        let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
        loop {
            let keys = stack
                .logs_client()
                .await
                .list_metric_keys(pb::ListMetricKeysRequest { job_id: job.id.clone() })
                .await;
            let keys = keys.unwrap().into_inner().keys;
            if keys.iter().any(|k| k.starts_with("sys/")) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no sys metrics stored: {keys:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

mod streaming {
    use kiln_e2e::Stack;
    use kiln_proto::v1 as pb;

    #[tokio::test]
    async fn a_stream_of_batches_is_stored_whole() {
        let stack = Stack::start_without_runner().await;
        let job = stack.submit(&["true"]).await;
        let batches: Vec<pb::WriteMetricsRequest> = (0..10)
            .map(|b| pb::WriteMetricsRequest {
                job_id: job.id.clone(),
                points: (0..1000)
                    .map(|i| pb::MetricPoint {
                        key: "s".into(),
                        step: b * 1000 + i,
                        value: 1.0,
                        timestamp_ms: 0,
                    })
                    .collect(),
                columns: None,
            })
            .collect();
        let response = stack
            .logs_client()
            .await
            .write_metrics_stream(futures::stream::iter(batches))
            .await
            .unwrap();
        assert_eq!(response.into_inner().accepted, 10_000);
        let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
        loop {
            let request = pb::QueryMetricsRequest {
                job_ids: vec![job.id.clone()],
                max_points: 10,
                ..Default::default()
            };
            let series = stack
                .logs_client()
                .await
                .query_metrics(request)
                .await
                .unwrap()
                .into_inner()
                .series;
            if series.first().is_some_and(|s| s.total_points == 10_000) {
                assert!(series[0].points.len() <= 10);
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{series:?}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
