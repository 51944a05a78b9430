//! What a pool has on its way, and the status the cycle publishes for it: split from
//! [`crate::cycle`], whose `Provisioner` they read.

use std::collections::HashMap;

use kiln_cloud::{CapacityType, LaunchIntent, Offering, PoolSpec};
use kiln_core::capacity::Instance;
use kiln_core::provisioning::{Launching, OfferingPrice, PoolStatus};
use kiln_core::store::cloud::{instance_state, intent_state};

use crate::cycle::Provisioner;
use crate::error::Result;
use crate::plan::{Coming, Room};

impl Provisioner {
    /// Machines on their way for the pool, and how many instances count against its maximum.
    pub(crate) async fn coming(
        &self,
        pool: &PoolSpec,
        offerings: &[Offering],
        demand_at_ms: i64,
    ) -> Result<(Vec<Coming>, u32)> {
        let shape_of = |instance_type: &str, disk_bytes: i64| {
            offerings
                .iter()
                .find(|o| o.key.instance_type == instance_type)
                .map(|o| Room::of_shape(&o.shape, disk_bytes))
        };
        // What each intent's root volume gives its machines' jobs (read once per intent).
        let mut disk_of_intent: HashMap<String, i64> = HashMap::new();
        let mut coming = Vec::new();
        let records = self.store.instances(&self.cluster, &instance_state::LIVE).await?;
        let mut live = 0;
        for record in records.iter().filter(|r| r.pool == pool.name) {
            live += 1;
            // Booting, or registered after the demand was read (its room is not in it yet).
            let on_its_way = record.state == instance_state::BOOTING
                || (record.state == instance_state::REGISTERED && record.registered_at_ms >= demand_at_ms);
            if !on_its_way {
                continue;
            }
            let disk_bytes = match disk_of_intent.get(&record.intent_id) {
                Some(bytes) => *bytes,
                None => {
                    let bytes = self.intent_disk(pool, &record.intent_id).await?;
                    *disk_of_intent.entry(record.intent_id.clone()).or_insert(bytes)
                }
            };
            if let Some(room) = shape_of(&record.instance_type, disk_bytes) {
                coming.push(Coming {
                    capacity: if record.capacity == CapacityType::Spot.as_str() {
                        CapacityType::Spot
                    } else {
                        CapacityType::OnDemand
                    },
                    room,
                });
            }
        }
        for intent in self.store.intents(&self.cluster, &[intent_state::CALLING]).await? {
            if intent.pool != pool.name {
                continue;
            }
            let Ok(request) = serde_json::from_str::<LaunchIntent>(&intent.request) else {
                continue;
            };
            if let Some(first) = request.candidates.first() {
                for _ in 0..request.count {
                    coming.push(Coming {
                        capacity: request.capacity,
                        room: Room::of_shape(&first.shape, pool.job_disk_of(request.root_volume.as_ref())),
                    });
                }
                live += request.count;
            }
        }
        Ok((coming, live))
    }

    /// What the machines of a recorded intent offer jobs' disks (its root volume); nothing is
    /// read for a pool that sizes no volumes.
    async fn intent_disk(&self, pool: &PoolSpec, intent_id: &str) -> Result<i64> {
        if pool.disk.max_job_gib == 0 {
            return Ok(0);
        }
        let volume = self
            .store
            .intent(intent_id)
            .await?
            .and_then(|record| serde_json::from_str::<LaunchIntent>(&record.request).ok())
            .and_then(|request| request.root_volume);
        Ok(pool.job_disk_of(volume.as_ref()))
    }

    pub(crate) async fn status(
        &self,
        pool: &PoolSpec,
        offerings: &[Offering],
        held_back: Vec<(String, String)>,
        now_ms: i64,
    ) -> Result<PoolStatus> {
        let state = self.state.get(&pool.name);
        let mut status = PoolStatus {
            pool: pool.name.clone(),
            at_ms: now_ms,
            max_instances: pool.max_instances,
            held_back,
            ..PoolStatus::default()
        };
        for offering in offerings {
            status.prices.push(OfferingPrice {
                instance_type: offering.key.instance_type.clone(),
                zone: offering.key.zone.clone(),
                capacity: offering.key.capacity.as_str().into(),
                price_per_hour: offering.price_per_hour,
            });
            let shape = &offering.shape;
            status.largest = Instance {
                cpu_millis: status.largest.cpu_millis.max(shape.cpu_millis),
                memory_bytes: status.largest.memory_bytes.max(shape.memory_bytes),
                gpus: status.largest.gpus.max(shape.gpus),
                // Sized for its jobs up to the pool's most (0: `--disk` jobs are not its).
                disk_bytes: pool.job_disk_bytes(),
            };
            let cheapest = match offering.key.capacity {
                CapacityType::Spot => {
                    status.spot_offered = true;
                    &mut status.spot_per_hour
                }
                CapacityType::OnDemand => &mut status.on_demand_per_hour,
            };
            if *cheapest == 0.0 || offering.price_per_hour < *cheapest {
                *cheapest = offering.price_per_hour;
            }
        }
        let records = self.store.instances(&self.cluster, &instance_state::LIVE).await?;
        let mut by_intent: HashMap<String, u32> = HashMap::new();
        for record in records.iter().filter(|r| r.pool == pool.name) {
            status.live_instances += 1;
            if record.state == instance_state::BOOTING {
                *by_intent.entry(record.intent_id.clone()).or_default() += 1;
            }
        }
        // The intents still calling, and the launched ones with instances booting. A launched
        // intent stays `launched` after its instances are gone (the reaper adopts by it), so
        // reading every launched intent made each cycle slower with the cluster's whole history.
        let mut intents = self.store.intents(&self.cluster, &[intent_state::CALLING]).await?;
        for id in by_intent.keys() {
            if let Some(intent) = self.store.intent(id).await?
                && intent.state == intent_state::LAUNCHED
            {
                intents.push(intent);
            }
        }
        intents.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        for intent in intents {
            let booting = by_intent.get(&intent.id).copied().unwrap_or(0);
            if intent.pool != pool.name || (intent.state == intent_state::LAUNCHED && booting == 0) {
                continue;
            }
            status.launching.push(Launching {
                intent_id: intent.id.clone(),
                capacity: intent.capacity.clone(),
                instances: if intent.state == intent_state::CALLING {
                    intent.count as u32
                } else {
                    booting
                },
                jobs: serde_json::from_str(&intent.demand).unwrap_or_default(),
            });
        }
        if let Some(state) = state {
            status.unavailable = state.unavailable.listed(offerings, now_ms);
            status.stopped = state.stopped.clone();
        }
        Ok(status)
    }
}
