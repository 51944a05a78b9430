//! kiln-runner: runs jobs on instances of its [`provider`] (`docker`, or `process` for machines
//! without Docker).
//!
//! - launch consumer: pulls `kiln.launch.<pool>` (work queue, durable `runner-<pool>`) one at a
//!   time, checks the request is current and fits, moves the job SCHEDULED → PROVISIONING by
//!   compare-and-set, acks, and hands it to a [`supervisor`];
//! - control consumer: `kiln.control.>` (durable `control-<runner>`), stop requests for the jobs
//!   this runner holds;
//! - capacity reports to the `kiln_capacity` bucket, which the scheduler reads;
//! - reconciler: at start, jobs this runner held when it went away are ended (LOST, or queued
//!   again, as `on-lost` says): their instances are killed, their outputs synced and the
//!   instances released; anything else labelled with this runner is released too; unpublished
//!   changes of its jobs are published again.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use gpu::{GpuPool, GpuSampler};
use kiln_core::capacity::{self, CapacityReport};
use kiln_core::events::publish_job_change;
use kiln_core::ids::now_ms;
use kiln_core::store::{Change, JobRecord, Store, StoreError};
use kiln_core::streams::{Nats, NatsError};
use kiln_core::{JobState, objects, streams, subjects};
use kiln_proto::v1 as pb;
use object_store::ObjectStore;
use prost::Message;
use provider::docker::DockerProvider;
use provider::process::ProcessProvider;
use provider::{Capacity, Provider};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

pub mod bundle;
pub mod collector;
pub mod config;
pub mod error;
pub mod gpu;
pub mod logs;
pub mod outputs;
pub mod provider;
mod supervisor;

pub use config::{Config, OnLost, ProviderKind};
pub use error::{Error, Result};

const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// A job this runner holds, with what it takes and how to stop it.
struct ActiveJob {
    controls: supervisor::Controls,
    cpu_millis: i64,
    memory_bytes: i64,
    gpu_devices: Vec<u32>,
}

/// What the runner's tasks share.
#[derive(Clone)]
pub(crate) struct Context {
    config: Arc<Config>,
    store: Store,
    nats: Nats,
    objects: Arc<dyn ObjectStore>,
    provider: Arc<dyn Provider>,
    capacity: Capacity,
    active: Arc<Mutex<HashMap<String, ActiveJob>>>,
    gpus: Arc<Mutex<GpuPool>>,
    sampler: Option<Arc<dyn GpuSampler>>,
    /// The agent archive for batch workers' containers, packed on first use.
    agent_archive: Arc<tokio::sync::OnceCell<bytes::Bytes>>,
}

impl Context {
    /// Forgets a job this runner held, giving its GPUs back.
    fn release_active(&self, job_id: &str) {
        let released = self.active.lock().expect("active jobs lock").remove(job_id);
        if let Some(active) = released {
            self.gpus.lock().expect("gpu pool lock").give_back(&active.gpu_devices);
        }
    }

    /// Tells whether a job of this size fits next to the jobs running now.
    fn fits(&self, job: &JobRecord) -> bool {
        let active = self.active.lock().expect("active jobs lock");
        let cpu: i64 = active.values().map(|a| a.cpu_millis).sum();
        let memory: i64 = active.values().map(|a| a.memory_bytes).sum();
        cpu + job.cpu_millis <= self.capacity.cpu_millis && memory + job.memory_bytes <= self.capacity.memory_bytes
    }
}

/// The runner, connected and listening, not yet running.
pub struct Runner {
    ctx: Context,
    listener: TcpListener,
}

impl Runner {
    /// Binds a runner that reads GPU utilisation through NVML where it loads.
    pub async fn bind(config: Config) -> Result<Runner> {
        let sampler = gpu::NvmlSampler::load();
        Runner::bind_with_sampler(config, sampler).await
    }

