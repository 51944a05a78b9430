//! What the runner's machine is and what its cloud warns it of: a [`MetadataSource`], read
//! through [`imds`] (EC2's instance metadata service, IMDSv2) when `[imds] enabled`.
//!
//! At start the runner reads its [`Identity`] (instance id, type, zone, spot or on-demand) and
//! reports it with its capacity; [`spot`] then polls the [`Notices`] every `poll-interval-ms`
//! and acts on them: a rebalance recommendation cordons the runner and asks each job to
//! checkpoint; an interruption notice cordons it and stops its jobs within the notice, each
//! ending PREEMPTED and queued again from the outputs synced at its stop.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;

pub mod imds;
pub(crate) mod spot;

/// `[imds]`: whether and where the runner reads its instance's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ImdsConfig {
    /// Off by default: a runner that is not on an EC2 instance has no metadata service.
    pub enabled: bool,
    /// Where the metadata service answers (a test's AEMM, in tests).
    pub endpoint: String,
    /// How often the notices are read, in milliseconds (AWS advises every 5 s or less; a spot
    /// notice comes two minutes ahead).
    pub poll_interval_ms: u64,
    /// How long a session token lives (1..=21600 s); it is renewed when a fifth of that is
    /// left, and at once when the service refuses it (401).
    pub token_ttl_secs: u64,
    /// What the instance costs per hour, reported with the capacity; unset: unknown (until the
    /// provisioner tells prices).
    pub price_per_hour: Option<f64>,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        ImdsConfig {
            enabled: false,
            endpoint: "http://169.254.169.254".into(),
            poll_interval_ms: 2_000,
            token_ttl_secs: 21_600,
            price_per_hour: None,
        }
    }
}

impl ImdsConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        if !self.enabled {
            return;
        }
        if reqwest::Url::parse(&self.endpoint).is_err() {
            problems.push(format!("imds.endpoint {:?} is not a URL", self.endpoint));
        }
        if self.poll_interval_ms == 0 {
            problems.push("imds.poll-interval-ms must be at least 1".into());
        }
        if !(1..=21_600).contains(&self.token_ttl_secs) {
            problems.push("imds.token-ttl-secs must be between 1 and 21600".into());
        }
        if self.price_per_hour.is_some_and(|price| price.is_nan() || price < 0.0) {
            problems.push("imds.price-per-hour must not be negative".into());
        }
    }
}

/// What the instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub instance_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    /// `spot` or `on-demand` (EC2's `instance-life-cycle`, whose `scheduled` reads on-demand).
    pub market: String,
}

impl Identity {
    pub fn is_spot(&self) -> bool {
        self.market == "spot"
    }

    /// The offering a job event carries.
    pub fn offering(&self) -> kiln_core::events::Offering {
        kiln_core::events::Offering {
            instance_type: self.instance_type.clone(),
            zone: self.zone.clone(),
        }
    }
}

/// What the cloud has announced so far (each stays once it is there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notices {
    /// A rebalance recommendation: the instance is at higher risk of interruption; when it was
    /// made, in ms since the epoch.
    pub rebalance_at_ms: Option<i64>,
    /// An interruption notice: what the cloud does (`terminate`, `stop`, `hibernate`) and when.
    pub interruption: Option<Interruption>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    pub action: String,
    pub at_ms: i64,
}

/// Where the runner learns what its machine is and what its cloud warns of.
#[async_trait::async_trait]
pub trait MetadataSource: Send + Sync + 'static {
    async fn identity(&self) -> Result<Identity>;
    async fn notices(&self) -> Result<Notices>;
}

/// How long a runner starting on an instance waits for its metadata service (it may come up
/// a moment after the instance boots).
const IDENTITY_PATIENCE: Duration = Duration::from_secs(10);

/// The metadata source `[imds]` names and the instance's identity read through it; both `None`
/// when it is off. Fails (the runner does not start) when the service does not answer.
pub async fn connect(config: &ImdsConfig) -> Result<(Option<Arc<dyn MetadataSource>>, Option<Identity>)> {
    if !config.enabled {
        return Ok((None, None));
    }
    let source = Arc::new(imds::Imds::new(
        &config.endpoint,
        Duration::from_secs(config.token_ttl_secs),
    )?);
    let deadline = tokio::time::Instant::now() + IDENTITY_PATIENCE;
    let identity = loop {
        match source.identity().await {
            Ok(identity) => break identity,
            Err(error) if tokio::time::Instant::now() < deadline => {
                tracing::info!(endpoint = %config.endpoint, error = %error, "instance metadata not read yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    };
    tracing::info!(
        instance_id = %identity.instance_id,
        instance_type = %identity.instance_type,
        zone = %identity.zone,
        market = %identity.market,
        "on a cloud instance"
    );
    Ok((Some(source), Some(identity)))
}

/// Reads `YYYY-MM-DDTHH:MM:SS[.fff]Z` (what IMDS writes) as ms since the epoch.
pub fn parse_utc(text: &str) -> Option<i64> {
    let text = text.trim().strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut time = time.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (time.next()??, time.next()??, time.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let millis = match fraction {
        "" => 0,
        digits => format!("{digits:0<3}")[..3].parse::<i64>().ok()?,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imds_times_are_read_as_ms_since_the_epoch() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_utc("2026-12-04T08:52:49Z"), Some(1_796_374_369_000));
        assert_eq!(parse_utc("2024-02-29T12:00:00.5Z"), Some(1_709_208_000_500));
        for bad in ["", "2026-12-04 08:52:49", "2026-13-04T08:52:49Z", "yesterday"] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_imds_section_is_checked_only_when_enabled() {
        let mut problems = Vec::new();
        let off = ImdsConfig {
            endpoint: "not a url".into(),
            ..ImdsConfig::default()
        };
        off.validate(&mut problems);
        assert!(problems.is_empty());
        let on = ImdsConfig {
            enabled: true,
            poll_interval_ms: 0,
            token_ttl_secs: 0,
            ..off
        };
        on.validate(&mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }
}
