//! A run's configuration: flat `a.b` keys with typed values, as `kiln.init(config=...)` stores
//! it, as a sweep's trial is given its knobs, and as a registered model version records it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One configuration value. In JSON it is the plain value (`true`, `3`, `0.1`, `"adam"`), so a
/// stored config reads back as the object the user gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

/// A run's configuration, by flattened key (`optimizer.lr`).
pub type RunConfig = BTreeMap<String, ConfigValue>;

impl ConfigValue {
    /// The value as a number (bools and strings have none), for comparisons such as `lr<0.01`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            ConfigValue::Int(value) => Some(*value as f64),
            ConfigValue::Float(value) => Some(*value),
            ConfigValue::Bool(_) | ConfigValue::Str(_) => None,
        }
    }
}

impl fmt::Display for ConfigValue {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigValue::Bool(value) => write!(formatter, "{value}"),
            ConfigValue::Int(value) => write!(formatter, "{value}"),
            ConfigValue::Float(value) => write!(formatter, "{value}"),
            ConfigValue::Str(value) => formatter.write_str(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_the_plain_json_they_came_from() {
        let config: RunConfig = serde_json::from_str(r#"{"a.b": 3, "lr": 0.1, "opt": "adam", "on": true}"#).unwrap();
        assert_eq!(config["a.b"], ConfigValue::Int(3));
        assert_eq!(config["lr"], ConfigValue::Float(0.1));
        assert_eq!(config["opt"], ConfigValue::Str("adam".into()));
        assert_eq!(config["on"], ConfigValue::Bool(true));
        assert_eq!(
            serde_json::to_string(&config).unwrap(),
            r#"{"a.b":3,"lr":0.1,"on":true,"opt":"adam"}"#
        );
        assert_eq!(config["a.b"].as_f64(), Some(3.0));
        assert_eq!(config["opt"].as_f64(), None);
    }
}
