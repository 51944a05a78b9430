//! The runner's and item-batch's `/metrics` after real work: a process job through launch to
//! its end, a small batch with a dead letter. Each exposition passes `promtool check metrics`,
//! holds the named metrics with the values the work implies, and no label carries a job, item,
//! batch or user id.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::metrics::{Metrics, MetricsConfig};
use kiln_core::testing::{assert_no_ids_in_labels, http_get, promtool_check_metrics, series_value};
use kiln_e2e::{PATIENCE, Stack};
use kiln_proto::v1 as pb;
use tokio_util::sync::CancellationToken;

/// Checks the exposition with promtool and that no label value holds one of `ids`.
fn assert_clean(exposition: &str, ids: &[String]) {
    promtool_check_metrics(exposition);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_no_ids_in_labels(exposition, &ids);
}

/// Scrapes `addr` until `ready` holds (or the patience runs out) and returns the last scrape.
async fn scrape_until(addr: SocketAddr, ready: impl Fn(&str) -> bool) -> String {
    let url = format!("http://{addr}/metrics");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = http_get(&url).await;
        if ready(&text) || tokio::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_runner_counts_launches_ends_outputs_and_spend() {
    let stack = Stack::start_without_runner().await;
    let metrics = Metrics::default();
    let runner = kiln_runner::Runner::bind(stack.runner_config("runner-metrics"))
        .await
        .expect("runner binds")
        .with_metrics(&metrics);
    let shutdown = CancellationToken::new();
    let addr = kiln_core::metrics::export(&MetricsConfig::local(0), &metrics, runner.nats(), &shutdown)
        .await
        .unwrap()
        .expect("enabled");
    let served = tokio::spawn(runner.serve(shutdown.clone()));

    let writes = stack
        .submit(&[
            "sh",
            "-c",
            "head -c 5000 /dev/zero > \"$KILN_OUTPUTS/out.bin\"; echo done",
        ])
        .await;
    let fails = stack.submit(&["sh", "-c", "exit 3"]).await;
    let done = stack.wait_for_state(&writes.id, pb::JobState::Succeeded).await;
    stack.wait_for_state(&fails.id, pb::JobState::Failed).await;

    let pool = "pool=\"local\"";
    let text = scrape_until(addr, |text| {
        series_value(text, &format!("kiln_runner_stops_total{{{pool},reason=\"failed\"}}")) == Some(1.0)
            && series_value(text, &format!("kiln_runner_stops_total{{{pool},reason=\"succeeded\"}}")) == Some(1.0)
    })
    .await;
    assert_eq!(
        series_value(&text, &format!("kiln_runner_launches_total{{{pool}}}")),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, &format!("kiln_runner_launch_duration_seconds_count{{{pool}}}")),
        Some(2.0),
        "{text}"
    );
    for reason in ["succeeded", "failed"] {
        assert_eq!(
            series_value(&text, &format!("kiln_runner_stops_total{{{pool},reason=\"{reason}\"}}")),
            Some(1.0),
            "{text}"
        );
    }
    let synced = series_value(&text, &format!("kiln_runner_outputs_synced_bytes_total{{{pool}}}")).unwrap();
    assert!(synced >= 5000.0, "{synced}: {text}");
    assert_eq!(
        series_value(
            &text,
            &format!("kiln_runner_outputs_sync_duration_seconds_count{{{pool}}}")
        ),
        Some(2.0),
        "{text}"
    );
    for state in ["provisioning", "running", "stopping", "syncing"] {
        assert_eq!(
            series_value(&text, &format!("kiln_runner_instances{{{pool},state=\"{state}\"}}")),
            Some(0.0),
            "every instance is released: {text}"
        );
    }
    let spent = series_value(
        &text,
        &format!("kiln_runner_spend_dollars_total{{{pool},market=\"on-demand\"}}"),
    );
    assert!(spent.is_some_and(|s| s >= 0.0), "{text}");
    assert_eq!(
        series_value(&text, "kiln_runner_idle_gpu_kills_total{pool=\"local\"}"),
        Some(0.0),
        "{text}"
    );
    assert!(
        series_value(&text, "kiln_runner_job_transitions_total{state=\"RUNNING\"}") == Some(2.0),
        "{text}"
    );
    assert!(text.contains("kiln_runner_build_info{version=\""), "{text}");
    assert_eq!(
        series_value(
            &text,
            "kiln_runner_provider_errors_total{pool=\"local\",provider=\"process\"}"
        ),
        Some(0.0),
        "{text}"
    );
    assert_clean(&text, &[writes.id.clone(), fails.id.clone(), done.owner.clone()]);

    shutdown.cancel();
    served.await.unwrap().unwrap();
}

