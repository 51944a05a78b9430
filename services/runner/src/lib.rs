//! kiln-runner: runs jobs on instances of its [`provider`] (`docker`, or `process` for machines
//! without Docker).
//!
//! - launch consumer: pulls `kiln.launch.<pool>` (work queue, durable `runner-<pool>`) one at a
//!   time, checks the request is current and fits, moves the job SCHEDULED → PROVISIONING by
//!   compare-and-set, acks, and hands it to a [`supervisor`];
//! - control consumer: `kiln.control.>` (durable `control-<runner>`), stop requests for the jobs
//!   this runner holds;
//! - capacity reports to the `kiln_capacity` bucket, which the scheduler reads (with the
//!   instance's identity, and whether the runner is cordoned, when it reads its instance
//!   metadata: [`metadata`]);
//! - on a cloud instance (`[imds] enabled`): its spot notices, polled ([`metadata::spot`]);
//! - its lease in the `kiln_runners` bucket ([`liveness`]), renewed every third of
//!   `lease-ttl-ms`: if it lapses, the scheduling leader ends or queues again this runner's jobs
//!   and stops counting its capacity, and the runner takes no launch until it holds it again; a
//!   supervisor that finds its job taken kills and releases the instance without writing the job;
//! - reconciler: at start, jobs this runner held when it went away are ended (LOST, or queued
//!   again, as `on-lost` says): their instances are killed, their outputs synced and the
//!   instances released; anything else labelled with this runner is released too; unpublished
//!   changes of its jobs are published again.
//!
//! `launch`, `control`, `report`, `liveness` and `reconcile` hold these parts; this file binds the
//! runner (its store, NATS, object storage and provider) and runs them side by side.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu::{GpuPool, GpuSampler};
use kiln_core::capacity;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::store::{JobRecord, Store};
use kiln_core::streams::{Nats, NatsError};
use kiln_core::{objects, streams};
use object_store::ObjectStore;
use provider::docker::DockerProvider;
use provider::process::{JobUsers, ProcessProvider};
use provider::{Capacity, Provider};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub mod bundle;
pub mod collector;
pub mod config;
mod control;
pub mod datasets;
pub mod ecr;
pub mod error;
pub mod gpu;
mod launch;
mod liveness;
pub mod logs;
pub mod metadata;
mod models;
pub mod outputs;
pub mod provider;
mod reconcile;
pub mod relay;
mod report;
mod service_metrics;
mod supervisor;

pub use config::{Config, OnLost, ProviderKind};
pub use error::{Error, Result};
#[cfg(feature = "test-util")]
pub use liveness::LeasePause;

use control::{watch_controls, watch_preemptions};
use launch::take_launches;
use reconcile::reconcile;
use report::report_capacity;

const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// A job this runner holds, with what it takes and how to stop it.
struct ActiveJob {
    controls: supervisor::Controls,
    cpu_millis: i64,
    memory_bytes: i64,
    disk_bytes: i64,
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
    /// Whether this runner holds its lease (launches are taken only while it does).
    lease: Arc<liveness::LeaseStatus>,
    datasets: datasets::DatasetCache,
    /// Where inference workers' model versions are staged.
    models_dir: std::path::PathBuf,
    metrics: Arc<service_metrics::RunnerMetrics>,
    /// The key that opens the secrets jobs name; `None` when the config names none (such jobs
    /// fail to start, saying so).
    secrets_key: Option<Arc<kiln_core::secrets::SecretsKey>>,
    /// What this runner's machine is, read from its instance metadata (`[imds] enabled`).
    identity: Option<Arc<metadata::Identity>>,
    /// ECR tokens of the instance role, for the registries of `[ecr]`.
    ecr: Option<Arc<ecr::Ecr>>,
    /// Set once its cloud warned the instance (a rebalance recommendation, an interruption
    /// notice): the runner takes no new launch and reports no free room. Never cleared.
    cordoned: Arc<std::sync::atomic::AtomicBool>,
    /// On a cloud instance, what its offering costs per hour (on-demand, spot), from the
    /// provisioner's pool status ([`report::learn_prices`]); `None` until known.
    instance_prices: Arc<Mutex<Option<(f64, f64)>>>,
}

