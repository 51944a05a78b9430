//! One provisioning cycle over every pool (docs/provisioner.md section 7): settle what a crash
//! left, release what is idle or never booted, then plan the demand onto machines and launch
//! them, retrying an offering's failures on the next offerings in the same cycle.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_cloud::{Cloud, CloudError, IntentId, LaunchIntent, Offering, PoolSpec, TemplateRef, UNAVAILABLE_TTL};
use kiln_core::provisioning::{Demand, DemandJob, PoolStatus};
use kiln_core::store::Store;

use crate::error::{Error, Result, in_pool};
use crate::launch::{self, Outcome, Reconciled};
use crate::plan::{self, PoolInput, Room};
use crate::release::{self, Reaped, Released, Seen};
use crate::unavailable::UnavailableOfferings;

mod status;

/// How many times a cycle plans a pool again after launches came back short.
const ROUNDS: usize = 3;

/// Timings of the provisioner's decisions.
#[derive(Debug, Clone)]
pub struct Timings {
    /// How long after a call without an answer the reconciler sends it again.
    pub horizon_ms: i64,
    /// How old an unknown tagged instance must be before the reaper terminates it.
    pub reap_grace_ms: i64,
    /// How long a cordoned idle instance waits before it is terminated.
    pub cordon_settle_ms: i64,
    pub unavailable_ttl_ms: i64,
    /// How often a pool's offerings and prices are read again.
    pub offerings_refresh_ms: i64,
    /// How long a pool waits after the cloud throttled or failed a call.
    pub backoff_ms: i64,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            horizon_ms: 120_000,
            reap_grace_ms: 300_000,
            cordon_settle_ms: 3_000,
            unavailable_ttl_ms: UNAVAILABLE_TTL.as_millis() as i64,
            offerings_refresh_ms: 300_000,
            backoff_ms: 30_000,
        }
    }
}

#[derive(Default)]
struct PoolState {
    offerings: Vec<Offering>,
    offerings_at_ms: Option<i64>,
    unavailable: UnavailableOfferings,
    idle_since: HashMap<String, i64>,
    backoff_until_ms: i64,
    stopped: String,
}

/// What one cycle did.
#[derive(Debug, Default, Clone)]
pub struct Cycle {
    pub reconciled: Reconciled,
    pub released: Released,
    /// Create calls sent, and the instances they made.
    pub calls: usize,
    pub launched: usize,
    pub statuses: Vec<PoolStatus>,
}

/// The provisioner's state on its leader.
pub struct Provisioner {
    cluster: String,
    pools: Vec<PoolSpec>,
    clouds: HashMap<String, Arc<dyn Cloud>>,
    store: Store,
    timings: Timings,
    state: HashMap<String, PoolState>,
}

impl Provisioner {
    /// `clouds` maps each pool's name to the cloud it launches on.
    pub fn new(
        cluster: String,
        pools: Vec<PoolSpec>,
        clouds: HashMap<String, Arc<dyn Cloud>>,
        store: Store,
        timings: Timings,
    ) -> Provisioner {
        Provisioner {
            cluster,
            pools,
            clouds,
            store,
            timings,
            state: HashMap::new(),
        }
    }

    pub fn pools(&self) -> &[PoolSpec] {
        &self.pools
    }

    /// Marks an offering unavailable after a spot notice on it.
    pub fn interrupted(&mut self, pool: &str, key: kiln_cloud::OfferingKey, now_ms: i64) {
        let until = now_ms + self.timings.unavailable_ttl_ms;
        self.state.entry(pool.to_owned()).or_default().unavailable.mark_one(
            key,
            kiln_cloud::Unavailable::Interrupted,
            until,
        );
    }

