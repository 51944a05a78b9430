//! The checks of a write that need nothing but the request: its size, its columns, its keys,
//! its lines. They run before the job is looked up.

use kiln_core::streams::MAX_LOG_LINE_BYTES;
use kiln_formats::columns::check_columns;
use kiln_proto::v1 as pb;
use prost::Message;

use super::{MAX_KEY_BYTES, MAX_REQUEST_BYTES};
use crate::error::Error;

/// Most lines of one WriteLogs request.
pub(super) const MAX_LINES_PER_REQUEST: usize = 10_000;

pub(super) fn invalid(error: kiln_formats::Error) -> Error {
    Error::InvalidArgument(error.to_string())
}

/// Checks a WriteMetrics request; returns its distinct keys, sorted.
pub(super) fn check_write_metrics(request: &pb::WriteMetricsRequest) -> Result<Vec<String>, Error> {
    let size = request.encoded_len();
    if size > MAX_REQUEST_BYTES {
        return Err(Error::TooLarge(format!(
            "the batch is {size} bytes; the limit is {MAX_REQUEST_BYTES} bytes (4 MiB): send smaller batches"
        )));
    }
    let no_columns = pb::MetricColumns::default();
    let columns = request.columns.as_ref().unwrap_or(&no_columns);
    check_columns(columns).map_err(invalid)?;
    let mut keys: Vec<&str> = request
        .points
        .iter()
        .map(|p| p.key.as_str())
        .chain(columns.keys.iter().map(String::as_str))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for key in &keys {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
            return Err(Error::InvalidArgument(format!(
                "metric key {:?} is {} bytes; keys are 1 to {MAX_KEY_BYTES} bytes without control characters",
                key.chars().take(40).collect::<String>(),
                key.len()
            )));
        }
    }
    Ok(keys.into_iter().map(str::to_string).collect())
}

