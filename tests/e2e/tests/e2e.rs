//! kiln's cross-service tests as one test executable: each file of this directory is a module
//! (`cargo test --workspace --test e2e ec2::` runs one file's tests; scripts/test.sh runs them
//! with cargo-nextest, each test in a process of its own).
//!
//! One executable, not one per file: each of the 48 linked the whole stack and compiled its own
//! copies of the generic code it used. Rebuilding them after an edit of the e2e library took
//! 5 min 57 s on two cores, the one executable 21 s (docs/design-notes.md, "CI's time:
//! nextest, one e2e test executable, ...").

mod api;
mod authz;
mod batch;
mod batch_crash;
mod batch_docker;
mod batch_docker_tls;
mod batch_done;
mod batch_items;
mod batch_provisioned;
mod batch_replicas;
mod batch_sim;
mod batch_stall;
mod cluster;
mod crash;
mod datasets;
mod docker;
mod docker_isolation;
mod ec2;
mod explain;
mod exposition;
mod gang;
mod gpu;
mod jobs;
mod leases;
mod logs;
mod metrics;
mod models;
mod nats_tls;
mod owner_pause;
mod process_isolation;
mod read_your_writes;
mod registry;
mod runs;
mod s3;
mod scheduling;
mod secrets;
mod serve;
mod serve_channel;
mod serve_clients;
mod serve_docker;
mod serve_jobs;
mod serve_preemption;
mod serve_tls;
mod service_metrics;
mod sim;
mod spot_notices;
mod sweep;
mod tenancy;
