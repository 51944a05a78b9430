//! The api's error type.

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("job {job_id} not found")]
    JobNotFound { job_id: String },
    #[error("code bundle {digest} is not uploaded; upload it with ArtifactService first")]
    ArtifactMissing { digest: String },
    #[error("dataset {name} does not exist; create it with `kiln dataset create`")]
    DatasetMissing { name: String },
    #[error("idempotency key {key:?} was used for job {job_id} with another spec; use a new key for a new job")]
    SubmitKeyReused { key: String, job_id: String },
    #[error("project {project} has no secret {name}; set it with `kiln secret set {name} --project {project}`")]
    SecretMissing { project: String, name: String },
    /// No key to seal with, a value that does not open, or a key that cannot be read.
    #[error(transparent)]
    Secrets(#[from] kiln_core::secrets::SecretsError),
    #[error("dataset {name} exists already; datasets are immutable, pick another name")]
    DatasetExists { name: String },
    #[error(
        "dataset {name} is named by job {job_id}, which has not ended; delete it once no queued or running job needs it"
    )]
    DatasetInUse { name: String, job_id: String },
    #[error("job {job_id} has no output {path}")]
    OutputMissing { job_id: String, path: String },
    #[error("job {job_id} saved no artifact {name}{}; `kiln artifacts saved {job_id}` lists what it saved", if path.is_empty() { String::new() } else { format!(" with a file {path}") })]
    RunArtifactMissing { job_id: String, name: String, path: String },
    #[error("blob {digest} of {size} bytes is not uploaded; upload it with ArtifactService.UploadArtifact first")]
    BlobMissing { digest: String, size: u64 },
    #[error("{0}")]
    TooLarge(String),
    /// A record the store holds contradicts itself (the message says how).
    #[error("{0}")]
    Internal(String),
    /// A quota refuses the request; the message names it.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    /// The caller may not make this call on this object.
    #[error(transparent)]
    Denied(#[from] kiln_core::authz::Denied),
    #[error("user {name} not found")]
    UserNotFound { name: String },
    #[error("you have no live token {token}; `kiln token ls` lists them")]
    TokenNotFound { token: String },
    #[error("{what} {name} exists already")]
    Exists { what: &'static str, name: String },
    /// A model registry operation failed; the message says why.
    #[error(transparent)]
    Model(#[from] kiln_core::models::ModelError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An operation of kiln-core that spans the store and NATS.
    #[error(transparent)]
    Core(#[from] kiln_core::Error),
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// No scheduler leader answered an explain request in time.
    #[error("no scheduler leader answered within {waited:?}; is a kiln-scheduler running?")]
    SchedulerUnavailable { waited: std::time::Duration },
    /// The scheduler leader answered, but could not explain (its message), or not readably.
    #[error("the scheduler could not explain the job: {0}")]
    SchedulerFailed(String),
    #[error("object store: {0}")]
    Objects(#[from] object_store::Error),
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
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
            Error::JobNotFound { .. } | Error::OutputMissing { .. } => ErrorKind::NotFound,
            Error::RunArtifactMissing { .. } => ErrorKind::NotFound,
            Error::BlobMissing { .. } => ErrorKind::FailedPrecondition,
            Error::ArtifactMissing { .. } => ErrorKind::FailedPrecondition,
            Error::DatasetMissing { .. } | Error::DatasetInUse { .. } => ErrorKind::FailedPrecondition,
            Error::SecretMissing { .. } => ErrorKind::FailedPrecondition,
            Error::Secrets(error) => error.kind(),
            Error::DatasetExists { .. } | Error::SubmitKeyReused { .. } => ErrorKind::AlreadyExists,
            Error::TooLarge(_) | Error::QuotaExceeded(_) => ErrorKind::ResourceExhausted,
            Error::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Denied(denied) => denied.kind(),
            Error::UserNotFound { .. } | Error::TokenNotFound { .. } => ErrorKind::NotFound,
            Error::Exists { .. } => ErrorKind::AlreadyExists,
            Error::Model(error) => error.kind(),
            Error::Store(error) => error.kind(),
            Error::Core(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::SchedulerUnavailable { .. } => ErrorKind::Unavailable,
            Error::SchedulerFailed(_) | Error::Internal(_) => ErrorKind::Internal,
            Error::Tls(error) => error.kind(),
            Error::Objects(_) | Error::Io { .. } | Error::Bind { .. } | Error::Serve(_) => ErrorKind::Internal,
            Error::Metrics(_) => ErrorKind::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
