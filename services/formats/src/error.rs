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
