//! kiln-core: the parts every kiln service shares.
//!
//! - [`config`]: the figment loader and the config parts (database, NATS, object store, gRPC);
//! - [`error`]: [`ErrorKind`] and its one mapping to gRPC codes;
//! - [`ids`]: UUIDv7 ids and clocks;
//! - [`subjects`] and [`streams`]: every JetStream name, declared once, and their creation;
//! - [`nats_auth`]: each service's NATS user and subjects, and the nats-server `authorization`
//!   block they render to;
//! - [`publish`]: publishing with a message id, sent again while a cluster elects a leader;
//! - [`state`] and [`store`]: the job state machine and the metadata store (sea-orm);
//! - [`events`]: publishing committed changes (the outbox) and re-driving unpublished ones;
//! - [`intake`]: consuming a stream in batches, acking after the write; [`item_results`]: batch
//!   items' outcomes as they travel, grouped;
//! - [`lease`] and [`runners`]: leader leases, and the runners' liveness leases and what is
//!   done with a lost runner's jobs;
//! - [`auth`]: bearer tokens, the server auth layer and the client interceptor;
//! - [`authz`]: the policy table of every RPC and the one authorisation decision;
//! - [`scheduling`] and [`quotas`]: the names and quota checks the scheduler and the api share;
//! - [`whoami`]: `NodeService`, the one RPC every service serves;
//! - [`tls`]: TLS for gRPC servers (reloaded certificates, client certificates) and clients;
//! - [`models`]: the model registry's register operation (versions of a job's outputs, lineage);
//! - [`runs`]: a run's configuration values (what `kiln.init(config)` stores, a trial's knobs);
//! - [`serving`]: inference services' live definitions and the predictor ↔ relay contract;
//! - [`objects`]: the blob store; [`telemetry`] and [`shutdown`]: process plumbing.
#![forbid(unsafe_code)]

pub mod auth;
pub mod authz;
pub mod capacity;
pub mod config;
pub mod error;
pub mod events;
pub mod feed;
pub mod ids;
pub mod intake;
pub mod item_results;
pub mod lease;
pub mod metrics;
pub mod models;
pub mod nats_auth;
pub mod objects;
pub mod provisioning;
pub mod publish;
pub mod quotas;
pub mod runners;
pub mod runs;
pub mod scheduling;
pub mod secrets;
pub mod service;
pub mod serving;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod streams;
pub mod subjects;
pub mod telemetry;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod tls;
pub mod whoami;

pub use error::ErrorKind;
pub use state::JobState;

/// Error of the operations in this crate that span the store and NATS.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Nats(#[from] streams::NatsError),
    /// The caller may not make the call on what it addresses.
    #[error(transparent)]
    Denied(#[from] authz::Denied),
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Store(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Denied(denied) => denied.kind(),
        }
    }
}
