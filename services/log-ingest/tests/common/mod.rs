//! What log-ingest's tests share.
#![allow(dead_code)]

use kiln_log_ingest::scylla_store::ScyllaConfig;

/// The Scylla stores' configuration for the test Cassandra (`KILN_TEST_SCYLLA_NODES`, which
/// scripts/test.sh starts) with a keyspace of its own, so tests never see each other's rows.
pub fn cassandra_config() -> ScyllaConfig {
    let nodes = std::env::var("KILN_TEST_SCYLLA_NODES")
        .expect("KILN_TEST_SCYLLA_NODES is not set: run the tests through scripts/test.sh, which starts Cassandra");
    ScyllaConfig {
        nodes: nodes.split(',').map(str::to_string).collect(),
        keyspace: format!("kiln_test_{}", kiln_core::ids::new_id().replace('-', "")),
        ..Default::default()
    }
}
