//! A batch on the Docker Engine with item-batch serving TLS only and requiring client
//! certificates: the static kiln-agent in each container reaches it at the bridge's gateway
//! with the CA and client certificate the runner hands it (`job-tls`).

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::auth::BearerInterceptor;
use kiln_core::testing::TestCa;
use kiln_e2e::{BatchRun, Stack, docker, run_batch_to_done, static_agent_binary, test_image};
use kiln_proto::v1 as pb;
use kiln_proto::v1::batch_service_client::BatchServiceClient;

const ITEMS: usize = 200;

/// The host's address on the default bridge, where the runner points containers at loopback
/// services: the IPAM gateway, else the first address of the subnet (as the docker provider).
async fn bridge_gateway() -> String {
    let network = docker()
        .await
        .inspect_network("bridge", None::<bollard::query_parameters::InspectNetworkOptions>)
        .await
        .expect("the bridge network");
    let configs = network.ipam.and_then(|ipam| ipam.config).unwrap_or_default();
    configs
        .into_iter()
        .find_map(|config| {
            if let Some(gateway) = config.gateway.filter(|g| !g.is_empty()) {
                return Some(gateway);
            }
            let subnet: std::net::Ipv4Addr = config.subnet?.split_once('/')?.0.parse().ok()?;
            Some(std::net::Ipv4Addr::from(u32::from(subnet) + 1).to_string())
        })
        .expect("the bridge has an IPv4 subnet")
}

#[tokio::test]
async fn agents_in_containers_reach_a_tls_only_item_batch_with_the_runner_s_certificate() {
    let mut stack = Stack::start_without_runner().await;
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new(certs.path(), "kiln");
    let gateway = bridge_gateway().await;
    let server = ca.server_cert_for("item-batch", &[&gateway]);
    let mut config = stack.item_batch_config();
    config.grpc.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    config.grpc.tls = kiln_core::tls::ServerTlsConfig {
        cert_file: Some(server.cert_file),
        key_file: Some(server.key_file),
        client_ca_file: Some(ca.ca_file.clone()),
        require_client_cert: true,
    };
    stack.start_item_batch(config).await;
    let mut runner = stack.docker_runner_config(&stack.docker_runner_id());
    runner.docker.network = "bridge".into();
    // The engine's bridge, unconfined: the isolated network has its own tests (docker_isolation.rs).
    runner.docker.isolate_jobs = false;
    runner.agent_binary = static_agent_binary();
    runner.job_tls = ca.client_tls("job");
    stack.runner = Some(stack.spawn_runner(runner).await);

    let url = format!("https://127.0.0.1:{}", stack.batches_addr.unwrap().port());
    let channel = kiln_core::tls::endpoint(&url, &ca.client_tls("test"))
        .unwrap()
        .connect()
        .await
        .expect("a TLS client of the CA connects");
    let mut client = BatchServiceClient::with_interceptor(channel, BearerInterceptor::new(&stack.token));
    let spec = pb::BatchSpec {
        name: "docker-tls".into(),
        image: test_image(),
        command: ["true", "{item}"].iter().map(|s| s.to_string()).collect(),
        cpu_millis: 500,
        memory_mb: 64,
        max_attempts: 2,
        max_workers: 2,
        ..Default::default()
    };
    let batch = client
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    let items = (0..ITEMS)
        .map(|n| pb::Item {
            key: format!("{n:03}"),
            uri: format!("mem://{n}"),
            params: Default::default(),
        })
        .collect();
    let request = pb::AddItemsRequest {
        batch_id: batch.id.clone(),
        items,
    };
    let added = client
        .add_items(futures::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.total, ITEMS as u64);
    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let BatchRun { done, .. } = match run_batch_to_done(&mut client, &batch.id, deadline).await {
        Ok(run) => run,
        Err(now) => {
            let mut report = String::new();
            for worker in stack
                .store
                .list_jobs(None, &kiln_core::authz::Visible::All, true, 20)
                .await
                .unwrap()
            {
                let lines = stack.log_lines(&worker.id, false).await;
                let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
                report += &format!("\n{} {} {:?} {:?}", worker.id, worker.state, worker.reason, texts);
            }
            panic!("the batch did not finish: {now:?}{report}");
        }
    };
    let counts = done.counts.unwrap();
    assert_eq!((counts.total, counts.succeeded), (ITEMS as u64, ITEMS as u64));
}
