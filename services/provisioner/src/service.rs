//! The provisioner as a service: one leader by lease in `kiln_leases`, hot standbys. The leader
//! runs a cycle when the scheduler's demand changed and then held still for `batch-idle-ms`
//! (or `batch-max-ms` after its first change), and at least every `cycle-interval-ms` for the
//! releases; the reaper every `reap-interval-ms`. Each cycle's pool statuses go to
//! `kiln_provisioner` for the scheduler and `kiln explain`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kiln_cloud::{CapacityType, Cloud, OfferingKey};
use kiln_core::capacity::InstanceNotice;
use kiln_core::lease::Lease;
use kiln_core::provisioning::{self, Demand};
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_core::{capacity, ids::now_ms, subjects};
use tokio_util::sync::CancellationToken;

use std::net::SocketAddr;

use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::cycle::Provisioner;
use crate::error::{Error, Result};
use crate::release::Seen;
use crate::service_metrics::ProvisionerMetrics;

/// How long a non-api service waits for `api` to apply the migrations.
const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// The provisioner, connected and listening, not yet running.
pub struct ProvisionerService {
    config: Config,
    clouds: HashMap<String, Arc<dyn Cloud>>,
    store: Store,
    nats: Nats,
    listener: TcpListener,
    metrics: Metrics,
}

impl ProvisionerService {
    /// Connects with the clouds its pools name ([`crate::clouds`]).
    pub async fn bind(config: Config) -> Result<ProvisionerService> {
        let clouds = crate::clouds(&config)?;
        ProvisionerService::bind_with_clouds(config, clouds).await
    }

    /// Connects with `clouds` (pool name → its cloud): a test's, or `kiln up`'s.
    pub async fn bind_with_clouds(
        config: Config,
        clouds: HashMap<String, Arc<dyn Cloud>>,
    ) -> Result<ProvisionerService> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Provisioner).await?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        Ok(ProvisionerService {
            config,
            clouds,
            store,
            nats,
            listener,
            metrics: Metrics::default(),
        })
    }

    /// Registers the provisioner's metrics in `metrics` (the process's registry).
    pub fn with_metrics(mut self, metrics: &Metrics) -> ProvisionerService {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves gRPC health and leads or stands by until `shutdown`.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let metrics = ProvisionerMetrics::register(&self.metrics);
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let health = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(RpcMetricsLayer::new(&self.metrics, "provisioner"))
                .layer(kiln_core::auth::AuthLayer::new(Arc::new(self.store.clone())))
                .add_service(health_service)
                .add_service(kiln_core::whoami::NodeApi::new("provisioner").server())
                .serve_with_incoming_shutdown(
                    kiln_core::tls::incoming(self.listener, &self.config.grpc.tls)?,
                    shutdown.clone().cancelled_owned(),
                ),
        );
        let led = lead(self.config, self.clouds, self.store, self.nats, metrics, shutdown).await;
        health
            .await
            .map_err(|e| Error::Nats(kiln_core::streams::NatsError::Other(e.to_string())))??;
        led
    }
}

