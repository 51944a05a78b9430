//! Runner capacity reports, kept in the `kiln_capacity` KV bucket keyed by runner id. Only the
//! reports of runners holding a live lease ([`crate::runners`]) count, so a dead runner's
//! capacity stops counting within its lease TTL; the bucket's max age removes the report later.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::streams::{Nats, NatsError};
use crate::subjects::BUCKET_CAPACITY;

/// The smallest disk a job may ask for (`--disk`): a file system's own structures take a few
/// MiB.
pub const MIN_JOB_DISK_BYTES: u64 = 16 << 20;
/// The most GPUs one job (or one batch worker) may ask for.
pub const MAX_GPUS: u32 = 16;

/// What a runner offers jobs' disks out of `free` bytes under its disks' directory: 90%, a
/// margin for its own files.
pub fn disk_offered(free: u64) -> u64 {
    u64::try_from(u128::from(free) * 9 / 10).unwrap_or(u64::MAX)
}

/// The free space a runner needs to offer `wanted` (the inverse of [`disk_offered`], rounded
/// up): what a machine's volume is grown by for its jobs' disks.
pub fn disk_needed(wanted: u64) -> u64 {
    u64::try_from((u128::from(wanted) * 10).div_ceil(9)).unwrap_or(u64::MAX)
}

/// What is wrong with asking for a disk of its own and shared memory (`--disk`, `--shm`), the
/// same for jobs, sweeps' trials and batch workers; each caller words it with its own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskShmProblem {
    /// A disk under [`MIN_JOB_DISK_BYTES`].
    DiskTooSmall,
    /// A disk without an image: runners make one only for a container (the docker provider).
    DiskWithoutImage,
    /// More shared memory than memory, which /dev/shm counts against.
    ShmOverMemory,
}

/// Checks a request for a disk and shared memory (0: none asked).
pub fn check_disk_and_shm(
    disk_bytes: u64,
    shm_bytes: u64,
    memory_bytes: u64,
    image: &str,
) -> Result<(), DiskShmProblem> {
    if disk_bytes > 0 && disk_bytes < MIN_JOB_DISK_BYTES {
        return Err(DiskShmProblem::DiskTooSmall);
    }
    if disk_bytes > 0 && image.is_empty() {
        return Err(DiskShmProblem::DiskWithoutImage);
    }
    if shm_bytes > memory_bytes {
        return Err(DiskShmProblem::ShmOverMemory);
    }
    Ok(())
}

/// What one runner offers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityReport {
    pub runner_id: String,
    pub pool: String,
    pub provider: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    #[serde(default)]
    pub gpus: i64,
    /// Bytes of disk the runner gives jobs' own disks (`--disk`); 0 when it gives none.
    #[serde(default)]
    pub disk_bytes: i64,
    /// The address other machines reach this runner's jobs at (`advertise-host`): a gang's
    /// nodes meet at its rank 0's.
    #[serde(default)]
    pub address: String,
    pub updated_at_ms: i64,
    /// One instance: the largest job it can hold; all zero means the whole capacity is one.
    #[serde(default)]
    pub instance: Instance,
    /// Prices of one instance per hour; spot only when `spot` (the provider offers it).
    #[serde(default)]
    pub on_demand_per_hour: f64,
    #[serde(default)]
    pub spot_per_hour: f64,
    #[serde(default)]
    pub spot: bool,
    /// What the runner's machine is, when it reads its cloud's instance metadata (`[imds]`):
    /// its instance id, type and zone, its market (`spot` or `on-demand`) and what it costs per
    /// hour (unknown until told). `None` for a runner that is not on a cloud instance.
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub instance_type: Option<String>,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub market: Option<String>,
    #[serde(default)]
    pub price_per_hour: Option<f64>,
    /// The runner takes no new launch (its instance got a rebalance recommendation or an
    /// interruption notice): the scheduler counts no free room on it.
    #[serde(default)]
    pub cordoned: bool,
}

/// What a runner on a spot instance tells on [`crate::subjects::instance_notice`] when its
/// cloud warns it: a rebalance recommendation (`action = "rebalance"`) or an interruption
/// notice (`"terminate"`, `"stop"`, `"hibernate"`), so the provisioner marks the offering
/// interrupted and counts the displaced jobs as demand at once. JSON, as the capacity reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceNotice {
    pub runner_id: String,
    pub pool: String,
    pub instance_id: String,
    /// The offering: instance type and availability zone.
    pub instance_type: String,
    pub zone: String,
    pub action: String,
    /// When the cloud acts (the notice's `time`, or the recommendation's `noticeTime`), in ms
    /// since the epoch.
    pub at_ms: i64,
    /// The jobs the runner held when the notice came (each is stopped and queued again on an
    /// interruption).
    #[serde(default)]
    pub jobs: Vec<String>,
}

