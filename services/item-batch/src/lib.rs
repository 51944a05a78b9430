//! kiln-item-batch: batch jobs. Items go into the metadata database (idempotent by key) and
//! onto `KILN_ITEMS`, one durable consumer per batch; workers are jobs running kiln-agent, which
//! holds a [`work`] session with item-batch; outcomes go through `KILN_ITEM_RESULTS` into the
//! items' rows ([`results`]); the [`scaler`] asks for workers by the backlog and ends batches.
//!
//! - [`grpc`]: `BatchService`, with `sources` streaming items from object storage; [`work`]:
//!   `ItemWorkService` (the agents' sessions);
//! - [`store`]: batches, items, attempts; [`spec`] and [`template`]: what a batch runs;
//!   `progress`: a batch as clients see it (counters, rate, ETA).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{self, pull};
use kiln_core::auth::AuthLayer;
use kiln_core::events::stop_job;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use kiln_proto::v1::batch_service_server::BatchServiceServer;
use kiln_proto::v1::item_work_service_server::ItemWorkServiceServer;
use object_store::ObjectStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod error;
mod feed;
pub mod grpc;
mod intake;
mod progress;
pub mod results;
pub mod retry;
pub mod scaler;
pub mod service_metrics;
mod sources;
pub mod spec;
pub mod store;
pub mod template;
pub mod usage;
pub mod work;

pub use config::Config;
pub use error::{Error, Result};

use crate::error::nats_error;
use crate::progress::Progress;
use crate::store::{BatchStore, NewItem};

const SCHEMA_WAIT: Duration = Duration::from_secs(60);
/// Unpublished items read from the database at a time.
const UNPUBLISHED_PAGE: u64 = 10_000;
/// How long a batch's state read from the database is trusted by the sessions.
const STATE_TTL: Duration = Duration::from_millis(500);
/// What every part of item-batch shares.
pub struct Shared {
    pub config: Config,
    pub store: Store,
    pub batches: BatchStore,
    pub nats: Nats,
    pub objects: Arc<dyn ObjectStore>,
    /// Where workers reach this service.
    pub advertise_url: String,
    states: Mutex<HashMap<String, (String, Instant)>>,
    /// Batches with an [`intake::Intake`] under way here, and how many: their recorded items
    /// are on their way to the queue, not stranded (see [`Shared::publish_stranded`]).
    intakes: Mutex<HashMap<String, usize>>,
    progress: Mutex<HashMap<String, Progress>>,
    /// What batches' items used, read at most every few seconds per batch.
    pub(crate) usage: usage::UsageCache,
    /// Wakes the scaler early (outcomes arrived: a sealed batch may be done).
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) metrics: service_metrics::BatchMetrics,
}

impl Shared {
    /// A batch's state, read from the database at most every [`STATE_TTL`].
    pub async fn batch_state(&self, batch_id: &str) -> Result<String> {
        if let Some((state, at)) = self.states.lock().expect("states lock").get(batch_id)
            && at.elapsed() < STATE_TTL
        {
            return Ok(state.clone());
        }
        let state = self.batches.batch(batch_id).await?.state;
        self.states
            .lock()
            .expect("states lock")
            .insert(batch_id.to_string(), (state.clone(), Instant::now()));
        Ok(state)
    }

    fn forget_state(&self, batch_id: &str) {
        self.states.lock().expect("states lock").remove(batch_id);
    }

    /// Creates the batch's durable consumer on `KILN_ITEMS` when it does not exist.
    pub async fn ensure_consumer(&self, batch_id: &str) -> Result<consumer::PullConsumer> {
        let stream = self
            .nats
            .jetstream
            .get_stream(subjects::STREAM_ITEMS)
            .await
            .map_err(nats_error)?;
        let name = subjects::consumer_items(batch_id);
        stream
            .get_or_create_consumer(
                &name,
                pull::Config {
                    durable_name: Some(name.clone()),
                    filter_subject: subjects::items(batch_id),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(self.config.ack_wait_secs),
                    max_deliver: -1,
                    max_ack_pending: 100_000,
                    // Every worker's session keeps a pull request waiting.
                    max_waiting: 100_000,
                    ..Default::default()
                },
            )
            .await
            .map_err(nats_error)
    }

