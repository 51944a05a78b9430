//! The error of every parser here: which input was refused, and why.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An archive that is corrupt, leaves its destination or passes a limit.
    #[error("{0}")]
    Archive(String),
    /// A batch command template that does not parse.
    #[error("{0}")]
    Template(String),
    /// Metric columns that do not line up.
    #[error("{0}")]
    Columns(String),
    /// An inference request or response (Open Inference Protocol) that does not parse.
    #[error("{0}")]
    Inference(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// An error and its sources, `: `-separated: many libraries' own message hides the cause
/// (tar's "failed to unpack" hides "No space left on device", tonic's "transport error" and
/// reqwest's hide the io error).
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
