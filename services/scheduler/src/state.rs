//! What the leader remembers between passes ([`PassState`]), and the part a new leader takes
//! over ([`SavedRates`]): the pools' spot preemption rates, kept in the `kiln_scheduler` bucket
//! so a failover or a restart does not forget what the pools taught.

use std::collections::{HashMap, HashSet};

use async_nats::jetstream::kv;
use kiln_core::ids::now_ms;
use kiln_core::streams::{Nats, NatsError};
use kiln_core::subjects::{BUCKET_SCHEDULER, KEY_PREEMPTION_RATES};

use crate::config::Config;
use crate::policy;

/// How often the leader saves the rates when no preemption made them change (exposure only).
const SAVE_EVERY_MS: i64 = 10_000;

/// What the leader remembers between passes: the pools' spot preemption rates and the token
/// buckets that rate-limit priority and fair-share preemptions.
#[derive(Debug)]
pub struct PassState {
    rates: HashMap<String, policy::PreemptionRate>,
    half_life_hours: f64,
    /// Spot instance-hours are counted from the running spot jobs between passes.
    last_exposure_ms: Option<i64>,
    /// When the rates were last saved, and whether a preemption changed them since.
    saved_ms: i64,
    preempted_since_save: bool,
    tokens: f64,
    tokens_per_minute: f64,
    /// Fair-share preemptions have a bucket of their own, refilled at the same time.
    fair_share_tokens: f64,
    fair_share_tokens_per_minute: f64,
    last_refill_ms: i64,
    /// Victims of priority preemptions ordered and not yet gone: they count as stopping, so no
    /// pass orders more victims for the same job.
    preempting: HashSet<String>,
}

impl PassState {
    pub fn new(config: &Config) -> PassState {
        PassState {
            rates: HashMap::new(),
            half_life_hours: config.preemption_half_life_hours,
            last_exposure_ms: None,
            saved_ms: i64::MIN,
            preempted_since_save: false,
            tokens: f64::from(config.preemptions_per_minute),
            tokens_per_minute: f64::from(config.preemptions_per_minute),
            fair_share_tokens: f64::from(config.fair_share_preemptions_per_minute),
            fair_share_tokens_per_minute: f64::from(config.fair_share_preemptions_per_minute),
            last_refill_ms: now_ms(),
            preempting: HashSet::new(),
        }
    }

    fn rate(&mut self, pool: &str) -> &mut policy::PreemptionRate {
        let half_life = self.half_life_hours;
        self.rates
            .entry(pool.to_string())
            .or_insert_with(|| policy::PreemptionRate::new(half_life, 0.0, 1.0))
    }

    /// Counts a spot preemption on `pool`, and on the offering (`<instance type>/<zone>`) it
    /// happened on when its event names one (a runner that reads its instance's metadata).
    pub fn observe_preemption(&mut self, pool: &str, offering: Option<&str>) {
        let now = now_ms();
        self.rate(pool).observe_preemption(now);
        if let Some(offering) = offering {
            self.rate(&offering_key(pool, offering)).observe_preemption(now);
        }
        self.preempted_since_save = true;
    }

    /// Each known pool's (and offering's, keyed by [`offering_key`]) estimated spot
    /// preemptions per instance-hour, now.
    pub fn rates_per_hour(&self) -> HashMap<String, f64> {
        let now = now_ms();
        self.rates
            .iter()
            .map(|(pool, rate)| (pool.clone(), rate.rate_per_hour(now)))
            .collect()
    }

    /// Takes in a pass's active jobs: victims ordered earlier count as stopping while they are
    /// active (and are forgotten once gone), and spot jobs add to their pools' exposure.
    pub fn observe_running(&mut self, running: &mut [policy::RunningJob], runners: &[policy::Runner]) {
        let active: HashSet<&str> = running.iter().map(|job| job.id.as_str()).collect();
        self.preempting.retain(|victim| active.contains(victim.as_str()));
        for job in running.iter_mut() {
            job.stopping |= self.preempting.contains(&job.id);
        }
        self.count_exposure(running, runners);
    }

    /// Records a preemption sent to `victim`: a token of its bucket spent, and the victim
    /// counted as stopping until it is gone.
    pub fn preempted(&mut self, victim: String, fair_share: bool) {
        let tokens = if fair_share {
            &mut self.fair_share_tokens
        } else {
            &mut self.tokens
        };
        *tokens = (*tokens - 1.0).max(0.0);
        self.preempting.insert(victim);
    }

