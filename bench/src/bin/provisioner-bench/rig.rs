//! What every part of the benchmark drives: a real store (SQLite in a temp dir, or the
//! Postgres of `--database-url`), the simulated cloud behind a wrapper that times the calls,
//! the pool, the demand, and the process's CPU clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::stream::BoxStream;
use kiln_cloud::sim::{SimCalls, SimCatalogue, SimCloud, SimConfig};
use kiln_cloud::{
    Cloud, CloudError, CloudInstance, InstanceId, Interruption, LaunchIntent, Launched, Offering, PoolSpec, TagSelector,
};
use kiln_core::capacity::Instance;
use kiln_core::config::{DatabaseConfig, DatabaseUrl};
use kiln_core::provisioning::DemandJob;
use kiln_core::store::Store;
use kiln_core::store::cloud::instance_state;
use kiln_provisioner::cycle::{Cycle, Provisioner, Timings};
use kiln_provisioner::release::Seen;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeVal;

pub const GIB: i64 = 1 << 30;
pub const POOL: &str = "cpu";

/// The CPU time of the whole process so far (user + system, every thread): the provisioner,
/// the simulated cloud and, with SQLite, the store.
pub fn cpu_time() -> Duration {
    let micros = |tv: TimeVal| tv.tv_sec() * 1_000_000 + tv.tv_usec();
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => Duration::from_micros((micros(usage.user_time()) + micros(usage.system_time())).max(0) as u64),
        Err(_) => Duration::ZERO,
    }
}

/// The benchmark's pool: every CPU type of the sim's standard catalogue, its three zones, spot
/// and on-demand.
pub fn pool(max_instances: u32, idle_timeout_secs: u64) -> PoolSpec {
    PoolSpec {
        max_instances,
        idle_timeout_secs,
        ..SimCatalogue::standard().cpu_pool(POOL)
    }
}

pub fn job(id: String, cpus: i64, memory_gib: i64, market: &str) -> DemandJob {
    DemandJob {
        job_id: id,
        pool: String::new(),
        resources: Instance {
            cpu_millis: cpus * 1000,
            memory_bytes: memory_gib * GIB,
            gpus: 0,
            disk_bytes: 0,
        },
        nodes: 1,
        market: market.into(),
        chosen_market: String::new(),
        priority: 0,
        submitted_at_ms: 0,
    }
}

/// The simulated cloud, timing the calls the provisioner makes and noting the first create.
pub struct Recorder {
    pub sim: Arc<SimCloud>,
    in_calls: Mutex<Duration>,
    first_create: Mutex<Option<Instant>>,
}

impl Recorder {
    fn timed<T>(&self, started: Instant, out: T) -> T {
        *self.in_calls.lock().expect("recorder lock") += started.elapsed();
        out
    }

    /// Time spent inside cloud calls so far.
    pub fn in_calls(&self) -> Duration {
        *self.in_calls.lock().expect("recorder lock")
    }

    /// When the first create call since the last [`Recorder::take_first_create`] came in.
    pub fn take_first_create(&self) -> Option<Instant> {
        self.first_create.lock().expect("recorder lock").take()
    }

    pub fn calls(&self) -> SimCalls {
        self.sim.calls()
    }
}

#[async_trait::async_trait]
impl Cloud for Recorder {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn create(&self, intent: &LaunchIntent) -> Result<Launched, CloudError> {
        let started = Instant::now();
        self.first_create.lock().expect("recorder lock").get_or_insert(started);
        let out = self.sim.create(intent).await;
        self.timed(started, out)
    }

    async fn get(&self, id: &InstanceId) -> Result<Option<CloudInstance>, CloudError> {
        let started = Instant::now();
        let out = self.sim.get(id).await;
        self.timed(started, out)
    }

    async fn list(&self, selector: &TagSelector) -> Result<Vec<CloudInstance>, CloudError> {
        let started = Instant::now();
        let out = self.sim.list(selector).await;
        self.timed(started, out)
    }

    async fn terminate(&self, ids: &[InstanceId]) -> Result<(), CloudError> {
        let started = Instant::now();
        let out = self.sim.terminate(ids).await;
        self.timed(started, out)
    }

    async fn offerings(&self, pool: &PoolSpec) -> Result<Vec<Offering>, CloudError> {
        let started = Instant::now();
        let out = self.sim.offerings(pool).await;
        self.timed(started, out)
    }

