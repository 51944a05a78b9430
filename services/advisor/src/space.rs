//! The search space of a sweep: the `parameters:` block of its spec, validated.
//!
//! ```yaml
//! parameters:
//!   lr:        {type: float, min: 1.0e-5, max: 1.0e-1, log: true}
//!   batch:     {type: int, values: [32, 64, 128]}
//!   layers:    {type: int, min: 1, max: 8}
//!   dropout:   {type: float, min: 0.0, max: 0.5, step: 0.1}
//!   optimizer: {type: categorical, values: [sgd, adam]}
//!   momentum:  {type: float, min: 0.8, max: 0.99, when: {optimizer: sgd}}
//! ```
//!
//! A parameter with `when` is conditional: it is active (present in a trial's config) only when
//! every parent named there is active and has the value given. Parents are parameters with a
//! finite set of values (`values`, or an int range).

use std::collections::{BTreeMap, BTreeSet};

use kiln_core::runs::{ConfigValue, RunConfig};
use serde::{Deserialize, Serialize};

mod check;

/// A parameter's `type`. An unknown name is kept so that [`Space::new`] can name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ParamType {
    Float,
    Int,
    Categorical,
    Unknown(String),
}

impl From<String> for ParamType {
    fn from(name: String) -> Self {
        match name.as_str() {
            "float" => ParamType::Float,
            "int" => ParamType::Int,
            "categorical" => ParamType::Categorical,
            _ => ParamType::Unknown(name),
        }
    }
}

impl From<ParamType> for String {
    fn from(kind: ParamType) -> Self {
        match kind {
            ParamType::Float => "float".into(),
            ParamType::Int => "int".into(),
            ParamType::Categorical => "categorical".into(),
            ParamType::Unknown(name) => name,
        }
    }
}

/// One entry of `parameters:`, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ParamSpec {
    pub r#type: ParamType,
    pub min: Option<f64>,
    pub max: Option<f64>,
    #[serde(default)]
    pub log: bool,
    pub values: Option<Vec<ConfigValue>>,
    pub step: Option<f64>,
    pub when: Option<BTreeMap<String, ConfigValue>>,
}

/// A problem in a spec, naming the field (`parameters.lr.min`) so a person can fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}: {}", self.field, self.message)
    }
}

/// The values a parameter takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Domain {
    /// `[low, high]`, on a log scale when `log`; on the grid `low + k·step` when `step` is set.
    Float {
        low: f64,
        high: f64,
        log: bool,
        step: Option<f64>,
    },
    /// `low, low + step, …, ≤ high`; `log` (with step 1) samples on a log scale.
    Int { low: i64, high: i64, log: bool, step: i64 },
    /// One of `values`: a categorical, or an int/float given as a list.
    Choice { values: Vec<ConfigValue> },
}

/// A validated parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    pub domain: Domain,
    /// Parent parameter → the value it must have for this one to be active.
    pub when: BTreeMap<String, ConfigValue>,
}

/// The validated parameters, in the order given, and an order in which parents come first.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    params: Vec<Param>,
    order: Vec<usize>,
}

/// Whether two config values are the same value (`1` and `1.0` are).
pub fn same_value(a: &ConfigValue, b: &ConfigValue) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

impl Domain {
    /// The number of grid points; `None` for a float range without `step`.
    pub fn grid_len(&self) -> Option<u64> {
        match self {
            Domain::Float { step: None, .. } => None,
            Domain::Float {
                low,
                high,
                step: Some(step),
                ..
            } => Some(((high - low) / step + 1e-9).floor() as u64 + 1),
            Domain::Int { low, high, step, .. } => Some(((high - low) / step) as u64 + 1),
            Domain::Choice { values } => Some(values.len() as u64),
        }
    }

    /// The `k`-th grid point (`k < grid_len`).
    pub fn grid_value(&self, k: u64) -> ConfigValue {
        match self {
            Domain::Float { low, step, .. } => ConfigValue::Float(round_to_step(low + k as f64 * step.unwrap_or(0.0))),
            Domain::Int { low, step, .. } => ConfigValue::Int(low + k as i64 * step),
            Domain::Choice { values } => values[k as usize].clone(),
        }
    }

