//! The runner's error type.

use kiln_core::ErrorKind;
use kiln_core::store::StoreError;
use kiln_core::streams::NatsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad code bundle: {0}")]
    BadBundle(String),
    #[error("cannot start {program:?}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("image not found: {image} ({message})")]
    ImageNotFound { image: String, message: String },
    /// A gang job's node cannot run here.
    #[error("gang: {0}")]
    Gang(String),
    /// A job's own disk (`--disk`) could not be made or removed.
    #[error("job disk: {0}")]
    Disk(String),
    /// The registry refused the pull: the project's credentials are wrong, or it has none.
    #[error("cannot pull image {image}: {why}")]
    ImageRefused { image: String, why: String },
    #[error("this runner runs containers: the job must name an image (--image)")]
    NoImage,
    #[error(
        "this runner runs local processes and cannot run image {image}; submit without --image or use a runner with Docker"
    )]
    ImageUnsupported { image: String },
    /// A process job of a user this runner does not trust, on a runner that cannot isolate it.
    #[error(
        "this runner runs process jobs as its own user, which can read kiln's files, so it runs only those of its process.trusted-owner, not of user {owner}: process jobs of other users need the runner to run as root with [process] isolation (uid-range, work-root), or a Docker Engine (submit with --image)"
    )]
    UntrustedOwner { owner: String },
    /// Process jobs cannot be isolated as configured.
    #[error("process isolation: {0}")]
    Isolation(String),
    #[error("no capacity: {0}")]
    Capacity(String),
    #[error("docker: cannot {what}: {message}")]
    Docker { what: String, message: String },
    /// The jobs' network or its firewall cannot be made (see `docker.isolate-jobs`).
    #[error(
        "cannot isolate job containers: {message} (or set docker.isolate-jobs = false, which lets jobs reach kiln's services)"
    )]
    Firewall { message: String },
    #[error(
        "cannot confine process jobs' network: {message} (the runner needs root and iptables; or set process.firewall = false, which lets process jobs reach every port of this host)"
    )]
    ProcessFirewall { message: String },
    #[error("dataset: {0}")]
    Dataset(String),
    /// ECR through the instance role (`[ecr]`) cannot be set up.
    #[error("ecr: {0}")]
    Ecr(String),
    /// The model version an inference worker serves cannot be staged.
    #[error("model: {0}")]
    Model(String),
    #[error("cannot restore the outputs of the earlier attempts: {0}")]
    Restore(String),
    #[error(transparent)]
    Secrets(#[from] kiln_core::secrets::SecretsError),
    /// A secret the job names is gone (deleted after the job was submitted).
    #[error(
        "project {project} has no secret {name} any more; set it again with `kiln secret set {name} --project {project}`"
    )]
    SecretMissing { project: String, name: String },
    /// The instance metadata service (`[imds]`) did not answer as it should.
    #[error("instance metadata: {0}")]
    Metadata(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
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
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::BadBundle(_)
            | Error::Spawn { .. }
            | Error::ImageNotFound { .. }
            | Error::ImageRefused { .. }
            | Error::Gang(_)
            | Error::NoImage
            | Error::ImageUnsupported { .. } => ErrorKind::InvalidArgument,
            Error::Docker { .. } | Error::Metadata(_) | Error::Ecr(_) => ErrorKind::Unavailable,
            Error::Firewall { .. } | Error::ProcessFirewall { .. } => ErrorKind::FailedPrecondition,
            Error::Capacity(_) | Error::Disk(_) => ErrorKind::ResourceExhausted,
            Error::Restore(_)
            | Error::Dataset(_)
            | Error::Model(_)
            | Error::SecretMissing { .. }
            | Error::UntrustedOwner { .. }
            | Error::Isolation(_) => ErrorKind::FailedPrecondition,
            Error::Secrets(error) => error.kind(),
            Error::Store(error) => error.kind(),
            Error::Core(error) => error.kind(),
            Error::Nats(error) => error.kind(),
            Error::Tls(error) => error.kind(),
            Error::Io { .. } | Error::Objects(_) | Error::Bind { .. } | Error::Serve(_) | Error::Metrics(_) => {
                ErrorKind::Internal
            }
        }
    }

    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