    /// Binds a runner with the given GPU sampler (`None`: no GPUs can be watched).
    pub async fn bind_with_sampler(config: Config, sampler: Option<Arc<dyn GpuSampler>>) -> Result<Runner> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect(&config.nats).await?;
        let objects = objects::open(&config.objects)?;
        tokio::fs::create_dir_all(&config.work_dir)
            .await
            .map_err(Error::io(format!("cannot create {}", config.work_dir.display())))?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let provider = connect_provider(&config).await?;
        let mut capacity = provider.capacity().await?;
        // GPUs: configured, else those NVML finds, else the provider's own (a simulated cloud's).
        capacity.gpus = match config.gpus {
            0 => sampler
                .as_ref()
                .map(|s| s.count())
                .filter(|n| *n > 0)
                .unwrap_or(capacity.gpus),
            n => u32::try_from(n).unwrap_or(0),
        };
        tracing::info!(
            provider = provider.name(),
            cpu_millis = capacity.cpu_millis,
            memory_bytes = capacity.memory_bytes,
            "provider ready"
        );
        let ctx = Context {
            config: Arc::new(config),
            store,
            nats,
            objects,
            provider,
            capacity,
            active: Arc::default(),
            gpus: Arc::new(Mutex::new(GpuPool::new(capacity.gpus))),
            sampler,
            agent_archive: Arc::default(),
        };
        Ok(Runner { ctx, listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The provider this runner runs its instances on.
    pub fn provider_name(&self) -> &'static str {
        self.ctx.provider.name()
    }

    /// Runs until `shutdown` is cancelled. Dropping the returned future aborts every job task
    /// (their processes are killed), as a crash would.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let ctx = self.ctx;
        reconcile(&ctx).await?;
        let mut tasks = JoinSet::new();
        tasks.spawn(report_capacity(ctx.clone(), shutdown.clone()));
        tasks.spawn(watch_controls(ctx.clone(), shutdown.clone()));
        if let Some(notices) = ctx.provider.preemptions() {
            tasks.spawn(watch_preemptions(ctx.clone(), notices, shutdown.clone()));
        }
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let health = tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(self.listener),
                shutdown.clone().cancelled_owned(),
            );
        tasks.spawn(async move {
            if let Err(error) = health.await {
                tracing::error!(error = %error, "health endpoint failed");
            }
        });
        tracing::info!(runner_id = %ctx.config.runner_id, pool = %ctx.config.pool, "runner running");
        let mut jobs = JoinSet::new();
        while !shutdown.is_cancelled() {
            if let Err(error) = take_launches(&ctx, &mut jobs, &shutdown).await {
                tracing::warn!(error = %error, "launch consumer failed; restarting");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
        // Jobs stop on the shutdown token; give them the grace period and a margin.
        let grace = Duration::from_millis(ctx.config.stop_grace_period_ms) + Duration::from_secs(10);
        if tokio::time::timeout(grace, async { while jobs.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!("jobs did not stop in time");
        }
        while tasks.join_next().await.is_some() {}
        if let Err(error) = capacity::withdraw(&ctx.nats, &ctx.config.runner_id).await {
            tracing::warn!(error = %error, "cannot withdraw the capacity report");
        }
        Ok(())
    }
}

/// Builds the provider the configuration asks for; `auto` runs image jobs in containers when
/// the engine answers, and the rest as processes.
async fn connect_provider(config: &Config) -> Result<Arc<dyn Provider>> {
    let docker = || DockerProvider::connect(config.docker.clone(), config.cpu_millis, config.memory_bytes);
    let process = || {
        let capacity = Capacity {
            cpu_millis: config.offered_cpu_millis(),
            memory_bytes: config.offered_memory_bytes(),
            gpus: 0,
        };
        ProcessProvider::new(capacity, config.work_dir.clone())
    };
    Ok(match config.provider {
        ProviderKind::Process => Arc::new(process()),
        ProviderKind::Sim => Arc::new(provider::sim::SimProvider::new(config.sim.clone())),
        ProviderKind::Docker => Arc::new(docker().await?),
        // Containers for jobs with an image, processes for the others.
        ProviderKind::Auto => match tokio::time::timeout(Duration::from_secs(5), docker()).await {
            Ok(Ok(docker)) => Arc::new(provider::auto::AutoProvider::new(docker, process())),
            Ok(Err(error)) => {
                tracing::info!(host = %config.docker.host, error = %error, "no Docker engine; running jobs as local processes");
                Arc::new(process())
            }
            Err(_) => {
                tracing::info!(host = %config.docker.host, "the Docker engine did not answer; running jobs as local processes");
                Arc::new(process())
            }
        },
    })
}

/// Runs a runner until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    Runner::bind(config).await?.serve(shutdown).await
}

fn nats_error(error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(error.to_string()))
}

