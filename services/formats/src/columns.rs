//! The columns of a metric batch ([`pb::MetricColumns`]: keys, and per point a key index, a
//! step, a value and a time): checked, merged with single points, and split into parts.

use std::collections::HashMap;

use kiln_proto::v1 as pb;

use crate::error::{Error, Result};

/// Checks that the columns of a batch line up; the message says what does not.
pub fn check_columns(columns: &pb::MetricColumns) -> Result<()> {
    let n = columns.steps.len();
    if columns.key_index.len() != n || columns.values.len() != n {
        return Err(Error::Columns(format!(
            "columns differ in length: {} key indexes, {} steps, {} values; give one of each per point",
            columns.key_index.len(),
            n,
            columns.values.len()
        )));
    }
    if !columns.timestamps_ms.is_empty() && columns.timestamps_ms.len() != n {
        return Err(Error::Columns(format!(
            "{} timestamps for {n} points: give one per point, or none",
            columns.timestamps_ms.len()
        )));
    }
    if let Some(index) = columns.key_index.iter().find(|i| **i as usize >= columns.keys.len()) {
        return Err(Error::Columns(format!(
            "key index {index} is out of range: there are {} keys",
            columns.keys.len()
        )));
    }
    Ok(())
}

/// Turns a batch's points and columns into columns (appended to `out`, which must line up),
/// giving points without a time `now`. Columns that do not line up are refused, and `out` is
/// left as it was.
pub fn append_columns(
    out: &mut pb::MetricColumns,
    points: Vec<pb::MetricPoint>,
    columns: pb::MetricColumns,
    now: i64,
) -> Result<()> {
    check_columns(out)?;
    check_columns(&columns)?;
    // A time column is either full or empty: fill in the empty one first.
    if out.timestamps_ms.is_empty() {
        out.timestamps_ms.resize(out.steps.len(), now);
    }
    let mut index: HashMap<String, u32> = out
        .keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), i as u32))
        .collect();
    let mut key_index = |out: &mut pb::MetricColumns, key: String| -> u32 {
        *index.entry(key).or_insert_with_key(|key| {
            out.keys.push(key.clone());
            (out.keys.len() - 1) as u32
        })
    };
    for point in points {
        let i = key_index(out, point.key);
        out.key_index.push(i);
        out.steps.push(point.step);
        out.values.push(point.value);
        out.timestamps_ms.push(if point.timestamp_ms == 0 {
            now
        } else {
            point.timestamp_ms
        });
    }
    let remap: Vec<u32> = columns.keys.into_iter().map(|key| key_index(out, key)).collect();
    out.key_index
        .extend(columns.key_index.iter().map(|i| remap[*i as usize]));
    out.steps.extend_from_slice(&columns.steps);
    out.values.extend_from_slice(&columns.values);
    if columns.timestamps_ms.is_empty() {
        out.timestamps_ms.resize(out.steps.len(), now);
    } else {
        out.timestamps_ms
            .extend(columns.timestamps_ms.iter().map(|t| if *t == 0 { now } else { *t }));
    }
    Ok(())
}