/// The resources of one instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    #[serde(default)]
    pub disk_bytes: i64,
}

/// Total capacity of a pool over its runners, the largest instance, and the highest prices any
/// of them reported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolCapacity {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    pub disk_bytes: i64,
    pub runners: usize,
    pub instance: Instance,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
    pub spot: bool,
}

/// Stores a runner's report.
pub async fn report(nats: &Nats, report: &CapacityReport) -> Result<(), NatsError> {
    let kv = nats
        .jetstream
        .get_key_value(BUCKET_CAPACITY)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    let value = serde_json::to_vec(report).map_err(|e| NatsError::Other(e.to_string()))?;
    kv.put(&report.runner_id, value.into())
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    Ok(())
}

/// Withdraws a runner's report (on shutdown).
pub async fn withdraw(nats: &Nats, runner_id: &str) -> Result<(), NatsError> {
    let kv = nats
        .jetstream
        .get_key_value(BUCKET_CAPACITY)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    kv.delete(runner_id)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    Ok(())
}

impl CapacityReport {
    /// The largest job the runner can hold: its instance, or its whole capacity when it is one.
    pub fn largest_job(&self) -> Instance {
        if self.instance == Instance::default() {
            Instance {
                cpu_millis: self.cpu_millis,
                memory_bytes: self.memory_bytes,
                gpus: self.gpus,
                disk_bytes: self.disk_bytes,
            }
        } else {
            self.instance
        }
    }
}

/// The reports of the runners whose lease is live, one per runner (not summed), by runner id.
/// The scheduler places each job on one of them.
pub async fn runners(nats: &Nats) -> Result<Vec<CapacityReport>, NatsError> {
    let live = crate::runners::live(nats).await?;
    let kv = nats
        .jetstream
        .get_key_value(BUCKET_CAPACITY)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    let mut keys = kv.keys().await.map_err(|e| NatsError::Other(e.to_string()))?;
    let mut reports = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| NatsError::Other(e.to_string()))?;
        let Some(value) = kv.get(&key).await.map_err(|e| NatsError::Other(e.to_string()))? else {
            continue;
        };
        let Ok(report) = serde_json::from_slice::<CapacityReport>(&value) else {
            tracing::warn!(key, "ignoring a malformed capacity report");
            continue;
        };
        if !live.contains(&report.runner_id) {
            tracing::debug!(runner_id = %report.runner_id, "ignoring the capacity of a runner without a live lease");
            continue;
        }
        reports.push(report);
    }
    reports.sort_by(|a, b| a.runner_id.cmp(&b.runner_id));
    Ok(reports)
}

/// Sums by pool the reports of the runners whose lease is live (for dashboards and a pool's
/// catalogue: its largest runner and prices; placement uses [`runners`]).
pub async fn pools(nats: &Nats) -> Result<BTreeMap<String, PoolCapacity>, NatsError> {
    Ok(sum_by_pool(&runners(nats).await?))
}

/// Sums `reports` by pool.
pub fn sum_by_pool(reports: &[CapacityReport]) -> BTreeMap<String, PoolCapacity> {
    let mut pools: BTreeMap<String, PoolCapacity> = BTreeMap::new();
    for report in reports {
        let pool = pools.entry(report.pool.clone()).or_default();
        pool.cpu_millis += report.cpu_millis;
        pool.memory_bytes += report.memory_bytes;
        pool.gpus += report.gpus;
        pool.disk_bytes += report.disk_bytes;
        pool.runners += 1;
        let instance = report.largest_job();
        pool.instance.cpu_millis = pool.instance.cpu_millis.max(instance.cpu_millis);
        pool.instance.memory_bytes = pool.instance.memory_bytes.max(instance.memory_bytes);
        pool.instance.gpus = pool.instance.gpus.max(instance.gpus);
        pool.instance.disk_bytes = pool.instance.disk_bytes.max(instance.disk_bytes);
        pool.on_demand_per_hour = pool.on_demand_per_hour.max(report.on_demand_per_hour);
        pool.spot_per_hour = pool.spot_per_hour.max(report.spot_per_hour);
        pool.spot |= report.spot;
    }
    pools
}
