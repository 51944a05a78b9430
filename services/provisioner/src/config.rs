//! The provisioner's configuration: where it reads and writes, its timings, and the pools it
//! launches machines for (`[[pools]]`, docs/provisioner.md section 6).

use kiln_cloud::PoolSpec;
use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

use crate::cycle::Timings;

pub const DEFAULT_PORT: u16 = 7072;
pub const DEFAULT_METRICS_PORT: u16 = 9472;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Health endpoint.
    pub grpc: GrpcConfig,
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// This kiln's id: the `kiln-cluster` tag on every instance, and the reaper's scope.
    pub cluster: String,
    /// This provisioner's name in the leader lease; empty picks a random one.
    pub instance_name: String,
    pub lease_ttl_ms: u64,
    /// A cycle starts once the demand has not changed for this long...
    pub batch_idle_ms: u64,
    /// ...or this long after its first change, whichever is first (Karpenter's 1 s and 10 s).
    pub batch_max_ms: u64,
    /// Longest wait between cycles without a demand change (releases, boot timeouts).
    pub cycle_interval_ms: u64,
    /// How often the reaper lists the cloud.
    pub reap_interval_ms: u64,
    /// How old an unknown tagged instance must be before it is reaped.
    pub reap_grace_ms: u64,
    /// How long after an unanswered call the reconciler sends it once more.
    pub consistency_horizon_ms: u64,
    /// How long a cordoned idle instance waits (at least a scheduling pass) before release.
    pub cordon_settle_ms: u64,
    /// How long an offering that failed is not tried.
    pub unavailable_ttl_ms: u64,
    /// EC2's API endpoint; empty for AWS's own (`https://ec2.<region>.amazonaws.com`).
    pub ec2_endpoint: String,
    pub pools: Vec<PoolSpec>,
}

impl Default for Config {
    fn default() -> Self {
        let timings = Timings::default();
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            cluster: "kiln".into(),
            instance_name: String::new(),
            lease_ttl_ms: 10_000,
            batch_idle_ms: 1_000,
            batch_max_ms: 10_000,
            cycle_interval_ms: 5_000,
            reap_interval_ms: 30_000,
            reap_grace_ms: timings.reap_grace_ms as u64,
            consistency_horizon_ms: timings.horizon_ms as u64,
            cordon_settle_ms: timings.cordon_settle_ms as u64,
            unavailable_ttl_ms: timings.unavailable_ttl_ms as u64,
            ec2_endpoint: String::new(),
            pools: Vec::new(),
        }
    }
}

impl Config {
    pub fn timings(&self) -> Timings {
        Timings {
            horizon_ms: self.consistency_horizon_ms as i64,
            reap_grace_ms: self.reap_grace_ms as i64,
            cordon_settle_ms: self.cordon_settle_ms as i64,
            unavailable_ttl_ms: self.unavailable_ttl_ms as i64,
            ..Timings::default()
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.grpc.validate(&mut problems);
        self.nats.validate(&mut problems);
        self.metrics.validate(&mut problems);
        if self.cluster.is_empty()
            || self.cluster.len() > 63
            || !self
                .cluster
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            problems.push(format!(
                "cluster is {:?}; give 1 to 63 lowercase letters, digits and '-' (it is a tag on every instance)",
                self.cluster
            ));
        }
        if !(300..30_000).contains(&self.lease_ttl_ms) {
            problems.push(format!("lease-ttl-ms is {}; give 300 to 29999", self.lease_ttl_ms));
        }
        if self.batch_idle_ms == 0 || self.batch_max_ms < self.batch_idle_ms {
            problems.push("batch-idle-ms must be at least 1 and at most batch-max-ms".into());
        }
        if self.reap_grace_ms < self.consistency_horizon_ms {
            problems.push(
                "reap-grace-ms must be at least consistency-horizon-ms (an instance of an unanswered call is adopted, not reaped)".into(),
            );
        }
        let mut names = std::collections::HashSet::new();
        for pool in &self.pools {
            pool.validate(&mut problems);
            if !names.insert(pool.name.as_str()) {
                problems.push(format!("pools: {:?} is declared twice", pool.name));
            }
        }
        problems_to_result(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_terraform_config_parses_and_checks() {
        let text = r#"
instance-name = "kiln-provisioner-0"
cluster = "kiln"
[grpc]
listen = "0.0.0.0:7072"
[[pools]]
name = "gpu"
cloud = "ec2"
region = "eu-west-1"
subnets = ["subnet-0a","subnet-0b"]
requirements = { gpu-model = ["A10G","L4"], gpus = [1,1], memory-gib = [16,64.5], vcpu = [4,16] }
capacity-types = ["spot"]
launch-template = "kiln-runner-gpu"
max-instances = 8
disk = { max-job-gib = 500, root-gib = 200, root-device = "/dev/xvda" }
idle-timeout-secs = 600
boot-timeout-secs = 900
labels = { }
on-demand-prices = { }
"#;
        let config: Config = toml::from_str(text).expect("terraform's provisioner.toml parses");
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        assert_eq!(config.pools[0].capacity_types, [kiln_cloud::CapacityType::Spot]);
        assert_eq!(config.pools[0].job_disk_bytes(), 500 << 30);
    }

    #[test]
    fn bad_pools_are_refused_with_every_problem_named() {
        let text = r#"
cluster = "Kiln!"
[[pools]]
name = "cpu"
cloud = "azure"
[[pools]]
name = "cpu"
cloud = "sim"
zones = ["a"]
instance-types = ["sim.small"]
max-instances = 0
"#;
        let config: Config = toml::from_str(text).unwrap();
        let Err(ConfigError::Invalid(problems)) = config.validate() else {
            panic!("refused");
        };
        let text = problems.join("\n");
        for expected in [
            "cluster is \"Kiln!\"",
            "pools[cpu].cloud: \"azure\" is not a cloud kiln knows",
            "pools[cpu]: name instance-types or requirements",
            "pools[cpu].max-instances: must be at least 1",
            "pools: \"cpu\" is declared twice",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }
}
