//! The cloud crate's error type.

use std::time::Duration;

use kiln_core::ErrorKind;

/// What went wrong in a call to a cloud, classified by what the provisioner does next.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// `RequestLimitExceeded`, HTTP 429/503 throttling: back off, then try again.
    #[error("the cloud is throttling kiln's calls{}", retry_after_text(.retry_after))]
    Throttled { retry_after: Option<Duration> },
    /// A 5xx, or the network failed before the request was sent: retryable.
    #[error("the cloud is unavailable: {0}")]
    Unavailable(String),
    /// The call was sent and no answer came back: it may have happened. Never retried blindly;
    /// the intent reconciler lists by tag first.
    #[error("no answer to a call that was sent (it may have taken effect): {0}")]
    Ambiguous(String),
    /// `AuthFailure`, `UnauthorizedOperation`, 403: the credentials or their policy.
    #[error("the cloud refused kiln's credentials: {0}")]
    Unauthorized(String),
    /// A bad template, subnet or parameter: a configuration error that stops the pool.
    #[error("the cloud refused the request as invalid: {0}")]
    Invalid(String),
    #[error("not found: {0}")]
    NotFound(String),
}

fn retry_after_text(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(after) => format!(" (retry after {} ms)", after.as_millis()),
        None => String::new(),
    }
}

impl CloudError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            CloudError::Throttled { .. } | CloudError::Unavailable(_) => ErrorKind::Unavailable,
            // Not retryable by a caller's generic loop: the reconciler decides.
            CloudError::Ambiguous(_) => ErrorKind::Timeout,
            CloudError::Unauthorized(_) | CloudError::Invalid(_) => ErrorKind::FailedPrecondition,
            CloudError::NotFound(_) => ErrorKind::NotFound,
        }
    }

    /// Whether the same call may be sent again after a backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CloudError::Throttled { .. } | CloudError::Unavailable(_))
    }
}