    /// One cycle: reconcile, release, plan and launch, for every pool.
    pub async fn cycle(&mut self, demand: &Demand, seen: &Seen, now_ms: i64) -> Result<Cycle> {
        let mut cycle = Cycle::default();
        let clouds = self.clouds.clone();
        let boot_timeouts: HashMap<String, i64> = self
            .pools
            .iter()
            .map(|p| (p.name.clone(), p.boot_timeout_secs as i64 * 1000))
            .collect();
        cycle.reconciled = launch::reconcile(
            &self.store,
            &|pool| clouds.get(pool).cloned(),
            &self.cluster,
            &|pool| boot_timeouts.get(pool).copied().unwrap_or(600_000),
            self.timings.horizon_ms,
            now_ms,
        )
        .await?;
        let assigned = self.assign(demand).await;
        for pool in self.pools.clone() {
            let Some(cloud) = self.clouds.get(&pool.name).cloned() else {
                continue;
            };
            let state = self.state.entry(pool.name.clone()).or_default();
            let scope = release::Scope {
                store: &self.store,
                cloud: cloud.as_ref(),
                cluster: &self.cluster,
            };
            let released = release::release(
                &scope,
                &pool,
                seen,
                &mut state.idle_since,
                self.timings.cordon_settle_ms,
                now_ms,
            )
            .await;
            match released {
                Ok(released) => add_released(&mut cycle.released, &released),
                Err(error) => {
                    tracing::warn!(pool = %pool.name, error = %error, "releasing instances failed; retrying next cycle")
                }
            }
            let jobs: Vec<&DemandJob> = assigned.get(&pool.name).map(|j| j.iter().collect()).unwrap_or_default();
            let status = self
                .launch_pool(&pool, cloud.as_ref(), demand, jobs, now_ms, &mut cycle)
                .await?;
            cycle.statuses.push(status);
        }
        Ok(cycle)
    }

    /// Gives each job of the demand to the first pool (in config order) with an offering that
    /// holds it, among the pools it may use; jobs no pool of this provisioner holds are not its.
    async fn assign(&mut self, demand: &Demand) -> HashMap<String, Vec<DemandJob>> {
        let mut assigned: HashMap<String, Vec<DemandJob>> = HashMap::new();
        let names: Vec<String> = self.pools.iter().map(|p| p.name.clone()).collect();
        for name in names {
            // A pool whose offerings cannot be read takes no demand this cycle; it says why.
            let _ = self.offerings(&name).await;
        }
        for job in &demand.jobs {
            let asked = Room::of_job(&job.resources);
            let pool = self.pools.iter().find(|pool| {
                (job.pool.is_empty() || job.pool == pool.name)
                    && self.state.get(&pool.name).is_some_and(|state| {
                        state
                            .offerings
                            .iter()
                            .any(|o| asked.fits_in(Room::of_shape(&o.shape, pool.job_disk_bytes())))
                    })
            });
            if let Some(pool) = pool {
                assigned.entry(pool.name.clone()).or_default().push(job.clone());
            }
        }
        assigned
    }

    /// The pool's offerings, read again when stale.
    async fn offerings(&mut self, pool_name: &str) -> Result<Vec<Offering>> {
        let now = kiln_core::ids::now_ms();
        let refresh = self.timings.offerings_refresh_ms;
        let state = self.state.entry(pool_name.to_owned()).or_default();
        if state.offerings_at_ms.is_some_and(|at| now - at < refresh) {
            return Ok(state.offerings.clone());
        }
        let (Some(pool), Some(cloud)) = (
            self.pools.iter().find(|p| p.name == pool_name),
            self.clouds.get(pool_name),
        ) else {
            return Ok(Vec::new());
        };
        match cloud.offerings(pool).await {
            Ok(offerings) => {
                state.offerings = offerings;
                state.offerings_at_ms = Some(now);
                state.stopped.clear();
                Ok(state.offerings.clone())
            }
            Err(error) => {
                tracing::warn!(pool = pool_name, error = %error, "cannot read the pool's offerings");
                if !error.is_retryable() {
                    state.stopped = error.to_string();
                }
                Err(in_pool(pool_name)(error))
            }
        }
    }

