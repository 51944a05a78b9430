//! Spot or on-demand: the market choice of `auto`, and the preemption rate it rests on.

use serde::{Deserialize, Serialize};

use super::model::{Market, MarketPolicy, Pool, Settings};

/// The runtime assumed for a job whose user gave none (0, negative or not a number): one hour.
pub const DEFAULT_RUNTIME_SECS: f64 = 3600.0;

const MS_PER_HOUR: f64 = 3_600_000.0;

/// The chance that a spot instance is taken back within `runtime_secs`, when preemptions come
/// as a Poisson process at `rate_per_hour`: `1 - exp(-rate × hours)`. An unknown runtime counts
/// as [`DEFAULT_RUNTIME_SECS`].
pub fn restart_probability(rate_per_hour: f64, runtime_secs: f64) -> f64 {
    let runtime_secs = if runtime_secs > 0.0 && runtime_secs.is_finite() {
        runtime_secs
    } else {
        DEFAULT_RUNTIME_SECS
    };
    1.0 - (-rate_per_hour.max(0.0) * runtime_secs / 3600.0).exp()
}

/// Picks the market of a job on `pool`, or `None` when the pool cannot serve its policy (spot
/// asked, and the pool offers none).
///
/// `Spot` and `OnDemand` are honoured. `Auto` runs on-demand when the pool offers no spot, when
/// the job was already preempted `max_spot_preemptions` (K) times, or when
/// [`restart_probability`] of the pool's observed rate over the expected runtime exceeds
/// `max_restart_probability`; it runs on spot otherwise. An unknown runtime (0) counts as
/// [`DEFAULT_RUNTIME_SECS`].
pub fn choose_market(
    policy: MarketPolicy,
    pool: &Pool,
    preemptions: u32,
    expected_runtime_secs: f64,
    settings: &Settings,
) -> Option<Market> {
    match policy {
        MarketPolicy::OnDemand => Some(Market::OnDemand),
        MarketPolicy::Spot => pool.spot_available.then_some(Market::Spot),
        MarketPolicy::Auto => {
            let too_risky = preemptions >= settings.max_spot_preemptions
                || restart_probability(pool.preemptions_per_hour, expected_runtime_secs)
                    > settings.max_restart_probability;
            if pool.spot_available && !too_risky {
                Some(Market::Spot)
            } else {
                Some(Market::OnDemand)
            }
        }
    }
}

/// A pool's spot preemption rate: preemptions over instance-hours of spot exposure, both decayed
/// exponentially with a half-life so old storms fade, plus a prior that keeps the estimate
/// sensible before there is data (and after the data has decayed away).
///
/// `rate = (decayed preemptions + prior rate × prior hours) / (decayed exposure + prior hours)`.
/// Times are milliseconds since the epoch; a time before the last observation decays nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptionRate {
    half_life_hours: f64,
    prior_rate_per_hour: f64,
    prior_hours: f64,
    /// Decayed counts as of `as_of_ms`.
    preemptions: f64,
    exposure_hours: f64,
    as_of_ms: i64,
}

impl PreemptionRate {
    pub const DEFAULT_HALF_LIFE_HOURS: f64 = 6.0;
    /// The prior: 0.05 preemptions per instance-hour (the `sim` provider's default), worth ten
    /// instance-hours of observation.
    pub const DEFAULT_PRIOR_RATE_PER_HOUR: f64 = 0.05;
    pub const DEFAULT_PRIOR_HOURS: f64 = 10.0;

    pub fn new(half_life_hours: f64, prior_rate_per_hour: f64, prior_hours: f64) -> PreemptionRate {
        PreemptionRate {
            half_life_hours: half_life_hours.max(f64::MIN_POSITIVE),
            prior_rate_per_hour: prior_rate_per_hour.max(0.0),
            prior_hours: prior_hours.max(0.0),
            preemptions: 0.0,
            exposure_hours: 0.0,
            as_of_ms: i64::MIN,
        }
    }

    /// Decays with `half_life_hours` from now on (what was decayed so far stays).
    pub fn set_half_life(&mut self, half_life_hours: f64) {
        self.half_life_hours = half_life_hours.max(f64::MIN_POSITIVE);
    }

    /// Counts one spot preemption at `now_ms`.
    pub fn observe_preemption(&mut self, now_ms: i64) {
        self.decay_to(now_ms);
        self.preemptions += 1.0;
    }

    /// Counts `instance_hours` of spot exposure (instances alive on spot) at `now_ms`.
    pub fn observe_exposure(&mut self, instance_hours: f64, now_ms: i64) {
        self.decay_to(now_ms);
        self.exposure_hours += instance_hours.max(0.0);
    }

    /// The estimated preemptions per instance-hour at `now_ms`.
    pub fn rate_per_hour(&self, now_ms: i64) -> f64 {
        let decay = self.decay_factor(now_ms);
        let preemptions = self.preemptions * decay + self.prior_rate_per_hour * self.prior_hours;
        let exposure = self.exposure_hours * decay + self.prior_hours;
        if exposure > 0.0 { preemptions / exposure } else { 0.0 }
    }

    fn decay_factor(&self, now_ms: i64) -> f64 {
        if self.as_of_ms == i64::MIN || now_ms <= self.as_of_ms {
            return 1.0;
        }
        let elapsed_hours = (now_ms - self.as_of_ms) as f64 / MS_PER_HOUR;
        0.5f64.powf(elapsed_hours / self.half_life_hours)
    }

