//! kiln-cli's integration tests as one test executable: each file of this directory is a
//! module (`cargo test --workspace --test cli cli::` runs one file's tests; scripts/test.sh
//! runs them with cargo-nextest, each test in a process of its own). One executable, not one per
//! file, for the build's sake: each linked the whole crate and its dependencies again
//! (docs/design-notes.md, "CI's time: ...").

mod common;

mod batch;
mod cli;
mod http;
mod http_feed;
mod http_streams;
mod metrics;
mod model;
mod output;
mod sweep;
mod tenancy;
mod tls;
mod up;
mod up_hostile;
mod up_nats;