/// Pulls launch requests one at a time and starts the jobs that are current and fit.
async fn take_launches(ctx: &Context, jobs: &mut JoinSet<()>, shutdown: &CancellationToken) -> Result<()> {
    let stream = ctx
        .nats
        .jetstream
        .get_stream(subjects::STREAM_LAUNCH)
        .await
        .map_err(nats_error)?;
    let name = subjects::consumer_launch(&ctx.config.pool);
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::launch(&ctx.config.pool),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .map_err(nats_error)?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1)
        .messages()
        .await
        .map_err(nats_error)?;
    loop {
        // Reap finished job tasks as we go.
        while jobs.try_join_next().is_some() {}
        let message = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => message,
        };
        let Some(message) = message else {
            return Err(nats_error("launch consumer ended"));
        };
        let message = message.map_err(nats_error)?;
        let ack = match accept_launch(ctx, &message.payload, jobs, shutdown).await {
            Ok(Accepted::Started | Accepted::Stale) => AckKind::Ack,
            Ok(Accepted::NoRoom) => AckKind::Nak(Some(Duration::from_secs(1))),
            Err(error) => {
                tracing::warn!(error = %error, "launch failed; it will be retried");
                AckKind::Nak(Some(Duration::from_secs(2)))
            }
        };
        message.ack_with(ack).await.map_err(nats_error)?;
    }
}

enum Accepted {
    Started,
    Stale,
    NoRoom,
}

async fn accept_launch(
    ctx: &Context,
    payload: &[u8],
    jobs: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Accepted> {
    let Ok(request) = pb::LaunchRequest::decode(payload) else {
        tracing::warn!("dropping a malformed launch request");
        return Ok(Accepted::Stale);
    };
    let job = match ctx.store.job(&request.job_id).await {
        Ok(job) => job,
        Err(StoreError::JobNotFound { .. }) => return Ok(Accepted::Stale),
        Err(error) => return Err(error.into()),
    };
    // A duplicate or an outdated request: the job has moved on.
    if job.version != request.version || job.state()? != JobState::Scheduled {
        return Ok(Accepted::Stale);
    }
    if !ctx.fits(&job) {
        return Ok(Accepted::NoRoom);
    }
    let wanted = u32::try_from(job.gpus).unwrap_or(u32::MAX);
    let Some(gpu_devices) = ctx.gpus.lock().expect("gpu pool lock").take(wanted) else {
        return Ok(Accepted::NoRoom);
    };
    let controls = supervisor::Controls::default();
    let active = ActiveJob {
        controls: controls.clone(),
        cpu_millis: job.cpu_millis,
        memory_bytes: job.memory_bytes,
        gpu_devices: gpu_devices.clone(),
    };
    ctx.active
        .lock()
        .expect("active jobs lock")
        .insert(job.id.clone(), active);
    let change = Change {
        runner_id: Some(ctx.config.runner_id.clone()),
        ..Change::default()
    };
    let provisioning = match ctx.store.transition(&job, JobState::Provisioning, change).await {
        Ok(provisioning) => provisioning,
        Err(error) => {
            ctx.release_active(&job.id);
            return match error {
                StoreError::Conflict { .. } => Ok(Accepted::Stale),
                error => Err(error.into()),
            };
        }
    };
    supervisor::publish(ctx, &provisioning).await;
    jobs.spawn(supervisor::supervise(
        ctx.clone(),
        provisioning,
        gpu_devices,
        controls,
        shutdown.clone(),
    ));
    Ok(Accepted::Started)
}

/// Spot preemption notices from the provider, passed to the jobs they concern.
async fn watch_preemptions(
    ctx: Context,
    mut notices: tokio::sync::mpsc::Receiver<provider::Preemption>,
    shutdown: CancellationToken,
) {
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            notice = notices.recv() => notice,
        };
        let Some(notice) = notice else { return };
        if let Some(active) = ctx.active.lock().expect("active jobs lock").get(&notice.job_id) {
            tracing::warn!(job_id = %notice.job_id, notice_ms = notice.notice.as_millis() as u64, "spot preemption notice");
            active.controls.preempt(notice.notice);
        }
    }
}