    fn decay_to(&mut self, now_ms: i64) {
        let decay = self.decay_factor(now_ms);
        self.preemptions *= decay;
        self.exposure_hours *= decay;
        self.as_of_ms = self.as_of_ms.max(now_ms);
    }
}

impl Default for PreemptionRate {
    fn default() -> Self {
        PreemptionRate::new(
            Self::DEFAULT_HALF_LIFE_HOURS,
            Self::DEFAULT_PRIOR_RATE_PER_HOUR,
            Self::DEFAULT_PRIOR_HOURS,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Resources;

    const HOUR_MS: i64 = 3_600_000;

    fn pool(spot_available: bool, preemptions_per_hour: f64) -> Pool {
        Pool {
            name: "p".into(),
            capacity: Resources::new(4000, 1 << 33, 0),
            instance: Resources::new(4000, 1 << 33, 0),
            on_demand_per_hour: 0.17,
            spot_per_hour: 0.06,
            spot_available,
            preemptions_per_hour,
        }
    }

    #[test]
    fn explicit_policies_are_honoured() {
        let settings = Settings::default();
        let risky = pool(true, 10.0);
        assert_eq!(
            choose_market(MarketPolicy::Spot, &risky, 9, 1e6, &settings),
            Some(Market::Spot)
        );
        assert_eq!(
            choose_market(MarketPolicy::OnDemand, &pool(true, 0.0), 0, 60.0, &settings),
            Some(Market::OnDemand)
        );
        assert_eq!(
            choose_market(MarketPolicy::Spot, &pool(false, 0.0), 0, 60.0, &settings),
            None
        );
        assert_eq!(
            choose_market(MarketPolicy::Auto, &pool(false, 0.0), 0, 60.0, &settings),
            Some(Market::OnDemand)
        );
    }

    #[test]
    fn auto_weighs_restart_probability_against_runtime() {
        let settings = Settings::default();
        let calm = pool(true, 0.05);
        // 1 - e^(-0.05 × 10) = 0.39 <= 0.5: spot. 1 - e^(-0.05 × 20) = 0.63 > 0.5: on-demand.
        assert_eq!(
            choose_market(MarketPolicy::Auto, &calm, 0, 10.0 * 3600.0, &settings),
            Some(Market::Spot)
        );
        assert_eq!(
            choose_market(MarketPolicy::Auto, &calm, 0, 20.0 * 3600.0, &settings),
            Some(Market::OnDemand)
        );
        // Unknown runtime counts as one hour: 1 - e^(-0.5) = 0.39 vs 1 - e^(-1) = 0.63.
        assert_eq!(
            choose_market(MarketPolicy::Auto, &pool(true, 0.5), 0, 0.0, &settings),
            Some(Market::Spot)
        );
        assert_eq!(
            choose_market(MarketPolicy::Auto, &pool(true, 1.0), 0, 0.0, &settings),
            Some(Market::OnDemand)
        );
        assert!((restart_probability(1.0, 0.0) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
    }

    #[test]
    fn auto_goes_on_demand_after_k_preemptions() {
        let settings = Settings::default();
        let calm = pool(true, 0.0);
        assert_eq!(
            choose_market(MarketPolicy::Auto, &calm, 2, 60.0, &settings),
            Some(Market::Spot)
        );
        assert_eq!(
            choose_market(MarketPolicy::Auto, &calm, 3, 60.0, &settings),
            Some(Market::OnDemand)
        );
    }

    #[test]
    fn preemption_rate_starts_at_the_prior_and_learns() {
        let mut rate = PreemptionRate::new(6.0, 0.05, 10.0);
        assert!((rate.rate_per_hour(0) - 0.05).abs() < 1e-12);
        rate.observe_exposure(90.0, 0);
        for _ in 0..20 {
            rate.observe_preemption(0);
        }
        // (20 + 0.5) / (90 + 10)
        assert!((rate.rate_per_hour(0) - 0.205).abs() < 1e-12);
    }

    #[test]
    fn preemption_rate_decays_with_its_half_life() {
        let mut rate = PreemptionRate::new(6.0, 0.0, 1.0);
        rate.observe_exposure(9.0, 0);
        for _ in 0..10 {
            rate.observe_preemption(0);
        }
        assert!((rate.rate_per_hour(0) - 1.0).abs() < 1e-12);
        // One half-life later the data weighs half: 5 / (4.5 + 1).
        assert!((rate.rate_per_hour(6 * HOUR_MS) - 5.0 / 5.5).abs() < 1e-12);
        // Two: 2.5 / (2.25 + 1); and far later only the prior (0) is left.
        assert!((rate.rate_per_hour(12 * HOUR_MS) - 2.5 / 3.25).abs() < 1e-12);
        assert!(rate.rate_per_hour(600 * HOUR_MS) < 1e-12);
        // New calm exposure after a half-life dilutes the decayed storm: 5 / (4.5 + 10 + 1).
        rate.observe_exposure(10.0, 6 * HOUR_MS);
        assert!((rate.rate_per_hour(6 * HOUR_MS) - 5.0 / 15.5).abs() < 1e-12);
        // A clock going backwards decays nothing.
        assert!((rate.rate_per_hour(HOUR_MS) - 5.0 / 15.5).abs() < 1e-12);
    }
}
