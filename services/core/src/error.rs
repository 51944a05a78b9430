//! Error kinds shared by every crate, and their one mapping to gRPC status codes.
//!
//! Each crate has its own `Error` enum whose variants name causes; each exposes `kind()` so the
//! edge (`grpc.rs` of a service) turns it into a `tonic::Status` through [`status`].

use tonic::{Code, Status};

/// ErrorKind classifies an error by what the caller can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    ResourceExhausted,
    Unauthenticated,
    PermissionDenied,
    Unavailable,
    Timeout,
    Internal,
}

impl ErrorKind {
    /// Returns the gRPC code of this kind. This is the only place kinds map to codes.
    pub fn code(self) -> Code {
        match self {
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::FailedPrecondition => Code::FailedPrecondition,
            ErrorKind::ResourceExhausted => Code::ResourceExhausted,
            ErrorKind::Unauthenticated => Code::Unauthenticated,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::Unavailable => Code::Unavailable,
            ErrorKind::Timeout => Code::DeadlineExceeded,
            ErrorKind::Internal => Code::Internal,
        }
    }

    /// Tells whether retrying the same operation later may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable | ErrorKind::Timeout)
    }
}

/// Builds the status returned to a caller. Internal errors are logged here and answered with
/// a generic message, so no detail of the server (paths, SQL, secrets) leaks to clients.
pub fn status(kind: ErrorKind, message: impl std::fmt::Display) -> Status {
    if kind == ErrorKind::Internal {
        tracing::error!(error = %message, "internal error");
        return Status::internal("internal error; the server log has the details");
    }
    Status::new(kind.code(), message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_hide_their_details() {
        let status = status(ErrorKind::Internal, "disk /secret/path is full");
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("/secret/path"));
    }

    #[test]
    fn kinds_map_to_codes() {
        assert_eq!(status(ErrorKind::NotFound, "job x").code(), Code::NotFound);
        assert_eq!(ErrorKind::Timeout.code(), Code::DeadlineExceeded);
        assert!(ErrorKind::Unavailable.is_retryable());
        assert!(!ErrorKind::InvalidArgument.is_retryable());
    }
}