/// Checks a WriteLogs request.
pub(super) fn check_write_logs(request: &pb::WriteLogsRequest) -> Result<(), Error> {
    let size = request.encoded_len();
    if size > MAX_REQUEST_BYTES {
        return Err(Error::TooLarge(format!(
            "the request is {size} bytes; the limit is {MAX_REQUEST_BYTES} bytes (4 MiB): send fewer lines at a time"
        )));
    }
    if request.lines.len() > MAX_LINES_PER_REQUEST {
        return Err(Error::TooLarge(format!(
            "{} lines in one request; the limit is {MAX_LINES_PER_REQUEST}",
            request.lines.len()
        )));
    }
    if request.writer.len() > MAX_KEY_BYTES || request.writer.contains(['.', '*', '>', ' ']) {
        return Err(Error::InvalidArgument(format!(
            "writer {:?} must be at most {MAX_KEY_BYTES} bytes without '.', '*', '>' or spaces",
            request.writer.chars().take(40).collect::<String>()
        )));
    }
    if let Some((n, line)) = request
        .lines
        .iter()
        .enumerate()
        .find(|(_, line)| line.text.len() > MAX_LOG_LINE_BYTES)
    {
        return Err(Error::InvalidArgument(format!(
            "line {n} is {} bytes; the limit is {MAX_LOG_LINE_BYTES} bytes (16 KiB): split it",
            line.text.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::string::string_regex(&format!(".{{0,{max}}}")).unwrap(),
            proptest::string::string_regex(&format!("[a-z/.*> \\n]{{0,{max}}}")).unwrap(),
        ]
    }

    fn any_metrics() -> impl Strategy<Value = pb::WriteMetricsRequest> {
        (
            text(8),
            prop::collection::vec((text(6), any::<i64>(), any::<f64>(), any::<i64>()), 0..4),
            prop::option::of((
                prop::collection::vec(text(6), 0..3),
                prop::collection::vec(0u32..4, 0..4),
                prop::collection::vec(any::<i64>(), 0..4),
                prop::collection::vec(any::<f64>(), 0..4),
                prop::collection::vec(any::<i64>(), 0..4),
            )),
        )
            .prop_map(|(job_id, points, columns)| pb::WriteMetricsRequest {
                job_id,
                points: points
                    .into_iter()
                    .map(|(key, step, value, timestamp_ms)| pb::MetricPoint {
                        key,
                        step,
                        value,
                        timestamp_ms,
                    })
                    .collect(),
                columns: columns.map(|(keys, key_index, steps, values, timestamps_ms)| pb::MetricColumns {
                    keys,
                    key_index,
                    steps,
                    values,
                    timestamps_ms,
                }),
            })
    }

    fn valid_metrics() -> impl Strategy<Value = pb::WriteMetricsRequest> {
        (1usize..4, 0usize..20).prop_flat_map(|(keys, n)| {
            (
                prop::collection::vec(("[a-z][a-z/_]{0,20}", any::<i64>(), any::<f64>()), 0..4),
                prop::collection::vec("[a-z][a-z/_]{0,20}", keys),
                prop::collection::vec(0..keys as u32, n),
                prop::collection::vec(any::<i64>(), n),
                prop::collection::vec(any::<f64>(), n),
            )
                .prop_map(|(points, keys, key_index, steps, values)| pb::WriteMetricsRequest {
                    job_id: "j".into(),
                    points: points
                        .into_iter()
                        .map(|(key, step, value)| pb::MetricPoint {
                            key,
                            step,
                            value,
                            timestamp_ms: 0,
                        })
                        .collect(),
                    columns: Some(pb::MetricColumns {
                        keys,
                        key_index,
                        steps,
                        values,
                        timestamps_ms: Vec::new(),
                    }),
                })
        })
    }

    fn any_logs() -> impl Strategy<Value = pb::WriteLogsRequest> {
        (text(8), text(10), prop::collection::vec(text(20), 0..4)).prop_map(|(job_id, writer, lines)| {
            pb::WriteLogsRequest {
                job_id,
                writer,
                first_index: 0,
                lines: lines
                    .into_iter()
                    .map(|text| pb::LogEntry {
                        text,
                        ..Default::default()
                    })
                    .collect(),
            }
        })
    }

    proptest! {
        #[test]
        fn any_metrics_request_is_answered_without_a_panic(request in any_metrics()) {
            if let Ok(keys) = check_write_metrics(&request) {
                prop_assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
                prop_assert!(keys.iter().all(|key| !key.is_empty() && key.len() <= MAX_KEY_BYTES));
            }
        }

        #[test]
        fn valid_metrics_requests_are_accepted(request in valid_metrics()) {
            let keys = check_write_metrics(&request).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(!keys.is_empty() || request.points.is_empty());
        }

        #[test]
        fn a_bad_metrics_field_is_refused_and_named(request in valid_metrics(), which in 0u8..5) {
            let mut request = request;
            let columns = request.columns.as_mut().unwrap();
            let named = match which {
                0 => { columns.values.push(0.0); "columns differ in length" }
                1 => { columns.key_index.push(99); columns.steps.push(0); columns.values.push(0.0); "key index" }
                2 => { columns.timestamps_ms = vec![1; columns.steps.len() + 1]; "timestamps" }
                3 => { columns.keys[0] = "a\nb".into(); "metric key" }
                _ => { columns.keys[0] = "k".repeat(MAX_KEY_BYTES + 1); "metric key" }
            };
            let message = check_write_metrics(&request).unwrap_err().to_string();
            prop_assert!(message.contains(named), "{} does not name {}", message, named);
        }

        #[test]
        fn any_logs_request_is_answered_without_a_panic(request in any_logs()) {
            let valid = !request.writer.contains(['.', '*', '>', ' ']);
            prop_assert_eq!(check_write_logs(&request).is_ok(), valid);
        }

        #[test]
        fn a_bad_logs_field_is_refused_and_named(request in any_logs(), which in 0u8..3) {
            let mut request = request;
            request.writer = "w1".into();
            let named = match which {
                0 => { request.writer = "a.b".into(); "writer" }
                1 => {
                    request.lines.push(pb::LogEntry { text: "x".repeat(MAX_LOG_LINE_BYTES + 1), ..Default::default() });
                    "line"
                }
                _ => {
                    request.lines = vec![pb::LogEntry::default(); MAX_LINES_PER_REQUEST + 1];
                    "lines in one request"
                }
            };
            let message = check_write_logs(&request).unwrap_err().to_string();
            prop_assert!(message.contains(named), "{} does not name {}", message, named);
        }
    }
}
