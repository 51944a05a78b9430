//! Median stopping (Golovin et al. 2017, Google Vizier): after `grace`, a trial stops when its
//! best value so far is worse than the median of the running averages, up to the same resource,
//! of the finished (`Done`) trials that got that far, once at least `min-trials` of them did.

use serde::{Deserialize, Serialize};

use super::Decision;
use crate::algo::{Trial, TrialState};
use crate::space::FieldError;

/// `early-stop: {name: median, resource: epoch, grace: 5, min-trials: 5}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MedianOptions {
    /// The metric key counting the resource; the service's default when absent (the step).
    pub resource: Option<String>,
    /// No stopping before this resource.
    pub grace: f64,
    /// Finished trials needed before anything is stopped.
    pub min_trials: u32,
}

impl Default for MedianOptions {
    fn default() -> Self {
        MedianOptions {
            resource: None,
            grace: 1.0,
            min_trials: 5,
        }
    }
}

impl MedianOptions {
    pub(crate) fn check(&self, errors: &mut Vec<FieldError>) {
        if !(self.grace >= 0.0 && self.grace.is_finite()) {
            errors.push(FieldError::new(
                "early-stop.grace",
                format!("grace must be ≥ 0, got {}", self.grace),
            ));
        }
        if self.min_trials == 0 {
            errors.push(FieldError::new(
                "early-stop.min-trials",
                "at least one finished trial is needed to compare with",
            ));
        }
    }
}

pub(crate) fn decide(options: &MedianOptions, trial: &Trial, others: &[Trial]) -> Decision {
    let Some(&(latest, _)) = trial.curve.last() else {
        return Decision::Continue;
    };
    if latest < options.grace {
        return Decision::Continue;
    }
    let best = trial
        .curve
        .iter()
        .map(|(_, value)| *value)
        .fold(f64::INFINITY, f64::min);
    let mut averages: Vec<f64> = others
        .iter()
        .filter(|other| other.index != trial.index && other.state == TrialState::Done)
        .filter(|other| other.curve.last().is_some_and(|(at, _)| *at >= latest))
        .filter_map(|other| {
            let prefix: Vec<f64> = other
                .curve
                .iter()
                .take_while(|(at, _)| *at <= latest)
                .map(|(_, v)| *v)
                .collect();
            (!prefix.is_empty()).then(|| prefix.iter().sum::<f64>() / prefix.len() as f64)
        })
        .collect();
    if averages.len() < options.min_trials as usize {
        return Decision::Continue;
    }
    averages.sort_by(f64::total_cmp);
    let middle = averages.len() / 2;
    let median = if averages.len().is_multiple_of(2) {
        (averages[middle - 1] + averages[middle]) / 2.0
    } else {
        averages[middle]
    };
    if best > median {
        Decision::Stop {
            rung: latest,
            reason: format!(
                "best value {best} by {latest} is worse than the median {median} of {} finished trials",
                averages.len()
            ),
        }
    } else {
        Decision::Continue
    }
}