    /// The value at `u ∈ [0, 1)` of the unit interval, uniform in the parameter's own scale.
    pub fn from_unit(&self, u: f64) -> ConfigValue {
        let u = u.clamp(0.0, 1.0);
        let pick = |n: u64| ((u * n as f64).floor() as u64).min(n.saturating_sub(1));
        match self {
            Domain::Float {
                low, high, log: true, ..
            } => ConfigValue::Float((low.ln() + u * (high.ln() - low.ln())).exp().clamp(*low, *high)),
            Domain::Float {
                low, high, step: None, ..
            } => ConfigValue::Float((low + u * (high - low)).clamp(*low, *high)),
            Domain::Int {
                low, high, log: true, ..
            } => {
                let (a, b) = ((*low as f64 - 0.5).ln(), (*high as f64 + 0.5).ln());
                ConfigValue::Int(((a + u * (b - a)).exp().round() as i64).clamp(*low, *high))
            }
            _ => self.grid_value(pick(self.grid_len().unwrap_or(1))),
        }
    }

    /// Whether `value` is one this domain can take.
    pub fn contains(&self, value: &ConfigValue) -> bool {
        match self {
            Domain::Choice { values } => values.iter().any(|known| same_value(known, value)),
            Domain::Int { low, high, step, .. } => {
                matches!(value, ConfigValue::Int(v) if v >= low && v <= high && (v - low) % step == 0)
            }
            Domain::Float { low, high, .. } => value.as_f64().is_some_and(|v| v >= *low && v <= *high),
        }
    }
}

/// `x` without the float noise of `low + k·step` (`0.30000000000000004` → `0.3`).
fn round_to_step(x: f64) -> f64 {
    let rounded = (x * 1e12).round() / 1e12;
    if (rounded - x).abs() < 1e-9 { rounded } else { x }
}

impl Space {
    /// Validates the parameters; every problem is reported, each naming its field.
    pub fn new(specs: Vec<(String, ParamSpec)>) -> Result<Space, Vec<FieldError>> {
        let mut errors = Vec::new();
        if specs.is_empty() {
            errors.push(FieldError::new("parameters", "a sweep needs at least one parameter"));
        }
        let mut params = Vec::with_capacity(specs.len());
        let mut seen = BTreeSet::new();
        for (name, spec) in &specs {
            if !seen.insert(name.as_str()) {
                errors.push(FieldError::new(format!("parameters.{name}"), "declared twice"));
                continue;
            }
            if let Some(domain) = check::domain(name, spec, &mut errors) {
                params.push(Param {
                    name: name.clone(),
                    domain,
                    when: spec.when.clone().unwrap_or_default(),
                });
            }
        }
        let order = check::conditions(&params, &specs, &mut errors);
        if errors.is_empty() {
            Ok(Space { params, order })
        } else {
            Err(errors)
        }
    }

    /// The parameter names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.params.iter().map(|param| param.name.as_str())
    }

    /// The parameters, in the order given.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Indices into [`Space::params`] with every parent before its children.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|param| param.name == name)
    }

    /// Whether `name` is active in `config`: each of its `when` parents is active there and has
    /// the value required. An unknown name is not active.
    pub fn is_active(&self, name: &str, config: &RunConfig) -> bool {
        let Some(param) = self.param(name) else { return false };
        param.when.iter().all(|(parent, wanted)| {
            config.get(parent).is_some_and(|value| same_value(value, wanted)) && self.is_active(parent, config)
        })
    }

    /// The number of distinct configs a grid search visits (inactive conditionals are not
    /// multiplied in); `None` when a float has neither `values` nor `step`. Saturates at
    /// `u64::MAX`.
    pub fn grid_size(&self) -> Option<u64> {
        crate::algo::grid::size(self)
    }

    /// Whether `config` holds exactly the active parameters, each with a value of its domain.
    pub fn admits(&self, config: &RunConfig) -> bool {
        let active = self.params.iter().filter(|param| self.is_active(&param.name, config));
        let mut count = 0;
        for param in active {
            count += 1;
            if !config
                .get(&param.name)
                .is_some_and(|value| param.domain.contains(value))
            {
                return false;
            }
        }
        count == config.len()
    }
}

#[cfg(test)]
pub(crate) mod tests;
