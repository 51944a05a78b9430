//! kiln's streams and buckets on a real three-node NATS cluster, and on a single server asked
//! for three replicas.

use std::time::Duration;

use kiln_core::config::NatsConfig;
use kiln_core::streams::{self, BUCKETS, bucket_stream, stream_configs};
use kiln_core::testing::{NatsCluster, NatsServer};

/// Every stream kiln uses, the KV buckets' included.
fn every_stream() -> Vec<String> {
    let mut names: Vec<String> = stream_configs(1).into_iter().map(|c| c.name).collect();
    names.extend(BUCKETS.iter().map(|(bucket, _)| bucket_stream(bucket)));
    names
}

/// Asserts that every stream has `replicas` replicas, a leader and `current` followers that
/// are current (waiting for them to catch up after an update).
async fn assert_replicas(nats: &streams::Nats, replicas: usize, current: usize) {
    for name in every_stream() {
        let mut stream = nats.jetstream.get_stream(&name).await.expect("the stream exists");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let info = stream.info().await.expect("stream info").clone();
            assert_eq!(info.config.num_replicas, replicas, "{name}: {info:?}");
            let cluster = info.cluster.clone().expect("cluster info");
            let followers = cluster.replicas.iter().filter(|peer| peer.current).count();
            if cluster.leader.is_some() && followers == current {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} is not replicated: {cluster:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn every_stream_and_bucket_is_replicated_three_ways_on_a_cluster() {
    let cluster = NatsCluster::start().await;
    let nats = streams::connect(&cluster.config()).await.expect("connect");
    assert_replicas(&nats, 3, 2).await;
}

#[tokio::test]
async fn streams_made_with_one_replica_are_raised_to_the_configured_replicas() {
    let cluster = NatsCluster::start().await;
    let one = NatsConfig {
        replicas: 1,
        ..cluster.config()
    };
    let nats = streams::connect(&one).await.expect("connect with one replica");
    assert_replicas(&nats, 1, 0).await;
    let nats = streams::connect(&cluster.config()).await.expect("connect with three");
    assert_replicas(&nats, 3, 2).await;
}

#[tokio::test]
async fn three_replicas_on_a_single_server_is_a_clear_error() {
    let server = NatsServer::start();
    let config = NatsConfig {
        replicas: 3,
        ..server.config()
    };
    let error = streams::connect(&config)
        .await
        .expect_err("one server cannot hold three replicas");
    let message = error.to_string();
    assert!(
        message.contains("needs a JetStream cluster of at least 3 servers"),
        "{message}"
    );
}

#[tokio::test]
async fn a_list_of_servers_reaches_the_live_ones() {
    let mut cluster = NatsCluster::start().await;
    cluster.kill(0);
    // One server of the list is dead: the client finds a live one.
    let nats = streams::connect(&cluster.config())
        .await
        .expect("connect past a dead node");
    assert_replicas(&nats, 3, 1).await;
}

#[tokio::test]
async fn the_first_connect_is_retried_until_the_cluster_is_up() {
    let mut cluster = NatsCluster::start().await;
    for index in 0..NatsCluster::SIZE {
        cluster.kill(index);
    }
    let config = cluster.config();
    let connecting = tokio::spawn(async move { streams::connect(&config).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!connecting.is_finished(), "connect gave up while no server was up");
    for index in 0..NatsCluster::SIZE {
        cluster.start_node(index);
    }
    let nats = connecting.await.unwrap().expect("connected once the cluster came back");
    assert_replicas(&nats, 3, 2).await;
}
