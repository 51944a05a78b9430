//! Why a registry operation failed.

use crate::error::ErrorKind;
use crate::store::StoreError;
use crate::streams::NatsError;

/// ModelError is a failure of a registry operation; each names what the caller can do.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    Invalid(String),
    #[error("path {path:?} is not a relative path inside the job's outputs")]
    InvalidPath { path: String },
    #[error("job {job_id} is {state}: register a model from it once it has ended and its outputs are synced")]
    JobNotEnded { job_id: String, state: String },
    #[error("job {job_id} has no outputs or saved artifacts{}; `kiln artifacts ls {job_id}` and `kiln artifacts saved {job_id}` list what it wrote", if path.is_empty() { String::new() } else { format!(" under {path}") })]
    NoOutputs { job_id: String, path: String },
    /// A bare name with no project given is a model of several projects the caller may read.
    #[error("model {name} is in more than one project you may read ({}): name one as PROJECT/{name}, or give its project (--project)", projects.join(", "))]
    Ambiguous { name: String, projects: Vec<String> },
    #[error("model {name} not found; `kiln model ls` lists the models")]
    ModelNotFound { name: String },
    #[error("model {name} has no version {version}; `kiln model versions {name}` lists them")]
    VersionNotFound { name: String, version: i64 },
    #[error("model {name} has no alias {alias}; set it with `kiln model alias {name} VERSION {alias}`")]
    AliasNotFound { name: String, alias: String },
    #[error("version {version} of model {name} has no file {path}")]
    FileNotFound { name: String, version: i64, path: String },
    #[error("no log-ingest answered about job {job_id}'s metrics within {waited:?}; is a kiln-log-ingest running?")]
    MetricsUnavailable {
        job_id: String,
        waited: std::time::Duration,
    },
    #[error("log-ingest could not read job {job_id}'s metrics: {message}")]
    MetricsFailed { job_id: String, message: String },
    #[error("stored model record is corrupt: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Nats(NatsError),
    #[error("object store: {0}")]
    Objects(#[from] object_store::Error),
}

impl ModelError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ModelError::Invalid(_) | ModelError::InvalidPath { .. } => ErrorKind::InvalidArgument,
            ModelError::JobNotEnded { .. } | ModelError::NoOutputs { .. } | ModelError::Ambiguous { .. } => {
                ErrorKind::FailedPrecondition
            }
            ModelError::ModelNotFound { .. }
            | ModelError::VersionNotFound { .. }
            | ModelError::AliasNotFound { .. }
            | ModelError::FileNotFound { .. } => ErrorKind::NotFound,
            ModelError::MetricsUnavailable { .. } => ErrorKind::Unavailable,
            ModelError::MetricsFailed { .. } | ModelError::Corrupt(_) | ModelError::Objects(_) => ErrorKind::Internal,
            ModelError::Store(error) => error.kind(),
            ModelError::Nats(error) => error.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the projects the caller may read are listed (the caller computes them).
    #[test]
    fn an_ambiguous_name_asks_for_its_project() {
        let refusal = ModelError::Ambiguous {
            name: "resnet".into(),
            projects: vec!["alpha".into(), "beta".into()],
        };
        assert_eq!(refusal.kind(), ErrorKind::FailedPrecondition);
        let text = refusal.to_string();
        assert!(
            text.contains("(alpha, beta)") && text.contains("PROJECT/resnet"),
            "{text}"
        );
    }
}
