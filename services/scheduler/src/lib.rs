//! kiln-scheduler: decides which queued job runs next and on which pool.
//!
//! Each pass reads the QUEUED jobs from the database (the source of truth), the pools'
//! capacity from the runners' reports in the `kiln_capacity` bucket, and what active jobs hold;
//! [`queue::plan`] picks the jobs that fit, in FIFO order; each is moved QUEUED → SCHEDULED by
//! compare-and-set and its launch request published on `kiln.launch.<pool>`. Job events on
//! `KILN_JOBS` (durable consumer `scheduler`) wake a pass; a timer covers the rest. At start,
//! SCHEDULED changes that were committed but not published are published (reconciler).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::events::{publish_job_change, republish_pending};
use kiln_core::store::{Change, Store, StoreError};
use kiln_core::streams::{Nats, NatsError};
use kiln_core::{JobState, capacity, streams, subjects};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod error;
pub mod queue;

pub use config::Config;
pub use error::{Error, Result};

/// How long a non-api service waits for `api` to apply the migrations.
const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// The scheduler, connected and listening, not yet running.
pub struct Scheduler {
    config: Config,
    listener: TcpListener,
    store: Store,
    nats: Nats,
}

impl Scheduler {
    pub async fn bind(config: Config) -> Result<Scheduler> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect(&config.nats).await?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        Ok(Scheduler {
            config,
            listener,
            store,
            nats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        republish_pending(&self.nats, &self.store, &[JobState::Scheduled]).await?;
        let wake = Arc::new(Notify::new());
        let events = tokio::spawn(watch_job_events(self.nats.clone(), wake.clone(), shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let health = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(self.listener),
                    shutdown.clone().cancelled_owned(),
                ),
        );
        let interval = Duration::from_millis(self.config.pass_interval_ms);
        tracing::info!("scheduler running");
        while !shutdown.is_cancelled() {
            if let Err(error) = pass(&self.store, &self.nats).await {
                tracing::warn!(error = %error, "scheduling pass failed; retrying");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = wake.notified() => {}
                _ = tokio::time::sleep(interval) => {}
            }
        }
        let _ = events.await;
        health
            .await
            .map_err(|e| Error::Nats(NatsError::Other(e.to_string())))??;
        Ok(())
    }
}

/// Runs the scheduler until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    Scheduler::bind(config).await?.serve(shutdown).await
}

/// One scheduling pass: place what fits, in order.
pub async fn pass(store: &Store, nats: &Nats) -> Result<usize> {
    let queued = store.jobs_in_states(&[JobState::Queued]).await?;
    if queued.is_empty() {
        return Ok(0);
    }
    let pools = capacity::pools(nats).await?;
    let usage = store.active_usage_by_pool().await?;
    let mut placed = 0;
    for (index, pool) in queue::plan(&queued, &pools, &usage) {
        let job = &queued[index];
        let change = Change {
            pool: Some(pool.clone()),
            ..Change::default()
        };
        match store.transition(job, JobState::Scheduled, change).await {
            Ok(scheduled) => {
                tracing::info!(job_id = %scheduled.id, pool, "job scheduled");
                placed += 1;
                // A failed publish is re-driven by the reconciler at the next start.
                if let Err(error) = publish_job_change(nats, store, &scheduled).await {
                    tracing::warn!(job_id = %scheduled.id, error = %error, "publish failed");
                }
            }
            // Stopped or taken by another scheduler since we read it: nothing to do.
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    // Unpublished SCHEDULED changes (a publish failed above, or in an earlier pass).
    republish_pending(nats, store, &[JobState::Scheduled]).await?;
    Ok(placed)
}

/// Wakes a pass on every job event; acks them, since the database holds the truth.
async fn watch_job_events(nats: Nats, wake: Arc<Notify>, shutdown: CancellationToken) {
    loop {
        match consume_job_events(&nats, &wake, &shutdown).await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(error = %error, "job event consumer failed; restarting");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

async fn consume_job_events(nats: &Nats, wake: &Notify, shutdown: &CancellationToken) -> Result<(), NatsError> {
    let other = |e: &dyn std::fmt::Display| NatsError::Other(e.to_string());
    let stream = nats
        .jetstream
        .get_stream(subjects::STREAM_JOBS)
        .await
        .map_err(|e| other(&e))?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            subjects::CONSUMER_SCHEDULER,
            pull::Config {
                durable_name: Some(subjects::CONSUMER_SCHEDULER.to_string()),
                filter_subject: subjects::JOB_ALL.to_string(),
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| other(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| other(&e))?;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => {
                let Some(message) = message else { return Err(NatsError::Other("consumer ended".into())) };
                let message = message.map_err(|e| other(&e))?;
                wake.notify_one();
                message.ack().await.map_err(|e| other(&*e))?;
            }
        }
    }
}
