//! Trials' objective points, read from `KILN_METRICS` by the leader through the durable
//! `advisor-metrics` consumer. Points of jobs that are not live trials are skipped by subject
//! (not decoded); a trial's points become `observe` events, and the messages are acked only once
//! those are recorded, so a leader that dies in between reads them again (and the events'
//! dedupe keys keep them from counting twice).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::streams::Nats;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;

use crate::error::{Result, nats_error};

/// Messages taken per fetch.
const FETCH: usize = 1000;
/// How long a fetch waits for messages before the drain ends.
const FETCH_WAIT: Duration = Duration::from_millis(50);

/// What the leader asks about a job's points: whose trial it is and which keys matter.
#[derive(Debug, Clone)]
pub struct Interest {
    pub sweep_id: String,
    pub trial: u32,
    pub objective: String,
    /// A metric key giving the resource; `None` uses the step.
    pub resource: Option<String>,
}

/// One objective point of a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub sweep_id: String,
    pub trial: u32,
    pub step: i64,
    pub resource: f64,
    pub value: f64,
}

/// What one fetch read.
#[derive(Default)]
pub struct Drained {
    pub points: Vec<Point>,
    /// The highest stream sequence read.
    pub read_to: u64,
    messages: Vec<async_nats::jetstream::Message>,
}

impl Drained {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Acks what was read: call it once the points are recorded.
    pub async fn ack(self) {
        for message in self.messages {
            if let Err(error) = message.ack().await {
                tracing::warn!(error = %error, "cannot ack a metric message; it comes again");
            }
        }
    }
}

pub struct MetricsFeed {
    consumer: consumer::PullConsumer,
    /// Resource values by (job, step), for points whose resource key came in another message.
    resources: HashMap<(String, i64), f64>,
}

impl MetricsFeed {
    pub async fn open(nats: &Nats) -> Result<MetricsFeed> {
        let stream = nats
            .jetstream
            .get_stream(subjects::STREAM_METRICS)
            .await
            .map_err(nats_error)?;
        let consumer = stream
            .get_or_create_consumer(
                subjects::CONSUMER_ADVISOR_METRICS,
                pull::Config {
                    durable_name: Some(subjects::CONSUMER_ADVISOR_METRICS.to_string()),
                    filter_subject: subjects::METRICS_ALL.to_string(),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(60),
                    max_ack_pending: 20_000,
                    // Points from before the advisor first ran belong to no trial.
                    deliver_policy: consumer::DeliverPolicy::New,
                    ..Default::default()
                },
            )
            .await
            .map_err(nats_error)?;
        Ok(MetricsFeed {
            consumer,
            resources: HashMap::new(),
        })
    }

    /// The stream's last sequence: once the feed has read up to it, it has every point
    /// published before this call.
    pub async fn last_sequence(nats: &Nats) -> Result<u64> {
        let mut stream = nats
            .jetstream
            .get_stream(subjects::STREAM_METRICS)
            .await
            .map_err(nats_error)?;
        Ok(stream.info().await.map_err(nats_error)?.state.last_sequence)
    }

    /// One fetch: the points of the jobs in `interest` among the next messages. The caller
    /// records the points, then acks the messages ([`Drained::ack`]).
    pub async fn fetch(&mut self, interest: &HashMap<String, Interest>) -> Result<Drained> {
        let mut messages = self
            .consumer
            .fetch()
            .max_messages(FETCH)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(nats_error)?;
        let mut drained = Drained::default();
        while let Some(message) = messages.next().await {
            let message = message.map_err(nats_error)?;
            if let Ok(info) = message.info() {
                drained.read_to = drained.read_to.max(info.stream_sequence);
            }
            let job_id = message
                .subject
                .as_str()
                .strip_prefix("kiln.metrics.")
                .unwrap_or_default();
            if let Some(wanted) = interest.get(job_id)
                && let Ok(batch) = pb::MetricBatch::decode(message.payload.as_ref())
            {
                let points = self.points(job_id, wanted, &batch);
                drained.points.extend(points);
            }
            drained.messages.push(message);
        }
        Ok(drained)
    }

    /// The objective points of one batch (each with its resource).
    fn points(&mut self, job_id: &str, wanted: &Interest, batch: &pb::MetricBatch) -> Vec<Point> {
        let mut objective = Vec::new();
        let mut each = |key: &str, step: i64, value: f64| {
            if key == wanted.objective {
                objective.push((step, value));
            } else if wanted.resource.as_deref() == Some(key) {
                self.resources.insert((job_id.to_string(), step), value);
            }
        };
        for point in &batch.points {
            each(&point.key, point.step, point.value);
        }
        if let Some(columns) = &batch.columns {
            for (n, (step, value)) in columns.steps.iter().zip(&columns.values).enumerate() {
                let key = columns
                    .key_index
                    .get(n)
                    .and_then(|index| columns.keys.get(*index as usize));
                if let Some(key) = key {
                    each(key, *step, *value);
                }
            }
        }
        objective
            .into_iter()
            .filter(|(_, value)| value.is_finite())
            .map(|(step, value)| {
                let resource = match &wanted.resource {
                    None => step as f64,
                    Some(_) => self
                        .resources
                        .get(&(job_id.to_string(), step))
                        .copied()
                        .unwrap_or(step as f64),
                };
                Point {
                    sweep_id: wanted.sweep_id.clone(),
                    trial: wanted.trial,
                    step,
                    resource,
                    value,
                }
            })
            .collect()
    }

    /// Forgets what it kept for jobs no longer of interest.
    pub fn retain(&mut self, interest: &HashMap<String, Interest>) {
        self.resources.retain(|(job_id, _), _| interest.contains_key(job_id));
    }
}