    /// Adds the spot instance-hours since the last pass to each pool's exposure, and to each
    /// spot offering's the jobs on runners of that offering.
    fn count_exposure(&mut self, running: &[policy::RunningJob], runners: &[policy::Runner]) {
        let now = now_ms();
        let since = self.last_exposure_ms.replace(now).unwrap_or(now);
        let hours = (now - since).max(0) as f64 / 3_600_000.0;
        if hours == 0.0 {
            return;
        }
        let mut spot_jobs: HashMap<&str, f64> = HashMap::new();
        for job in running.iter().filter(|job| job.market == policy::Market::Spot) {
            *spot_jobs.entry(job.pool.as_str()).or_default() += 1.0;
        }
        for (pool, jobs) in spot_jobs {
            self.rate(pool).observe_exposure(jobs * hours, now);
        }
        let offerings: HashMap<(&str, &str), &str> = runners
            .iter()
            .filter_map(|runner| {
                Some((
                    (runner.pool.as_str(), runner.id.as_str()),
                    runner.spot_offering.as_deref()?,
                ))
            })
            .collect();
        let mut offering_jobs: HashMap<String, f64> = HashMap::new();
        for job in running {
            if let Some(offering) = offerings.get(&(job.pool.as_str(), job.runner.as_str())) {
                *offering_jobs.entry(offering_key(&job.pool, offering)).or_default() += 1.0;
            }
        }
        for (key, jobs) in offering_jobs {
            self.rate(&key).observe_exposure(jobs * hours, now);
        }
    }

    /// Refills the preemption buckets and says how many priority and fair-share preemptions
    /// this pass may order.
    pub fn budgets(&mut self) -> (usize, usize) {
        let now = now_ms();
        let minutes = (now - self.last_refill_ms).max(0) as f64 / 60_000.0;
        self.tokens = (self.tokens + minutes * self.tokens_per_minute).min(self.tokens_per_minute);
        self.fair_share_tokens = (self.fair_share_tokens + minutes * self.fair_share_tokens_per_minute)
            .min(self.fair_share_tokens_per_minute);
        self.last_refill_ms = now;
        (self.tokens.floor() as usize, self.fair_share_tokens.floor() as usize)
    }

    /// Becoming leader: the rates are the ones the last leader saved (none when nothing was
    /// saved), not what this scheduler saw as a standby, which counted preemptions but no
    /// exposure; they decay with this scheduler's half-life from now on. Exposure is counted
    /// from the first pass on.
    pub fn take_over(&mut self, mut saved: HashMap<String, policy::PreemptionRate>) {
        for rate in saved.values_mut() {
            rate.set_half_life(self.half_life_hours);
        }
        self.rates = saved;
        self.last_exposure_ms = None;
        self.preempted_since_save = false;
        self.saved_ms = now_ms();
    }

    /// The rates to save after a pass, when a preemption changed them or the last save is
    /// [`SAVE_EVERY_MS`] old; [`PassState::saved`] records the save.
    pub fn rates_to_save(&self) -> Option<HashMap<String, policy::PreemptionRate>> {
        let due = self.preempted_since_save || now_ms().saturating_sub(self.saved_ms) >= SAVE_EVERY_MS;
        (due && !self.rates.is_empty()).then(|| self.rates.clone())
    }

    pub fn saved(&mut self) {
        self.saved_ms = now_ms();
        self.preempted_since_save = false;
    }
}

/// The key of an offering's rate beside its pool's: `<pool>/<instance type>/<zone>` (a pool
/// name has no `/`, so the two never meet).
pub fn offering_key(pool: &str, offering: &str) -> String {
    format!("{pool}/{offering}")
}

/// The pools' preemption rates as the leader last saved them, in the `kiln_scheduler` bucket.
pub struct SavedRates {
    kv: kv::Store,
}

impl SavedRates {
    pub async fn open(nats: &Nats) -> Result<SavedRates, NatsError> {
        let kv = nats
            .jetstream
            .get_key_value(BUCKET_SCHEDULER)
            .await
            .map_err(|e| NatsError::Other(format!("bucket {BUCKET_SCHEDULER}: {e}")))?;
        Ok(SavedRates { kv })
    }

