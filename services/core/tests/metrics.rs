//! The metrics registry and the exposition it serves: every name parses with `promtool check
//! metrics`, and the endpoint serves what the registry holds.

use kiln_core::metrics::{Metrics, MetricsConfig};
use kiln_core::testing;

#[tokio::test]
async fn the_endpoint_serves_the_registry_and_nats_lag() {
    let server = testing::NatsServer::start();
    let nats = kiln_core::streams::connect(&server.config()).await.unwrap();
    let metrics = Metrics::default();
    metrics.register("api", kiln_core::metrics::register_build_info);
    let mut config = MetricsConfig::local(0);
    config.consumer_lag = true;
    config.refresh_ms = 100;
    config.nats_monitor = vec![server.monitor_url()];
    let shutdown = tokio_util::sync::CancellationToken::new();
    let addr = kiln_core::metrics::export(&config, &metrics, &nats, &shutdown)
        .await
        .unwrap()
        .expect("enabled");
    let url = format!("http://{addr}/metrics");
    let mut text = String::new();
    for _ in 0..50 {
        text = testing::http_get(&url).await;
        if text.contains("kiln_nats_server_connections{") && text.contains("kiln_nats_stream_messages{") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(text.contains("kiln_api_build_info{version="), "{text}");
    assert!(text.contains("kiln_nats_server_connections{server="), "{text}");
    assert!(
        text.contains("kiln_nats_stream_messages{stream=\"KILN_JOBS\"}"),
        "{text}"
    );
    assert!(text.contains("kiln_nats_server_up{url="), "{text}");
    testing::promtool_check_metrics(&text);
    shutdown.cancel();
}
