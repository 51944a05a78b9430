//! The cycle tests' rig: a pool of the simulated cloud, a real store (SQLite), and jobs.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use kiln_cloud::sim::{SimCatalogue, SimCloud, SimConfig};
use kiln_cloud::{CapacityType, Cloud, OfferingKey, PoolSpec};
use kiln_core::capacity::Instance;
use kiln_core::ids::now_ms;
use kiln_core::provisioning::{Demand, DemandJob};
use kiln_core::store::Store;
use kiln_core::store::cloud::instance_state;
use kiln_provisioner::cycle::{Provisioner, Timings};

pub const GIB: i64 = 1 << 30;
pub const CLUSTER: &str = "test";

pub fn pool() -> PoolSpec {
    SimCatalogue::standard().cpu_pool("cpu")
}

pub fn job(id: &str, cpus: i64, market: &str) -> DemandJob {
    DemandJob {
        job_id: id.into(),
        pool: String::new(),
        resources: Instance {
            cpu_millis: cpus * 1000,
            memory_bytes: cpus * GIB,
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

pub fn demand(jobs: Vec<DemandJob>) -> Demand {
    Demand { at_ms: now_ms(), jobs }
}

pub struct Rig {
    _dir: tempfile::TempDir,
    pub store: Store,
    pub sim: Arc<SimCloud>,
}

impl Rig {
    pub async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&kiln_core::testing::sqlite_config(dir.path()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let sim = Arc::new(SimCloud::new(SimCatalogue::standard(), SimConfig::default()));
        Rig { _dir: dir, store, sim }
    }

    /// A provisioner leading now: a new one stands for a leader change.
    pub fn leader(&self) -> Provisioner {
        self.leader_of(pool())
    }

    pub fn leader_of(&self, pool: PoolSpec) -> Provisioner {
        let cloud: Arc<dyn Cloud> = self.sim.clone();
        Provisioner::new(
            CLUSTER.into(),
            vec![pool],
            HashMap::from([("cpu".to_string(), cloud)]),
            self.store.clone(),
            Timings {
                horizon_ms: 60_000,
                reap_grace_ms: 120_000,
                cordon_settle_ms: 3_000,
                ..Timings::default()
            },
        )
    }

    pub async fn live(&self) -> Vec<kiln_core::store::InstanceRecord> {
        self.store.instances(CLUSTER, &instance_state::LIVE).await.unwrap()
    }
}

pub fn spot(instance_type: &str, zone: &str) -> OfferingKey {
    OfferingKey {
        instance_type: instance_type.into(),
        zone: zone.into(),
        capacity: CapacityType::Spot,
    }
}
