//! kiln's side of an inference worker: the relay between the member's NATS subject and the
//! worker's Open Inference Protocol REST API on `127.0.0.1:KILN_SERVE_PORT`.
//!
//! - It joins the member's queue group ([`subjects::serve`], [`QUEUE_SERVE`]) only once the
//!   worker answers `GET /v2/health/ready`, so no request waits on a model still loading.
//! - Each request's budget ([`BUDGET_HEADER`]) is counted from its arrival. Requests wait for
//!   one of `concurrency` slots; one whose budget ran out before its slot came is dropped
//!   unanswered, never sent to the worker, and so is one the worker does not answer in time.
//! - A worker that misses `eject-after` deadlines in a row is taken out of rotation: the relay
//!   leaves the queue group (requests go to the member's other workers, or are answered at
//!   once as unavailable when there are none), probes the worker every `probe-interval` and
//!   joins again when it answers.
//! - A worker that cannot be reached (gone, restarting) is out of rotation at once, and the
//!   request is answered 503 (`Kiln-Status`), which the predictor asks another worker again.
//! - Draining (a stop or a preemption notice) leaves the queue group, answers what was already
//!   delivered, and returns once in-flight requests are done.
//! - Every `report-interval-ms` it tells the predictors' controller its worker's load
//!   ([`LoadReport`] on [`subjects::serve_load`]: requests in flight on average, answered, their
//!   mean time, whether it is in rotation), which the controller scales the member on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kiln_core::serving::{
    BUDGET_HEADER, ENV_MEMBER, ENV_PORT, ENV_REVISION, ENV_SERVICE, LoadReport, PROBE_HEADER, STATUS_HEADER,
};
use kiln_core::subjects::{self, QUEUE_SERVE};
use kiln_formats::oip::HEADER_LENGTH;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

/// How a relay treats its worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RelaySettings {
    /// Requests the worker is given at once; the rest wait in the relay, where an expired one
    /// can still be dropped.
    pub concurrency: usize,
    /// Deadlines missed in a row that take the worker out of rotation.
    pub eject_after: u32,
    /// How often a worker out of rotation (or still loading) is probed, in milliseconds.
    pub probe_interval_ms: u64,
    /// How long a drain waits for in-flight requests, in milliseconds.
    pub drain_grace_ms: u64,
    /// How often the worker's load is reported to the controller, in milliseconds.
    pub report_interval_ms: u64,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            concurrency: 2,
            eject_after: 3,
            probe_interval_ms: 200,
            drain_grace_ms: 10_000,
            report_interval_ms: 1_000,
        }
    }
}

/// The member a relay's worker serves.
#[derive(Debug, Clone)]
pub struct Member {
    pub service: String,
    pub revision: u64,
    pub member: String,
    /// The worker's REST API (`127.0.0.1:KILN_SERVE_PORT`).
    pub worker: SocketAddr,
    /// The worker's job, named in its load reports.
    pub job_id: String,
}

