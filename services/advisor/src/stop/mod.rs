//! Early stopping: a pure decision over a trial's learning curve and its peers' curves. The
//! service calls [`EarlyStop::decide`] when a trial reports an observation and stops it on
//! [`Decision::Stop`]; the decision depends only on the curves it is given.

use serde::{Deserialize, Serialize};

use crate::algo::Trial;
use crate::space::FieldError;

pub mod asha;
pub mod median;

pub use asha::AshaOptions;
pub use median::MedianOptions;

/// The `early-stop:` block of a sweep spec (`{name: asha, min: 1, max: 81, eta: 3}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "name", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EarlyStop {
    #[default]
    None,
    Asha(AshaOptions),
    Median(MedianOptions),
}

/// What to do with a trial after its newest observation.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Continue,
    /// Stop it: it lost at `rung` (the resource it was judged at), for `reason`.
    Stop {
        rung: f64,
        reason: String,
    },
}

impl EarlyStop {
    /// Whether `trial` goes on after its newest observation, judged against `others` (the
    /// sweep's other trials, with the curves they have reported so far; `trial` itself among
    /// them is ignored).
    pub fn decide(&self, trial: &Trial, others: &[Trial]) -> Decision {
        match self {
            EarlyStop::None => Decision::Continue,
            EarlyStop::Asha(options) => asha::decide(options, trial, others),
            EarlyStop::Median(options) => median::decide(options, trial, others),
        }
    }

    /// The resources at which trials are judged, ascending (ASHA's rungs over all brackets,
    /// `max` last); empty for median stopping, which judges every observation.
    pub fn rungs(&self) -> Vec<f64> {
        match self {
            EarlyStop::None | EarlyStop::Median(_) => Vec::new(),
            EarlyStop::Asha(options) => options.all_rungs(),
        }
    }

    /// The metric key that counts the resource (`epoch`), when the spec names one.
    pub fn resource(&self) -> Option<&str> {
        match self {
            EarlyStop::None => None,
            EarlyStop::Asha(options) => options.resource.as_deref(),
            EarlyStop::Median(options) => options.resource.as_deref(),
        }
    }

    /// Problems of the options, each naming its field under `early-stop`.
    pub fn check(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        match self {
            EarlyStop::None => {}
            EarlyStop::Asha(options) => options.check(&mut errors),
            EarlyStop::Median(options) => options.check(&mut errors),
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

/// The value `curve` had on reaching `resource`: its first observation at or past it.
pub(crate) fn value_at(curve: &[(f64, f64)], resource: f64) -> Option<f64> {
    curve.iter().find(|(at, _)| *at >= resource).map(|(_, value)| *value)
}

#[cfg(test)]
mod tests;
