//! item-batch's error type.

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("batch {batch_id} not found")]
    BatchNotFound { batch_id: String },
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    TooLarge(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An operation of kiln-core that spans the store and NATS.
    #[error(transparent)]
    Core(#[from] kiln_core::Error),
    #[error(transparent)]
    Nats(#[from] NatsError),
    #[error("object store: {0}")]
    Objects(#[from] object_store::Error),
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
    /// A task of this service that failed (a panic): a bug.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Why the owner may no longer have jobs made for them, when this is that refusal.
    pub fn owner_revoked(&self) -> Option<&str> {
        match self {
            Error::Store(error) => error.owner_revoked(),
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::BatchNotFound { .. } => ErrorKind::NotFound,
            Error::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            Error::AlreadyExists(_) => ErrorKind::AlreadyExists,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::TooLarge(_) => ErrorKind::ResourceExhausted,
            Error::Store(error) => error.kind(),
            Error::Core(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Tls(error) => error.kind(),
            Error::Objects(_) | Error::Bind { .. } | Error::Serve(_) | Error::Metrics(_) | Error::Internal(_) => {
                ErrorKind::Internal
            }
        }
    }
}

impl From<sea_orm::DbErr> for Error {
    fn from(error: sea_orm::DbErr) -> Self {
        Error::Store(StoreError::Db(error))
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> tonic::Status {
        kiln_core::error::status(error.kind(), &error)
    }
}

pub fn nats_error(error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(error.to_string()))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
