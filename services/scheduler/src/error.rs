//! The scheduler's error type.

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An operation of kiln-core that spans the store and NATS.
    #[error(transparent)]
    Core(#[from] kiln_core::Error),
    #[error(transparent)]
    Nats(#[from] NatsError),
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
            Error::Core(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Tls(error) => error.kind(),
            Error::Bind { .. } | Error::Serve(_) | Error::Metrics(_) => ErrorKind::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