/// Stop requests for jobs of this runner.
async fn watch_controls(ctx: Context, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(error) = consume_controls(&ctx, &shutdown).await {
            tracing::warn!(error = %error, "control consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume_controls(ctx: &Context, shutdown: &CancellationToken) -> Result<()> {
    let stream = ctx
        .nats
        .jetstream
        .get_stream(subjects::STREAM_CONTROL)
        .await
        .map_err(nats_error)?;
    let name = subjects::consumer_control(&ctx.config.runner_id);
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::CONTROL_ALL.to_string(),
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                inactive_threshold: Duration::from_secs(24 * 3600),
                ..Default::default()
            },
        )
        .await
        .map_err(nats_error)?;
    let mut messages = consumer.messages().await.map_err(nats_error)?;
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => message,
        };
        let Some(message) = message else {
            return Err(nats_error("control consumer ended"));
        };
        let message = message.map_err(nats_error)?;
        if let Ok(request) = pb::ControlRequest::decode(message.payload.as_ref())
            && let Some(active) = ctx.active.lock().expect("active jobs lock").get(&request.job_id)
        {
            match pb::control_request::Action::try_from(request.action) {
                Ok(pb::control_request::Action::Stop) => {
                    tracing::info!(job_id = %request.job_id, "stop requested");
                    active.controls.stop.cancel();
                }
                Ok(pb::control_request::Action::Preempt) => {
                    tracing::warn!(job_id = %request.job_id, for_job = %request.for_job, "preempted for a higher priority");
                    let grace = Duration::from_millis(ctx.config.stop_grace_period_ms);
                    active.controls.preempt_for(request.for_job, grace);
                }
                _ => {}
            }
        }
        message.ack().await.map_err(nats_error)?;
    }
}

/// Reports this runner's capacity until shutdown, and re-drives unpublished changes of its jobs.
async fn report_capacity(ctx: Context, shutdown: CancellationToken) {
    let interval = Duration::from_millis(ctx.config.report_interval_ms);
    let offer = ctx.provider.offer();
    loop {
        let report = CapacityReport {
            runner_id: ctx.config.runner_id.clone(),
            pool: ctx.config.pool.clone(),
            provider: ctx.provider.name().into(),
            cpu_millis: ctx.capacity.cpu_millis,
            memory_bytes: ctx.capacity.memory_bytes,
            gpus: i64::from(ctx.capacity.gpus),
            updated_at_ms: now_ms(),
            instance: offer
                .instance
                .map_or_else(Default::default, |instance| capacity::Instance {
                    cpu_millis: instance.cpu_millis,
                    memory_bytes: instance.memory_bytes,
                    gpus: i64::from(instance.gpus),
                }),
            on_demand_per_hour: offer.on_demand_per_hour,
            spot_per_hour: offer.spot_per_hour,
            spot: offer.spot,
        };
        if let Err(error) = capacity::report(&ctx.nats, &report).await {
            tracing::warn!(error = %error, "cannot report capacity");
        }
        if let Err(error) = republish_own(&ctx).await {
            tracing::warn!(error = %error, "cannot re-drive unpublished changes");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Ends the jobs this runner held before it restarted, and publishes what was left unpublished.
async fn reconcile(ctx: &Context) -> Result<()> {
    let held = ctx
        .store
        .jobs_in_states(&[JobState::Provisioning, JobState::Running, JobState::Syncing])
        .await?;
    for job in held.into_iter().filter(|job| job.runner_id == ctx.config.runner_id) {
        let scratch_dir = ctx.config.work_dir.join(format!("{}-{}", job.id, job.attempt));
        if let Some(instance) = ctx
            .provider
            .recover(&job.id, job.attempt, &job.instance_id, scratch_dir)
            .await?
        {
            tracing::warn!(job_id = %job.id, instance = %instance.id, "killing an instance left by the previous runner");
            ctx.provider
                .signal(&instance, nix::sys::signal::Signal::SIGKILL)
                .await?;
            supervisor::sync_outputs(ctx, &instance).await;
            ctx.provider.release(&instance).await?;
        }
        supervisor::lose(ctx, &job, "the runner restarted while the job ran").await?;
    }
    let released = ctx.provider.release_leftovers(&ctx.config.runner_id, &[]).await?;
    if released > 0 {
        tracing::warn!(released, "released instances left by the previous runner");
    }
    republish_own(ctx).await
}

async fn republish_own(ctx: &Context) -> Result<()> {
    let pending = ctx.store.unpublished_jobs(&JobState::ALL).await?;
    for job in pending.iter().filter(|job| job.runner_id == ctx.config.runner_id) {
        publish_job_change(&ctx.nats, &ctx.store, job).await?;
    }
    Ok(())
}
