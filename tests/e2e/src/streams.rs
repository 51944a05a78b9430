//! What the streams hold: stored messages, metric batches, job events.

use super::*;

/// Every message stored so far on `subject` of `stream`, in order. Read again after an error
/// (on a cluster, a new consumer may have no leader for a moment).
pub async fn stored_messages(stack: &Stack, stream: &str, subject: String) -> Vec<bytes::Bytes> {
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match read_stored(&js, stream, &subject).await {
            Ok(payloads) => return payloads,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("cannot read {subject} from {stream}: {error}"),
        }
    }
}

/// How many messages `stream` holds on `subject` (one subject, no wildcard).
pub async fn stored_count(stack: &Stack, stream: &str, subject: &str) -> usize {
    use futures::TryStreamExt;
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let stream = js.get_stream(stream).await.expect("the stream");
    let counts: Vec<(String, usize)> = stream
        .info_with_subjects(subject)
        .await
        .expect("the stream's subjects")
        .try_collect()
        .await
        .expect("the stream's subjects");
    counts
        .into_iter()
        .filter(|(name, _)| name == subject)
        .map(|(_, n)| n)
        .sum()
}

async fn read_stored(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Vec<bytes::Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    use async_nats::jetstream::consumer::pull;
    use futures::StreamExt;
    let stream = js.get_stream(stream).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subject.to_string(),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer
        .fetch()
        .max_messages(10_000)
        .expires(Duration::from_millis(500))
        .messages()
        .await?;
    let mut payloads = Vec::new();
    while let Some(message) = messages.next().await {
        payloads.push(message?.payload.clone());
    }
    Ok(payloads)
}

/// The metric batches published for a job so far (read back from `KILN_METRICS`).
pub async fn metric_batches(stack: &Stack, job_id: &str) -> Vec<pb::MetricBatch> {
    use prost::Message;
    stored_messages(
        stack,
        kiln_core::subjects::STREAM_METRICS,
        kiln_core::subjects::metrics(job_id),
    )
    .await
    .iter()
    .map(|payload| pb::MetricBatch::decode(payload.as_ref()).expect("a metric batch"))
    .collect()
}

/// The state changes published for `job` (all but QUEUED), in order, through the version it
/// has in `job`: a change is committed before it is published, and one whose publish failed (a
/// cluster electing a stream leader) is published again by its owner's reconciler, so the
/// stream is waited for until it holds that version.
pub async fn job_events(stack: &Stack, job: &pb::Job) -> Vec<pb::JobEvent> {
    use prost::Message;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let events: Vec<pb::JobEvent> = stored_messages(
            stack,
            kiln_core::subjects::STREAM_JOBS,
            kiln_core::subjects::job_event(&job.id),
        )
        .await
        .iter()
        .map(|payload| pb::JobEvent::decode(payload.as_ref()).expect("a job event"))
        .collect();
        if events.iter().any(|event| event.version >= job.version) {
            return events;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "version {} of job {} was never published: {events:?}",
            job.version,
            job.id
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The hours `jobs` spent RUNNING, summed over every attempt, from the times their events were
/// stored in `KILN_JOBS`: from each RUNNING event to the job's next one. A change published again
/// (by a reconciler) is taken once, by its version.
pub async fn running_hours(stack: &Stack, jobs: &std::collections::HashSet<String>) -> f64 {
    use async_nats::jetstream::consumer::pull;
    use futures::StreamExt;
    use prost::Message;
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let stream = js
        .get_stream(kiln_core::subjects::STREAM_JOBS)
        .await
        .expect("the jobs stream");
    let mut consumer = stream
        .create_consumer(pull::Config {
            filter_subject: kiln_core::subjects::JOB_EVENT_ALL.to_string(),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("a consumer of the job events");
    let stored = consumer.info().await.expect("the consumer's info").num_pending;
    let mut messages = consumer.messages().await.expect("the job events");
    // By job, by version: (state, stored at in ns since the epoch).
    let mut changes: std::collections::HashMap<String, std::collections::BTreeMap<i64, (i32, i128)>> =
        Default::default();
    for _ in 0..stored {
        let message = tokio::time::timeout(PATIENCE, messages.next())
            .await
            .expect("the job events come")
            .expect("a job event")
            .expect("a job event");
        let event = pb::JobEvent::decode(message.payload.as_ref()).expect("a job event");
        if !jobs.contains(&event.job_id) {
            continue;
        }
        let at = message.info().expect("its info").published.unix_timestamp_nanos();
        changes
            .entry(event.job_id)
            .or_default()
            .entry(event.version)
            .or_insert((event.state, at));
    }
    let running = pb::JobState::Running as i32;
    let nanos: i128 = changes
        .values()
        .map(|versions| {
            let ordered: Vec<&(i32, i128)> = versions.values().collect();
            ordered
                .windows(2)
                .filter(|pair| pair[0].0 == running)
                .map(|pair| (pair[1].1 - pair[0].1).max(0))
                .sum::<i128>()
        })
        .sum();
    nanos as f64 / 3.6e12
}
