//! Suggestion algorithms. Each is a pure function of its options, the space, the history of
//! trials and the index of the trial to suggest: the same inputs give the same config, so an
//! advisor that replays its record after a restart makes the same next suggestion. The order of
//! `history` does not matter (trials are taken by `index`).

use kiln_core::runs::{ConfigValue, RunConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::space::{FieldError, Space};

pub mod grid;
mod parzen;
pub mod random;
pub mod tpe;

pub use tpe::TpeOptions;

/// Where a trial is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialState {
    /// Suggested and not finished (queued, running, or preempted and resuming).
    Running,
    /// Finished with a value.
    Done,
    /// Failed; it says nothing about its config.
    Failed,
    /// Stopped early; its curve says how far it got.
    Stopped,
}

/// A suggested trial as the algorithms see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub index: u64,
    pub config: RunConfig,
    pub state: TrialState,
    /// The objective, oriented so that lower is better (`Done` trials).
    pub value: Option<f64>,
    /// `(resource, value)` observations in increasing resource, lower is better.
    pub curve: Vec<(f64, f64)>,
}

/// The `algorithm:` block of a sweep spec (`{name: tpe, seed: 0, startup-trials: 10}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Algorithm {
    /// Independent uniform draws (in each parameter's scale).
    Random {
        #[serde(default)]
        seed: u64,
    },
    /// Owen-scrambled Sobol points (`sobol_burley`), a low-discrepancy sequence.
    Sobol {
        #[serde(default)]
        seed: u64,
    },
    /// Latin hypercube designs of `trials` points each: every parameter's range is cut into
    /// `trials` strata and each design puts one point in each; index `trials` starts a new one.
    LatinHypercube {
        #[serde(default)]
        seed: u64,
        trials: u64,
    },
    /// Every combination of the parameters' grid values, in order; then `None`.
    Grid,
    /// Multivariate TPE with a constant liar.
    Tpe(TpeOptions),
}

impl Algorithm {
    /// The config of trial `index`, or `None` when the algorithm has no more (grid exhausted).
    pub fn suggest(&self, space: &Space, history: &[Trial], index: u64) -> Option<RunConfig> {
        match self {
            Algorithm::Random { seed } => Some(random::random(space, *seed, index)),
            Algorithm::Sobol { seed } => Some(random::sobol(space, *seed, index)),
            Algorithm::LatinHypercube { seed, trials } => Some(random::latin_hypercube(space, *seed, *trials, index)),
            Algorithm::Grid => grid::point(space, index),
            Algorithm::Tpe(options) => Some(tpe::suggest(options, space, history, index)),
        }
    }

    /// Problems of this algorithm with this space (a grid over a float without `step`, …).
    pub fn check(&self, space: &Space) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        match self {
            Algorithm::Grid => {
                for param in space.params() {
                    if param.domain.grid_len().is_none() {
                        errors.push(FieldError::new(
                            format!("parameters.{}.step", param.name),
                            "a grid search needs `values` or a `step` for every float parameter",
                        ));
                    }
                }
            }
            Algorithm::LatinHypercube { trials: 0, .. } => {
                errors.push(FieldError::new(
                    "algorithm.trials",
                    "a Latin hypercube needs at least one trial",
                ));
            }
            Algorithm::Tpe(options) => options.check(&mut errors),
            _ => {}
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

/// The generator of trial `index` under `seed`: one ChaCha stream per trial, portable across
/// platforms and releases of `rand`.
pub(crate) fn trial_rng(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

/// A config from one unit coordinate per parameter (by declaration position), parents first,
/// leaving out the parameters their conditions make inactive.
pub(crate) fn from_unit(space: &Space, mut unit: impl FnMut(usize) -> f64) -> RunConfig {
    let mut config = RunConfig::new();
    for &at in space.order() {
        let param = &space.params()[at];
        let u = unit(at);
        if space.is_active(&param.name, &config) {
            config.insert(param.name.clone(), param.domain.from_unit(u));
        }
    }
    config
}

/// The value's position in a `Choice`'s values.
pub(crate) fn position(values: &[ConfigValue], value: &ConfigValue) -> Option<usize> {
    values.iter().position(|known| crate::space::same_value(known, value))
}

#[cfg(test)]
mod tests;