impl Context {
    /// Forgets a job this runner held, giving its GPUs back.
    fn release_active(&self, job_id: &str) {
        let released = self.active.lock().expect("active jobs lock").remove(job_id);
        if let Some(active) = released {
            self.gpus.lock().expect("gpu pool lock").give_back(&active.gpu_devices);
        }
    }

    /// What the provider offers, priced as the instance this runner is on when that is known
    /// (its `[imds] price-per-hour`, else its pool's prices from the provisioner).
    fn offer(&self) -> provider::Offer {
        let mut offer = self.provider.offer();
        let Some(identity) = self.identity.as_deref() else {
            return offer;
        };
        if let Some((on_demand, spot)) = *self.instance_prices.lock().expect("prices lock") {
            offer.on_demand_per_hour = on_demand;
            offer.spot_per_hour = spot;
        }
        if let Some(price) = self.config.imds.price_per_hour {
            if identity.is_spot() {
                offer.spot_per_hour = price;
            } else {
                offer.on_demand_per_hour = price;
            }
        }
        offer.spot = identity.is_spot();
        offer
    }

    fn is_cordoned(&self) -> bool {
        self.cordoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Tells whether a job of this size fits next to the jobs running now.
    fn fits(&self, job: &JobRecord) -> bool {
        let active = self.active.lock().expect("active jobs lock");
        let cpu: i64 = active.values().map(|a| a.cpu_millis).sum();
        let memory: i64 = active.values().map(|a| a.memory_bytes).sum();
        let disk: i64 = active.values().map(|a| a.disk_bytes).sum();
        cpu + job.cpu_millis <= self.capacity.cpu_millis
            && memory + job.memory_bytes <= self.capacity.memory_bytes
            && disk + job.disk_bytes <= self.capacity.disk_bytes
    }
}

/// The runner, connected and listening, not yet running.
pub struct Runner {
    ctx: Context,
    listener: TcpListener,
    registry: Metrics,
    /// The simulated cloud, on the `sim` provider.
    sim: Option<provider::sim::SimCloud>,
    /// The isolated process jobs' firewall (`process.firewall`).
    firewall: Option<provider::firewall::UidFirewall>,
    /// The instance metadata service whose notices are watched (`[imds] enabled`).
    metadata: Option<Arc<dyn metadata::MetadataSource>>,
}

impl Runner {
    /// Binds a runner that reads GPU utilisation through NVML where it loads.
    pub async fn bind(config: Config) -> Result<Runner> {
        let sampler = gpu::NvmlSampler::load();
        Runner::bind_with_sampler(config, sampler).await
    }

    /// Binds a runner with the given GPU sampler (`None`: no GPUs can be watched).
    pub async fn bind_with_sampler(config: Config, sampler: Option<Arc<dyn GpuSampler>>) -> Result<Runner> {
        let (metadata, identity) = metadata::connect(&config.imds).await?;
        Runner::bind_on(config, sampler, metadata, identity).await
    }

    /// Binds a runner on a machine whose identity and notices `source` tells (a simulated
    /// cloud's instance; EC2's is `[imds]`): it acts on them as on IMDS's.
    pub async fn bind_with_metadata(config: Config, source: Arc<dyn metadata::MetadataSource>) -> Result<Runner> {
        let identity = source.identity().await?;
        Runner::bind_on(config, None, Some(source), Some(identity)).await
    }