fn item(key: &str) -> pb::Item {
    pb::Item {
        key: key.into(),
        uri: format!("mem://{key}"),
        params: Default::default(),
    }
}

#[tokio::test]
async fn item_batch_counts_items_and_reports_its_batches() {
    let mut stack = Stack::start().await;
    let metrics = Metrics::default();
    let service = kiln_item_batch::ItemBatch::bind(stack.item_batch_config())
        .await
        .expect("item-batch binds")
        .with_metrics(&metrics);
    let shutdown = CancellationToken::new();
    let addr = kiln_core::metrics::export(&MetricsConfig::local(0), &metrics, service.nats(), &shutdown)
        .await
        .unwrap()
        .expect("enabled");
    stack.batches_addr = Some(service.local_addr());
    let served = tokio::spawn(service.serve(shutdown.clone()));

    let mut batches = stack.batches_client().await;
    let spec = pb::BatchSpec {
        name: "metrics".into(),
        command: ["sh", "-c", "case {item} in poison) exit 4;; esac; echo {item}"]
            .map(String::from)
            .to_vec(),
        cpu_millis: 100,
        memory_mb: 64,
        max_attempts: 2,
        max_workers: 2,
        ..Default::default()
    };
    let batch = batches
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<String> = (0..6).map(|n| format!("key-{n}")).chain(["poison".into()]).collect();
    let request = pb::AddItemsRequest {
        batch_id: batch.id.clone(),
        items: keys.iter().map(|key| item(key)).collect(),
    };
    let added = batches
        .add_items(futures::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.added, 7);
    let sealed = pb::BatchRef {
        batch_id: batch.id.clone(),
    };
    batches.seal_batch(sealed.clone()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let current = batches.get_batch(sealed.clone()).await.unwrap().into_inner();
        if current.state == pb::BatchState::Done as i32 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the batch never ended: {current:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let text = scrape_until(addr, |text| {
        series_value(text, "kiln_item_batch_batches{state=\"done\"}") == Some(1.0)
            && series_value(text, "kiln_item_batch_workers_live") == Some(0.0)
    })
    .await;
    assert_eq!(
        series_value(&text, "kiln_item_batch_items_added_total"),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_item_batch_items_succeeded_total"),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_item_batch_items_failed_total"),
        Some(2.0),
        "poison's two attempts: {text}"
    );
    assert_eq!(
        series_value(&text, "kiln_item_batch_items_dead_total"),
        Some(1.0),
        "{text}"
    );
    let dispatched = series_value(&text, "kiln_item_batch_items_dispatched_total").unwrap();
    assert!(dispatched >= 8.0, "six items once, poison twice: {text}");
    assert_eq!(
        series_value(&text, "kiln_item_batch_batches{state=\"done\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_item_batch_batches{state=\"open\"}"),
        Some(0.0),
        "{text}"
    );
    for state in ["pending", "leased", "succeeded", "failed", "dead"] {
        assert_eq!(
            series_value(&text, &format!("kiln_item_batch_backlog_items{{state=\"{state}\"}}")),
            Some(0.0),
            "no batch is live any more: {text}"
        );
    }
    assert_eq!(
        series_value(&text, "kiln_item_batch_workers_requested"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series_value(&text, "kiln_item_batch_scaler_leader"),
        Some(1.0),
        "{text}"
    );
    assert!(
        series_value(&text, "kiln_item_batch_items_per_second").is_some(),
        "{text}"
    );
    assert!(text.contains("kiln_item_batch_build_info{version=\""), "{text}");
    assert!(
        series_value(
            &text,
            "kiln_item_batch_rpc_requests_total{grpc_service=\"kiln.v1.BatchService\",grpc_method=\"AddItems\"}"
        ) == Some(1.0),
        "{text}"
    );
    assert!(
        text.contains(
            "kiln_item_batch_rpc_requests_total{grpc_service=\"kiln.v1.ItemWorkService\",grpc_method=\"Work\"}"
        ),
        "{text}"
    );
    let owner = batch.owner.clone();
    let mut ids = vec![batch.id.clone(), owner];
    ids.extend(keys.iter().cloned());
    let workers = stack
        .store
        .list_jobs(None, &kiln_core::authz::Visible::All, true, 1000)
        .await
        .unwrap();
    ids.extend(
        workers
            .into_iter()
            .filter(|job| job.batch_id == batch.id)
            .map(|job| job.id),
    );
    assert!(ids.len() > 9, "the batch had workers: {ids:?}");
    assert_clean(&text, &ids);

    shutdown.cancel();
    served.await.unwrap().unwrap();
}
