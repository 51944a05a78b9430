//! Two item-batch replicas: both serve the API and the workers, one runs the scaler; when it
//! crashes the other takes the scaler over within the lease TTL, asks for no worker twice, and
//! the workers that worked for the dead one go on with the survivor.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::lease::Lease;
use kiln_core::subjects;
use kiln_e2e::{Stack, assert_adds_up};
use kiln_proto::v1 as pb;

const ITEMS: usize = 300;
const MAX_WORKERS: u32 = 3;
const PATIENCE: Duration = Duration::from_secs(240);

/// A loopback address free now, so both replicas can be told each other's before they bind.
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn replica_config(stack: &Stack, name: &str, listen: SocketAddr, advertise: &str) -> kiln_item_batch::Config {
    let mut config = stack.item_batch_config();
    config.grpc.listen = listen;
    config.instance_name = name.into();
    config.lease_ttl_ms = 1_500;
    config.advertise_url = advertise.into();
    config
}

async fn scaler_leader(stack: &Stack) -> Option<String> {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    Lease::current(&nats, subjects::LEASE_ITEM_BATCH_SCALER)
        .await
        .unwrap()
        .map(|holder| holder.holder)
}

async fn wait_for_leader(stack: &Stack, name: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while scaler_leader(stack).await.as_deref() != Some(name) {
        assert!(tokio::time::Instant::now() < deadline, "{name} never led the scaler");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_standby_replica_takes_the_scaler_over_without_asking_for_workers_twice() {
    let stack = Stack::start().await;
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let advertise = format!("http://{a_addr},http://{b_addr}");
    let (a, _) = stack
        .spawn_item_batch(replica_config(&stack, "batch-a", a_addr, &advertise))
        .await;
    wait_for_leader(&stack, "batch-a").await;
    let (b, _) = stack
        .spawn_item_batch(replica_config(&stack, "batch-b", b_addr, &advertise))
        .await;

    // Created and fed through the standby: every replica serves the API.
    let mut client = stack.batches_client_at(b_addr).await;
    let batch = client
        .create_batch(pb::CreateBatchRequest {
            spec: Some(pb::BatchSpec {
                name: "replicas".into(),
                command: vec!["kiln:sleep".into(), "40".into()],
                cpu_millis: 100,
                memory_mb: 64,
                max_attempts: 3,
                max_workers: MAX_WORKERS,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let items: Vec<pb::Item> = (0..ITEMS)
        .map(|n| pb::Item {
            key: format!("item-{n}"),
            uri: format!("mem://{n}"),
            params: Default::default(),
        })
        .collect();
    client
        .add_items(futures::stream::iter([pb::AddItemsRequest {
            batch_id: batch.id.clone(),
            items,
        }]))
        .await
        .unwrap();
    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();

    // Polls the survivor; at every poll the counters add up and no more workers are live than
    // the batch allows (two scalers at once would each ask for MAX_WORKERS).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut a = Some(a);
    let mut rate_seen_on_standby = false;
    let done = loop {
        let now = client
            .get_batch(pb::BatchRef {
                batch_id: batch.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let counts = now.counts.unwrap();
        assert_adds_up(&counts);
        let live = stack.store.live_batch_workers(&batch.id).await.unwrap().len();
        assert!(
            live <= MAX_WORKERS as usize,
            "{live} workers live, more than max_workers {MAX_WORKERS}: a scaler asked twice"
        );
        rate_seen_on_standby |= a.is_some() && now.items_per_second > 0.0;
        // Crash the leader mid-batch, once the standby has shown it knows the rate too.
        if a.is_some() && rate_seen_on_standby && counts.succeeded >= (ITEMS / 4) as u64 {
            a.take().unwrap().crash().await;
        }
        if now.state == pb::BatchState::Done as i32 {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "batch never done: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        a.is_none(),
        "the batch ended before the leader could be crashed: the standby never answered with a rate"
    );
    assert_eq!(scaler_leader(&stack).await.as_deref(), Some("batch-b"));
    let counts = done.counts.unwrap();
    assert_eq!(
        (counts.total, counts.succeeded, counts.dead, counts.failed),
        (ITEMS as u64, ITEMS as u64, 0, 0),
        "{counts:?}"
    );
    // Workers leave once there is nothing left to do.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !stack.store.live_batch_workers(&batch.id).await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "workers never left");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.stop().await;
}

#[tokio::test]
async fn a_replica_that_does_not_hold_the_scaler_lease_asks_for_no_workers() {
    let stack = Stack::start().await;
    // Someone else leads the scaler: this replica serves, but must not scale.
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let mut outsider = Lease::new(
        &nats,
        subjects::LEASE_ITEM_BATCH_SCALER,
        "outsider",
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    assert!(outsider.tick().await.unwrap());
    let listen = free_addr();
    let (replica, _) = stack
        .spawn_item_batch(replica_config(&stack, "batch-a", listen, &format!("http://{listen}")))
        .await;
    let mut client = stack.batches_client_at(listen).await;
    let batch = client
        .create_batch(pb::CreateBatchRequest {
            spec: Some(pb::BatchSpec {
                name: "standby".into(),
                command: vec!["kiln:noop".into()],
                cpu_millis: 100,
                memory_mb: 64,
                max_attempts: 1,
                max_workers: MAX_WORKERS,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    client
        .add_items(futures::stream::iter([pb::AddItemsRequest {
            batch_id: batch.id.clone(),
            items: vec![pb::Item {
                key: "one".into(),
                uri: "mem://one".into(),
                params: Default::default(),
            }],
        }]))
        .await
        .unwrap();
    let succeeded = |batch: &pb::Batch| batch.counts.unwrap().succeeded;
    let get = |mut client: kiln_proto::v1::batch_service_client::BatchServiceClient<kiln_e2e::Authed>,
               batch_id: String| async move {
        client.get_batch(pb::BatchRef { batch_id }).await.unwrap().into_inner()
    };
    // Many scale intervals (200 ms) pass with a backlog and no worker to take it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = get(client.clone(), batch.id.clone()).await;
    assert_eq!(succeeded(&waiting), 0, "a standby asked for workers: {waiting:?}");
    assert!(stack.store.live_batch_workers(&batch.id).await.unwrap().is_empty());
    // Once the lease is free, the replica takes it and scales.
    outsider.release().await.unwrap();
    wait_for_leader(&stack, "batch-a").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while succeeded(&get(client.clone(), batch.id.clone()).await) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new leader never asked for a worker"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replica.stop().await;
}