/// Splits columns into parts of at most `size` points, each with only the keys it uses.
pub fn split_columns(columns: &pb::MetricColumns, size: usize) -> Result<Vec<pb::MetricColumns>> {
    check_columns(columns)?;
    let size = size.max(1);
    let n = columns.steps.len();
    Ok((0..n)
        .step_by(size)
        .map(|start| {
            let end = (start + size).min(n);
            let mut remap: HashMap<u32, u32> = HashMap::new();
            let mut part = pb::MetricColumns::default();
            for &i in &columns.key_index[start..end] {
                let j = *remap.entry(i).or_insert_with(|| {
                    part.keys.push(columns.keys[i as usize].clone());
                    (part.keys.len() - 1) as u32
                });
                part.key_index.push(j);
            }
            part.steps = columns.steps[start..end].to_vec();
            part.values = columns.values[start..end].to_vec();
            part.timestamps_ms = columns
                .timestamps_ms
                .get(start..end)
                .map(<[i64]>::to_vec)
                .unwrap_or_default();
            part
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Each point of columns as (key, step, value bits, time).
    fn points(columns: &pb::MetricColumns) -> Vec<(String, i64, u64, i64)> {
        (0..columns.steps.len())
            .map(|i| {
                (
                    columns.keys[columns.key_index[i] as usize].clone(),
                    columns.steps[i],
                    columns.values[i].to_bits(),
                    columns.timestamps_ms.get(i).copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Columns that line up: `n` points over `keys` keys, with or without times.
    fn valid_columns() -> impl Strategy<Value = pb::MetricColumns> {
        (1usize..5, 0usize..40, any::<bool>()).prop_flat_map(|(keys, n, timed)| {
            (
                prop::collection::vec("[a-z/]{1,8}", keys),
                prop::collection::vec(0..keys as u32, n),
                prop::collection::vec(any::<i64>(), n),
                prop::collection::vec(any::<f64>(), n),
                prop::collection::vec(1..i64::MAX, if timed { n } else { 0 }),
            )
                .prop_map(|(keys, key_index, steps, values, timestamps_ms)| pb::MetricColumns {
                    keys,
                    key_index,
                    steps,
                    values,
                    timestamps_ms,
                })
        })
    }

    fn any_columns() -> impl Strategy<Value = pb::MetricColumns> {
        (
            prop::collection::vec(".{0,4}", 0..4),
            prop::collection::vec(any::<u32>(), 0..8),
            prop::collection::vec(any::<i64>(), 0..8),
            prop::collection::vec(any::<f64>(), 0..8),
            prop::collection::vec(any::<i64>(), 0..8),
        )
            .prop_map(|(keys, key_index, steps, values, timestamps_ms)| pb::MetricColumns {
                keys,
                key_index,
                steps,
                values,
                timestamps_ms,
            })
    }

    proptest! {
        #[test]
        fn any_columns_are_answered_without_a_panic(columns in any_columns(), size in 0usize..10) {
            let checked = check_columns(&columns);
            prop_assert_eq!(split_columns(&columns, size).is_ok(), checked.is_ok());
            let mut out = pb::MetricColumns::default();
            prop_assert_eq!(append_columns(&mut out, Vec::new(), columns.clone(), 7).is_ok(), checked.is_ok());
            if checked.is_err() {
                prop_assert_eq!(out, pb::MetricColumns::default());
            }
        }

        #[test]
        fn valid_columns_split_and_merge_back_to_their_points(
            columns in valid_columns(),
            size in 1usize..10,
            single in prop::collection::vec(("[a-z]{1,3}", any::<i64>(), any::<f64>()), 0..4),
        ) {
            check_columns(&columns).unwrap();
            let parts = split_columns(&columns, size).unwrap();
            let mut rejoined = Vec::new();
            for part in &parts {
                check_columns(part).unwrap();
                prop_assert!(part.steps.len() <= size);
                rejoined.extend(points(part));
            }
            prop_assert_eq!(&rejoined, &points(&columns));
            // Single points first, then the columns; a time of 0 becomes `now`.
            let now = 99;
            let mut all = pb::MetricColumns::default();
            let single: Vec<pb::MetricPoint> = single
                .into_iter()
                .map(|(key, step, value)| pb::MetricPoint { key, step, value, timestamp_ms: 0 })
                .collect();
            append_columns(&mut all, single.clone(), columns.clone(), now).unwrap();
            check_columns(&all).unwrap();
            let mut expected: Vec<(String, i64, u64, i64)> =
                single.iter().map(|p| (p.key.clone(), p.step, p.value.to_bits(), now)).collect();
            expected.extend(points(&columns).into_iter().map(|(k, s, v, t)| (k, s, v, if t == 0 { now } else { t })));
            prop_assert_eq!(points(&all), expected);
        }

        #[test]
        fn a_column_that_does_not_line_up_is_named(columns in valid_columns(), which in 0u8..4) {
            prop_assume!(!columns.steps.is_empty());
            let mut broken = columns;
            let expected = match which {
                0 => { broken.key_index.pop(); "key indexes" }
                1 => { broken.values.push(1.0); "values" }
                2 => { broken.timestamps_ms = vec![1; broken.steps.len() + 1]; "timestamps" }
                _ => { broken.key_index[0] = broken.keys.len() as u32; "key index" }
            };
            let message = check_columns(&broken).unwrap_err().to_string();
            prop_assert!(message.contains(expected), "{}", message);
        }
    }
}