    fn interruptions(&self) -> Option<BoxStream<'static, Interruption>> {
        self.sim.interruptions()
    }
}

/// What one timed cycle cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub wall: Duration,
    pub cpu: Duration,
    /// Wall time inside the (simulated) cloud's calls.
    pub cloud: Duration,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        self.wall += other.wall;
        self.cpu += other.cpu;
        self.cloud += other.cloud;
    }
}

/// A store, a simulated cloud and a provisioner leading on them.
pub struct Rig {
    _dir: Option<tempfile::TempDir>,
    pub store: Store,
    pub cloud: Arc<Recorder>,
    pub leader: Provisioner,
    pub cluster: String,
    pub pool: PoolSpec,
}

impl Rig {
    /// A fresh store (its own cluster id on a shared Postgres) and a fresh simulated cloud.
    pub async fn new(database_url: Option<&str>, pool: PoolSpec, catalogue: SimCatalogue) -> Result<Rig> {
        let (dir, url) = match database_url {
            Some(url) => (None, url.to_owned()),
            None => {
                let dir = tempfile::tempdir().context("a temp dir for the SQLite store")?;
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("kiln.db").display());
                (Some(dir), url)
            }
        };
        let config = DatabaseConfig {
            url: DatabaseUrl::new(url),
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.context("connecting to the store")?;
        store.migrate().await.context("migrating the store")?;
        let cloud = Arc::new(Recorder {
            sim: Arc::new(SimCloud::new(catalogue, SimConfig::default())),
            in_calls: Mutex::new(Duration::ZERO),
            first_create: Mutex::new(None),
        });
        let cluster = format!("bench-{}", kiln_core::ids::new_id());
        let as_cloud: Arc<dyn Cloud> = cloud.clone();
        let leader = Provisioner::new(
            cluster.clone(),
            vec![pool.clone()],
            HashMap::from([(pool.name.clone(), as_cloud)]),
            store.clone(),
            Timings::default(),
        );
        Ok(Rig {
            _dir: dir,
            store,
            cloud,
            leader,
            cluster,
            pool,
        })
    }

    /// One cycle, timed.
    pub async fn cycle(
        &mut self,
        demand: &kiln_core::provisioning::Demand,
        seen: &Seen,
        now_ms: i64,
    ) -> Result<(Cycle, Cost)> {
        let (cpu, cloud, wall) = (cpu_time(), self.cloud.in_calls(), Instant::now());
        let cycle = self.leader.cycle(demand, seen, now_ms).await?;
        let cost = Cost {
            wall: wall.elapsed(),
            cpu: cpu_time().saturating_sub(cpu),
            cloud: self.cloud.in_calls().saturating_sub(cloud),
        };
        Ok((cycle, cost))
    }

    /// One reaper round, timed.
    pub async fn reap(&mut self, now_ms: i64) -> Result<Cost> {
        let (cpu, cloud, wall) = (cpu_time(), self.cloud.in_calls(), Instant::now());
        self.leader.reap(now_ms).await?;
        Ok(Cost {
            wall: wall.elapsed(),
            cpu: cpu_time().saturating_sub(cpu),
            cloud: self.cloud.in_calls().saturating_sub(cloud),
        })
    }

    /// The cluster's live instance records.
    pub async fn live(&self) -> Result<Vec<kiln_core::store::InstanceRecord>> {
        Ok(self.store.instances(&self.cluster, &instance_state::LIVE).await?)
    }

    /// Every live instance with a runner on it, all of them busy (`busy`) or idle.
    pub async fn runners(&self, busy: bool) -> Result<Seen> {
        let mut seen = Seen::default();
        for record in self.live().await? {
            let runner = format!("r-{}", record.instance_id);
            if busy {
                seen.busy.insert(runner.clone());
            }
            seen.runner_on.insert(record.instance_id, runner);
        }
        Ok(seen)
    }
}

/// Calls per method between two readings, and their sum.
pub fn calls_between(before: SimCalls, after: SimCalls) -> SimCalls {
    SimCalls {
        create: after.create - before.create,
        get: after.get - before.get,
        list: after.list - before.list,
        terminate: after.terminate - before.terminate,
        offerings: after.offerings - before.offerings,
    }
}

pub fn total_calls(calls: SimCalls) -> u64 {
    calls.create + calls.get + calls.list + calls.terminate + calls.offerings
}
