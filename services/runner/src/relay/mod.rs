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
//! - Every `report-interval-ms`, and at once when it joins or leaves the rotation, it tells the
//!   predictors its worker's load ([`LoadReport`] on [`subjects::serve_load`]: requests in
//!   flight on average, answered, their mean time, whether it is in rotation), which the
//!   controller scales the member on and the predictors learn its direct channel from.
//! - Its direct channel (`direct`: `POST /infer` on `direct-addr`, over HTTP/1.1 keep-alive)
//!   takes the same requests without the hop through nats-server: the predictors learn its URL
//!   and token from the load reports and call it while it is in rotation; out of rotation it
//!   answers 503 at once, and a request it drops is answered 504. Measured against NATS
//!   request/reply by serve-bench (the README's Performance section), it is the predictors'
//!   default; NATS stays for discovery, probes and when no direct URL is known.
//!
//! Leaving the queue group can lose a request NATS is routing to the relay at that instant:
//! async-nats (0.51) forgets a drained subscription once its UNSUB is written, not when the
//! server's PONG shows it was read, and core NATS does not deliver a message again. Its client
//! sees 504 at the deadline. The direct channel has no such window (out of rotation it answers
//! 503 and the predictor asks another relay), which is why the relay reports at once when it
//! joins the rotation: the predictors use NATS only until they hear of a relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kiln_core::serving::{BUDGET_HEADER, LoadReport, PROBE_HEADER, STATUS_HEADER};
use kiln_core::subjects::{self, QUEUE_SERVE};
use kiln_formats::oip::HEADER_LENGTH;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

mod direct;
mod metrics;
mod settings;

pub use metrics::RelayMetrics;
pub use settings::{Member, RelaySettings};

/// One worker's relay; [`Relay::run`] serves until `drain` is cancelled.
pub struct Relay {
    client: async_nats::Client,
    http: reqwest::Client,
    member: Member,
    settings: RelaySettings,
    metrics: RelayMetrics,
    load: Load,
    /// The turn of the rotation the relay is in; `None` out of it.
    current: std::sync::Mutex<Option<Arc<Turn>>>,
    /// The direct channel's URL and token, once it listens.
    direct: std::sync::OnceLock<(String, String)>,
    /// Wakes the reporter when the relay joins or leaves the rotation.
    rotation_changed: Notify,
}

/// One request, as it came.
struct Request {
    /// The time it may take, from its arrival.
    budget: Duration,
    payload: Bytes,
    arrived: Instant,
    /// `direct` or `nats`.
    channel: &'static str,
}