    /// The saved rates; none before the first save. Rates this version cannot read count as
    /// none, with a warning, rather than keep a scheduler from leading.
    pub async fn load(&self) -> Result<HashMap<String, policy::PreemptionRate>, NatsError> {
        let entry = self
            .kv
            .get(KEY_PREEMPTION_RATES)
            .await
            .map_err(|e| NatsError::Other(format!("read {KEY_PREEMPTION_RATES}: {e}")))?;
        let Some(bytes) = entry else {
            return Ok(HashMap::new());
        };
        Ok(serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            tracing::warn!(error = %error, "cannot read the saved preemption rates; starting from the priors");
            HashMap::new()
        }))
    }

    pub async fn save(&self, rates: &HashMap<String, policy::PreemptionRate>) -> Result<(), NatsError> {
        let bytes = serde_json::to_vec(rates).map_err(|e| NatsError::Other(e.to_string()))?;
        self.kv
            .put(KEY_PREEMPTION_RATES, bytes.into())
            .await
            .map_err(|e| NatsError::Other(format!("save {KEY_PREEMPTION_RATES}: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::testing::NatsServer;

    use super::*;

    fn spot_job(pool: &str) -> policy::RunningJob {
        policy::RunningJob {
            id: kiln_core::ids::new_id(),
            user: "u".into(),
            project: "p".into(),
            priority: 0,
            resources: policy::Resources::default(),
            pool: pool.into(),
            runner: String::new(),
            market: policy::Market::Spot,
            started_at_ms: 0,
            preemptible: true,
            stopping: false,
        }
    }

    #[test]
    fn a_spot_preemption_on_an_offering_feeds_its_pools_rate_and_the_offerings() {
        let mut state = PassState::new(&Config::default());
        // Two spot jobs for an hour: one on a runner of c5.large in us-east-1b, one on a runner
        // that does not know its instance.
        state.last_exposure_ms = Some(now_ms() - 3_600_000);
        let runner = |id: &str, spot_offering: Option<&str>| policy::Runner {
            id: id.into(),
            pool: "spot".into(),
            capacity: policy::Resources::default(),
            instance: policy::Resources::default(),
            cordoned: false,
            spot_offering: spot_offering.map(str::to_string),
        };
        let on = |runner: &str| policy::RunningJob {
            runner: runner.into(),
            ..spot_job("spot")
        };
        state.count_exposure(
            &[on("r-1"), on("r-2")],
            &[runner("r-1", Some("c5.large/us-east-1b")), runner("r-2", None)],
        );
        state.observe_preemption("spot", Some("c5.large/us-east-1b"));
        state.observe_preemption("spot", None);
        let rates = state.rates_per_hour();
        let offering = offering_key("spot", "c5.large/us-east-1b");
        assert_eq!(offering, "spot/c5.large/us-east-1b");
        // Pool: 2 preemptions over 2 + 1 (prior) hours; offering: 1 over 1 + 1.
        assert!((rates["spot"] - 2.0 / 3.0).abs() < 1e-3, "{rates:?}");
        assert!((rates[&offering] - 0.5).abs() < 1e-3, "{rates:?}");
        assert_eq!(rates.len(), 2, "{rates:?}");
    }

    #[tokio::test]
    async fn a_new_leader_takes_over_the_rates_the_last_one_saved() {
        let server = NatsServer::start();
        let nats = kiln_core::streams::connect(&server.config()).await.expect("connect");
        let config = Config::default();

        // The leader learns its pool: 3 preemptions over 4 instance-hours of spot (0.6/h with
        // the hour of prior at 0).
        let mut leader = PassState::new(&config);
        leader.last_exposure_ms = Some(now_ms() - 3_600_000);
        leader.count_exposure(&vec![spot_job("gpu"); 4], &[]);
        for _ in 0..3 {
            leader.observe_preemption("gpu", None);
        }
        let rates = leader.rates_to_save().expect("a preemption makes a save due");
        SavedRates::open(&nats)
            .await
            .expect("bucket")
            .save(&rates)
            .await
            .expect("save");
        leader.saved();
        assert!(
            leader.rates_to_save().is_none(),
            "nothing new to save right after a save"
        );
        let learnt = leader.rates_per_hour()["gpu"];

        // A standby saw one preemption but none of the exposure: on its own it would guess 1/h.
        let mut standby = PassState::new(&config);
        standby.observe_preemption("gpu", None);
        assert!((standby.rates_per_hour()["gpu"] - 1.0).abs() < 1e-9);

        let saved = SavedRates::open(&nats)
            .await
            .expect("bucket")
            .load()
            .await
            .expect("load");
        standby.take_over(saved);
        let taken = standby.rates_per_hour()["gpu"];
        assert!(
            (taken - learnt).abs() < 1e-6,
            "took over {taken}/h, the leader had learnt {learnt}/h"
        );
        assert!(
            (learnt - 1.0).abs() > 0.1,
            "the leader's rate ({learnt}/h) must differ from the standby's guess"
        );

        // A successor configured with a 1-hour half-life decays what it took over with it: an
        // hour on, the 3 preemptions over 4 instance-hours weigh half, 1.5 / (2 + 1).
        let mut hasty = PassState::new(&Config {
            preemption_half_life_hours: 1.0,
            ..Config::default()
        });
        hasty.take_over(
            SavedRates::open(&nats)
                .await
                .expect("bucket")
                .load()
                .await
                .expect("load"),
        );
        let later = hasty.rates["gpu"].rate_per_hour(now_ms() + 3_600_000);
        assert!((later - 0.5).abs() < 1e-3, "an hour later: {later}/h");
    }

    #[tokio::test]
    async fn nothing_saved_means_the_priors() {
        let server = NatsServer::start();
        let nats = kiln_core::streams::connect(&server.config()).await.expect("connect");
        let saved = SavedRates::open(&nats).await.expect("bucket");
        assert!(saved.load().await.expect("load").is_empty());
        saved
            .kv
            .put(KEY_PREEMPTION_RATES, "not json".into())
            .await
            .expect("put");
        assert!(saved.load().await.expect("load").is_empty());
    }
}