/// Takes the lease and, while it holds it, provisions, until `shutdown`.
async fn lead(
    config: Config,
    clouds: HashMap<String, Arc<dyn Cloud>>,
    store: Store,
    nats: Nats,
    metrics: ProvisionerMetrics,
    shutdown: CancellationToken,
) -> Result<()> {
    let name = if config.instance_name.is_empty() {
        format!("provisioner-{}", kiln_core::ids::new_id())
    } else {
        config.instance_name.clone()
    };
    let ttl = Duration::from_millis(config.lease_ttl_ms);
    let mut lease = Lease::new(&nats, subjects::LEASE_PROVISIONER, &name, ttl).await?;
    let mut notices = nats
        .client
        .subscribe(subjects::INSTANCE_NOTICE_ALL)
        .await
        .map_err(|e| kiln_core::streams::NatsError::Other(e.to_string()))?;
    let mut provisioner: Option<Provisioner> = None;
    // Instances with an interruption notice, and when it came (kept an hour).
    let mut interrupted_at: HashMap<String, i64> = HashMap::new();
    let mut last_demand: Option<Demand> = None;
    let mut changed_at: Option<tokio::time::Instant> = None;
    let mut first_change_at: Option<tokio::time::Instant> = None;
    let mut last_cycle = tokio::time::Instant::now() - Duration::from_secs(3600);
    let mut last_reap = last_cycle;
    let tick = Duration::from_millis(config.batch_idle_ms.min(250));
    tracing::info!(name, pools = config.pools.len(), cluster = %config.cluster, "provisioner running; waiting for the lease");
    while !shutdown.is_cancelled() {
        if let Err(error) = lease.tick().await {
            tracing::warn!(error = %error, "cannot reach the lease; not provisioning");
        }
        if lease.is_held() != provisioner.is_some() {
            metrics.leading(lease.is_held());
        }
        if !lease.is_held() {
            provisioner = None;
        } else {
            let leader = provisioner.get_or_insert_with(|| {
                tracing::info!(name, "leading: reconciling intents and instances");
                Provisioner::new(
                    config.cluster.clone(),
                    config.pools.clone(),
                    clouds.clone(),
                    store.clone(),
                    config.timings(),
                )
            });
            let demand = provisioning::demand(&nats).await.unwrap_or_default();
            let now = tokio::time::Instant::now();
            if last_demand.as_ref().map(|d| &d.jobs) != Some(&demand.jobs) {
                changed_at = Some(now);
                first_change_at.get_or_insert(now);
            }
            last_demand = Some(demand.clone());
            let settled = changed_at.is_some_and(|at| now - at >= Duration::from_millis(config.batch_idle_ms))
                || first_change_at.is_some_and(|at| now - at >= Duration::from_millis(config.batch_max_ms));
            let due = now - last_cycle >= Duration::from_millis(config.cycle_interval_ms);
            if settled || due {
                changed_at = None;
                first_change_at = None;
                last_cycle = now;
                interrupted_at.retain(|_, at| now_ms() - *at < 3_600_000);
                match seen(&nats, &store).await {
                    Ok(mut seen) => {
                        seen.interrupted = interrupted_at.keys().cloned().collect();
                        let started = std::time::Instant::now();
                        match leader.cycle(&demand, &seen, now_ms()).await {
                            Ok(cycle) => {
                                metrics.cycled(&cycle, started.elapsed().as_secs_f64());
                                for status in &cycle.statuses {
                                    if let Err(error) = provisioning::publish_status(&nats, status).await {
                                        tracing::warn!(error = %error, "cannot publish a pool's status");
                                    }
                                }
                            }
                            Err(error) => tracing::warn!(error = %error, "provisioning cycle failed; retrying"),
                        }
                    }
                    Err(error) => tracing::warn!(error = %error, "cannot read the runners; no cycle"),
                }
            }
            if now - last_reap >= Duration::from_millis(config.reap_interval_ms) {
                last_reap = now;
                let reaped = leader.reap(now_ms()).await;
                if let Ok(reaped) = &reaped {
                    metrics.reaped(reaped);
                }
                match reaped {
                    Ok(reaped) if reaped.reaped + reaped.adopted + reaped.gone > 0 => {
                        tracing::info!(?reaped, "reaper round")
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(error = %error, "reaper round failed"),
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(tick) => {}
            notice = notices.next() => {
                if let (Some(notice), Some(leader)) = (notice, provisioner.as_mut()) {
                    if let Some(instance) = interrupted(leader, &notice.payload) {
                        interrupted_at.insert(instance, now_ms());
                    }
                    // Its jobs come back as demand: plan for them without waiting a window.
                    first_change_at = Some(tokio::time::Instant::now() - Duration::from_millis(config.batch_max_ms));
                }
            }
        }
    }
    if let Err(error) = lease.release().await {
        tracing::warn!(error = %error, "cannot give the lease up; it expires on its own");
    }
    Ok(())
}

/// A spot notice marks its offering unavailable for a while (a rebalance recommendation too: the
/// cloud says capacity there is at risk). Returns the instance an interruption notice dooms.
fn interrupted(leader: &mut Provisioner, payload: &[u8]) -> Option<String> {
    let Ok(notice) = serde_json::from_slice::<InstanceNotice>(payload) else {
        tracing::warn!("ignoring a malformed instance notice");
        return None;
    };
    let doomed = (notice.action != "rebalance").then(|| notice.instance_id.clone());
    tracing::info!(pool = %notice.pool, instance = %notice.instance_id, action = %notice.action, instance_type = %notice.instance_type, zone = %notice.zone, "spot notice; the offering is unavailable for a while");
    let key = OfferingKey {
        instance_type: notice.instance_type,
        zone: notice.zone,
        capacity: CapacityType::Spot,
    };
    leader.interrupted(&notice.pool, key, now_ms());
    doomed
}

/// The runners with a live lease, by the instance they report, and the runners with jobs.
async fn seen(nats: &Nats, store: &Store) -> Result<Seen> {
    let reports = capacity::runners(nats).await?;
    let runner_on = reports
        .into_iter()
        .filter_map(|report| Some((report.instance_id?, report.runner_id)))
        .collect();
    let busy: HashSet<String> = store.busy_runners().await?.into_iter().collect();
    Ok(Seen {
        runner_on,
        busy,
        interrupted: HashSet::new(),
    })
}
