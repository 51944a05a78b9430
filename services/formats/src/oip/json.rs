//! A tensor's `data` in JSON: row-major, flat or nested in arrays, numbers, booleans or strings.

use serde_json::Value;

use super::{Data, DataType, refuse};
use crate::Result;

/// Row-major leaves of nested arrays, at most `limit` of them.
pub(super) fn flatten<'a>(value: &'a Value, into: &mut Vec<&'a Value>, limit: u64, what: &str) -> Result<()> {
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(item, into, limit, what)?;
            }
            Ok(())
        }
        leaf if (into.len() as u64) < limit => {
            into.push(leaf);
            Ok(())
        }
        _ => Err(refuse(format!("{what}: the data has more elements than its shape"))),
    }
}

pub(super) fn from_json(datatype: DataType, values: &[&Value], what: &str) -> Result<Data> {
    let bad = |at: usize, want: &str| refuse(format!("{what}: element {at} is not {want}"));
    Ok(match datatype {
        DataType::Bool => Data::Bool(
            values
                .iter()
                .enumerate()
                .map(|(at, value)| value.as_bool().ok_or_else(|| bad(at, "true or false")))
                .collect::<Result<_>>()?,
        ),
        DataType::Bytes => Data::Bytes(
            values
                .iter()
                .enumerate()
                .map(|(at, value)| {
                    value
                        .as_str()
                        .map(|text| text.as_bytes().to_vec())
                        .ok_or_else(|| bad(at, "a string"))
                })
                .collect::<Result<_>>()?,
        ),
        DataType::Fp16 | DataType::Fp32 | DataType::Fp64 => Data::Float(
            values
                .iter()
                .enumerate()
                .map(|(at, value)| value.as_f64().ok_or_else(|| bad(at, "a number")))
                .collect::<Result<_>>()?,
        ),
        _ => {
            let (low, high) = datatype.int_range().unwrap_or((0, 0));
            let name = datatype.name();
            Data::Int(
                values
                    .iter()
                    .enumerate()
                    .map(|(at, value)| {
                        let int = value
                            .as_i64()
                            .map(i128::from)
                            .or_else(|| value.as_u64().map(i128::from))
                            .ok_or_else(|| bad(at, "an integer"))?;
                        if (low..=high).contains(&int) {
                            Ok(int)
                        } else {
                            Err(refuse(format!("{what}: element {at} ({int}) is outside {name}")))
                        }
                    })
                    .collect::<Result<_>>()?,
            )
        }
    })
}

pub(super) fn to_json(data: &Data) -> Value {
    match data {
        Data::Bool(values) => values.iter().copied().map(Value::Bool).collect(),
        Data::Int(values) => values
            .iter()
            .map(|value| match i64::try_from(*value) {
                Ok(int) => Value::from(int),
                Err(_) => Value::from(*value as u64),
            })
            .collect(),
        Data::Float(values) => values
            .iter()
            .map(|value| serde_json::Number::from_f64(*value).map_or(Value::Null, Value::Number))
            .collect(),
        Data::Bytes(values) => values
            .iter()
            .map(|value| Value::String(String::from_utf8_lossy(value).into_owned()))
            .collect(),
    }
}

/// Whether JSON can carry the data: its strings are UTF-8 and its numbers finite, so BYTES that
/// are not text and floats that are NaN or infinite go to the binary part.
pub(super) fn json_can_hold(data: &Data) -> bool {
    match data {
        Data::Bytes(values) => values.iter().all(|value| std::str::from_utf8(value).is_ok()),
        Data::Float(values) => values.iter().all(|value| value.is_finite()),
        Data::Bool(_) | Data::Int(_) => true,
    }
}
