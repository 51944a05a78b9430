//! The two channels between a predictor and its relays: once a relay's load report named its
//! direct channel, a predictor with `channel = "direct"` (the default) sends it the member's
//! requests over HTTP, and before that (or with `channel = "nats"`) through NATS request/reply;
//! either way every request is answered. The relay counts each request by the channel it came by.

use std::time::Duration;

use kiln_e2e::serving::{Rest, serve_double, spawn_predictor_configured};
use kiln_e2e::{PATIENCE, Stack};
use kiln_runner::relay::RelayMetrics;
use serde_json::json;

fn answered(relays: &RelayMetrics, channel: &'static str) -> u64 {
    relays.requests("default", "scale", "double", channel, "answered")
}

async fn ask(rest: &Rest, times: usize) {
    let body = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1.5]}]});
    for _ in 0..times {
        let reply = rest.post_json("/v2/models/scale/infer", &body).await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.json()["outputs"][0]["data"], json!([3.0]), "{}", reply.json());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_go_direct_once_the_relay_reported_and_through_nats_otherwise() {
    let stack = Stack::start_without_runner().await;
    let relays = RelayMetrics::default();
    let _double = serve_double(&stack, &relays).await;
    let (_direct, direct_base, _) = spawn_predictor_configured(&stack, |_| {}).await;
    let (_nats, nats_base, _) =
        spawn_predictor_configured(&stack, |config| config.channel = kiln_predictor::config::Channel::Nats).await;
    let direct = Rest::new(&direct_base, &stack.token);
    let nats = Rest::new(&nats_base, &stack.token);

    // Until the relay's first report, the direct predictor asks through NATS too.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while answered(&relays, "direct") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no request ever went direct");
        let body = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1.5]}]});
        let _ = direct.post_json("/v2/models/scale/infer", &body).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (before_direct, before_nats) = (answered(&relays, "direct"), answered(&relays, "nats"));
    ask(&direct, 20).await;
    assert_eq!(
        answered(&relays, "direct"),
        before_direct + 20,
        "the direct predictor's requests"
    );
    assert_eq!(answered(&relays, "nats"), before_nats);
    ask(&nats, 20).await;
    assert_eq!(answered(&relays, "direct"), before_direct + 20);
    assert_eq!(
        answered(&relays, "nats"),
        before_nats + 20,
        "the NATS predictor's requests"
    );
}