impl Member {
    /// The member an inference worker's job environment names, with the port the runner gave
    /// it; `None` for other jobs.
    pub fn of_env(env: &std::collections::BTreeMap<String, String>) -> Option<Member> {
        Some(Member {
            service: env.get(ENV_SERVICE)?.clone(),
            revision: env.get(ENV_REVISION)?.parse().ok()?,
            member: env.get(ENV_MEMBER)?.clone(),
            worker: SocketAddr::from(([127, 0, 0, 1], env.get(ENV_PORT)?.parse().ok()?)),
            job_id: env.get("KILN_JOB_ID").cloned().unwrap_or_default(),
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    service: String,
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    service: String,
    member: String,
    outcome: &'static str,
}

/// The relays' metrics (`kiln_runner_serve_*`), shared by every relay of a runner.
#[derive(Clone, Debug, Default)]
pub struct RelayMetrics {
    requests: Family<OutcomeLabels, Counter>,
    ejections: Family<MemberLabels, Counter>,
    in_rotation: Family<MemberLabels, Gauge>,
}

impl RelayMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        use kiln_core::metrics::RegistryExt;
        registry.add(
            "serve_requests",
            "Inference requests the relays took, by service, member and outcome (answered, dropped: expired before the worker took it, late: the worker missed the deadline, failed)",
            self.requests.clone(),
        );
        registry.add(
            "serve_ejections",
            "Times a worker was taken out of rotation for missing deadlines in a row",
            self.ejections.clone(),
        );
        registry.add(
            "serve_in_rotation",
            "Workers in rotation (their relay in the member's queue group)",
            self.in_rotation.clone(),
        );
    }

    /// How often the worker of `member` of `service` was taken out of rotation.
    pub fn ejections(&self, service: &str, member: &str) -> u64 {
        self.ejections
            .get_or_create(&MemberLabels {
                service: service.into(),
                member: member.into(),
            })
            .get()
    }

    fn count(&self, member: &Member, outcome: &'static str) {
        self.requests
            .get_or_create(&OutcomeLabels {
                service: member.service.clone(),
                member: member.member.clone(),
                outcome,
            })
            .inc();
    }

    fn labels(member: &Member) -> MemberLabels {
        MemberLabels {
            service: member.service.clone(),
            member: member.member.clone(),
        }
    }
}

/// One worker's relay; [`Relay::run`] serves until `drain` is cancelled.
pub struct Relay {
    client: async_nats::Client,
    http: reqwest::Client,
    member: Member,
    settings: RelaySettings,
    metrics: RelayMetrics,
    load: Load,
}

/// What the load reports are made of, kept by the handlers.
#[derive(Default)]
struct Load {
    in_flight: AtomicUsize,
    answered: AtomicU64,
    answered_us: AtomicU64,
    in_rotation: AtomicBool,
}

/// What a request's handler shares with the loop.
struct Turn {
    misses: AtomicU32,
    eject: Notify,
    slots: Semaphore,
}

impl Relay {
    pub fn new(client: async_nats::Client, member: Member, settings: RelaySettings, metrics: RelayMetrics) -> Relay {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(settings.concurrency.max(1) * 2)
            .build()
            .expect("a plain HTTP client builds");
        Relay {
            client,
            http,
            member,
            settings,
            metrics,
            load: Load::default(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.member.worker)
    }

    /// Serves until `drain` is cancelled, then drains.
    pub async fn run(self, drain: CancellationToken) -> Result<()> {
        let relay = Arc::new(self);
        let subject = subjects::serve(&relay.member.service, relay.member.revision, &relay.member.member);
        let rotation = relay
            .metrics
            .in_rotation
            .get_or_create(&RelayMetrics::labels(&relay.member))
            .clone();
        let mut in_flight = JoinSet::new();
        let reporter = tokio::spawn(relay.clone().report(drain.clone()));
        loop {
            if !relay.wait_ready(&drain).await {
                break;
            }
            let turn = Arc::new(Turn {
                misses: AtomicU32::new(0),
                eject: Notify::new(),
                slots: Semaphore::new(relay.settings.concurrency.max(1)),
            });
            let mut requests = relay
                .client
                .queue_subscribe(subject.clone(), QUEUE_SERVE.to_string())
                .await
                .map_err(|error| {
                    Error::Nats(kiln_core::streams::NatsError::Other(format!(
                        "subscribe {subject}: {error}"
                    )))
                })?;
            rotation.inc();
            relay.load.in_rotation.store(true, Ordering::Relaxed);
            tracing::info!(subject, worker = %relay.member.worker, "worker in rotation");
            let ejected = loop {
                tokio::select! {
                    _ = drain.cancelled() => break false,
                    _ = turn.eject.notified() => break true,
                    message = requests.next() => match message {
                        Some(message) => {
                            in_flight.spawn(relay.clone().handle(turn.clone(), message, Instant::now()));
                        }
                        None => break false,
                    },
                    Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
                }
            };
            rotation.dec();
            relay.load.in_rotation.store(false, Ordering::Relaxed);
            // Leave the group, and answer what it had already delivered.
            let _ = requests.drain().await;
            while let Some(message) = requests.next().await {
                in_flight.spawn(relay.clone().handle(turn.clone(), message, Instant::now()));
            }
            if !ejected {
                break;
            }
            relay
                .metrics
                .ejections
                .get_or_create(&RelayMetrics::labels(&relay.member))
                .inc();
            tracing::warn!(subject, worker = %relay.member.worker, missed = relay.settings.eject_after, "worker missed its deadlines; out of rotation until it answers a probe");
        }
        let grace = Duration::from_millis(relay.settings.drain_grace_ms);
        let _ = tokio::time::timeout(grace, async { while in_flight.join_next().await.is_some() {} }).await;
        reporter.abort();
        Ok(())
    }

    /// Reports the worker's load every interval until the relay drains; requests in flight
    /// are sampled 10 times an interval.
    async fn report(self: Arc<Self>, drain: CancellationToken) {
        let interval = Duration::from_millis(self.settings.report_interval_ms.max(10));
        let subject = subjects::serve_load(&self.member.service);
        loop {
            let mut sum = 0usize;
            for _ in 0..10 {
                tokio::select! {
                    _ = drain.cancelled() => return,
                    _ = tokio::time::sleep(interval / 10) => {}
                }
                sum += self.load.in_flight.load(Ordering::Relaxed);
            }
            let answered = self.load.answered.swap(0, Ordering::Relaxed);
            let answered_us = self.load.answered_us.swap(0, Ordering::Relaxed);
            let report = LoadReport {
                job_id: self.member.job_id.clone(),
                service: self.member.service.clone(),
                revision: self.member.revision,
                member: self.member.member.clone(),
                in_flight: sum as f64 / 10.0,
                answered,
                mean_ms: if answered == 0 {
                    0.0
                } else {
                    answered_us as f64 / answered as f64 / 1000.0
                },
                in_rotation: self.load.in_rotation.load(Ordering::Relaxed),
            };
            let body = serde_json::to_vec(&report).expect("a load report serializes");
            if let Err(error) = self.client.publish(subject.clone(), body.into()).await {
                tracing::debug!(error = %error, "cannot report the worker's load");
            }
        }
    }

    /// Probes the worker until it is ready (true) or the relay drains (false).
    async fn wait_ready(&self, drain: &CancellationToken) -> bool {
        let interval = Duration::from_millis(self.settings.probe_interval_ms.max(1));
        loop {
            let probe = self
                .http
                .get(self.url("/v2/health/ready"))
                .timeout(interval.max(Duration::from_millis(100)))
                .send()
                .await;
            if probe.is_ok_and(|answer| answer.status().is_success()) {
                return true;
            }
            tokio::select! {
                _ = drain.cancelled() => return false,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn handle(self: Arc<Self>, turn: Arc<Turn>, message: async_nats::Message, arrived: Instant) {
        self.load.in_flight.fetch_add(1, Ordering::Relaxed);
        self.clone().answer(turn, message, arrived).await;
        self.load.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    async fn answer(self: Arc<Self>, turn: Arc<Turn>, message: async_nats::Message, arrived: Instant) {
        let Some(reply) = message.reply.clone() else {
            return;
        };
        if message
            .headers
            .as_ref()
            .is_some_and(|headers| headers.get(PROBE_HEADER).is_some())
        {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(STATUS_HEADER, "200");
            if let Err(error) = self.client.publish_with_headers(reply, headers, Bytes::new()).await {
                tracing::warn!(error = %error, "cannot answer a readiness probe");
            }
            return;
        }
        let budget = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(BUDGET_HEADER))
            .and_then(|value| value.as_str().parse::<u64>().ok())
            .map_or(Duration::from_secs(60), Duration::from_micros);
        let deadline = arrived + budget;
        let Ok(Ok(_slot)) = tokio::time::timeout_at(deadline, turn.slots.acquire()).await else {
            self.metrics.count(&self.member, "dropped");
            return;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.metrics.count(&self.member, "dropped");
            return;
        }
        let sent = self
            .http
            .post(self.url(&format!("/v2/models/{}/infer", self.member.member)))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(message.payload.clone())
            .timeout(left)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) if error.is_timeout() => return self.missed(&turn),
            Err(error) => {
                // A worker that is gone (killed, restarting) leaves the rotation at once; the
                // predictor asks another worker of the member.
                turn.eject.notify_one();
                return self
                    .fail(&reply, 503, &format!("the worker cannot be reached: {error}"))
                    .await;
            }
        };
        let status = answer.status().as_u16();
        let header_length = answer
            .headers()
            .get(HEADER_LENGTH)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        let body = match tokio::time::timeout_at(deadline, answer.bytes()).await {
            Ok(Ok(body)) => body,
            Ok(Err(error)) => {
                return self
                    .fail(&reply, 502, &format!("the worker's answer broke off: {error}"))
                    .await;
            }
            Err(_) => return self.missed(&turn),
        };
        turn.misses.store(0, Ordering::Relaxed);
        self.metrics
            .count(&self.member, if status == 200 { "answered" } else { "failed" });
        self.load.answered.fetch_add(1, Ordering::Relaxed);
        self.load
            .answered_us
            .fetch_add(arrived.elapsed().as_micros() as u64, Ordering::Relaxed);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(STATUS_HEADER, status.to_string().as_str());
        if let Some(length) = header_length {
            headers.insert(HEADER_LENGTH, length.as_str());
        }
        if let Err(error) = self.client.publish_with_headers(reply, headers, body).await {
            tracing::warn!(error = %error, "cannot send an inference answer");
        }
    }

    fn missed(&self, turn: &Turn) {
        self.metrics.count(&self.member, "late");
        if turn.misses.fetch_add(1, Ordering::Relaxed) + 1 >= self.settings.eject_after.max(1) {
            turn.eject.notify_one();
        }
    }

    /// Answers with `status` (503: ask another worker; 502: the worker failed this request).
    async fn fail(&self, reply: &async_nats::Subject, status: u16, message: &str) {
        self.metrics.count(&self.member, "failed");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(STATUS_HEADER, status.to_string().as_str());
        let body = Bytes::from(serde_json::json!({ "error": message }).to_string());
        if let Err(error) = self.client.publish_with_headers(reply.clone(), headers, body).await {
            tracing::warn!(error = %error, "cannot send an inference error");
        }
    }
}