    /// Items taken by workers and not yet answered (JetStream's count), if the consumer exists.
    async fn in_flight(&self, batch_id: &str) -> Option<u64> {
        let stream = self.nats.jetstream.get_stream(subjects::STREAM_ITEMS).await.ok()?;
        let mut consumer: consumer::PullConsumer =
            stream.get_consumer(&subjects::consumer_items(batch_id)).await.ok()?;
        consumer.info().await.ok().map(|info| info.num_ack_pending as u64)
    }

    /// Records checked items in an open batch; returns the new ones (to publish: see
    /// [`intake::Intake`]) and how many were duplicates.
    pub(crate) async fn record(&self, batch_id: &str, items: Vec<NewItem>) -> Result<(Vec<NewItem>, u64)> {
        self.forget_state(batch_id);
        let state = self.batch_state(batch_id).await?;
        if state != store::OPEN {
            return Err(Error::FailedPrecondition(format!(
                "batch {batch_id} is {state}; items can only be added to an open batch"
            )));
        }
        self.batches.add_items(batch_id, items).await
    }

    fn intake_began(&self, batch_id: &str) {
        *self
            .intakes
            .lock()
            .expect("intakes lock")
            .entry(batch_id.to_string())
            .or_default() += 1;
    }

    fn intake_ended(&self, batch_id: &str) {
        let mut intakes = self.intakes.lock().expect("intakes lock");
        if let Some(count) = intakes.get_mut(batch_id) {
            *count -= 1;
            if *count == 0 {
                intakes.remove(batch_id);
            }
        }
    }

    /// Publishes items stranded unpublished (an intake that died with its process, or whose
    /// queue stayed away past the publish window), unless an intake of this process is under
    /// way for the batch: its items are unpublished only until it publishes them, and sending
    /// them twice would cost as much again (the copies are dropped as duplicates). An intake
    /// of another replica can still be doubled that way, harmlessly.
    pub async fn publish_stranded(self: &Arc<Self>, batch_id: &str) -> Result<usize> {
        if self.intakes.lock().expect("intakes lock").contains_key(batch_id) {
            return Ok(0);
        }
        self.publish_unpublished(batch_id).await
    }

    /// Publishes the items recorded but not published (a crash came between, or RetryFailed).
    pub async fn publish_unpublished(self: &Arc<Self>, batch_id: &str) -> Result<usize> {
        // The scaler asks every pass: a publisher is started only when there is something.
        let mut items = self.batches.unpublished(batch_id, "", UNPUBLISHED_PAGE).await?;
        if items.is_empty() {
            return Ok(0);
        }
        let mut intake = intake::Intake::start(self.clone(), batch_id.to_string());
        let mut published = 0;
        while let Some(last) = items.last() {
            let after = last.item_key.clone();
            let queued: Vec<pb::QueuedItem> = items
                .into_iter()
                .map(|item| pb::QueuedItem {
                    batch_id: batch_id.to_string(),
                    params: serde_json::from_str(&item.params_json).unwrap_or_default(),
                    key: item.item_key,
                    uri: item.uri,
                    round: u32::try_from(item.round).unwrap_or(0),
                })
                .collect();
            published += queued.len();
            intake.publish(queued).await?;
            items = self.batches.unpublished(batch_id, &after, UNPUBLISHED_PAGE).await?;
        }
        intake.finish().await?;
        Ok(published)
    }

