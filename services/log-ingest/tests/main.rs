//! kiln-log-ingest's integration tests as one test executable: each file of this directory is a
//! module (`cargo test --workspace --test log_ingest caught_up::` runs one file's tests; scripts/test.sh
//! runs them with cargo-nextest, each test in a process of its own). One executable, not one per
//! file, for the build's sake: each linked the whole crate and its dependencies again
//! (docs/design-notes.md, "CI's time: ...").

mod common;

mod caught_up;
mod exposition;
mod log_store;
mod metric_store;
mod scylla_secure;
mod sole;
