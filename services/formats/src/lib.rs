//! The parsers of untrusted input that kiln shares, with few dependencies so that `fuzz/` can
//! link them alone:
//! - [`archive`]: code bundles, datasets and restored outputs (tar.gz), checked entry by entry
//!   and unpacked without leaving the destination, within byte, entry and header limits;
//! - [`template`]: a batch's per-item command (`{uri}`, `{output}`, `{item}`, `{attempt}`);
//! - [`columns`]: the columns of a metric batch (`MetricColumns`): checked, merged and split;
//! - [`image`]: container image references;
//! - [`units`]: memory sizes, CPU cores and durations as people write them;
//! - [`chunks`]: metric points packed into the byte columns of a CQL row, and read back;
//! - [`oip`]: the tensors of an Open Inference Protocol (KServe v2) request or response, in
//!   JSON and the binary tensor extension.
//!
//! Every function here returns an [`Error`] whose message says what is wrong, and none panics
//! or allocates without bound on any input (property tests next to each, fuzz targets in
//! `fuzz/`).

#![forbid(unsafe_code)]

pub mod archive;
pub mod chunks;
pub mod columns;
pub mod error;
pub mod image;
pub mod mask;
pub mod oip;
pub mod template;
pub mod units;

pub use error::{Error, Result};
