//! Batches whose services crash: item-batch crashed mid-run and a worker SIGKILLed, and
//! item-batch SIGKILLed mid-intake, lose no item and count none twice.

use std::time::Duration;

use kiln_e2e::{
    BATCH_PATIENCE, Stack, add_items, assert_adds_up, batch_now, batch_spec, counts_of, create_batch, kill_a_worker,
    live_workers, mem_items, seal_batch, wait_batch,
};
use kiln_proto::v1 as pb;
use kiln_proto::v1::batch_service_client::BatchServiceClient;

#[tokio::test]
async fn killing_item_batch_and_a_worker_loses_nothing_and_counts_nothing_twice() {
    let mut stack = Stack::start_with_item_batch().await;
    let mut work = batch_spec(&["sh", "-c", "sleep 0.05; echo {item}"]);
    work.max_workers = 3;
    let batch = create_batch(&stack, work).await;
    add_items(&stack, &batch.id, mem_items((0..300).map(|n| format!("k{n:03}"))))
        .await
        .unwrap();
    seal_batch(&stack, &batch.id).await;
    wait_batch(&stack, &batch.id, "under way", |b| counts_of(b).succeeded >= 30).await;

    // SIGKILL one worker's agent: its items go to the others.
    kill_a_worker(&stack, &batch.id).await;

    // Crash item-batch mid-run and start it again.
    stack.batches.take().unwrap().crash().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.start_item_batch(stack.item_batch_config()).await;

    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts_of(&done);
    assert_eq!((c.total, c.succeeded, c.dead, c.failed), (300, 300, 0, 0), "{c:?}");
    assert_adds_up(&c);
}

/// item-batch as a process of its own on a fixed port (so workers and clients find it again
/// after a restart), SIGKILLed by the test.
struct ItemBatchProcess {
    child: tokio::process::Child,
}

