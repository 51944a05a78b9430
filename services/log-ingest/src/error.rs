//! log-ingest's error type.

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("job {job_id} not found")]
    JobNotFound { job_id: String },
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("log store: {0}")]
    LogStore(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// An operation of kiln-core (an authorised read of a job).
    #[error(transparent)]
    Core(#[from] kiln_core::Error),
    #[error(
        "another log-ingest ({holder}) serves this NATS account with its own SQLite store; two would split a job's logs: set log-store = \"scylla\" and metric-store = \"scylla\" to run replicas"
    )]
    AnotherLogIngest { holder: String },
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
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::JobNotFound { .. } => ErrorKind::NotFound,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::TooLarge(_) => ErrorKind::ResourceExhausted,
            Error::FailedPrecondition(_) | Error::AnotherLogIngest { .. } => ErrorKind::FailedPrecondition,
            Error::Store(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Core(error) => error.kind(),
            Error::Tls(error) => error.kind(),
            Error::LogStore(_) | Error::Bind { .. } | Error::Serve(_) | Error::Metrics(_) => ErrorKind::Internal,
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Error::LogStore(error.to_string())
    }
}

impl From<sea_orm::DbErr> for Error {
    fn from(error: sea_orm::DbErr) -> Self {
        Error::LogStore(error.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
