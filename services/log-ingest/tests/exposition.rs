//! log-ingest's `/metrics`: points and log lines published to its intakes are counted as
//! received and stored, the exposition passes `promtool check metrics`, and no label carries a
//! job id. Real nats-server and SQLite stores.

use std::time::Duration;

use kiln_core::config::GrpcConfig;
use kiln_core::metrics::{Metrics, MetricsConfig};
use kiln_core::store::Store;
use kiln_core::testing::{
    NatsServer, assert_no_ids_in_labels, http_get, promtool_check_metrics, series_value, sqlite_config,
};
use kiln_log_ingest::config::SqliteConfig;
use kiln_log_ingest::{Config, LogIngest};
use kiln_proto::v1 as pb;
use prost::Message;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn points_and_lines_are_counted_and_no_job_id_is_a_label() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite_config(dir.path());
    Store::connect(&database).await.unwrap().migrate().await.unwrap();
    let config = Config {
        grpc: GrpcConfig::local(0),
        database,
        nats: nats.config(),
        sqlite: SqliteConfig {
            logs_path: dir.path().join("logs.db"),
            metrics_path: dir.path().join("metrics.db"),
        },
        ..Default::default()
    };
    let metrics = Metrics::default();
    let service = LogIngest::bind(config).await.unwrap().with_metrics(&metrics);
    let shutdown = CancellationToken::new();
    let addr = kiln_core::metrics::export(&MetricsConfig::local(0), &metrics, service.nats(), &shutdown)
        .await
        .unwrap()
        .expect("enabled");
    let grpc_addr = service.local_addr();
    let nats_client = kiln_core::streams::connect(&nats.config()).await.unwrap();
    let served = tokio::spawn(service.serve(shutdown.clone()));

    // Two jobs, 3 metric messages of 250 points each and 40 log lines.
    let jobs = [kiln_core::ids::new_id(), kiln_core::ids::new_id()];
    let mut points = 0u64;
    for (n, job_id) in jobs.iter().cycle().take(3).enumerate() {
        let batch = pb::MetricBatch {
            job_id: job_id.clone(),
            attempt: 1,
            points: (0..250)
                .map(|step| pb::MetricPoint {
                    key: "loss".into(),
                    step: step + 1000 * n as i64,
                    value: 1.0 / (step + 1) as f64,
                    timestamp_ms: 1,
                })
                .collect(),
            columns: None,
        };
        points += batch.points.len() as u64;
        kiln_core::streams::publish(
            &nats_client.jetstream,
            kiln_core::subjects::metrics(job_id),
            &kiln_core::ids::new_id(),
            batch.encode_to_vec().into(),
        )
        .await
        .unwrap();
    }
    let lines = 40u64;
    for i in 0..lines {
        let job_id = &jobs[i as usize % 2];
        let record = pb::LogRecord {
            job_id: job_id.clone(),
            attempt: 1,
            text: format!("line {i} of {job_id}"),
            timestamp_ms: 1,
            ..Default::default()
        };
        kiln_core::streams::publish(
            &nats_client.jetstream,
            kiln_core::subjects::logs(job_id),
            &kiln_core::ids::new_id(),
            record.encode_to_vec().into(),
        )
        .await
        .unwrap();
    }
    // A refused call, so the RPC layer has something to count: no token.
    let mut client = pb::log_service_client::LogServiceClient::connect(format!("http://{grpc_addr}"))
        .await
        .unwrap();
    let refused = client
        .list_metric_keys(pb::ListMetricKeysRequest {
            job_id: jobs[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    let url = format!("http://{addr}/metrics");
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        text = http_get(&url).await;
        if series_value(&text, "kiln_log_ingest_points_stored_total") == Some(points as f64)
            && series_value(&text, "kiln_log_ingest_log_lines_stored_total") == Some(lines as f64)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        series_value(&text, "kiln_log_ingest_points_stored_total"),
        Some(points as f64),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_log_ingest_points_received_total"),
        Some(points as f64),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_log_ingest_log_lines_stored_total"),
        Some(lines as f64),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_log_ingest_log_lines_received_total"),
        Some(lines as f64),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_log_ingest_store_errors_total{store=\"metrics\"}"),
        Some(0.0),
        "{text}"
    );
    let batches = series_value(
        &text,
        "kiln_log_ingest_write_batch_duration_seconds_count{store=\"metrics\"}",
    )
    .unwrap();
    assert!(
        (1.0..=3.0).contains(&batches),
        "three messages in one to three batches: {text}"
    );
    let rows = series_value(&text, "kiln_log_ingest_write_batch_size_sum{store=\"logs\"}").unwrap();
    assert_eq!(rows, lines as f64, "{text}");
    assert!(text.contains("kiln_log_ingest_build_info{version=\""), "{text}");
    assert_eq!(
        series_value(
            &text,
            "kiln_log_ingest_rpc_errors_total{grpc_service=\"kiln.v1.LogService\",grpc_method=\"ListMetricKeys\",grpc_code=\"UNAUTHENTICATED\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // Within the 5 s window of the points stored: not zero.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = http_get(&url).await;
    let rate = series_value(&text, "kiln_log_ingest_points_per_second").expect("the rate is exported");
    assert!(rate > 0.0, "{rate}: {text}");
    promtool_check_metrics(&text);
    let ids: Vec<&str> = jobs.iter().map(String::as_str).collect();
    assert_no_ids_in_labels(&text, &ids);

    shutdown.cancel();
    served.await.unwrap().unwrap();
}
