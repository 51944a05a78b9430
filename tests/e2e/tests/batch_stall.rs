//! A batch whose workers cannot start (a docker runner without the agent binary, as a plain
//! `kiln up` once was) stalls after `max-worker-failures` failed workers in a row, with their
//! reason, instead of asking for new ones for ever; fixed and retried, it runs to the end.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_e2e::{Stack, run_batch_to_done, static_agent_binary, test_image};
use kiln_proto::v1 as pb;

const MAX_WORKER_FAILURES: u32 = 3;
const MAX_WORKERS: u32 = 2;
const ITEMS: usize = 20;

/// The worker jobs item-batch asked for so far for the batch.
async fn workers(stack: &Stack, batch_id: &str) -> Vec<kiln_core::store::JobRecord> {
    let mut jobs = stack
        .store
        .list_jobs(None, &kiln_core::authz::Visible::All, true, 1000)
        .await
        .unwrap();
    jobs.retain(|job| job.batch_id == batch_id);
    jobs
}

#[tokio::test]
async fn a_batch_whose_workers_cannot_start_stalls_with_their_reason_and_resumes_on_retry() {
    let mut stack = Stack::start_without_runner().await;
    let mut config = stack.item_batch_config();
    // Containers reach item-batch through the bridge's gateway, so it listens beyond loopback.
    config.grpc.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    config.max_worker_failures = MAX_WORKER_FAILURES;
    stack.start_item_batch(config).await;
    let mut runner = stack.docker_runner_config(&stack.docker_runner_id());
    runner.docker.network = "bridge".into();
    // The engine's bridge, unconfined: the isolated network has its own tests (docker_isolation.rs).
    runner.docker.isolate_jobs = false;
    runner.cpu_millis = 2000;
    // No agent binary: every worker fails at once.
    stack.runner = Some(stack.spawn_runner(runner.clone()).await);

    let mut client = stack.batches_client().await;
    let spec = pb::BatchSpec {
        name: "stall".into(),
        image: test_image(),
        command: vec!["kiln:noop".into()],
        cpu_millis: 250,
        memory_mb: 64,
        max_workers: MAX_WORKERS,
        ..Default::default()
    };
    let batch = client
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    let items = (0..ITEMS)
        .map(|n| pb::Item {
            key: format!("{n:02}"),
            uri: format!("mem://{n}"),
            params: Default::default(),
        })
        .collect();
    let request = pb::AddItemsRequest {
        batch_id: batch.id.clone(),
        items,
    };
    client.add_items(futures::stream::iter([request])).await.unwrap();
    let batch_ref = pb::BatchRef {
        batch_id: batch.id.clone(),
    };
    client.seal_batch(batch_ref.clone()).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let stalled = loop {
        let now = client.get_batch(batch_ref.clone()).await.unwrap().into_inner();
        if !now.stalled_reason.is_empty() {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the batch never stalled: {now:?}, workers {:?}",
            workers(&stack, &batch.id)
                .await
                .iter()
                .map(|w| (&w.state, &w.reason))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stalled.state, pb::BatchState::Sealed as i32);
    assert!(
        stalled.stalled_reason.contains("3 workers in a row failed")
            && stalled.stalled_reason.contains("no agent-binary"),
        "{}",
        stalled.stalled_reason
    );
    // It stopped asking: the workers asked for stay bounded, and no more come.
    let asked = workers(&stack, &batch.id).await.len();
    assert!(
        (MAX_WORKER_FAILURES as usize..=(MAX_WORKER_FAILURES + MAX_WORKERS) as usize).contains(&asked),
        "{asked} workers asked for"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        workers(&stack, &batch.id).await.len(),
        asked,
        "a stalled batch asks for no workers"
    );
    let still = client.get_batch(batch_ref.clone()).await.unwrap().into_inner();
    assert_eq!(still.stalled_reason, stalled.stalled_reason);
    assert_eq!(still.counts.unwrap().succeeded, 0);

    // Fixed (the runner gets the static agent), then retried: it runs to the end.
    stack.runner.take().unwrap().stop().await;
    runner.agent_binary = static_agent_binary();
    stack.runner = Some(stack.spawn_runner(runner).await);
    let retried = client.retry_failed(batch_ref.clone()).await.unwrap().into_inner();
    assert!(retried.resumed, "{retried:?}");
    assert_eq!(retried.retried, 0, "no item died: none had a worker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let run = run_batch_to_done(&mut client, &batch.id, deadline)
        .await
        .unwrap_or_else(|now| panic!("the retried batch did not finish: {now:?}"));
    assert_eq!(run.done.counts.unwrap().succeeded, ITEMS as u64);
    assert!(run.done.stalled_reason.is_empty());
    let again = client.retry_failed(batch_ref).await.unwrap().into_inner();
    assert!(!again.resumed, "a batch that is not stalled is not resumed");
}