    /// Cancels a batch: no more dispatch (its consumer and queued items go), its workers stop.
    pub async fn cancel(&self, batch_id: &str) -> Result<()> {
        self.batches
            .set_batch_state(batch_id, &[store::OPEN, store::SEALED], store::CANCELLED)
            .await?;
        self.forget_state(batch_id);
        self.drop_queue(batch_id).await?;
        for worker in self.store.live_batch_workers(batch_id).await? {
            stop_job(&self.nats, &self.store, worker, "batch cancelled").await?;
        }
        tracing::info!(%batch_id, "batch cancelled");
        Ok(())
    }

    /// Deletes a batch's consumer and whatever of its items is still queued.
    async fn drop_queue(&self, batch_id: &str) -> Result<()> {
        let stream = self
            .nats
            .jetstream
            .get_stream(subjects::STREAM_ITEMS)
            .await
            .map_err(nats_error)?;
        // Gone already is fine.
        let _ = stream.delete_consumer(&subjects::consumer_items(batch_id)).await;
        stream
            .purge()
            .filter(subjects::items(batch_id))
            .await
            .map_err(nats_error)?;
        Ok(())
    }
}

/// item-batch, connected and listening, not yet serving.
pub struct ItemBatch {
    shared: Shared,
    listener: TcpListener,
    metrics: Metrics,
}

impl ItemBatch {
    pub async fn bind(config: Config) -> Result<ItemBatch> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::ItemBatch).await?;
        let objects = kiln_core::objects::connect(&config.objects).await?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.grpc.listen,
            source,
        })?;
        let advertise_url = if config.advertise_url.is_empty() {
            let scheme = if config.grpc.tls.enabled() { "https" } else { "http" };
            format!("{scheme}://{addr}")
        } else {
            config.advertise_url.clone()
        };
        let shared = Shared {
            batches: BatchStore::new(&store).telling(kiln_core::feed::Changes::publish(
                nats.jetstream.clone(),
                kiln_core::subjects::CHANGES_BATCHES,
            )),
            store,
            nats,
            objects,
            advertise_url,
            states: Mutex::new(HashMap::new()),
            intakes: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            usage: usage::UsageCache::default(),
            wake: tokio::sync::Notify::new(),
            metrics: service_metrics::BatchMetrics::default(),
            config,
        };
        Ok(ItemBatch {
            shared,
            listener,
            metrics: Metrics::default(),
        })
    }

    /// Registers item-batch's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> ItemBatch {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.shared.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let mut shared = self.shared;
        shared.metrics.register(&self.metrics);
        shared.store.count_transitions(&self.metrics, "item-batch");
        let shared = Arc::new(shared);
        let rpc_metrics = RpcMetricsLayer::new(&self.metrics, "item-batch");
        // A JoinSet aborts its tasks when dropped, so a serve future dropped mid-flight takes
        // the intake and the scaler with it, as a process exit would.
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(kiln_core::intake::run(
            shared.nats.clone(),
            results::RESULTS,
            results::MESSAGES_PER_WRITE,
            Arc::new(results::ResultWriter { shared: shared.clone() }),
            shutdown.clone(),
        ));
        tasks.spawn(scaler::run(shared.clone(), shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<BatchServiceServer<grpc::BatchApi>>()
            .await;
        let batches = grpc::BatchApi { shared: shared.clone() };
        let work = work::WorkApi { shared: shared.clone() };
        tracing::info!(addr = %self.listener.local_addr().map_err(|source| Error::Bind { addr: shared.config.grpc.listen, source })?, "item-batch serving");
        let served = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            .layer(AuthLayer::new(Arc::new(shared.store.clone())))
            .add_service(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("item-batch").server())
            .add_service(BatchServiceServer::new(batches).max_decoding_message_size(grpc::MAX_MESSAGE_BYTES))
            .add_service(ItemWorkServiceServer::new(work))
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.listener, &shared.config.grpc.tls)?,
                shutdown.clone().cancelled_owned(),
            )
            .await;
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        served?;
        Ok(())
    }
}

/// Runs item-batch until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let service = ItemBatch::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
