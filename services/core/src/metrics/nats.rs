//! `kiln_nats_*`: the lag of every kiln JetStream consumer, read by kiln itself through the
//! JetStream API (no NATS exporter is needed), and nats-server's own `/varz`.
//!
//! A task refreshes a snapshot every `metrics.refresh-ms`; the collector encodes the latest one
//! at each scrape, so a consumer or server that went away leaves the exposition with it.
//! Consumers of one kind (one a batch: `items-<batch>`, one a runner: `control-<runner>`) are
//! summed under their kind ([`subjects::consumer_kind`]), so no batch id becomes a label.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio_util::sync::CancellationToken;

use super::varz::{Varz, read_varz};
use super::{Metrics, MetricsConfig};
use crate::streams::Nats;
use crate::subjects;

/// What the last refresh read.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    /// (stream, consumer kind) → (pending, ack pending).
    consumers: BTreeMap<(String, String), (u64, u64)>,
    /// stream → (messages, bytes).
    streams: BTreeMap<String, (u64, u64)>,
    /// Whether the JetStream API answered the last read (only when consumer lag is on).
    jetstream_up: Option<bool>,
    /// monitor URL → its /varz, or `None` when it did not answer.
    servers: BTreeMap<String, Option<Varz>>,
}

/// The collector of `kiln_nats_*`.
#[derive(Debug, Clone, Default)]
pub struct NatsCollector {
    snapshot: Arc<Mutex<Snapshot>>,
}

/// Registers the `kiln_nats_*` families, empty until a refresher fills them (the metrics
/// reference registers them so).
pub fn register(metrics: &Metrics) -> NatsCollector {
    let collector = NatsCollector::default();
    metrics.register_root(|registry| registry.register_collector(Box::new(collector.clone())));
    collector
}

/// Registers the collector and starts its refresher when the configuration asks for either
/// part; does nothing otherwise.
pub(super) fn start(config: &MetricsConfig, metrics: &Metrics, nats: &Nats, shutdown: &CancellationToken) {
    if !config.consumer_lag && config.nats_monitor.is_empty() {
        return;
    }
    let collector = register(metrics);
    let nats = config.consumer_lag.then(|| nats.clone());
    let monitors = config.nats_monitor.clone();
    let interval = Duration::from_millis(config.refresh_ms);
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let snapshot = read(nats.as_ref(), &monitors, &http).await;
            *collector.snapshot.lock().expect("the snapshot lock is never poisoned") = snapshot;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
}

async fn read(nats: Option<&Nats>, monitors: &[String], http: &reqwest::Client) -> Snapshot {
    let mut snapshot = Snapshot::default();
    if let Some(nats) = nats {
        match read_jetstream(nats, &mut snapshot).await {
            Ok(()) => snapshot.jetstream_up = Some(true),
            Err(error) => {
                tracing::debug!(error = %error, "cannot read the JetStream consumers");
                snapshot.jetstream_up = Some(false);
            }
        }
    }
    for url in monitors {
        let varz = read_varz(http, url).await;
        if let Err(error) = &varz {
            tracing::debug!(url, error = %error, "cannot read nats-server /varz");
        }
        snapshot.servers.insert(url.clone(), varz.ok());
    }
    snapshot
}

