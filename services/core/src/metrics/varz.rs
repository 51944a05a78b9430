//! nats-server's `/varz` (its monitoring endpoint), the parts kiln exports as
//! `kiln_nats_server_*`.

use std::time::Duration;

/// The parts of nats-server's `/varz` kiln exports.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub(super) struct Varz {
    #[serde(default)]
    pub(super) server_name: String,
    #[serde(default)]
    pub(super) connections: u64,
    #[serde(default)]
    pub(super) subscriptions: u64,
    #[serde(default)]
    pub(super) slow_consumers: u64,
    #[serde(default)]
    pub(super) in_msgs: u64,
    #[serde(default)]
    pub(super) out_msgs: u64,
    #[serde(default)]
    pub(super) in_bytes: u64,
    #[serde(default)]
    pub(super) out_bytes: u64,
    #[serde(default)]
    pub(super) mem: u64,
    #[serde(default)]
    pub(super) cpu: f64,
    #[serde(default)]
    pub(super) jetstream: Option<VarzJetStream>,
}

#[derive(Debug, Default, Clone, serde::Deserialize)]
pub(super) struct VarzJetStream {
    #[serde(default)]
    pub(super) stats: Option<VarzJetStreamStats>,
}

#[derive(Debug, Default, Clone, serde::Deserialize)]
pub(super) struct VarzJetStreamStats {
    #[serde(default)]
    pub(super) memory: u64,
    #[serde(default)]
    pub(super) storage: u64,
    #[serde(default)]
    pub(super) api: Option<VarzApi>,
}

#[derive(Debug, Default, Clone, serde::Deserialize)]
pub(super) struct VarzApi {
    #[serde(default)]
    pub(super) total: u64,
    #[serde(default)]
    pub(super) errors: u64,
}

pub(super) async fn read_varz(
    http: &reqwest::Client,
    url: &str,
) -> Result<Varz, Box<dyn std::error::Error + Send + Sync>> {
    let body = http
        .get(format!("{}/varz", url.trim_end_matches('/')))
        .timeout(Duration::from_secs(2))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(serde_json::from_slice(&body)?)
}