    async fn bind_on(
        config: Config,
        sampler: Option<Arc<dyn GpuSampler>>,
        metadata: Option<Arc<dyn metadata::MetadataSource>>,
        identity: Option<metadata::Identity>,
    ) -> Result<Runner> {
        let secrets_key = config.secrets.load()?.map(Arc::new);
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Runner).await?;
        let objects = objects::connect(&config.objects).await?;
        tokio::fs::create_dir_all(&config.work_dir)
            .await
            .map_err(Error::io(format!("cannot create {}", config.work_dir.display())))?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let isolated = match config.provider {
            ProviderKind::Docker => None,
            _ => provider::process::isolation::resolve(&config.process, &config.work_dir)?,
        };
        let (provider, sim, firewall) = connect_provider(&config, isolated.as_ref()).await?;
        let dataset_cache = datasets::DatasetCacheConfig {
            dir: config.dataset_cache_dir(),
            ..config.dataset_cache.clone()
        };
        let models_dir = config.models_dir();
        let datasets = datasets::DatasetCache::open(&dataset_cache, &config.work_dir, objects.clone()).await?;
        if isolated.is_some() {
            datasets.hide_entries()?;
            provider::process::isolation::check_reachable(datasets.root())?;
        }
        let mut capacity = provider.capacity().await?;
        // A simulated cloud's capacity is its instances' (one per job); `cpu-millis` and
        // `memory-bytes` set it instead where the runner stands for one machine of it (a
        // provisioned sim instance), as they do for the other providers.
        if config.provider == ProviderKind::Sim {
            if config.cpu_millis > 0 {
                capacity.cpu_millis = config.cpu_millis;
            }
            if config.memory_bytes > 0 {
                capacity.memory_bytes = config.memory_bytes;
            }
        }
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
            store,
            nats,
            objects,
            provider,
            capacity,
            active: Arc::default(),
            gpus: Arc::new(Mutex::new(GpuPool::new(capacity.gpus))),
            sampler,
            agent_archive: Arc::default(),
            lease: Arc::default(),
            datasets,
            models_dir,
            metrics: Arc::new({
                let metrics = service_metrics::RunnerMetrics::new(&config.pool);
                metrics.nvml_load_failed.set(i64::from(gpu::nvml_failed()));
                metrics
            }),
            secrets_key,
            identity: identity.map(Arc::new),
            ecr: ecr::Ecr::new(&config.ecr, &config.imds.endpoint)?,
            cordoned: Arc::default(),
            instance_prices: Arc::default(),
            config: Arc::new(config),
        };
        Ok(Runner {
            ctx,
            listener,
            registry: Metrics::default(),
            sim,
            firewall,
            metadata,
        })
    }

    /// Registers the runner's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Runner {
        self.registry = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.ctx.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The provider this runner runs its instances on.
    pub fn provider_name(&self) -> &'static str {
        self.ctx.provider.name()
    }

    /// The simulated cloud's handle, on the `sim` provider (a test or a study takes its
    /// instances back through it).
    pub fn sim_cloud(&self) -> Option<provider::sim::SimCloud> {
        self.sim.clone()
    }

    /// A handle that pauses this runner's lease renewals (tests: a runner cut off from NATS).
    #[cfg(feature = "test-util")]
    pub fn lease_pause(&self) -> LeasePause {
        LeasePause(self.ctx.lease.clone())
    }

    /// Runs until `shutdown` is cancelled. Dropping the returned future aborts every job task
    /// (their processes are killed), as a crash would.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let mut ctx = self.ctx;
        ctx.metrics.register(&self.registry);
        ctx.metrics.providers(ctx.provider.name());
        ctx.store.count_transitions(&self.registry, "runner");
        let rpc_metrics = RpcMetricsLayer::new(&self.registry, "runner");
        // Held until the jobs have ended, so the leader does not take them while they stop.
        let lease = liveness::take_lease(&ctx).await?;
        let lease_stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(liveness::hold_lease(ctx.clone(), lease, lease_stop.clone()));
        reconcile(&ctx).await?;
        tasks.spawn(report_capacity(ctx.clone(), shutdown.clone()));
        tasks.spawn(watch_controls(ctx.clone(), shutdown.clone()));
        if let Some(notices) = ctx.provider.preemptions() {
            tasks.spawn(watch_preemptions(ctx.clone(), notices, shutdown.clone()));
        }
        if let Some(source) = self.metadata.clone() {
            tasks.spawn(metadata::spot::watch_notices(ctx.clone(), source, shutdown.clone()));
        }
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let health = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            .layer(kiln_core::auth::AuthLayer::new(std::sync::Arc::new(ctx.store.clone())))
            .add_service(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("runner").server())
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.listener, &ctx.config.grpc.tls)?,
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
        } else if let Some(firewall) = &self.firewall
            && let Err(error) = firewall.remove().await
        {
            // Every job has ended: nothing goes through it any more.
            tracing::warn!(chain = firewall.chain(), error = %error, "cannot remove the process jobs' chain");
        }
        lease_stop.cancel();
        while tasks.join_next().await.is_some() {}
        if let Err(error) = capacity::withdraw(&ctx.nats, &ctx.config.runner_id).await {
            tracing::warn!(error = %error, "cannot withdraw the capacity report");
        }
        Ok(())
    }
}