async fn read_jetstream(nats: &Nats, snapshot: &mut Snapshot) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let infos: Vec<_> = nats.jetstream.streams().try_collect().await?;
    for info in infos {
        let name = info.config.name.clone();
        if !name.starts_with("KILN_") {
            continue;
        }
        snapshot
            .streams
            .insert(name.clone(), (info.state.messages, info.state.bytes));
        let stream = nats.jetstream.get_stream_no_info(&name).await?;
        let consumers: Vec<_> = stream.consumers().try_collect().await?;
        for consumer in consumers {
            let kind = subjects::consumer_kind(&consumer.name);
            let entry = snapshot.consumers.entry((name.clone(), kind.to_string())).or_default();
            entry.0 += consumer.num_pending;
            entry.1 += consumer.num_ack_pending as u64;
        }
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ConsumerLabels {
    stream: String,
    consumer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct StreamLabels {
    stream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct MonitorLabels {
    url: String,
}

/// Encodes one family of values under `name`; its descriptor even when it has no values (a
/// server not answering yet), as [`super::RegistryExt`] does for the other families.
fn family<L, M>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet,
    M: EncodeMetric + prometheus_client::metrics::TypedMetric,
{
    let mut metric_encoder = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in rows {
        metric.encode(metric_encoder.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for NatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self
            .snapshot
            .lock()
            .expect("the snapshot lock is never poisoned")
            .clone();
        let consumer = |(stream, consumer): &(String, String)| ConsumerLabels {
            stream: stream.clone(),
            consumer: consumer.clone(),
        };
        family(
            &mut encoder,
            "kiln_nats_consumer_pending_messages",
            "Messages of a kiln JetStream consumer not yet delivered, summed over consumers of one kind",
            snapshot
                .consumers
                .iter()
                .map(|(key, (pending, _))| (consumer(key), ConstGauge::new(*pending as i64))),
        )?;
        family(
            &mut encoder,
            "kiln_nats_consumer_ack_pending_messages",
            "Messages of a kiln JetStream consumer delivered and not yet acknowledged",
            snapshot
                .consumers
                .iter()
                .map(|(key, (_, ack))| (consumer(key), ConstGauge::new(*ack as i64))),
        )?;
        let stream = |name: &String| StreamLabels { stream: name.clone() };
        family(
            &mut encoder,
            "kiln_nats_stream_messages",
            "Messages held by a kiln JetStream stream",
            snapshot
                .streams
                .iter()
                .map(|(name, (messages, _))| (stream(name), ConstGauge::new(*messages as i64))),
        )?;
        family(
            &mut encoder,
            "kiln_nats_stream_bytes",
            "Bytes held by a kiln JetStream stream",
            snapshot
                .streams
                .iter()
                .map(|(name, (_, bytes))| (stream(name), ConstGauge::new(*bytes as i64))),
        )?;
        family(
            &mut encoder,
            "kiln_nats_jetstream_up",
            "1 when the last read of the JetStream consumers succeeded",
            snapshot
                .jetstream_up
                .map(|up| (StreamLabels { stream: "all".into() }, ConstGauge::new(i64::from(up)))),
        )?;
        family(
            &mut encoder,
            "kiln_nats_server_up",
            "1 when the nats-server monitoring endpoint answered the last /varz read",
            snapshot.servers.iter().map(|(url, varz)| {
                (
                    MonitorLabels { url: url.clone() },
                    ConstGauge::new(i64::from(varz.is_some())),
                )
            }),
        )?;
        let servers: Vec<(ServerLabels, Varz)> = snapshot
            .servers
            .iter()
            .filter_map(|(url, varz)| {
                let varz = varz.clone()?;
                let server = if varz.server_name.is_empty() {
                    url.clone()
                } else {
                    varz.server_name.clone()
                };
                Some((ServerLabels { server }, varz))
            })
            .collect();
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: fn(&Varz) -> i64| {
            family(
                encoder,
                name,
                help,
                servers.iter().map(|(l, v)| (l.clone(), ConstGauge::new(value(v)))),
            )
        };
        gauge(
            &mut encoder,
            "kiln_nats_server_connections",
            "Client connections open",
            |v| v.connections as i64,
        )?;
        gauge(&mut encoder, "kiln_nats_server_subscriptions", "Subscriptions", |v| {
            v.subscriptions as i64
        })?;
        gauge(
            &mut encoder,
            "kiln_nats_server_memory_bytes",
            "Resident memory of nats-server",
            |v| v.mem as i64,
        )?;
        gauge(
            &mut encoder,
            "kiln_nats_server_jetstream_memory_bytes",
            "Memory used by JetStream",
            |v| {
                v.jetstream
                    .as_ref()
                    .and_then(|j| j.stats.as_ref())
                    .map_or(0, |s| s.memory as i64)
            },
        )?;
        gauge(
            &mut encoder,
            "kiln_nats_server_jetstream_storage_bytes",
            "File storage used by JetStream",
            |v| {
                v.jetstream
                    .as_ref()
                    .and_then(|j| j.stats.as_ref())
                    .map_or(0, |s| s.storage as i64)
            },
        )?;
        family(
            &mut encoder,
            "kiln_nats_server_cpu_ratio",
            "CPU use of nats-server, 1.0 being one core",
            servers.iter().map(|(l, v)| (l.clone(), ConstGauge::new(v.cpu / 100.0))),
        )?;
        let counter = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: fn(&Varz) -> u64| {
            family(
                encoder,
                name,
                help,
                servers.iter().map(|(l, v)| (l.clone(), ConstCounter::new(value(v)))),
            )
        };
        counter(&mut encoder, "kiln_nats_server_in_messages", "Messages received", |v| {
            v.in_msgs
        })?;
        counter(&mut encoder, "kiln_nats_server_out_messages", "Messages sent", |v| {
            v.out_msgs
        })?;
        counter(&mut encoder, "kiln_nats_server_in_bytes", "Bytes received", |v| {
            v.in_bytes
        })?;
        counter(&mut encoder, "kiln_nats_server_out_bytes", "Bytes sent", |v| {
            v.out_bytes
        })?;
        counter(
            &mut encoder,
            "kiln_nats_server_slow_consumers",
            "Clients cut off as slow consumers",
            |v| v.slow_consumers,
        )?;
        counter(
            &mut encoder,
            "kiln_nats_server_jetstream_api_requests",
            "JetStream API requests",
            |v| {
                v.jetstream
                    .as_ref()
                    .and_then(|j| j.stats.as_ref())
                    .and_then(|s| s.api.as_ref())
                    .map_or(0, |a| a.total)
            },
        )?;
        counter(
            &mut encoder,
            "kiln_nats_server_jetstream_api_errors",
            "JetStream API requests that failed",
            |v| {
                v.jetstream
                    .as_ref()
                    .and_then(|j| j.stats.as_ref())
                    .and_then(|s| s.api.as_ref())
                    .map_or(0, |a| a.errors)
            },
        )?;
        Ok(())
    }
}
