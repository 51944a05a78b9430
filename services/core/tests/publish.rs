//! Pipelined publishing on a real nats-server: pipelines that share a connection cannot starve
//! one another, nor the connection's other publishers, of acks.

use std::time::Duration;

use kiln_core::lease::Lease;
use kiln_core::publish::Pipeline;
use kiln_core::streams;
use kiln_core::subjects;
use kiln_core::testing::NatsServer;

/// Sends `count` messages through a pipeline of `in_flight`; returns how many are stored.
async fn send_through(nats: &streams::Nats, batch: &str, count: usize, in_flight: usize) -> u64 {
    let mut pipeline = Pipeline::new(nats.jetstream.clone(), subjects::items(batch), in_flight);
    for n in 0..count {
        let payload = bytes::Bytes::from(format!("item {n}"));
        pipeline.send(format!("{batch}:{n}"), payload).await.expect("sent");
        // Take turns with the other pipelines, as intakes of separate requests do.
        tokio::task::yield_now().await;
    }
    pipeline.settle().await.expect("stored");
    pipeline.stored()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_on_one_connection_together_wider_than_its_acks_all_finish() {
    // async-nats lets a connection await 5,000 acks; two intakes of 4,096 each once held 2,500
    // apiece and each waited for the other's to free one, and a lease's renewal waited behind
    // them: item-batch stopped publishing and no standby ever took the scaler over.
    let server = NatsServer::start();
    let nats = streams::connect(&server.config()).await.expect("connect");
    let lease = async {
        let mut lease = Lease::new(&nats, "publish-test", "holder", Duration::from_secs(10))
            .await
            .expect("the lease bucket");
        tokio::time::sleep(Duration::from_millis(50)).await;
        lease.tick().await.expect("the lease is written")
    };
    let all = async {
        tokio::join!(
            send_through(&nats, "a", 12_000, 4096),
            send_through(&nats, "b", 12_000, 4096),
            send_through(&nats, "c", 3_000, 1024),
            lease,
        )
    };
    let (a, b, c, leading) = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the pipelines and the lease deadlocked on the connection's acks");
    assert_eq!((a, b, c, leading), (12_000, 12_000, 3_000, true));
}