/// What became of one request.
enum Reply {
    /// The worker's answer, or the relay's refusal: status, the binary header's length, body.
    Answer {
        status: u16,
        header_length: Option<String>,
        body: Bytes,
    },
    /// None: it expired before the worker took it, or the worker missed its deadline.
    Nothing,
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
            current: std::sync::Mutex::default(),
            direct: std::sync::OnceLock::new(),
            rotation_changed: Notify::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.member.worker)
    }

    /// Serves until `drain` is cancelled, then drains.
    pub async fn run(self, drain: CancellationToken) -> Result<()> {
        let relay = Arc::new(self);
        let subject = subjects::serve(
            &relay.member.project,
            &relay.member.service,
            relay.member.revision,
            &relay.member.member,
        );
        let rotation = relay
            .metrics
            .in_rotation
            .get_or_create(&RelayMetrics::labels(&relay.member))
            .clone();
        let mut in_flight = JoinSet::new();
        let direct_stop = CancellationToken::new();
        if !relay.settings.direct_addr.is_empty()
            && let Err(error) = direct::listen(relay.clone(), direct_stop.clone()).await
        {
            // NATS alone still reaches the worker.
            tracing::warn!(error = %error, "the relay's direct channel cannot listen; NATS only");
        }
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
            *relay.current.lock().expect("rotation lock") = Some(turn.clone());
            relay.rotation_changed.notify_one();
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
            *relay.current.lock().expect("rotation lock") = None;
            relay.rotation_changed.notify_one();
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
        let _ = tokio::time::timeout(grace, async {
            while in_flight.join_next().await.is_some() {}
            // The direct channel's requests are counted, not held.
            while relay.load.in_flight.load(Ordering::Relaxed) > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        direct_stop.cancel();
        reporter.abort();
        Ok(())
    }

    /// Reports the worker's load every interval, and at once when the relay joins or leaves
    /// the rotation, until it drains; requests in flight are sampled 10 times an interval.
    async fn report(self: Arc<Self>, drain: CancellationToken) {
        let interval = Duration::from_millis(self.settings.report_interval_ms.max(10));
        let subject = subjects::serve_load(&self.member.project, &self.member.service);
        loop {
            let mut sum = 0usize;
            let mut samples = 0usize;
            while samples < 10 {
                tokio::select! {
                    _ = drain.cancelled() => return,
                    _ = self.rotation_changed.notified() => break,
                    _ = tokio::time::sleep(interval / 10) => {}
                }
                sum += self.load.in_flight.load(Ordering::Relaxed);
                samples += 1;
            }
            let answered = self.load.answered.swap(0, Ordering::Relaxed);
            let answered_us = self.load.answered_us.swap(0, Ordering::Relaxed);
            let report = LoadReport {
                job_id: self.member.job_id.clone(),
                project: self.member.project.clone(),
                service: self.member.service.clone(),
                revision: self.member.revision,
                member: self.member.member.clone(),
                in_flight: if samples == 0 { 0.0 } else { sum as f64 / samples as f64 },
                answered,
                mean_ms: if answered == 0 {
                    0.0
                } else {
                    answered_us as f64 / answered as f64 / 1000.0
                },
                in_rotation: self.load.in_rotation.load(Ordering::Relaxed),
                direct_url: self.direct.get().map(|(url, _)| url.clone()).unwrap_or_default(),
                direct_token: self.direct.get().map(|(_, token)| token.clone()).unwrap_or_default(),
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

    /// Answers a request that came through NATS.
    async fn answer(self: Arc<Self>, turn: Arc<Turn>, message: async_nats::Message, arrived: Instant) {
        let Some(reply) = message.reply.clone() else {
            return;
        };
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(name))
                .map(|value| value.as_str().to_string())
        };
        let (status, header_length, body) = if header(PROBE_HEADER).is_some() {
            (200, None, Bytes::new())
        } else {
            let budget = budget_of(header(BUDGET_HEADER).as_deref());
            let request = Request {
                budget,
                payload: message.payload.clone(),
                arrived,
                channel: "nats",
            };
            match self.take(&turn, request).await {
                Reply::Answer {
                    status,
                    header_length,
                    body,
                } => (status, header_length, body),
                Reply::Nothing => return,
            }
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(STATUS_HEADER, status.to_string().as_str());
        if let Some(length) = header_length {
            headers.insert(HEADER_LENGTH, length.as_str());
        }
        if let Err(error) = self.client.publish_with_headers(reply, headers, body).await {
            tracing::warn!(error = %error, "cannot send an inference answer");
        }
    }

    /// Gives a request to the worker once a slot is free, within `budget` from `arrived`.
    async fn take(&self, turn: &Turn, request: Request) -> Reply {
        let Request {
            budget,
            payload,
            arrived,
            channel,
        } = request;
        let deadline = arrived + budget;
        let Ok(Ok(_slot)) = tokio::time::timeout_at(deadline, turn.slots.acquire()).await else {
            self.metrics.count(&self.member, channel, "dropped");
            return Reply::Nothing;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.metrics.count(&self.member, channel, "dropped");
            return Reply::Nothing;
        }
        let sent = self
            .http
            .post(self.url(&format!("/v2/models/{}/infer", self.member.member)))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(payload)
            .timeout(left)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) if error.is_timeout() => return self.missed(turn, channel),
            Err(error) => {
                // A worker that is gone (killed, restarting) leaves the rotation at once; the
                // predictor asks another worker of the member.
                turn.eject.notify_one();
                return self.fail(channel, 503, &format!("the worker cannot be reached: {error}"));
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
            Ok(Err(error)) => return self.fail(channel, 502, &format!("the worker's answer broke off: {error}")),
            Err(_) => return self.missed(turn, channel),
        };
        turn.misses.store(0, Ordering::Relaxed);
        self.metrics
            .count(&self.member, channel, if status == 200 { "answered" } else { "failed" });
        self.load.answered.fetch_add(1, Ordering::Relaxed);
        self.load
            .answered_us
            .fetch_add(arrived.elapsed().as_micros() as u64, Ordering::Relaxed);
        Reply::Answer {
            status,
            header_length,
            body,
        }
    }

    fn missed(&self, turn: &Turn, channel: &'static str) -> Reply {
        self.metrics.count(&self.member, channel, "late");
        if turn.misses.fetch_add(1, Ordering::Relaxed) + 1 >= self.settings.eject_after.max(1) {
            turn.eject.notify_one();
        }
        Reply::Nothing
    }

    /// The relay's own answer `status` (503: ask another worker; 502: the worker failed this
    /// request).
    fn fail(&self, channel: &'static str, status: u16, message: &str) -> Reply {
        self.metrics.count(&self.member, channel, "failed");
        Reply::Answer {
            status,
            header_length: None,
            body: Bytes::from(serde_json::json!({ "error": message }).to_string()),
        }
    }
}

/// A request's budget from its header (microseconds); a minute without one.
fn budget_of(header: Option<&str>) -> Duration {
    header
        .and_then(|value| value.parse::<u64>().ok())
        .map_or(Duration::from_secs(60), Duration::from_micros)
}
