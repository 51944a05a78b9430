//! What the scheduler and the provisioner tell each other (docs/provisioner.md section 5),
//! through two KV buckets, each written by one of them:
//!
//! - [`BUCKET_DEMAND`](crate::subjects::BUCKET_DEMAND), written by the scheduling leader after
//!   each pass: the jobs that passed quotas and fair share but fit no live runner's free room
//!   ([`Demand`]). The newest snapshot is the whole truth, so a lost or repeated update changes
//!   nothing. Quota-blocked jobs are never demand: a job that may not run rents no machine.
//! - [`BUCKET_PROVISIONER`](crate::subjects::BUCKET_PROVISIONER), written by the provisioning
//!   leader after each cycle, one key per pool ([`PoolStatus`]): its catalogue (the largest
//!   machine it can launch, prices), the machines on their way and for which jobs, and why
//!   offerings are unavailable. The scheduler reads it so an empty pool that scales from zero is
//!   still eligible, and `kiln explain` says what the provisioner is doing about a job.

use serde::{Deserialize, Serialize};

use crate::capacity::Instance;
use crate::streams::{Nats, NatsError};
use crate::subjects::{BUCKET_DEMAND, BUCKET_PROVISIONER, KEY_DEMAND};

/// One job that fits no live runner's free room.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemandJob {
    pub job_id: String,
    /// The pool the job asked for; empty for any.
    #[serde(default)]
    pub pool: String,
    /// One node's resources.
    pub resources: Instance,
    /// The machines the job still needs, each holding one node: 1 for a job of one node; for a
    /// gang, its nodes that live runners cannot hold now. Above 1 the provisioner launches them
    /// together: one call, one zone, the pool's placement group.
    #[serde(default = "one_node")]
    pub nodes: u32,
    /// `auto`, `spot` or `on-demand`.
    pub market: String,
    /// The market `auto` resolved to for this pass (`spot` or `on-demand`), from the learnt rate.
    #[serde(default)]
    pub chosen_market: String,
    pub priority: i32,
    pub submitted_at_ms: i64,
}

fn one_node() -> u32 {
    1
}

/// The scheduler's demand after one pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    pub at_ms: i64,
    pub jobs: Vec<DemandJob>,
}

/// An offering the provisioner will not try for a while, and why (for `kiln explain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnavailableOffering {
    /// `spot g5.xlarge in eu-west-1a`.
    pub offering: String,
    /// `no capacity`, `on-demand vCPU (standard family) quota reached`, ...
    pub reason: String,
    pub until_ms: i64,
}

/// What one offering of a pool costs: a runner on an instance of it reports this price, and
/// its jobs' costs are reckoned from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfferingPrice {
    pub instance_type: String,
    pub zone: String,
    /// `spot` or `on-demand`.
    pub capacity: String,
    pub price_per_hour: f64,
}

/// Machines on their way for a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launching {
    pub intent_id: String,
    /// `spot` or `on-demand`.
    pub capacity: String,
    pub instances: u32,
    pub jobs: Vec<String>,
}

/// The provisioner's view of one pool after its last cycle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub pool: String,
    pub at_ms: i64,
    /// The largest machine any offering of the pool has (zero when it has none available).
    pub largest: Instance,
    pub spot_offered: bool,
    /// The cheapest prices per hour of an offering of the pool, per market.
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
    /// Every offering's price (spot: the latest the cloud answered; on-demand: its table).
    #[serde(default)]
    pub prices: Vec<OfferingPrice>,
    pub live_instances: u32,
    pub max_instances: u32,
    pub launching: Vec<Launching>,
    pub unavailable: Vec<UnavailableOffering>,
    /// Jobs of the demand this pool could hold but will not launch for, and why
    /// ("pool gpu at max-instances (20)"), by job id.
    #[serde(default)]
    pub held_back: Vec<(String, String)>,
    /// A configuration or credentials problem that stops the pool, if any.
    #[serde(default)]
    pub stopped: String,
}

async fn bucket(nats: &Nats, name: &str) -> Result<async_nats::jetstream::kv::Store, NatsError> {
    nats.jetstream
        .get_key_value(name)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))
}

/// Writes the scheduler's demand (one key: the newest snapshot wins).
pub async fn publish_demand(nats: &Nats, demand: &Demand) -> Result<(), NatsError> {
    let value = serde_json::to_vec(demand).map_err(|e| NatsError::Other(e.to_string()))?;
    bucket(nats, BUCKET_DEMAND)
        .await?
        .put(KEY_DEMAND, value.into())
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    Ok(())
}

/// Reads the newest demand; none written yet reads as empty.
pub async fn demand(nats: &Nats) -> Result<Demand, NatsError> {
    let value = bucket(nats, BUCKET_DEMAND)
        .await?
        .get(KEY_DEMAND)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    match value {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| NatsError::Other(format!("malformed demand: {e}"))),
        None => Ok(Demand::default()),
    }
}

/// Writes one pool's status.
pub async fn publish_status(nats: &Nats, status: &PoolStatus) -> Result<(), NatsError> {
    let value = serde_json::to_vec(status).map_err(|e| NatsError::Other(e.to_string()))?;
    bucket(nats, BUCKET_PROVISIONER)
        .await?
        .put(&status.pool, value.into())
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    Ok(())
}

/// One pool's status, if the provisioner wrote one.
pub async fn status(nats: &Nats, pool: &str) -> Result<Option<PoolStatus>, NatsError> {
    let value = bucket(nats, BUCKET_PROVISIONER)
        .await?
        .get(pool)
        .await
        .map_err(|e| NatsError::Other(e.to_string()))?;
    Ok(value.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
}

/// Every pool's status, by pool name; malformed entries are skipped.
pub async fn statuses(nats: &Nats) -> Result<Vec<PoolStatus>, NatsError> {
    use futures::StreamExt;
    let kv = bucket(nats, BUCKET_PROVISIONER).await?;
    let mut keys = kv.keys().await.map_err(|e| NatsError::Other(e.to_string()))?;
    let mut statuses = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| NatsError::Other(e.to_string()))?;
        if let Some(value) = kv.get(&key).await.map_err(|e| NatsError::Other(e.to_string()))?
            && let Ok(status) = serde_json::from_slice::<PoolStatus>(&value)
        {
            statuses.push(status);
        }
    }
    statuses.sort_by(|a, b| a.pool.cmp(&b.pool));
    Ok(statuses)
}
