//! kiln-scheduler: decides which queued job runs next, on which pool and market.
//!
//! One scheduler leads at a time, by lease in the `kiln_leases` bucket ([`kiln_core::lease`]);
//! standbys keep trying and take over within the lease TTL. Each pass of the leader reads the
//! QUEUED jobs from the database (the source of truth), the pools from the runners' reports in
//! `kiln_capacity`, the quotas, and what active jobs hold ([`input::read`]); [`policy::plan`]
//! orders and places them; each placement is moved QUEUED → SCHEDULED by compare-and-set (so a
//! job is placed once even if two schedulers ever believe they lead), names the runner it was
//! placed on (one whose own free room holds it, never a pool's sum), and is published on
//! `kiln.launch.<pool>.<runner>`; each priority preemption is sent to its runner. Only runners holding a
//! live lease count: the pass first ends or queues again the jobs of runners whose lease expired
//! ([`lost`]), and their capacity reports are ignored. Job events on
//! `KILN_JOBS` (one consumer per scheduler) wake a pass and feed the pools' spot preemption
//! rates, which the leader saves in the `kiln_scheduler` bucket for its successor
//! ([`state`]); a timer covers the rest. A new leader first publishes SCHEDULED changes that were
//! committed but not published (reconciler). While it leads it also answers `kiln explain` over
//! NATS request/reply from the same reading as its pass ([`explain_service`]).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::events::{preempt_job, publish_job_change, republish_pending};
use kiln_core::lease::Lease;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::scheduling::{Market, SPOT_PREEMPTION};
use kiln_core::store::{Change, JobRecord, Store, StoreError};
use kiln_core::streams::{Nats, NatsError};
use kiln_core::{JobState, streams, subjects};
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod demand;
pub mod error;
pub mod explain_service;
pub mod gang;
pub mod input;
pub mod lost;
pub mod policy;
pub mod service_metrics;
pub mod state;

pub use config::Config;
pub use error::{Error, Result};
pub use state::{PassState, SavedRates};

/// How long a non-api service waits for `api` to apply the migrations.
const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// The scheduler, connected and listening, not yet running.
pub struct Scheduler {
    config: Config,
    listener: TcpListener,
    store: Store,
    nats: Nats,
    metrics: Metrics,
}

impl Scheduler {
    pub async fn bind(config: Config) -> Result<Scheduler> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Scheduler).await?;
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
            metrics: Metrics::default(),
        })
    }

    /// Registers the scheduler's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Scheduler {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(mut self, shutdown: CancellationToken) -> Result<()> {
        let metrics = service_metrics::SchedulerMetrics::register(&self.metrics);
        let rpc_metrics = RpcMetricsLayer::new(&self.metrics, "scheduler");
        self.store.count_transitions(&self.metrics, "scheduler");
        let name = if self.config.instance_name.is_empty() {
            format!("scheduler-{}", kiln_core::ids::new_id())
        } else {
            self.config.instance_name.clone()
        };
        let ttl = Duration::from_millis(self.config.lease_ttl_ms);
        let mut lease = Lease::new(&self.nats, subjects::LEASE_SCHEDULER, &name, ttl).await?;
        let state = Arc::new(Mutex::new(PassState::new(&self.config)));
        let saved_rates = SavedRates::open(&self.nats).await?;
        let wake = Arc::new(Notify::new());
        let events = tokio::spawn(watch_job_events(
            self.nats.clone(),
            metrics.clone(),
            wake.clone(),
            state.clone(),
            shutdown.clone(),
        ));
        let (leading_tx, leading_rx) = watch::channel(false);
        let explainer = explain_service::Explainer {
            config: self.config.clone(),
            store: self.store.clone(),
            nats: self.nats.clone(),
            state: state.clone(),
        };
        let explain = tokio::spawn(explainer.serve(leading_rx, shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let health = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(rpc_metrics)
                .layer(kiln_core::auth::AuthLayer::new(std::sync::Arc::new(self.store.clone())))
                .add_service(health_service)
                .add_service(kiln_core::whoami::NodeApi::new("scheduler").server())
                .serve_with_incoming_shutdown(
                    kiln_core::tls::incoming(self.listener, &self.config.grpc.tls)?,
                    shutdown.clone().cancelled_owned(),
                ),
        );
        let interval = Duration::from_millis(self.config.pass_interval_ms);
        let renew_every = ttl / 3;
        let mut last_tick: Option<tokio::time::Instant> = None;
        let mut leading = false;
        tracing::info!(name, "scheduler running; waiting for the lease");
        while !shutdown.is_cancelled() {
            if last_tick.is_none_or(|at| at.elapsed() >= renew_every) {
                last_tick = Some(tokio::time::Instant::now());
                if let Err(error) = lease.tick().await {
                    tracing::warn!(error = %error, "cannot reach the lease; not scheduling");
                }
            }
            let now_leading = lease.is_held();
            if now_leading != leading {
                leading = now_leading;
                metrics.leading(leading);
                tracing::info!(name, leading, "leadership changed");
                if leading {
                    // What the pools taught the last leader.
                    match saved_rates.load().await {
                        Ok(rates) => state.lock().expect("pass state lock").take_over(rates),
                        Err(error) => tracing::warn!(error = %error, "cannot read the saved preemption rates"),
                    }
                    // Changes committed by the last leader but not published.
                    if let Err(error) = republish_pending(&self.nats, &self.store, &[JobState::Scheduled]).await {
                        tracing::warn!(error = %error, "cannot re-drive unpublished changes");
                    }
                }
                // Explanations start from the rates taken over.
                leading_tx.send_replace(leading);
            }
            if leading {
                if let Err(error) = pass(&self.config, &self.store, &self.nats, &state, &metrics).await {
                    tracing::warn!(error = %error, "scheduling pass failed; retrying");
                }
                save_rates(&saved_rates, &state).await;
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = wake.notified(), if leading => {}
                _ = tokio::time::sleep(if leading { interval } else { renew_every.min(interval) }) => {}
            }
        }
        if let Err(error) = lease.release().await {
            tracing::warn!(error = %error, "cannot give the lease up; it expires on its own");
        }
        leading_tx.send_replace(false);
        let _ = events.await;
        let _ = explain.await;
        health
            .await
            .map_err(|e| Error::Nats(NatsError::Other(e.to_string())))??;
        Ok(())
    }
}

