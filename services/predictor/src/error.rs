//! The predictor's error type, and its one mapping to HTTP statuses (gRPC codes go through
//! [`ErrorKind`]).

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request the caller must change: its body, its tensors, the model it names.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// Too few members answered by the deadline.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Too few members have a worker that answers.
    #[error("{0}")]
    Unavailable(String),
    /// The members' workers failed (their model raised, or their answers do not combine): the
    /// message is the service's own, and is shown to the caller.
    #[error("{0}")]
    MemberFailed(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An operation of kiln-core that spans the store and NATS (authorisation included).
    #[error(transparent)]
    Core(#[from] kiln_core::Error),
    #[error(transparent)]
    Nats(#[from] NatsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Metrics(#[from] kiln_core::metrics::MetricsError),
    #[error(transparent)]
    Tls(#[from] kiln_core::tls::TlsError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::AlreadyExists(_) => ErrorKind::AlreadyExists,
            Error::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            Error::Unauthenticated(_) => ErrorKind::Unauthenticated,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::DeadlineExceeded(_) => ErrorKind::Timeout,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Store(error) => error.kind(),
            Error::Core(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::MemberFailed(_) | Error::Internal(_) | Error::Bind { .. } | Error::Metrics(_) | Error::Tls(_) => {
                ErrorKind::Internal
            }
        }
    }

    /// The message a caller is shown: internal errors are logged and answered generically.
    pub fn public_message(&self) -> String {
        match self {
            Error::MemberFailed(message) => message.clone(),
            _ if self.kind() == ErrorKind::Internal => {
                tracing::error!(error = %self, "internal error");
                "internal error; the predictor's log has the details".into()
            }
            _ => self.to_string(),
        }
    }

    /// The HTTP status the REST API answers with.
    pub fn http_status(&self) -> u16 {
        match self.kind() {
            ErrorKind::InvalidArgument => 400,
            ErrorKind::Unauthenticated => 401,
            ErrorKind::PermissionDenied => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::AlreadyExists | ErrorKind::FailedPrecondition => 409,
            ErrorKind::Timeout => 504,
            ErrorKind::Unavailable => 503,
            ErrorKind::ResourceExhausted => 429,
            _ => 500,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> tonic::Status {
        tonic::Status::new(error.kind().code(), error.public_message())
    }
}
