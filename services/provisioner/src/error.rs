//! The provisioner's error type.

use kiln_cloud::CloudError;
use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Nats(#[from] NatsError),
    #[error("pool {pool}: {source}")]
    Cloud { pool: String, source: CloudError },
    #[error("a stored record is malformed: {0}")]
    Corrupt(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error(transparent)]
    Tls(#[from] kiln_core::tls::TlsError),
    #[error(transparent)]
    Metrics(#[from] kiln_core::metrics::MetricsError),
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Store(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Cloud { source, .. } => source.kind(),
            Error::Tls(error) => error.kind(),
            Error::Corrupt(_) | Error::Bind { .. } | Error::Serve(_) | Error::Metrics(_) => ErrorKind::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names the pool a cloud call failed for.
pub fn in_pool(pool: &str) -> impl FnOnce(CloudError) -> Error + '_ {
    move |source| Error::Cloud {
        pool: pool.to_owned(),
        source,
    }
}
