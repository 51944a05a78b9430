//! The api's and the scheduler's `/metrics` after real work: jobs submitted, placed, run,
//! stopped and refused. The exposition parses with `promtool check metrics`, carries the
//! metrics the operators' dashboards read, and no label carries a job or user id.

use std::time::Duration;

use kiln_core::metrics::MetricsConfig;
use kiln_core::testing::{assert_no_ids_in_labels, http_get, promtool_check_metrics, sample_value, samples};
use kiln_e2e::*;
use kiln_proto::v1 as pb;

#[tokio::test]
async fn api_and_scheduler_export_what_they_did() {
    let stack = Stack::start().await;
    let mut config = MetricsConfig::local(0);
    config.consumer_lag = true;
    config.refresh_ms = 200;
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let addr = kiln_core::metrics::export(&config, &stack.metrics, &nats, &shutdown)
        .await
        .unwrap()
        .expect("enabled");

    stack.create_project("vision").await;
    let mut done = spec(&["sh", "-c", "echo hi"]);
    done.project = "vision".into();
    let done = stack.submit_spec(done).await;
    let long = stack.submit(&["sleep", "60"]).await;
    stack.wait_for_state(&done.id, pb::JobState::Succeeded).await;
    stack.wait_for_state(&long.id, pb::JobState::Running).await;
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest {
            job_id: long.id.clone(),
        })
        .await
        .unwrap();
    stack.wait_for_state(&long.id, pb::JobState::Stopped).await;
    // Too big for any pool: it waits, and the api stops it while it is still QUEUED.
    let mut huge = spec(&["true"]);
    huge.resources = Some(pb::Resources {
        cpu_millis: 64_000,
        memory_bytes: 64 << 20,
        ..Default::default()
    });
    let huge = stack.submit_spec(huge).await;
    let mut waited = false;
    for _ in 0..100 {
        let text = http_get(&format!("http://{addr}/metrics")).await;
        if text.contains("kiln_scheduler_waiting_jobs{reason=\"no-pool-fits\"} 1") {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(waited, "the scheduler never counted the job that fits no pool");
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest {
            job_id: huge.id.clone(),
        })
        .await
        .unwrap();
    stack.wait_for_state(&huge.id, pb::JobState::Stopped).await;
    let refused = stack
        .jobs()
        .await
        .get_job(pb::GetJobRequest {
            job_id: "no-such-job".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let url = format!("http://{addr}/metrics");
    let mut text = String::new();
    for _ in 0..100 {
        text = http_get(&url).await;
        // Until the lag was read and the api's reconciler counted the jobs after the stop.
        let running: Vec<f64> = samples(&text)
            .into_iter()
            .filter(|s| s.name == "kiln_api_jobs" && s.labels.iter().any(|(k, v)| k == "state" && v == "RUNNING"))
            .map(|s| s.value)
            .collect();
        if text.contains("kiln_nats_consumer_pending_messages{")
            && !running.is_empty()
            && running.iter().sum::<f64>() == 0.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    promtool_check_metrics(&text);

    let job_service = ("grpc_service", "kiln.v1.JobService");
    assert!(
        sample_value(
            &text,
            "kiln_api_rpc_requests_total",
            &[job_service, ("grpc_method", "SubmitJob")]
        ) >= 2.0
    );
    assert_eq!(
        sample_value(
            &text,
            "kiln_api_rpc_errors_total",
            &[
                job_service,
                ("grpc_method", "GetJob"),
                ("grpc_code", "INVALID_ARGUMENT")
            ]
        ),
        1.0
    );
    assert!(
        sample_value(
            &text,
            "kiln_api_rpc_duration_seconds_count",
            &[job_service, ("grpc_method", "SubmitJob")]
        ) >= 2.0
    );
    assert_eq!(
        sample_value(&text, "kiln_api_jobs_submitted_total", &[("project", "vision")]),
        1.0
    );
    assert_eq!(
        sample_value(&text, "kiln_api_job_transitions_total", &[("state", "STOPPED")]),
        1.0
    );
    assert_eq!(
        sample_value(&text, "kiln_scheduler_job_transitions_total", &[("state", "SCHEDULED")]),
        2.0
    );
    assert_eq!(sample_value(&text, "kiln_scheduler_leader", &[]), 1.0);
    assert!(sample_value(&text, "kiln_scheduler_passes_total", &[]) >= 1.0);
    assert!(sample_value(&text, "kiln_scheduler_pass_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(
        sample_value(
            &text,
            "kiln_scheduler_placements_total",
            &[("pool", "local"), ("market", "on-demand")]
        ),
        2.0
    );
    assert_eq!(
        sample_value(&text, "kiln_scheduler_queue_wait_seconds_count", &[("pool", "local")]),
        2.0
    );
    assert_eq!(
        sample_value(
            &text,
            "kiln_scheduler_capacity",
            &[("pool", "local"), ("resource", "cpu")]
        ),
        2.0
    );
    assert!(text.contains("kiln_scheduler_running_jobs{"), "{text}");
    assert!(text.contains("kiln_scheduler_held{"), "{text}");
    assert!(text.contains("kiln_scheduler_pending_jobs{"), "{text}");
    assert_eq!(sample_value(&text, "kiln_api_jobs", &[("state", "RUNNING")]), 0.0);
    assert!(
        samples(&text)
            .iter()
            .any(|s| s.name == "kiln_nats_consumer_pending_messages"
                && s.labels.iter().any(|(k, v)| k == "consumer" && v == "launch")),
        "{text}"
    );
    assert_no_ids_in_labels(&text, &[&done.id, &long.id, &huge.id, &done.owner]);
    shutdown.cancel();
}
