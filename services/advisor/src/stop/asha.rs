//! Asynchronous successive halving (Li et al. 2020) with optional Hyperband brackets.
//!
//! Rungs are at `min·eta^k ≤ max`. When a trial's newest observation is its first at or past a
//! rung below `max`, it is judged there: it goes on only if its value is among the best
//! `max(1, ⌊n/eta⌋)` of the `n` values recorded at that rung so far (its own included), so the
//! first trial to reach a rung always goes on, as in ASHA. A trial is judged at each rung once,
//! when it crosses it; later observations do not re-judge it.
//!
//! With `brackets: b > 1` (Hyperband), trial `index` is in bracket `index % b`, whose rungs start
//! at `min·eta^bracket`; trials compete only within their bracket.

use serde::{Deserialize, Serialize};

use super::{Decision, value_at};
use crate::algo::{Trial, TrialState};
use crate::space::FieldError;

/// `early-stop: {name: asha, resource: epoch, min: 1, max: 81, eta: 3, brackets: 1}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AshaOptions {
    /// The metric key counting the resource; the service's default when absent (the step).
    #[serde(default)]
    pub resource: Option<String>,
    pub min: f64,
    pub max: f64,
    #[serde(default = "default_eta")]
    pub eta: f64,
    /// 1: ASHA; more: Hyperband brackets.
    #[serde(default = "default_brackets")]
    pub brackets: u32,
}

fn default_eta() -> f64 {
    3.0
}

fn default_brackets() -> u32 {
    1
}

impl AshaOptions {
    pub(crate) fn check(&self, errors: &mut Vec<FieldError>) {
        if !(self.min > 0.0 && self.min.is_finite()) {
            errors.push(FieldError::new(
                "early-stop.min",
                format!("min must be a positive number, got {}", self.min),
            ));
        }
        if !(self.max.is_finite() && self.max > self.min) {
            errors.push(FieldError::new(
                "early-stop.max",
                format!("max ({}) must be above min ({})", self.max, self.min),
            ));
        }
        if !(self.eta > 1.0 && self.eta.is_finite()) {
            errors.push(FieldError::new(
                "early-stop.eta",
                format!("eta must be above 1, got {}", self.eta),
            ));
        }
        if self.brackets == 0 {
            errors.push(FieldError::new("early-stop.brackets", "at least one bracket"));
        } else if errors.is_empty() && self.rungs(self.brackets - 1).len() < 2 {
            errors.push(FieldError::new(
                "early-stop.brackets",
                format!(
                    "{} brackets leave the last one no rung below max; use fewer",
                    self.brackets
                ),
            ));
        }
    }

    /// The rungs of `bracket`: `min·eta^(bracket+k)` below `max`, then `max`.
    pub fn rungs(&self, bracket: u32) -> Vec<f64> {
        let mut rungs = Vec::new();
        if !(self.eta > 1.0 && self.min > 0.0) {
            return vec![self.max];
        }
        let mut rung = self.min * self.eta.powi(bracket as i32);
        // A relative tolerance so that 1·3^4 = 81 counts as max, not as a rung below it.
        while rung < self.max * (1.0 - 1e-9) {
            rungs.push(rung);
            rung *= self.eta;
        }
        rungs.push(self.max);
        rungs
    }

    pub(crate) fn all_rungs(&self) -> Vec<f64> {
        let mut all: Vec<f64> = (0..self.brackets.max(1))
            .flat_map(|bracket| self.rungs(bracket))
            .collect();
        all.sort_by(f64::total_cmp);
        all.dedup();
        all
    }

    /// The bracket of trial `index`.
    pub fn bracket(&self, index: u64) -> u32 {
        (index % u64::from(self.brackets.max(1))) as u32
    }
}

pub(crate) fn decide(options: &AshaOptions, trial: &Trial, others: &[Trial]) -> Decision {
    let Some(&(latest, _)) = trial.curve.last() else {
        return Decision::Continue;
    };
    let previous = trial
        .curve
        .len()
        .checked_sub(2)
        .map_or(f64::NEG_INFINITY, |at| trial.curve[at].0);
    let bracket = options.bracket(trial.index);
    let rungs = options.rungs(bracket);
    for &rung in &rungs[..rungs.len() - 1] {
        if !(previous < rung && rung <= latest) {
            continue;
        }
        let Some(mine) = value_at(&trial.curve, rung) else {
            continue;
        };
        let peers: Vec<f64> = others
            .iter()
            .filter(|other| other.index != trial.index && other.state != TrialState::Failed)
            .filter(|other| options.bracket(other.index) == bracket)
            .filter_map(|other| value_at(&other.curve, rung))
            .collect();
        let recorded = peers.len() + 1;
        let keep = ((recorded as f64 / options.eta).floor() as usize).max(1);
        let better = peers.iter().filter(|value| value.total_cmp(&mine).is_lt()).count();
        if better >= keep {
            return Decision::Stop {
                rung,
                reason: format!(
                    "value {mine} at {rung} is not among the best {keep} of the {recorded} trials recorded there (1/{} kept)",
                    options.eta
                ),
            };
        }
    }
    Decision::Continue
}