/// Builds the provider the configuration asks for, and the simulated cloud's handle on `sim`;
/// `auto` runs image jobs in containers when the engine answers, and the rest as processes.
async fn connect_provider(
    config: &Config,
    isolated: Option<&provider::process::Isolated>,
) -> Result<(
    Arc<dyn Provider>,
    Option<provider::sim::SimCloud>,
    Option<provider::firewall::UidFirewall>,
)> {
    let job_endpoints = job_endpoints(config);
    let firewall = match isolated {
        Some(_) if config.process.firewall => {
            let mut all = job_endpoints.to_vec();
            all.extend(config.docker.job_endpoints.iter().cloned());
            let endpoints = provider::firewall::resolve_endpoints(&all)
                .await
                .map_err(|error| match error {
                    Error::Firewall { message } => Error::ProcessFirewall { message },
                    error => error,
                })?;
            let firewall = provider::firewall::UidFirewall::install(
                &config.docker.iptables,
                &config.work_dir,
                &endpoints,
                &config.docker.job_blocked_ranges,
            )
            .await?;
            Some(firewall)
        }
        Some(_) => {
            tracing::warn!(
                "process.firewall = false: isolated process jobs reach every port of this host (NATS, databases, metrics) and the instance metadata address"
            );
            None
        }
        None => None,
    };
    let docker = || {
        DockerProvider::connect(
            config.docker.clone(),
            config.cpu_millis,
            config.memory_bytes,
            &job_endpoints,
            config.work_dir.join("disks"),
        )
    };
    let process = || {
        let capacity = Capacity {
            cpu_millis: config.offered_cpu_millis(),
            memory_bytes: config.offered_memory_bytes(),
            gpus: 0,
            disk_bytes: 0,
        };
        let users = match isolated {
            Some(isolated) => JobUsers::Isolated(isolated.clone()),
            None => JobUsers::Trusted(config.process.trusted_owner.clone()),
        };
        let provider = ProcessProvider::new(capacity, config.work_dir.clone(), users);
        match &firewall {
            Some(firewall) => provider.with_firewall(firewall.clone()),
            None => provider,
        }
    };
    if config.provider == ProviderKind::Sim {
        // Inference workers run for real on the simulated cloud's instances.
        let sim = provider::sim::SimProvider::new(config.sim.clone()).with_host(process());
        let cloud = sim.cloud();
        return Ok((Arc::new(sim), Some(cloud), firewall));
    }
    let provider: Arc<dyn Provider> = match config.provider {
        ProviderKind::Process | ProviderKind::Sim => Arc::new(process()),
        ProviderKind::Docker => Arc::new(docker().await?),
        // Containers for jobs with an image, processes for the others.
        // 20 s: an engine that answers also gets its jobs' network and firewall (tens of iptables calls).
        ProviderKind::Auto => match tokio::time::timeout(Duration::from_secs(20), docker()).await {
            Ok(Ok(docker)) => Arc::new(provider::auto::AutoProvider::new(docker, process())),
            // Fail closed: image jobs are refused rather than run unconfined.
            Ok(Err(error @ Error::Firewall { .. })) => {
                tracing::error!(
                    error = %error,
                    "cannot isolate job containers: jobs with an image are refused; fix the firewall (root or CAP_NET_ADMIN, the iptables program) or set docker.isolate-jobs = false"
                );
                Arc::new(process())
            }
            Ok(Err(error)) => {
                tracing::info!(host = %config.docker.host, error = %error, "no Docker engine; running jobs as local processes");
                Arc::new(process())
            }
            Err(_) => {
                tracing::info!(host = %config.docker.host, "the Docker engine did not answer; running jobs as local processes");
                Arc::new(process())
            }
        },
    };
    Ok((provider, None, firewall))
}

/// What jobs are given (`KILN_API`, `KILN_LOGS`): what their firewall lets them reach.
fn job_endpoints(config: &Config) -> [String; 2] {
    [config.api_url.clone(), config.logs_url.clone()]
}

/// Runs a runner until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says; with
/// `docker.firewall = "keeper"` only keeps the jobs' network and firewall in place.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    if config.docker.firewall == provider::docker::FirewallMode::Keeper {
        let docker = DockerProvider::engine(&config.docker).await?;
        return provider::docker::network::keep(&docker, &config.docker, &job_endpoints(&config), shutdown).await;
    }
    let metrics = Metrics::default();
    let runner = Runner::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, runner.nats(), &shutdown).await?;
    runner.serve(shutdown).await
}

fn nats_error(error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(error.to_string()))
}
