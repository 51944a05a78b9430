//! What the simulated cloud sells: instance types with their shapes and prices, in zones.

use serde::{Deserialize, Serialize};

use crate::Shape;

/// One simulated instance type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SimType {
    pub name: String,
    pub shape: Shape,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
}

/// The types × zones of the simulated cloud, less the pairs listed as not offered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SimCatalogue {
    pub types: Vec<SimType>,
    pub zones: Vec<String>,
    /// (type, zone) pairs the cloud does not offer (as `c5.large` is absent from us-east-1e).
    pub not_offered: Vec<(String, String)>,
}

impl Default for SimCatalogue {
    fn default() -> SimCatalogue {
        SimCatalogue::standard()
    }
}

impl SimCatalogue {
    /// The runner's simulated types (`c.large` … `g.xlarge`, its `[sim]` defaults) in three
    /// zones, `sim-a`, `sim-b` and `sim-c`.
    pub fn standard() -> SimCatalogue {
        let gib = 1i64 << 30;
        let cpu = |name: &str, vcpus: i64, memory_gib: i64, on_demand: f64, spot: f64| SimType {
            name: name.to_owned(),
            shape: Shape {
                cpu_millis: vcpus * 1000,
                memory_bytes: memory_gib * gib,
                gpus: 0,
                gpu_model: None,
                arch: "x86_64".to_owned(),
            },
            on_demand_per_hour: on_demand,
            spot_per_hour: spot,
        };
        let mut gpu = cpu("g.xlarge", 4, 16, 0.53, 0.21);
        gpu.shape.gpus = 1;
        gpu.shape.gpu_model = Some("T4".to_owned());
        SimCatalogue {
            types: vec![
                cpu("c.large", 2, 4, 0.085, 0.030),
                cpu("c.xlarge", 4, 8, 0.17, 0.06),
                cpu("m.2xlarge", 8, 32, 0.38, 0.13),
                gpu,
            ],
            zones: vec!["sim-a".to_owned(), "sim-b".to_owned(), "sim-c".to_owned()],
            not_offered: Vec::new(),
        }
    }

    /// A pool named `name` of this catalogue's CPU types (those without GPUs) in all its
    /// zones, spot and on-demand: at most 100 instances, idle 60 s, boot 600 s. Tests and
    /// benchmarks change the fields they are about.
    pub fn cpu_pool(&self, name: &str) -> crate::PoolSpec {
        crate::PoolSpec {
            name: name.to_owned(),
            cloud: "sim".to_owned(),
            region: String::new(),
            subnets: Vec::new(),
            zones: self.zones.clone(),
            instance_types: self
                .types
                .iter()
                .filter(|t| t.shape.gpus == 0)
                .map(|t| t.name.clone())
                .collect(),
            requirements: None,
            capacity_types: vec![crate::CapacityType::Spot, crate::CapacityType::OnDemand],
            launch_template: "kiln-runner-cpu".to_owned(),
            launch_template_version: None,
            max_instances: 100,
            idle_timeout_secs: 60,
            boot_timeout_secs: 600,
            labels: Default::default(),
            on_demand_prices: Default::default(),
            placement_group: None,
            disk: Default::default(),
        }
    }

    pub fn find(&self, instance_type: &str) -> Option<&SimType> {
        self.types.iter().find(|t| t.name == instance_type)
    }

    /// Whether the type exists and is sold in the zone.
    pub fn offers(&self, instance_type: &str, zone: &str) -> bool {
        self.find(instance_type).is_some()
            && self.zones.iter().any(|z| z == zone)
            && !self.not_offered.iter().any(|(t, z)| t == instance_type && z == zone)
    }
}