impl ItemBatchProcess {
    async fn start(stack: &Stack, config_file: &std::path::Path) -> ItemBatchProcess {
        let child = tokio::process::Command::new(kiln_e2e::workspace_binary("kiln-item-batch"))
            .arg("--config")
            .arg(config_file)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("kiln-item-batch starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let addr = stack.batches_addr.expect("the fixed address");
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "kiln-item-batch did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut client = stack.batches_client().await;
        while client.list_batches(pb::ListBatchesRequest::default()).await.is_err() {
            assert!(tokio::time::Instant::now() < deadline, "kiln-item-batch did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ItemBatchProcess { child }
    }

    async fn sigkill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

/// A client of item-batch that connects when first used, so it outlives a restart.
fn lazy_batches(stack: &Stack) -> BatchServiceClient<kiln_e2e::Authed> {
    let addr = stack.batches_addr.expect("the fixed address");
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    BatchServiceClient::with_interceptor(channel, kiln_core::auth::BearerInterceptor::new(&stack.token))
        .max_encoding_message_size(16 << 20)
}

/// Adds every item until a call succeeds, as a pipeline retries after an error; returns the
/// calls made.
async fn add_until_done(mut client: BatchServiceClient<kiln_e2e::Authed>, requests: Vec<pb::AddItemsRequest>) -> u32 {
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    let mut calls = 0;
    loop {
        calls += 1;
        // A call cut off mid-stream by a SIGKILL may never be answered: a client gives up on
        // it, as a pipeline's would.
        let call = client.add_items(futures::stream::iter(requests.clone()));
        match tokio::time::timeout(Duration::from_secs(30), call).await {
            Ok(Ok(_)) => return calls,
            Ok(Err(status)) => assert!(
                tokio::time::Instant::now() < deadline,
                "the adds never got through: {status}"
            ),
            Err(_) => assert!(tokio::time::Instant::now() < deadline, "the adds never got through"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn item_batch_sigkilled_mid_intake_loses_nothing_and_counts_nothing_twice() {
    // The figure is 200,000 items (KILN_INTAKE_FAULT_ITEMS=200000); CI adds 20,000.
    let items_wanted: usize = std::env::var("KILN_INTAKE_FAULT_ITEMS")
        .ok()
        .map(|n| n.parse().expect("KILN_INTAKE_FAULT_ITEMS is a number"))
        .unwrap_or(20_000);
    let total = items_wanted as u64;
    let mut stack = Stack::start().await;
    let mut config = stack.item_batch_config();
    config.grpc.listen = std::net::SocketAddr::from(([127, 0, 0, 1], kiln_core::testing::free_port()));
    stack.batches_addr = Some(config.grpc.listen);
    let config_file = stack.dir.path().join("item-batch.toml");
    std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();
    let mut item_batch = ItemBatchProcess::start(&stack, &config_file).await;

    let mut work = batch_spec(&["kiln:noop"]);
    work.max_workers = 2;
    let batch = create_batch(&stack, work).await;
    // Two clients add every item at once, in opposite orders, each again after every error.
    let items = mem_items((0..items_wanted).map(|n| format!("k{n:06}")));
    let mut reversed = items.clone();
    reversed.reverse();
    let clients = [items, reversed].map(|items| {
        tokio::spawn(add_until_done(
            lazy_batches(&stack),
            kiln_e2e::add_requests(&batch.id, &items, 1000),
        ))
    });
    // Whatever a poll sees adds up, between the crashes too.
    let polls = {
        let mut client = lazy_batches(&stack);
        let batch_id = batch.id.clone();
        tokio::spawn(async move {
            let mut seen = 0u32;
            loop {
                if let Ok(b) = client
                    .get_batch(pb::BatchRef {
                        batch_id: batch_id.clone(),
                    })
                    .await
                {
                    let b = b.into_inner();
                    assert_adds_up(&counts_of(&b));
                    seen += 1;
                    if b.state == pb::BatchState::Done as i32 {
                        return seen;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // SIGKILL it twice while the intake is under way, and start it again each time.
    let mut recorded_at_kills = Vec::new();
    for share in [10, 50] {
        let what = format!("{share}% of the items recorded");
        let seen = wait_batch(&stack, &batch.id, &what, |b| counts_of(b).total * 100 >= total * share).await;
        item_batch.sigkill().await;
        recorded_at_kills.push(counts_of(&seen).total);
        item_batch = ItemBatchProcess::start(&stack, &config_file).await;
    }
    let calls: Vec<u32> = futures::future::join_all(clients)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let recorded = counts_of(&batch_now(&stack, &batch.id).await).total;
    assert_eq!(recorded, total, "every item is recorded once");
    assert!(
        calls.iter().any(|&n| n > 1),
        "no add was cut off by a SIGKILL (calls: {calls:?}): the test proved nothing"
    );

    // A worker SIGKILLed meanwhile loses nothing either.
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    while live_workers(&stack, &batch.id).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no worker came up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill_a_worker(&stack, &batch.id).await;
    seal_batch(&stack, &batch.id).await;
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts_of(&done);
    assert_eq!((c.total, c.succeeded, c.dead, c.failed), (total, total, 0, 0), "{c:?}");
    assert_adds_up(&c);
    let polls = polls.await.unwrap();
    // A busy session records its outcomes in groups, one message for many items.
    let messages = kiln_e2e::stored_count(
        &stack,
        kiln_core::subjects::STREAM_ITEM_RESULTS,
        &kiln_core::subjects::item_results(&batch.id),
    )
    .await;
    assert!(
        messages > 0 && messages * 4 <= items_wanted,
        "{messages} outcome messages for {total} items: the outcomes were not grouped"
    );
    eprintln!("{messages} outcome messages for {total} items");
    eprintln!(
        "{total} items from two clients, item-batch SIGKILLed with {recorded_at_kills:?} recorded, adds called {calls:?} times: \
         every item succeeded once; {polls} polls added up"
    );
}
