//! The simulated cloud of one runner, `[sim]` of its config: the catalogue of instance types,
//! boot latencies, spot preemptions, the instance cap and the time scale.

use serde::{Deserialize, Serialize};

/// A kind of simulated machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct InstanceType {
    pub name: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    #[serde(default)]
    pub gpus: u32,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
}

/// The simulated cloud of one runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SimConfig {
    pub seed: u64,
    pub instance_types: Vec<InstanceType>,
    /// Buy spot instances (preemptible) rather than on-demand ones.
    pub spot: bool,
    /// Boot latency range, in simulated milliseconds.
    pub boot_min_ms: u64,
    pub boot_max_ms: u64,
    /// Spot preemptions per instance-hour (simulated).
    pub preemptions_per_hour: f64,
    /// Time between the notice and the preemption, simulated.
    pub notice_ms: u64,
    /// Instances alive at once, at most.
    pub max_instances: usize,
    /// Simulated time per wall-clock time.
    pub time_scale: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        let gib = 1i64 << 30;
        SimConfig {
            seed: 1,
            instance_types: vec![
                InstanceType {
                    name: "c.large".into(),
                    cpu_millis: 2000,
                    memory_bytes: 4 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.085,
                    spot_per_hour: 0.030,
                },
                InstanceType {
                    name: "c.xlarge".into(),
                    cpu_millis: 4000,
                    memory_bytes: 8 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.17,
                    spot_per_hour: 0.06,
                },
                InstanceType {
                    name: "m.2xlarge".into(),
                    cpu_millis: 8000,
                    memory_bytes: 32 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.38,
                    spot_per_hour: 0.13,
                },
                InstanceType {
                    name: "g.xlarge".into(),
                    cpu_millis: 4000,
                    memory_bytes: 16 * gib,
                    gpus: 1,
                    on_demand_per_hour: 0.53,
                    spot_per_hour: 0.21,
                },
            ],
            spot: true,
            boot_min_ms: 20_000,
            boot_max_ms: 90_000,
            preemptions_per_hour: 0.05,
            notice_ms: 120_000,
            max_instances: 1000,
            time_scale: 1.0,
        }
    }
}

impl SimConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        if self.instance_types.is_empty() {
            problems.push("sim.instance-types must name at least one type".into());
        }
        if self.boot_min_ms > self.boot_max_ms {
            problems.push("sim.boot-min-ms must not exceed sim.boot-max-ms".into());
        }
        if !(self.time_scale > 0.0 && self.time_scale.is_finite()) {
            problems.push("sim.time-scale must be a positive number".into());
        }
        if self.preemptions_per_hour < 0.0 {
            problems.push("sim.preemptions-per-hour must not be negative".into());
        }
        if self.max_instances == 0 {
            problems.push("sim.max-instances must be at least 1".into());
        }
    }
}
