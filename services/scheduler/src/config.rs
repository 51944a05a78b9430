//! The scheduler's configuration.

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

use crate::policy::Order;

pub const DEFAULT_PORT: u16 = 7073;

/// Default port of the scheduler's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9473;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Health endpoint.
    pub grpc: GrpcConfig,
    /// `/metrics`; the scheduler reports the JetStream consumer lag by default.
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// Longest wait between scheduling passes, in milliseconds; job events wake it sooner.
    pub pass_interval_ms: u64,
    /// This scheduler's name in the leader lease; empty picks a random one.
    pub instance_name: String,
    /// How long a leader's lease lasts without renewal: a standby takes over within it. Under
    /// 30 s (the lease bucket's max age).
    pub lease_ttl_ms: u64,
    /// Priority preemptions allowed per minute, across passes (a token bucket of this size).
    pub preemptions_per_minute: u32,
    /// Inside a project, once a user's job waits for capacity, the project's users with a larger
    /// share place jobs only after every other project's (they backfill what is left). On by
    /// default: it lets a project's share fall to its new user's turn instead of its GPU holders
    /// taking back every GPU that frees (see README, Scheduling).
    pub yield_within_project: bool,
    /// How a priority's users are ordered: `fair-share-ratio` (the default: one order of all
    /// users by held share over their demand-capped hierarchical DRF share; yielding does not
    /// apply) or `hierarchical` (the project with the smallest weighted share, then its user with
    /// the smallest). See README, Scheduling.
    pub order: Order,
    /// Let a job below its fair share preempt preemptible jobs of users above theirs (same or
    /// lower priority, never inverting the order of projects or of users). Off by default: in the
    /// study it costs work and does not raise fairness reliably.
    pub fair_share_preemption: bool,
    /// Fair-share preemptions allowed per minute, from a token bucket of their own (so they never
    /// spend the priority preemptions' bucket); at least 1 when `fair-share-preemption` is on.
    pub fair_share_preemptions_per_minute: u32,
    /// `auto` jobs run on-demand when a spot restart during their expected runtime is likelier.
    pub max_restart_probability: f64,
    /// `auto` jobs run on-demand after this many preemptions.
    pub max_spot_preemptions: u32,
    /// Half-life of the observed spot preemption rate of a pool, in hours.
    pub preemption_half_life_hours: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig {
                consumer_lag: true,
                ..MetricsConfig::local(DEFAULT_METRICS_PORT)
            },
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            pass_interval_ms: if cfg!(test) { 100 } else { 1_000 },
            instance_name: String::new(),
            lease_ttl_ms: 10_000,
            preemptions_per_minute: 6,
            yield_within_project: true,
            order: Order::FairShareRatio,
            fair_share_preemption: false,
            fair_share_preemptions_per_minute: 6,
            max_restart_probability: 0.5,
            max_spot_preemptions: 3,
            preemption_half_life_hours: 6.0,
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
        if self.pass_interval_ms == 0 {
            problems.push("pass-interval-ms must be at least 1".into());
        }
        if !(300..30_000).contains(&self.lease_ttl_ms) {
            problems.push(format!(
                "lease-ttl-ms is {}; give 300 to 29999 (the lease bucket forgets entries after 30 s)",
                self.lease_ttl_ms
            ));
        }
        if self.fair_share_preemption && self.fair_share_preemptions_per_minute == 0 {
            problems.push(
                "fair-share-preemptions-per-minute is 0 while fair-share-preemption is on; give at least 1".into(),
            );
        }
        if !(0.0..=1.0).contains(&self.max_restart_probability) {
            problems.push("max-restart-probability must be between 0 and 1".into());
        }
        if self.preemption_half_life_hours.is_nan() || self.preemption_half_life_hours <= 0.0 {
            problems.push("preemption-half-life-hours must be above 0".into());
        }
        problems_to_result(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_share_preemption_needs_a_bucket() {
        assert!(Config::default().validate().is_ok());
        let config = Config {
            fair_share_preemption: true,
            fair_share_preemptions_per_minute: 0,
            ..Config::default()
        };
        let Err(ConfigError::Invalid(problems)) = config.validate() else {
            panic!("a fair-share preemption without tokens is refused");
        };
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("fair-share-preemptions-per-minute"));
        // Off, a zero rate is harmless.
        let config = Config {
            fair_share_preemptions_per_minute: 0,
            ..Config::default()
        };
        assert!(config.validate().is_ok());
    }

    #[test]
    fn order_is_named_in_kebab_case_and_checked() {
        assert_eq!(Config::default().order, Order::FairShareRatio);
        let config: Config = serde_json::from_str(r#"{"order": "hierarchical"}"#).expect("a known order");
        assert_eq!(config.order, Order::Hierarchical);
        assert!(serde_json::from_str::<Config>(r#"{"order": "fifo"}"#).is_err());
    }
}
