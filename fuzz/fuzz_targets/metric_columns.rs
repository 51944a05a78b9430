//! A metric batch as it arrives (protobuf): its columns checked, merged and split as
//! log-ingest does, and byte columns of a stored row read back. No panic; columns that pass
//! the check survive a split and a merge point for point.

#![no_main]

use kiln_formats::{chunks, columns};
use kiln_proto::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let (steps, values) = data.split_at(data.len() / 2);
    assert_eq!(chunks::steps(steps).count(), steps.len() / 8);
    let _ = chunks::samples(steps, values).count();
    let Ok(batch) = pb::MetricBatch::decode(data) else {
        return;
    };
    let given = batch.columns.unwrap_or_default();
    if columns::check_columns(&given).is_err() {
        assert!(columns::split_columns(&given, 3).is_err());
        return;
    }
    let mut all = pb::MetricColumns::default();
    columns::append_columns(&mut all, batch.points.clone(), given.clone(), 1).unwrap();
    assert_eq!(all.steps.len(), batch.points.len() + given.steps.len());
    let parts = columns::split_columns(&all, 3).unwrap();
    assert_eq!(parts.iter().map(|p| p.steps.len()).sum::<usize>(), all.steps.len());
});
