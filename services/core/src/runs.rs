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

impl From<&ConfigValue> for kiln_proto::v1::ConfigValue {
    fn from(value: &ConfigValue) -> Self {
        use kiln_proto::v1::config_value::Value;
        let value = match value {
            ConfigValue::Bool(value) => Value::BoolValue(*value),
            ConfigValue::Int(value) => Value::IntValue(*value),
            ConfigValue::Float(value) => Value::FloatValue(*value),
            ConfigValue::Str(value) => Value::StringValue(value.clone()),
        };
        kiln_proto::v1::ConfigValue { value: Some(value) }
    }
}

impl ConfigValue {
    /// The value a proto message carries; `None` when it carries none.
    pub fn from_proto(value: &kiln_proto::v1::ConfigValue) -> Option<ConfigValue> {
        use kiln_proto::v1::config_value::Value;
        Some(match value.value.as_ref()? {
            Value::BoolValue(value) => ConfigValue::Bool(*value),
            Value::IntValue(value) => ConfigValue::Int(*value),
            Value::FloatValue(value) => ConfigValue::Float(*value),
            Value::StringValue(value) => ConfigValue::Str(value.clone()),
        })
    }
}

/// A config as proto carries it (`map<string, ConfigValue>`).
pub fn config_to_proto(config: &RunConfig) -> std::collections::HashMap<String, kiln_proto::v1::ConfigValue> {
    config.iter().map(|(key, value)| (key.clone(), value.into())).collect()
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
        for value in config.values() {
            assert_eq!(ConfigValue::from_proto(&value.into()).as_ref(), Some(value));
        }
    }
}