/// Runs the scheduler until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let scheduler = Scheduler::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, scheduler.nats(), &shutdown).await?;
    scheduler.serve(shutdown).await
}

/// Tells the provisioner which jobs no live runner holds (the newest snapshot wins, so a failed
/// write is made good by the next pass).
async fn publish_demand(nats: &Nats, input: &policy::Input, plan: &policy::Plan) {
    let demand = demand::of_plan(input, plan, kiln_core::ids::now_ms());
    if let Err(error) = kiln_core::provisioning::publish_demand(nats, &demand).await {
        tracing::warn!(error = %error, "cannot publish the demand for the provisioner");
    }
}

/// One scheduling pass: take back the jobs of runners gone ([`lost`]), place what the policy
/// places, send its preemptions.
pub async fn pass(
    config: &Config,
    store: &Store,
    nats: &Nats,
    state: &Mutex<PassState>,
    metrics: &service_metrics::SchedulerMetrics,
) -> Result<usize> {
    let started = std::time::Instant::now();
    let placed = place(config, store, nats, state, metrics).await;
    metrics.pass_took(started.elapsed().as_secs_f64());
    placed
}

async fn place(
    config: &Config,
    store: &Store,
    nats: &Nats,
    state: &Mutex<PassState>,
    metrics: &service_metrics::SchedulerMetrics,
) -> Result<usize> {
    metrics.lost(lost::take_back(store, nats).await?);
    let read = input::read_as_leader(config, store, nats, state).await?;
    metrics.read(&read.input);
    if read.queued.is_empty() {
        metrics.planned(&policy::Plan::default());
        publish_demand(nats, &read.input, &policy::Plan::default()).await;
        return Ok(0);
    }
    let plan = policy::plan(&read.input);
    metrics.planned(&plan);
    publish_demand(nats, &read.input, &plan).await;
    let mut placed = 0;
    let mut gangs = gang::Rendezvous::default();
    for placement in &plan.placements {
        let job = &read.queued[placement.job];
        let gang_master = if placement.nodes.is_empty() {
            None
        } else {
            let master = gangs.master(store, nats, job, &placement.runner).await?;
            store.place_gang(&job.id, job.attempt, &placement.nodes).await?;
            Some(master)
        };
        let change = Change {
            pool: Some(placement.pool.clone()),
            // The runner it was placed on: its launch goes to that runner alone.
            runner_id: (!placement.runner.is_empty()).then(|| placement.runner.clone()),
            market: Some(placement.market),
            gang_master,
            ..Change::default()
        };
        match store.transition(job, JobState::Scheduled, change).await {
            Ok(scheduled) => {
                tracing::info!(job_id = %scheduled.id, pool = %placement.pool, runner = %placement.runner, market = %placement.market, "job scheduled");
                metrics.placed(&placement.pool, placement.market, job.updated_at_ms);
                placed += 1;
                // A failed publish is re-driven by the reconciler.
                if let Err(error) = publish_job_change(nats, store, &scheduled).await {
                    tracing::warn!(job_id = %scheduled.id, error = %error, "publish failed");
                }
            }
            // Stopped or taken by another scheduler since we read it: nothing to do.
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    for preemption in &plan.preemptions {
        let victim = match store.job(&preemption.victim).await {
            Ok(victim) => victim,
            Err(StoreError::JobNotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        let victim = match unschedule(store, nats, victim, &preemption.for_job).await? {
            Some(started) => started,
            // Taken back before any runner took it: no work lost, no token spent.
            None => continue,
        };
        tracing::warn!(victim = %victim.id, for_job = %preemption.for_job, "preempting a job");
        preempt_job(nats, &victim, &preemption.for_job).await?;
        state
            .lock()
            .expect("pass state lock")
            .preempted(victim.id, preemption.fair_share);
    }
    // Unpublished SCHEDULED changes (a publish failed above, or in an earlier pass).
    republish_pending(nats, store, &[JobState::Scheduled]).await?;
    Ok(placed)
}

/// A victim still SCHEDULED is queued again by compare-and-set before a runner takes it (no
/// runner holds it yet, so a control message would find nobody); its launch goes stale. Returns
/// the victim to send the preemption to when a runner took it first (or it was past SCHEDULED).
async fn unschedule(store: &Store, nats: &Nats, victim: JobRecord, for_job: &str) -> Result<Option<JobRecord>> {
    if victim.state()? != JobState::Scheduled {
        return Ok(Some(victim));
    }
    let change = Change {
        reason: Some(format!("preempted for {for_job} before it started; queued again")),
        ..Change::default()
    };
    match store.transition(&victim, JobState::Queued, change).await {
        Ok(queued) => {
            tracing::warn!(victim = %queued.id, for_job, "taking back a scheduled job");
            if let Err(error) = publish_job_change(nats, store, &queued).await {
                tracing::warn!(job_id = %queued.id, error = %error, "publish failed");
            }
            Ok(None)
        }
        // A runner took it in the meantime: it holds it now, and the control reaches it.
        Err(StoreError::Conflict { .. }) => Ok(Some(store.job(&victim.id).await?)),
        Err(error) => Err(error.into()),
    }
}

/// Saves the pools' preemption rates for the next leader when they are due.
async fn save_rates(saved_rates: &SavedRates, state: &Mutex<PassState>) {
    let Some(rates) = state.lock().expect("pass state lock").rates_to_save() else {
        return;
    };
    match saved_rates.save(&rates).await {
        Ok(()) => state.lock().expect("pass state lock").saved(),
        Err(error) => tracing::warn!(error = %error, "cannot save the preemption rates; retrying after the next pass"),
    }
}

/// Wakes a pass on every job event, and counts spot preemptions.
async fn watch_job_events(
    nats: Nats,
    metrics: service_metrics::SchedulerMetrics,
    wake: Arc<Notify>,
    state: Arc<Mutex<PassState>>,
    shutdown: CancellationToken,
) {
    loop {
        match consume_job_events(&nats, &metrics, &wake, &state, &shutdown).await {
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

async fn consume_job_events(
    nats: &Nats,
    metrics: &service_metrics::SchedulerMetrics,
    wake: &Notify,
    state: &Mutex<PassState>,
    shutdown: &CancellationToken,
) -> Result<(), NatsError> {
    let other = |e: &dyn std::fmt::Display| NatsError::Other(e.to_string());
    let stream = nats
        .jetstream
        .get_stream(subjects::STREAM_JOBS)
        .await
        .map_err(|e| other(&e))?;
    // Each scheduler its own consumer (every one sees every event; the events are hints, the
    // database holds the truth), removed by the server a minute after it goes away.
    let consumer: consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            filter_subject: subjects::JOB_ALL.to_string(),
            deliver_policy: consumer::DeliverPolicy::New,
            ack_policy: consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .map_err(|e| other(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| other(&e))?;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => {
                let Some(message) = message else { return Err(NatsError::Other("consumer ended".into())) };
                let message = message.map_err(|e| other(&e))?;
                // A spot preemption feeds its pool's rate (the reason tells it from a priority
                // one), and its offering's when the event names one (the runner knows its
                // instance, and that it is on spot whatever market the job was placed for).
                if let Ok(event) = pb::JobEvent::decode(message.payload.as_ref())
                    && event.state == pb::JobState::Preempted as i32
                    && (event.market == Market::Spot.as_str() || !event.instance_type.is_empty())
                    && event.reason == SPOT_PREEMPTION
                {
                    let offering = (!event.instance_type.is_empty())
                        .then(|| format!("{}/{}", event.instance_type, event.zone));
                    state
                        .lock()
                        .expect("pass state lock")
                        .observe_preemption(&event.pool, offering.as_deref());
                    metrics.spot_preempted();
                }
                wake.notify_one();
            }
        }
    }
}