    async fn launch_pool(
        &mut self,
        pool: &PoolSpec,
        cloud: &dyn Cloud,
        demand: &Demand,
        jobs: Vec<&DemandJob>,
        now_ms: i64,
        cycle: &mut Cycle,
    ) -> Result<PoolStatus> {
        let offerings = self.offerings(&pool.name).await.unwrap_or_default();
        let mut held_back = Vec::new();
        // Each round sees what the last one launched as machines on their way (booting
        // instances and unanswered intents), so only jobs left without one are planned again,
        // on the offerings that did not fail.
        for _round in 0..ROUNDS {
            let state = self.state.entry(pool.name.clone()).or_default();
            state.unavailable.expire(now_ms);
            if now_ms < state.backoff_until_ms {
                break;
            }
            let available = state.unavailable.available(&offerings, now_ms);
            let reasons = state.unavailable.summary(&offerings, now_ms);
            let (coming, live) = self.coming(pool, &offerings, demand.at_ms).await?;
            let input = PoolInput {
                pool: &pool.name,
                offerings: &available,
                unavailable_reasons: reasons,
                demand: jobs.clone(),
                coming,
                live_instances: live,
                max_instances: pool.max_instances,
                capacity_types: &pool.capacity_types,
                job_disk_bytes: pool.job_disk_bytes(),
            };
            let decided = plan::plan(&input);
            held_back = decided.held_back.clone();
            if decided.launch.is_empty() {
                break;
            }
            let mut short = false;
            let mut learnt = false;
            for machines in decided.launch {
                let intent = LaunchIntent {
                    id: IntentId::new(),
                    cluster: self.cluster.clone(),
                    pool: pool.name.clone(),
                    capacity: machines.capacity,
                    count: machines.count,
                    // A gang's machines: all or none, in one zone (its placement group's).
                    min_count: if machines.gang { machines.count } else { 1 },
                    single_zone: machines.gang,
                    placement_group: pool.placement_group.clone().filter(|_| machines.gang),
                    candidates: machines.candidates,
                    template: TemplateRef {
                        name: pool.launch_template.clone(),
                        version: pool.launch_template_version.clone(),
                    },
                    labels: pool.labels.clone(),
                    root_volume: pool.root_volume(machines.disk_bytes),
                };
                cycle.calls += 1;
                let boot_timeout_ms = pool.boot_timeout_secs as i64 * 1000;
                match launch::launch(&self.store, cloud, &intent, &machines.jobs, boot_timeout_ms, now_ms).await {
                    Ok(Outcome::Answered(answer)) => {
                        tracing::info!(pool = %pool.name, intent = %intent.id, capacity = %intent.capacity, asked = intent.count, got = answer.instances.len(), failures = answer.failures.len(), "launched");
                        let state = self.state.entry(pool.name.clone()).or_default();
                        state
                            .unavailable
                            .mark(&answer.failures, &offerings, now_ms, self.timings.unavailable_ttl_ms);
                        cycle.launched += answer.instances.len();
                        short |= (answer.instances.len() as u32) < intent.count;
                        learnt |= !answer.failures.is_empty();
                    }
                    Ok(Outcome::Ambiguous) => {}
                    Err(Error::Cloud { source, .. }) => {
                        self.backoff(pool, &source, now_ms);
                        break;
                    }
                    Err(error) => return Err(error),
                }
            }
            // Planning again helps only when the answer marked offerings unavailable.
            if !short || !learnt {
                break;
            }
        }
        self.status(pool, &offerings, held_back, now_ms).await
    }

    fn backoff(&mut self, pool: &PoolSpec, error: &CloudError, now_ms: i64) {
        let state = self.state.entry(pool.name.clone()).or_default();
        let wait = match error {
            CloudError::Throttled {
                retry_after: Some(after),
            } => after.as_millis() as i64,
            _ => self.timings.backoff_ms,
        };
        state.backoff_until_ms = now_ms + wait;
        if matches!(error, CloudError::Unauthorized(_) | CloudError::Invalid(_)) {
            state.stopped = error.to_string();
        }
        tracing::warn!(pool = %pool.name, error = %error, wait_ms = wait, "the cloud refused a launch; the pool waits");
    }

    /// One reaper round on every cloud the pools use.
    pub async fn reap(&self, now_ms: i64) -> Result<Reaped> {
        let mut total = Reaped::default();
        // One listing per cloud (pools of one region share their client), keyed by its address.
        let mut by_cloud: HashMap<usize, (Arc<dyn Cloud>, Vec<&PoolSpec>)> = HashMap::new();
        for pool in &self.pools {
            if let Some(cloud) = self.clouds.get(&pool.name) {
                let key = Arc::as_ptr(cloud) as *const () as usize;
                by_cloud
                    .entry(key)
                    .or_insert_with(|| (cloud.clone(), Vec::new()))
                    .1
                    .push(pool);
            }
        }
        for (cloud, pools) in by_cloud.into_values() {
            let reaped = release::reap(
                &self.store,
                &cloud,
                &self.cluster,
                &pools,
                self.timings.reap_grace_ms,
                self.timings.horizon_ms,
                now_ms,
            )
            .await?;
            total.adopted += reaped.adopted;
            total.reaped += reaped.reaped;
            total.gone += reaped.gone;
        }
        Ok(total)
    }
}

fn add_released(total: &mut Released, more: &Released) {
    total.registered += more.registered;
    total.cordoned += more.cordoned;
    total.uncordoned += more.uncordoned;
    total.terminated += more.terminated;
    total.terminated_idle += more.terminated_idle;
    total.boot_timeouts += more.boot_timeouts;
    total.lapsed += more.lapsed;
    total.interrupted += more.interrupted;
}
